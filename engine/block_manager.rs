//! Which KV-cache blocks belong to which sequence: a small CPU-only state machine.
//!
//! The pool is cut into fixed blocks of `BLOCK_SIZE` tokens. A sequence owns a block table,
//! the list of its blocks in token order: token `p` lives in block `table[p / BLOCK_SIZE]` at
//! offset `p % BLOCK_SIZE`. A block is taken from the free list when a sequence crosses a
//! block boundary and returned when the sequence ends. Blocks carry a reference count so that
//! sequences can later share a common prefix (PagedAttention, SGLang's radix cache).

use crate::error::{Error, Result};

/// Tokens per KV-cache block.
pub const BLOCK_SIZE: usize = 16;

pub struct BlockManager {
    /// Free block ids; the next allocation pops from the end.
    free: Vec<u32>,
    /// `[n_blocks]`: how many block tables hold each block (0 = free).
    refcount: Vec<u32>,
}

/// One sequence's blocks, in token order, and how many of its tokens are in the cache.
#[derive(Clone, Debug, Default)]
pub struct BlockTable {
    pub blocks: Vec<u32>,
    pub len: usize,
}

impl BlockTable {
    /// The cache slot (block * BLOCK_SIZE + offset) of token `pos`.
    pub fn slot(&self, pos: usize) -> u32 {
        self.blocks[pos / BLOCK_SIZE] * BLOCK_SIZE as u32 + (pos % BLOCK_SIZE) as u32
    }
}

/// Blocks needed to hold `n_tokens` tokens.
pub fn blocks_for(n_tokens: usize) -> usize {
    n_tokens.div_ceil(BLOCK_SIZE)
}

impl BlockManager {
    pub fn new(n_blocks: usize) -> BlockManager {
        BlockManager {
            // Reversed so that block 0 is handed out first: easier to read in a debugger.
            free: (0..n_blocks as u32).rev().collect(),
            refcount: vec![0; n_blocks],
        }
    }

    pub fn n_blocks(&self) -> usize {
        self.refcount.len()
    }

    pub fn n_free(&self) -> usize {
        self.free.len()
    }

    pub fn refcount(&self, block: u32) -> u32 {
        self.refcount[block as usize]
    }

    /// Grows `table` so it can hold `new_len` tokens. All or nothing: if the pool cannot
    /// supply every block, nothing is taken and the error says how many were wanted.
    pub fn reserve(&mut self, table: &mut BlockTable, new_len: usize) -> Result<()> {
        let wanted = blocks_for(new_len).saturating_sub(table.blocks.len());
        if wanted > self.free.len() {
            return Err(Error::KvCacheFull {
                wanted,
                free: self.free.len(),
                total: self.n_blocks(),
                block_size: BLOCK_SIZE,
            });
        }
        for _ in 0..wanted {
            let b = self.free.pop().expect("checked above");
            self.refcount[b as usize] = 1;
            table.blocks.push(b);
        }
        Ok(())
    }

    /// A new table that shares `src`'s first `n_blocks` blocks (a common prefix).
    pub fn share_prefix(&mut self, src: &BlockTable, n_blocks: usize) -> BlockTable {
        let blocks = src.blocks[..n_blocks].to_vec();
        for &b in &blocks {
            self.refcount[b as usize] += 1;
        }
        BlockTable {
            blocks,
            len: (n_blocks * BLOCK_SIZE).min(src.len),
        }
    }

    /// Ends a sequence: each of its blocks loses one holder, and returns to the free list
    /// when none is left.
    pub fn release(&mut self, table: &mut BlockTable) {
        for b in table.blocks.drain(..) {
            let rc = &mut self.refcount[b as usize];
            debug_assert!(*rc > 0, "block {b} released twice");
            *rc -= 1;
            if *rc == 0 {
                self.free.push(b);
            }
        }
        table.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_one_block_per_boundary() {
        let mut m = BlockManager::new(4);
        let mut t = BlockTable::default();
        m.reserve(&mut t, 1).unwrap();
        assert_eq!(t.blocks, vec![0]);
        m.reserve(&mut t, 16).unwrap();
        assert_eq!(t.blocks.len(), 1, "16 tokens still fit one block");
        m.reserve(&mut t, 17).unwrap();
        assert_eq!(t.blocks, vec![0, 1]);
        assert_eq!(m.n_free(), 2);
        assert_eq!(t.slot(0), 0);
        assert_eq!(t.slot(17), 16 + 1);
    }

    #[test]
    fn slots_follow_the_block_table() {
        let t = BlockTable {
            blocks: vec![7, 2],
            len: 20,
        };
        assert_eq!(t.slot(3), 7 * 16 + 3);
        assert_eq!(t.slot(16), 2 * 16);
    }

    #[test]
    fn exhaustion_is_an_error_and_takes_nothing() {
        let mut m = BlockManager::new(2);
        let mut t = BlockTable::default();
        let e = m.reserve(&mut t, 33).unwrap_err();
        assert!(e.to_string().contains("3 more blocks"), "{e}");
        assert_eq!(m.n_free(), 2);
        assert!(t.blocks.is_empty());
    }

    #[test]
    fn release_returns_blocks_for_reuse() {
        let mut m = BlockManager::new(3);
        let mut a = BlockTable::default();
        m.reserve(&mut a, 40).unwrap();
        assert_eq!(m.n_free(), 0);
        m.release(&mut a);
        assert_eq!(m.n_free(), 3);
        assert!(a.blocks.is_empty() && a.len == 0);
        let mut b = BlockTable::default();
        m.reserve(&mut b, 48).unwrap();
        assert_eq!(b.blocks.len(), 3);
    }

    #[test]
    fn three_sequences_share_a_two_block_prefix() {
        let mut m = BlockManager::new(8);
        let mut a = BlockTable::default();
        m.reserve(&mut a, 40).unwrap();
        a.len = 40;
        let mut b = m.share_prefix(&a, 2);
        let mut c = m.share_prefix(&a, 2);
        assert_eq!((m.refcount(a.blocks[0]), m.refcount(a.blocks[1])), (3, 3));
        assert_eq!(m.refcount(a.blocks[2]), 1);
        assert_eq!(b.len, 32);
        m.release(&mut a);
        assert_eq!(
            m.n_free(),
            8 - 2,
            "the shared prefix stays while b and c hold it"
        );
        m.release(&mut b);
        m.release(&mut c);
        assert_eq!(m.n_free(), 8);
    }
}
