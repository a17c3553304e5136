//! Which sequences run in the next step, and which of their tokens: a small CPU-only state
//! machine that owns the sequences and the block manager.
//!
//! Each step (Sarathi-Serve's stall-free batching), under a budget of tokens and of
//! sequences:
//! 1. every running sequence that is decoding gets its next token, oldest first;
//! 2. running sequences part-way through their prompt get the next chunk of it;
//! 3. waiting sequences are admitted, first come first served, each with a first chunk,
//!    while the budget lasts and the pool has room for that chunk (past its cached prefix).
//!    A sibling (another choice of the same prompt) waits at the head of the queue until
//!    the first of its group has computed the prompt, then finds its blocks in the cache.
//!
//! A long prompt is thus cut into chunks and never holds up the decodes. When a running
//! sequence needs a block and none is free, the newest running sequence not yet in this step
//! is preempted by recomputation: it gives its blocks back (its full ones stay in the prefix
//! cache, so coming back is often cheap) and returns to the front of the waiting queue.

use std::collections::VecDeque;

use super::sequence::{FinishReason, RequestId, Sequence, Status};
use crate::kv::block_manager::{BLOCK_SIZE, BlockManager, blocks_for};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most tokens in one step (decode tokens and prompt chunks together).
    pub token_budget: usize,
    /// Most sequences in one step.
    pub max_seqs: usize,
    /// Guessed tokens (speculative decoding) fill a step only up to this many tokens in all:
    /// past it a row costs compute, not just the weights' read that every row shares.
    pub guess_rows: usize,
    /// Every layer's sliding window, where all have one: blocks that fall wholly out of it
    /// are given back as a sequence advances.
    pub window: Option<usize>,
}

/// One sequence's part of a step: its tokens `start..start + len` (`start` is what it has
/// computed so far).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Index into `Scheduler::running()`, valid until the next call that changes it.
    pub seq: usize,
    pub start: usize,
    pub len: usize,
    /// Whether the chunk reaches the end of the sequence's tokens: its logits give the next
    /// token. A prompt chunk that stops short needs none.
    pub logits: bool,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct ScheduledStep {
    pub chunks: Vec<Chunk>,
}

impl ScheduledStep {
    pub fn n_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.len).sum()
    }
}

pub struct Scheduler {
    pub config: SchedulerConfig,
    pub blocks: BlockManager,
    waiting: VecDeque<Sequence>,
    /// Admitted sequences, oldest first.
    running: Vec<Sequence>,
    preemptions: u64,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, blocks: BlockManager) -> Scheduler {
        assert!(config.token_budget > 0 && config.max_seqs > 0);
        Scheduler {
            config,
            blocks,
            waiting: VecDeque::new(),
            running: vec![],
            preemptions: 0,
        }
    }

    /// Queues a new sequence behind those already waiting.
    pub fn add(&mut self, seq: Sequence) {
        debug_assert!(seq.table.blocks.is_empty());
        self.waiting.push_back(seq);
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    pub fn running(&self) -> &[Sequence] {
        &self.running
    }

    pub fn running_mut(&mut self) -> &mut [Sequence] {
        &mut self.running
    }

    pub fn waiting(&self) -> impl Iterator<Item = &Sequence> {
        self.waiting.iter()
    }

    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Chooses the next step's chunks and reserves their blocks.
    pub fn schedule(&mut self) -> ScheduledStep {
        let mut budget = self.config.token_budget;
        // (sequence id, start, len) in the order chosen; resolved to indices at the end, as
        // preemptions move sequences out of `running`.
        let mut chosen: Vec<(RequestId, usize, usize)> = vec![];
        let mut in_step = vec![false; self.running.len()];

        // 1. Decodes, oldest first. 2. Prompt chunks of running sequences, oldest first.
        for decoding in [true, false] {
            let mut i = 0;
            while i < self.running.len() {
                if budget == 0 || chosen.len() == self.config.max_seqs {
                    break;
                }
                let seq = &self.running[i];
                // A decoding sequence computes its last token and any guessed after it.
                let pending = seq.pending();
                if in_step[i] || (pending - seq.drafts() == 1) != decoding {
                    i += 1;
                    continue;
                }
                // A decode is its one token here; its guesses, if any, take what budget is
                // left at the end (4.).
                let mut len = if decoding { 1 } else { pending.min(budget) };
                let need = self.blocks.blocks_needed(&seq.table, seq.computed() + len);
                if !self.make_room(need, i, &mut in_step) {
                    if decoding {
                        // No one newer to take blocks from: this one waits instead.
                        self.preempt(i, &mut in_step);
                        continue;
                    }
                    // A prompt chunk shrinks to the room there is, or waits for the next step.
                    let seq = &self.running[i];
                    let room = (seq.table.blocks.len() + self.blocks.n_free()) * BLOCK_SIZE;
                    len = room - seq.computed();
                    if len == 0 {
                        i += 1;
                        continue;
                    }
                }
                let seq = &mut self.running[i];
                let new_len = seq.computed() + len;
                self.blocks
                    .reserve(&mut seq.table, new_len)
                    .expect("room was made");
                chosen.push((seq.id, seq.computed(), len));
                in_step[i] = true;
                budget -= len;
                i += 1;
            }
        }

        // 3. Admission, first come first served: the queue's head waits for room rather than
        // let a later, smaller request pass it.
        while budget > 0 && chosen.len() < self.config.max_seqs {
            let Some(seq) = self.waiting.front() else {
                break;
            };
            if seq
                .wait_for
                .is_some_and(|leader| self.computing_prompt(leader))
            {
                // Its prompt's blocks will be in the prefix cache in a step or two.
                break;
            }
            let tokens = seq.tokens();
            // The last token is always computed: its logits choose the next one.
            let hit = self.blocks.lookup(&tokens[..tokens.len() - 1]);
            let len = (tokens.len() - hit.tokens()).min(budget);
            let need = blocks_for(hit.tokens() + len) - hit.blocks.len();
            if need + hit.parked > self.blocks.n_free() {
                break;
            }
            let mut seq = self.waiting.pop_front().expect("just looked");
            let query = seq.tokens().len();
            self.blocks.take_prefix(&mut seq.table, hit, query);
            let new_len = seq.computed() + len;
            self.blocks
                .reserve(&mut seq.table, new_len)
                .expect("room was counted");
            seq.status = Status::Running;
            chosen.push((seq.id, seq.computed(), len));
            self.running.push(seq);
            budget -= len;
        }

        // 4. Guessed tokens (speculative decoding), where any sequence has some.
        if self.running.iter().any(|s| s.drafts() > 0) {
            self.fit_guesses(&mut chosen, budget);
        }

        let chunks = chosen
            .into_iter()
            .map(|(id, start, len)| {
                let seq = self
                    .running
                    .iter()
                    .position(|s| s.id == id)
                    .expect("scheduled sequences are running");
                Chunk {
                    seq,
                    start,
                    len,
                    logits: start + len == self.running[seq].tokens().len(),
                }
            })
            .collect();
        ScheduledStep { chunks }
    }

    /// Whether running sequence `id` has not finished computing its prompt yet.
    fn computing_prompt(&self, id: RequestId) -> bool {
        self.running
            .iter()
            .any(|s| s.id == id && s.computed() < s.prompt().len())
    }

    /// Frees blocks until `need` are available, by preempting running sequences newer than
    /// `i` that are not in this step, newest first. Returns whether there is room.
    fn make_room(&mut self, need: usize, i: usize, in_step: &mut Vec<bool>) -> bool {
        while self.blocks.n_free() < need {
            let Some(victim) = (i + 1..self.running.len()).rev().find(|&j| !in_step[j]) else {
                return false;
            };
            self.preempt(victim, in_step);
        }
        true
    }

    /// Step 4 of `schedule`: guessed tokens (speculative decoding) extend their decodes in
    /// `chosen` (id, start, len) with the `budget` left and the free blocks no one else
    /// needed, up to `guess_rows` tokens in the step, shared evenly among the sequences that
    /// guessed; those that do not fit are dropped.
    fn fit_guesses(&mut self, chosen: &mut [(RequestId, usize, usize)], budget: usize) {
        let mut rows_left = (self.config.guess_rows)
            .saturating_sub(self.config.token_budget - budget)
            .min(budget);
        let mut guessing = chosen
            .iter()
            .filter(|(id, _, _)| self.running.iter().any(|s| s.id == *id && s.drafts() > 0))
            .count();
        for (id, start, len) in chosen.iter_mut() {
            let Some(seq) = self.running.iter_mut().find(|s| s.id == *id) else {
                continue;
            };
            if seq.drafts() == 0 {
                continue;
            }
            let share = rows_left.div_ceil(guessing);
            guessing -= 1;
            let mut extra = seq.drafts().min(share);
            let need = self.blocks.blocks_needed(&seq.table, *start + *len + extra);
            if need > self.blocks.n_free() {
                extra = 0;
            }
            seq.drop_drafts(seq.drafts() - extra);
            if extra > 0 {
                self.blocks
                    .reserve(&mut seq.table, *start + *len + extra)
                    .expect("room was counted");
                *len += extra;
                rows_left -= extra;
            }
        }
    }

    /// Sends running sequence `i` back to the front of the queue, its blocks released: it
    /// will compute its tokens again (those still cached come back from the prefix cache).
    fn preempt(&mut self, i: usize, in_step: &mut Vec<bool>) {
        let mut seq = self.running.remove(i);
        in_step.remove(i);
        seq.drop_drafts(seq.drafts());
        self.blocks.release(&mut seq.table);
        seq.status = Status::Waiting;
        self.waiting.push_front(seq);
        self.preemptions += 1;
    }

    /// After the step's forward pass: each chunk's tokens are computed; blocks they filled
    /// join the prefix cache. A speculating sequence's guesses must have been taken off
    /// (`Sequence::take_drafts`) first: only its real tokens count, and only theirs are
    /// cached (the caller counts the guesses the model agreed with once it has pushed them).
    pub fn advance(&mut self, step: &ScheduledStep) {
        for c in &step.chunks {
            let seq = &mut self.running[c.seq];
            debug_assert_eq!(seq.computed(), c.start);
            debug_assert_eq!(seq.drafts(), 0, "guesses taken before advance");
            seq.table.len = (c.start + c.len).min(seq.tokens().len());
            let (table, tokens) = seq.table_and_tokens();
            self.blocks.cache_full_blocks(table, tokens);
            // The next token, at position `len`, attends from `len + 1 - window` on, and
            // every later one from further on.
            if let Some(window) = self.config.window {
                let first = (seq.table.len + 1).saturating_sub(window);
                self.blocks.drop_before(&mut seq.table, first);
            }
        }
    }

    /// Releases the blocks of every finished running sequence and drops it.
    pub fn retire_finished(&mut self) {
        let blocks = &mut self.blocks;
        self.running.retain_mut(|seq| {
            let done = matches!(seq.status, Status::Finished(_));
            if done {
                blocks.release(&mut seq.table);
            }
            !done
        });
    }

    /// Ends a request at once, wherever it is, releasing its blocks. Returns whether it was
    /// found (it may have finished already).
    pub fn abort(&mut self, id: RequestId) -> bool {
        let mut seq = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            self.running.remove(i)
        } else if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(i).expect("just found")
        } else {
            return false;
        };
        self.blocks.release(&mut seq.table);
        seq.status = Status::Finished(FinishReason::Abort);
        true
    }

    /// Checks the block manager against every sequence's table (tests, debugging).
    pub fn audit(&self) -> Result<(), String> {
        if let Some(s) = self.waiting.iter().find(|s| !s.table.blocks.is_empty()) {
            return Err(format!("waiting sequence {} holds blocks", s.id));
        }
        self.blocks.audit(self.running.iter().map(|s| &s.table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::SamplingParams;
    use crate::serve::sequence::StopConditions;

    fn seq(id: RequestId, prompt_len: u32, max_tokens: usize) -> Sequence {
        let prompt = (0..prompt_len)
            .map(|i| (i * 7 + id as u32 * 13) % 100)
            .collect();
        let stop = StopConditions {
            max_tokens,
            ..Default::default()
        };
        Sequence::new(id, prompt, SamplingParams::default(), stop)
    }

    fn scheduler(token_budget: usize, max_seqs: usize, n_blocks: usize) -> Scheduler {
        let config = SchedulerConfig {
            token_budget,
            max_seqs,
            guess_rows: 32,
            window: None,
        };
        Scheduler::new(config, BlockManager::new(n_blocks, true))
    }

    /// What the engine does after the forward pass, with `token` as every sampled token.
    fn finish_step(s: &mut Scheduler, step: &ScheduledStep, token: u32) {
        s.advance(step);
        for c in step.chunks.iter().filter(|c| c.logits) {
            let seq = &mut s.running_mut()[c.seq];
            if let (_, Some(reason)) = seq.push(token) {
                seq.status = Status::Finished(reason);
            }
        }
        s.retire_finished();
        s.audit().unwrap();
    }

    /// Each chunk as (sequence id, start, len, logits).
    fn chunks(s: &Scheduler, step: &ScheduledStep) -> Vec<(RequestId, usize, usize, bool)> {
        step.chunks
            .iter()
            .map(|c| (s.running()[c.seq].id, c.start, c.len, c.logits))
            .collect()
    }

    #[test]
    fn decodes_go_first_then_prompt_chunks_fill_the_budget() {
        let mut s = scheduler(10, 8, 64);
        s.add(seq(0, 3, 100));
        s.add(seq(1, 4, 100));
        let step = s.schedule();
        assert_eq!(chunks(&s, &step), [(0, 0, 3, true), (1, 0, 4, true)]);
        finish_step(&mut s, &step, 5);
        s.add(seq(2, 20, 100));
        let step = s.schedule();
        // Two decodes, then the new prompt's first 8 tokens: no logits, it has more to go.
        assert_eq!(
            chunks(&s, &step),
            [(0, 3, 1, true), (1, 4, 1, true), (2, 0, 8, false)]
        );
        finish_step(&mut s, &step, 5);
        let step = s.schedule();
        assert_eq!(
            chunks(&s, &step),
            [(0, 4, 1, true), (1, 5, 1, true), (2, 8, 8, false)]
        );
        finish_step(&mut s, &step, 5);
        let step = s.schedule();
        assert_eq!(
            chunks(&s, &step),
            [(0, 5, 1, true), (1, 6, 1, true), (2, 16, 4, true)]
        );
        assert!(step.n_tokens() <= 10);
    }

    /// Guesses fill the rows the decodes left under `guess_rows`, shared evenly; the rest
    /// are dropped, and a step already at the cap takes none.
    #[test]
    fn guesses_share_the_rows_under_the_cap() {
        let mut s = scheduler(64, 8, 64);
        s.config.guess_rows = 9;
        for id in 0..3 {
            s.add(seq(id, 4, 100));
        }
        let step = s.schedule();
        finish_step(&mut s, &step, 7);
        for seq in s.running_mut() {
            seq.add_drafts(&[1, 2, 3, 4, 5]);
        }
        // 3 decodes and 6 guessed rows: 2 each.
        let step = s.schedule();
        assert_eq!(
            chunks(&s, &step),
            vec![(0, 4, 3, true), (1, 4, 3, true), (2, 4, 3, true)]
        );
        assert!(s.running().iter().all(|q| q.drafts() == 2));
        for seq in s.running_mut() {
            seq.take_drafts();
        }
        finish_step(&mut s, &step, 7);
        s.config.guess_rows = 3;
        for seq in s.running_mut() {
            seq.add_drafts(&[1, 2]);
        }
        let step = s.schedule();
        assert!(step.chunks.iter().all(|c| c.len == 1));
        assert!(s.running().iter().all(|q| q.drafts() == 0));
    }

    #[test]
    fn the_sequence_cap_and_the_budget_hold() {
        let mut s = scheduler(6, 2, 64);
        for id in 0..3 {
            s.add(seq(id, 2, 100));
        }
        let step = s.schedule();
        assert_eq!(chunks(&s, &step), [(0, 0, 2, true), (1, 0, 2, true)]);
        finish_step(&mut s, &step, 5);
        // Two decodes fill the cap: the third still waits.
        let step = s.schedule();
        assert_eq!(step.chunks.len(), 2);
        assert_eq!(s.waiting().count(), 1);
        // A budget smaller than the running decodes: the oldest go first.
        let mut s = scheduler(2, 8, 64);
        for id in 0..3 {
            s.add(seq(id, 1, 100));
        }
        let step = s.schedule();
        assert_eq!(chunks(&s, &step), [(0, 0, 1, true), (1, 0, 1, true)]);
        finish_step(&mut s, &step, 5);
        let step = s.schedule();
        assert_eq!(chunks(&s, &step), [(0, 1, 1, true), (1, 1, 1, true)]);
    }

    #[test]
    fn admission_waits_for_room_first_come_first_served() {
        let mut s = scheduler(64, 8, 4);
        s.add(seq(0, 40, 1)); // 3 blocks, ends after its first token
        s.add(seq(1, 20, 4)); // 2 blocks: only 1 left
        s.add(seq(2, 5, 4)); // 1 block would fit, but must not pass sequence 1
        let step = s.schedule();
        assert_eq!(chunks(&s, &step), [(0, 0, 40, true)]);
        assert_eq!(s.waiting().count(), 2);
        finish_step(&mut s, &step, 5);
        assert!(
            s.running().is_empty(),
            "sequence 0 ended and gave its blocks back"
        );
        let step = s.schedule();
        assert_eq!(chunks(&s, &step), [(1, 0, 20, true), (2, 0, 5, true)]);
    }

    #[test]
    fn preemption_takes_the_newest_and_requeues_it_first() {
        let mut s = scheduler(64, 8, 4);
        for id in 0..4 {
            s.add(seq(id, 16, 100));
        }
        let step = s.schedule();
        assert_eq!(step.chunks.len(), 4, "a block each: the pool is full");
        finish_step(&mut s, &step, 5);
        // Each decode needs a second block. Sequence 0 takes the newest's (3's) first block,
        // 1 takes 2's; 2 and 3 wait, 2 ahead of 3.
        let step = s.schedule();
        assert_eq!(chunks(&s, &step), [(0, 16, 1, true), (1, 16, 1, true)]);
        assert_eq!(s.preemptions(), 2);
        let waiting: Vec<_> = s
            .waiting()
            .map(|q| (q.id, q.status, q.computed()))
            .collect();
        assert_eq!(waiting, [(2, Status::Waiting, 0), (3, Status::Waiting, 0)]);
        finish_step(&mut s, &step, 5);
        s.audit().unwrap();
    }

    #[test]
    fn a_decode_with_no_one_newer_to_preempt_waits_itself() {
        let mut s = scheduler(64, 8, 3);
        s.add(seq(0, 20, 100)); // 2 blocks, room for 12 more tokens
        s.add(seq(1, 16, 100)); // 1 block, full
        let step = s.schedule();
        finish_step(&mut s, &step, 5);
        // 0 decodes in its own blocks; 1 needs a block, and there is no one newer.
        let step = s.schedule();
        assert_eq!(chunks(&s, &step), [(0, 20, 1, true)]);
        assert_eq!(s.waiting().map(|q| q.id).collect::<Vec<_>>(), [1]);
        assert_eq!(s.preemptions(), 1);
    }

    #[test]
    fn abort_releases_blocks_at_once() {
        let mut s = scheduler(64, 8, 8);
        s.add(seq(0, 40, 100));
        s.add(seq(1, 40, 100));
        let step = s.schedule();
        finish_step(&mut s, &step, 5);
        assert!(s.abort(0));
        assert!(!s.abort(0), "already gone");
        assert!(s.abort(1));
        assert!(!s.has_work());
        assert_eq!((s.blocks.n_used(), s.blocks.n_free()), (0, 8));
        s.audit().unwrap();
    }
}
