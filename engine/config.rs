//! Model configuration in two steps: `HfConfig` mirrors `config.json` (every field optional,
//! as real files vary), and `Config::resolve` checks it once and derives what the forward
//! needs (head_dim, kv_dim, the GQA group size). GGUF files fill the same `HfConfig` from
//! their metadata, so there is one validation path. Its rooms: `limits` (the bounds every
//! field is held to), `rope_scaling` (RoPE's long-context scaling), `tests`.

use serde::Deserialize;

use crate::error::{Error, Result};

/// What rustle runs. Each differs from Llama only where noted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2 / 3 / 3.1 / 3.2, SmolLM / SmolLM2, TinyLlama.
    Llama,
    /// Mistral: Llama whose every layer attends over a sliding window (`sliding_window`,
    /// where the file sets one: Mistral 7B v0.1's 4096).
    Mistral,
    /// Qwen2 / 2.5: bias on the q, k and v projections.
    Qwen2,
    /// Qwen3 (dense): each query and key head RMSNormed before RoPE (`q_norm`, `k_norm`),
    /// no projection bias, `head_dim` from the configuration (128 where hidden / heads is not).
    Qwen3,
    /// Phi-3 / Phi-3.5 / Phi-4-mini: q, k and v in one matrix (`qkv_proj`) and gate and up in
    /// another (`gate_up_proj`), split at load; RoPE on part of each head
    /// (`partial_rotary_factor`); `longrope` scaling for the long-context variants.
    Phi3,
    /// Mixtral: Llama with a mixture of experts in place of each MLP (`Config::moe`).
    Mixtral,
    /// Qwen3-MoE: Qwen3 with a mixture of experts in place of each MLP.
    Qwen3Moe,
    /// Gemma 3 (text): a GELU-gated MLP, the embedding scaled by sqrt(hidden), RMSNorms that
    /// multiply by 1 + weight, norms after attention and after the MLP too, Qwen3's head
    /// norms, attention scaled by `query_pre_attn_scalar`, and local layers over a sliding
    /// window with a RoPE base of their own (`Config::sliding`).
    Gemma3,
}

pub const SUPPORTED: &str = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, \
    Qwen3ForCausalLM, Phi3ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM, \
    Gemma3ForCausalLM, Gemma3ForConditionalGeneration (its language model)";

/// The GGUF `general.architecture` names rustle reads, and the `model_type` each stands for
/// (llama.cpp's converter writes `llama` for Llama, Mistral, SmolLM and TinyLlama).
const GGUF_ARCHS: &[(&str, &str)] = &[
    ("llama", "llama"),
    ("gemma3", "gemma3_text"),
    ("qwen2", "qwen2"),
    ("qwen3", "qwen3"),
    ("phi3", "phi3"),
    ("qwen3moe", "qwen3_moe"),
];

impl Arch {
    /// The `model_type` a GGUF file's `general.architecture` stands for, or the error that
    /// names it and lists what is read: checked before any of its keys (`ARCH.key`) is.
    pub fn gguf_model_type(arch: &str) -> Result<&'static str> {
        let found = GGUF_ARCHS.iter().find(|(name, _)| *name == arch);
        found
            .map(|&(_, model_type)| model_type)
            .ok_or_else(|| Error::UnsupportedArchitecture {
                field: "general.architecture",
                found: arch.to_owned(),
                supported: "llama (Llama, Mistral, Mixtral, SmolLM, TinyLlama), qwen2, qwen3, qwen3moe, phi3, gemma3",
            })
    }

    fn from_hf(architectures: Option<&[String]>, model_type: Option<&str>) -> Result<Arch> {
        if let Some(name) = architectures.and_then(|a| a.first()) {
            return match name.as_str() {
                "LlamaForCausalLM" => Ok(Arch::Llama),
                "MistralForCausalLM" => Ok(Arch::Mistral),
                "Qwen2ForCausalLM" => Ok(Arch::Qwen2),
                "Qwen3ForCausalLM" => Ok(Arch::Qwen3),
                "Phi3ForCausalLM" => Ok(Arch::Phi3),
                "MixtralForCausalLM" => Ok(Arch::Mixtral),
                "Qwen3MoeForCausalLM" => Ok(Arch::Qwen3Moe),
                "Gemma3ForCausalLM" => Ok(Arch::Gemma3),
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
            Some("qwen3") => Ok(Arch::Qwen3),
            Some("phi3") => Ok(Arch::Phi3),
            Some("mixtral") => Ok(Arch::Mixtral),
            Some("qwen3_moe") => Ok(Arch::Qwen3Moe),
            Some("gemma3_text") => Ok(Arch::Gemma3),
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
    /// The share of each head RoPE turns (Phi-4-mini: 0.75); transformers 5 writes it inside
    /// `rope_parameters`.
    pub partial_rotary_factor: Option<f64>,
    /// Dimensions of each head RoPE turns, as GGUF files say it (`ARCH.rope.dimension_count`);
    /// no `config.json` has it.
    #[serde(skip)]
    pub rotary_dim: Option<usize>,
    /// The context a `longrope` model was trained at before its extension (Phi-3); also
    /// inside the scaling.
    pub original_max_position_embeddings: Option<usize>,
    pub rope_scaling: Option<HfRopeScaling>,
    /// transformers 5 writes `rope_theta` and the scaling together under this key.
    pub rope_parameters: Option<RopeParameters>,
    pub tie_word_embeddings: Option<bool>,
    /// Mixtral's experts a layer.
    pub num_local_experts: Option<usize>,
    /// Qwen3-MoE's experts a layer.
    pub num_experts: Option<usize>,
    pub num_experts_per_tok: Option<usize>,
    /// An expert's hidden width (Qwen3-MoE; Mixtral's is `intermediate_size`).
    pub moe_intermediate_size: Option<usize>,
    /// Qwen3-MoE: the chosen experts' weights renormalized to sum to 1.
    pub norm_topk_prob: Option<bool>,
    /// Qwen3-MoE: every `decoder_sparse_step`-th layer has experts, but `mlp_only_layers`.
    pub decoder_sparse_step: Option<usize>,
    pub mlp_only_layers: Option<Vec<usize>>,
    pub attention_bias: Option<bool>,
    pub sliding_window: Option<usize>,
    pub use_sliding_window: Option<bool>,
    /// What Gemma 3 adds (its activation, window pattern, local RoPE, query scale).
    #[serde(flatten)]
    pub gemma: HfGemma,
    /// The files store RMSNorm factors already shifted (GGUF's converter adds Gemma's 1 to
    /// its `w`); no `config.json` says so.
    #[serde(skip)]
    pub norms_shifted: bool,
    /// The language model's configuration inside a multimodal one (Gemma 3 4B and larger:
    /// `Gemma3ForConditionalGeneration`), read as the model (`HfConfig::language_model`).
    pub text_config: Option<Box<HfConfig>>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<OneOrMany>,
}

impl HfConfig {
    /// The configuration of the model rustle runs: a multimodal Gemma 3's language model
    /// (its `text_config`, the vision tower left out), else this one. Gemma 3's fields that
    /// its files leave to transformers' defaults (`Gemma3TextConfig`'s) are filled in.
    pub fn language_model(self) -> HfConfig {
        let wrapped = self
            .architectures
            .as_ref()
            .and_then(|a| a.first())
            .map(String::as_str)
            == Some("Gemma3ForConditionalGeneration");
        let mut text = match (wrapped, self.text_config.clone()) {
            (true, Some(text)) => HfConfig {
                architectures: Some(vec!["Gemma3ForCausalLM".into()]),
                model_type: Some("gemma3_text".into()),
                bos_token_id: text.bos_token_id.or(self.bos_token_id),
                eos_token_id: text.eos_token_id.clone().or(self.eos_token_id.clone()),
                gemma: HfGemma {
                    torch_dtype: text
                        .gemma
                        .torch_dtype
                        .clone()
                        .or(self.gemma.torch_dtype.clone()),
                    dtype: text.gemma.dtype.clone().or(self.gemma.dtype.clone()),
                    ..text.gemma.clone()
                },
                ..*text
            },
            _ => self,
        };
        if text.model_type.as_deref() == Some("gemma3_text") {
            text.fill_gemma3_defaults();
        }
        text
    }

    /// `Gemma3TextConfig`'s defaults for the fields not set.
    fn fill_gemma3_defaults(&mut self) {
        fn or<T>(field: &mut Option<T>, default: T) {
            field.get_or_insert(default);
        }
        or(&mut self.vocab_size, 262_208);
        or(&mut self.num_attention_heads, 8);
        or(&mut self.num_key_value_heads, 4);
        or(&mut self.head_dim, 256);
        or(&mut self.max_position_embeddings, 131_072);
        or(&mut self.rms_norm_eps, 1e-6);
        or(&mut self.gemma.query_pre_attn_scalar, 256.0);
        or(&mut self.sliding_window, 4096);
        or(&mut self.tie_word_embeddings, true);
        if self.gemma.hidden_activation.is_none() && self.gemma.hidden_act.is_none() {
            self.gemma.hidden_activation = Some("gelu_pytorch_tanh".into());
        }
        if self.rope_parameters.is_none() {
            or(&mut self.rope_theta, 1_000_000.0);
            or(&mut self.gemma.rope_local_base_freq, 10_000.0);
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

/// A mixture of experts in place of each layer's MLP: a router picks `top_k` of `n_experts`
/// experts for each token (a softmax over all of them, the best `top_k` kept, their weights
/// renormalized to sum to 1 where `renormalize`), and the token's MLP output is the weighted
/// sum of those experts' SwiGLU MLPs, each `expert_ffn_dim` wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moe {
    pub n_experts: usize,
    pub top_k: usize,
    pub expert_ffn_dim: usize,
    pub renormalize: bool,
}

/// Most experts a layer rustle reads (Qwen3-MoE has 128, DeepSeek-V3 256).
pub const MAX_EXPERTS: usize = 1 << 10;

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
    /// Dimensions of each query and key head that RoPE turns: `head_dim`, or less where the
    /// model says (`partial_rotary_factor`); even.
    pub rotary_dim: usize,
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
    /// Each query and key head RMSNormed over `head_dim` before RoPE, with weights of its
    /// own (`q_norm`, `k_norm`: Qwen3).
    pub qk_norm: bool,
    /// Every layer's MLP a mixture of experts (Mixtral, Qwen3-MoE); `None`: dense.
    pub moe: Option<Moe>,
    /// The MLP's gate activation.
    pub activation: Activation,
    /// The embedding's rows times this before the first layer (Gemma: sqrt(hidden)).
    pub embed_scale: Option<f32>,
    /// A norm of the attention's output and of the MLP's before each is added to the
    /// residual stream (Gemma 3's `post_attention_layernorm`, `post_feedforward_layernorm`).
    pub post_norms: bool,
    /// Local layers over a sliding window (Gemma 3); `None`: every layer global.
    pub sliding: Option<Sliding>,
    /// Added to every RMSNorm weight at load: 1 where the files store Gemma's `w` of `x (1 +
    /// w)`, 0 where they store the factor itself (GGUF's converter adds the 1).
    pub norm_offset: f32,
    /// The query heads' norm times this at load: `sqrt(head_dim / query_pre_attn_scalar)`,
    /// so that the kernels' `1 / sqrt(head_dim)` scales scores as the model's scalar does.
    pub query_scale: f32,
    pub bos_token: Option<u32>,
    pub eos_tokens: Vec<u32>,
}

mod gemma;
pub mod limits;
mod rope_scaling;

pub use gemma::{Activation, HfGemma, RopeParameters, Sliding};
use rope_scaling::{Extension, resolve_rope_scaling, shown};
pub use rope_scaling::{HfRopeScaling, RopeScaling};

impl Config {
    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// The sliding window layer `layer` attends over, where it is a local layer.
    pub fn window(&self, layer: usize) -> Option<usize> {
        let s = self.sliding.as_ref()?;
        s.local[layer].then_some(s.window)
    }

    /// The sliding window, where every layer attends over one (Mistral's; Gemma 3's global
    /// layers see the whole context).
    pub fn window_everywhere(&self) -> Option<usize> {
        let s = self.sliding.as_ref()?;
        s.local.iter().all(|&l| l).then_some(s.window)
    }

    /// Query heads that share one key/value head (grouped-query attention).
    pub fn group_size(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// The parameters the model's weights hold (biases and norms left out). Every factor is
    /// bounded by `limits`, so this cannot overflow.
    pub fn n_params(&self) -> u64 {
        let (dim, q, kv, ffn) = (
            self.dim as u64,
            self.q_dim() as u64,
            self.kv_dim() as u64,
            self.ffn_dim as u64,
        );
        let mlp = match self.moe {
            Some(m) => {
                m.n_experts as u64 * 3 * dim * m.expert_ffn_dim as u64 + m.n_experts as u64 * dim
            }
            None => 3 * dim * ffn,
        };
        let per_layer = dim * (q + 2 * kv) + q * dim + mlp;
        let heads = if self.tie_embeddings { 1 } else { 2 };
        self.n_layers as u64 * per_layer + heads * self.vocab_size as u64 * dim
    }

    /// Checks `hf` and derives the rest; errors name `config.json`'s fields.
    pub fn resolve(hf: &HfConfig) -> Result<Config> {
        Config::resolve_named(hf, &|field| format!("`{field}`"))
    }

    /// As `resolve`, with each field named as `name` spells it: GGUF files have other keys.
    pub fn resolve_named(hf: &HfConfig, name: &dyn Fn(&str) -> String) -> Result<Config> {
        let arch = Arch::from_hf(hf.architectures.as_deref(), hf.model_type.as_deref())?;
        let err = |msg: String| Err::<usize, _>(Error::Config(msg));
        let need = |v: Option<usize>, field: &str| {
            v.ok_or_else(|| Error::Config(format!("missing field {}", name(field))))
        };
        // Positive and at most `max`: every size below is then a small product.
        let bounded = |v: usize, field: &str, max: usize| {
            if v == 0 {
                err(format!("{} must be positive", name(field)))
            } else if v > max {
                err(format!(
                    "{} is {v}, more than rustle's limit of {max}",
                    name(field)
                ))
            } else {
                Ok(v)
            }
        };
        let dim = bounded(
            need(hf.hidden_size, "hidden_size")?,
            "hidden_size",
            limits::DIM,
        )?;
        let n_heads = bounded(
            need(hf.num_attention_heads, "num_attention_heads")?,
            "num_attention_heads",
            limits::HEADS,
        )?;
        let n_kv_heads = bounded(
            hf.num_key_value_heads.unwrap_or(n_heads),
            "num_key_value_heads",
            limits::HEADS,
        )?;
        if n_heads % n_kv_heads != 0 {
            return Err(Error::Config(format!(
                "{} {n_heads} is not a multiple of {} {n_kv_heads}",
                name("num_attention_heads"),
                name("num_key_value_heads")
            )));
        }
        let head_dim = match hf.head_dim {
            Some(h) => h,
            None if dim % n_heads == 0 => dim / n_heads,
            None => {
                return Err(Error::Config(format!(
                    "{} {dim} is not a multiple of {} {n_heads} and {} is not set",
                    name("hidden_size"),
                    name("num_attention_heads"),
                    name("head_dim")
                )));
            }
        };
        let head_dim = bounded(head_dim, "head_dim", limits::HEAD_DIM)?;
        if head_dim % 2 != 0 {
            return Err(Error::Config(format!(
                "{} {head_dim} must be even for RoPE",
                name("head_dim")
            )));
        }
        let partial = hf.partial_rotary_factor.or(hf
            .rope_parameters
            .as_ref()
            .and_then(|p| p.global().partial_rotary_factor));
        let rotary_dim = match (hf.rotary_dim, partial) {
            (Some(d), _) => d,
            (None, Some(f)) if f > 0.0 && f <= 1.0 => (head_dim as f64 * f) as usize,
            (None, Some(f)) => {
                return Err(Error::Config(format!(
                    "{} is {}; it must be above 0 and at most 1",
                    name("partial_rotary_factor"),
                    shown(f)
                )));
            }
            (None, None) => head_dim,
        };
        if rotary_dim == 0 || rotary_dim > head_dim || rotary_dim % 2 != 0 {
            return Err(Error::Config(format!(
                "RoPE turns {rotary_dim} dimensions of each head of {head_dim} ({}); it must be an even number from 2 to {head_dim}",
                name("partial_rotary_factor")
            )));
        }
        if n_heads * head_dim > limits::ATTENTION_WIDTH {
            return Err(Error::Config(format!(
                "{} {n_heads} times {} {head_dim} is {}, more than rustle's limit of {}",
                name("num_attention_heads"),
                name("head_dim"),
                n_heads * head_dim,
                limits::ATTENTION_WIDTH
            )));
        }
        let n_layers = bounded(
            need(hf.num_hidden_layers, "num_hidden_layers")?,
            "num_hidden_layers",
            limits::LAYERS,
        )?;
        let ffn_dim = bounded(
            need(hf.intermediate_size, "intermediate_size")?,
            "intermediate_size",
            limits::FFN_DIM,
        )?;
        let vocab_size = bounded(
            need(hf.vocab_size, "vocab_size")?,
            "vocab_size",
            limits::VOCAB,
        )?;
        let max_seq_len_before_window = bounded(
            need(hf.max_position_embeddings, "max_position_embeddings")?,
            "max_position_embeddings",
            limits::CONTEXT,
        )?;
        let mut max_seq_len = max_seq_len_before_window;
        // Another architecture's sliding window (Qwen2's, where `use_sliding_window` turns
        // it on for some layers only) changes attention only past the window: capping the
        // context there keeps every result exact. Mistral's and Gemma 3's windows are
        // attention's own (`Config::sliding`).
        let window = hf
            .sliding_window
            .filter(|&w| w > 0 && hf.use_sliding_window != Some(false));
        if let Some(window) = window
            && !matches!(arch, Arch::Mistral | Arch::Gemma3)
        {
            max_seq_len = max_seq_len.min(window);
        }
        // eps only keeps a zero row from dividing by zero: a small positive number, and one
        // that stays positive as the f32 the forward adds.
        let rms_eps = hf.rms_norm_eps.unwrap_or(1e-6);
        if !(rms_eps > 0.0 && rms_eps <= 1.0 && (rms_eps as f32) > 0.0) {
            return Err(Error::Config(format!(
                "{} is {}; it must be a small positive number such as 1e-5",
                name("rms_norm_eps"),
                shown(rms_eps)
            )));
        }
        // Frequencies theta^(-2i/d) must fall as i grows, and be finite.
        let rope_theta = hf
            .rope_theta
            .or(hf
                .rope_parameters
                .as_ref()
                .and_then(|p| p.global().rope_theta))
            .unwrap_or(10000.0);
        if !(rope_theta > 1.0 && rope_theta.is_finite()) {
            return Err(Error::Config(format!(
                "{} is {}; it must be a finite number above 1 such as 10000",
                name("rope_theta"),
                shown(rope_theta)
            )));
        }
        let rope_scaling = resolve_rope_scaling(
            hf.rope_scaling
                .as_ref()
                .or(hf.rope_parameters.as_ref().map(RopeParameters::global)),
            &Extension {
                rotary_dim,
                max_position: max_seq_len_before_window,
                original_max_position: hf.original_max_position_embeddings,
            },
            name,
        )?;
        let eos_tokens = match &hf.eos_token_id {
            Some(OneOrMany::One(id)) => vec![*id],
            Some(OneOrMany::Many(ids)) => ids.clone(),
            None => vec![],
        };
        for (field, id) in eos_tokens
            .iter()
            .map(|&id| ("eos_token_id", id))
            .chain(hf.bos_token_id.map(|id| ("bos_token_id", id)))
        {
            if id as usize >= vocab_size {
                return Err(Error::Config(format!(
                    "{} {id} is outside the vocabulary of {vocab_size}",
                    name(field)
                )));
            }
        }
        Ok(Config {
            arch,
            dim,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            rotary_dim,
            ffn_dim,
            vocab_size,
            max_seq_len,
            rms_eps: rms_eps as f32,
            rope_theta,
            rope_scaling,
            tie_embeddings: hf.tie_word_embeddings.unwrap_or(false),
            qkv_bias: arch == Arch::Qwen2 || hf.attention_bias.unwrap_or(false),
            qk_norm: matches!(arch, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3),
            moe: resolve_moe(hf, arch, ffn_dim, name)?,
            activation: gemma::resolve_activation(&hf.gemma, name)?,
            embed_scale: (arch == Arch::Gemma3).then(|| gemma::embed_scale(&hf.gemma, dim)),
            post_norms: arch == Arch::Gemma3,
            sliding: match arch {
                Arch::Gemma3 => Some(gemma::resolve_sliding(
                    &hf.gemma,
                    hf.sliding_window,
                    hf.rope_parameters.as_ref(),
                    n_layers,
                    name,
                )?),
                Arch::Mistral => window.filter(|&w| w < max_seq_len).map(|window| Sliding {
                    window,
                    local: vec![true; n_layers],
                    rope_theta: None,
                }),
                _ => None,
            },
            norm_offset: match arch == Arch::Gemma3 && !hf.norms_shifted {
                true => 1.0,
                false => 0.0,
            },
            query_scale: gemma::query_scale(&hf.gemma, arch == Arch::Gemma3, head_dim, name)?,
            bos_token: hf.bos_token_id,
            eos_tokens,
        })
    }
}

/// The mixture of experts `hf` describes, checked: Mixtral's `num_local_experts` (a GGUF
/// file's `expert_count`, whatever its architecture) or Qwen3-MoE's `num_experts`.
fn resolve_moe(
    hf: &HfConfig,
    arch: Arch,
    ffn_dim: usize,
    name: &dyn Fn(&str) -> String,
) -> Result<Option<Moe>> {
    let (experts_field, n_experts) = match (hf.num_local_experts, hf.num_experts) {
        (Some(n), _) => ("num_local_experts", n),
        (None, Some(n)) => ("num_experts", n),
        (None, None) if matches!(arch, Arch::Mixtral | Arch::Qwen3Moe) => {
            return Err(Error::Config(format!(
                "missing field {} for {arch:?}'s experts",
                name("num_experts")
            )));
        }
        (None, None) => return Ok(None),
    };
    if n_experts == 0 || n_experts > MAX_EXPERTS {
        return Err(Error::Config(format!(
            "{} is {n_experts}; rustle reads 1 to {MAX_EXPERTS} experts",
            name(experts_field)
        )));
    }
    let top_k = hf
        .num_experts_per_tok
        .ok_or_else(|| Error::Config(format!("missing field {}", name("num_experts_per_tok"))))?;
    if top_k == 0 || top_k > n_experts {
        return Err(Error::Config(format!(
            "{} is {top_k}; it must be 1 to the {n_experts} experts",
            name("num_experts_per_tok")
        )));
    }
    let expert_ffn_dim = hf.moe_intermediate_size.unwrap_or(ffn_dim);
    if expert_ffn_dim == 0 || expert_ffn_dim > limits::FFN_DIM {
        return Err(Error::Config(format!(
            "{} is {expert_ffn_dim}; it must be 1 to {}",
            name("moe_intermediate_size"),
            limits::FFN_DIM
        )));
    }
    // Layers without experts (Qwen3-MoE's `mlp_only_layers`, a sparse step above 1) are not
    // read: no released Qwen3-MoE has them.
    let every_layer = hf.decoder_sparse_step.unwrap_or(1) == 1
        && hf.mlp_only_layers.as_ref().is_none_or(|l| l.is_empty());
    if !every_layer {
        return Err(Error::Unsupported(format!(
            "{} and {}: rustle reads models whose every layer has experts",
            name("decoder_sparse_step"),
            name("mlp_only_layers")
        )));
    }
    // Mixtral's softmax is over the chosen experts: the same as renormalizing them.
    let renormalize = match arch {
        Arch::Qwen3Moe => hf.norm_topk_prob.unwrap_or(true),
        _ => true,
    };
    Ok(Some(Moe {
        n_experts,
        top_k,
        expert_ffn_dim,
        renormalize,
    }))
}

#[cfg(test)]
mod tests;
