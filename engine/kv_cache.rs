//! The KV cache's storage: one preallocated pool of blocks per layer, for keys and values.
//!
//! Layout, the one the GPU kernels read too:
//!   k, v: `[n_layers, n_blocks, BLOCK_SIZE, n_kv_heads, head_dim]`, f32
//! so a token's keys for all heads are contiguous (one `kv_dim` row), a block is
//! `BLOCK_SIZE` such rows, and a "slot" (block * BLOCK_SIZE + offset) indexes rows within
//! a layer. Which blocks a sequence owns is the block manager's business.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::kv::block_manager::BLOCK_SIZE;

pub struct KvCache {
    /// `[n_layers, n_blocks, BLOCK_SIZE, n_kv_heads, head_dim]`
    pub k: Vec<f32>,
    /// `[n_layers, n_blocks, BLOCK_SIZE, n_kv_heads, head_dim]`
    pub v: Vec<f32>,
    pub n_blocks: usize,
    /// Floats per layer: `n_blocks * BLOCK_SIZE * kv_dim`.
    layer_len: usize,
}

impl KvCache {
    /// A pool of `n_blocks` blocks, or an error if the host cannot hold it.
    pub fn new(config: &Config, n_blocks: usize) -> Result<KvCache> {
        let too_big = || {
            let bytes = (n_blocks as f64) * (KvCache::bytes_per_token(config) * BLOCK_SIZE) as f64;
            Error::Usage(format!(
                "cannot allocate a KV cache of {n_blocks} blocks ({:.1} GiB) in host memory; lower --kv-blocks",
                bytes / (1u64 << 30) as f64
            ))
        };
        let layer_len = n_blocks
            .checked_mul(BLOCK_SIZE * config.kv_dim())
            .ok_or_else(too_big)?;
        let n = config.n_layers.checked_mul(layer_len).ok_or_else(too_big)?;
        // The pool's pages are mapped lazily, so the allocator may grant far more than the
        // machine holds; a pool past physical memory could never fill, and would fail late,
        // under load. Refuse it now.
        let bytes = (2 * n) as u64 * std::mem::size_of::<f32>() as u64;
        if host_memory_bytes().is_some_and(|total| bytes > total) {
            return Err(too_big());
        }
        Ok(KvCache {
            k: zeroed(n).ok_or_else(too_big)?,
            v: zeroed(n).ok_or_else(too_big)?,
            n_blocks,
            layer_len,
        })
    }

    /// Bytes per token across all layers, keys and values.
    pub fn bytes_per_token(config: &Config) -> usize {
        2 * config.n_layers * config.kv_dim() * std::mem::size_of::<f32>()
    }

    /// Layer `l`'s keys and values: each `[n_blocks * BLOCK_SIZE, kv_dim]`.
    pub fn layer(&self, l: usize) -> (&[f32], &[f32]) {
        let r = l * self.layer_len..(l + 1) * self.layer_len;
        (&self.k[r.clone()], &self.v[r])
    }

    pub fn layer_mut(&mut self, l: usize) -> (&mut [f32], &mut [f32]) {
        let r = l * self.layer_len..(l + 1) * self.layer_len;
        (&mut self.k[r.clone()], &mut self.v[r])
    }
}

/// The machine's physical memory (`MemTotal` in `/proc/meminfo`), or `None` where that
/// cannot be read (not Linux).
fn host_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `n` zeros, or `None` when the allocator refuses. The memory comes from `alloc_zeroed`,
/// which for a large pool maps fresh pages that the OS zeroes when first touched: the pool
/// costs only what the sequences write, not its whole size up front (`Vec::resize` would
/// write every page).
fn zeroed(n: usize) -> Option<Vec<f32>> {
    let layout = std::alloc::Layout::array::<f32>(n).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<f32>();
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `n` f32 (so the
    // capacity is `n`), and all-zero bytes are `n` initialised 0.0 values.
    Some(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_is_zeros_and_a_pool_too_large_is_an_error() {
        let z = zeroed(1000).unwrap();
        assert!(z.len() == 1000 && z.capacity() == 1000 && z.iter().all(|&v| v == 0.0));
        assert_eq!(zeroed(0).unwrap().len(), 0);
        // Past what any address space holds: refused, not an abort.
        assert!(zeroed(usize::MAX / 2).is_none());
    }
}
