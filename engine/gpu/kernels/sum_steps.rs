//! The lesson's reductions alone: `sum_step1_warp_f32` (a warp per row, `warp_sum`) and
//! `sum_step2_block_f32` (a block per row, `block_sum`), see their kernels' headers. Nothing
//! in the forward pass uses them; `rustle bench --lesson` times them beside `rmsnorm_f32`.

use cudarc::driver::LaunchConfig;

use super::{In, Out, linear, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::traffic;

/// Threads per block of step 2: as many as RMSNorm gives a row.
const SUM_BLOCK_THREADS: u32 = 1024;

impl Gpu {
    /// Lesson step 1 of the reductions: each row's sum, a warp per row: out `[n_rows]`,
    /// x `[n_rows, n_cols]`, `n_rows = out.len()`.
    pub fn sum_step1_warp_f32(&self, out: &mut Out<f32>, x: &In<f32>, n_cols: usize) -> Result<()> {
        let n_rows = out.len();
        assert!(n_cols > 0 && n_rows > 0 && x.len() == n_rows * n_cols);
        let traffic = traffic::sum_f32(n_rows, n_cols);
        let (nc, nr) = (u32_of(n_cols, "n_cols"), u32_of(n_rows, "n_rows"));
        let mut b = self.launcher(&self.kernels.sum_step1_warp_f32);
        b.arg(out).arg(x).arg(&nc).arg(&nr);
        // SAFETY: lengths checked; blocks of 256 threads covering a warp per row.
        self.timed("sum_step1_warp_f32", traffic, || unsafe {
            b.launch(linear(32 * n_rows))
        })
    }

    /// Lesson step 2 of the reductions: as step 1, a block per row.
    pub fn sum_step2_block_f32(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        n_cols: usize,
    ) -> Result<()> {
        let n_rows = out.len();
        assert!(n_cols > 0 && n_rows > 0 && x.len() == n_rows * n_cols);
        let traffic = traffic::sum_f32(n_rows, n_cols);
        let (nc, nr) = (u32_of(n_cols, "n_cols"), u32_of(n_rows, "n_rows"));
        let cfg = LaunchConfig {
            grid_dim: (nr, 1, 1),
            block_dim: (SUM_BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 32 * 4,
        };
        let mut b = self.launcher(&self.kernels.sum_step2_block_f32);
        b.arg(out).arg(x).arg(&nc).arg(&nr);
        // SAFETY: lengths checked; a block per row of 1024 threads (a multiple of 32) and the
        // 32 floats of shared memory `block_sum` needs.
        self.timed("sum_step2_block_f32", traffic, || unsafe { b.launch(cfg) })
    }
}
