//! A stand-in model for tests of the serving layer: instant, deterministic, and as sensitive
//! to the KV cache as a real one.
//!
//! Its "KV cache" holds one number per slot: a hash of the token at that position and of the
//! number at the position before (read through the sequence's block table). So a token's
//! logits depend on its whole prefix exactly as the cache holds it: a block mapped to the
//! wrong sequence, freed while still read, or overwritten by another sequence changes the
//! tokens that follow, and comparing with a run alone catches it.

use crate::batch::Batch;
use crate::error::Result;
use crate::kv::block_manager::BLOCK_SIZE;
use crate::runner::{Forward, Limits};

pub struct FakeModel {
    limits: Limits,
    /// `[n_blocks * BLOCK_SIZE]` one state per slot.
    kv: Vec<u64>,
    /// `[rows, vocab]`
    logits: Vec<f32>,
    ids: Vec<u32>,
    /// Forward passes run, and the most tokens and sequences one of them held.
    pub passes: usize,
    /// Of those, the ones through `forward_greedy` (no logits returned).
    pub greedy_passes: usize,
    pub max_tokens_seen: usize,
    pub max_seqs_seen: usize,
}

const START: u64 = 0x9e37_79b9_7f4a_7c15;

fn mix(a: u64, b: u64) -> u64 {
    // splitmix64's finaliser over the pair
    let mut z = a ^ b.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl FakeModel {
    pub fn new(
        vocab_size: usize,
        max_context: usize,
        n_blocks: usize,
        max_batch_tokens: usize,
    ) -> FakeModel {
        FakeModel {
            limits: Limits {
                vocab_size,
                model_context: max_context,
                max_context: max_context.min(n_blocks * BLOCK_SIZE),
                n_blocks,
                max_batch_tokens,
                max_batch_seqs: max_batch_tokens,
                window: None,
            },
            // Poisoned: a read of a slot never written gives its own garbage.
            kv: (0..(n_blocks * BLOCK_SIZE) as u64)
                .map(|i| mix(i, 7))
                .collect(),
            logits: vec![],
            ids: vec![],
            passes: 0,
            greedy_passes: 0,
            max_tokens_seen: 0,
            max_seqs_seen: 0,
        }
    }

    /// Says every layer attends over a sliding window of `window` positions (at least 2:
    /// the fake reads only the position before a token's own).
    pub fn with_window(mut self, window: usize) -> FakeModel {
        assert!(window >= 2);
        self.limits.window = Some(window);
        self
    }

    /// Also caps the sequences per pass, as the GPU does.
    pub fn with_max_seqs(mut self, n: usize) -> FakeModel {
        self.limits.max_batch_seqs = n;
        self
    }

    fn run(&mut self, b: &Batch) {
        let n = b.tokens.len();
        let n_seqs = b.block_tables.len() / b.max_blocks.max(1);
        assert!(n <= self.limits.max_batch_tokens, "{n} tokens in one pass");
        assert!(
            n_seqs <= self.limits.max_batch_seqs,
            "{n_seqs} sequences in one pass"
        );
        self.passes += 1;
        self.max_tokens_seen = self.max_tokens_seen.max(n);
        self.max_seqs_seen = self.max_seqs_seen.max(n_seqs);
        for t in 0..n {
            let pos = b.positions[t] as usize;
            let table = &b.block_tables[b.token_seq[t] as usize * b.max_blocks..][..b.max_blocks];
            let slot = |p: usize| table[p / BLOCK_SIZE] as usize * BLOCK_SIZE + p % BLOCK_SIZE;
            assert_eq!(
                b.slots[t] as usize,
                slot(pos),
                "row {t}: slot off its block table"
            );
            assert!(b.tokens[t] < self.limits.vocab_size as u32);
            let before = if pos == 0 {
                START
            } else {
                self.kv[slot(pos - 1)]
            };
            self.kv[slot(pos)] = mix(before, b.tokens[t] as u64 + ((pos as u64) << 32));
        }
        let vocab = self.limits.vocab_size;
        self.logits.clear();
        for &r in &b.logit_rows {
            let state = self.kv[b.slots[r as usize] as usize];
            self.logits
                .extend((0..vocab as u64).map(|v| (mix(state, v) >> 40) as f32 / (1 << 20) as f32));
        }
    }
}

impl Forward for FakeModel {
    fn limits(&self) -> Limits {
        self.limits
    }

    fn forward(&mut self, batch: &Batch) -> Result<&[f32]> {
        self.run(batch);
        Ok(&self.logits)
    }

    fn forward_sample(
        &mut self,
        batch: &Batch,
        choices: &crate::sampler::Choices,
    ) -> Result<&[u32]> {
        self.run(batch);
        let vocab = self.limits.vocab_size;
        choices.sample_on_host(&mut self.logits, vocab, &mut self.ids);
        Ok(&self.ids)
    }

    fn forward_greedy(&mut self, batch: &Batch) -> Result<&[u32]> {
        self.run(batch);
        self.greedy_passes += 1;
        let vocab = self.limits.vocab_size;
        self.ids.clear();
        self.ids.extend(
            self.logits
                .chunks_exact(vocab)
                .map(crate::cpu::ops::argmax_f32),
        );
        Ok(&self.ids)
    }
}
