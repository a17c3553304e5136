//! Model configuration in two steps: `HfConfig` mirrors `config.json` (every field optional,
//! as real files vary), and `Config::resolve` checks it once and derives what the forward
//! needs (head_dim, kv_dim, the GQA group size). GGUF files fill the same `HfConfig` from
//! their metadata, so there is one validation path.

use serde::Deserialize;

use crate::error::{Error, Result};

/// What rustle runs. Each differs from Llama only where noted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2 / 3 / 3.1 / 3.2, SmolLM / SmolLM2, TinyLlama.
    Llama,
    /// Mistral: Llama with a sliding attention window (we cap the context at the window).
    Mistral,
    /// Qwen2 / 2.5: bias on the q, k and v projections.
    Qwen2,
}

pub const SUPPORTED: &str = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM";

impl Arch {
    fn from_hf(architectures: Option<&[String]>, model_type: Option<&str>) -> Result<Arch> {
        if let Some(name) = architectures.and_then(|a| a.first()) {
            return match name.as_str() {
                "LlamaForCausalLM" => Ok(Arch::Llama),
                "MistralForCausalLM" => Ok(Arch::Mistral),
                "Qwen2ForCausalLM" => Ok(Arch::Qwen2),
                other => Err(Error::UnsupportedArchitecture {
                    field: "architectures",
                    found: other.to_owned(),
                    supported: SUPPORTED,
                }),
            };
        }
        match model_type {
            Some("llama") => Ok(Arch::Llama),
            Some("mistral") => Ok(Arch::Mistral),
            Some("qwen2") => Ok(Arch::Qwen2),
            Some(other) => Err(Error::UnsupportedArchitecture {
                field: "model_type",
                found: other.to_owned(),
                supported: SUPPORTED,
            }),
            None => Err(Error::Config(
                "neither `architectures` nor `model_type` is set".into(),
            )),
        }
    }
}

/// `config.json` as Hugging Face writes it. Only the fields rustle reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct HfConfig {
    pub architectures: Option<Vec<String>>,
    pub model_type: Option<String>,
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub vocab_size: Option<usize>,
    pub max_position_embeddings: Option<usize>,
    pub rms_norm_eps: Option<f64>,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<HfRopeScaling>,
    /// transformers 5 writes `rope_theta` and the scaling together under this key.
    pub rope_parameters: Option<HfRopeScaling>,
    pub tie_word_embeddings: Option<bool>,
    pub attention_bias: Option<bool>,
    pub sliding_window: Option<usize>,
    pub use_sliding_window: Option<bool>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<OneOrMany>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct HfRopeScaling {
    /// Newer files say `rope_type`, older ones `type`.
    pub rope_type: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub factor: Option<f64>,
    pub low_freq_factor: Option<f64>,
    pub high_freq_factor: Option<f64>,
    pub original_max_position_embeddings: Option<usize>,
    /// Only inside `rope_parameters`.
    pub rope_theta: Option<f64>,
}

/// How RoPE frequencies are stretched for long contexts.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f64,
    },
    /// Llama 3.1's: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position: usize,
    },
}

/// The validated configuration the engine runs from.
#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Arch,
    /// Width of the residual stream.
    pub dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Width of the MLP's hidden layer.
    pub ffn_dim: usize,
    pub vocab_size: usize,
    /// The longest sequence the model (and, for Mistral, its window) allows.
    pub max_seq_len: usize,
    pub rms_eps: f32,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub tie_embeddings: bool,
    /// Bias on the q, k and v projections (Qwen2, or `attention_bias`).
    pub qkv_bias: bool,
    pub bos_token: Option<u32>,
    pub eos_tokens: Vec<u32>,
}

impl Config {
    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Query heads that share one key/value head (grouped-query attention).
    pub fn group_size(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    pub fn resolve(hf: &HfConfig) -> Result<Config> {
        let arch = Arch::from_hf(hf.architectures.as_deref(), hf.model_type.as_deref())?;
        let need = |v: Option<usize>, field: &str| {
            v.ok_or_else(|| Error::Config(format!("missing field `{field}`")))
        };
        let dim = need(hf.hidden_size, "hidden_size")?;
        let n_heads = need(hf.num_attention_heads, "num_attention_heads")?;
        let n_kv_heads = hf.num_key_value_heads.unwrap_or(n_heads);
        let head_dim = match hf.head_dim {
            Some(h) => h,
            None if n_heads > 0 && dim % n_heads == 0 => dim / n_heads,
            None => {
                return Err(Error::Config(format!(
                    "hidden_size {dim} is not a multiple of num_attention_heads {n_heads} and head_dim is not set"
                )));
            }
        };
        let positive = |v: usize, field: &str| {
            if v == 0 {
                Err(Error::Config(format!("`{field}` must be positive")))
            } else {
                Ok(v)
            }
        };
        positive(dim, "hidden_size")?;
        positive(n_heads, "num_attention_heads")?;
        positive(n_kv_heads, "num_key_value_heads")?;
        if n_heads % n_kv_heads != 0 {
            return Err(Error::Config(format!(
                "num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv_heads}"
            )));
        }
        if head_dim % 2 != 0 || head_dim == 0 {
            return Err(Error::Config(format!(
                "head_dim {head_dim} must be even for RoPE"
            )));
        }
        let mut max_seq_len = positive(
            need(hf.max_position_embeddings, "max_position_embeddings")?,
            "max_position_embeddings",
        )?;
        // Mistral's sliding window changes attention only past the window; capping the
        // context there keeps every result exact without a windowed kernel.
        if let Some(window) = hf.sliding_window
            && hf.use_sliding_window != Some(false)
            && window > 0
        {
            max_seq_len = max_seq_len.min(window);
        }
        let eos_tokens = match &hf.eos_token_id {
            Some(OneOrMany::One(id)) => vec![*id],
            Some(OneOrMany::Many(ids)) => ids.clone(),
            None => vec![],
        };
        Ok(Config {
            arch,
            dim,
            n_layers: positive(
                need(hf.num_hidden_layers, "num_hidden_layers")?,
                "num_hidden_layers",
            )?,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim: positive(
                need(hf.intermediate_size, "intermediate_size")?,
                "intermediate_size",
            )?,
            vocab_size: positive(need(hf.vocab_size, "vocab_size")?, "vocab_size")?,
            max_seq_len,
            rms_eps: hf.rms_norm_eps.unwrap_or(1e-6) as f32,
            rope_theta: hf
                .rope_theta
                .or(hf.rope_parameters.as_ref().and_then(|p| p.rope_theta))
                .unwrap_or(10000.0),
            rope_scaling: resolve_rope_scaling(
                hf.rope_scaling.as_ref().or(hf.rope_parameters.as_ref()),
            )?,
            tie_embeddings: hf.tie_word_embeddings.unwrap_or(false),
            qkv_bias: arch == Arch::Qwen2 || hf.attention_bias.unwrap_or(false),
            bos_token: hf.bos_token_id,
            eos_tokens,
        })
    }
}

fn resolve_rope_scaling(s: Option<&HfRopeScaling>) -> Result<RopeScaling> {
    let Some(s) = s else {
        return Ok(RopeScaling::None);
    };
    let kind = s
        .rope_type
        .as_deref()
        .or(s.kind.as_deref())
        .unwrap_or("default");
    let factor = || {
        s.factor.filter(|f| *f > 0.0).ok_or_else(|| {
            Error::Config(format!("rope_scaling {kind:?} needs a positive `factor`"))
        })
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: factor()? }),
        "llama3" => {
            let field = |v: Option<f64>, name: &str| {
                v.ok_or_else(|| Error::Config(format!("rope_scaling llama3: missing `{name}`")))
            };
            let low = field(s.low_freq_factor, "low_freq_factor")?;
            let high = field(s.high_freq_factor, "high_freq_factor")?;
            if high <= low {
                return Err(Error::Config(format!(
                    "rope_scaling llama3: high_freq_factor {high} must exceed low_freq_factor {low}"
                )));
            }
            Ok(RopeScaling::Llama3 {
                factor: factor()?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position: s.original_max_position_embeddings.ok_or_else(|| {
                    Error::Config(
                        "rope_scaling llama3: missing `original_max_position_embeddings`".into(),
                    )
                })?,
            })
        }
        other => Err(Error::Config(format!(
            "rope_scaling type {other:?} is not supported (default, linear, llama3 are)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Config> {
        Config::resolve(&serde_json::from_str(json).unwrap())
    }

    const SMOLLM2: &str = r#"{
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
        "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2
    }"#;

    #[test]
    fn derives_head_dim_kv_dim_and_group() {
        let c = parse(SMOLLM2).unwrap();
        assert_eq!(c.arch, Arch::Llama);
        assert_eq!(
            (c.head_dim, c.q_dim(), c.kv_dim(), c.group_size()),
            (64, 576, 192, 3)
        );
        assert!(c.tie_embeddings && !c.qkv_bias);
        assert_eq!(c.eos_tokens, vec![2]);
        assert_eq!(c.rope_scaling, RopeScaling::None);
        assert!((c.rms_eps - 1e-5).abs() < 1e-12);
    }

    #[test]
    fn explicit_head_dim_wins() {
        let c =
            parse(&SMOLLM2.replace("\"vocab_size\"", "\"head_dim\": 128, \"vocab_size\"")).unwrap();
        assert_eq!((c.head_dim, c.q_dim(), c.kv_dim()), (128, 1152, 384));
    }

    #[test]
    fn qwen2_has_qkv_bias_and_mistral_caps_context_at_window() {
        let q = parse(&SMOLLM2.replace("LlamaForCausalLM", "Qwen2ForCausalLM")).unwrap();
        assert!(q.qkv_bias);
        let m = parse(
            &SMOLLM2
                .replace("LlamaForCausalLM", "MistralForCausalLM")
                .replace("\"vocab_size\"", "\"sliding_window\": 4096, \"vocab_size\""),
        )
        .unwrap();
        assert_eq!((m.arch, m.max_seq_len), (Arch::Mistral, 4096));
    }

    #[test]
    fn llama3_rope_scaling_and_eos_list() {
        let json = SMOLLM2.replace(
            "\"eos_token_id\": 2",
            r#""eos_token_id": [128001, 128009], "rope_scaling": {"rope_type": "llama3",
               "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}"#,
        );
        let c = parse(&json).unwrap();
        assert_eq!(c.eos_tokens, vec![128001, 128009]);
        assert_eq!(
            c.rope_scaling,
            RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position: 8192
            }
        );
    }

    #[test]
    fn transformers_5_rope_parameters() {
        let json = SMOLLM2.replace(
            "\"rope_theta\": 100000.0,",
            r#""rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},"#,
        );
        let c = parse(&json).unwrap();
        assert_eq!(c.rope_theta, 500000.0);
        assert!(matches!(
            c.rope_scaling,
            RopeScaling::Llama3 { factor: 8.0, .. }
        ));
    }

    #[test]
    fn bad_configs_name_the_problem() {
        let e = parse(&SMOLLM2.replace("LlamaForCausalLM", "GPT2LMHeadModel")).unwrap_err();
        assert!(e.to_string().contains("GPT2LMHeadModel"), "{e}");
        assert!(e.to_string().contains("architectures"), "{e}");
        let e = parse(&SMOLLM2.replace("\"hidden_size\": 576,", "")).unwrap_err();
        assert_eq!(e.to_string(), "config: missing field `hidden_size`");
        let e = parse(&SMOLLM2.replace("\"num_key_value_heads\": 3", "\"num_key_value_heads\": 4"))
            .unwrap_err();
        assert!(e.to_string().contains("not a multiple"), "{e}");
        let e = parse(&SMOLLM2.replace(
            "\"eos_token_id\": 2",
            r#""eos_token_id": 2, "rope_scaling": {"type": "yarn", "factor": 4.0}"#,
        ))
        .unwrap_err();
        assert!(e.to_string().contains("yarn"), "{e}");
    }
}
