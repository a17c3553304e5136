//! The grouped GEMVs of a mixture of experts (`gemv_experts_<type>`,
//! `gemv_swiglu_experts_<type>`, `gpu-kernels/src/gemv_experts.rs`): each run of pairs that
//! `route_experts_f32` grouped, through its expert's matrix of a layer's stack.

use cudarc::driver::CudaFunction;

use super::gemv::{GEMV_WARPS, gemv_launch};
use super::gemv_codes::codes_launch;
use super::gemv_mma::mma_launch;
use super::gemv_quant::BlocksIn;
use super::table::Kernels;
use super::{In, Out, aligned16};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::kernel_args::{MatmulShape, Runs};
use crate::tiles::CODES_ROWS;
use crate::traffic::Traffic;
use crate::weights::blocks::BlockType;

/// A grouped GEMV's runs on the device.
pub type RunsIn<'a, 'b> = Runs<&'b In<'a, u32>>;

/// The stack's experts and the grid's runs (`min(n_experts, pairs)`) of a grouped GEMV over
/// `stack_len` elements of `[n_experts, n_out, matrix / n_out]`, after the checks every one
/// needs.
fn experts_and_runs(stack_len: usize, matrix: usize, runs: RunsIn, pairs: usize) -> (usize, usize) {
    assert!(
        matrix > 0 && stack_len.is_multiple_of(matrix),
        "a stack of whole experts"
    );
    let experts = stack_len / matrix;
    assert!(runs.expert.len() >= experts && runs.start.len() > experts);
    assert!(pairs > 0, "a grouped GEMV of no pairs");
    (experts, experts.min(pairs))
}

/// What a grouped GEMV moves and computes, at most: every expert some pair chose read once
/// (at most `runs` of them), the pairs' inputs and outputs.
fn experts_traffic(matrix_bytes: usize, runs: usize, input: usize, shape: MatmulShape) -> Traffic {
    let [pairs, n_in, n_out, _] = shape.sizes();
    Traffic {
        bytes: (matrix_bytes * runs + input + 4 * pairs * n_out) as u64,
        flops: (2 * pairs * n_in * n_out) as u64,
    }
}

impl Gpu {
    /// `gemv_experts_<ty>` (with `up`, `gemv_swiglu_experts_<ty>`): out (`[pairs,
    /// out_stride]`, columns `0..n_out`) = each pair's row of x times its run's expert of `w`
    /// (`[n_experts * n_out]` rows of `w.ty`; with `up`, silu of the gate `w` times up), x as
    /// `quantize_q8_f32` left it (`codes` `[pairs, n_in]`, `scales` `[pairs, n_in / 32][2]`).
    /// `shape.n_tokens` is the pairs; it does not accumulate. With `mma`, the same on the
    /// tensor cores (`gemv_experts_mma_<ty>`, for the types of `MMA_GEMV_TYPES`): the caller
    /// asks for it where the runs are long (`Gpu::gemv_on_mma` of the pairs a run).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_experts_codes(
        &self,
        out: &mut Out<f32>,
        (codes, scales): (&In<u8>, &In<f32>),
        (w, up): (&BlocksIn, Option<&BlocksIn>),
        runs: RunsIn,
        shape: MatmulShape,
        mma: bool,
    ) -> Result<()> {
        let [pairs, n_in, n_out, _] = shape.sizes();
        let ty = w.ty;
        assert!(
            ty != BlockType::Fp8 && w.row_scales.is_none(),
            "GGUF blocks"
        );
        assert!(
            ty.fits(n_in) && n_in.is_multiple_of(64),
            "{ty} rows of {n_in}"
        );
        assert!(up.is_none_or(|u| u.ty == ty && u.bytes.len() == w.bytes.len()));
        assert!(!shape.accumulates(), "a grouped GEMV overwrites its output");
        for m in [Some(w), up].into_iter().flatten() {
            assert!(
                aligned16(&m.bytes, &self.stream),
                "{ty}: stacks 16-byte aligned"
            );
        }
        // The codes' checks for every pair (a launch takes any number: each block at most
        // `QUANT_MAX_TOKENS` of them a pass).
        let [_, _, _, out_stride] = shape.sizes();
        assert!(n_out <= out_stride && out.len() >= (pairs - 1) * out_stride + n_out);
        assert!(codes.len() >= pairs * n_in && aligned16(codes, &self.stream));
        assert!(scales.len() >= pairs * n_in / 16 && aligned16(scales, &self.stream));
        let matrix = n_out * ty.row_bytes(n_in);
        let (_, n_runs) = experts_and_runs(w.bytes.len(), matrix, runs, pairs);
        let tiles = 1 + up.is_some() as usize;
        let ((func, name), mut cfg) = if mma {
            let [gemv, swiglu] = self
                .kernels
                .experts_mma(ty)
                .unwrap_or_else(|| panic!("no gemv_experts_mma_<type> for {ty}"));
            let kernel = if up.is_some() { swiglu } else { gemv };
            (kernel, mma_launch(n_out, tiles))
        } else {
            let [gemv, swiglu] = self.kernels.experts(ty);
            match up {
                None => (gemv, codes_launch(ty, n_in, n_out.div_ceil(CODES_ROWS))),
                Some(_) => (swiglu, codes_launch(ty, n_in, n_out)),
            }
        };
        cfg.grid_dim.1 = n_runs as u32;
        let traffic = experts_traffic(tiles * matrix, n_runs, pairs * n_in * 5 / 4, shape);
        let mut b = self.launcher(func);
        b.arg(out).arg(codes).arg(scales).arg(&w.bytes);
        if let Some(up) = up {
            b.arg(&up.bytes);
        }
        b.arg(runs.expert).arg(runs.start).arg(&shape);
        // SAFETY: the stacks are whole aligned experts of their type (checked), the runs
        // hold every expert's entry (checked) and the routing's pairs (below `pairs`,
        // `route_experts_f32`'s); codes, scales and out hold every pair; grid y at most the
        // experts.
        self.timed(name, traffic, || unsafe { b.launch(cfg) })
    }

    /// `gemv_experts_bf16` (with `up`, `gemv_swiglu_experts_bf16`): out (`[pairs, n_out]`) =
    /// each pair's row of x (`[pairs, n_in]` f32) times its run's expert of `w` (`[n_experts,
    /// n_out, n_in]` bf16; with `up`, silu of the gate `w` times up). With `mma`, the same on
    /// the tensor cores, x rounded to bf16 (`gemv_experts_mma_bf16`, rows of a multiple of
    /// 32): the caller asks for it where the runs are long (`Gpu::experts_bf16_on_mma`).
    pub fn gemv_experts_bf16(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        (w, up): (&In<u16>, Option<&In<u16>>),
        runs: RunsIn,
        shape: MatmulShape,
        mma: bool,
    ) -> Result<()> {
        let [pairs, n_in, n_out, out_stride] = shape.sizes();
        assert!(n_in.is_multiple_of(8) && out_stride == n_out && !shape.accumulates());
        assert!(
            !mma || n_in.is_multiple_of(32),
            "bf16 rows of {n_in} on the tensor cores"
        );
        assert!(x.len() >= pairs * n_in && out.len() >= pairs * n_out);
        assert!(up.is_none_or(|u| u.len() == w.len()));
        for m in [Some(w), up].into_iter().flatten() {
            assert!(aligned16(m, &self.stream), "bf16 stacks 16-byte aligned");
        }
        assert!(aligned16(x, &self.stream));
        let (_, n_runs) = experts_and_runs(w.len(), n_out * n_in, runs, pairs);
        let matrices = 1 + up.is_some() as usize;
        let k = &self.kernels;
        let ((func, name), mut cfg) = match (mma, up.is_some()) {
            (true, false) => (
                (&k.gemv_experts_mma_bf16, "gemv_experts_mma_bf16"),
                mma_launch(n_out, 1),
            ),
            (true, true) => (
                (
                    &k.gemv_swiglu_experts_mma_bf16,
                    "gemv_swiglu_experts_mma_bf16",
                ),
                mma_launch(n_out, 2),
            ),
            // The launch's runs share the GPU: each run's part sized as if it had the SMs'
            // share.
            (false, swiglu) => (
                match swiglu {
                    false => (&k.gemv_experts_bf16, "gemv_experts_bf16"),
                    true => (&k.gemv_swiglu_experts_bf16, "gemv_swiglu_experts_bf16"),
                },
                gemv_launch(n_out, self.sm_count.div_ceil(n_runs), GEMV_WARPS, 4),
            ),
        };
        cfg.grid_dim.1 = n_runs as u32;
        let traffic = experts_traffic(matrices * 2 * n_out * n_in, n_runs, 4 * pairs * n_in, shape);
        let mut b = self.launcher(func);
        b.arg(out).arg(x).arg(w);
        if let Some(up) = up {
            b.arg(up);
        }
        b.arg(runs.expert).arg(runs.start).arg(&shape);
        // SAFETY: as `gemv_experts_codes`, for bf16 stacks (aligned, whole experts: checked);
        // 8 warps a block and a float of shared memory each (`gemv_launch`), or the tensor
        // cores' sums of the tiles (`mma_launch`) with rows of a multiple of 32 (checked).
        self.timed(name, traffic, || unsafe { b.launch(cfg) })
    }

    /// Whether a grouped bf16 GEMV whose runs average `per_run` pairs takes the tensor cores
    /// (`gemv_experts_mma_bf16`): from `gemv_mma_tokens` pairs, as the GGUF types' do.
    pub fn experts_bf16_on_mma(&self, per_run: usize, n_in: usize) -> bool {
        per_run >= self.gemv_mma_tokens && n_in.is_multiple_of(32)
    }
}

impl Kernels {
    /// `gemv_experts_mma_<type>` and `gemv_swiglu_experts_mma_<type>`, with their names, for
    /// the types of `MMA_GEMV_TYPES`.
    fn experts_mma(&self, ty: BlockType) -> Option<[(&CudaFunction, &'static str); 2]> {
        Some(match ty {
            BlockType::Q4_1 => [
                (&self.gemv_experts_mma_q4_1, "gemv_experts_mma_q4_1"),
                (
                    &self.gemv_swiglu_experts_mma_q4_1,
                    "gemv_swiglu_experts_mma_q4_1",
                ),
            ],
            BlockType::Q8_0 => [
                (&self.gemv_experts_mma_q8_0, "gemv_experts_mma_q8_0"),
                (
                    &self.gemv_swiglu_experts_mma_q8_0,
                    "gemv_swiglu_experts_mma_q8_0",
                ),
            ],
            BlockType::Q4K => [
                (&self.gemv_experts_mma_q4_k, "gemv_experts_mma_q4_k"),
                (
                    &self.gemv_swiglu_experts_mma_q4_k,
                    "gemv_swiglu_experts_mma_q4_k",
                ),
            ],
            BlockType::Q6K => [
                (&self.gemv_experts_mma_q6_k, "gemv_experts_mma_q6_k"),
                (
                    &self.gemv_swiglu_experts_mma_q6_k,
                    "gemv_swiglu_experts_mma_q6_k",
                ),
            ],
            _ => return None,
        })
    }

    /// `gemv_experts_<type>` and `gemv_swiglu_experts_<type>`, with their names, for the GGUF
    /// types.
    fn experts(&self, ty: BlockType) -> [(&CudaFunction, &'static str); 2] {
        match ty {
            BlockType::Q4_0 => [
                (&self.gemv_experts_q4_0, "gemv_experts_q4_0"),
                (&self.gemv_swiglu_experts_q4_0, "gemv_swiglu_experts_q4_0"),
            ],
            BlockType::Q4_1 => [
                (&self.gemv_experts_q4_1, "gemv_experts_q4_1"),
                (&self.gemv_swiglu_experts_q4_1, "gemv_swiglu_experts_q4_1"),
            ],
            BlockType::Q5_0 => [
                (&self.gemv_experts_q5_0, "gemv_experts_q5_0"),
                (&self.gemv_swiglu_experts_q5_0, "gemv_swiglu_experts_q5_0"),
            ],
            BlockType::Q5_1 => [
                (&self.gemv_experts_q5_1, "gemv_experts_q5_1"),
                (&self.gemv_swiglu_experts_q5_1, "gemv_swiglu_experts_q5_1"),
            ],
            BlockType::Q8_0 => [
                (&self.gemv_experts_q8_0, "gemv_experts_q8_0"),
                (&self.gemv_swiglu_experts_q8_0, "gemv_swiglu_experts_q8_0"),
            ],
            BlockType::Q4K => [
                (&self.gemv_experts_q4_k, "gemv_experts_q4_k"),
                (&self.gemv_swiglu_experts_q4_k, "gemv_swiglu_experts_q4_k"),
            ],
            BlockType::Q5K => [
                (&self.gemv_experts_q5_k, "gemv_experts_q5_k"),
                (&self.gemv_swiglu_experts_q5_k, "gemv_swiglu_experts_q5_k"),
            ],
            BlockType::Q6K => [
                (&self.gemv_experts_q6_k, "gemv_experts_q6_k"),
                (&self.gemv_swiglu_experts_q6_k, "gemv_swiglu_experts_q6_k"),
            ],
            BlockType::Fp8 => panic!("fp8 experts take the host's routing (gpu::experts)"),
        }
    }
}
