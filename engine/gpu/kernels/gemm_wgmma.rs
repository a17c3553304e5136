//! `gemm_wgmma_bf16`, the prompt GEMM on Hopper's warpgroup tensor cores, its plan, and
//! the prefill's choice between it and `gemm_mma_bf16`.

use cudarc::driver::CudaFunction;

use super::gemm_mma::TensorGemm;
use super::{In, Out};
use crate::error::{Error, Result};
use crate::gpu::context::Gpu;
use crate::gpu::gemm_plan::{self, GemmPlan, WGMMA_SPLITS};
use crate::gpu::tiles::{WGMMA_BM, WGMMA_SHARED_BYTES, WGMMA_THREADS, WGMMA_WIDTHS};
use crate::traffic;

/// `gemm_wgmma_bf16`.
const WGMMA_GEMM: TensorGemm = TensorGemm {
    name: "gemm_wgmma_bf16",
    tile_m: WGMMA_BM,
    threads: WGMMA_THREADS,
    shared: WGMMA_SHARED_BYTES,
    takes_tile_n: true,
    split_parts: true,
    traffic: traffic::gemm_wgmma_bf16,
};

impl Gpu {
    /// As `gemm_mma_bf16`, on Hopper's warpgroup tensor cores (`wgmma`): an error on a GPU
    /// without them (the kernel is in the sm_90a build only). A split plan stores its parts
    /// in `parts` (at least `wgmma_parts_len` floats) and adds them in order.
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
        parts: &mut Out<f32>,
    ) -> Result<()> {
        let plan = self.wgmma_plan(n, n_in, n_out)?;
        self.gemm_wgmma_planned(plan, out, x, w, bias, n, n_in, n_out, parts, false)
    }

    /// `out += x w^T` through `gemm_wgmma_bf16`, where its plan for this shape splits the
    /// reduction (`wgmma_parts_len > 0`): the in-order sum of the parts adds into `out`, so
    /// the residual add costs no launch of its own.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_wgmma_add_bf16(
        &self,
        out: &mut Out<f32>,
        x: &In<u16>,
        w: &In<u16>,
        n: usize,
        n_in: usize,
        n_out: usize,
        parts: &mut Out<f32>,
    ) -> Result<()> {
        let plan = self.wgmma_plan(n, n_in, n_out)?;
        self.gemm_wgmma_planned(plan, out, x, w, None, n, n_in, n_out, parts, true)
    }

    /// The tile width and split `gemm_wgmma_bf16` runs `n` tokens through an
    /// `n_out x n_in` matrix with on this GPU.
    pub fn wgmma_plan(&self, n: usize, n_in: usize, n_out: usize) -> Result<GemmPlan> {
        self.wgmma_kernel()?;
        Ok(gemm_plan::wgmma(n, n_in, n_out, self.gemm_slots.wgmma))
    }

    /// Floats of split sums `gemm_wgmma_bf16` needs for `n` tokens through an `n_out x n_in`
    /// matrix: `k_splits * n * n_out` when its plan splits the reduction, else 0 (none on a
    /// GPU without `wgmma`).
    pub fn wgmma_parts_len(&self, n: usize, n_in: usize, n_out: usize) -> usize {
        match self.wgmma_plan(n, n_in, n_out) {
            Ok(plan) if plan.k_splits > 1 => plan.k_splits * n * n_out,
            _ => 0,
        }
    }

    /// `gemm_wgmma_bf16` with the tile width and split chosen by the caller (one of
    /// `WGMMA_WIDTHS` and of `WGMMA_SPLITS`), not by `gemm_plan::wgmma`: for measuring the
    /// plans. Split, the parts go to `parts` and `gemm_skinny_reduce_f32` adds them, in
    /// order, and the bias into `out` (onto what it holds when `accumulate`, which only a
    /// split plan takes): the same sums whatever order the blocks ran in.
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
        parts: &mut Out<f32>,
        accumulate: bool,
    ) -> Result<()> {
        assert!(WGMMA_WIDTHS.contains(&plan.tile_n) && WGMMA_SPLITS.contains(&plan.k_splits));
        assert!(
            !accumulate || plan.k_splits > 1,
            "gemm_wgmma_bf16 adds into its output only through a split's sum"
        );
        let func = self.wgmma_kernel()?;
        if plan.k_splits == 1 {
            return self.tensor_gemm(func, &WGMMA_GEMM, plan, out, x, w, bias, n, n_in, n_out);
        }
        let len = plan.k_splits * n * n_out;
        assert!(
            parts.len() >= len,
            "gemm_wgmma_bf16 split {} ways needs {len} floats of parts, has {}",
            plan.k_splits,
            parts.len()
        );
        let parts = &mut parts.slice_mut(..len);
        self.tensor_gemm(func, &WGMMA_GEMM, plan, parts, x, w, None, n, n_in, n_out)?;
        self.gemm_skinny_reduce_f32(out, &parts.as_view(), bias, n_out, accumulate)
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

    /// The prefill's matmul: `gemm_wgmma_bf16` where the GPU has it (`parts` as it says),
    /// else `gemm_mma_bf16`.
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
        parts: &mut Out<f32>,
    ) -> Result<()> {
        if self.has_wgmma() {
            self.gemm_wgmma_bf16(out, x, w, bias, n, n_in, n_out, parts)
        } else {
            self.gemm_mma_bf16(out, x, w, bias, n, n_in, n_out)
        }
    }
}
