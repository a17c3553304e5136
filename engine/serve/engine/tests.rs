use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::serve::fake::FakeModel;

const VOCAB: usize = 40;
const EOS: u32 = 0;

fn engine(
    n_blocks: usize,
    budget: usize,
    max_seqs: usize,
    prefix_cache: bool,
) -> Engine<FakeModel> {
    let model = FakeModel::new(VOCAB, 256, n_blocks, budget).with_max_seqs(max_seqs);
    let opts = EngineOptions {
        token_budget: budget,
        max_seqs: 1000,
        prefix_cache,
        eos: vec![EOS],
        ..Default::default()
    };
    Engine::new(model, opts).unwrap()
}

fn greedy(max_tokens: usize) -> RequestParams {
    RequestParams {
        max_tokens,
        ..Default::default()
    }
}

/// Every request's output tokens and finish reason, stepping until all are done; checks
/// the block manager after every step.
type Outputs = HashMap<RequestId, (Vec<u32>, Option<FinishReason>)>;

fn collect(out: &mut Outputs, step: Vec<StepOutput>) {
    for o in step {
        let e = out.entry(o.id).or_default();
        assert!(e.1.is_none(), "request {} went on after finishing", o.id);
        e.0.extend(o.token);
        e.1 = o.finish;
    }
}

fn drain(e: &mut Engine<FakeModel>, out: &mut Outputs) {
    while e.has_work() {
        let step = e.step().unwrap();
        collect(out, step);
        e.scheduler.audit().unwrap();
    }
}

/// The request run alone, in an engine of its own with room to spare.
fn alone(prompt: &[u32], params: &RequestParams) -> (Vec<u32>, FinishReason) {
    let mut e = engine(64, 64, 64, false);
    let id = e.add_request(prompt.to_vec(), params.clone()).unwrap();
    let mut out = Outputs::new();
    drain(&mut e, &mut out);
    let (tokens, finish) = out.remove(&id).unwrap();
    (tokens, finish.unwrap())
}

fn prompt(rng: &mut StdRng, len: usize) -> Vec<u32> {
    (0..len)
        .map(|_| rng.random_range(1..VOCAB as u32))
        .collect()
}

#[test]
fn requests_are_checked_up_front() {
    let mut e = engine(4, 16, 8, true); // 64 tokens of pool, under the 256 of context
    let err = |e: &mut Engine<FakeModel>, p: Vec<u32>, r: RequestParams| {
        e.add_request(p, r).unwrap_err().to_string()
    };
    assert!(err(&mut e, vec![], greedy(1)).contains("no tokens"));
    assert!(err(&mut e, vec![1, 40], greedy(1)).contains("prompt token 1 is id 40"));
    assert!(err(&mut e, vec![1], greedy(0)).contains("max_tokens"));
    let hot = RequestParams {
        sampling: SamplingParams {
            top_p: 0.0,
            ..Default::default()
        },
        ..greedy(1)
    };
    assert!(err(&mut e, vec![1], hot).contains("top_p must be in (0, 1]"));
    let stop = RequestParams {
        stop_token_ids: vec![99],
        ..greedy(1)
    };
    assert!(err(&mut e, vec![1], stop).contains("stop token id 99"));
    let long = err(&mut e, vec![1; 65], greedy(1));
    assert!(
        long.contains("the KV cache (--kv-blocks) holds only 64"),
        "{long}"
    );
    let much = err(&mut e, vec![1; 60], greedy(6));
    assert!(much.contains("needs 65 positions"), "{much}");
    // 60 + 5 - 1 = 64: the last token needs no room.
    e.add_request(vec![1; 60], greedy(5)).unwrap();
    assert_eq!(e.stats().waiting, 1);
}

#[test]
fn a_preempted_request_finishes_with_the_same_tokens() {
    let mut rng = StdRng::seed_from_u64(1);
    // 8 blocks; three requests that each grow to 4 blocks cannot all run at once.
    let mut e = engine(8, 32, 8, true);
    let reqs: Vec<_> = (0..3).map(|_| (prompt(&mut rng, 20), greedy(40))).collect();
    let mut ids = vec![];
    for (p, r) in &reqs {
        let mut r = r.clone();
        r.ignore_eos = true;
        ids.push(e.add_request(p.clone(), r).unwrap());
    }
    let mut out = Outputs::new();
    drain(&mut e, &mut out);
    assert!(e.stats().preemptions > 0, "the pool was meant to run out");
    for (id, (p, r)) in ids.iter().zip(&reqs) {
        let mut r = r.clone();
        r.ignore_eos = true;
        let want = alone(p, &r);
        assert_eq!(out[id], (want.0, Some(want.1)), "request {id}");
        assert_eq!(out[id].0.len(), 40);
    }
}

#[test]
fn a_prefix_hit_gives_the_tokens_of_a_miss() {
    let mut rng = StdRng::seed_from_u64(2);
    let system = prompt(&mut rng, 50);
    let asks: Vec<Vec<u32>> = (0..4)
        .map(|i| [system.clone(), prompt(&mut rng, 3 + i)].concat())
        .collect();
    let mut runs = vec![];
    for cache in [false, true] {
        let mut e = engine(32, 64, 8, cache);
        let mut out = Outputs::new();
        let mut ids = vec![];
        // One after another, so each later one can find the first's blocks.
        for p in &asks {
            ids.push(e.add_request(p.clone(), greedy(12)).unwrap());
            drain(&mut e, &mut out);
        }
        let s = e.stats();
        if cache {
            // 3 full blocks of the 50-token prefix, for each of the three later requests.
            assert_eq!(s.prefix_hit_tokens, 3 * 48);
            assert!(s.prefix_hit_rate > 0.5, "{s:?}");
            assert_eq!(s.blocks_used, 0);
            assert!(s.blocks_cached > 0);
        } else {
            assert_eq!((s.prefix_hit_tokens, s.blocks_cached), (0, 0));
        }
        runs.push(ids.iter().map(|id| out[id].clone()).collect::<Vec<_>>());
    }
    assert_eq!(runs[0], runs[1]);
}

#[test]
fn hash_collisions_cost_hits_never_tokens() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut e = engine(40, 48, 8, true);
    e.scheduler.blocks.prefix.set_hash(|_, _| 1);
    let shared = prompt(&mut rng, 40);
    let mut reqs = vec![];
    for i in 0..8 {
        let p = if i % 2 == 0 {
            [shared.clone(), prompt(&mut rng, 5)].concat()
        } else {
            prompt(&mut rng, 45)
        };
        reqs.push((e.add_request(p.clone(), greedy(20)).unwrap(), p));
    }
    let mut out = Outputs::new();
    drain(&mut e, &mut out);
    for (id, p) in &reqs {
        let want = alone(p, &greedy(20));
        assert_eq!(out[id], (want.0, Some(want.1)));
    }
}

#[test]
fn seeded_sampling_repeats_whatever_the_batch() {
    let mut rng = StdRng::seed_from_u64(4);
    let sampled = |seed| RequestParams {
        sampling: SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            presence_penalty: 0.3,
            seed,
            ..Default::default()
        },
        max_tokens: 30,
        ..Default::default()
    };
    let mine = prompt(&mut rng, 23);
    let (want, _) = alone(&mine, &sampled(7));
    let mut e = engine(64, 40, 16, true);
    let mut out = Outputs::new();
    for i in 0..10 {
        e.add_request(prompt(&mut rng, 5 + 3 * i), sampled(i as u64))
            .unwrap();
        collect(&mut out, e.step().unwrap());
    }
    let id = e.add_request(mine, sampled(7)).unwrap();
    drain(&mut e, &mut out);
    assert_eq!(out[&id].0, want);
}

#[test]
fn logprobs_report_the_chosen_token_and_the_most_likely() {
    let p: Vec<u32> = (1..30).collect();
    let with = RequestParams {
        logprobs: Some(3),
        ..greedy(8)
    };
    let mut e = engine(16, 32, 8, true);
    let id = e.add_request(p.clone(), with).unwrap();
    let mut tokens = vec![];
    while e.has_work() {
        for o in e.step().unwrap() {
            assert_eq!(o.id, id);
            let lp = o.logprobs.expect("asked for");
            assert_eq!(o.token.unwrap_or(lp.token), lp.token);
            // Greedy: the chosen token is the most likely one.
            assert_eq!(lp.top.len(), 3);
            assert_eq!((lp.top[0].0, lp.top[0].1), (lp.token, lp.logprob));
            assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
            let mass: f32 = lp.top.iter().map(|t| t.1.exp()).sum();
            assert!(lp.logprob < 0.0 && mass < 1.0, "{lp:?}");
            tokens.extend(o.token);
        }
    }
    let m = e.model();
    assert_eq!(
        (m.passes, m.greedy_passes),
        (8, 0),
        "the logits path, never the greedy one"
    );
    // The logits path chooses what the greedy path does.
    assert_eq!(tokens, alone(&p, &greedy(8)).0);
    // Without logprobs there are none; a sampled token has its own, below the top one.
    let sampled = RequestParams {
        sampling: SamplingParams {
            temperature: 1.5,
            seed: 3,
            ..Default::default()
        },
        logprobs: Some(0),
        ..greedy(20)
    };
    let mut e = engine(16, 32, 8, true);
    e.add_request(p.clone(), greedy(3)).unwrap();
    e.add_request(p, sampled).unwrap();
    while e.has_work() {
        for o in e.step().unwrap() {
            match o.id {
                0 => assert!(o.logprobs.is_none()),
                _ => assert!(o.logprobs.unwrap().top.is_empty()),
            }
        }
    }
    let too_many = RequestParams {
        logprobs: Some(MAX_TOP_LOGPROBS + 1),
        ..greedy(3)
    };
    assert!(e.add_request(vec![1, 2], too_many).is_err());
}

/// `n` choices of one prompt: the prompt is computed once and its full blocks are held
/// by every choice.
#[test]
fn siblings_share_the_prompts_full_blocks() {
    // 40 tokens: 2 full blocks before the last
    let p: Vec<u32> = (0..40).map(|i| 1 + i % 39).collect();
    let mut e = engine(32, 64, 8, true);
    let ids = e.add_group(p.clone(), vec![greedy(6); 3]).unwrap();
    let mut out = Outputs::new();
    collect(&mut out, e.step().unwrap());
    let s = e.stats();
    assert_eq!(
        (s.running, s.waiting),
        (1, 2),
        "the first computes the prompt"
    );
    collect(&mut out, e.step().unwrap());
    let running = e.scheduler().running();
    assert_eq!(running.len(), 3);
    let shared = &running[0].table.blocks[..2];
    for seq in &running[1..] {
        assert_eq!(&seq.table.blocks[..2], shared);
        assert_ne!(seq.table.blocks[2], running[0].table.blocks[2]);
    }
    for &b in shared {
        assert_eq!(e.scheduler().blocks.refcount(b), 3);
    }
    assert_eq!(e.stats().prefix_hit_tokens, 2 * 32);
    drain(&mut e, &mut out);
    let want = alone(&p, &greedy(6));
    for id in ids {
        assert_eq!(out[&id], (want.0.clone(), Some(want.1)));
    }
    // Without the prefix cache there is nothing to wait for: all start at once.
    let mut e = engine(32, 128, 8, false);
    e.add_group(p.clone(), vec![greedy(6); 3]).unwrap();
    e.step().unwrap();
    assert_eq!(e.stats().running, 3);
    // One bad member refuses the whole group.
    let bad = RequestParams {
        max_tokens: 0,
        ..greedy(1)
    };
    assert!(e.add_group(p, vec![greedy(1), bad]).is_err());
    assert_eq!(e.stats().waiting, 0);
}

#[test]
fn abort_ends_a_request_and_frees_its_blocks() {
    let mut e = engine(16, 32, 8, true);
    let a = e.add_request(vec![3; 40], greedy(50)).unwrap();
    let b = e.add_request(vec![4; 40], greedy(50)).unwrap();
    e.step().unwrap();
    e.step().unwrap();
    assert!(e.abort(a));
    assert!(!e.abort(a));
    let s = e.stats();
    assert_eq!((s.running, s.waiting), (1, 0));
    assert!(e.abort(b));
    let s = e.stats();
    assert!(!e.has_work());
    assert_eq!(s.blocks_used, 0);
    assert_eq!(s.blocks_free + s.blocks_cached, 16);
    e.scheduler.audit().unwrap();
}

/// Random workloads: requests of random lengths (many sharing prefixes) arrive at random
/// steps, some sampled, some aborted, in pools small enough to force preemptions. After
/// every step the block manager's books must balance; at the end every block is back;
/// every request that finished produced exactly what it produces alone, and every aborted
/// one a prefix of that.
#[test]
fn random_workloads_never_leak_and_never_change_a_token() {
    let (mut steps, mut preemptions, mut hits, mut aborts, mut finished) = (0, 0, 0, 0, 0);
    for seed in 0..8 {
        let mut rng = StdRng::seed_from_u64(seed);
        let n_blocks = rng.random_range(10..40);
        let budget = rng.random_range(4..80);
        let max_seqs = rng.random_range(1..12);
        let mut e = engine(n_blocks, budget, max_seqs, seed % 4 != 3);
        let room = (n_blocks * 16).min(256);
        let systems: Vec<Vec<u32>> = (0..3)
            .map(|_| {
                let n = rng.random_range(0..60);
                prompt(&mut rng, n)
            })
            .collect();
        let mut reqs: Vec<(RequestId, Vec<u32>, RequestParams)> = vec![];
        let mut aborted = vec![];
        let mut out = Outputs::new();
        for _ in 0..1500 {
            if reqs.len() < 120 && rng.random_bool(0.3) {
                let sys = &systems[rng.random_range(0..systems.len())];
                let n = rng.random_range(1..40);
                let p = [sys.clone(), prompt(&mut rng, n)].concat();
                let max_tokens = rng.random_range(1..40).min(room + 1 - p.len());
                let mut r = greedy(max_tokens);
                if rng.random_bool(0.3) {
                    r.sampling.temperature = 0.8;
                    r.sampling.seed = rng.random();
                }
                r.ignore_eos = rng.random_bool(0.2);
                reqs.push((e.add_request(p.clone(), r.clone()).unwrap(), p, r));
            }
            if rng.random_bool(0.03) && !reqs.is_empty() {
                let (id, ..) = reqs[rng.random_range(0..reqs.len())];
                if e.abort(id) {
                    aborted.push(id);
                }
            }
            let step = e.step().unwrap();
            collect(&mut out, step);
            e.scheduler.audit().unwrap();
            steps += 1;
        }
        drain(&mut e, &mut out);
        let s = e.stats();
        assert_eq!((s.running, s.waiting, s.blocks_used), (0, 0, 0));
        assert_eq!(s.blocks_free + s.blocks_cached, n_blocks);
        e.scheduler.blocks.audit([]).unwrap();
        for (id, p, r) in &reqs {
            let (want, why) = alone(p, r);
            let got = out.get(id).cloned().unwrap_or_default();
            if aborted.contains(id) {
                assert!(
                    want.starts_with(&got.0),
                    "seed {seed}: aborted request {id}"
                );
            } else {
                assert_eq!(got, (want, Some(why)), "seed {seed}: request {id}");
            }
        }
        let m = e.model();
        assert!(m.max_tokens_seen <= budget && m.max_seqs_seen <= max_seqs);
        preemptions += s.preemptions;
        hits += s.prefix_hit_tokens;
        aborts += aborted.len();
        finished += reqs.len() - aborted.len();
    }
    eprintln!(
        "{steps} steps, {preemptions} preemptions, {hits} prefix-hit tokens, {aborts} aborts, {finished} finished"
    );
    assert!(steps >= 8 * 1500);
    assert!(
        preemptions > 0 && hits > 0 && aborts > 0,
        "{preemptions} {hits} {aborts}"
    );
}

mod speculation;

/// A model whose every layer attends over a sliding window (Mistral's): a sequence gives
/// back its blocks as they fall out of the window, so requests that would each outgrow a
/// third of the pool run side by side without preemption, with the tokens of a run alone.
#[test]
fn a_windowed_model_gives_back_the_blocks_out_of_its_window() {
    let mut rng = StdRng::seed_from_u64(7);
    let reqs: Vec<Vec<u32>> = (0..3).map(|_| prompt(&mut rng, 20)).collect();
    let params = RequestParams {
        ignore_eos: true,
        ..greedy(60)
    };
    // 10 blocks of 16: each request reaches 80 positions (5 blocks), 15 in all; a window of
    // 24 keeps at most 3 blocks a sequence (2 wholly or partly inside, 1 being filled).
    let model = FakeModel::new(VOCAB, 256, 10, 32).with_window(24);
    let opts = EngineOptions {
        token_budget: 32,
        max_seqs: 1000,
        prefix_cache: true,
        eos: vec![EOS],
        ..Default::default()
    };
    let mut e = Engine::new(model, opts).unwrap();
    let ids: Vec<_> = reqs
        .iter()
        .map(|p| e.add_request(p.clone(), params.clone()).unwrap())
        .collect();
    let mut out = Outputs::new();
    let mut most_used = 0;
    while e.has_work() {
        let step = e.step().unwrap();
        collect(&mut out, step);
        e.scheduler.audit().unwrap();
        most_used = most_used.max(e.scheduler.blocks.n_used());
    }
    assert_eq!(
        e.stats().preemptions,
        0,
        "the window was meant to make room"
    );
    assert!(most_used <= 9, "{most_used} blocks held at once");
    for (id, p) in ids.iter().zip(&reqs) {
        let want = alone(p, &params);
        assert_eq!(out[id], (want.0, Some(want.1)), "request {id}");
    }
    assert_eq!(e.scheduler.blocks.n_used(), 0, "every block given back");
}
