//! The serving engine on a real (tiny) model, on the CPU: a request's tokens must not depend
//! on what else is in its batch, on where its prompt was cut into chunks, on whether its
//! prefix came from the cache, or on having been preempted and recomputed. The CPU backend
//! makes this exact: every row's arithmetic (each matmul row's dot product, each
//! (token, head)'s attention over its own positions, each norm) is the same function of that
//! row's inputs whatever the batch holds, so the tests compare tokens for equality.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustle::loader;
use rustle::runner::{Device, Forward, Runner, RunnerOptions};
use rustle::sampler::SamplingParams;
use rustle::serve::{Engine, EngineOptions, FinishReason, RequestId, RequestParams};

const TINY: &str = "tests/golden/tiny-llama3";

fn runner(path: &str, kv_blocks: usize, max_batch_tokens: usize) -> Runner {
    let m = loader::load(path.as_ref()).expect("load the tiny model");
    let opts = RunnerOptions {
        kv_blocks: Some(kv_blocks),
        max_batch_tokens,
        ..Default::default()
    };
    Runner::new(m.config, m.weights, &opts, Device::Cpu).unwrap()
}

fn engine(path: &str, kv_blocks: usize, budget: usize, prefix_cache: bool) -> Engine {
    let opts = EngineOptions {
        token_budget: budget,
        prefix_cache,
        ..Default::default()
    };
    Engine::new(runner(path, kv_blocks, budget), opts).unwrap()
}

type Outputs = HashMap<RequestId, (Vec<u32>, Option<FinishReason>)>;

fn step(e: &mut Engine, out: &mut Outputs) {
    for o in e.step().unwrap() {
        let entry = out.entry(o.id).or_default();
        entry.0.extend(o.token);
        entry.1 = o.finish;
    }
}

fn drain(e: &mut Engine, out: &mut Outputs) {
    while e.has_work() {
        step(e, out);
    }
}

/// Each request alone, one after another, in an engine without the prefix cache.
fn alone(path: &str, reqs: &[(Vec<u32>, RequestParams)]) -> Vec<(Vec<u32>, Option<FinishReason>)> {
    let mut e = engine(path, 64, 64, false);
    reqs.iter()
        .map(|(p, r)| {
            let id = e.add_request(p.clone(), r.clone()).unwrap();
            let mut out = Outputs::new();
            drain(&mut e, &mut out);
            out.remove(&id).unwrap()
        })
        .collect()
}

/// All requests in one engine, request `i` arriving before step `arrivals[i]`.
fn together(
    e: &mut Engine,
    reqs: &[(Vec<u32>, RequestParams)],
    arrivals: &[usize],
) -> Vec<(Vec<u32>, Option<FinishReason>)> {
    let mut out = Outputs::new();
    let mut ids = vec![None; reqs.len()];
    let mut t = 0;
    while ids.iter().any(Option::is_none) || e.has_work() {
        for (i, r) in reqs.iter().enumerate() {
            if arrivals[i] == t {
                ids[i] = Some(e.add_request(r.0.clone(), r.1.clone()).unwrap());
            }
        }
        step(e, &mut out);
        t += 1;
    }
    ids.iter()
        .map(|id| out.remove(&id.unwrap()).unwrap())
        .collect()
}

fn random_prompt(rng: &mut StdRng, len: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|_| rng.random_range(0..vocab as u32))
        .collect()
}

fn greedy(max_tokens: usize) -> RequestParams {
    RequestParams {
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    }
}

/// 33 requests of different lengths arriving at different steps, in 48-token steps (so
/// prompts are cut into chunks at varying places and share steps with decodes).
fn workload(seed: u64, vocab: usize) -> (Vec<(Vec<u32>, RequestParams)>, Vec<usize>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let reqs = (0..33)
        .map(|_| {
            let len = rng.random_range(1..120);
            (
                random_prompt(&mut rng, len, vocab),
                greedy(rng.random_range(1..40)),
            )
        })
        .collect();
    let arrivals = (0..33).map(|_| rng.random_range(0..30)).collect();
    (reqs, arrivals)
}

#[test]
fn greedy_tokens_do_not_depend_on_the_batch() {
    for path in [TINY, "tests/golden/tiny-qwen2"] {
        let vocab = runner(path, 1, 1).limits().vocab_size;
        let (reqs, arrivals) = workload(1, vocab);
        let want = alone(path, &reqs);
        let mut e = engine(path, 256, 48, false);
        let got = together(&mut e, &reqs, &arrivals);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g,
                w,
                "{path}: request {i}, {} prompt tokens",
                reqs[i].0.len()
            );
        }
        // Batched for real: far fewer steps than the tokens generated.
        let generated: usize = want.iter().map(|w| w.0.len()).sum();
        assert!(
            (e.stats().steps as usize) * 2 < generated,
            "{:?}",
            e.stats()
        );
    }
}

#[test]
fn the_engine_alone_matches_the_runner_directly() {
    // The path the golden tests check: one sequence through `Runner::extend_greedy`.
    let mut rng = StdRng::seed_from_u64(2);
    let reqs: Vec<_> = [1, 17, 90]
        .iter()
        .map(|&n| (random_prompt(&mut rng, n, 264), greedy(30)))
        .collect();
    let want = alone(TINY, &reqs);
    let mut r = runner(TINY, 64, 7);
    for ((p, _), (w, _)) in reqs.iter().zip(&want) {
        let mut seq = r.solo();
        let mut t = r.extend_greedy(&mut seq, p).unwrap();
        let mut tokens = vec![];
        for _ in 0..30 {
            tokens.push(t);
            t = r.extend_greedy(&mut seq, &[t]).unwrap();
        }
        assert_eq!(&tokens, w);
    }
}

#[test]
fn a_prefix_hit_gives_exactly_the_tokens_of_a_miss() {
    let mut rng = StdRng::seed_from_u64(3);
    let system = random_prompt(&mut rng, 70, 264);
    let reqs: Vec<_> = (0..12)
        .map(|i| {
            let ask = random_prompt(&mut rng, 1 + 5 * i, 264);
            ([system.clone(), ask].concat(), greedy(25))
        })
        .collect();
    let want = alone(TINY, &reqs);
    // One at a time (each finds the blocks the previous ones left), then arriving together.
    let mut e = engine(TINY, 256, 64, true);
    for (i, r) in reqs.iter().enumerate() {
        let got = together(&mut e, std::slice::from_ref(r), &[0]);
        assert_eq!(got[0], want[i], "request {i}, one at a time");
    }
    let hits = e.stats().prefix_hit_tokens;
    assert!(
        hits >= 11 * 64,
        "the 70-token prefix's 4 blocks hit: {hits}"
    );
    let arrivals: Vec<usize> = (0..reqs.len()).map(|i| i / 3).collect();
    let got = together(&mut e, &reqs, &arrivals);
    assert_eq!(got, want, "arriving together");
    let s = e.stats();
    assert!(s.prefix_hit_rate > 0.4, "{s:?}");
    assert_eq!(s.blocks_used, 0);
}

#[test]
fn seeded_sampled_requests_repeat_whatever_the_batch() {
    let (mut reqs, arrivals) = workload(4, 264);
    for (i, (_, r)) in reqs.iter_mut().enumerate() {
        if i % 2 == 0 {
            r.sampling = SamplingParams {
                temperature: 0.8,
                top_k: 50,
                top_p: 0.9,
                repeat_penalty: 1.1,
                frequency_penalty: 0.2,
                seed: 100 + i as u64,
                ..Default::default()
            };
        }
    }
    let want = alone(TINY, &reqs);
    let mut e = engine(TINY, 256, 48, true);
    assert_eq!(together(&mut e, &reqs, &arrivals), want);
}

#[test]
fn preempted_requests_recompute_to_the_same_tokens() {
    let (reqs, arrivals) = workload(5, 264);
    let want = alone(TINY, &reqs);
    // 14 blocks (224 tokens) for 33 requests: preemptions all the way.
    let mut e = engine(TINY, 14, 32, true);
    let got = together(&mut e, &reqs, &arrivals);
    let s = e.stats();
    assert!(s.preemptions > 0, "{s:?}");
    assert_eq!(got, want);
    assert_eq!((s.blocks_used, s.blocks_free + s.blocks_cached), (0, 14));
}
