//! Which KV-cache blocks belong to which sequence: a small CPU-only state machine.
//!
//! The pool is cut into fixed blocks of `BLOCK_SIZE` tokens. A sequence owns a block table,
//! the list of its blocks in token order: token `p` lives in block `table[p / BLOCK_SIZE]` at
//! offset `p % BLOCK_SIZE`. Blocks carry a reference count: sequences that start with the
//! same tokens share their full prefix blocks, found through the prefix cache.
//!
//! Every block is in exactly one of three states:
//! - used: held by at least one block table (refcount > 0);
//! - free: never cached (or its content forgotten), on the free list;
//! - cached: owned by no one but its content kept and findable, on the prefix cache's LRU
//!   list; it is evicted (its content forgotten) only when an allocation finds the free
//!   list empty.

use super::prefix_cache::{Link, PrefixCache, PrefixStats};
use crate::error::{Error, Result};

/// Tokens per KV-cache block: the kernels' constant (`gpu-kernels/src/tiles.rs`), the one
/// place it is set.
pub use crate::tiles::BLOCK_SIZE;

pub struct BlockManager {
    /// Never-cached free blocks; the next allocation pops from the end.
    free: Vec<u32>,
    /// `[n_blocks]`: how many block tables hold each block.
    refcount: Vec<u32>,
    pub prefix: PrefixCache,
}

/// A block table's entry for a block given back because no layer will attend to its
/// positions again (`BlockManager::drop_before`): no kernel reads it.
pub const DROPPED: u32 = u32::MAX;

/// One sequence's blocks, in token order, and how many of its tokens are in the cache.
#[derive(Clone, Debug, Default)]
pub struct BlockTable {
    /// The first `dropped` are `DROPPED`.
    pub blocks: Vec<u32>,
    /// Leading blocks given back because they fell out of every layer's sliding window.
    pub dropped: usize,
    /// Tokens whose keys and values are in the cache (the next one goes at this position).
    pub len: usize,
    /// The prefix-cache identity of the first `chain.len()` blocks (all full): the parent of
    /// the next block to be cached.
    pub chain: Vec<Link>,
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

/// A sequence's longest cached prefix, found but not yet taken (`BlockManager::lookup`).
#[derive(Debug, Default)]
pub struct PrefixHit {
    pub blocks: Vec<u32>,
    pub chain: Vec<Link>,
    /// How many of `blocks` are owned by no one: taking them uses up that much free room.
    pub parked: usize,
}

impl PrefixHit {
    pub fn tokens(&self) -> usize {
        self.blocks.len() * BLOCK_SIZE
    }
}

impl BlockManager {
    pub fn new(n_blocks: usize, prefix_cache: bool) -> BlockManager {
        BlockManager {
            // Reversed so that block 0 is handed out first: easier to read in a debugger.
            free: (0..n_blocks as u32).rev().collect(),
            refcount: vec![0; n_blocks],
            prefix: PrefixCache::new(n_blocks, prefix_cache),
        }
    }

    pub fn n_blocks(&self) -> usize {
        self.refcount.len()
    }

    /// Blocks an allocation can take: free ones, then cached ones owned by no one.
    pub fn n_free(&self) -> usize {
        self.free.len() + self.prefix.n_evictable()
    }

    /// Blocks owned by no one whose content is kept for the prefix cache (part of `n_free`).
    pub fn n_cached(&self) -> usize {
        self.prefix.n_evictable()
    }

    /// Blocks held by at least one sequence.
    pub fn n_used(&self) -> usize {
        self.n_blocks() - self.n_free()
    }

    pub fn refcount(&self, block: u32) -> u32 {
        self.refcount[block as usize]
    }

    pub fn prefix_stats(&self) -> PrefixStats {
        self.prefix.stats
    }

    /// More blocks `table` needs to hold `new_len` tokens.
    pub fn blocks_needed(&self, table: &BlockTable, new_len: usize) -> usize {
        blocks_for(new_len).saturating_sub(table.blocks.len())
    }

    /// Grows `table` so it can hold `new_len` tokens. All or nothing: if the pool cannot
    /// supply every block, nothing is taken and the error says how many were wanted.
    pub fn reserve(&mut self, table: &mut BlockTable, new_len: usize) -> Result<()> {
        let wanted = self.blocks_needed(table, new_len);
        if wanted > self.n_free() {
            return Err(Error::KvCacheFull {
                wanted,
                free: self.n_free(),
                total: self.n_blocks(),
                block_size: BLOCK_SIZE,
            });
        }
        for _ in 0..wanted {
            // Never-cached blocks first: a cached one may still be someone's prefix.
            let b = match self.free.pop() {
                Some(b) => b,
                None => self.prefix.evict().expect("counted above"),
            };
            self.refcount[b as usize] = 1;
            table.blocks.push(b);
        }
        Ok(())
    }

    /// The longest run of full blocks at the start of `tokens` that the cache holds. Pass a
    /// sequence's tokens without its last one: that token must be computed for its logits.
    pub fn lookup(&self, tokens: &[u32]) -> PrefixHit {
        let mut hit = PrefixHit::default();
        for block_tokens in tokens.chunks_exact(BLOCK_SIZE) {
            let Some((b, link)) = self.prefix.find(hit.chain.last().copied(), block_tokens) else {
                break;
            };
            hit.parked += usize::from(self.refcount[b as usize] == 0);
            hit.blocks.push(b);
            hit.chain.push(link);
        }
        hit
    }

    /// Maps a prefix found by `lookup` into an empty `table`: each block gains a holder, and
    /// the table starts with those tokens already computed. `query_tokens` (the tokens the
    /// sequence had to compute) feeds the hit rate.
    pub fn take_prefix(&mut self, table: &mut BlockTable, hit: PrefixHit, query_tokens: usize) {
        assert!(table.blocks.is_empty(), "a prefix goes into an empty table");
        for &b in &hit.blocks {
            if self.refcount[b as usize] == 0 {
                self.prefix.unpark(b);
            }
            self.refcount[b as usize] += 1;
        }
        let stats = &mut self.prefix.stats;
        stats.lookups += 1;
        stats.query_tokens += query_tokens as u64;
        stats.hit_tokens += hit.tokens() as u64;
        table.len = hit.tokens();
        table.blocks = hit.blocks;
        table.chain = hit.chain;
    }

    /// Caches `table`'s blocks that have become full: `tokens` are the sequence's tokens,
    /// of which the first `table.len` are computed.
    pub fn cache_full_blocks(&mut self, table: &mut BlockTable, tokens: &[u32]) {
        if !self.prefix.enabled() {
            return;
        }
        let full = table.len / BLOCK_SIZE;
        while table.chain.len() < full && table.chain.len() >= table.dropped {
            let i = table.chain.len();
            let parent = table.chain.last().copied();
            let block_tokens = &tokens[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
            match self.prefix.insert(table.blocks[i], parent, block_tokens) {
                Some(link) => table.chain.push(link),
                None => break, // a hash collision: this block and the rest stay uncached
            }
        }
    }

    /// Ends a sequence (or preempts it): each of its blocks loses one holder. A block with
    /// no holder left goes back to the free list, or, if cached, to the end of the LRU list.
    /// Blocks go last first, so a prefix's tail is evicted before its head (a tail is useless
    /// without its head; the head may serve other sequences).
    pub fn release(&mut self, table: &mut BlockTable) {
        let dropped = table.dropped;
        for b in table.blocks.drain(..).skip(dropped).rev() {
            self.give_back(b);
        }
        table.chain.clear();
        table.len = 0;
        table.dropped = 0;
    }

    /// Gives back `table`'s blocks that lie wholly before position `first` (the first any
    /// layer will attend to again: every layer's sliding window has passed them), keeping
    /// their places in the table as `DROPPED`. Their content stays findable where the
    /// prefix cache holds it. Returns how many were given back.
    pub fn drop_before(&mut self, table: &mut BlockTable, first: usize) -> usize {
        let end = (first / BLOCK_SIZE).min(table.blocks.len());
        let mut n = 0;
        for i in table.dropped..end {
            let b = std::mem::replace(&mut table.blocks[i], DROPPED);
            self.give_back(b);
            n += 1;
        }
        table.dropped = table.dropped.max(end);
        n
    }

    /// One holder less for block `b`: with none left it goes back to the free list, or, if
    /// cached, to the end of the LRU list.
    fn give_back(&mut self, b: u32) {
        let rc = &mut self.refcount[b as usize];
        assert!(*rc > 0, "block {b} released twice");
        *rc -= 1;
        if *rc == 0 {
            if self.prefix.is_cached(b) {
                self.prefix.park(b);
            } else {
                self.free.push(b);
            }
        }
    }

    /// Checks every invariant against the block tables that exist (for tests and debugging):
    /// each block's refcount is the number of tables holding it; a block with none is
    /// either free (uncached) or parked (cached), never both; held blocks are in neither.
    pub fn audit<'a>(
        &self,
        tables: impl IntoIterator<Item = &'a BlockTable>,
    ) -> Result<(), String> {
        let n = self.n_blocks();
        let mut holders = vec![0u32; n];
        for t in tables {
            if t.len > t.blocks.len() * BLOCK_SIZE {
                return Err(format!(
                    "a table holds {} tokens in {} blocks",
                    t.len,
                    t.blocks.len()
                ));
            }
            if t.chain.len() > t.len / BLOCK_SIZE {
                return Err("a table's chain is longer than its full blocks".into());
            }
            if t.dropped > t.blocks.len()
                || t.blocks
                    .iter()
                    .enumerate()
                    .any(|(i, &b)| (b == DROPPED) != (i < t.dropped))
            {
                return Err(format!(
                    "a table's {} dropped blocks are not its first",
                    t.dropped
                ));
            }
            for &b in &t.blocks[t.dropped..] {
                holders[b as usize] += 1;
            }
        }
        let mut on_free = vec![false; n];
        for &b in &self.free {
            if std::mem::replace(&mut on_free[b as usize], true) {
                return Err(format!("block {b} is on the free list twice"));
            }
        }
        for b in 0..n as u32 {
            let (rc, i) = (self.refcount[b as usize], b as usize);
            if rc != holders[i] {
                return Err(format!("block {b}: refcount {rc}, held by {}", holders[i]));
            }
            let (free, parked) = (on_free[i], self.prefix.is_parked(b));
            let ok = match rc {
                0 => free != parked && parked == self.prefix.is_cached(b),
                _ => !free && !parked,
            };
            if !ok {
                return Err(format!(
                    "block {b}: refcount {rc}, free {free}, parked {parked}, cached {}",
                    self.prefix.is_cached(b)
                ));
            }
        }
        self.prefix.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block table holding `tokens`, as if they had all been computed.
    fn computed(m: &mut BlockManager, tokens: &[u32]) -> BlockTable {
        let mut t = BlockTable::default();
        let hit = m.lookup(&tokens[..tokens.len() - 1]);
        m.take_prefix(&mut t, hit, tokens.len());
        m.reserve(&mut t, tokens.len()).unwrap();
        t.len = tokens.len();
        m.cache_full_blocks(&mut t, tokens);
        t
    }

    fn toks(range: std::ops::Range<u32>) -> Vec<u32> {
        range.collect()
    }

    #[test]
    fn grows_one_block_per_boundary() {
        let mut m = BlockManager::new(4, true);
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

    /// Blocks wholly before a window's first position go back (cached ones parked, still
    /// findable), keep their places as `DROPPED`, and are not given back twice.
    #[test]
    fn blocks_out_of_the_window_go_back_once() {
        let mut m = BlockManager::new(6, true);
        let tokens = toks(0..70);
        let mut t = BlockTable::default();
        m.reserve(&mut t, 70).unwrap(); // 5 blocks
        t.len = 70;
        m.cache_full_blocks(&mut t, &tokens); // 4 full ones cached
        assert_eq!(
            m.drop_before(&mut t, 40),
            2,
            "positions 0..32 are two whole blocks"
        );
        assert_eq!((t.dropped, &t.blocks[..2]), (2, &[DROPPED, DROPPED][..]));
        assert_eq!((m.n_free(), m.n_cached()), (3, 2));
        assert_eq!(m.drop_before(&mut t, 40), 0);
        m.audit([&t]).unwrap();
        // The dropped blocks' content still serves a new sequence's prefix.
        assert_eq!(m.lookup(&tokens[..69]).blocks.len(), 4);
        m.release(&mut t);
        assert_eq!((m.n_free(), t.dropped), (6, 0));
        m.audit([&t]).unwrap();
    }

    #[test]
    fn slots_follow_the_block_table() {
        let t = BlockTable {
            blocks: vec![7, 2],
            dropped: 0,
            len: 20,
            chain: vec![],
        };
        assert_eq!(t.slot(3), 7 * 16 + 3);
        assert_eq!(t.slot(16), 2 * 16);
    }

    #[test]
    fn exhaustion_is_an_error_and_takes_nothing() {
        let mut m = BlockManager::new(2, true);
        let mut t = BlockTable::default();
        let e = m.reserve(&mut t, 33).unwrap_err();
        assert!(e.to_string().contains("3 more blocks"), "{e}");
        assert_eq!(m.n_free(), 2);
        assert!(t.blocks.is_empty());
    }

    #[test]
    fn release_returns_blocks_for_reuse() {
        let mut m = BlockManager::new(3, false);
        let mut a = BlockTable::default();
        m.reserve(&mut a, 40).unwrap();
        assert_eq!(m.n_free(), 0);
        m.release(&mut a);
        assert_eq!(m.n_free(), 3);
        assert!(a.blocks.is_empty() && a.len == 0);
        let mut b = BlockTable::default();
        m.reserve(&mut b, 48).unwrap();
        assert_eq!(b.blocks.len(), 3);
        m.audit([&b]).unwrap();
    }

    #[test]
    fn three_sequences_share_a_two_block_prefix() {
        let mut m = BlockManager::new(8, true);
        // 40 tokens: two full blocks and a partial one; b and c share the 32-token prefix.
        let a = computed(&mut m, &toks(0..40));
        let b = computed(&mut m, &[toks(0..32), toks(500..510)].concat());
        let c = computed(&mut m, &[toks(0..32), toks(600..605)].concat());
        assert_eq!(b.blocks[..2], a.blocks[..2]);
        assert_eq!(c.blocks[..2], a.blocks[..2]);
        assert_eq!((m.refcount(a.blocks[0]), m.refcount(a.blocks[1])), (3, 3));
        assert_eq!(m.refcount(a.blocks[2]), 1);
        assert_eq!(m.refcount(b.blocks[2]), 1);
        assert_ne!(b.blocks[2], c.blocks[2]);
        assert_eq!(m.n_used(), 5);
        let s = m.prefix_stats();
        assert_eq!(
            (s.lookups, s.hit_tokens, s.query_tokens),
            (3, 64, 40 + 42 + 37)
        );
        m.audit([&a, &b, &c]).unwrap();
    }

    #[test]
    fn a_hit_maps_blocks_and_never_the_whole_prompt() {
        let mut m = BlockManager::new(8, true);
        let mut a = computed(&mut m, &toks(0..32));
        m.release(&mut a);
        assert_eq!(m.n_cached(), 2);
        // The same 32 tokens again: the last must be computed for its logits, so only the
        // first block is taken from the cache.
        let hit = m.lookup(&toks(0..31));
        assert_eq!(hit.blocks.len(), 1);
        assert_eq!(hit.parked, 1);
        let mut t = BlockTable::default();
        m.take_prefix(&mut t, hit, 32);
        assert_eq!((t.len, m.refcount(t.blocks[0]), m.n_cached()), (16, 1, 1));
        // 33 tokens: both blocks hit.
        assert_eq!(m.lookup(&toks(0..32)).blocks.len(), 2);
        m.audit([&t]).unwrap();
    }

    #[test]
    fn cached_blocks_are_evicted_only_when_needed_least_recent_first() {
        let mut m = BlockManager::new(6, true);
        let mut a = computed(&mut m, &toks(0..33)); // blocks 0, 1 full; 2 partial
        let mut b = computed(&mut m, &toks(100..132)); // blocks 3, 4
        m.release(&mut a); // 2 freed, then 1 and 0 parked (tail first)
        m.release(&mut b); // 4 then 3 parked
        assert_eq!((m.n_free(), m.n_cached()), (6, 4));
        assert_eq!(m.prefix.lru_order(), vec![1, 0, 4, 3]);
        // Two blocks: the never-cached ones come first, nothing is evicted.
        let mut c = BlockTable::default();
        m.reserve(&mut c, 32).unwrap();
        assert_eq!(m.n_cached(), 4);
        assert_eq!(m.lookup(&toks(0..32)).blocks.len(), 2);
        // Two more: a's prefix goes, tail first; b's stays findable.
        m.reserve(&mut c, 33).unwrap();
        assert_eq!(
            m.lookup(&toks(0..32)).blocks.len(),
            1,
            "block 1 evicted first"
        );
        m.reserve(&mut c, 49).unwrap();
        assert_eq!(m.lookup(&toks(0..32)).blocks.len(), 0);
        assert_eq!(m.lookup(&toks(100..132)).blocks.len(), 2);
        m.audit([&c]).unwrap();
    }

    #[test]
    fn a_hit_on_a_parked_block_protects_it_from_eviction() {
        let mut m = BlockManager::new(2, true);
        let mut a = computed(&mut m, &toks(0..16));
        m.release(&mut a);
        let b = computed(&mut m, &toks(0..20)); // maps block 0 back, takes block 1
        assert_eq!(b.blocks, vec![0, 1]);
        let mut c = BlockTable::default();
        assert!(
            m.reserve(&mut c, 1).is_err(),
            "block 0 is held, not evictable"
        );
        m.audit([&b]).unwrap();
    }

    #[test]
    fn colliding_hashes_give_misses_not_wrong_blocks() {
        let mut m = BlockManager::new(8, true);
        m.prefix.set_hash(|_, _| 7);
        let mut a = computed(&mut m, &toks(0..40));
        let b = computed(&mut m, &toks(200..240));
        assert_eq!(
            m.lookup(&toks(200..240)).blocks.len(),
            0,
            "b's blocks were never cached"
        );
        assert!(b.chain.is_empty());
        // a's first block was cached; its second collides with it (same hash) and was not.
        assert_eq!(a.chain.len(), 1);
        m.release(&mut a);
        assert_eq!(m.lookup(&toks(0..40)).blocks.len(), 1);
        m.audit([&b]).unwrap();
    }

    #[test]
    fn without_the_cache_released_blocks_are_plain_free() {
        let mut m = BlockManager::new(4, false);
        let mut a = computed(&mut m, &toks(0..40));
        m.release(&mut a);
        assert_eq!((m.n_free(), m.n_cached()), (4, 0));
        assert_eq!(m.lookup(&toks(0..40)).blocks.len(), 0);
        m.audit([]).unwrap();
    }
}
