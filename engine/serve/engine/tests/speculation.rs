//! Speculative decoding in the engine: the tokens a request gets are the ones it would get
//! without (the fake model, greedy and seeded draws alike), and sampled tokens keep the
//! model's distribution (a model whose distribution is known).

use super::*;
use crate::batch::Batch;
use crate::runner::{Forward, Limits};
use crate::sampler::Choices;
use crate::serve::draft::DraftModel;

/// Every prompt through `e` with its params to the end: each one's tokens in order, and the
/// engine's figures; every block must be back.
fn run_all(
    e: &mut Engine<FakeModel>,
    prompts: &[Vec<u32>],
    params: &[RequestParams],
) -> (Vec<Vec<u32>>, EngineStats) {
    let ids: Vec<RequestId> = prompts
        .iter()
        .zip(params)
        .map(|(p, params)| e.add_request(p.clone(), params.clone()).unwrap())
        .collect();
    let mut out = Outputs::new();
    drain(e, &mut out);
    assert_eq!(e.stats().blocks_used, 0, "every block back");
    let tokens = ids.iter().map(|id| out[id].0.clone()).collect();
    (tokens, e.stats())
}

/// Speculative decoding keeps every request's tokens as they were without it, greedy,
/// sampled and penalised alike, whether its guesses all fit a step or are cut by a small
/// token budget, with the prefix cache on or off; every block comes back. A vocabulary of 3
/// makes the fake model's text repeat often enough for prompt lookup to guess right.
#[test]
fn speculation_changes_no_token_and_leaks_no_block() {
    let mut rng = StdRng::seed_from_u64(11);
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|_| (0..20).map(|_| rng.random_range(0..3)).collect())
        .collect();
    let params = |i: usize, speculate: usize| RequestParams {
        max_tokens: 40,
        sampling: SamplingParams {
            temperature: if i % 3 == 1 { 0.9 } else { 0.0 },
            repeat_penalty: if i % 3 == 2 { 1.3 } else { 1.0 },
            seed: i as u64,
            ..Default::default()
        },
        speculate,
        ..Default::default()
    };
    for (prefix_cache, budget) in [(false, 64), (true, 7), (true, 64)] {
        let run = |speculate: usize| {
            let model = FakeModel::new(3, 256, 48, budget).with_max_seqs(16);
            let opts = EngineOptions {
                token_budget: budget,
                max_seqs: 16,
                prefix_cache,
                eos: vec![],
                guess_rows: budget,
            };
            let mut e = Engine::new(model, opts).unwrap();
            let params: Vec<RequestParams> =
                (0..prompts.len()).map(|i| params(i, speculate)).collect();
            run_all(&mut e, &prompts, &params)
        };
        let (plain, plain_stats) = run(0);
        let (guessed, stats) = run(4);
        assert_eq!(
            guessed, plain,
            "budget {budget}, prefix cache {prefix_cache}"
        );
        assert!(plain.iter().all(|t| t.len() == 40));
        // Guesses only take budget no sequence's own token needs: never more steps, and
        // fewer where the budget has room for them.
        let fewer = match budget > 6 * 5 {
            true => stats.steps < plain_stats.steps,
            false => stats.steps <= plain_stats.steps,
        };
        assert!(
            stats.accepted_tokens > 0 && fewer,
            "budget {budget}: {stats:?} against {plain_stats:?}"
        );
        assert_eq!(plain_stats.drafted_tokens, 0);
    }
}

/// A draft model (the fake model drafting for itself) changes no request's tokens, greedy or
/// sampled; its greedy guesses are all the target's greedy choices, and its caches are freed
/// as requests end. With a small block pool for the draft, asks that do not fit get no guess.
#[test]
fn a_draft_model_changes_no_token() {
    let mut rng = StdRng::seed_from_u64(5);
    let prompts: Vec<Vec<u32>> = (0..5)
        .map(|n| {
            (0..10 + 7 * n)
                .map(|_| rng.random_range(0..VOCAB as u32))
                .collect()
        })
        .collect();
    let params = |i: usize, speculate: usize| RequestParams {
        max_tokens: 30,
        sampling: SamplingParams {
            temperature: if i % 2 == 1 { 0.8 } else { 0.0 },
            seed: i as u64,
            ..Default::default()
        },
        speculate,
        ..Default::default()
    };
    for draft_blocks in [64, 6] {
        let run = |speculate: usize| {
            let mut e = engine(64, 64, 16, true);
            if speculate > 0 {
                let draft = FakeModel::new(VOCAB, 256, draft_blocks, 64);
                e.set_drafter(Box::new(DraftModel::new(draft, VOCAB).unwrap()));
            }
            let params: Vec<RequestParams> =
                (0..prompts.len()).map(|i| params(i, speculate)).collect();
            run_all(&mut e, &prompts, &params)
        };
        let (plain, plain_stats) = run(0);
        let (drafted, stats) = run(5);
        assert_eq!(drafted, plain, "draft pool of {draft_blocks} blocks");
        assert!(
            stats.accepted_tokens > 0 && stats.steps < plain_stats.steps,
            "{stats:?}"
        );
    }
}

/// A model whose next token depends on the last one alone, through a fixed table of logits:
/// the distribution of every sampled token is known.
struct Markov {
    /// `[V, V]` row t: the logits after token t
    table: Vec<f32>,
    vocab: usize,
    logits: Vec<f32>,
    ids: Vec<u32>,
}

impl Markov {
    /// After token t, (t + 1) mod V is e^2 times as likely as each other token: the text
    /// mostly cycles, so prompt lookup guesses the cycle and is right about 71% of the time.
    fn cycling(vocab: usize) -> Markov {
        let table = (0..vocab * vocab)
            .map(|i| {
                if (i / vocab + 1) % vocab == i % vocab {
                    2.0
                } else {
                    0.0
                }
            })
            .collect();
        Markov {
            table,
            vocab,
            logits: vec![],
            ids: vec![],
        }
    }

    /// The probability of `next` after `last`.
    fn p(&self, last: usize, next: usize) -> f64 {
        let row = &self.table[last * self.vocab..][..self.vocab];
        let z: f64 = row.iter().map(|&l| (l as f64).exp()).sum();
        (row[next] as f64).exp() / z
    }

    fn run(&mut self, b: &Batch) {
        self.logits.clear();
        for &r in &b.logit_rows {
            let t = b.tokens[r as usize] as usize;
            self.logits
                .extend_from_slice(&self.table[t * self.vocab..][..self.vocab]);
        }
    }
}

impl Forward for Markov {
    fn limits(&self) -> Limits {
        Limits {
            vocab_size: self.vocab,
            model_context: 4096,
            max_context: 4096,
            n_blocks: 4096,
            max_batch_tokens: 1024,
            max_batch_seqs: 256,
            window: None,
        }
    }

    fn forward(&mut self, b: &Batch) -> Result<&[f32]> {
        self.run(b);
        Ok(&self.logits)
    }

    fn forward_greedy(&mut self, b: &Batch) -> Result<&[u32]> {
        self.run(b);
        self.ids.clear();
        let rows = self.logits.chunks_exact(self.vocab);
        self.ids.extend(rows.map(crate::cpu::ops::argmax_f32));
        Ok(&self.ids)
    }

    fn forward_sample(&mut self, b: &Batch, choices: &Choices) -> Result<&[u32]> {
        self.run(b);
        choices.sample_on_host(&mut self.logits, self.vocab, &mut self.ids);
        Ok(&self.ids)
    }
}

/// Sampled at temperature 1 with prompt lookup guessing up to 6 tokens, the pairs (token,
/// next token) of 300 requests follow the model's table: Pearson's chi-square over the 16
/// pairs (12 degrees of freedom) stays under 32.9, its 0.1% critical value. The draws are
/// seeded, so the test gives the same answer every run. Keeping a guess whenever the
/// model's most likely token agrees with it (rather than when the draw does) would favour
/// the cycle the guesses follow and fail it (the statistic is printed).
#[test]
fn sampled_tokens_keep_the_models_distribution() {
    const V: usize = 4;
    let model = Markov::cycling(V);
    let expected: Vec<f64> = (0..V * V).map(|i| model.p(i / V, i % V)).collect();
    let opts = EngineOptions {
        token_budget: 1024,
        max_seqs: 64,
        prefix_cache: false,
        eos: vec![],
        guess_rows: 1024,
    };
    let mut e = Engine::new(model, opts).unwrap();
    let prompt: Vec<u32> = (0..12).map(|i| i % V as u32).collect();
    let mut ids = vec![];
    for seed in 0..300 {
        let params = RequestParams {
            max_tokens: 60,
            sampling: SamplingParams {
                temperature: 1.0,
                seed,
                ..Default::default()
            },
            speculate: 6,
            ..Default::default()
        };
        ids.push(e.add_request(prompt.clone(), params).unwrap());
    }
    let mut out = Outputs::new();
    while e.has_work() {
        collect(&mut out, e.step().unwrap());
    }
    let stats = e.stats();
    assert!(
        stats.accepted_tokens * 5 > stats.generated_tokens,
        "most tokens should come from kept guesses: {stats:?}"
    );
    let mut counts = [0u64; V * V];
    for id in &ids {
        let tokens = &out[id].0;
        assert_eq!(tokens.len(), 60);
        let mut last = *prompt.last().unwrap() as usize;
        for &t in tokens {
            counts[last * V + t as usize] += 1;
            last = t as usize;
        }
    }
    let mut chi2 = 0.0;
    for last in 0..V {
        let row: u64 = counts[last * V..][..V].iter().sum();
        for next in 0..V {
            let want = row as f64 * expected[last * V + next];
            let got = counts[last * V + next] as f64;
            chi2 += (got - want).powi(2) / want;
        }
    }
    eprintln!(
        "chi-square {chi2:.1} over 12 degrees of freedom; {} of {} tokens kept guesses",
        stats.accepted_tokens, stats.generated_tokens
    );
    assert!(chi2 < 32.9, "counts {counts:?}, chi-square {chi2}");
}
