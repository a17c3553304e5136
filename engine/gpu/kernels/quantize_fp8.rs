//! `quantize_fp8_f32`: a prompt's activations to e4m3, one scale a token, for
//! `gemm_wgmma_fp8`.

use cudarc::driver::LaunchConfig;

use super::{In, Out, aligned16, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::traffic;

impl Gpu {
    /// `quantize_fp8_f32`: each of the `n` rows of `x` (`[n, n_in]`) to e4m3 `codes`
    /// (`[n, n_in]`) and its scale (`scales`, `[n]`: the row's largest magnitude over 448).
    /// An error on a GPU without it (the kernel is in the sm_90a build only, beside the
    /// GEMM it feeds).
    pub fn quantize_fp8_f32(
        &self,
        codes: &mut Out<u8>,
        scales: &mut Out<f32>,
        x: &In<f32>,
        n: usize,
        n_in: usize,
    ) -> Result<()> {
        let func = self.hopper_kernel(&self.kernels.quantize_fp8_f32, "quantize_fp8_f32")?;
        assert!(n_in.is_multiple_of(4), "4 values at a time: n_in {n_in}");
        assert!(x.len() == n * n_in && codes.len() == n * n_in && scales.len() == n);
        assert!(
            aligned16(x, &self.stream),
            "quantize_fp8_f32 needs a 16-byte aligned x"
        );
        let cfg = LaunchConfig {
            grid_dim: (u32_of(n, "tokens"), 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 32 * 4,
        };
        let traffic = traffic::quantize_fp8_f32(n, n_in);
        let n_in = u32_of(n_in, "n_in");
        let mut b = self.launcher(func);
        b.arg(codes).arg(scales).arg(x).arg(&n_in);
        // SAFETY: one block per row of the checked shapes (so codes are 4-byte aligned: n_in
        // % 4 == 0 and allocations are aligned), 1024 threads, 32 floats of shared memory.
        self.timed("quantize_fp8_f32", traffic, || unsafe { b.launch(cfg) })
    }
}
