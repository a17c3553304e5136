//! `attention_split_mma_bf16`: flash-decoding's first half on tensor cores, for the query
//! heads of a KV head together; `attention_split_mma_fp8` the same over the fp8 cache.

use cudarc::driver::{CudaFunction, DeviceRepr};

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
        let kernel = (
            &self.kernels.attention_split_mma_bf16,
            "attention_split_mma_bf16",
        );
        let shared = attn_split_mma_shared_bytes(p.shape.heads.head_dim as usize);
        // SAFETY: the caller's guarantee, passed on; the shared memory the kernel's header
        // asks for (under the default 48 KiB).
        unsafe { self.split_mma(kernel, shared, (partial_o, partial_ml), p, None, split_len) }
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
        check_scales(self, "attention_split_mma_fp8", p, scales);
        let kernel = (
            &self.kernels.attention_split_mma_fp8,
            "attention_split_mma_fp8",
        );
        let shared = attn_split_mma_fp8_shared_bytes(p.shape.heads.head_dim as usize);
        let partials = (partial_o, partial_ml);
        // SAFETY: the caller's guarantee, passed on; the shared memory the kernel's header
        // asks for (its limit raised when the module loaded).
        unsafe { self.split_mma(kernel, shared, partials, p, Some(scales), split_len) }
    }

    /// The launch both tensor-core split kernels share: the shapes they take checked, one
    /// warp a block, `shared` bytes of dynamic shared memory.
    ///
    /// # Safety
    /// As `attention_split_bf16`; `shared` is what the kernel's header asks for.
    unsafe fn split_mma<T: DeviceRepr>(
        &self,
        (func, name): (&CudaFunction, &'static str),
        shared: usize,
        (partial_o, partial_ml): (&mut Out<f32>, &mut Out<f32>),
        p: &PagedIn<T>,
        scales: Option<&KvScales>,
        split_len: usize,
    ) -> Result<()> {
        let (n_heads, n_kv_heads, head_dim) = p.shape.heads.sizes();
        assert!(
            attention_split_mma_supports(head_dim, n_heads, n_kv_heads, split_len),
            "{name}: heads of {head_dim}, {n_heads} over {n_kv_heads}, splits of {split_len}"
        );
        let kernel = SplitKernel {
            func,
            name,
            threads: 32,
            shared,
        };
        // SAFETY: the caller's guarantee, passed on.
        unsafe { self.attention_split(kernel, partial_o, partial_ml, p, scales, split_len) }
    }
}
