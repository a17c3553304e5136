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
        let layer_len = n_blocks * BLOCK_SIZE * config.kv_dim();
        let n = config.n_layers * layer_len;
        let alloc = || -> Result<Vec<f32>> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| {
                Error::Usage(format!(
                    "cannot allocate a KV cache of {n_blocks} blocks ({:.1} GiB) in host memory; lower --kv-blocks",
                    (2 * n * size_of::<f32>()) as f64 / (1u64 << 30) as f64
                ))
            })?;
            // Zeroed pages come from the OS lazily: a large pool costs only what is used.
            v.resize(n, 0.0);
            Ok(v)
        };
        Ok(KvCache {
            k: alloc()?,
            v: alloc()?,
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
