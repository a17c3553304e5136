//! The quantized matmul kernels (`gemv_<type>`, `dequant_<type>`, one pair per block type,
//! the GGUF types' GEMV wrapped in `gemv_codes.rs`;
//! `gpu-kernels/src/gemv_quant.rs`): one wrapper for each kind, which picks the type's
//! kernel from the table. The arguments are the kernels', the matrix with its block type
//! (`BlocksIn`).

use cudarc::driver::{CudaFunction, LaunchConfig};

use super::table::Kernels;
use super::{In, Out, aligned16, linear, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::kernel_args::{Blocks, MatmulShape};
use crate::tiles::{
    FP8_PARTS, FP8_SHARED_BYTES, FP8_TILE_ROWS, QUANT_MAX_TOKENS, dequant_in_pieces,
    dequant_shared_bytes,
};
use crate::traffic::Traffic;
use crate::weights::blocks::BlockType;

/// A matrix of quantized rows on the device (`kernel_args::Blocks`): its block type, its
/// bytes, and fp8's row scales.
pub type BlocksIn<'a> = Blocks<In<'a, u8>, In<'a, f32>>;

impl Kernels {
    /// `(gemv_<type>, dequant_<type>)` and their names.
    pub(super) fn quant(
        &self,
        ty: BlockType,
    ) -> (&CudaFunction, &CudaFunction, &'static str, &'static str) {
        match ty {
            BlockType::Q4_0 => (
                &self.gemv_q4_0,
                &self.dequant_q4_0,
                "gemv_q4_0",
                "dequant_q4_0",
            ),
            BlockType::Q4_1 => (
                &self.gemv_q4_1,
                &self.dequant_q4_1,
                "gemv_q4_1",
                "dequant_q4_1",
            ),
            BlockType::Q5_0 => (
                &self.gemv_q5_0,
                &self.dequant_q5_0,
                "gemv_q5_0",
                "dequant_q5_0",
            ),
            BlockType::Q5_1 => (
                &self.gemv_q5_1,
                &self.dequant_q5_1,
                "gemv_q5_1",
                "dequant_q5_1",
            ),
            BlockType::Q8_0 => (
                &self.gemv_q8_0,
                &self.dequant_q8_0,
                "gemv_q8_0",
                "dequant_q8_0",
            ),
            BlockType::Q4K => (
                &self.gemv_q4_k,
                &self.dequant_q4_k,
                "gemv_q4_k",
                "dequant_q4_k",
            ),
            BlockType::Q5K => (
                &self.gemv_q5_k,
                &self.dequant_q5_k,
                "gemv_q5_k",
                "dequant_q5_k",
            ),
            BlockType::Q6K => (
                &self.gemv_q6_k,
                &self.dequant_q6_k,
                "gemv_q6_k",
                "dequant_q6_k",
            ),
            BlockType::Fp8 => (&self.gemv_fp8, &self.dequant_fp8, "gemv_fp8", "dequant_fp8"),
        }
    }
}

/// The checks every quantized GEMV needs of its tokens and output: 1 to `QUANT_MAX_TOKENS`
/// tokens, each with `n_out` columns of `out_stride`.
pub(super) fn check_tokens_out(out: &Out<f32>, shape: MatmulShape) {
    let [n_tokens, _, n_out, out_stride] = shape.sizes();
    assert!(
        (1..=QUANT_MAX_TOKENS).contains(&n_tokens),
        "1..={QUANT_MAX_TOKENS} tokens a launch"
    );
    assert!(n_out <= out_stride && out.len() >= (n_tokens - 1) * out_stride + n_out);
}

/// The checks both kernels need of a matrix of `n_rows` rows of `n_in`: whole, aligned
/// blocks, and scales for fp8.
pub(super) fn check_matrix(gpu: &Gpu, w: &BlocksIn, n_rows: usize, n_in: usize) {
    let (ty, row_scales, w) = (w.ty, w.row_scales.as_ref(), &w.bytes);
    assert!(
        ty.fits(n_in),
        "{ty} rows of {n_in} weights are not whole, aligned blocks"
    );
    assert!(w.len() == n_rows * ty.row_bytes(n_in), "{ty}: matrix bytes");
    assert!(
        aligned16(w, &gpu.stream),
        "{ty}: the matrix must start 16-byte aligned"
    );
    assert!(
        (ty == BlockType::Fp8) == row_scales.is_some(),
        "row scales come with fp8 and only with it"
    );
    assert!(row_scales.is_none_or(|s| s.len() == n_rows));
}

impl Gpu {
    /// `gemv_fp8` (the GGUF types take `gemv_codes`): out (`[n_tokens, out_stride]`, this
    /// matrix's columns `0..n_out`) (+)= x `[n_tokens, n_in]` times w^T (`[n_out]` rows of
    /// `w.ty`, with their scales) + bias `[n_out]`.
    pub fn gemv_blocks(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        w: &BlocksIn,
        bias: Option<&In<f32>>,
        shape: MatmulShape,
    ) -> Result<()> {
        let [n_tokens, n_in, n_out, _] = shape.sizes();
        let accumulate = shape.accumulates();
        let ty = w.ty;
        check_matrix(self, w, n_out, n_in);
        assert!(
            ty == BlockType::Fp8,
            "the GGUF types multiply in integers: gemv_codes"
        );
        self.check_fp8_tokens(out, x, shape);
        assert!(bias.is_none_or(|b| b.len() == n_out));
        // A block of `FP8_PARTS` warps for every 16 rows (`gemv_fp8`).
        let cfg = LaunchConfig {
            grid_dim: (n_out.div_ceil(FP8_TILE_ROWS) as u32, 1, 1),
            block_dim: (32 * FP8_PARTS as u32, 1, 1),
            shared_mem_bytes: FP8_SHARED_BYTES as u32,
        };
        let (func, _, name, _) = self.kernels.quant(ty);
        let traffic = Traffic {
            bytes: (w.bytes.len()
                + 4 * (n_tokens * n_in + n_tokens * n_out * (1 + accumulate as usize))
                + 4 * bias.map_or(0, |b| b.len())
                + 4 * w.row_scales.as_ref().map_or(0, |s| s.len())) as u64,
            flops: (2 * n_tokens * n_in * n_out) as u64,
        };
        let mut b = self.launcher(func);
        b.arg(out)
            .arg(x)
            .arg(&w.bytes)
            .arg_or_null(w.row_scales.as_ref())
            .arg_or_null(bias)
            .arg(&shape);
        // SAFETY: the matrix is whole aligned blocks of its type (checked), x holds the
        // tokens' rows 16-byte aligned, out every token's n_out columns; x and out are
        // different buffers; the weights are read-only.
        self.timed(name, traffic, || unsafe { b.launch(cfg) })
    }

    /// `gemv_swiglu_fp8`: out (`[n_tokens, out_stride]`, columns `0..n_out`) = silu(x
    /// w_gate^T) * (x w_up^T), x `[n_tokens, n_in]`, both matrices `[n_out]` fp8 rows with
    /// their scales; `shape` does not accumulate.
    pub fn gemv_swiglu_fp8(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        w_gate: &BlocksIn,
        w_up: &BlocksIn,
        shape: MatmulShape,
    ) -> Result<()> {
        let [n_tokens, n_in, n_out, _] = shape.sizes();
        for w in [w_gate, w_up] {
            assert!(w.ty == BlockType::Fp8, "gemv_swiglu_fp8 takes fp8 rows");
            check_matrix(self, w, n_out, n_in);
        }
        assert!(!shape.accumulates(), "the SwiGLU overwrites its output");
        self.check_fp8_tokens(out, x, shape);
        // Each fp8 matrix has its scales (`check_matrix`).
        let [gate_scales, up_scales] =
            [w_gate, w_up].map(|w| w.row_scales.as_ref().expect("fp8 row scales"));
        // `gemv_fp8`'s launch, a block for every 8 outputs (their gate and up rows).
        let cfg = LaunchConfig {
            grid_dim: (n_out.div_ceil(FP8_TILE_ROWS / 2) as u32, 1, 1),
            block_dim: (32 * FP8_PARTS as u32, 1, 1),
            shared_mem_bytes: FP8_SHARED_BYTES as u32,
        };
        let traffic = Traffic {
            bytes: (2 * w_gate.bytes.len() + 8 * n_out + 4 * (n_tokens * n_in + n_tokens * n_out))
                as u64,
            flops: (4 * n_tokens * n_in * n_out) as u64,
        };
        let mut b = self.launcher(&self.kernels.gemv_swiglu_fp8);
        b.arg(out).arg(x).arg(&w_gate.bytes).arg(&w_up.bytes);
        b.arg(gate_scales).arg(up_scales).arg(&shape);
        // SAFETY: both matrices are whole aligned fp8 rows with their scales (checked), x
        // holds the tokens' rows 16-byte aligned, out every token's n_out columns; x and out
        // are different buffers; the weights are read-only.
        self.timed("gemv_swiglu_fp8", traffic, || unsafe { b.launch(cfg) })
    }

    /// The checks of the tokens and the output that both fp8 GEMVs need.
    fn check_fp8_tokens(&self, out: &Out<f32>, x: &In<f32>, shape: MatmulShape) {
        let [n_tokens, n_in, ..] = shape.sizes();
        check_tokens_out(out, shape);
        assert!(x.len() == n_tokens * n_in && aligned16(x, &self.stream));
    }

    /// `dequant_<ty>`: rows `rows[r]` (all rows in order for `None`) of w (rows of `w.ty`,
    /// n_in weights each) into `out_f32` (`[n_rows, n_in]`) where given, else into
    /// `out_bf16`.
    ///
    /// # Safety
    /// Every row id is a row of `w` (the kernel does not check: the embedding's token ids
    /// are checked on the host).
    pub unsafe fn dequant_blocks(
        &self,
        out_bf16: Option<&mut Out<u16>>,
        out_f32: Option<&mut Out<f32>>,
        w: &BlocksIn,
        rows: Option<&In<u32>>,
        n_rows: usize,
        n_in: usize,
    ) -> Result<()> {
        let ty = w.ty;
        let w_rows = w.bytes.len() / ty.row_bytes(n_in).max(1);
        check_matrix(self, w, w_rows, n_in);
        assert!(rows.is_some() || n_rows <= w_rows);
        assert!(rows.is_none_or(|r| r.len() == n_rows));
        let n = n_rows * n_in;
        let written = match (&out_f32, &out_bf16) {
            (Some(o), _) => {
                assert!(o.len() >= n);
                4
            }
            (None, Some(o)) => {
                assert!(o.len() >= n);
                2
            }
            (None, None) => panic!("dequant_blocks needs an output"),
        };
        let mut cfg = linear(n / 32);
        // To bf16 the block's groups pass through shared memory (`dequant_blocks`), but for
        // a whole Q8_0 matrix, whose pieces go out straight from the registers.
        let pieces = dequant_in_pieces(ty == BlockType::Q8_0, rows.is_some(), out_f32.is_some());
        if out_f32.is_none() && !pieces {
            cfg.shared_mem_bytes = dequant_shared_bytes(cfg.block_dim.0 as usize) as u32;
        }
        let (_, func, _, name) = self.kernels.quant(ty);
        let traffic = Traffic {
            bytes: (n_rows * ty.row_bytes(n_in) + written * n) as u64,
            flops: 0,
        };
        let (n_rows, n_in) = (u32_of(n_rows, "rows"), u32_of(n_in, "n_in"));
        let mut b = self.launcher(func);
        b.arg_or_null(out_bf16.map(|o| &*o))
            .arg_or_null(out_f32.map(|o| &*o))
            .arg(&w.bytes)
            .arg_or_null(w.row_scales.as_ref())
            .arg_or_null(rows);
        b.arg(&n_rows).arg(&n_in);
        // SAFETY: the matrix checked as above, the output holds n_rows x n_in, and the row
        // ids are rows of w (this function's contract).
        self.timed(name, traffic, || unsafe { b.launch(cfg) })
    }
}
