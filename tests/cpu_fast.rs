//! The fast CPU backend end to end: its greedy tokens against the f32 reference's on the
//! golden prompts (the default model, Q4_1 and Q8_0), and its logits against transformers'
//! on every golden model (the tiny ones hold bf16, f16, and a Q4_K/Q5_0/Q6_K/Q8_0 mix).
//!
//! The fast backend rounds activations (to 8 bits per 32 values in decode, to bf16 in
//! prefill) and keeps its KV cache in bf16, as the GPU does: so it is held to the GPU's
//! near-tie rule (tests/gpu.rs), not the reference's exact one.

mod common;

use common::{TEST_KV_BLOCKS, Tolerance, check_case, golden};
use rustle::cpu::ops::argmax_f32;
use rustle::loader;
use rustle::runner::{Device, Runner, RunnerOptions};
use rustle::tokenizer::Tokenizer;

/// The GPU's near-tie rule against transformers (tests/gpu.rs); logits within 1.0. Decode's
/// activations quantized to 8 bits per 32 values (llama.cpp's choice too) move the default
/// model's logits (about 20 wide) by up to 0.73 (seen, 2026-12-01), more than bf16 moves the
/// GPU's (0.28): SmolLM2's few large activation features set their blocks' scales.
const FAST_VS_TRANSFORMERS: Tolerance = Tolerance {
    near_tie: 0.5,
    logit: 1.0,
};

/// A step where the reference's best two logits are closer than this may go either way.
const NEAR_TIE: f32 = 0.5;

fn opts(max_batch_tokens: usize) -> RunnerOptions {
    RunnerOptions {
        kv_blocks: Some(TEST_KV_BLOCKS),
        max_batch_tokens,
        ..Default::default()
    }
}

fn fast(path: Option<&str>, max_batch_tokens: usize) -> (Runner, Tokenizer) {
    let path = loader::resolve_model_path(path.map(Into::into)).unwrap();
    let m = loader::open(&path).unwrap().into_fast().unwrap();
    let runner = Runner::with_fast_cpu(m.config, m.weights, &opts(max_batch_tokens)).unwrap();
    (runner, m.tokenizer)
}

fn reference(path: Option<&str>) -> Runner {
    let path = loader::resolve_model_path(path.map(Into::into)).unwrap();
    let m = loader::load(&path).unwrap();
    Runner::new(m.config, m.weights, &opts(256), Device::Cpu).unwrap()
}

/// `steps` greedy tokens after `prompt`, and at each step the margin between the best two
/// logits.
fn greedy(r: &mut Runner, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<f32>) {
    let mut seq = r.solo();
    let mut logits = r.extend(&mut seq, prompt).unwrap().to_vec();
    let (mut tokens, mut margins) = (vec![], vec![]);
    for _ in 0..steps {
        let t = argmax_f32(&logits);
        let mut sorted = logits.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        margins.push(sorted[0] - sorted[1]);
        tokens.push(t);
        logits = r.extend(&mut seq, &[t]).unwrap().to_vec();
    }
    seq.release();
    (tokens, margins)
}

#[test]
fn default_model_fast_matches_reference_greedy() {
    let mut fast = fast(None, 256).0;
    let mut reference = reference(None);
    for case in &golden("smollm2-135m").cases {
        let n = case.prompt_ids.len();
        let (want, margins) = greedy(&mut reference, &case.prompt_ids, 32);
        let (got, _) = greedy(&mut fast, &case.prompt_ids, 32);
        match want.iter().zip(&got).position(|(a, b)| a != b) {
            None => eprintln!("{n} prompt tokens: 32/32 greedy tokens identical"),
            Some(i) => {
                assert!(
                    margins[i] < NEAR_TIE,
                    "{n}-token prompt: step {i}: reference {} fast {} (reference margin {})",
                    want[i],
                    got[i],
                    margins[i]
                );
                eprintln!(
                    "{n} prompt tokens: identical for {i} steps, then a near-tie (margin {})",
                    margins[i]
                );
            }
        }
    }
}

fn check_model(path: Option<&str>, golden_name: &str, max_batch_tokens: usize) {
    let (mut r, tok) = fast(path, max_batch_tokens);
    let mut worst = 0f32;
    for case in &golden(golden_name).cases {
        worst = worst.max(check_case(&mut r, &tok, case, &FAST_VS_TRANSFORMERS));
    }
    eprintln!("{golden_name}: largest top-logit error against transformers {worst:.3e}");
}

#[test]
fn default_model_fast_matches_transformers() {
    check_model(None, "smollm2-135m", 256);
}

#[test]
fn default_model_fast_in_chunks_of_seven_matches_transformers() {
    // 7-token chunks take the bf16 tiles with a part group (4 + 3 tokens, one at a time)
    // and put chunk edges inside and across KV blocks.
    check_model(None, "smollm2-135m", 7);
}

#[test]
fn tiny_quant_gguf_fast_matches_transformers() {
    check_model(Some("tests/golden/tiny-quant.gguf"), "tiny-quant", 256);
}

#[test]
fn tiny_llama3_fast_matches_transformers() {
    check_model(Some("tests/golden/tiny-llama3"), "tiny-llama3", 256);
}

#[test]
fn tiny_qwen2_fast_matches_transformers() {
    check_model(Some("tests/golden/tiny-qwen2"), "tiny-qwen2", 256);
}

#[test]
fn tiny_mistral_fast_matches_transformers() {
    check_model(Some("tests/golden/tiny-mistral"), "tiny-mistral", 256);
}

#[test]
fn tiny_qwen3_fast_matches_transformers() {
    check_model(Some("tests/golden/tiny-qwen3"), "tiny-qwen3", 256);
}

#[test]
fn tiny_qwen3_gguf_fast_matches_transformers() {
    check_model(Some("tests/golden/tiny-qwen3.gguf"), "tiny-qwen3", 256);
}

#[test]
fn tiny_phi3_fast_matches_transformers() {
    check_model(Some("tests/golden/tiny-phi3"), "tiny-phi3", 256);
}

#[test]
fn tiny_phi3_gguf_fast_matches_transformers() {
    check_model(Some("tests/golden/tiny-phi3.gguf"), "tiny-phi3", 256);
}

#[test]
fn tiny_mixtral_fast_matches_transformers() {
    check_model(Some("tests/golden/tiny-mixtral"), "tiny-mixtral", 256);
}

#[test]
fn tiny_mixtral_gguf_fast_matches_transformers() {
    check_model(Some("tests/golden/tiny-mixtral.gguf"), "tiny-mixtral", 256);
}

#[test]
fn tiny_gemma3_fast_matches_transformers() {
    check_model(Some("tests/golden/tiny-gemma3"), "tiny-gemma3", 256);
}

#[test]
fn tiny_gemma3_1b_gguf_fast_matches_transformers() {
    check_model(
        Some("tests/golden/tiny-gemma3-1b.gguf"),
        "tiny-gemma3-1b",
        256,
    );
}

#[test]
fn tiny_qwen3moe_fast_matches_transformers() {
    check_model(Some("tests/golden/tiny-qwen3moe"), "tiny-qwen3moe", 256);
}

#[test]
fn tiny_qwen3moe_gguf_fast_matches_transformers() {
    check_model(
        Some("tests/golden/tiny-qwen3moe.gguf"),
        "tiny-qwen3moe",
        256,
    );
}

/// The weights held are the file's tensor bytes, within the 5% the issue allows (the f32
/// copies of norms are the only growth).
#[test]
fn fast_weights_hold_the_files_bytes() {
    let path = loader::resolve_model_path(None).unwrap();
    let m = loader::open(&path).unwrap().into_fast().unwrap();
    let file: usize = m.stored.iter().map(|s| s.2).sum();
    let held = m.weights.held_bytes();
    assert!(
        held as f64 <= 1.05 * file as f64 && held as f64 >= 0.95 * file as f64,
        "held {held} bytes, the file's tensors {file}"
    );
}

/// In the batch-invariant mode (the server's), a prompt's logits are bit for bit the same in
/// one pass and in chunks of three, and so is the next decode step's: the bf16 tiles and the
/// 8-bit dot products are never mixed by the batch's size.
#[test]
fn batch_invariant_mode_ignores_chunking() {
    let prompt = &golden("smollm2-135m").cases[1].prompt_ids;
    let run = |max_batch_tokens: usize| {
        let (mut r, _) = fast(None, max_batch_tokens);
        r.set_batch_invariant(true);
        let mut seq = r.solo();
        let mut logits = r.extend_all_logits(&mut seq, prompt).unwrap();
        let next = argmax_f32(&logits[logits.len() - r.config.vocab_size..]);
        logits.extend_from_slice(r.extend(&mut seq, &[next]).unwrap());
        logits
    };
    let (whole, chunked) = (run(256), run(3));
    assert!(whole.iter().all(|v| v.is_finite()));
    assert!(
        whole == chunked,
        "logits differ between one pass and chunks of three"
    );
}
