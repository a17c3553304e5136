//! Automatic prefix caching: full KV blocks found again by their content.
//!
//! A full block (all `BLOCK_SIZE` of its tokens computed) is named by a hash chained over its
//! parent block's hash and its own token ids, as vLLM does: two sequences that start with the
//! same tokens get the same chain of hashes, so a new sequence finds its longest cached prefix
//! one block at a time and maps those blocks into its table instead of computing them again.
//!
//! Why a flat map of chained hashes and not SGLang's radix tree: only full blocks are ever
//! shared (a partial block is still being written, and sharing it would need copy-on-write),
//! so the tree's ability to match at any token is not needed; a map is O(1) per block, and
//! needs no tree upkeep (splitting nodes, keeping parents alive for their children).
//!
//! A hash is not an identity: two different prefixes could collide. So each entry keeps its
//! block's token ids and the entry id of the parent block it was computed after, and a hit
//! needs both to match. By induction along the chain, a hit's whole prefix is then the same
//! tokens, and a collision can only cost a miss, never wrong output.
//!
//! Blocks whose last owner has gone keep their content and stay findable, on an LRU list;
//! the block manager evicts from its head (least recently released) only when it needs room.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::tiles::BLOCK_SIZE;

/// A full block's place in a prefix chain: the chained hash (the map's key) and the id of the
/// cache entry holding that content (which names the whole prefix up to this block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    pub hash: u64,
    pub entry: u64,
}

/// The hash of a block given its parent's (`ROOT_HASH` for a sequence's first block).
pub type HashFn = fn(parent: u64, tokens: &[u32]) -> u64;

const ROOT_HASH: u64 = 0;
/// Entry ids start at 1: 0 is "no parent".
const ROOT_ENTRY: u64 = 0;
const NIL: u32 = u32::MAX;

/// vLLM's chained block hash: the parent's hash, then the block's token ids.
pub fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    // SipHash with fixed keys: the same value in every run, which keeps tests repeatable.
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// What a cached block holds.
struct Entry {
    /// Unique over the cache's life: a block that is evicted and cached again gets a new id,
    /// so children computed after its old content can never match the new one.
    id: u64,
    hash: u64,
    /// The parent block's entry id (`ROOT_ENTRY` for a first block).
    parent: u64,
    tokens: [u32; BLOCK_SIZE],
}

/// Counters behind the hit rate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Sequences that looked up their prefix (each admission, re-admissions after a
    /// preemption included).
    pub lookups: u64,
    /// Tokens those sequences had to compute before the lookup.
    pub query_tokens: u64,
    /// Of those, tokens found in the cache.
    pub hit_tokens: u64,
}

impl PrefixStats {
    /// Share of looked-up tokens found in the cache, 0 when nothing was looked up.
    pub fn hit_rate(&self) -> f64 {
        if self.query_tokens == 0 {
            return 0.0;
        }
        self.hit_tokens as f64 / self.query_tokens as f64
    }
}

pub struct PrefixCache {
    enabled: bool,
    hash: HashFn,
    /// Chained hash -> the block holding that content.
    map: HashMap<u64, u32>,
    /// `[n_blocks]`: what each cached block holds (`None`: not cached).
    entries: Vec<Option<Entry>>,
    next_id: u64,
    lru: Lru,
    pub stats: PrefixStats,
}

impl PrefixCache {
    pub fn new(n_blocks: usize, enabled: bool) -> PrefixCache {
        PrefixCache {
            enabled,
            hash: chain_hash,
            map: HashMap::new(),
            entries: (0..n_blocks).map(|_| None).collect(),
            next_id: ROOT_ENTRY + 1,
            lru: Lru::new(n_blocks),
            stats: PrefixStats::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Replaces the hash function: tests force collisions with it.
    pub fn set_hash(&mut self, hash: HashFn) {
        self.hash = hash;
    }

    pub fn is_cached(&self, block: u32) -> bool {
        self.entries[block as usize].is_some()
    }

    /// The block holding `tokens` (one full block) after the prefix `parent` names, if cached.
    pub fn find(&self, parent: Option<Link>, tokens: &[u32]) -> Option<(u32, Link)> {
        if !self.enabled {
            return None;
        }
        let (parent_hash, parent_entry) =
            parent.map_or((ROOT_HASH, ROOT_ENTRY), |l| (l.hash, l.entry));
        let hash = (self.hash)(parent_hash, tokens);
        let &block = self.map.get(&hash)?;
        let e = self.entries[block as usize].as_ref()?;
        (e.parent == parent_entry && e.tokens[..] == *tokens)
            .then_some((block, Link { hash, entry: e.id }))
    }

    /// Records that `block` now holds `tokens` (full, computed) after the prefix `parent`
    /// names. Returns the link to carry on the chain: the block's own new entry, or the entry
    /// of another block that already holds the same prefix (the block then stays uncached).
    /// `None` when the hash is taken by a different prefix (a collision): the chain stops.
    pub fn insert(&mut self, block: u32, parent: Option<Link>, tokens: &[u32]) -> Option<Link> {
        if !self.enabled {
            return None;
        }
        debug_assert!(!self.is_cached(block), "block {block} cached twice");
        let (parent_hash, parent_entry) =
            parent.map_or((ROOT_HASH, ROOT_ENTRY), |l| (l.hash, l.entry));
        let hash = (self.hash)(parent_hash, tokens);
        if let Some(&other) = self.map.get(&hash) {
            let e = self.entries[other as usize]
                .as_ref()
                .expect("mapped blocks are cached");
            let same = e.parent == parent_entry && e.tokens[..] == *tokens;
            return same.then_some(Link { hash, entry: e.id });
        }
        let id = self.next_id;
        self.next_id += 1;
        self.map.insert(hash, block);
        self.entries[block as usize] = Some(Entry {
            id,
            hash,
            parent: parent_entry,
            tokens: tokens.try_into().expect("a full block"),
        });
        Some(Link { hash, entry: id })
    }

    /// Blocks cached but owned by no one: they can be evicted.
    pub fn n_evictable(&self) -> usize {
        self.lru.len
    }

    /// A cached block lost its last owner: it becomes the most recently used evictable one.
    pub fn park(&mut self, block: u32) {
        debug_assert!(self.is_cached(block));
        self.lru.push_back(block);
    }

    /// A parked block is owned again (a prefix hit): it leaves the LRU list.
    pub fn unpark(&mut self, block: u32) {
        self.lru.remove(block);
    }

    pub fn is_parked(&self, block: u32) -> bool {
        self.lru.contains(block)
    }

    /// Takes the least recently used evictable block, forgetting its content.
    pub fn evict(&mut self) -> Option<u32> {
        let block = self.lru.pop_front()?;
        let e = self.entries[block as usize]
            .take()
            .expect("parked blocks are cached");
        if self.map.get(&e.hash) == Some(&block) {
            self.map.remove(&e.hash);
        }
        Some(block)
    }

    /// The parked blocks, least recently used first (for audits and tests).
    pub fn lru_order(&self) -> Vec<u32> {
        let mut out = vec![];
        let mut b = self.lru.head;
        while b != NIL {
            out.push(b);
            b = self.lru.next[b as usize];
        }
        out
    }

    /// Checks the map and the entries agree (for audits): every key names a cached block
    /// whose entry has that hash.
    pub fn check(&self) -> Result<(), String> {
        for (&hash, &b) in &self.map {
            match &self.entries[b as usize] {
                Some(e) if e.hash == hash => {}
                _ => {
                    return Err(format!(
                        "hash {hash:#x} maps to block {b}, which does not hold it"
                    ));
                }
            }
        }
        let cached = self.entries.iter().filter(|e| e.is_some()).count();
        if cached != self.map.len() {
            return Err(format!(
                "{cached} cached blocks but {} keys",
                self.map.len()
            ));
        }
        Ok(())
    }
}

/// A doubly linked list threaded through block ids: O(1) push, pop and removal from the
/// middle (a hit on a parked block).
struct Lru {
    /// `[n_blocks]` neighbours; `NIL` at the ends. `prev[b] == b` marks "not in the list".
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    len: usize,
}

impl Lru {
    fn new(n: usize) -> Lru {
        Lru {
            prev: (0..n as u32).collect(),
            next: vec![NIL; n],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    fn contains(&self, b: u32) -> bool {
        self.prev[b as usize] != b
    }

    fn push_back(&mut self, b: u32) {
        debug_assert!(!self.contains(b), "block {b} parked twice");
        self.prev[b as usize] = self.tail;
        self.next[b as usize] = NIL;
        match self.tail {
            NIL => self.head = b,
            t => self.next[t as usize] = b,
        }
        self.tail = b;
        self.len += 1;
    }

    fn remove(&mut self, b: u32) {
        debug_assert!(self.contains(b), "block {b} is not parked");
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        match p {
            NIL => self.head = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NIL => self.tail = p,
            n => self.prev[n as usize] = p,
        }
        self.prev[b as usize] = b;
        self.next[b as usize] = NIL;
        self.len -= 1;
    }

    fn pop_front(&mut self) -> Option<u32> {
        let b = self.head;
        if b == NIL {
            return None;
        }
        self.remove(b);
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(first: u32) -> Vec<u32> {
        (first..first + BLOCK_SIZE as u32).collect()
    }

    #[test]
    fn a_chain_is_found_block_by_block() {
        let mut c = PrefixCache::new(8, true);
        let l0 = c.insert(3, None, &block(0)).unwrap();
        let l1 = c.insert(5, Some(l0), &block(16)).unwrap();
        assert_eq!(c.find(None, &block(0)), Some((3, l0)));
        assert_eq!(c.find(Some(l0), &block(16)), Some((5, l1)));
        // The same tokens after another prefix are another block.
        assert_eq!(c.find(None, &block(16)), None);
    }

    #[test]
    fn a_second_copy_of_a_prefix_links_to_the_first() {
        let mut c = PrefixCache::new(8, true);
        let l0 = c.insert(3, None, &block(0)).unwrap();
        assert_eq!(c.insert(4, None, &block(0)), Some(l0));
        assert!(!c.is_cached(4), "the copy stays uncached");
    }

    #[test]
    fn colliding_hashes_never_match_other_content() {
        let mut c = PrefixCache::new(8, true);
        c.set_hash(|_, _| 42);
        let l0 = c.insert(0, None, &block(0)).unwrap();
        // Another first block with the same hash: not found, and not cached over the first.
        assert_eq!(c.find(None, &block(100)), None);
        assert_eq!(c.insert(1, None, &block(100)), None);
        // The same tokens after a different parent: the parent's entry id tells them apart,
        // even though every hash is equal.
        assert_eq!(
            c.find(
                Some(Link {
                    hash: 42,
                    entry: 99
                }),
                &block(0)
            ),
            None
        );
        assert_eq!(c.find(None, &block(0)), Some((0, l0)));
        c.check().unwrap();
    }

    #[test]
    fn lru_evicts_the_least_recently_parked_and_forgets_it() {
        let mut c = PrefixCache::new(4, true);
        for b in 0..3 {
            c.insert(b, None, &block(100 * b)).unwrap();
            c.park(b);
        }
        c.unpark(0); // a hit
        c.park(0);
        assert_eq!(c.lru_order(), vec![1, 2, 0]);
        assert_eq!(c.evict(), Some(1));
        assert_eq!(c.find(None, &block(100)), None);
        assert_eq!(c.n_evictable(), 2);
        c.check().unwrap();
    }

    #[test]
    fn an_evicted_parent_orphans_its_children() {
        let mut c = PrefixCache::new(4, true);
        let l0 = c.insert(0, None, &block(0)).unwrap();
        c.insert(1, Some(l0), &block(16)).unwrap();
        c.park(0);
        assert_eq!(c.evict(), Some(0));
        // The same first block cached again (in block 2) is a new entry: block 1, computed
        // after the old one, is not reachable from it.
        let again = c.insert(2, None, &block(0)).unwrap();
        assert_ne!(again.entry, l0.entry);
        assert_eq!(c.find(Some(again), &block(16)), None);
    }

    #[test]
    fn disabled_finds_and_keeps_nothing() {
        let mut c = PrefixCache::new(4, false);
        assert_eq!(c.insert(0, None, &block(0)), None);
        assert_eq!(c.find(None, &block(0)), None);
        assert!(!c.is_cached(0));
    }
}
