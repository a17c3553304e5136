//! The integer GEMV of several tokens on the tensor cores (`gemv_mma_<type>`,
//! `gemv_swiglu_mma_<type>`, `gpu-kernels/src/gemv_mma.rs`): what `Gpu::gemv_codes` and
//! `Gpu::gemv_swiglu_codes` run for `Gpu::gemv_mma_tokens` tokens or more over the types
//! that have it.

use cudarc::driver::{CudaFunction, LaunchConfig};

use super::gemv_quant::{BlocksIn, check_matrix};
use super::table::Kernels;
use super::{In, Out};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::kernel_args::MatmulShape;
use crate::tiles::{MMA_GEMV_ROWS, MMA_GEMV_WARPS, mma_gemv_shared_bytes};
use crate::traffic::Traffic;
use crate::weights::blocks::BlockType;

impl Gpu {
    /// Whether the integer GEMV of `n_tokens` tokens over `ty` runs on the tensor cores
    /// (`gemv_mma_<ty>`): from `gemv_mma_tokens` tokens, for the types of `MMA_GEMV_TYPES`.
    pub fn gemv_on_mma(&self, ty: BlockType, n_tokens: usize) -> bool {
        n_tokens >= self.gemv_mma_tokens && MMA_GEMV_TYPES.contains(&ty)
    }

    /// `gemv_mma_<ty>`: `gemv_codes`'s product (its arguments, checks and result) on the
    /// tensor cores. Panics where `ty` has no such kernel (`gemv_on_mma`).
    pub fn gemv_mma(
        &self,
        out: &mut Out<f32>,
        codes: &In<u8>,
        scales: &In<f32>,
        w: &BlocksIn,
        bias: Option<&In<f32>>,
        shape: MatmulShape,
    ) -> Result<()> {
        let [_, n_in, n_out, _] = shape.sizes();
        let ty = w.ty;
        let (func, name) = self
            .kernels
            .gemv_mma(ty)
            .unwrap_or_else(|| panic!("no gemv_mma_<type> for {ty}"));
        check_matrix(self, w, n_out, n_in);
        self.check_codes(codes, scales, out, shape);
        assert!(bias.is_none_or(|b| b.len() == n_out));
        let traffic = mma_traffic(w.bytes.len(), 1, shape);
        let mut b = self.launcher(func);
        b.arg(out)
            .arg(codes)
            .arg(scales)
            .arg(&w.bytes)
            .arg_or_null(bias);
        b.arg(&shape);
        // SAFETY: the matrix is whole aligned blocks of its type (checked), codes and
        // scales hold the tokens' groups 16-byte aligned, out every token's n_out columns
        // and no input (checked); the weights are read-only; the launch is `mma_launch`'s.
        self.timed(name, traffic, || unsafe { b.launch(mma_launch(n_out, 1)) })
    }

    /// `gemv_swiglu_mma_<ty>`: `gemv_swiglu_codes`'s product on the tensor cores. Panics
    /// where `ty` has no such kernel (`gemv_on_mma`).
    pub fn gemv_swiglu_mma(
        &self,
        out: &mut Out<f32>,
        codes: &In<u8>,
        scales: &In<f32>,
        w_gate: &BlocksIn,
        w_up: &BlocksIn,
        shape: MatmulShape,
    ) -> Result<()> {
        let [_, n_in, n_out, _] = shape.sizes();
        let ty = w_gate.ty;
        assert!(w_up.ty == ty, "gate {ty} and up {} in one launch", w_up.ty);
        let (func, name) = self
            .kernels
            .gemv_swiglu_mma(ty)
            .unwrap_or_else(|| panic!("no gemv_swiglu_mma_<type> for {ty}"));
        for w in [w_gate, w_up] {
            check_matrix(self, w, n_out, n_in);
        }
        assert!(!shape.accumulates(), "the SwiGLU overwrites its output");
        self.check_codes(codes, scales, out, shape);
        let traffic = mma_traffic(w_gate.bytes.len(), 2, shape);
        let mut b = self.launcher(func);
        b.arg(out)
            .arg(codes)
            .arg(scales)
            .arg(&w_gate.bytes)
            .arg(&w_up.bytes);
        b.arg(&shape);
        // SAFETY: as `gemv_mma`, for both matrices.
        self.timed(name, traffic, || unsafe { b.launch(mma_launch(n_out, 2)) })
    }
}

/// The types whose matmuls take `gemv_mma_<type>` (`Gpu::gemv_on_mma`): Q4_K and Q6_K
/// (round 67), Q4_1 and Q8_0 (round 73: the default model on the H100, against the same
/// build with `RUSTLE_GEMV_MMA_TOKENS=9`, a pass over 8 tokens 1.29 decode steps instead of
/// 2.79, 8 sequences 7,985 tok/s instead of 3,830, prompt-lookup speculation 2.06x instead of
/// 1.49x).
pub const MMA_GEMV_TYPES: [BlockType; 4] = [
    BlockType::Q4K,
    BlockType::Q6K,
    BlockType::Q4_1,
    BlockType::Q8_0,
];

/// What the GEMV on the tensor cores moves and computes over `matrices` matrices of
/// `weights` bytes each: the weights, the tokens' codes and scales, the output (read too
/// where it accumulates). Its `mma`s multiply 8 tokens whatever their number: the flops
/// counted are the tokens'.
fn mma_traffic(weights: usize, matrices: usize, shape: MatmulShape) -> Traffic {
    let [n_tokens, n_in, n_out, _] = shape.sizes();
    let accumulate = shape.accumulates();
    Traffic {
        bytes: (matrices * weights
            + n_tokens * n_in
            + 8 * n_tokens * n_in / 32
            + 4 * n_tokens * n_out * (1 + accumulate as usize)) as u64,
        flops: (2 * matrices * n_tokens * n_in * n_out) as u64,
    }
}

/// A block of `MMA_GEMV_WARPS` warps for every `MMA_GEMV_ROWS` rows, with its warps' sums of
/// `tiles` tiles of rows in shared memory.
pub(super) fn mma_launch(n_out: usize, tiles: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n_out.div_ceil(MMA_GEMV_ROWS) as u32, 1, 1),
        block_dim: (32 * MMA_GEMV_WARPS as u32, 1, 1),
        shared_mem_bytes: mma_gemv_shared_bytes(tiles) as u32,
    }
}

impl Kernels {
    /// `gemv_mma_<type>` and its name, for the types that have it (Q4_1, Q8_0, Q4_K and
    /// Q6_K).
    fn gemv_mma(&self, ty: BlockType) -> Option<(&CudaFunction, &'static str)> {
        match ty {
            BlockType::Q4_1 => Some((&self.gemv_mma_q4_1, "gemv_mma_q4_1")),
            BlockType::Q8_0 => Some((&self.gemv_mma_q8_0, "gemv_mma_q8_0")),
            BlockType::Q4K => Some((&self.gemv_mma_q4_k, "gemv_mma_q4_k")),
            BlockType::Q6K => Some((&self.gemv_mma_q6_k, "gemv_mma_q6_k")),
            _ => None,
        }
    }

    /// `gemv_swiglu_mma_<type>` and its name, for the types that have it.
    fn gemv_swiglu_mma(&self, ty: BlockType) -> Option<(&CudaFunction, &'static str)> {
        match ty {
            BlockType::Q4_1 => Some((&self.gemv_swiglu_mma_q4_1, "gemv_swiglu_mma_q4_1")),
            BlockType::Q8_0 => Some((&self.gemv_swiglu_mma_q8_0, "gemv_swiglu_mma_q8_0")),
            BlockType::Q4K => Some((&self.gemv_swiglu_mma_q4_k, "gemv_swiglu_mma_q4_k")),
            BlockType::Q6K => Some((&self.gemv_swiglu_mma_q6_k, "gemv_swiglu_mma_q6_k")),
            _ => None,
        }
    }
}
