//! Choosing the next token from the logits, per request.
//!
//! In order, as vLLM applies them: the repetition penalty (over the prompt and the tokens
//! generated so far, as Hugging Face defines it), the frequency and presence penalties (over
//! the generated tokens, as OpenAI defines them), then (unless greedy) the temperature, top-k,
//! top-p and min-p filters, then a draw from what remains. The draw's random number is a hash
//! of the request's seed and the index of the token being drawn, so a seeded request draws the
//! same tokens whatever else shares its batch.
//!
//! A step's choices travel as `Choices`, one row per request: on the GPU the penalties and the
//! draw run as kernels (`penalize_f32`, `sample_f32`) and only the ids come back; on the CPU
//! the same functions (their twins) run on the host, so both backends choose alike.

use crate::cpu::ops::{SAMPLE_PARAMS, mask_logits_f32, penalize_f32, sample_f32, sample_params};

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

/// How to choose each logits row's token in one step (`Forward::forward_sample`).
#[derive(Clone, Debug, Default)]
pub struct Choices {
    /// `[rows, SAMPLE_PARAMS]` each row's parameters (`cpu::ops::sample_params`).
    pub params: Vec<u32>,
    /// `[rows]` the index of the draw (how many tokens the request generated before).
    pub steps: Vec<u32>,
    /// `[n, 3]` (row, token, times generated | in prompt << 31), distinct per row: the
    /// tokens the penalties touch (none when no row has a penalty).
    pub penalty_entries: Vec<u32>,
    /// `[rows, 3]` repeat, presence and frequency penalty of each row.
    pub penalties: Vec<f32>,
    /// `[n, ceil(vocab / 32)]` the grammar masks of the constrained rows: bit `t % 32` of word
    /// `t / 32` set when token `t` may be chosen (`constrain::Constraint::mask`).
    pub masks: Vec<u32>,
    /// `[n]` the row each mask applies to.
    pub mask_rows: Vec<u32>,
    /// `[vocab]` per-token counts while a row's entries are built; all zeros between rows.
    counts: Vec<u32>,
}

/// The entry bit of a token seen in the prompt.
const IN_PROMPT: u32 = 1 << 31;

impl Choices {
    pub fn clear(&mut self) {
        self.params.clear();
        self.steps.clear();
        self.penalty_entries.clear();
        self.penalties.clear();
        self.masks.clear();
        self.mask_rows.clear();
    }

    pub fn rows(&self) -> usize {
        self.steps.len()
    }

    /// Adds the next row: a request with these parameters whose prompt and generated tokens
    /// are these (every id inside `vocab`).
    pub fn push(&mut self, p: &SamplingParams, prompt: &[u32], generated: &[u32], vocab: usize) {
        let row = self.rows() as u32;
        self.params.extend(sample_params(
            p.temperature,
            p.top_k,
            p.top_p,
            p.min_p,
            p.seed,
        ));
        self.steps.push(generated.len() as u32);
        self.penalties
            .extend([p.repeat_penalty, p.presence_penalty, p.frequency_penalty]);
        let repeat = p.repeat_penalty != 1.0;
        if !repeat && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 {
            return;
        }
        // Each distinct token once: counted (times generated, and whether in the prompt),
        // then emitted and cleared at its first occurrence.
        self.counts.resize(vocab, 0);
        let prompt = if repeat { prompt } else { &[] };
        prompt
            .iter()
            .for_each(|&t| self.counts[t as usize] |= IN_PROMPT);
        generated.iter().for_each(|&t| self.counts[t as usize] += 1);
        for &t in prompt.iter().chain(generated) {
            let c = std::mem::take(&mut self.counts[t as usize]);
            if c != 0 {
                self.penalty_entries.extend([row, t, c]);
            }
        }
    }

    /// Restricts the last row pushed to the tokens `mask` allows (`[ceil(vocab / 32)]`).
    pub fn push_mask(&mut self, mask: &[u32]) {
        let row = self.rows() - 1;
        self.masks.extend_from_slice(mask);
        self.mask_rows.push(row as u32);
    }

    /// Whether every row is a plain argmax of the raw logits.
    pub fn all_plain_greedy(&self) -> bool {
        self.penalty_entries.is_empty()
            && self.mask_rows.is_empty()
            && self
                .params
                .chunks_exact(SAMPLE_PARAMS)
                .all(|p| f32::from_bits(p[0]) == 0.0)
    }

    /// The choices made on the host: `logits` (`[rows, vocab]`) penalised and masked in
    /// place, then drawn from, into `out`.
    pub fn sample_on_host(&self, logits: &mut [f32], vocab: usize, out: &mut Vec<u32>) {
        penalize_f32(logits, &self.penalty_entries, &self.penalties, vocab);
        mask_logits_f32(logits, &self.masks, &self.mask_rows, vocab);
        out.clear();
        out.resize(self.rows(), 0);
        sample_f32(out, logits, &self.params, &self.steps, vocab);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOGITS: [f32; 4] = [1.0, 3.0, 2.0, 0.0];

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut c = SamplingParams::default();
        f(&mut c);
        c.validate().unwrap();
        c
    }

    /// One draw from `logits` for a request with these parameters and tokens so far.
    fn draw(p: &SamplingParams, logits: &mut [f32], prompt: &[u32], generated: &[u32]) -> u32 {
        let mut ch = Choices::default();
        ch.push(p, prompt, generated, logits.len());
        let mut out = vec![];
        ch.sample_on_host(logits, logits.len(), &mut out);
        out[0]
    }

    /// How often each token is drawn over `n` draws (the draw index running 0..n).
    fn counts(p: &SamplingParams, logits: &[f32], n: usize) -> Vec<usize> {
        let mut counts = vec![0; logits.len()];
        let generated = vec![0u32; n];
        for i in 0..n {
            let mut l = logits.to_vec();
            // No penalties here: the generated tokens only set the draw index.
            counts[draw(p, &mut l, &[], &generated[..i]) as usize] += 1;
        }
        counts
    }

    #[test]
    fn greedy_takes_the_largest() {
        assert_eq!(draw(&params(|_| {}), &mut LOGITS.to_vec(), &[], &[]), 1);
    }

    #[test]
    fn repetition_penalty_can_change_the_greedy_choice() {
        let p = params(|c| c.repeat_penalty = 2.0);
        // token 1 (3.0) was seen: 1.5 < 2.0, so token 2 wins
        assert_eq!(draw(&p, &mut LOGITS.to_vec(), &[1], &[]), 2);
        // a negative logit is multiplied, pushed further down
        let mut l = vec![-1.0, -1.5];
        assert_eq!(draw(&p, &mut l, &[0], &[]), 1);
        assert_eq!(l, vec![-2.0, -1.5]);
        // once per distinct token, whether in the prompt, the output or both
        let mut l = vec![8.0, 8.0, 1.0];
        draw(&p, &mut l, &[0, 0, 1], &[1, 0, 1]);
        assert_eq!(l, vec![4.0, 4.0, 1.0]);
    }

    #[test]
    fn presence_and_frequency_penalties_count_the_output_only() {
        let p = params(|c| {
            c.presence_penalty = 0.5;
            c.frequency_penalty = 0.25
        });
        let mut l = vec![4.0, 4.0, 4.0, 4.0];
        // token 0 only in the prompt: untouched; token 1 once, token 2 three times
        let mut ch = Choices::default();
        ch.push(&p, &[0, 3], &[1, 2, 2, 2], 4);
        let mut out = vec![];
        ch.sample_on_host(&mut l, 4, &mut out);
        assert_eq!(l, vec![4.0, 3.25, 2.75, 4.0]);
        assert_eq!(out, vec![0]);
        assert!(ch.counts.iter().all(|&n| n == 0), "scratch left clean");
    }

    #[test]
    fn top_k_one_is_greedy_and_top_k_two_never_leaves_the_two() {
        let p = params(|c| {
            c.temperature = 1.0;
            c.top_k = 1
        });
        assert_eq!(counts(&p, &LOGITS, 50)[1], 50);
        let p = params(|c| {
            c.temperature = 1.0;
            c.top_k = 2
        });
        let n = counts(&p, &LOGITS, 2000);
        assert_eq!(n[0] + n[3], 0);
        // p(1) / p(2) = e: expect about 1462 vs 538
        assert!(n[1] > 1300 && n[2] > 400, "{n:?}");
    }

    #[test]
    fn top_p_keeps_the_smallest_sufficient_set() {
        // probabilities of LOGITS: [.087, .644, .237, .032]; top 1 covers .644
        let p = params(|c| {
            c.temperature = 1.0;
            c.top_p = 0.6
        });
        assert_eq!(counts(&p, &LOGITS, 200)[1], 200);
        let p = params(|c| {
            c.temperature = 1.0;
            c.top_p = 0.85
        });
        let n = counts(&p, &LOGITS, 500);
        assert!(n[0] + n[3] == 0 && n[2] > 0, "{n:?}");
    }

    #[test]
    fn min_p_drops_the_unlikely() {
        // relative to the best: [.135, 1, .368, .050]; min_p .3 keeps tokens 1 and 2
        let p = params(|c| {
            c.temperature = 1.0;
            c.min_p = 0.3
        });
        let n = counts(&p, &LOGITS, 500);
        assert!(n[0] + n[3] == 0 && n[1] > 0 && n[2] > 0, "{n:?}");
    }

    #[test]
    fn seed_makes_runs_repeatable_and_temperature_flattens() {
        let run = |seed| {
            let p = params(|c| {
                c.temperature = 1.0;
                c.seed = seed
            });
            let generated = [0u32; 40];
            (0..40)
                .map(|i| draw(&p, &mut LOGITS.to_vec(), &[], &generated[..i]))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let hot = params(|c| c.temperature = 100.0);
        let n = counts(&hot, &LOGITS, 2000);
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
