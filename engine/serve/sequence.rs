//! One request as the engine tracks it: its tokens (prompt, then generated), its KV blocks,
//! how to sample it and when to stop.

use super::guess_budget::GuessBudget;
use crate::constrain::Constraint;
use crate::kv::block_manager::BlockTable;
use crate::sampler::SamplingParams;

pub type RequestId = u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence or stop token was sampled (it is not part of the output), or the
    /// request's grammar is complete.
    Stop,
    /// `max_tokens` were generated.
    Length,
    /// The caller aborted the request.
    Abort,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Queued: not admitted yet, or preempted (its blocks given back) and waiting to be
    /// admitted again.
    Waiting,
    /// Admitted: holds blocks, part of each step until it finishes.
    Running,
    Finished(FinishReason),
}

/// When a request ends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopConditions {
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    /// The model's end-of-sequence ids (empty: ignore them).
    pub eos: Vec<u32>,
    /// More ids that end the request, as an end-of-sequence would.
    pub stop_token_ids: Vec<u32>,
}

pub struct Sequence {
    pub id: RequestId,
    /// The prompt, then the generated tokens, then (while speculating) `drafts` guessed
    /// tokens that the next step checks.
    tokens: Vec<u32>,
    prompt_len: usize,
    drafts: usize,
    /// How many tokens to guess next (speculative decoding), from how guesses fared.
    pub guesses: GuessBudget,
    /// Its blocks; `table.len` tokens have been computed (their KV is in the cache).
    pub table: BlockTable,
    /// How its tokens are chosen; the seed with the draw index (tokens generated so far)
    /// makes each draw.
    pub sampling: SamplingParams,
    pub stop: StopConditions,
    pub status: Status,
    /// Report the chosen token's log-probability and this many of the most likely tokens'
    /// with each token (`None`: no log-probabilities; the greedy path may skip the logits).
    pub logprobs: Option<usize>,
    /// A sibling of an earlier request with the same prompt (`n` choices): it is not
    /// admitted while that request is still computing the prompt, and then takes the
    /// prompt's full blocks from the prefix cache instead of computing them again.
    pub wait_for: Option<RequestId>,
    /// The grammar its output must match, where it has one: where it stands after the
    /// generated tokens.
    pub constraint: Option<Constraint>,
}

impl Sequence {
    pub fn new(
        id: RequestId,
        prompt: Vec<u32>,
        params: SamplingParams,
        stop: StopConditions,
    ) -> Sequence {
        assert!(!prompt.is_empty(), "a sequence needs a prompt");
        Sequence {
            id,
            prompt_len: prompt.len(),
            tokens: prompt,
            drafts: 0,
            guesses: GuessBudget::default(),
            table: BlockTable::default(),
            sampling: params,
            stop,
            status: Status::Waiting,
            logprobs: None,
            wait_for: None,
            constraint: None,
        }
    }

    /// The prompt, then the generated tokens, then the guessed ones (if any).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn prompt(&self) -> &[u32] {
        &self.tokens[..self.prompt_len]
    }

    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..self.tokens.len() - self.drafts]
    }

    /// The generated tokens and the first `j` guessed ones: what a guessed row's choice
    /// follows (its penalties and its draw's index).
    pub fn generated_and_drafts(&self, j: usize) -> &[u32] {
        assert!(j <= self.drafts);
        &self.tokens[self.prompt_len..self.tokens.len() - self.drafts + j]
    }

    /// Guessed tokens at the end of `tokens()`, not checked yet.
    pub fn drafts(&self) -> usize {
        self.drafts
    }

    /// Appends tokens guessed to follow the generated ones; the next step computes them with
    /// the last generated token and checks them.
    pub fn add_drafts(&mut self, drafts: &[u32]) {
        assert!(
            self.drafts == 0 && self.pending() == 1,
            "drafts follow a decoding sequence"
        );
        self.tokens.extend_from_slice(drafts);
        self.drafts = drafts.len();
    }

    /// Drops the last `n` guessed tokens (a step too small for them all, a preemption).
    pub fn drop_drafts(&mut self, n: usize) {
        let n = n.min(self.drafts);
        self.tokens.truncate(self.tokens.len() - n);
        self.drafts -= n;
    }

    /// Takes the guessed tokens off the end, after the step that computed them: the caller
    /// pushes those the model agreed with, then its own next token.
    pub fn take_drafts(&mut self) -> Vec<u32> {
        let drafts = self.tokens.split_off(self.tokens.len() - self.drafts);
        self.drafts = 0;
        drafts
    }

    /// Its block table and its tokens at once: the block manager caches full blocks by
    /// their tokens.
    pub fn table_and_tokens(&mut self) -> (&mut BlockTable, &[u32]) {
        (&mut self.table, &self.tokens)
    }

    /// Tokens whose KV is in the cache.
    pub fn computed(&self) -> usize {
        self.table.len
    }

    /// Tokens still to run through the model before the next one can be sampled: the rest
    /// of the prompt while prefilling (all tokens after a preemption), then 1 (the last
    /// token generated) at each decode step.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.table.len
    }

    /// Takes the token chosen for this sequence. Returns whether it is part of the output
    /// (a stop token is not) and, when the request has ended, why.
    pub fn push(&mut self, token: u32) -> (bool, Option<FinishReason>) {
        debug_assert_eq!(self.drafts, 0, "guessed tokens are taken before a push");
        let ends = self.stop.eos.contains(&token) || self.stop.stop_token_ids.contains(&token);
        // Under a grammar, an end token where the grammar cannot end is text it allowed.
        if ends && self.constraint.as_ref().is_none_or(|c| c.may_end()) {
            return (false, Some(FinishReason::Stop));
        }
        self.tokens.push(token);
        if let Some(c) = &mut self.constraint {
            c.accept(token);
            if c.is_finished() {
                return (true, Some(FinishReason::Stop));
            }
        }
        let done = self.generated().len() >= self.stop.max_tokens;
        (true, done.then_some(FinishReason::Length))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_on_eos_stop_ids_and_length() {
        let stop = StopConditions {
            max_tokens: 3,
            eos: vec![2],
            stop_token_ids: vec![9],
        };
        let mut s = Sequence::new(1, vec![5, 6], SamplingParams::default(), stop);
        assert_eq!(s.pending(), 2);
        assert_eq!(s.push(7), (true, None));
        assert_eq!(s.push(2), (false, Some(FinishReason::Stop)));
        assert_eq!(s.push(9), (false, Some(FinishReason::Stop)));
        assert_eq!(s.push(8), (true, None));
        assert_eq!(s.push(8), (true, Some(FinishReason::Length)));
        assert_eq!((s.prompt(), s.generated()), (&[5, 6][..], &[7, 8, 8][..]));
    }
}
