//! The lesson's GEMV steps before `gemv_bf16`: `gemv_step1_thread_per_row_bf16` and
//! `gemv_step2_warp_per_row_bf16` (see their kernels' headers). Nothing in the forward pass
//! uses them; `rustle bench --lesson` times them beside `gemv_bf16`.

use cudarc::driver::{CudaFunction, LaunchConfig};

use super::{In, Out, linear, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::traffic;

impl Gpu {
    /// Lesson step 1: one token through an `n_out x n_in` bf16 matrix, a thread per row:
    /// out `[n_out]`, x `[n_in]`, w `[n_out, n_in]`.
    pub fn gemv_step1_thread_per_row_bf16(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        w: &In<u16>,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        let func = &self.kernels.gemv_step1_thread_per_row_bf16;
        let kernel = (func, "gemv_step1_thread_per_row_bf16", linear(n_out));
        self.gemv_step(kernel, out, x, w, n_in, n_out)
    }

    /// Lesson step 2: as step 1, a warp per row.
    pub fn gemv_step2_warp_per_row_bf16(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        w: &In<u16>,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        let func = &self.kernels.gemv_step2_warp_per_row_bf16;
        let kernel = (func, "gemv_step2_warp_per_row_bf16", linear(32 * n_out));
        self.gemv_step(kernel, out, x, w, n_in, n_out)
    }

    /// The launch both steps share: the kernel, its name and its grid, then the same
    /// arguments, the same checks.
    fn gemv_step(
        &self,
        (func, name, cfg): (&CudaFunction, &'static str, LaunchConfig),
        out: &mut Out<f32>,
        x: &In<f32>,
        w: &In<u16>,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        assert!(x.len() == n_in && out.len() == n_out && w.len() == n_out * n_in);
        let traffic = traffic::gemv_bf16(n_in, n_out, false, false);
        let (n_in, n_out) = (u32_of(n_in, "n_in"), u32_of(n_out, "n_out"));
        let mut b = self.launcher(func);
        b.arg(out).arg(x).arg(w).arg(&n_in).arg(&n_out);
        // SAFETY: lengths checked; blocks of 256 threads covering a thread (step 1) or a
        // warp (step 2) per row.
        self.timed(name, traffic, || unsafe { b.launch(cfg) })
    }
}
