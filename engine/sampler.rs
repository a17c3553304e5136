//! Choosing the next token from the logits.
//!
//! In order, as Hugging Face applies them: the repetition penalty, then (unless greedy) the
//! temperature, top-k, top-p and min-p filters, then a draw from what remains. A seed makes
//! a sampled run repeatable.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cpu::ops::argmax_f32;

#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// 0 = greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 = all.
    pub top_k: usize,
    /// Keep the fewest most likely tokens whose probabilities sum to at least p; 1 = all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely; 0 = none.
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of tokens already seen; 1 = off.
    pub repeat_penalty: f32,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Checks the ranges, so a bad flag is a message and not a strange result.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!(
                "--temperature must be 0 or more, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("--top-p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("--min-p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return Err(format!(
                "--repeat-penalty must be above 0, got {}",
                self.repeat_penalty
            ));
        }
        Ok(())
    }
}

pub struct Sampler {
    pub config: SamplerConfig,
    rng: StdRng,
    /// `[vocab]` (probability, token) pairs, reused every step.
    candidates: Vec<(f32, u32)>,
    /// `[vocab]`: whether a token has appeared, for the repetition penalty.
    seen: Vec<bool>,
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Sampler {
        let rng = StdRng::seed_from_u64(config.seed);
        Sampler {
            config,
            rng,
            candidates: vec![],
            seen: vec![],
        }
    }

    /// Whether every choice is simply the most likely token (no temperature, no penalty):
    /// then the backend can pick it itself and skip sending the logits back.
    pub fn is_greedy(&self) -> bool {
        self.config.temperature == 0.0 && self.config.repeat_penalty == 1.0
    }

    /// Picks a token from `logits` (`[vocab]`, modified in place). `history`: the tokens of
    /// the sequence so far, prompt included, for the repetition penalty.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        let c = &self.config;
        if c.repeat_penalty != 1.0 {
            self.seen.clear();
            self.seen.resize(logits.len(), false);
            for &t in history {
                if let Some(s) = self.seen.get_mut(t as usize) {
                    *s = true;
                }
            }
            for (l, &seen) in logits.iter_mut().zip(&self.seen) {
                if seen {
                    *l = if *l > 0.0 {
                        *l / c.repeat_penalty
                    } else {
                        *l * c.repeat_penalty
                    };
                }
            }
        }
        if c.temperature == 0.0 {
            return argmax_f32(logits);
        }

        // Softmax at the temperature, most likely first.
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        self.candidates.clear();
        self.candidates.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (((l - max) / c.temperature).exp(), i as u32)),
        );
        let cands = &mut self.candidates;
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

    fn sampler(f: impl FnOnce(&mut SamplerConfig)) -> Sampler {
        let mut c = SamplerConfig::default();
        f(&mut c);
        c.validate().unwrap();
        Sampler::new(c)
    }

    fn counts(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<usize> {
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
        let bad = |f: fn(&mut SamplerConfig)| {
            let mut c = SamplerConfig::default();
            f(&mut c);
            c.validate().is_err()
        };
        assert!(bad(|c| c.temperature = -1.0));
        assert!(bad(|c| c.top_p = 0.0));
        assert!(bad(|c| c.min_p = 1.5));
        assert!(bad(|c| c.repeat_penalty = 0.0));
    }
}
