//! `gemm_wgmma_bf16`, the prompt GEMM on Hopper's warpgroup tensor cores, its plan, and
//! the prefill's choice between it and `gemm_mma_bf16`.

use cudarc::driver::CudaFunction;

use super::gemm_mma::TensorGemm;
use super::{In, Out};
use crate::error::{Error, Result};
use crate::gpu::context::Gpu;
use crate::gpu::gemm_plan::{self, GemmPlan};
use crate::gpu::tiles::{WGMMA_BM, WGMMA_SHARED_BYTES, WGMMA_THREADS, WGMMA_WIDTHS};
use crate::traffic;

/// `gemm_wgmma_bf16`.
const WGMMA_GEMM: TensorGemm = TensorGemm {
    name: "gemm_wgmma_bf16",
    tile_m: WGMMA_BM,
    threads: WGMMA_THREADS,
    shared: WGMMA_SHARED_BYTES,
    takes_tile_n: true,
    traffic: traffic::gemm_wgmma_bf16,
};

impl Gpu {
    /// As `gemm_mma_bf16`, on Hopper's warpgroup tensor cores (`wgmma`): an error on a GPU
    /// without them (the kernel is in the sm_90a build only).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_wgmma_bf16(
        &self,
        out: &mut Out<f32>,
        x: &In<u16>,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        let plan = self.wgmma_plan(n, n_in, n_out)?;
        self.gemm_wgmma_planned(plan, out, x, w, bias, n, n_in, n_out)
    }

    /// The tile width and split `gemm_wgmma_bf16` runs `n` tokens through an
    /// `n_out x n_in` matrix with on this GPU.
    pub fn wgmma_plan(&self, n: usize, n_in: usize, n_out: usize) -> Result<GemmPlan> {
        self.wgmma_kernel()?;
        Ok(gemm_plan::wgmma(n, n_in, n_out, self.gemm_slots.wgmma))
    }

    /// `gemm_wgmma_bf16` with the tile width and split chosen by the caller (one of
    /// `WGMMA_WIDTHS`, 1 or 2), not by `gemm_plan::wgmma`: for measuring the plans.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_wgmma_planned(
        &self,
        plan: GemmPlan,
        out: &mut Out<f32>,
        x: &In<u16>,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        assert!(WGMMA_WIDTHS.contains(&plan.tile_n) && (1..=2).contains(&plan.k_splits));
        let func = self.wgmma_kernel()?;
        self.tensor_gemm(func, &WGMMA_GEMM, plan, out, x, w, bias, n, n_in, n_out)
    }

    fn wgmma_kernel(&self) -> Result<&CudaFunction> {
        self.kernels.gemm_wgmma_bf16.as_ref().ok_or_else(|| {
            Error::Unsupported(format!(
                "gemm_wgmma_bf16 needs a GPU of compute capability 9.0 (Hopper); this is {}",
                self.description
            ))
        })
    }

    /// Whether this GPU runs `gemm_wgmma_bf16`.
    pub fn has_wgmma(&self) -> bool {
        self.kernels.gemm_wgmma_bf16.is_some()
    }

    /// The prefill's matmul: `gemm_wgmma_bf16` where the GPU has it, else `gemm_mma_bf16`.
    #[allow(clippy::too_many_arguments)]
    pub fn prefill_gemm(
        &self,
        out: &mut Out<f32>,
        x: &In<u16>,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        if self.has_wgmma() {
            self.gemm_wgmma_bf16(out, x, w, bias, n, n_in, n_out)
        } else {
            self.gemm_mma_bf16(out, x, w, bias, n, n_in, n_out)
        }
    }
}
