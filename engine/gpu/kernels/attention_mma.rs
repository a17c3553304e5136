//! `attention_mma_bf16`: a prompt's attention on tensor cores; `attention_mma_fp8` the same
//! over the fp8 cache.

use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig};

use super::attention::{KvScales, PagedIn, check_scales};
use super::{Out, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::tiles::{
    ATTN_MMA_ROWS, ATTN_MMA_THREADS, BLOCK_SIZE, attn_mma_fp8_shared_bytes, attn_mma_shared_bytes,
};
use crate::traffic;

/// Whether `attention_mma_bf16` takes heads of this width.
pub fn attention_mma_supports(head_dim: usize) -> bool {
    head_dim == 64 || head_dim == 128
}

impl Gpu {
    /// Causal GQA attention for a prompt on tensor cores: the same arguments as
    /// `attention_bf16`. The batch must be one sequence, and `head_dim` 64 or 128
    /// (`attention_mma_supports`).
    ///
    /// # Safety
    /// As `attention_f32`, and every token of the batch is of one sequence.
    pub unsafe fn attention_mma_bf16(&self, out: &mut Out<f32>, p: &PagedIn<u16>) -> Result<()> {
        let kernel = (&self.kernels.attention_mma_bf16, "attention_mma_bf16");
        // SAFETY: the caller's guarantee.
        unsafe { self.prompt_attention(kernel, out, p, None) }
    }

    /// `attention_mma_bf16` over the fp8 cache: e4m3 keys and values, and their `scales`.
    ///
    /// # Safety
    /// As `attention_mma_bf16`.
    pub unsafe fn attention_mma_fp8(
        &self,
        out: &mut Out<f32>,
        p: &PagedIn<u8>,
        scales: &KvScales,
    ) -> Result<()> {
        check_scales(self, "attention_mma_fp8", p, scales);
        let kernel = (&self.kernels.attention_mma_fp8, "attention_mma_fp8");
        // SAFETY: the caller's guarantee.
        unsafe { self.prompt_attention(kernel, out, p, Some(scales)) }
    }

    /// The launch both prompt kernels share: the kernel and its name, its arguments (the
    /// scales of an fp8 cache after the caches).
    ///
    /// # Safety
    /// As `attention_mma_bf16`.
    unsafe fn prompt_attention<T: DeviceRepr>(
        &self,
        (func, name): (&CudaFunction, &'static str),
        out: &mut Out<f32>,
        p: &PagedIn<T>,
        scales: Option<&KvScales>,
    ) -> Result<()> {
        let n = p.positions.len();
        let heads = p.shape.heads;
        let (n_heads, n_kv_heads, head_dim) = heads.sizes();
        assert!(
            attention_mma_supports(head_dim),
            "{name} takes heads of 64 or 128 (got {head_dim})"
        );
        assert!(
            n > 0
                && n_kv_heads > 0
                && n_heads.is_multiple_of(n_kv_heads)
                && p.q.len() == n * heads.q_dim()
                && out.len() == p.q.len()
        );
        assert!(
            p.token_seq.len() == n
                && p.k_cache.len() == p.v_cache.len()
                && p.k_cache.len() % (BLOCK_SIZE * heads.kv_dim()) == 0
        );
        let max_blocks = p.shape.max_blocks as usize;
        assert!(max_blocks > 0 && p.block_tables.len() % max_blocks == 0);
        let rows = n * (n_heads / n_kv_heads);
        let cfg = LaunchConfig {
            grid_dim: (
                u32_of(rows.div_ceil(ATTN_MMA_ROWS), "row blocks"),
                u32_of(n_kv_heads, "n_kv_heads"),
                1,
            ),
            block_dim: (ATTN_MMA_THREADS as u32, 1, 1),
            shared_mem_bytes: match scales {
                Some(_) => attn_mma_fp8_shared_bytes(head_dim),
                None => attn_mma_shared_bytes(head_dim),
            } as u32,
        };
        let prompt_traffic = match scales {
            Some(_) => traffic::attention_mma_fp8,
            None => traffic::attention_mma_bf16,
        };
        let traffic = move |positions: &[u32]| {
            let positions = &positions[..n.min(positions.len())];
            prompt_traffic(positions, n_heads, n_kv_heads, head_dim)
        };
        let nn = u32_of(n, "n");
        let mut b = self.launcher(func);
        b.arg(out).arg(&p.q).arg(&p.k_cache).arg(&p.v_cache);
        if let Some((k_scales, v_scales)) = scales {
            b.arg(k_scales).arg(v_scales);
        }
        b.arg(&p.block_tables)
            .arg(&p.token_seq)
            .arg(&p.positions)
            .arg(&p.shape)
            .arg(&nn);
        // SAFETY: shapes checked; 128 threads and the shared memory the kernel documents (its
        // limit raised to the most it takes when the module loaded); the caller's batch is one sequence whose block tables cover every position
        // up to each token's own, whose key and value were written before.
        self.timed_batch(name, traffic, || unsafe { b.launch(cfg) })
    }
}
