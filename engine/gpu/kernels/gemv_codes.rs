//! The integer GEMV of the GGUF types (`quantize_q8_f32`, then `gemv_<type>`,
//! `gpu-kernels/src/gemv_codes.rs`).

use cudarc::driver::{CudaFunction, LaunchConfig};

use super::gemv_quant::{BlocksIn, check_matrix, check_tokens_out};
use super::table::Kernels;
use super::{In, Out, aligned16, linear, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::kernel_args::MatmulShape;
use crate::tiles::{
    CODES_MAX_WARPS, CODES_ROWS, STREAM_BARRIER_BYTES, STREAM_MAX_SHARED_BYTES, STREAM_MAX_STAGES,
    codes_shared_bytes, stream_codes_bytes, stream_shared_bytes,
};
use crate::traffic::Traffic;
use crate::weights::blocks::BlockType;

impl Gpu {
    /// `quantize_q8_f32`: x (`[n]`, whole groups of 32) to 8-bit `codes` (`[n]`) and the
    /// groups' `scales` (`[n / 32][2]`: d, d times the sum of the codes).
    pub fn quantize_q8_f32(
        &self,
        codes: &mut Out<u8>,
        scales: &mut Out<f32>,
        x: &In<f32>,
        n: usize,
    ) -> Result<()> {
        assert!(n.is_multiple_of(32), "whole groups of 32");
        assert!(x.len() >= n && codes.len() >= n && scales.len() >= n / 16);
        let traffic = Traffic {
            bytes: (4 * n + n + 8 * (n / 32)) as u64,
            flops: 0,
        };
        let n_arg = u32_of(n, "values");
        let mut b = self.launcher(&self.kernels.quantize_q8_f32);
        b.arg(codes).arg(scales).arg(x).arg(&n_arg);
        // SAFETY: the three buffers hold n values (and n / 32 pairs of scales), whole
        // groups; an output and an input are different buffers (Rust's borrows).
        self.timed("quantize_q8_f32", traffic, || unsafe {
            b.launch(linear(n))
        })
    }

    /// `gemv_<ty>` for the GGUF types: out (`[n_tokens, out_stride]`, this matrix's columns
    /// `0..n_out`) (+)= x w^T + bias `[n_out]`, x as `quantize_q8_f32` left it (`codes`
    /// `[n_tokens, n_in]`, `scales` `[n_tokens, n_in / 32][2]`), w `[n_out]` rows of
    /// `w.ty`. A matrix of `stream_min_rows` rows or more (a decode step's output head)
    /// streams through shared memory (`gemv_stream_<ty>`) where its type has that kernel
    /// (the k-quants) and `stream_plan` finds a launch for it.
    pub fn gemv_codes(
        &self,
        out: &mut Out<f32>,
        codes: &In<u8>,
        scales: &In<f32>,
        w: &BlocksIn,
        bias: Option<&In<f32>>,
        shape: MatmulShape,
    ) -> Result<()> {
        let [n_tokens, n_in, n_out, _] = shape.sizes();
        let ty = w.ty;
        assert!(
            ty != BlockType::Fp8,
            "fp8 multiplies its activations as they are: gemv_fp8 (Gpu::gemv_blocks)"
        );
        if self.gemv_on_mma(ty, n_tokens) {
            return self.gemv_mma(out, codes, scales, w, bias, shape);
        }
        check_matrix(self, w, n_out, n_in);
        self.check_codes(codes, scales, out, shape);
        assert!(bias.is_none_or(|b| b.len() == n_out));
        let stream = (n_out >= self.stream_min_rows)
            .then(|| self.stream_plan(ty, n_tokens, n_in, n_out, false))
            .flatten();
        let (func, name, cfg) = match stream {
            Some((func, name, cfg, _)) => (func, name, cfg),
            None => {
                let (func, _, name, _) = self.kernels.quant(ty);
                let cfg = codes_launch(ty, n_in, n_out.div_ceil(CODES_ROWS));
                (func, name, cfg)
            }
        };
        let traffic = codes_traffic(w.bytes.len(), bias, shape);
        let mut b = self.launcher(func);
        b.arg(out)
            .arg(codes)
            .arg(scales)
            .arg(&w.bytes)
            .arg_or_null(bias);
        b.arg(&shape);
        let stages = stream.map(|(.., stages)| stages);
        if let Some(stages) = &stages {
            b.arg(stages);
        }
        // SAFETY: the matrix is whole aligned blocks of its type (checked), codes and
        // scales hold the tokens' groups 16-byte aligned, out every token's n_out columns
        // and no input; the weights are read-only; a streamed launch's plan fits its
        // kernel (`stream_plan`).
        self.timed(name, traffic, || unsafe { b.launch(cfg) })
    }

    /// `gemv_<a>_<b>`, where this pair has one (`Kernels::two_types`): `gemv_codes` over a
    /// matrix whose first rows are `w_a`, of type `a`, and the rest (to `n_out` in all)
    /// `w_b`, of type `b`, in one launch. The kernel's `n_first` is `w_a`'s rows.
    pub fn gemv_codes_two(
        &self,
        out: &mut Out<f32>,
        codes: &In<u8>,
        scales: &In<f32>,
        (w_a, w_b): (&BlocksIn, &BlocksIn),
        bias: Option<&In<f32>>,
        shape: MatmulShape,
    ) -> Result<()> {
        let [n_tokens, n_in, n_out, out_stride] = shape.sizes();
        let (a, b) = (w_a.ty, w_b.ty);
        if self.gemv_on_mma(a, n_tokens) && self.gemv_on_mma(b, n_tokens) {
            // Each part on the tensor cores, its columns of the output and the bias its own.
            let n_first = w_a.bytes.len() / a.row_bytes(n_in).max(1);
            let part =
                |n_out| MatmulShape::new(n_tokens, n_in, n_out, out_stride, shape.accumulates());
            let bias_a = bias.map(|b| b.slice(..n_first));
            self.gemv_mma(out, codes, scales, w_a, bias_a.as_ref(), part(n_first))?;
            let bias_b = bias.map(|b| b.slice(n_first..));
            let out_b = &mut out.slice_mut(n_first..);
            return self.gemv_mma(
                out_b,
                codes,
                scales,
                w_b,
                bias_b.as_ref(),
                part(n_out - n_first),
            );
        }
        let (func, name) = self
            .kernels
            .two_types(a, b)
            .unwrap_or_else(|| panic!("no GEMV takes {a} rows and {b} rows in one launch"));
        let n_first = w_a.bytes.len() / a.row_bytes(n_in).max(1);
        assert!(0 < n_first && n_first < n_out, "rows of both types");
        check_matrix(self, w_a, n_first, n_in);
        check_matrix(self, w_b, n_out - n_first, n_in);
        self.check_codes(codes, scales, out, shape);
        assert!(bias.is_none_or(|b| b.len() == n_out));
        let blocks = n_first.div_ceil(CODES_ROWS) + (n_out - n_first).div_ceil(CODES_ROWS);
        let cfg = codes_launch(a, n_in, blocks);
        assert_eq!(
            cfg.block_dim,
            codes_launch(b, n_in, blocks).block_dim,
            "both types' blocks the same size"
        );
        let traffic = codes_traffic(w_a.bytes.len() + w_b.bytes.len(), bias, shape);
        let first = u32_of(n_first, "rows");
        let mut l = self.launcher(func);
        l.arg(out)
            .arg(codes)
            .arg(scales)
            .arg(&w_a.bytes)
            .arg(&w_b.bytes)
            .arg_or_null(bias);
        l.arg(&shape).arg(&first);
        // SAFETY: both parts are whole aligned blocks of their types (checked), their blocks
        // the same size (checked); codes and scales hold the tokens' groups 16-byte
        // aligned, out every token's n_out columns and no input; the weights are read-only.
        self.timed(name, traffic, || unsafe { l.launch(cfg) })
    }

    /// `gemv_swiglu_<ty>`: out (`[n_tokens, out_stride]`, columns `0..n_out`) = silu(x
    /// w_gate^T) * (x w_up^T), x as `quantize_q8_f32` left it, both matrices `[n_out]` rows
    /// of one type; `shape` does not accumulate.
    pub fn gemv_swiglu_codes(
        &self,
        out: &mut Out<f32>,
        codes: &In<u8>,
        scales: &In<f32>,
        w_gate: &BlocksIn,
        w_up: &BlocksIn,
        shape: MatmulShape,
    ) -> Result<()> {
        let [n_tokens, n_in, n_out, _] = shape.sizes();
        let ty = w_gate.ty;
        assert!(
            w_up.ty == ty,
            "gate {ty} and up {} rows in one launch",
            w_up.ty
        );
        for w in [w_gate, w_up] {
            check_matrix(self, w, n_out, n_in);
        }
        assert!(!shape.accumulates(), "the SwiGLU overwrites its output");
        self.check_codes(codes, scales, out, shape);
        if self.gemv_on_mma(ty, n_tokens) {
            return self.gemv_swiglu_mma(out, codes, scales, w_gate, w_up, shape);
        }
        let stream = self.stream_plan(ty, n_tokens, n_in, n_out, true);
        let (func, name, cfg) = match stream {
            Some((func, name, cfg, _)) => (func, name, cfg),
            None => {
                let (func, name) = self.kernels.swiglu(ty);
                (func, name, codes_launch(ty, n_in, n_out))
            }
        };
        let traffic = Traffic {
            bytes: (2 * w_gate.bytes.len()
                + n_tokens * n_in
                + 8 * n_tokens * n_in / 32
                + 4 * n_tokens * n_out) as u64,
            flops: (4 * n_tokens * n_in * n_out) as u64,
        };
        let mut b = self.launcher(func);
        b.arg(out)
            .arg(codes)
            .arg(scales)
            .arg(&w_gate.bytes)
            .arg(&w_up.bytes);
        b.arg(&shape);
        let stages = stream.map(|(.., stages)| stages);
        if let Some(stages) = &stages {
            b.arg(stages);
        }
        // SAFETY: both matrices are whole aligned blocks of their type (checked), codes and
        // scales hold the tokens' groups 16-byte aligned, out every token's n_out columns
        // and no input; the weights are read-only; a streamed launch's plan fits its
        // kernel (`stream_plan`).
        self.timed(name, traffic, || unsafe { b.launch(cfg) })
    }

    /// The streamed GEMV for `n_out` rows of `n_in` weights, where this build has it
    /// (sm_90a), `gemv_stream` is on, and the rows are whole 16-byte pieces: the gate and
    /// up matrices' (`gemv_swiglu_stream_<ty>`, with `swiglu`) or one matrix's
    /// (`gemv_stream_<ty>`); the kernel, its name, its launch and its stages. A tile is a
    /// row of each matrix for each of the block's warps, 8 where two such tiles fit in the
    /// block's `stream_bytes` (`stream_one_bytes` for one matrix), else fewer; 2 to
    /// `STREAM_MAX_STAGES` of them on their way. Where its type and warps take one
    /// (`stream_copies_codes`), the block keeps a copy of the `n_tokens` tokens' codes. The
    /// grid is as many blocks as fit on the GPU at once (by their shared memory), or one a
    /// tile.
    fn stream_plan(
        &self,
        ty: BlockType,
        n_tokens: usize,
        n_in: usize,
        n_out: usize,
        swiglu: bool,
    ) -> Option<(&CudaFunction, &'static str, LaunchConfig, u32)> {
        let (func, name) = if swiglu {
            self.kernels.gemv_swiglu_stream(ty)?
        } else {
            self.kernels.gemv_stream(ty)?
        };
        let row_bytes = ty.row_bytes(n_in);
        if !self.gemv_stream || !row_bytes.is_multiple_of(16) {
            return None;
        }
        let (matrices, budget) = if swiglu {
            (2, self.stream_bytes)
        } else {
            (1, self.stream_one_bytes)
        };
        let budget = budget.min(STREAM_MAX_SHARED_BYTES - STREAM_BARRIER_BYTES);
        let warps = [8, 4, 2, 1]
            .into_iter()
            .find(|&w| 2 * matrices * w * row_bytes <= budget)?;
        let slot = matrices * warps * row_bytes;
        let stages = (budget / slot).clamp(2, STREAM_MAX_STAGES);
        let codes = stream_codes_bytes(ty.block_len(), warps, n_tokens, n_in);
        let shared = stream_shared_bytes(stages, slot, codes);
        if shared > STREAM_MAX_SHARED_BYTES {
            return None;
        }
        // An SM has 228 KiB of shared memory, of which the system keeps 1 KiB a block.
        let per_sm = (228 * 1024 / (shared + 1024)).clamp(1, 16);
        let blocks = n_out.div_ceil(warps).min(per_sm * self.sm_count);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (32 * warps as u32, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        Some((func, name, cfg, stages as u32))
    }

    /// The checks of the activations' codes and the output that every integer GEMV needs.
    pub(super) fn check_codes(
        &self,
        codes: &In<u8>,
        scales: &In<f32>,
        out: &Out<f32>,
        shape: MatmulShape,
    ) {
        let [n_tokens, n_in, ..] = shape.sizes();
        check_tokens_out(out, shape);
        assert!(codes.len() >= n_tokens * n_in && aligned16(codes, &self.stream));
        assert!(scales.len() >= n_tokens * n_in / 16 && aligned16(scales, &self.stream));
    }
}

/// What an integer GEMV of one matrix (`weights` bytes) moves and computes: the weights,
/// the tokens' codes and their scales, the output (read too where it accumulates), the bias.
fn codes_traffic(weights: usize, bias: Option<&In<f32>>, shape: MatmulShape) -> Traffic {
    let [n_tokens, n_in, n_out, _] = shape.sizes();
    let accumulate = shape.accumulates();
    Traffic {
        bytes: (weights
            + n_tokens * n_in
            + 8 * n_tokens * n_in / 32
            + 4 * n_tokens * n_out * (1 + accumulate as usize)
            + 4 * bias.map_or(0, |b| b.len())) as u64,
        flops: (2 * n_tokens * n_in * n_out) as u64,
    }
}

/// An integer GEMV's launch over `blocks` blocks: each block's warps split a row's spans
/// (a k-quant span is two groups of 32, the others one), at most `CODES_MAX_WARPS`.
pub(super) fn codes_launch(ty: BlockType, n_in: usize, blocks: usize) -> LaunchConfig {
    let groups_per_span = if ty.block_len() == 256 { 2 } else { 1 };
    let spans = n_in / (32 * groups_per_span);
    let warps = spans.div_ceil(32).clamp(1, CODES_MAX_WARPS);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (32 * warps as u32, 1, 1),
        shared_mem_bytes: codes_shared_bytes(warps) as u32,
    }
}

impl Kernels {
    /// `gemv_swiglu_stream_<type>` and its name, where the build has it (sm_90a), for the
    /// GGUF types.
    pub(super) fn gemv_swiglu_stream(
        &self,
        ty: BlockType,
    ) -> Option<(&CudaFunction, &'static str)> {
        let (func, name) = match ty {
            BlockType::Q4_0 => (&self.gemv_swiglu_stream_q4_0, "gemv_swiglu_stream_q4_0"),
            BlockType::Q4_1 => (&self.gemv_swiglu_stream_q4_1, "gemv_swiglu_stream_q4_1"),
            BlockType::Q5_0 => (&self.gemv_swiglu_stream_q5_0, "gemv_swiglu_stream_q5_0"),
            BlockType::Q5_1 => (&self.gemv_swiglu_stream_q5_1, "gemv_swiglu_stream_q5_1"),
            BlockType::Q8_0 => (&self.gemv_swiglu_stream_q8_0, "gemv_swiglu_stream_q8_0"),
            BlockType::Q4K => (&self.gemv_swiglu_stream_q4_k, "gemv_swiglu_stream_q4_k"),
            BlockType::Q5K => (&self.gemv_swiglu_stream_q5_k, "gemv_swiglu_stream_q5_k"),
            BlockType::Q6K => (&self.gemv_swiglu_stream_q6_k, "gemv_swiglu_stream_q6_k"),
            BlockType::Fp8 => return None,
        };
        func.as_ref().map(|f| (f, name))
    }

    /// `gemv_stream_<type>` and its name, where the build has it (sm_90a), for the
    /// k-quants: the 32-weight types' `gemv_<type>` already reads a long matrix near the
    /// read bandwidth (`gemv_stream.rs`).
    pub(super) fn gemv_stream(&self, ty: BlockType) -> Option<(&CudaFunction, &'static str)> {
        let (func, name) = match ty {
            BlockType::Q4K => (&self.gemv_stream_q4_k, "gemv_stream_q4_k"),
            BlockType::Q5K => (&self.gemv_stream_q5_k, "gemv_stream_q5_k"),
            BlockType::Q6K => (&self.gemv_stream_q6_k, "gemv_stream_q6_k"),
            _ => return None,
        };
        func.as_ref().map(|f| (f, name))
    }

    /// `gemv_<a>_<b>` and its name, for the pairs of types that have one: a layer's q and
    /// k in Q4_K or Q5_K beside its v in Q6_K (Q4_K_M's and Q5_K_M's mixes).
    pub fn two_types(&self, a: BlockType, b: BlockType) -> Option<(&CudaFunction, &'static str)> {
        match (a, b) {
            (BlockType::Q4K, BlockType::Q6K) => Some((&self.gemv_q4_k_q6_k, "gemv_q4_k_q6_k")),
            (BlockType::Q5K, BlockType::Q6K) => Some((&self.gemv_q5_k_q6_k, "gemv_q5_k_q6_k")),
            _ => None,
        }
    }

    /// `gemv_swiglu_<type>` and its name, for the GGUF types.
    fn swiglu(&self, ty: BlockType) -> (&CudaFunction, &'static str) {
        match ty {
            BlockType::Q4_0 => (&self.gemv_swiglu_q4_0, "gemv_swiglu_q4_0"),
            BlockType::Q4_1 => (&self.gemv_swiglu_q4_1, "gemv_swiglu_q4_1"),
            BlockType::Q5_0 => (&self.gemv_swiglu_q5_0, "gemv_swiglu_q5_0"),
            BlockType::Q5_1 => (&self.gemv_swiglu_q5_1, "gemv_swiglu_q5_1"),
            BlockType::Q8_0 => (&self.gemv_swiglu_q8_0, "gemv_swiglu_q8_0"),
            BlockType::Q4K => (&self.gemv_swiglu_q4_k, "gemv_swiglu_q4_k"),
            BlockType::Q5K => (&self.gemv_swiglu_q5_k, "gemv_swiglu_q5_k"),
            BlockType::Q6K => (&self.gemv_swiglu_q6_k, "gemv_swiglu_q6_k"),
            BlockType::Fp8 => panic!("fp8 multiplies its activations as they are: gemv_swiglu_fp8"),
        }
    }
}
