//! `attention_split_mma_bf16`: flash-decoding's first half on tensor cores, for the query
//! heads of a KV head together.

use cudarc::driver::LaunchConfig;

use super::{In, Out, aligned16, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::gpu::tiles::{
    ATTN_SPLIT_MMA_KEYS, ATTN_SPLIT_MMA_MAX_GROUP, attn_split_mma_shared_bytes,
};
use crate::traffic;

/// Whether `attention_split_mma_bf16` takes this model's heads and splits of `split_len`:
/// heads 64 or 128 wide, at most 8 query heads per KV head (the rows of its `mma` that are
/// not padding), splits a whole number of its key tiles.
pub fn attention_split_mma_supports(
    head_dim: usize,
    n_heads: usize,
    n_kv_heads: usize,
    split_len: usize,
) -> bool {
    (head_dim == 64 || head_dim == 128)
        && n_kv_heads > 0
        && n_heads.is_multiple_of(n_kv_heads)
        && n_heads / n_kv_heads <= ATTN_SPLIT_MMA_MAX_GROUP
        && split_len > 0
        && split_len.is_multiple_of(ATTN_SPLIT_MMA_KEYS)
}

impl Gpu {
    /// `attention_split_bf16` on tensor cores: the same arguments and partial results, for
    /// the shapes `attention_split_mma_supports` accepts. See the kernel's header.
    ///
    /// # Safety
    /// As `attention_split_bf16`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attention_split_mma_bf16(
        &self,
        partial_o: &mut Out<f32>,
        partial_ml: &mut Out<f32>,
        q: &In<f32>,
        k_cache: &In<u16>,
        v_cache: &In<u16>,
        block_tables: &In<u32>,
        token_seq: &In<u32>,
        positions: &In<u32>,
        max_blocks: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        split_len: usize,
    ) -> Result<()> {
        let name = "attention_split_mma_bf16";
        let n = positions.len();
        assert!(
            attention_split_mma_supports(head_dim, n_heads, n_kv_heads, split_len),
            "{name}: heads of {head_dim}, {n_heads} over {n_kv_heads}, splits of {split_len}"
        );
        let n_splits = partial_ml.len() / (2 * n * n_heads);
        assert!(
            aligned16(k_cache, &self.stream) && aligned16(v_cache, &self.stream),
            "{name} copies the cache 16 bytes at a time"
        );
        assert!(
            n_splits > 0
                && partial_ml.len() == 2 * n * n_heads * n_splits
                && partial_o.len() == n * n_heads * n_splits * head_dim
        );
        assert!(q.len() == n * n_heads * head_dim && token_seq.len() == n);
        assert!(
            k_cache.len() == v_cache.len()
                && max_blocks > 0
                && block_tables.len().is_multiple_of(max_blocks)
        );
        let cfg = LaunchConfig {
            grid_dim: (
                u32_of(n_kv_heads, "n_kv_heads"),
                u32_of(n_splits, "n_splits"),
                u32_of(n, "n"),
            ),
            block_dim: (32, 1, 1),
            shared_mem_bytes: attn_split_mma_shared_bytes(head_dim) as u32,
        };
        let (mb, nh, nkv, hd, sl) = (
            max_blocks as u32,
            n_heads as u32,
            n_kv_heads as u32,
            head_dim as u32,
            u32_of(split_len, "split_len"),
        );
        let traffic = move |positions: &[u32]| {
            let attended = traffic::attended(positions);
            traffic::attention_split_bf16(attended, n, n_heads, n_kv_heads, head_dim, n_splits)
        };
        let mut b = self.launcher(&self.kernels.attention_split_mma_bf16);
        b.arg(partial_o)
            .arg(partial_ml)
            .arg(q)
            .arg(k_cache)
            .arg(v_cache)
            .arg(block_tables)
            .arg(token_seq)
            .arg(positions);
        b.arg(&mb).arg(&nh).arg(&nkv).arg(&hd).arg(&sl);
        // SAFETY: shapes checked; the caller sizes n_splits * split_len past every position
        // (the runner computes it from the batch), and the block tables cover each context;
        // 32 threads and the shared memory the kernel documents (under the default 48 KiB).
        self.timed_batch(name, traffic, || unsafe { b.launch(cfg) })
    }
}
