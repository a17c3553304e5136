//! `attention_split_mma_bf16`: flash-decoding's first half on tensor cores, for the query
//! heads of a KV head together; `attention_split_mma_fp8` the same over the fp8 cache.

use super::Out;
use super::attention::{KvScales, PagedIn, SplitKernel, check_scales};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::tiles::{
    ATTN_SPLIT_MMA_KEYS, ATTN_SPLIT_MMA_MAX_GROUP, attn_split_mma_fp8_shared_bytes,
    attn_split_mma_shared_bytes,
};

/// Whether `attention_split_mma_bf16` takes this model's heads and splits of `split_len`:
/// heads 64, 128 or 256 wide, at most 8 query heads per KV head (the rows of its `mma` that are
/// not padding), splits a whole number of its key tiles.
pub fn attention_split_mma_supports(
    head_dim: usize,
    n_heads: usize,
    n_kv_heads: usize,
    split_len: usize,
) -> bool {
    matches!(head_dim, 64 | 128 | 256)
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
    pub unsafe fn attention_split_mma_bf16(
        &self,
        partial_o: &mut Out<f32>,
        partial_ml: &mut Out<f32>,
        p: &PagedIn<u16>,
        split_len: usize,
    ) -> Result<()> {
        let h = p.shape.heads;
        let (n_heads, n_kv_heads, head_dim) = (
            h.n_heads as usize,
            h.n_kv_heads as usize,
            h.head_dim as usize,
        );
        assert!(
            attention_split_mma_supports(head_dim, n_heads, n_kv_heads, split_len),
            "attention_split_mma_bf16: heads of {head_dim}, {n_heads} over {n_kv_heads}, splits of {split_len}"
        );
        let kernel = SplitKernel {
            func: &self.kernels.attention_split_mma_bf16,
            name: "attention_split_mma_bf16",
            threads: 32,
            shared: attn_split_mma_shared_bytes(head_dim),
        };
        // SAFETY: the caller's guarantee, passed on; one warp a block and the shared memory
        // the kernel's header asks for (under the default 48 KiB).
        unsafe { self.attention_split(kernel, partial_o, partial_ml, p, None, split_len) }
    }

    /// `attention_split_mma_bf16` over the fp8 cache: e4m3 keys and values, and their
    /// `scales`; the same partial results. See the kernel's header.
    ///
    /// # Safety
    /// As `attention_split_bf16`.
    pub unsafe fn attention_split_mma_fp8(
        &self,
        partial_o: &mut Out<f32>,
        partial_ml: &mut Out<f32>,
        p: &PagedIn<u8>,
        scales: &KvScales,
        split_len: usize,
    ) -> Result<()> {
        let h = p.shape.heads;
        let (n_heads, n_kv_heads, head_dim) = h.sizes();
        assert!(
            attention_split_mma_supports(head_dim, n_heads, n_kv_heads, split_len),
            "attention_split_mma_fp8: heads of {head_dim}, {n_heads} over {n_kv_heads}, splits of {split_len}"
        );
        check_scales(self, "attention_split_mma_fp8", p, scales);
        let kernel = SplitKernel {
            func: &self.kernels.attention_split_mma_fp8,
            name: "attention_split_mma_fp8",
            threads: 32,
            shared: attn_split_mma_fp8_shared_bytes(head_dim),
        };
        // SAFETY: the caller's guarantee, passed on; one warp a block and the shared memory
        // the kernel's header asks for (its limit raised when the module loaded).
        unsafe { self.attention_split(kernel, partial_o, partial_ml, p, Some(scales), split_len) }
    }
}
