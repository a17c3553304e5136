//! End to end against Hugging Face transformers: tokens and logits must match what
//! transformers produced on the same weights. The default model (GGUF, Llama architecture)
//! comes from tests/golden/make_golden.py; two tiny random models in Hugging Face folders
//! (Llama 3 with llama3 RoPE scaling and an untied head in bf16; Qwen2 with q/k/v bias, tied,
//! f16, sharded) from tests/golden/make_tiny.py.

use rustle::block_manager::BlockTable;
use rustle::cpu::ops::argmax_f32;
use rustle::loader;
use rustle::runner::{Runner, RunnerOptions};
use rustle::tokenizer::Tokenizer;
use serde::Deserialize;

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt: String,
    prompt_ids: Vec<u32>,
    generated_ids: Vec<u32>,
    generated_text: String,
    greedy_margins: Vec<f32>,
    top_logits: Vec<Top>,
}

#[derive(Deserialize)]
struct Top {
    position: usize,
    ids: Vec<u32>,
    logits: Vec<f32>,
}

/// Logits of f32 implementations that sum in different orders differ by ~1e-4 here; a
/// greedy step whose best two logits are closer than this is a near-tie either may break.
const NEAR_TIE: f32 = 0.01;
/// Largest allowed |ours - transformers| for a logit (they are of size 10 to 30).
const LOGIT_TOL: f32 = 1e-3;

/// Fixtures are found from the working directory: cargo runs tests from the package root.
fn golden(name: &str) -> Golden {
    let path = format!("tests/golden/{name}.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

/// A model (the default one, fetched on first use, for `None`) as a runner and its tokenizer.
fn load(path: Option<&str>, max_batch_tokens: usize) -> (Runner, Tokenizer) {
    let path = loader::resolve_model_path(path.map(Into::into)).expect("model path");
    let m = loader::load(&path).expect("load the model");
    let opts = RunnerOptions {
        kv_blocks: Some(64),
        max_batch_tokens,
    };
    (
        Runner::new(m.config, m.weights, &opts).unwrap(),
        m.tokenizer,
    )
}

/// Runs one golden case: prefill (all positions' logits), then greedy decode one token at a
/// time, comparing tokens, text and the recorded top logits.
fn check_case(runner: &mut Runner, tok: &Tokenizer, case: &Case) {
    assert_eq!(
        tok.encode(&case.prompt, true).unwrap(),
        case.prompt_ids,
        "prompt ids for {:?}",
        case.prompt
    );

    let vocab = runner.config.vocab_size;
    let mut seq = BlockTable::default();
    let n = case.prompt_ids.len();
    // logits[p]: the logits at position p, predicting token p + 1.
    let mut logits: Vec<Vec<f32>> = runner
        .extend_all_logits(&mut seq, &case.prompt_ids)
        .unwrap()
        .chunks(vocab)
        .map(|c| c.to_vec())
        .collect();
    assert_eq!(seq.blocks.len(), n.div_ceil(16));
    let mut ours = vec![];
    for step in 0..case.generated_ids.len() {
        let next = argmax_f32(logits.last().unwrap());
        let want = case.generated_ids[step];
        if next != want {
            let margin = case.greedy_margins[step];
            assert!(
                margin < NEAR_TIE,
                "{:?}: step {step}: rustle chose {next}, transformers {want} (margin {margin})",
                case.prompt
            );
            eprintln!(
                "{:?}: diverged at step {step} after a near-tie (margin {margin}); stopping the comparison there",
                case.prompt
            );
            break;
        }
        ours.push(next);
        if step + 1 < case.generated_ids.len() {
            logits.push(runner.extend(&mut seq, &[next]).unwrap().to_vec());
        }
    }
    if ours.len() == case.generated_ids.len() {
        assert_eq!(tok.decode(&ours).unwrap(), case.generated_text);
    }

    let mut worst = 0f32;
    for top in &case.top_logits {
        let Some(row) = logits.get(top.position) else {
            continue; // past a tolerated divergence
        };
        assert_eq!(
            argmax_f32(row),
            top.ids[0],
            "top-1 at position {}",
            top.position
        );
        for (&id, &want) in top.ids.iter().zip(&top.logits) {
            let err = (row[id as usize] - want).abs();
            worst = worst.max(err);
            assert!(
                err < LOGIT_TOL,
                "{:?}: position {} token {id}: rustle {} transformers {want}",
                case.prompt,
                top.position,
                row[id as usize]
            );
        }
    }
    eprintln!(
        "{:?}: {} prompt tokens, {}/{} greedy tokens match, largest top-logit error {worst:.2e}",
        &case.prompt[..case.prompt.len().min(30)],
        n,
        ours.len(),
        case.generated_ids.len()
    );
    runner.release(&mut seq);
}

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

fn check_model(path: Option<&str>, golden_name: &str) {
    let (mut r, tok) = load(path, 256);
    for case in &golden(golden_name).cases {
        check_case(&mut r, &tok, case);
    }
    assert_eq!(r.blocks.n_free(), 64, "every block returned");
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
    let (mut r, tok) = load(None, 7);
    check_case(&mut r, &tok, long);
}
