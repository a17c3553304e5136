//! `gemm_wgmma_bf16`, the prompt GEMM on Hopper's warpgroup tensor cores, its plan, and
//! the prefill's choice between it and `gemm_mma_bf16`; `gemm_wgmma_fp8`, the same on e4m3
//! (`--weights fp8`).

use cudarc::driver::CudaFunction;

use super::gemm_mma::{Bf16Operands, TensorGemm};
use super::{In, Out, aligned16, u32_of};
use crate::error::{Error, Result};
use crate::gpu::context::Gpu;
use crate::gpu::gemm_plan::{GemmPlan, WGMMA_SPLITS};
use crate::tiles::{WGMMA_BM, WGMMA_GEMM_THREADS, WGMMA_SHARED_BYTES, WGMMA_WIDTHS};
use crate::traffic;

/// `gemm_wgmma_bf16`.
const WGMMA_GEMM: TensorGemm = TensorGemm {
    name: "gemm_wgmma_bf16",
    tile_m: WGMMA_BM,
    threads: WGMMA_GEMM_THREADS,
    shared: WGMMA_SHARED_BYTES,
    takes_tile_n: true,
    split_parts: true,
    traffic: traffic::gemm_wgmma_bf16,
};

/// `gemm_wgmma_fp8`: the same tiles, stages and shared memory.
const WGMMA_FP8_GEMM: TensorGemm = TensorGemm {
    name: "gemm_wgmma_fp8",
    traffic: traffic::gemm_wgmma_fp8,
    ..WGMMA_GEMM
};

/// `gemm_wgmma_fp8`'s inputs: e4m3 activations and weights, each with its scales, and the
/// bias.
pub struct Fp8Operands<'a> {
    /// `[n, n_in]` e4m3 (`quantize_fp8_f32`)
    pub x: In<'a, u8>,
    /// `[n]`
    pub x_scales: In<'a, f32>,
    /// `[n_out, n_in]` e4m3
    pub w: In<'a, u8>,
    /// `[n_out]`
    pub w_scales: In<'a, f32>,
    /// `[n_out]`, or none
    pub bias: Option<In<'a, f32>>,
}

/// What both warpgroup GEMMs check of a plan they are given: one of the widths and splits
/// they run, `accumulate` only through a split's sum, and room in `parts` for a split's
/// `k_splits * n * n_out` floats, which it returns (0 unsplit).
fn check_plan(
    name: &str,
    plan: GemmPlan,
    accumulate: bool,
    parts: &Out<f32>,
    n: usize,
    n_out: usize,
) -> usize {
    assert!(WGMMA_WIDTHS.contains(&plan.tile_n) && WGMMA_SPLITS.contains(&plan.k_splits));
    assert!(
        !accumulate || plan.k_splits > 1,
        "{name} adds into its output only through a split's sum"
    );
    if plan.k_splits == 1 {
        return 0;
    }
    let len = plan.k_splits * n * n_out;
    assert!(
        parts.len() >= len,
        "{name} split {} ways needs {len} floats of parts, has {}",
        plan.k_splits,
        parts.len()
    );
    len
}

impl Gpu {
    /// As `gemm_mma_bf16`, on Hopper's warpgroup tensor cores (`wgmma`): an error on a GPU
    /// without them (the kernel is in the sm_90a build only). A split plan stores its parts
    /// in `parts` (at least `wgmma_parts_len` floats) and adds them in order.
    pub fn gemm_wgmma_bf16(
        &self,
        out: &mut Out<f32>,
        ops: Bf16Operands,
        n_in: usize,
        parts: &mut Out<f32>,
    ) -> Result<()> {
        let (n, n_out) = ops.rows(n_in);
        let plan = self.wgmma_plan(n, n_in, n_out)?;
        self.gemm_wgmma_planned(plan, out, ops, n_in, parts, false)
    }

    /// `out += x w^T + bias` through `gemm_wgmma_bf16`, where its plan for this shape
    /// splits the reduction (`wgmma_parts_len > 0`): the in-order sum of the parts adds
    /// into `out`, so the residual add costs no launch of its own.
    pub fn gemm_wgmma_add_bf16(
        &self,
        out: &mut Out<f32>,
        ops: Bf16Operands,
        n_in: usize,
        parts: &mut Out<f32>,
    ) -> Result<()> {
        let (n, n_out) = ops.rows(n_in);
        let plan = self.wgmma_plan(n, n_in, n_out)?;
        self.gemm_wgmma_planned(plan, out, ops, n_in, parts, true)
    }

    /// The tile width and split `gemm_wgmma_bf16` runs `n` tokens through an
    /// `n_out x n_in` matrix with on this GPU.
    pub fn wgmma_plan(&self, n: usize, n_in: usize, n_out: usize) -> Result<GemmPlan> {
        self.wgmma_kernel()?;
        let tuned = self.tuned_plans.read().expect("the plan table's lock");
        Ok(tuned.wgmma(n, n_in, n_out, self.gemm_slots.wgmma))
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
    pub fn gemm_wgmma_planned(
        &self,
        plan: GemmPlan,
        out: &mut Out<f32>,
        ops: Bf16Operands,
        n_in: usize,
        parts: &mut Out<f32>,
        accumulate: bool,
    ) -> Result<()> {
        let (n, n_out) = ops.rows(n_in);
        let len = check_plan("gemm_wgmma_bf16", plan, accumulate, parts, n, n_out);
        let func = self.wgmma_kernel()?;
        if plan.k_splits == 1 {
            return self.tensor_gemm(func, &WGMMA_GEMM, plan, out, ops, n_in);
        }
        // The parts unbiased; their in-order sum adds the bias.
        let Bf16Operands { x, w, bias } = ops;
        let parts = &mut parts.slice_mut(..len);
        let ops = Bf16Operands { x, w, bias: None };
        self.tensor_gemm(func, &WGMMA_GEMM, plan, parts, ops, n_in)?;
        self.gemm_skinny_reduce_f32(out, &parts.as_view(), bias.as_ref(), n_out, accumulate)
    }

    /// `gemm_wgmma_fp8`: `out (+)= x_scales[t] w_scales[o] (x w^T)[t, o] + bias[o]` on the
    /// plan `gemm_wgmma_bf16` takes for the shape (`parts` as it says). It adds into `out`
    /// only through a split plan's sum, as `gemm_wgmma_add_bf16`: `accumulate` needs
    /// `wgmma_parts_len(n, n_in, n_out) > 0`. An error on a GPU without it.
    pub fn gemm_wgmma_fp8(
        &self,
        out: &mut Out<f32>,
        ops: Fp8Operands,
        n_in: usize,
        parts: &mut Out<f32>,
        accumulate: bool,
    ) -> Result<()> {
        let (n, n_out) = (ops.x_scales.len(), ops.w_scales.len());
        let plan = self.wgmma_plan(n, n_in, n_out)?;
        self.gemm_wgmma_fp8_planned(plan, out, ops, n_in, parts, accumulate)
    }

    /// `gemm_wgmma_fp8` on the plan the caller chose, as `gemm_wgmma_planned`.
    pub fn gemm_wgmma_fp8_planned(
        &self,
        plan: GemmPlan,
        out: &mut Out<f32>,
        ops: Fp8Operands,
        n_in: usize,
        parts: &mut Out<f32>,
        accumulate: bool,
    ) -> Result<()> {
        // A scale a token and a scale a row.
        let (n, n_out) = (ops.x_scales.len(), ops.w_scales.len());
        let len = check_plan("gemm_wgmma_fp8", plan, accumulate, parts, n, n_out);
        let func = self.hopper_kernel(&self.kernels.gemm_wgmma_fp8, "gemm_wgmma_fp8")?;
        let Fp8Operands {
            x,
            x_scales,
            w,
            w_scales,
            bias,
        } = ops;
        let bias = bias.as_ref();
        assert!(
            n_in.is_multiple_of(16),
            "gemm_wgmma_fp8 moves 16 values at a time: n_in {n_in} must be a multiple of 16"
        );
        assert!(x.len() == n * n_in && w.len() == n_out * n_in);
        assert!(x_scales.len() == n && w_scales.len() == n_out);
        assert!(bias.is_none_or(|b| b.len() == n_out));
        assert!(
            aligned16(&w, &self.stream) && aligned16(&x, &self.stream),
            "gemm_wgmma_fp8 needs 16-byte aligned w and x"
        );
        let k = &WGMMA_FP8_GEMM;
        let cfg = k.launch(plan, n, n_out);
        let traffic = (k.traffic)(n, n_in, n_out, bias.is_some());
        let split = plan.k_splits > 1;
        let (n_u, n_in_u, n_out_u) = (u32_of(n, "n"), u32_of(n_in, "n_in"), u32_of(n_out, "n_out"));
        let tile_n = plan.tile_n as u32;
        let parts = parts.slice_mut(..len);
        assert!(split || out.len() == n * n_out);
        let mut b = self.launcher(func);
        match split {
            true => b.arg(&parts),
            false => b.arg(out),
        };
        b.arg(&x).arg(&x_scales).arg(&w).arg(&w_scales);
        b.arg_or_null(if split { None } else { bias });
        let w_map = self.matrix_map(&w, n_out, n_in, plan.tile_n)?;
        let x_map = self.matrix_map(&x, n, n_in, WGMMA_BM)?;
        b.arg(&n_u)
            .arg(&n_in_u)
            .arg(&n_out_u)
            .arg(&tile_n)
            .arg(&w_map)
            .arg(&x_map);
        // SAFETY: shapes and alignment checked; the block size and shared memory of
        // `gemm_wgmma_bf16`'s launch (the limit raised for this kernel too), a grid of
        // tiles of the width the kernel is told (the map's boxes as wide), and room for every
        // part when split.
        self.timed(k.name, traffic, || unsafe { b.launch(cfg) })?;
        if split {
            self.gemm_skinny_reduce_f32(out, &parts.as_view(), bias, n_out, accumulate)?;
        }
        Ok(())
    }

    /// Whether this GPU runs `gemm_wgmma_fp8` (and `quantize_fp8_f32`, its input).
    pub fn has_wgmma_fp8(&self) -> bool {
        self.kernels.gemm_wgmma_fp8.is_some() && self.kernels.quantize_fp8_f32.is_some()
    }

    fn wgmma_kernel(&self) -> Result<&CudaFunction> {
        self.hopper_kernel(&self.kernels.gemm_wgmma_bf16, "gemm_wgmma_bf16")
    }

    /// A kernel of the sm_90a build only (`func`, from the kernel table), or the error that
    /// names it and this GPU.
    pub(super) fn hopper_kernel<'a>(
        &self,
        func: &'a Option<CudaFunction>,
        name: &str,
    ) -> Result<&'a CudaFunction> {
        func.as_ref().ok_or_else(|| {
            Error::Unsupported(format!(
                "{name} needs a GPU of compute capability 9.0 (Hopper); this is {}",
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
    pub fn prefill_gemm(
        &self,
        out: &mut Out<f32>,
        ops: Bf16Operands,
        n_in: usize,
        parts: &mut Out<f32>,
    ) -> Result<()> {
        if self.has_wgmma() {
            self.gemm_wgmma_bf16(out, ops, n_in, parts)
        } else {
            self.gemm_mma_bf16(out, ops, n_in)
        }
    }
}
