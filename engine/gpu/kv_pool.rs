//! The paged KV cache on the device: every layer's keys and values in bf16, in the CPU
//! cache's layout (which holds f32), plus one spare block that a graph's padding rows write
//! and read.

use cudarc::driver::CudaSlice;

use super::context::Gpu;
use super::kernels::{In, Out};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::kv::block_manager::blocks_for;
use crate::tiles::BLOCK_SIZE;

/// Share of the free device memory the KV pool may take by default.
const KV_SHARE_OF_FREE: f64 = 0.9;

/// Bytes of KV cache one token holds on the GPU: every layer's key and value rows, bf16.
pub fn kv_bytes_per_token(c: &Config) -> usize {
    2 * c.n_layers * c.kv_dim() * size_of::<u16>()
}

pub struct KvPool {
    /// `[n_layers, n_blocks + 1, BLOCK_SIZE, n_kv_heads, head_dim]` bf16
    pub k_cache: CudaSlice<u16>,
    pub v_cache: CudaSlice<u16>,
    /// Blocks the runner may hand out; block `n_blocks` is the spare.
    pub n_blocks: usize,
    n_layers: usize,
}

impl KvPool {
    /// A pool of `kv_blocks` blocks, or by default of most of the free memory (up to what
    /// `max_seqs` full contexts need).
    pub fn new(gpu: &Gpu, c: &Config, kv_blocks: Option<usize>, max_seqs: usize) -> Result<KvPool> {
        let block_bytes = kv_bytes_per_token(c) * BLOCK_SIZE;
        let n_blocks = match kv_blocks {
            Some(n) => n,
            None => {
                let (free, _) = gpu.memory();
                let affordable = (free as f64 * KV_SHARE_OF_FREE) as usize / block_bytes;
                affordable.min(blocks_for(c.max_seq_len) * max_seqs)
            }
        };
        if n_blocks == 0 {
            let (free, total) = gpu.memory();
            return Err(Error::GpuOutOfMemory {
                what: "one KV-cache block".into(),
                bytes: block_bytes,
                free,
                total,
            });
        }
        // One block more than the runner is told of: the padding rows'.
        let pool = (n_blocks + 1) * BLOCK_SIZE * c.kv_dim() * c.n_layers;
        Ok(KvPool {
            k_cache: gpu.zeros(pool, "the KV cache (keys)")?,
            v_cache: gpu.zeros(pool, "the KV cache (values)")?,
            n_blocks,
            n_layers: c.n_layers,
        })
    }

    /// The spare block graph padding rows write and read.
    pub fn pad_block(&self) -> usize {
        self.n_blocks
    }

    /// Layer `l`'s part of each pool: `[n_blocks + 1, BLOCK_SIZE, kv_dim]`.
    fn layer_range(&self, l: usize) -> std::ops::Range<usize> {
        let len = self.k_cache.len() / self.n_layers;
        l * len..(l + 1) * len
    }

    /// Layer `l`'s keys and values, to read.
    pub fn layer(&self, l: usize) -> (In<'_, u16>, In<'_, u16>) {
        let r = self.layer_range(l);
        (self.k_cache.slice(r.clone()), self.v_cache.slice(r))
    }

    /// Layer `l`'s keys and values, to write.
    pub fn layer_mut(&mut self, l: usize) -> (Out<'_, u16>, Out<'_, u16>) {
        let r = self.layer_range(l);
        (self.k_cache.slice_mut(r.clone()), self.v_cache.slice_mut(r))
    }
}
