//! Finding and opening a model: a Hugging Face folder or a GGUF file, to one `Config`, one
//! weight table and one tokenizer.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::{Config, HfConfig, HfGemma, OneOrMany};
use crate::cpu::fast::weights::FastWeights;
use crate::error::{Error, Result};
use crate::model::{HeadOrder, ModelWeights, Stored};
use crate::tokenizer::Tokenizer;
use crate::weights::fused::split_fused;
use crate::weights::gguf::{GgufFile, MetaValue};
use crate::weights::{DType, RawTensor, Weights, safetensors};

pub struct LoadedModel {
    pub config: Config,
    pub weights: ModelWeights,
    pub tokenizer: Tokenizer,
    /// What was opened, for messages: "SmolLM2-135M-Instruct.Q4_1.gguf (GGUF, llama)".
    pub description: String,
    /// The tensors as the files store them: (dtype, how many, bytes), the most bytes first.
    pub stored: Vec<(DType, usize, usize)>,
}

impl LoadedModel {
    /// "4.92 GB in the files: q4_k 193 (3.37 GB), q6_k 33 (1.32 GB), f32 65 (266.5 kB)".
    pub fn stored_summary(&self) -> String {
        stored_summary(&self.stored)
    }
}

/// `LoadedModel::stored_summary` of any table of stored tensors.
pub fn stored_summary(stored: &[(DType, usize, usize)]) -> String {
    let total: usize = stored.iter().map(|s| s.2).sum();
    let parts: Vec<String> = stored
        .iter()
        .map(|(d, n, b)| format!("{d} {n} ({})", bytes_text(*b)))
        .collect();
    format!("{} in the files: {}", bytes_text(total), parts.join(", "))
}

/// A model as the fast CPU backend holds it: its weights as the files store them.
pub struct FastModel {
    pub config: Config,
    pub weights: FastWeights,
    pub tokenizer: Tokenizer,
    pub description: String,
    /// The tensors as the files store them: (dtype, how many, bytes), the most bytes first.
    pub stored: Vec<(DType, usize, usize)>,
}

impl FastModel {
    /// "98.4 MB, 100.0% of the file's tensor bytes": what the backend holds for the weights.
    pub fn held_summary(&self) -> String {
        let file: usize = self.stored.iter().map(|s| s.2).sum();
        let held = self.weights.held_bytes();
        format!(
            "{}, {:.1}% of the files' tensor bytes",
            bytes_text(held),
            100.0 * held as f64 / file.max(1) as f64
        )
    }
}

/// A size for messages: "3.37 GB", "97.1 MB", "266.5 kB", "12 bytes".
pub fn bytes_text(b: usize) -> String {
    let b = b as f64;
    match b {
        b if b >= 1e9 => format!("{:.2} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.1} MB", b / 1e6),
        b if b >= 1e3 => format!("{:.1} kB", b / 1e3),
        b => format!("{b} bytes"),
    }
}

/// Opens `path`: a folder with `config.json`, or a `.gguf` file. Everything cheap is checked
/// first (the configuration, the tokenizer, every tensor's name, dtype and shape, the memory
/// the weights need), so a bad model is refused before any weight is read.
pub fn load(path: &Path) -> Result<LoadedModel> {
    open(path)?.into_f32()
}

/// A model opened and checked, its weights still as the files store them (memory-mapped):
/// the f32 weights (`into_f32`) or the fast CPU backend's (`cpu::fast::weights`) are made
/// from it.
pub struct OpenedModel {
    pub config: Config,
    pub raw: Weights,
    pub tokenizer: Tokenizer,
    /// The file's Q and K rows are in the order GGUF converters write for `llama` models.
    pub qk_permuted: bool,
    /// What was opened, for messages: "SmolLM2-135M-Instruct.Q4_1.gguf (GGUF, llama)".
    pub description: String,
}

impl OpenedModel {
    /// The tensors as the files store them: (dtype, how many, bytes), the most bytes first.
    pub fn stored(&self) -> Vec<(DType, usize, usize)> {
        self.raw.by_type()
    }

    /// The weights as the files store them, for the fast CPU backend.
    pub fn into_fast(self) -> Result<FastModel> {
        let stored = self.raw.by_type();
        fits(stored.iter().map(|s| s.2 as u64).sum(), "as stored")?;
        let weights = FastWeights::load(&self.config, &self.raw, self.qk_permuted)?;
        Ok(FastModel {
            description: self.description,
            stored,
            config: self.config,
            weights,
            tokenizer: self.tokenizer,
        })
    }

    /// Every weight dequantized to f32 (the reference backend's and the GPU upload's).
    pub fn into_f32(self) -> Result<LoadedModel> {
        check_params_fit(&self.config)?;
        let mut weights = ModelWeights::load(&self.config, &self.raw, self.qk_permuted)?;
        let stored = self.raw.by_type();
        // The GPU can upload quantized matrices in their blocks (`--weights stored`).
        weights.stored = Some(Arc::new(Stored {
            weights: self.raw,
            head_order: HeadOrder::new(&self.config, self.qk_permuted),
        }));
        Ok(LoadedModel {
            description: self.description,
            stored,
            config: self.config,
            weights,
            tokenizer: self.tokenizer,
        })
    }
}

/// Opens and checks `path` (as `load` does) without reading the weights.
pub fn open(path: &Path) -> Result<OpenedModel> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if meta.is_dir() {
        return open_hf(path);
    }
    if let Some(dir) = folder_of_hf_file(path)? {
        return open_hf(&dir);
    }
    let g = GgufFile::open(path)?;
    let arch = g
        .get("general.architecture")
        .and_then(MetaValue::as_str)
        .unwrap_or("")
        .to_owned();
    let config = Config::resolve_named(&gguf_config(&g)?, &|field| gguf_key(&arch, field))?;
    check_value_length(&g, &arch, &config)?;
    let tokenizer = Tokenizer::from_gguf(&g)?;
    check_vocab(&config, &tokenizer)?;
    // The converter permutes Q and K for `llama` files only.
    let qk_permuted = arch == "llama";
    let mut raw = gguf_weights(g, &arch)?;
    split_fused(&config, &mut raw)?;
    ModelWeights::check(&config, &raw)?;
    Ok(OpenedModel {
        description: format!("{} (GGUF, {arch})", file_name(path)),
        config,
        raw,
        tokenizer,
        qk_permuted,
    })
}

fn open_hf(dir: &Path) -> Result<OpenedModel> {
    let (config, mut raw, tokenizer) = open_hf_folder(dir)?;
    check_vocab(&config, &tokenizer)?;
    split_fused(&config, &mut raw)?;
    ModelWeights::check(&config, &raw)?;
    Ok(OpenedModel {
        description: format!("{} (safetensors, {:?})", file_name(dir), config.arch),
        config,
        raw,
        tokenizer,
        qk_permuted: false,
    })
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A file of a Hugging Face folder given in place of the folder (`-m dir/model.safetensors`):
/// the folder, when its `config.json` is beside the file; an error that says to pass the
/// folder when it is not. `None` for any other file (a GGUF file, say).
fn folder_of_hf_file(path: &Path) -> Result<Option<PathBuf>> {
    let name = file_name(path);
    let hf_file = name.ends_with(".safetensors")
        || name == "model.safetensors.index.json"
        || name == "config.json";
    if !hf_file {
        return Ok(None);
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    if dir.join("config.json").is_file() {
        return Ok(Some(dir));
    }
    Err(Error::Usage(format!(
        "{}: one file of a Hugging Face model, with no config.json beside it; pass the folder that holds config.json, tokenizer.json and the .safetensors files",
        path.display()
    )))
}

/// The weights are held as f32 in host memory; a model that cannot fit is one clear line
/// rather than an allocation failure halfway through loading.
pub fn check_params_fit(c: &Config) -> Result<()> {
    fits(c.n_params().saturating_mul(4), "as f32")
}

fn fits(need: u64, form: &str) -> Result<()> {
    if let Some(available) = available_memory()
        && need > available
    {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        return Err(Error::Usage(format!(
            "this model's weights {form} need {:.1} GiB of memory; {:.1} GiB is available",
            gib(need),
            gib(available)
        )));
    }
    Ok(())
}

/// `MemAvailable` from /proc/meminfo, in bytes (Linux); `None` where it cannot be read.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn check_vocab(config: &Config, tok: &Tokenizer) -> Result<()> {
    if tok.vocab_size() > config.vocab_size {
        return Err(Error::Tokenizer(format!(
            "the tokenizer has {} tokens but the model's vocabulary is {}",
            tok.vocab_size(),
            config.vocab_size
        )));
    }
    Ok(())
}

fn open_hf_folder(dir: &Path) -> Result<(Config, Weights, Tokenizer)> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?;
    let hf: HfConfig = serde_json::from_str(&text).map_err(|e| Error::Format {
        path: cfg_path.clone(),
        format: "config.json",
        reason: e.to_string(),
    })?;
    let config = Config::resolve(&hf.language_model())?;
    let tokenizer = Tokenizer::from_hf_folder(dir, &config.eos_tokens, config.bos_token)?;
    let weights = safetensors::open_folder(dir)?;
    Ok((config, weights, tokenizer))
}

/// The GGUF metadata as the `config.json` fields they stand for.
fn gguf_config(g: &GgufFile) -> Result<HfConfig> {
    let arch = g
        .get("general.architecture")
        .and_then(MetaValue::as_str)
        .ok_or_else(|| Error::Config("GGUF metadata has no `general.architecture`".into()))?;
    let model_type = crate::config::Arch::gguf_model_type(arch)?;
    let num = |key: &str| {
        let key = format!("{arch}.{key}");
        let v = g.get(&key).and_then(MetaValue::as_u64);
        typed(
            g,
            &key,
            "a non-negative integer",
            v.map(|v| usize::try_from(v).unwrap_or(usize::MAX)),
        )
    };
    let float = |key: &str| {
        let key = format!("{arch}.{key}");
        typed(g, &key, "a number", g.get(&key).and_then(MetaValue::as_f64))
    };
    let id = |key: &str| {
        let v = g.get(key).and_then(MetaValue::as_u64);
        typed(g, key, "a token id", v.and_then(|v| u32::try_from(v).ok()))
    };
    let n_tokens = g
        .get("tokenizer.ggml.tokens")
        .and_then(MetaValue::as_array)
        .map(|a| a.len());
    let token_embd = g.tensors.iter().find(|t| t.name == "token_embd.weight");
    let mut hf = HfConfig {
        model_type: Some(model_type.to_owned()),
        hidden_size: num("embedding_length")?,
        intermediate_size: num("feed_forward_length")?,
        num_hidden_layers: num("block_count")?,
        num_attention_heads: num("attention.head_count")?,
        num_key_value_heads: num("attention.head_count_kv")?,
        head_dim: num("attention.key_length")?,
        // The embedding's row count is the truth; the metadata key is optional.
        vocab_size: num("vocab_size")?
            .or(token_embd.and_then(|t| t.dims.get(1).copied()))
            .or(n_tokens),
        max_position_embeddings: num("context_length")?,
        rms_norm_eps: float("attention.layer_norm_rms_epsilon")?,
        rope_theta: float("rope.freq_base")?,
        rotary_dim: num("rope.dimension_count")?,
        num_local_experts: num("expert_count")?.filter(|&n| n > 0),
        num_experts_per_tok: num("expert_used_count")?,
        moe_intermediate_size: num("expert_feed_forward_length")?,
        original_max_position_embeddings: num("rope.scaling.original_context_length")?,
        rope_scaling: match gguf_longrope(g, arch)? {
            Some(longrope) => Some(longrope),
            None => gguf_rope_scaling(g, arch),
        },
        tie_word_embeddings: Some(!g.tensors.iter().any(|t| t.name == "output.weight")),
        bos_token_id: id("tokenizer.ggml.bos_token_id")?,
        eos_token_id: id("tokenizer.ggml.eos_token_id")?.map(OneOrMany::One),
        sliding_window: num("attention.sliding_window")?,
        gemma: HfGemma {
            sliding_window_pattern: num("attention.sliding_window_pattern")?,
            rope_local_base_freq: float("rope.freq_base_swa")?,
            final_logit_softcapping: float("final_logit_softcapping")?,
            attn_logit_softcapping: float("attn_logit_softcapping")?,
            ..Default::default()
        },
        norms_shifted: true,
        ..Default::default()
    };
    if arch == "gemma3" {
        // The file does not say how queries are scaled; llama.cpp takes 27B's (62 layers)
        // from hidden / heads and the others' from the head's width, as Google's
        // configurations have them.
        hf.gemma.query_pre_attn_scalar =
            match (hf.num_hidden_layers, hf.hidden_size, hf.num_attention_heads) {
                (Some(62), Some(dim), Some(heads)) if heads > 0 => Some((dim / heads) as f64),
                _ => hf.head_dim.map(|d| d as f64),
            };
        // Its files leave the local layers' kind to llama.cpp's default, every 6th global;
        // a file without a window has none (llama.cpp's reading), every layer global.
        if hf.sliding_window.is_none() {
            let n = hf.num_hidden_layers.unwrap_or(0);
            hf.gemma.layer_types = Some(vec!["full_attention".into(); n]);
            hf.sliding_window = hf.max_position_embeddings;
        }
        hf = hf.language_model();
    }
    Ok(hf)
}

/// rustle's attention has one head width for keys and values: a GGUF file that says
/// otherwise is refused (checked after the configuration, whose bounds come first).
fn check_value_length(g: &GgufFile, arch: &str, config: &Config) -> Result<()> {
    let key = format!("{arch}.attention.value_length");
    let read = g.get(&key).and_then(MetaValue::as_u64);
    match typed(g, &key, "a non-negative integer", read)? {
        Some(v) if v != config.head_dim as u64 => Err(Error::Config(format!(
            "`{key}` {v} differs from the head width {}: rustle needs keys and values of one width",
            config.head_dim
        ))),
        _ => Ok(()),
    }
}

/// `read`, the value of `key` read as what it should hold: `None` when the key is absent, an
/// error when it is there with another type (corruption, not absence).
fn typed<T>(g: &GgufFile, key: &str, want: &str, read: Option<T>) -> Result<Option<T>> {
    match (g.get(key), read) {
        (None, _) => Ok(None),
        (Some(_), Some(v)) => Ok(Some(v)),
        (Some(found), None) => Err(Error::Config(format!(
            "GGUF metadata `{key}` is {}, not {want}",
            found.brief()
        ))),
    }
}

/// The GGUF key that stands for a `config.json` field, for messages.
fn gguf_key(arch: &str, field: &str) -> String {
    let key = match field {
        "hidden_size" => "embedding_length",
        "intermediate_size" => "feed_forward_length",
        "num_hidden_layers" => "block_count",
        "num_attention_heads" => "attention.head_count",
        "num_key_value_heads" => "attention.head_count_kv",
        "head_dim" => "attention.key_length",
        "max_position_embeddings" => "context_length",
        "rms_norm_eps" => "attention.layer_norm_rms_epsilon",
        "rope_theta" => "rope.freq_base",
        "rope_scaling" => "rope.scaling",
        "sliding_window" => "attention.sliding_window",
        "sliding_window_pattern" => "attention.sliding_window_pattern",
        "rope_local_base_freq" => "rope.freq_base_swa",
        "final_logit_softcapping" => "final_logit_softcapping",
        "attn_logit_softcapping" => "attn_logit_softcapping",
        "vocab_size" => return "the vocabulary size (token_embd.weight's rows)".into(),
        "bos_token_id" | "eos_token_id" => {
            return format!("`tokenizer.ggml.{field}`");
        }
        other => return format!("`{other}`"),
    };
    format!("`{arch}.{key}`")
}

fn gguf_rope_scaling(g: &GgufFile, arch: &str) -> Option<crate::config::HfRopeScaling> {
    let kind = g
        .get(&format!("{arch}.rope.scaling.type"))
        .and_then(MetaValue::as_str)?;
    Some(crate::config::HfRopeScaling {
        rope_type: Some(kind.to_owned()),
        factor: g
            .get(&format!("{arch}.rope.scaling.factor"))
            .and_then(MetaValue::as_f64),
        ..Default::default()
    })
}

/// Phi-3's `longrope` as llama.cpp's converter writes it: no scaling type, the two lists of
/// factors as tensors (`rope_factors_short.weight`, `rope_factors_long.weight`, f32) and the
/// scale of cos and sin as `ARCH.rope.scaling.attn_factor`. `None` for a file without them.
fn gguf_longrope(g: &GgufFile, arch: &str) -> Result<Option<crate::config::HfRopeScaling>> {
    let factors = |name: &str| -> Result<Option<Vec<f64>>> {
        let Some(t) = g.tensors.iter().find(|t| t.name == name) else {
            return Ok(None);
        };
        if t.dtype != DType::F32 || t.dims.len() != 1 || t.n_bytes != 4 * t.dims[0] {
            return Err(Error::WeightMismatch {
                name: name.to_owned(),
                want: "a vector of f32".into(),
                found: format!("{:?} {}", t.dims, t.dtype),
            });
        }
        let bytes = g.data(t).chunks_exact(4);
        Ok(Some(
            bytes
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
                .collect(),
        ))
    };
    let (short, long) = (
        factors("rope_factors_short.weight")?,
        factors("rope_factors_long.weight")?,
    );
    if short.is_none() && long.is_none() {
        return Ok(None);
    }
    let key = format!("{arch}.rope.scaling.attn_factor");
    let attention_factor = typed(g, &key, "a number", g.get(&key).and_then(MetaValue::as_f64))?;
    Ok(Some(crate::config::HfRopeScaling {
        rope_type: Some("longrope".into()),
        short_factor: short,
        long_factor: long,
        attention_factor,
        ..Default::default()
    }))
}

/// GGUF tensor names, translated to the Hugging Face names the model asks for; `arch` is
/// the file's `general.architecture` (Gemma 3's norm before its MLP is `ffn_norm` too, but
/// under another name in its folders).
pub fn hf_name(gguf: &str, arch: &str) -> String {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return f.to_owned();
    }
    let Some(rest) = gguf.strip_prefix("blk.") else {
        return gguf.to_owned();
    };
    let Some((layer, rest)) = rest.split_once('.') else {
        return gguf.to_owned();
    };
    let Some((part, suffix)) = rest.split_once('.') else {
        return gguf.to_owned();
    };
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "ffn_norm" if arch == "gemma3" => "pre_feedforward_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "post_attention_norm" => "post_attention_layernorm",
        "post_ffw_norm" => "post_feedforward_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_qkv" => "self_attn.qkv_proj",
        "ffn_gate_inp" => "mlp.gate",
        // Every expert's matrix in one 3-D tensor (`weights::fused` splits them).
        "ffn_gate_exps" => "mlp.experts.gate_proj",
        "ffn_up_exps" => "mlp.experts.up_proj",
        "ffn_down_exps" => "mlp.experts.down_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return gguf.to_owned(),
    };
    format!("model.layers.{layer}.{hf}.{suffix}")
}

/// The tensor table under Hugging Face names. Two GGUF names for one weight (`output.weight`
/// and `lm_head.weight`, say) are an error, not a silent choice.
fn gguf_weights(g: GgufFile, arch: &str) -> Result<Weights> {
    let mut tensors: HashMap<String, RawTensor> = HashMap::with_capacity(g.tensors.len());
    let mut gguf_names: HashMap<String, &str> = HashMap::with_capacity(g.tensors.len());
    for t in &g.tensors {
        let name = hf_name(&t.name, arch);
        if let Some(other) = gguf_names.insert(name.clone(), &t.name) {
            return Err(Error::Format {
                path: g.path.clone(),
                format: "GGUF",
                reason: format!("tensors {other:?} and {:?} are both {name}", t.name),
            });
        }
        let raw = RawTensor {
            file: 0,
            offset: t.offset,
            n_bytes: t.n_bytes,
            dtype: t.dtype,
            // GGUF lists dimensions fastest first; the model wants `[out, in]`.
            shape: t.dims.iter().rev().copied().collect(),
        };
        tensors.insert(name, raw);
    }
    drop(gguf_names);
    Ok(Weights {
        files: vec![g.mmap],
        tensors,
    })
}

/// `--model`, else `$RUSTLE_MODEL`, else the default model (fetched once).
pub fn resolve_model_path(arg: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = arg {
        return Ok(p);
    }
    if let Some(p) = crate::knobs::Knobs::from_env()?.model {
        return Ok(p);
    }
    crate::default_model::ensure()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_read_in_the_unit_that_fits() {
        assert_eq!(bytes_text(12), "12 bytes");
        assert_eq!(bytes_text(266_500), "266.5 kB");
        assert_eq!(bytes_text(97_120_000), "97.1 MB");
        assert_eq!(bytes_text(3_370_000_000), "3.37 GB");
    }

    use super::*;

    #[test]
    fn gguf_names_map_to_hf_names() {
        assert_eq!(
            hf_name("token_embd.weight", "llama"),
            "model.embed_tokens.weight"
        );
        assert_eq!(
            hf_name("blk.12.ffn_down.weight", "llama"),
            "model.layers.12.mlp.down_proj.weight"
        );
        assert_eq!(
            hf_name("blk.0.attn_q.bias", "llama"),
            "model.layers.0.self_attn.q_proj.bias"
        );
        assert_eq!(
            hf_name("blk.3.attn_norm.weight", "llama"),
            "model.layers.3.input_layernorm.weight"
        );
        assert_eq!(
            hf_name("blk.5.attn_k_norm.weight", "llama"),
            "model.layers.5.self_attn.k_norm.weight"
        );
        assert_eq!(hf_name("rope_freqs.weight", "llama"), "rope_freqs.weight");
        // Gemma 3's four norms a layer.
        let gemma = |n: &str| hf_name(&format!("blk.2.{n}.weight"), "gemma3");
        assert_eq!(
            gemma("ffn_norm"),
            "model.layers.2.pre_feedforward_layernorm.weight"
        );
        assert_eq!(
            gemma("post_attention_norm"),
            "model.layers.2.post_attention_layernorm.weight"
        );
        assert_eq!(
            gemma("post_ffw_norm"),
            "model.layers.2.post_feedforward_layernorm.weight"
        );
        assert_eq!(gemma("attn_norm"), "model.layers.2.input_layernorm.weight");
    }

    /// A one-layer llama whose matrices hold the GGUF types that Q4_K_M, Q5_K_M and IQ4_XS
    /// files mix: it loads (the CPU and the GPU backends both start from these f32 weights),
    /// each matrix is its bytes dequantized, and a type rustle does not read is refused by
    /// name before anything is read.
    #[test]
    fn gguf_quantized_types_load_and_others_are_refused_by_name() {
        use crate::weights::DType;
        use crate::weights::dequant::to_f32;
        use crate::weights::gguf::tests::Writer;
        // dim 256: each row is one k-quant block. Every byte 0x11, so each f16 scale is
        // 0x1111 (about 5.7e-4) and every value finite.
        let dim = 256;
        let bytes = |ty: DType| vec![0x11u8; dim * dim / ty.block_len() * ty.block_bytes()];
        // (GGUF name, ggml type id, type); ffn_down's type is the test's to choose.
        let matrices = [
            ("attn_q", 6, DType::Q5_0),
            ("attn_k", 13, DType::Q5K),
            ("attn_v", 23, DType::IQ4XS),
            ("attn_output", 7, DType::Q5_1),
            ("ffn_gate", 10, DType::Q2K),
            ("ffn_up", 11, DType::Q3K),
        ];
        let model = |(down_id, down): (u32, DType)| {
            let mut w = Writer::new();
            w.meta_str("general.architecture", "llama")
                .meta_u32("llama.embedding_length", dim as u32)
                .meta_u32("llama.feed_forward_length", dim as u32)
                .meta_u32("llama.block_count", 1)
                .meta_u32("llama.attention.head_count", 4)
                .meta_u32("llama.attention.head_count_kv", 4)
                .meta_u32("llama.context_length", 64)
                .meta_str("tokenizer.ggml.model", "gpt2")
                .meta_str("tokenizer.ggml.pre", "smollm")
                .meta_strs("tokenizer.ggml.tokens", &["<|end|>", "a", "b", "ab"])
                .meta_i32s("tokenizer.ggml.token_type", &[3, 1, 1, 1])
                .meta_strs("tokenizer.ggml.merges", &["a b"])
                .meta_u32("tokenizer.ggml.eos_token_id", 0);
            let d = dim as u64;
            w.tensor_raw("token_embd.weight", &[d, 4], 8, &bytes(DType::Q8_0));
            for norm in ["output_norm", "blk.0.attn_norm", "blk.0.ffn_norm"] {
                w.tensor_f32(&format!("{norm}.weight"), &[d], &vec![1.0; dim]);
            }
            for (name, id, ty) in matrices {
                w.tensor_raw(&format!("blk.0.{name}.weight"), &[d, d], id, &bytes(ty));
            }
            w.tensor_raw("blk.0.ffn_down.weight", &[d, d], down_id, &bytes(down));
            let path = std::env::temp_dir()
                .join(format!("rustle-quant-{}-{down}.gguf", std::process::id()));
            std::fs::write(&path, w.finish()).unwrap();
            path
        };

        let path = model((20, DType::IQ4NL));
        let m = load(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let layer = &m.weights.layers[0];
        let (w_gate, w_up, w_down) = layer.mlp.dense().unwrap();
        let n = dim * dim;
        assert_eq!(
            layer.wv,
            to_f32(DType::IQ4XS, &bytes(DType::IQ4XS), n).unwrap()
        );
        assert_eq!(
            *w_down,
            to_f32(DType::IQ4NL, &bytes(DType::IQ4NL), n).unwrap()
        );
        assert_eq!(*w_up, to_f32(DType::Q3K, &bytes(DType::Q3K), n).unwrap());
        for w in [&layer.wq, &layer.wk, &layer.wv, &layer.wo, w_gate, w_up] {
            assert!(w.iter().all(|x| x.is_finite()) && w.iter().any(|&x| x != 0.0));
        }

        // Q8_K (ggml type 15) is llama.cpp's scratch type, IQ2_XXS (16) and TQ1_0 (34) types
        // rustle does not read: each known by name, never loaded.
        let reads = "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs";
        for (id, name) in [(15, "q8_k"), (16, "iq2_xxs"), (34, "tq1_0")] {
            let path = model((id, DType::from_ggml(id).unwrap()));
            let e = load(&path).err().unwrap().to_string();
            std::fs::remove_file(&path).unwrap();
            assert_eq!(
                e,
                format!(
                    "weight model.layers.0.mlp.down_proj.weight: want [256, 256], found [256, 256] {name}, which rustle does not read (it reads: {reads})"
                )
            );
        }
    }

    #[test]
    fn gguf_metadata_of_the_wrong_type_is_named() {
        use crate::weights::gguf::tests::Writer;
        let path = std::env::temp_dir().join(format!("rustle-loader-{}.gguf", std::process::id()));
        let mut w = Writer::new();
        w.meta_str("general.architecture", "llama")
            .meta_str("llama.attention.head_count", "four");
        std::fs::write(&path, w.finish()).unwrap();
        let e = load(&path).err().unwrap();
        assert_eq!(
            e.to_string(),
            "config: GGUF metadata `llama.attention.head_count` is the string \"four\", not a non-negative integer"
        );
        assert_eq!(
            gguf_key("qwen2", "head_dim"),
            "`qwen2.attention.key_length`"
        );
    }
}
