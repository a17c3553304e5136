//! Speculative decoding on the GPU (the CPU's twin: tests/speculate.rs): the default model's
//! greedy tokens with prompt lookup of up to 8 tokens a step, each input-grounded prompt
//! (tests/data/grounded_prompts.json) alone through the serving engine, against the same
//! prompt decoded one token a pass. A pass that checks guesses computes several rows at once,
//! and over GGUF blocks more than `QUANT_MAX_TOKENS` rows take the tensor cores' bf16
//! activations where one row takes the integer GEMV's f32 (as a batch of sequences does), so
//! a request may leave its unguessed tokens only at a near-tie: a step whose best two logits
//! decoded alone were less than 0.5 apart, which the test reports.

use rand::rngs::StdRng;
use rustle::gpu::Gpu;
use rustle::gpu::matrix::WeightFormat;
use rustle::runner::{Runner, RunnerOptions};
use rustle::serve::{Engine, EngineOptions, RequestParams};
use rustle::tools::speculate_bench::grounded_prompt_ids;

const STEPS: usize = 48;
const NEAR_TIE: f32 = 0.5;

pub fn default_model_speculation_keeps_greedy_tokens(g: &Gpu, _: &mut StdRng) {
    let path = rustle::loader::resolve_model_path(None).unwrap();
    let tok = rustle::loader::open(&path).unwrap().tokenizer;
    let prompts = grounded_prompt_ids(&tok).unwrap();
    for weights in [WeightFormat::Stored, WeightFormat::Bf16] {
        let m = rustle::loader::load(&path).unwrap();
        let opts = RunnerOptions {
            kv_blocks: Some(64),
            max_batch_tokens: 256,
            weights,
            ..Default::default()
        };
        let mut runner = Runner::new(m.config, m.weights, &opts, super::gpu_device(g)).unwrap();
        let alone: Vec<(Vec<u32>, Vec<f32>)> = prompts
            .iter()
            .map(|p| super::greedy(&mut runner, p, STEPS))
            .collect();
        let eopts = EngineOptions {
            token_budget: 256,
            prefix_cache: false,
            ..Default::default()
        };
        let mut engine = Engine::new(runner, eopts).unwrap();
        let mut ties = vec![];
        for (i, (prompt, (want, margins))) in prompts.iter().zip(&alone).enumerate() {
            let params = RequestParams {
                max_tokens: STEPS,
                ignore_eos: true,
                speculate: 8,
                ..Default::default()
            };
            let id = engine.add_request(prompt.clone(), params).unwrap();
            let mut got = vec![];
            while engine.has_work() {
                for o in engine.step().unwrap() {
                    assert_eq!(o.id, id);
                    got.extend(o.token);
                }
            }
            assert_eq!(got.len(), STEPS);
            if let Some(s) = want.iter().zip(&got).position(|(a, b)| a != b) {
                assert!(
                    margins[s] < NEAR_TIE,
                    "{weights:?}: prompt {i}: step {s}: alone {} speculating {} (margin {})",
                    want[s],
                    got[s],
                    margins[s]
                );
                ties.push(margins[s]);
            }
        }
        let stats = engine.stats();
        assert_eq!(stats.blocks_used, 0, "every block back");
        assert!(
            stats.accepted_tokens * 4 > stats.generated_tokens,
            "prompt lookup should guess a quarter of these tokens: {stats:?}"
        );
        eprintln!(
            "  {weights:?}: {} prompts, {} with every token of their unguessed run, {} diverging at a near-tie (margins {ties:.2?}); {} of {} guesses kept",
            prompts.len(),
            prompts.len() - ties.len(),
            ties.len(),
            stats.accepted_tokens,
            stats.drafted_tokens
        );
    }
}
