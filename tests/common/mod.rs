//! What the end-to-end tests share: the golden files from Hugging Face transformers, and
//! the check that a runner reproduces them; tiny models built in code (`tiny`); a running
//! `rustle serve` (`server`).

#![allow(dead_code)] // each test binary uses its own part

use rustle::cpu::ops::argmax_f32;
use rustle::loader;
use rustle::runner::{Device, Runner, RunnerOptions};
use rustle::tokenizer::Tokenizer;
use serde::Deserialize;

#[derive(Deserialize)]
pub struct Golden {
    pub cases: Vec<Case>,
}

#[derive(Deserialize)]
pub struct Case {
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub generated_ids: Vec<u32>,
    pub generated_text: String,
    pub greedy_margins: Vec<f32>,
    pub top_logits: Vec<Top>,
}

#[derive(Deserialize)]
pub struct Top {
    pub position: usize,
    pub ids: Vec<u32>,
    pub logits: Vec<f32>,
}

/// Fixtures are found from the working directory: cargo runs tests from the package root.
pub fn golden(name: &str) -> Golden {
    let path = format!("tests/golden/{name}.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

/// KV blocks every test runner gets: enough for the longest golden case, small enough that
/// tests can run side by side.
pub const TEST_KV_BLOCKS: usize = 64;

/// A model (the default one, fetched on first use, for `None`) as a runner and its tokenizer.
pub fn load(path: Option<&str>, max_batch_tokens: usize, device: Device) -> (Runner, Tokenizer) {
    let path = loader::resolve_model_path(path.map(Into::into)).expect("model path");
    let m = loader::load(&path).expect("load the model");
    let opts = RunnerOptions {
        kv_blocks: Some(TEST_KV_BLOCKS),
        max_batch_tokens,
        ..Default::default()
    };
    (
        Runner::new(m.config, m.weights, &opts, device).unwrap(),
        m.tokenizer,
    )
}

/// How close a backend must come to transformers.
pub struct Tolerance {
    /// A greedy step whose best two logits (in transformers) are closer than this is a
    /// near-tie either side may break; the comparison stops there, and says so.
    pub near_tie: f32,
    /// Largest allowed |ours - transformers| for a recorded top logit.
    pub logit: f32,
}

/// Runs one golden case: prefill (all positions' logits), then greedy decode one token at a
/// time, comparing tokens, text and the recorded top logits.
pub fn check_case(runner: &mut Runner, tok: &Tokenizer, case: &Case, tol: &Tolerance) -> f32 {
    assert_eq!(
        tok.encode(&case.prompt, true).unwrap(),
        case.prompt_ids,
        "prompt ids for {:?}",
        case.prompt
    );

    let vocab = runner.config.vocab_size;
    let mut seq = runner.solo();
    let n = case.prompt_ids.len();
    // logits[p]: the logits at position p, predicting token p + 1.
    let mut logits: Vec<Vec<f32>> = runner
        .extend_all_logits(&mut seq, &case.prompt_ids)
        .unwrap()
        .chunks(vocab)
        .map(|c| c.to_vec())
        .collect();
    assert_eq!(seq.table.blocks.len(), n.div_ceil(16));
    let mut ours = vec![];
    for step in 0..case.generated_ids.len() {
        let next = argmax_f32(logits.last().unwrap());
        let want = case.generated_ids[step];
        if next != want {
            let margin = case.greedy_margins[step];
            assert!(
                margin < tol.near_tie,
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
        // The best token must be transformers' best unless the two best are a near-tie
        // there (the logits themselves are held to `tol.logit` below either way).
        let margin = match top.logits[..] {
            [first, second, ..] => first - second,
            _ => f32::INFINITY,
        };
        if margin >= tol.near_tie {
            assert_eq!(
                argmax_f32(row),
                top.ids[0],
                "top-1 at position {} (margin {margin})",
                top.position
            );
        }
        for (&id, &want) in top.ids.iter().zip(&top.logits) {
            let err = (row[id as usize] - want).abs();
            worst = worst.max(err);
            assert!(
                err < tol.logit,
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
    seq.release();
    assert_eq!(seq.n_free(), runner.n_blocks(), "every block returned");
    worst
}

pub mod server;
pub mod tiny;
