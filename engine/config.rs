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
}

pub const SUPPORTED: &str = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, \
    Qwen3ForCausalLM, Phi3ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM";

/// The GGUF `general.architecture` names rustle reads, and the `model_type` each stands for
/// (llama.cpp's converter writes `llama` for Llama, Mistral, SmolLM and TinyLlama).
const GGUF_ARCHS: &[(&str, &str)] = &[
    ("llama", "llama"),
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
                supported: "llama (Llama, Mistral, Mixtral, SmolLM, TinyLlama), qwen2, qwen3, qwen3moe, phi3",
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
    pub rope_parameters: Option<HfRopeScaling>,
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
    /// `longrope`'s divisors of each turning pair's frequency: `short_factor` within the
    /// original context, `long_factor` past it.
    pub short_factor: Option<Vec<f64>>,
    pub long_factor: Option<Vec<f64>>,
    /// `longrope`'s scale of cos and sin (default from the extension's ratio).
    pub attention_factor: Option<f64>,
    /// Only inside `rope_parameters`.
    pub rope_theta: Option<f64>,
    /// Only inside `rope_parameters` (transformers 5).
    pub partial_rotary_factor: Option<f64>,
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
    /// Phi-3's `longrope` (also `su`): each turning pair's frequency divided by its factor,
    /// `short` for a context up to `original_max_position` and `long` past it, and cos and
    /// sin scaled by `attention_factor`.
    LongRope {
        short: Vec<f64>,
        long: Vec<f64>,
        original_max_position: usize,
        attention_factor: f64,
    },
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
    pub bos_token: Option<u32>,
    pub eos_tokens: Vec<u32>,
}

/// Bounds on what a model's configuration may say. Each is far above any released model
/// (Llama 3.1 405B: hidden 16384, ffn 53248, 126 layers, 128 heads of 128; vocabularies up to
/// about 256k tokens; contexts up to 10M), and together they keep every size derived from
/// them (a head group's width, a layer's weights, the parameter count) far inside 64 bits: a
/// corrupt number is refused here, by name, before it sizes anything.
pub mod limits {
    /// `hidden_size`
    pub const DIM: usize = 1 << 16;
    /// `intermediate_size`
    pub const FFN_DIM: usize = 1 << 18;
    /// `num_hidden_layers`
    pub const LAYERS: usize = 1 << 10;
    /// `num_attention_heads` (and so `num_key_value_heads`)
    pub const HEADS: usize = 1 << 10;
    /// `head_dim`
    pub const HEAD_DIM: usize = 1 << 10;
    /// Query heads times `head_dim`: the attention's width.
    pub const ATTENTION_WIDTH: usize = 1 << 16;
    /// `vocab_size`
    pub const VOCAB: usize = 1 << 22;
    /// `max_position_embeddings`: positions are u32 on the GPU, and 16M is past any model.
    pub const CONTEXT: usize = 1 << 24;
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
            .and_then(|p| p.partial_rotary_factor));
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
        // Mistral's sliding window changes attention only past the window; capping the
        // context there keeps every result exact without a windowed kernel.
        if let Some(window) = hf.sliding_window
            && hf.use_sliding_window != Some(false)
            && window > 0
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
            .or(hf.rope_parameters.as_ref().and_then(|p| p.rope_theta))
            .unwrap_or(10000.0);
        if !(rope_theta > 1.0 && rope_theta.is_finite()) {
            return Err(Error::Config(format!(
                "{} is {}; it must be a finite number above 1 such as 10000",
                name("rope_theta"),
                shown(rope_theta)
            )));
        }
        let rope_scaling = resolve_rope_scaling(
            hf.rope_scaling.as_ref().or(hf.rope_parameters.as_ref()),
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
            qk_norm: matches!(arch, Arch::Qwen3 | Arch::Qwen3Moe),
            moe: resolve_moe(hf, arch, ffn_dim, name)?,
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

/// A number for a message: exponent notation when plain digits would run long.
fn shown(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-4..1e6).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        v.to_string()
    }
}

/// What a `longrope` scaling is checked against: the turning pairs its factors cover, and
/// the context it extends (`max_position_embeddings` over the original).
struct Extension {
    rotary_dim: usize,
    max_position: usize,
    original_max_position: Option<usize>,
}

fn resolve_rope_scaling(
    s: Option<&HfRopeScaling>,
    ext: &Extension,
    name: &dyn Fn(&str) -> String,
) -> Result<RopeScaling> {
    let Some(s) = s else {
        return Ok(RopeScaling::None);
    };
    let kind = s
        .rope_type
        .as_deref()
        .or(s.kind.as_deref())
        .unwrap_or("default");
    let scaling = name("rope_scaling");
    let err = |msg: String| Error::Config(format!("{scaling} {kind:?}: {msg}"));
    // Stretching only: a factor below 1 would squeeze positions together.
    let factor = || match s.factor {
        Some(f) if f >= 1.0 && f.is_finite() => Ok(f),
        Some(f) => Err(err(format!(
            "`factor` is {}; it must be finite and at least 1",
            shown(f)
        ))),
        None => Err(err("missing `factor`".into())),
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: factor()? }),
        "llama3" => {
            let field = |v: Option<f64>, field: &str| match v {
                Some(v) if v > 0.0 && v.is_finite() => Ok(v),
                Some(v) => Err(err(format!(
                    "`{field}` is {}; it must be positive",
                    shown(v)
                ))),
                None => Err(err(format!("missing `{field}`"))),
            };
            let low = field(s.low_freq_factor, "low_freq_factor")?;
            let high = field(s.high_freq_factor, "high_freq_factor")?;
            if high <= low {
                return Err(err(format!(
                    "high_freq_factor {} must exceed low_freq_factor {}",
                    shown(high),
                    shown(low)
                )));
            }
            let original_max_position = match s.original_max_position_embeddings {
                Some(n) if (1..=limits::CONTEXT).contains(&n) => n,
                Some(n) => {
                    return Err(err(format!(
                        "`original_max_position_embeddings` is {n}; it must be 1 to {}",
                        limits::CONTEXT
                    )));
                }
                None => return Err(err("missing `original_max_position_embeddings`".into())),
            };
            Ok(RopeScaling::Llama3 {
                factor: factor()?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position,
            })
        }
        "longrope" | "su" => {
            let original_max_position = match s
                .original_max_position_embeddings
                .or(ext.original_max_position)
            {
                Some(n) if (1..=limits::CONTEXT).contains(&n) => n,
                Some(n) => {
                    return Err(err(format!(
                        "`original_max_position_embeddings` is {n}; it must be 1 to {}",
                        limits::CONTEXT
                    )));
                }
                None => return Err(err("missing `original_max_position_embeddings`".into())),
            };
            let pairs = ext.rotary_dim / 2;
            let factors = |v: &Option<Vec<f64>>, field: &str| match v {
                Some(f) if f.len() != pairs => Err(err(format!(
                    "`{field}` has {} factors; RoPE turns {pairs} pairs of each head",
                    f.len()
                ))),
                Some(f) => match f.iter().find(|x| !(**x > 0.0 && x.is_finite())) {
                    Some(bad) => Err(err(format!(
                        "`{field}` holds {}; factors must be positive",
                        shown(*bad)
                    ))),
                    None => Ok(f.clone()),
                },
                None => Err(err(format!("missing `{field}`"))),
            };
            // transformers' default: the square root of 1 + ln(extension) / ln(original).
            let extension = ext.max_position as f64 / original_max_position as f64;
            let attention_factor = match s.attention_factor {
                Some(a) if a > 0.0 && a.is_finite() => a,
                Some(a) => {
                    return Err(err(format!(
                        "`attention_factor` is {}; it must be positive",
                        shown(a)
                    )));
                }
                None if extension <= 1.0 => 1.0,
                None => (1.0 + extension.ln() / (original_max_position as f64).ln()).sqrt(),
            };
            Ok(RopeScaling::LongRope {
                short: factors(&s.short_factor, "short_factor")?,
                long: factors(&s.long_factor, "long_factor")?,
                original_max_position,
                attention_factor,
            })
        }
        other => Err(Error::Config(format!(
            "{scaling} type {other:?} is not supported (default, linear, llama3, longrope are)"
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
    fn qwen3_norms_its_heads_and_takes_head_dim_as_given() {
        // Qwen3-0.6B's widths: 16 heads of 128 over a residual of 1024.
        let q = parse(
            &SMOLLM2
                .replace("LlamaForCausalLM", "Qwen3ForCausalLM")
                .replace("\"vocab_size\"", "\"head_dim\": 128, \"vocab_size\"")
                .replace("\"num_attention_heads\": 9", "\"num_attention_heads\": 16")
                .replace("\"num_key_value_heads\": 3", "\"num_key_value_heads\": 8")
                .replace("576", "1024"),
        )
        .unwrap();
        assert_eq!(q.arch, Arch::Qwen3);
        assert!(q.qk_norm && !q.qkv_bias);
        assert_eq!((q.head_dim, q.q_dim(), q.kv_dim()), (128, 2048, 1024));
        assert!(!parse(SMOLLM2).unwrap().qk_norm);
    }

    #[test]
    fn phi3_partial_rotary_and_longrope() {
        // Phi-4-mini's heads: 96 of 128 dimensions turn, so each factor list has 48.
        let list = |v: f64| format!("{:?}", vec![v; 48]);
        let json = SMOLLM2
            .replace("LlamaForCausalLM", "Phi3ForCausalLM")
            .replace("\"vocab_size\"", "\"head_dim\": 128, \"vocab_size\"")
            .replace(
                "\"max_position_embeddings\": 8192",
                "\"max_position_embeddings\": 131072",
            )
            .replace(
                "\"tie_word_embeddings\"",
                &format!(
                    r#""partial_rotary_factor": 0.75, "original_max_position_embeddings": 4096,
                       "rope_scaling": {{"type": "longrope", "short_factor": {},
                                        "long_factor": {}}}, "tie_word_embeddings""#,
                    list(1.0),
                    list(3.0)
                ),
            );
        let c = parse(&json).unwrap();
        assert_eq!((c.arch, c.head_dim, c.rotary_dim), (Arch::Phi3, 128, 96));
        let RopeScaling::LongRope {
            short,
            long,
            original_max_position,
            attention_factor,
        } = &c.rope_scaling
        else {
            panic!("{:?}", c.rope_scaling)
        };
        assert_eq!(
            (short.len(), long[0], *original_max_position),
            (48, 3.0, 4096)
        );
        // transformers' default: sqrt(1 + ln(131072 / 4096) / ln(4096)).
        let want = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt();
        assert!((attention_factor - want).abs() < 1e-12);
        // A list that does not cover the turning pairs is named.
        let short_list = json.replacen(&list(1.0), &format!("{:?}", vec![1.0; 64]), 1);
        let err = parse(&short_list).unwrap_err().to_string();
        assert!(
            err.contains("`short_factor` has 64 factors") && err.contains("48"),
            "{err}"
        );
    }

    #[test]
    fn mixtures_of_experts() {
        let mixtral = parse(
            &SMOLLM2
                .replace("LlamaForCausalLM", "MixtralForCausalLM")
                .replace(
                    "\"vocab_size\"",
                    "\"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"vocab_size\"",
                ),
        )
        .unwrap();
        let want = Moe {
            n_experts: 8,
            top_k: 2,
            expert_ffn_dim: 1536,
            renormalize: true,
        };
        assert_eq!(mixtral.moe, Some(want));
        // Qwen3-30B-A3B's router: 128 experts of 768, 8 a token, renormalized.
        let qwen = SMOLLM2
            .replace("LlamaForCausalLM", "Qwen3MoeForCausalLM")
            .replace(
                "\"vocab_size\"",
                r#""num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
               "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
               "vocab_size""#,
            );
        let q = parse(&qwen).unwrap();
        assert!(q.qk_norm);
        assert_eq!(
            q.moe.map(|m| (m.n_experts, m.top_k, m.expert_ffn_dim)),
            Some((128, 8, 768))
        );
        // A layer without experts is refused by name; so is choosing more than there are.
        let dense_layers = qwen.replace("\"mlp_only_layers\": []", "\"mlp_only_layers\": [0]");
        assert!(
            parse(&dense_layers)
                .unwrap_err()
                .to_string()
                .contains("mlp_only_layers")
        );
        let too_many = qwen.replace("\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 200");
        assert!(
            parse(&too_many)
                .unwrap_err()
                .to_string()
                .contains("num_experts_per_tok")
        );
        assert_eq!(parse(SMOLLM2).unwrap().moe, None);
    }

    #[test]
    fn llama3_rope_scaling_and_eos_list() {
        let json = SMOLLM2.replace("49152", "128256").replace(
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

    fn with(field: &str, value: &str) -> String {
        let json: serde_json::Value = serde_json::from_str(SMOLLM2).unwrap();
        let mut json = json.as_object().unwrap().clone();
        json.insert(field.into(), serde_json::from_str(value).unwrap());
        serde_json::Value::Object(json).to_string()
    }

    fn refused(field: &str, value: &str) -> String {
        parse(&with(field, value)).unwrap_err().to_string()
    }

    #[test]
    fn sizes_past_the_limits_are_refused_before_they_multiply() {
        // Values whose products wrap to plausible shapes (2^63 + 4 heads of 16 are 64 wide
        // modulo 2^64) are refused by the bound on each factor.
        assert_eq!(
            refused("head_dim", "9223372036854775824"),
            "config: `head_dim` is 9223372036854775824, more than rustle's limit of 1024"
        );
        assert_eq!(
            refused("num_attention_heads", "9223372036854775812"),
            "config: `num_attention_heads` is 9223372036854775812, more than rustle's limit of 1024"
        );
        assert_eq!(
            refused("num_hidden_layers", "4294967296"),
            "config: `num_hidden_layers` is 4294967296, more than rustle's limit of 1024"
        );
        assert_eq!(
            refused("vocab_size", "18446744073709551615"),
            "config: `vocab_size` is 18446744073709551615, more than rustle's limit of 4194304"
        );
        assert_eq!(
            refused("max_position_embeddings", "16777217"),
            "config: `max_position_embeddings` is 16777217, more than rustle's limit of 16777216"
        );
        let wide = parse(
            &with("head_dim", "1024")
                .replace("\"num_attention_heads\":9", "\"num_attention_heads\":96"),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            wide,
            "config: `num_attention_heads` 96 times `head_dim` 1024 is 98304, more than rustle's limit of 65536"
        );
        // The largest configuration the limits allow still counts its parameters in u64.
        let c = parse(&SMOLLM2.replace("49152", "4194304")).unwrap();
        assert!(c.n_params() > 0);
    }

    #[test]
    fn zero_and_odd_head_dims_are_named_for_what_they_are() {
        assert_eq!(
            refused("head_dim", "0"),
            "config: `head_dim` must be positive"
        );
        assert_eq!(
            refused("head_dim", "63"),
            "config: `head_dim` 63 must be even for RoPE"
        );
    }

    #[test]
    fn values_outside_their_meaning_are_refused() {
        assert_eq!(
            refused("rms_norm_eps", "-1"),
            "config: `rms_norm_eps` is -1; it must be a small positive number such as 1e-5"
        );
        assert_eq!(
            refused("rms_norm_eps", "1e-50"),
            "config: `rms_norm_eps` is 1e-50; it must be a small positive number such as 1e-5"
        );
        assert_eq!(
            refused("rope_theta", "0"),
            "config: `rope_theta` is 0; it must be a finite number above 1 such as 10000"
        );
        assert_eq!(
            refused("rope_theta", "0.5"),
            "config: `rope_theta` is 0.5; it must be a finite number above 1 such as 10000"
        );
        assert_eq!(
            refused("rope_scaling", r#"{"rope_type": "linear", "factor": 0.5}"#),
            "config: `rope_scaling` \"linear\": `factor` is 0.5; it must be finite and at least 1"
        );
        assert_eq!(
            refused(
                "rope_scaling",
                r#"{"rope_type": "llama3", "factor": 8, "low_freq_factor": -1,
                    "high_freq_factor": 4, "original_max_position_embeddings": 8192}"#
            ),
            "config: `rope_scaling` \"llama3\": `low_freq_factor` is -1; it must be positive"
        );
        assert_eq!(
            refused("eos_token_id", "49152"),
            "config: `eos_token_id` 49152 is outside the vocabulary of 49152"
        );
    }

    #[test]
    fn messages_name_fields_as_the_source_spells_them() {
        let hf: HfConfig = serde_json::from_str(&with("head_dim", "0")).unwrap();
        let e = Config::resolve_named(&hf, &|f| format!("<{f}>")).unwrap_err();
        assert_eq!(e.to_string(), "config: <head_dim> must be positive");
    }
}
