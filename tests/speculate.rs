//! Speculative decoding changes no greedy token, on real models: every golden model on the
//! CPU reference (their transformers prompts), and the default model on the fast CPU path in
//! the batch-invariant mode `rustle --speculate` runs it in (the input-grounded prompts of
//! tests/data/grounded_prompts.json, where prompt lookup guesses well). Each model runs its
//! prompts through the serving engine together, once without guesses and once with up to 8
//! a step, and both runs must give every request the same tokens. The GPU's twin of this
//! test is in tests/gpu/speculation.rs.

mod common;

use rustle::runner::{Device, Forward, Runner, RunnerOptions};
use rustle::serve::{Engine, EngineOptions, EngineStats, RequestParams};
use rustle::tools::speculate_bench::grounded_prompt_ids;

/// Every prompt through one engine over `runner`, greedy, `max_tokens` each past any end
/// token, guessing up to `speculate` tokens a step: each request's tokens, in order.
fn run_all(
    runner: Runner,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    speculate: usize,
) -> (Vec<Vec<u32>>, EngineStats) {
    let opts = EngineOptions {
        token_budget: runner.limits().max_batch_tokens,
        prefix_cache: false,
        ..Default::default()
    };
    let mut engine = Engine::new(runner, opts).unwrap();
    let ids: Vec<_> = prompts
        .iter()
        .map(|p| {
            let params = RequestParams {
                max_tokens,
                ignore_eos: true,
                speculate,
                ..Default::default()
            };
            engine.add_request(p.clone(), params).unwrap()
        })
        .collect();
    let mut out = vec![vec![]; prompts.len()];
    while engine.has_work() {
        for o in engine.step().unwrap() {
            let i = ids.iter().position(|&id| id == o.id).unwrap();
            out[i].extend(o.token);
        }
    }
    assert_eq!(engine.stats().blocks_used, 0, "every block back");
    (out, engine.stats())
}

fn same_with_and_without(
    load: impl Fn() -> Runner,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    what: &str,
) -> EngineStats {
    let (plain, _) = run_all(load(), prompts, max_tokens, 0);
    let (guessed, stats) = run_all(load(), prompts, max_tokens, 8);
    for (i, (a, b)) in plain.iter().zip(&guessed).enumerate() {
        assert_eq!(
            a, b,
            "{what}: prompt {i}: tokens without and with speculation"
        );
    }
    eprintln!(
        "{what}: {} prompts, {max_tokens} tokens each, the same with and without; {} of {} guessed tokens kept in {} steps",
        prompts.len(),
        stats.accepted_tokens,
        stats.drafted_tokens,
        stats.steps
    );
    stats
}

#[test]
fn every_golden_model_decodes_the_same_with_speculation() {
    let models = [
        ("tests/golden/tiny-llama3", "tiny-llama3"),
        ("tests/golden/tiny-qwen2", "tiny-qwen2"),
        ("tests/golden/tiny-mistral", "tiny-mistral"),
        ("tests/golden/tiny-qwen3", "tiny-qwen3"),
        ("tests/golden/tiny-qwen3.gguf", "tiny-qwen3"),
        ("tests/golden/tiny-phi3", "tiny-phi3"),
        ("tests/golden/tiny-mixtral", "tiny-mixtral"),
        ("tests/golden/tiny-qwen3moe", "tiny-qwen3moe"),
        ("tests/golden/tiny-gemma3", "tiny-gemma3"),
        ("tests/golden/tiny-gemma3-1b.gguf", "tiny-gemma3-1b"),
        ("tests/golden/tiny-quant.gguf", "tiny-quant"),
    ];
    let mut kept = 0;
    for (path, golden) in models {
        let prompts: Vec<Vec<u32>> = common::golden(golden)
            .cases
            .into_iter()
            .map(|c| c.prompt_ids)
            .collect();
        let load = || common::load(Some(path), 256, Device::Cpu).0;
        kept += same_with_and_without(load, &prompts, 40, path).accepted_tokens;
    }
    assert!(
        kept > 0,
        "no golden model kept a guess: the test checked nothing"
    );
}

#[test]
fn the_default_model_decodes_the_same_with_speculation_on_the_fast_path() {
    let path = rustle::loader::resolve_model_path(None).unwrap();
    let load = || {
        let m = rustle::loader::open(&path).unwrap().into_fast().unwrap();
        let opts = RunnerOptions {
            kv_blocks: Some(common::TEST_KV_BLOCKS),
            max_batch_tokens: 256,
            ..Default::default()
        };
        let mut r = Runner::with_fast_cpu(m.config, m.weights, &opts).unwrap();
        r.set_batch_invariant(true);
        r
    };
    let tok = rustle::loader::open(&path).unwrap().tokenizer;
    let prompts = grounded_prompt_ids(&tok).unwrap();
    let stats = same_with_and_without(load, &prompts, 48, "the default model (fast path)");
    assert!(
        stats.accepted_tokens * 4 > stats.generated_tokens,
        "prompt lookup should guess a quarter of these tokens: {stats:?}"
    );
}
