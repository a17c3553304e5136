//! Finding and opening a model: a Hugging Face folder or a GGUF file, to one `Config`, one
//! weight table and one tokenizer.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::config::{Config, HfConfig, OneOrMany};
use crate::error::{Error, Result};
use crate::model::ModelWeights;
use crate::tokenizer::Tokenizer;
use crate::weights::gguf::{GgufFile, MetaValue};
use crate::weights::{RawTensor, Weights, safetensors};

pub struct LoadedModel {
    pub config: Config,
    pub weights: ModelWeights,
    pub tokenizer: Tokenizer,
    /// What was opened, for messages: "SmolLM2-135M-Instruct.Q4_1.gguf (GGUF, llama)".
    pub description: String,
}

/// Opens `path`: a folder with `config.json`, or a `.gguf` file.
pub fn load(path: &Path) -> Result<LoadedModel> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if meta.is_dir() {
        let (config, weights, tokenizer) = open_hf_folder(path)?;
        check_host_memory(&weights)?;
        let weights = ModelWeights::load(&config, &weights, false)?;
        check_vocab(&config, &tokenizer)?;
        Ok(LoadedModel {
            description: format!("{name} (safetensors, {:?})", config.arch),
            config,
            weights,
            tokenizer,
        })
    } else {
        let g = GgufFile::open(path)?;
        let arch = g
            .get("general.architecture")
            .and_then(MetaValue::as_str)
            .unwrap_or("")
            .to_owned();
        let config = Config::resolve(&gguf_config(&g)?)?;
        let tokenizer = Tokenizer::from_gguf(&g)?;
        check_vocab(&config, &tokenizer)?;
        // The converter permutes Q and K for `llama` files only.
        let qk_permuted = arch == "llama";
        let raw = gguf_weights(g);
        check_host_memory(&raw)?;
        let weights = ModelWeights::load(&config, &raw, qk_permuted)?;
        Ok(LoadedModel {
            description: format!("{name} (GGUF, {arch})"),
            config,
            weights,
            tokenizer,
        })
    }
}

/// The weights are held as f32 in host memory; a model that cannot fit is one clear line
/// rather than an allocation failure halfway through loading.
fn check_host_memory(w: &Weights) -> Result<()> {
    let elements: usize = w
        .tensors
        .values()
        .map(|t| t.shape.iter().product::<usize>())
        .sum();
    fits(elements as u64 * 4)
}

/// Whether a model of this shape fits host memory as f32 (for synthetic weights).
pub fn check_params_fit(c: &Config) -> Result<()> {
    let per_layer =
        c.dim * (c.q_dim() + 2 * c.kv_dim()) + c.q_dim() * c.dim + 3 * c.dim * c.ffn_dim;
    let head = if c.tie_embeddings { 1 } else { 2 };
    let params = c.n_layers * per_layer + head * c.vocab_size * c.dim;
    fits(params as u64 * 4)
}

fn fits(need: u64) -> Result<()> {
    if let Some(available) = available_memory()
        && need > available
    {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        return Err(Error::Usage(format!(
            "this model's weights as f32 need {:.1} GiB of memory; {:.1} GiB is available",
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
    let config = Config::resolve(&hf)?;
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
    let model_type = match arch {
        "llama" | "qwen2" => arch,
        other => {
            return Err(Error::UnsupportedArchitecture {
                field: "general.architecture",
                found: other.to_owned(),
                supported: "llama (Llama, Mistral, SmolLM, TinyLlama), qwen2",
            });
        }
    };
    let num = |key: &str| {
        g.get(&format!("{arch}.{key}"))
            .and_then(MetaValue::as_u64)
            .map(|v| v as usize)
    };
    let float = |key: &str| g.get(&format!("{arch}.{key}")).and_then(MetaValue::as_f64);
    let n_tokens = g
        .get("tokenizer.ggml.tokens")
        .and_then(MetaValue::as_array)
        .map(|a| a.len());
    let token_embd = g.tensors.iter().find(|t| t.name == "token_embd.weight");
    let id = |key: &str| g.get(key).and_then(MetaValue::as_u64).map(|v| v as u32);
    let hidden = num("embedding_length");
    let heads = num("attention.head_count");
    Ok(HfConfig {
        model_type: Some(model_type.to_owned()),
        hidden_size: hidden,
        intermediate_size: num("feed_forward_length"),
        num_hidden_layers: num("block_count"),
        num_attention_heads: heads,
        num_key_value_heads: num("attention.head_count_kv"),
        head_dim: num("attention.key_length"),
        // The embedding's row count is the truth; the metadata key is optional.
        vocab_size: num("vocab_size")
            .or(token_embd.and_then(|t| t.dims.get(1).copied()))
            .or(n_tokens),
        max_position_embeddings: num("context_length"),
        rms_norm_eps: float("attention.layer_norm_rms_epsilon"),
        rope_theta: float("rope.freq_base"),
        rope_scaling: gguf_rope_scaling(g, arch),
        tie_word_embeddings: Some(!g.tensors.iter().any(|t| t.name == "output.weight")),
        bos_token_id: id("tokenizer.ggml.bos_token_id"),
        eos_token_id: id("tokenizer.ggml.eos_token_id").map(OneOrMany::One),
        ..Default::default()
    })
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

/// GGUF tensor names, translated to the Hugging Face names the model asks for.
pub fn hf_name(gguf: &str) -> String {
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
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return gguf.to_owned(),
    };
    format!("model.layers.{layer}.{hf}.{suffix}")
}

fn gguf_weights(g: GgufFile) -> Weights {
    let tensors: HashMap<String, RawTensor> = g
        .tensors
        .iter()
        .map(|t| {
            (
                hf_name(&t.name),
                RawTensor {
                    file: 0,
                    offset: t.offset,
                    n_bytes: t.n_bytes,
                    dtype: t.dtype,
                    // GGUF lists dimensions fastest first; the model wants `[out, in]`.
                    shape: t.dims.iter().rev().copied().collect(),
                },
            )
        })
        .collect();
    Weights {
        files: vec![g.mmap],
        tensors,
    }
}

/// `--model`, else `$RUSTLE_MODEL`, else the default model (fetched once).
pub fn resolve_model_path(arg: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = arg {
        return Ok(p);
    }
    if let Some(p) = std::env::var_os("RUSTLE_MODEL").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    crate::default_model::ensure()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_names_map_to_hf_names() {
        assert_eq!(hf_name("token_embd.weight"), "model.embed_tokens.weight");
        assert_eq!(
            hf_name("blk.12.ffn_down.weight"),
            "model.layers.12.mlp.down_proj.weight"
        );
        assert_eq!(
            hf_name("blk.0.attn_q.bias"),
            "model.layers.0.self_attn.q_proj.bias"
        );
        assert_eq!(
            hf_name("blk.3.attn_norm.weight"),
            "model.layers.3.input_layernorm.weight"
        );
        assert_eq!(hf_name("rope_freqs.weight"), "rope_freqs.weight");
    }
}
