//! The fast backend's KV cache: the reference's layout (`kv_cache.rs`) in bf16, half the
//! bytes a token costs there and what attention reads per step.
//!
//!   k, v: `[n_layers, n_blocks, BLOCK_SIZE, n_kv_heads, head_dim]` bf16 bits

use crate::config::Config;
use crate::error::{Error, Result};
use crate::kv::block_manager::BLOCK_SIZE;

pub struct KvCacheBf16 {
    /// `[n_layers, n_blocks * BLOCK_SIZE, kv_dim]`
    pub k: Vec<u16>,
    /// `[n_layers, n_blocks * BLOCK_SIZE, kv_dim]`
    pub v: Vec<u16>,
    pub n_blocks: usize,
    /// Values per layer: `n_blocks * BLOCK_SIZE * kv_dim`.
    layer_len: usize,
}

impl KvCacheBf16 {
    pub fn new(config: &Config, n_blocks: usize) -> Result<KvCacheBf16> {
        let too_big = || {
            Error::Usage(format!(
                "cannot allocate a KV cache of {n_blocks} blocks in host memory; lower --kv-blocks"
            ))
        };
        let layer_len = n_blocks
            .checked_mul(BLOCK_SIZE * config.kv_dim())
            .ok_or_else(too_big)?;
        let n = config.n_layers.checked_mul(layer_len).ok_or_else(too_big)?;
        // Reserved first, so that a pool too large is an error rather than an abort.
        let zeros = || -> Result<Vec<u16>> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| too_big())?;
            v.resize(n, 0);
            Ok(v)
        };
        Ok(KvCacheBf16 {
            k: zeros()?,
            v: zeros()?,
            n_blocks,
            layer_len,
        })
    }

    /// Bytes per token across all layers, keys and values.
    pub fn bytes_per_token(config: &Config) -> usize {
        2 * config.n_layers * config.kv_dim() * std::mem::size_of::<u16>()
    }

    /// Layer `l`'s keys and values: each `[n_blocks * BLOCK_SIZE, kv_dim]`.
    pub fn layer(&self, l: usize) -> (&[u16], &[u16]) {
        let r = l * self.layer_len..(l + 1) * self.layer_len;
        (&self.k[r.clone()], &self.v[r])
    }

    pub fn layer_mut(&mut self, l: usize) -> (&mut [u16], &mut [u16]) {
        let r = l * self.layer_len..(l + 1) * self.layer_len;
        (&mut self.k[r.clone()], &mut self.v[r])
    }
}
