//! `rmsnorm_f32`, `rmsnorm_f32_bf16` (the same, its output also rounded to bf16) and
//! `rmsnorm_q8_f32` (its output made a GEMV's 8-bit codes).

use cudarc::driver::LaunchConfig;

use super::{In, Out, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::traffic;

/// Threads per block of RMSNorm: a whole row of up to 8192 in one round of loads.
const ROW_THREADS: u32 = 1024;

impl Gpu {
    /// RMSNorm of `n_rows = x.len() / dim` rows: out, x `[n_rows, dim]`, weight `[dim]`.
    pub fn rmsnorm_f32(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        weight: &In<f32>,
        eps: f32,
        dim: usize,
    ) -> Result<()> {
        let rows = x.len() / dim;
        assert!(dim > 0 && x.len() == rows * dim && out.len() == x.len() && weight.len() == dim);
        let cfg = LaunchConfig {
            grid_dim: (u32_of(rows, "rows"), 1, 1),
            block_dim: (ROW_THREADS, 1, 1),
            shared_mem_bytes: 32 * 4,
        };
        let dim = u32_of(dim, "dim");
        let traffic = traffic::rmsnorm_f32(rows, dim as usize);
        let mut b = self.launcher(&self.kernels.rmsnorm_f32);
        b.arg(out).arg(x).arg(weight).arg(&eps).arg(&dim);
        // SAFETY: shapes checked; 1024 threads (a multiple of 32) and 32 floats of shared memory.
        self.timed("rmsnorm_f32", traffic, || unsafe { b.launch(cfg) })
    }

    /// `rmsnorm_f32`, also writing the output rounded to bf16 into `out_bf16` (`[n_rows,
    /// dim]`): a tensor-core matmul's input without a rounding launch of its own.
    pub fn rmsnorm_f32_bf16(
        &self,
        out: &mut Out<f32>,
        out_bf16: &mut Out<u16>,
        x: &In<f32>,
        weight: &In<f32>,
        eps: f32,
        dim: usize,
    ) -> Result<()> {
        let rows = x.len() / dim;
        assert!(dim > 0 && x.len() == rows * dim && out.len() == x.len() && weight.len() == dim);
        assert_eq!(out_bf16.len(), x.len());
        let cfg = LaunchConfig {
            grid_dim: (u32_of(rows, "rows"), 1, 1),
            block_dim: (ROW_THREADS, 1, 1),
            shared_mem_bytes: 32 * 4,
        };
        let dim = u32_of(dim, "dim");
        let traffic = traffic::rmsnorm_f32_bf16(rows, dim as usize);
        let mut b = self.launcher(&self.kernels.rmsnorm_f32_bf16);
        b.arg(out)
            .arg(out_bf16)
            .arg(x)
            .arg(weight)
            .arg(&eps)
            .arg(&dim);
        // SAFETY: shapes checked; 1024 threads (a multiple of 32) and 32 floats of shared memory.
        self.timed("rmsnorm_f32_bf16", traffic, || unsafe { b.launch(cfg) })
    }

    /// `rmsnorm_f32` of `n_rows = x.len() / dim` rows made 8-bit codes as `quantize_q8_f32`
    /// makes them: `codes` `[n_rows, dim]`, `scales` `[n_rows, dim / 32][2]`; x `[n_rows,
    /// dim]`, weight `[dim]`. The input of a GEMV over GGUF blocks in one launch.
    pub fn rmsnorm_q8_f32(
        &self,
        codes: &mut Out<u8>,
        scales: &mut Out<f32>,
        x: &In<f32>,
        weight: &In<f32>,
        eps: f32,
        dim: usize,
    ) -> Result<()> {
        let rows = x.len() / dim;
        assert!(dim > 0 && dim.is_multiple_of(32), "whole groups of 32");
        assert!(x.len() == rows * dim && weight.len() == dim);
        assert!(codes.len() >= x.len() && scales.len() >= x.len() / 16);
        let cfg = LaunchConfig {
            grid_dim: (
                u32_of(dim.div_ceil(ROW_THREADS as usize), "blocks"),
                u32_of(rows, "rows"),
                1,
            ),
            block_dim: (ROW_THREADS, 1, 1),
            shared_mem_bytes: 32 * 4,
        };
        let dim = u32_of(dim, "dim");
        let traffic = traffic::rmsnorm_q8_f32(rows, dim as usize);
        let mut b = self.launcher(&self.kernels.rmsnorm_q8_f32);
        b.arg(codes)
            .arg(scales)
            .arg(x)
            .arg(weight)
            .arg(&eps)
            .arg(&dim);
        // SAFETY: shapes checked, dim whole groups; a grid of (dim / 1024 rounded up, rows)
        // blocks of 1024 threads (a multiple of 32) and 32 floats of shared memory.
        self.timed("rmsnorm_q8_f32", traffic, || unsafe { b.launch(cfg) })
    }
}
