//! `gemm_step1_simt_bf16`: the SIMT GEMM, the first step of the lesson. Nothing in the
//! forward pass launches it (the prefill runs the tensor-core ones); `rustle bench --lesson`
//! times it beside them.

use cudarc::driver::LaunchConfig;

use super::{In, Out, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::traffic;

impl Gpu {
    /// Many tokens through a linear layer: out `[n, n_out]`, x `[n, n_in]`,
    /// w `[n_out, n_in]` bf16, bias `[n_out]` or none.
    pub fn gemm_step1_simt_bf16(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n_in: usize,
    ) -> Result<()> {
        let (n, n_out) = (x.len() / n_in.max(1), w.len() / n_in.max(1));
        assert!(x.len() == n * n_in && out.len() == n * n_out && w.len() == n_out * n_in);
        assert!(bias.is_none_or(|b| b.len() == n_out));
        let cfg = LaunchConfig {
            grid_dim: (n_out.div_ceil(64) as u32, n.div_ceil(64) as u32, 1),
            block_dim: (16, 16, 1),
            shared_mem_bytes: 2 * 16 * 65 * 4,
        };
        let (n, n_in, n_out) = (u32_of(n, "n"), u32_of(n_in, "n_in"), u32_of(n_out, "n_out"));
        let traffic = traffic::gemm_bf16(n as usize, n_in as usize, n_out as usize, bias.is_some());
        let mut b = self.launcher(&self.kernels.gemm_step1_simt_bf16);
        b.arg(out).arg(x).arg(w).arg_or_null(bias);
        b.arg(&n).arg(&n_in).arg(&n_out);
        // SAFETY: shapes checked; block (16, 16), the grid covers the output in 64 x 64
        // tiles, and the two shared tiles get their 8320 bytes.
        self.timed("gemm_step1_simt_bf16", traffic, || unsafe { b.launch(cfg) })
    }
}
