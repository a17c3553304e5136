//! End to end against Hugging Face transformers: tokens and logits must match what
//! transformers produced on the same weights. The default model (GGUF, Llama architecture)
//! comes from tests/golden/make_golden.py; two tiny random models in Hugging Face folders
//! (Llama 3 with llama3 RoPE scaling and an untied head in bf16; Qwen2 with q/k/v bias, tied,
//! f16, sharded) from tests/golden/make_tiny.py; a tiny Llama GGUF whose matrices mix Q4_K,
//! Q5_0, Q6_K and Q8_0 from tests/golden/make_tiny_quant.py (transformers ran on what the
//! `gguf` package dequantizes); a tiny Qwen3 (q and k normed by head, head_dim not hidden /
//! heads), a tiny Phi-3 (fused matrices, partial RoPE, longrope) and tiny Mixtral and
//! Qwen3-MoE (mixtures of experts) from make_tiny.py, each as its folder and as llama.cpp's
//! converter writes it in GGUF (make_tiny_gguf.py); a tiny Gemma 3 (GeGLU, four norms a
//! layer, a local layer over a sliding window) from make_tiny.py.

mod common;

use common::{Tolerance, check_case, golden, load};
use rustle::runner::Device;

/// The CPU computes in f32 like transformers: logits differ by ~1e-4 (summation order).
const CPU: Tolerance = Tolerance {
    near_tie: 0.01,
    logit: 1e-3,
};

#[test]
fn default_model_matches_transformers() {
    check_model(None, "smollm2-135m");
}

#[test]
fn tiny_llama3_matches_transformers() {
    check_model(Some("tests/golden/tiny-llama3"), "tiny-llama3");
}

#[test]
fn tiny_qwen2_matches_transformers() {
    check_model(Some("tests/golden/tiny-qwen2"), "tiny-qwen2");
}

/// Every layer over a sliding window of 8 positions, which the prompts run past.
#[test]
fn tiny_mistral_matches_transformers() {
    check_model(Some("tests/golden/tiny-mistral"), "tiny-mistral");
}

#[test]
fn tiny_qwen3_matches_transformers() {
    check_model(Some("tests/golden/tiny-qwen3"), "tiny-qwen3");
}

/// The same weights through llama.cpp's converter (bf16, so the folder's golden outputs hold).
#[test]
fn tiny_qwen3_gguf_matches_transformers() {
    check_model(Some("tests/golden/tiny-qwen3.gguf"), "tiny-qwen3");
}

/// Fused q/k/v and gate/up, RoPE on half of each head, longrope past an original context
/// of 32 (every golden sequence is longer, so both sides use the long factors throughout).
#[test]
fn tiny_phi3_matches_transformers() {
    check_model(Some("tests/golden/tiny-phi3"), "tiny-phi3");
}

#[test]
fn tiny_phi3_gguf_matches_transformers() {
    check_model(Some("tests/golden/tiny-phi3.gguf"), "tiny-phi3");
}

/// Mixtures of experts: Mixtral (4 experts, 2 a token) and Qwen3-MoE (8 of 48, 3 a token,
/// renormalized), each from its folder and from llama.cpp's GGUF of it (3-D expert tensors).
#[test]
fn tiny_mixtral_matches_transformers() {
    check_model(Some("tests/golden/tiny-mixtral"), "tiny-mixtral");
}

#[test]
fn tiny_mixtral_gguf_matches_transformers() {
    check_model(Some("tests/golden/tiny-mixtral.gguf"), "tiny-mixtral");
}

#[test]
fn tiny_qwen3moe_matches_transformers() {
    check_model(Some("tests/golden/tiny-qwen3moe"), "tiny-qwen3moe");
}

#[test]
fn tiny_qwen3moe_gguf_matches_transformers() {
    check_model(Some("tests/golden/tiny-qwen3moe.gguf"), "tiny-qwen3moe");
}

/// Gemma 3: GeGLU, the embedding scaled by sqrt(hidden), four norms of 1 + w a layer, head
/// norms, a `query_pre_attn_scalar` that is not `head_dim`, and a local layer over a sliding
/// window of 8 positions (every golden sequence runs past it) with a RoPE base of its own.
#[test]
fn tiny_gemma3_matches_transformers() {
    check_model(Some("tests/golden/tiny-gemma3"), "tiny-gemma3");
}

/// Gemma 3 shaped as llama.cpp reads its GGUF files (every 6th layer global, queries scaled
/// by the head's width), from its folder and from the converter's file (norms stored with
/// their 1 added, the local layers' RoPE base under its own key).
#[test]
fn tiny_gemma3_1b_matches_transformers() {
    check_model(Some("tests/golden/tiny-gemma3-1b"), "tiny-gemma3-1b");
}

#[test]
fn tiny_gemma3_1b_gguf_matches_transformers() {
    check_model(Some("tests/golden/tiny-gemma3-1b.gguf"), "tiny-gemma3-1b");
}

#[test]
fn tiny_quant_gguf_matches_transformers() {
    check_model(Some("tests/golden/tiny-quant.gguf"), "tiny-quant");
}

fn check_model(path: Option<&str>, golden_name: &str) {
    let (mut r, tok) = load(path, 256, Device::Cpu);
    for case in &golden(golden_name).cases {
        check_case(&mut r, &tok, case, &CPU);
    }
}

#[test]
fn chunked_prefill_matches_too() {
    // 7-token chunks: chunk edges fall inside KV blocks and across them.
    let g = golden("smollm2-135m");
    let long = g.cases.iter().max_by_key(|c| c.prompt_ids.len()).unwrap();
    assert!(
        long.prompt_ids.len() > 3 * 16,
        "the long prompt spans several KV blocks"
    );
    let (mut r, tok) = load(None, 7, Device::Cpu);
    check_case(&mut r, &tok, long, &CPU);
}
