//! Named model shapes (llama3-8b, llama3.2-1b, qwen2.5-7b, qwen3-8b, phi4-mini, gemma3-12b and
//! gemma3-12b-global, gemma3-1b, qwen3-30b-a3b, smollm2-135m), as their
//! `config.json` files give them: benchmarks and profiles build synthetic weights of one, so
//! that they need no download, and tests size their problems by them.

use crate::config::{Config, HfConfig};
use crate::error::{Error, Result};

/// Named shapes, as their `config.json` files give them.
pub const SHAPES: &[(&str, &str)] = &[
    (
        "llama3-8b",
        r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "tie_word_embeddings": false}"#,
    ),
    (
        "llama3.2-1b",
        r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192,
            "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": true,
            "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}"#,
    ),
    (
        "qwen2.5-7b",
        r#"{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
            "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
            "vocab_size": 152064, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "tie_word_embeddings": false}"#,
    ),
    (
        "qwen3-8b",
        r#"{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "intermediate_size": 12288,
            "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": false}"#,
    ),
    (
        // Phi-4-mini without its longrope lists (48 factors each): they change the angles,
        // not the work, and the shape's weights are random anyway.
        "phi4-mini",
        r#"{"architectures": ["Phi3ForCausalLM"], "hidden_size": 3072, "intermediate_size": 8192,
            "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
            "vocab_size": 200064, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "partial_rotary_factor": 0.75, "tie_word_embeddings": true}"#,
    ),
    (
        // Gemma 3 12B's language model (`text_config`): heads of 256, five local layers over
        // a window of 1024 for every global one, GeGLU, a tied vocabulary of 262208.
        "gemma3-12b",
        r#"{"architectures": ["Gemma3ForCausalLM"], "hidden_size": 3840,
            "intermediate_size": 15360, "num_hidden_layers": 48, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 256, "query_pre_attn_scalar": 256,
            "vocab_size": 262208, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 1024,
            "sliding_window_pattern": 6, "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": true}"#,
    ),
    (
        "gemma3-1b",
        r#"{"architectures": ["Gemma3ForCausalLM"], "hidden_size": 1152,
            "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4,
            "num_key_value_heads": 1, "head_dim": 256, "query_pre_attn_scalar": 256,
            "vocab_size": 262144, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "sliding_window": 512,
            "sliding_window_pattern": 6, "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": true}"#,
    ),
    (
        // Qwen3-30B-A3B: 48 layers of 128 experts 768 wide, 8 a token renormalized (about 3.3
        // billion of its 30.5 billion weights read a token), heads of 128.
        "qwen3-30b-a3b",
        r#"{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048,
            "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
            "num_experts_per_tok": 8, "norm_topk_prob": true, "decoder_sparse_step": 1,
            "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
            "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": false}"#,
    ),
    (
        "smollm2-135m",
        r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
            "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "vocab_size": 49152, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
            "rope_theta": 100000.0, "tie_word_embeddings": true}"#,
    ),
];

/// Shapes that are another with some fields changed: (name, the shape it changes, the
/// fields as JSON).
pub const VARIANTS: &[(&str, &str, &str)] = &[
    // Gemma 3 12B with every layer global (a window pattern of 1): what its local layers
    // save at long contexts, measured against it.
    (
        "gemma3-12b-global",
        "gemma3-12b",
        r#"{"sliding_window_pattern": 1}"#,
    ),
];

/// The resolved `Config` of the shape named `name`, or a usage error listing the names.
pub fn shape_config(name: &str) -> Result<Config> {
    let parse = |json: &str| -> Result<serde_json::Value> {
        serde_json::from_str(json).map_err(|e| Error::Config(e.to_string()))
    };
    let json = |n: &str| SHAPES.iter().find(|(s, _)| *s == n).map(|(_, j)| *j);
    let value = match (json(name), VARIANTS.iter().find(|(v, ..)| *v == name)) {
        (Some(j), _) => parse(j)?,
        (None, Some((_, base, fields))) => {
            let mut value = parse(json(base).expect("a variant's base is a shape"))?;
            let (Some(obj), serde_json::Value::Object(changed)) =
                (value.as_object_mut(), parse(fields)?)
            else {
                unreachable!("shapes are JSON objects")
            };
            obj.extend(changed);
            value
        }
        (None, None) => {
            let names: Vec<&str> = SHAPES
                .iter()
                .map(|(n, _)| *n)
                .chain(VARIANTS.iter().map(|(n, ..)| *n))
                .collect();
            return Err(Error::Usage(format!(
                "unknown shape {name:?}; known: {}",
                names.join(", ")
            )));
        }
    };
    let hf: HfConfig = serde_json::from_value(value).map_err(|e| Error::Config(e.to_string()))?;
    Config::resolve(&hf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_shape_resolves() {
        for name in SHAPES
            .iter()
            .map(|s| s.0)
            .chain(VARIANTS.iter().map(|v| v.0))
        {
            shape_config(name).unwrap();
        }
        let c = shape_config("llama3-8b").unwrap();
        assert_eq!(
            (c.q_dim(), c.kv_dim(), c.group_size(), c.head_dim),
            (4096, 1024, 4, 128)
        );
        let c = shape_config("llama3.2-1b").unwrap();
        assert!(c.tie_embeddings && c.head_dim == 64);
        let global = shape_config("gemma3-12b-global").unwrap();
        assert!((0..48).all(|l| global.window(l).is_none()));
        let local = shape_config("gemma3-12b").unwrap();
        assert!((0..48).filter(|&l| local.window(l).is_some()).count() == 40);
        assert_eq!((global.dim, global.head_dim), (local.dim, local.head_dim));
        let c = shape_config("qwen3-30b-a3b").unwrap();
        let moe = c.moe.unwrap();
        assert_eq!(
            (moe.n_experts, moe.top_k, moe.expert_ffn_dim),
            (128, 8, 768)
        );
        assert!(moe.renormalize && c.qk_norm);
        let c = shape_config("gemma3-12b").unwrap();
        let s = c.sliding.as_ref().unwrap();
        assert_eq!(
            (c.head_dim, s.window, c.window(0), c.window(5)),
            (256, 1024, Some(1024), None)
        );
        assert!(
            shape_config("gpt-2")
                .unwrap_err()
                .to_string()
                .contains("llama3-8b")
        );
    }
}
