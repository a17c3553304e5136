//! One forward pass's tokens, from one or more sequences, flattened the way the kernels
//! read them. A prompt chunk (prefill), a single decode token and a mix of sequences are all
//! the same thing here: rows of tokens, each with its position, its sequence and its slot.

use crate::kv::block_manager::{BLOCK_SIZE, BlockTable};

#[derive(Clone, Default)]
pub struct Batch {
    /// `[n]` token ids
    pub tokens: Vec<u32>,
    /// `[n]` each token's position in its sequence
    pub positions: Vec<u32>,
    /// `[n]` each token's sequence: a row of `block_tables`
    pub token_seq: Vec<u32>,
    /// `[n]` where each token's key and value go: `block * BLOCK_SIZE + offset`
    pub slots: Vec<u32>,
    /// `[n_seqs, max_blocks]` each sequence's block table, padded with zeros
    pub block_tables: Vec<u32>,
    pub max_blocks: usize,
    /// Rows whose logits are wanted: the last rows of each chunk that asks for them (one, or
    /// one per guessed token when speculating), or every row
    pub logit_rows: Vec<u32>,
    /// Every chunk is a decode, and some end in guessed tokens (speculative decoding): each
    /// row could be a sequence of its own (`rows_as_sequences`).
    pub guesses: bool,
}

/// One sequence's part of a batch: `tokens` appended after the `table.len` it already holds.
/// The table must already have blocks for them (`BlockManager::reserve`).
pub struct SeqChunk<'a> {
    pub table: &'a BlockTable,
    pub tokens: &'a [u32],
    /// How many of the last tokens' logits are wanted: 1 for the next token; 1 + k when the
    /// chunk ends in k guessed tokens, each to be checked (speculative decoding); 0 for a
    /// prompt chunk that stops short of the prompt's end (its next token is already known).
    pub logits: usize,
}

impl Batch {
    /// Refills the batch in place (no allocation once the vectors have grown). `all_logits`:
    /// every row's logits (for tests and scoring), whatever the chunks ask.
    pub fn fill(&mut self, chunks: &[SeqChunk], all_logits: bool) {
        self.tokens.clear();
        self.positions.clear();
        self.token_seq.clear();
        self.slots.clear();
        self.logit_rows.clear();
        self.block_tables.clear();
        self.guesses = !all_logits
            && chunks.iter().all(|c| c.logits == c.tokens.len())
            && chunks.iter().any(|c| c.tokens.len() > 1);
        self.max_blocks = chunks
            .iter()
            .map(|c| c.table.blocks.len())
            .max()
            .unwrap_or(0);
        for (s, chunk) in chunks.iter().enumerate() {
            let start = chunk.table.len;
            debug_assert!(chunk.table.blocks.len() * BLOCK_SIZE >= start + chunk.tokens.len());
            for (i, &tok) in chunk.tokens.iter().enumerate() {
                let pos = start + i;
                if all_logits || i + chunk.logits >= chunk.tokens.len() {
                    self.logit_rows.push(self.tokens.len() as u32);
                }
                self.tokens.push(tok);
                self.positions.push(pos as u32);
                self.token_seq.push(s as u32);
                self.slots.push(chunk.table.slot(pos));
            }
            self.block_tables.extend(&chunk.table.blocks);
            self.block_tables.extend(std::iter::repeat_n(
                0,
                self.max_blocks - chunk.table.blocks.len(),
            ));
        }
    }
}

impl Batch {
    /// This batch with every row a sequence of its own, into `out`: a row's sequence's block
    /// table repeated for it. Attention reads a row's context up to its own position, and
    /// every row's key and value are written before any row attends, so a decode with its
    /// guessed tokens after it becomes a decode step of several sequences: the GPU's
    /// decode kernels and CUDA graphs take it as they take a batch of decodes.
    pub fn rows_as_sequences(&self, out: &mut Batch) {
        out.clone_from(self);
        out.guesses = false;
        out.token_seq.clear();
        out.token_seq.extend(0..self.tokens.len() as u32);
        out.block_tables.clear();
        for &s in &self.token_seq {
            let row = s as usize * self.max_blocks;
            out.block_tables
                .extend_from_slice(&self.block_tables[row..row + self.max_blocks]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table of `blocks` holding `len` tokens.
    fn table(blocks: &[u32], len: usize) -> BlockTable {
        BlockTable {
            blocks: blocks.to_vec(),
            dropped: 0,
            len,
            chain: vec![],
        }
    }

    #[test]
    fn two_sequences_flatten_into_rows() {
        let a = table(&[3, 5], 15);
        let b = table(&[1], 0);
        let c = table(&[2], 4);
        let mut batch = Batch::default();
        batch.fill(
            &[
                SeqChunk {
                    table: &a,
                    tokens: &[7, 8],
                    logits: 1,
                },
                SeqChunk {
                    table: &b,
                    tokens: &[9],
                    logits: 1,
                },
                // A prompt chunk short of the prompt's end: no logits.
                SeqChunk {
                    table: &c,
                    tokens: &[4, 4],
                    logits: 0,
                },
            ],
            false,
        );
        assert_eq!(batch.tokens, vec![7, 8, 9, 4, 4]);
        assert_eq!(batch.positions, vec![15, 16, 0, 4, 5]);
        assert_eq!(batch.token_seq, vec![0, 0, 1, 2, 2]);
        assert_eq!(
            batch.slots,
            vec![3 * 16 + 15, 5 * 16, 16, 2 * 16 + 4, 2 * 16 + 5]
        );
        assert_eq!(batch.block_tables, vec![3, 5, 1, 0, 2, 0]);
        assert_eq!(batch.max_blocks, 2);
        assert_eq!(batch.logit_rows, vec![1, 2]);
    }

    /// A decode with two guesses after it and a plain decode: every chunk is a decode, so
    /// the rows may be sequences of their own, each with its sequence's blocks.
    #[test]
    fn guessed_rows_become_sequences_of_their_own() {
        let a = table(&[3, 5], 15);
        let b = table(&[1], 4);
        let chunks = [
            SeqChunk {
                table: &a,
                tokens: &[7, 8, 9],
                logits: 3,
            },
            SeqChunk {
                table: &b,
                tokens: &[2],
                logits: 1,
            },
        ];
        let mut batch = Batch::default();
        batch.fill(&chunks, false);
        assert!(batch.guesses);
        let mut rows = Batch::default();
        batch.rows_as_sequences(&mut rows);
        assert_eq!(rows.positions, vec![15, 16, 17, 4]);
        assert_eq!(rows.slots, batch.slots);
        assert_eq!(rows.token_seq, vec![0, 1, 2, 3]);
        assert_eq!(rows.block_tables, vec![3, 5, 3, 5, 3, 5, 1, 0]);
        assert_eq!(rows.logit_rows, vec![0, 1, 2, 3]);
        assert!(!rows.guesses);
        // Plain decodes, a prompt chunk, or every row's logits asked for scoring: no.
        batch.fill(&chunks[1..], false);
        assert!(!batch.guesses);
        let prompt = [SeqChunk {
            table: &a,
            tokens: &[7, 8, 9],
            logits: 1,
        }];
        batch.fill(&prompt, false);
        assert!(!batch.guesses);
        batch.fill(&chunks, true);
        assert!(!batch.guesses);
    }
}
