//! Choosing the next token from the logits, per request.
//!
//! In order, as vLLM applies them: the repetition penalty (over the prompt and the tokens
//! generated so far, as Hugging Face defines it), the frequency and presence penalties (over
//! the generated tokens, as OpenAI defines them), then (unless greedy) the temperature, top-k,
//! top-p and min-p filters, then a draw from what remains. Each request carries its own
//! parameters and its own seeded generator, so a seeded request draws the same tokens
//! whatever else shares its batch.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cpu::ops::argmax_f32;

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 = all.
    pub top_k: usize,
    /// Keep the fewest most likely tokens whose probabilities sum to at least p; 1 = all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely; 0 = none.
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of tokens already seen, prompt included;
    /// 1 = off.
    pub repeat_penalty: f32,
    /// Subtracted from the logit of every token generated at least once; 0 = off.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated; 0 = off.
    pub frequency_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

/// A parameter out of its range: `name` as the field is called (`top_p`), `reason` the rest
/// of the sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidParam {
    pub name: &'static str,
    pub reason: String,
}

impl std::fmt::Display for InvalidParam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.name, self.reason)
    }
}

impl SamplingParams {
    /// Checks the ranges, so a bad parameter is a message and not a strange result.
    pub fn validate(&self) -> Result<(), InvalidParam> {
        let bad = |name, reason: String| Err(InvalidParam { name, reason });
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(
                "temperature",
                format!("must be 0 or more, got {}", self.temperature),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", format!("must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return bad(
                "repeat_penalty",
                format!("must be above 0, got {}", self.repeat_penalty),
            );
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(name, format!("must be in [-2, 2], got {v}"));
            }
        }
        Ok(())
    }

    /// Whether every choice is the most likely token.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Whether the choice is the most likely token of the raw logits (greedy, no penalty):
    /// then the backend can pick it itself and never send the logits back.
    pub fn is_plain_greedy(&self) -> bool {
        self.is_greedy()
            && self.repeat_penalty == 1.0
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
    }
}

/// Buffers every request's sampling shares (one request is sampled at a time), grown to the
/// vocabulary once.
#[derive(Default)]
pub struct SamplerScratch {
    /// `[vocab]` (probability, token) pairs.
    candidates: Vec<(f32, u32)>,
    /// `[vocab]` how often each token appears; all zeros between calls.
    counts: Vec<u32>,
}

/// One request's sampling: its parameters and its own generator.
#[derive(Clone, Debug)]
pub struct Sampler {
    pub params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = StdRng::seed_from_u64(params.seed);
        Sampler { params, rng }
    }

    /// Picks a token from `logits` (`[vocab]`, modified in place). `prompt` and `generated`:
    /// the request's tokens so far, for the penalties.
    pub fn sample(
        &mut self,
        scratch: &mut SamplerScratch,
        logits: &mut [f32],
        prompt: &[u32],
        generated: &[u32],
    ) -> u32 {
        let c = &self.params;
        let vocab = logits.len();
        let counts = &mut scratch.counts;
        counts.resize(vocab, 0);
        // Token ids as indices, those outside the vocabulary skipped.
        fn in_vocab(t: &[u32], vocab: usize) -> impl Iterator<Item = usize> + '_ {
            t.iter().map(|&t| t as usize).filter(move |&t| t < vocab)
        }
        let ids = |t| in_vocab(t, vocab);
        if c.repeat_penalty != 1.0 {
            // Once per distinct token of the prompt and the output: marked, then applied and
            // unmarked at its first occurrence.
            let p = c.repeat_penalty;
            let seen = || ids(prompt).chain(ids(generated));
            seen().for_each(|t| counts[t] = 1);
            for t in seen() {
                if std::mem::take(&mut counts[t]) == 1 {
                    let l = &mut logits[t];
                    *l = if *l > 0.0 { *l / p } else { *l * p };
                }
            }
        }
        if c.presence_penalty != 0.0 || c.frequency_penalty != 0.0 {
            ids(generated).for_each(|t| counts[t] += 1);
            for t in ids(generated) {
                let n = std::mem::take(&mut counts[t]);
                if n > 0 {
                    logits[t] -= c.presence_penalty + c.frequency_penalty * n as f32;
                }
            }
        }
        if c.temperature == 0.0 {
            return argmax_f32(logits);
        }

        // Softmax at the temperature, most likely first.
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        scratch.candidates.clear();
        scratch.candidates.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (((l - max) / c.temperature).exp(), i as u32)),
        );
        let cands = &mut scratch.candidates;
        let by_prob = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        let mut keep = cands.len();
        if c.top_k > 0 && c.top_k < keep {
            cands.select_nth_unstable_by(c.top_k - 1, by_prob);
            keep = c.top_k;
        }
        cands[..keep].sort_unstable_by(by_prob);
        let total: f32 = cands[..keep].iter().map(|c| c.0).sum();
        if c.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, cand) in cands[..keep].iter().enumerate() {
                acc += cand.0 / total;
                if acc >= c.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        if c.min_p > 0.0 {
            let floor = cands[0].0 * c.min_p;
            keep = cands[..keep]
                .iter()
                .take_while(|cand| cand.0 >= floor)
                .count()
                .max(1);
        }
        let total: f32 = cands[..keep].iter().map(|c| c.0).sum();
        let mut r = self.rng.random::<f32>() * total;
        for cand in &cands[..keep] {
            r -= cand.0;
            if r <= 0.0 {
                return cand.1;
            }
        }
        cands[keep - 1].1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's sampler with its scratch, history passed as the prompt.
    struct S(Sampler, SamplerScratch);

    impl S {
        fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
            self.0.sample(&mut self.1, logits, history, &[])
        }
    }

    fn sampler(f: impl FnOnce(&mut SamplingParams)) -> S {
        let mut c = SamplingParams::default();
        f(&mut c);
        c.validate().unwrap();
        S(Sampler::new(c), SamplerScratch::default())
    }

    fn counts(s: &mut S, logits: &[f32], n: usize) -> Vec<usize> {
        let mut counts = vec![0; logits.len()];
        for _ in 0..n {
            counts[s.sample(&mut logits.to_vec(), &[]) as usize] += 1;
        }
        counts
    }

    const LOGITS: [f32; 4] = [1.0, 3.0, 2.0, 0.0];

    #[test]
    fn greedy_takes_the_largest() {
        assert_eq!(sampler(|_| {}).sample(&mut LOGITS.to_vec(), &[]), 1);
    }

    #[test]
    fn repetition_penalty_can_change_the_greedy_choice() {
        let mut s = sampler(|c| c.repeat_penalty = 2.0);
        // token 1 (3.0) was seen: 1.5 < 2.0, so token 2 wins
        assert_eq!(s.sample(&mut LOGITS.to_vec(), &[1]), 2);
        // a negative logit is multiplied, pushed further down
        let mut l = vec![-1.0, -1.5];
        assert_eq!(s.sample(&mut l, &[0]), 1);
        assert_eq!(l, vec![-2.0, -1.5]);
        // once per distinct token, whether in the prompt, the output or both
        let mut l = vec![8.0, 8.0, 1.0];
        s.0.sample(&mut s.1, &mut l, &[0, 0, 1], &[1, 0, 1]);
        assert_eq!(l, vec![4.0, 4.0, 1.0]);
    }

    #[test]
    fn presence_and_frequency_penalties_count_the_output_only() {
        let mut s = sampler(|c| {
            c.presence_penalty = 0.5;
            c.frequency_penalty = 0.25
        });
        let mut l = vec![4.0, 4.0, 4.0, 4.0];
        // token 0 only in the prompt: untouched; token 1 once, token 2 three times
        let t = s.0.sample(&mut s.1, &mut l, &[0, 3], &[1, 2, 2, 2]);
        assert_eq!(l, vec![4.0, 3.25, 2.75, 4.0]);
        assert_eq!(t, 0);
        assert!(s.1.counts.iter().all(|&n| n == 0), "scratch left clean");
    }

    #[test]
    fn top_k_one_is_greedy_and_top_k_two_never_leaves_the_two() {
        let mut s = sampler(|c| {
            c.temperature = 1.0;
            c.top_k = 1
        });
        assert_eq!(counts(&mut s, &LOGITS, 50)[1], 50);
        let mut s = sampler(|c| {
            c.temperature = 1.0;
            c.top_k = 2
        });
        let n = counts(&mut s, &LOGITS, 2000);
        assert_eq!(n[0] + n[3], 0);
        // p(1) / p(2) = e: expect about 1462 vs 538
        assert!(n[1] > 1300 && n[2] > 400, "{n:?}");
    }

    #[test]
    fn top_p_keeps_the_smallest_sufficient_set() {
        // probabilities of LOGITS: [.087, .644, .237, .032]; top 1 covers .644
        let mut s = sampler(|c| {
            c.temperature = 1.0;
            c.top_p = 0.6
        });
        assert_eq!(counts(&mut s, &LOGITS, 200)[1], 200);
        let mut s = sampler(|c| {
            c.temperature = 1.0;
            c.top_p = 0.85
        });
        let n = counts(&mut s, &LOGITS, 500);
        assert!(n[0] + n[3] == 0 && n[2] > 0, "{n:?}");
    }

    #[test]
    fn min_p_drops_the_unlikely() {
        // relative to the best: [.135, 1, .368, .050]; min_p .3 keeps tokens 1 and 2
        let mut s = sampler(|c| {
            c.temperature = 1.0;
            c.min_p = 0.3
        });
        let n = counts(&mut s, &LOGITS, 500);
        assert!(n[0] + n[3] == 0 && n[1] > 0 && n[2] > 0, "{n:?}");
    }

    #[test]
    fn seed_makes_runs_repeatable_and_temperature_flattens() {
        let run = |seed| {
            let mut s = sampler(|c| {
                c.temperature = 1.0;
                c.seed = seed
            });
            (0..40)
                .map(|_| s.sample(&mut LOGITS.to_vec(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let mut hot = sampler(|c| c.temperature = 100.0);
        let n = counts(&mut hot, &LOGITS, 2000);
        assert!(
            n.iter().all(|&k| k > 350),
            "near-uniform at high temperature: {n:?}"
        );
    }

    #[test]
    fn bad_settings_are_refused() {
        let bad = |f: fn(&mut SamplingParams)| {
            let mut c = SamplingParams::default();
            f(&mut c);
            c.validate().unwrap_err().name
        };
        assert_eq!(bad(|c| c.temperature = -1.0), "temperature");
        assert_eq!(bad(|c| c.top_p = 0.0), "top_p");
        assert_eq!(bad(|c| c.min_p = 1.5), "min_p");
        assert_eq!(bad(|c| c.repeat_penalty = 0.0), "repeat_penalty");
        assert_eq!(bad(|c| c.presence_penalty = 2.5), "presence_penalty");
        assert_eq!(bad(|c| c.frequency_penalty = f32::NAN), "frequency_penalty");
        let e = SamplingParams {
            top_p: 0.0,
            ..Default::default()
        };
        assert_eq!(
            e.validate().unwrap_err().to_string(),
            "top_p must be in (0, 1], got 0"
        );
    }
}
