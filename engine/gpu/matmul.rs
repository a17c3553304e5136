//! A linear layer run as its plan says (`plan.rs`): the input made into the form the kernel
//! reads unless the kernel before made it already, the matrix dequantized where the plan
//! says, then the kernel's launches.

use cudarc::driver::CudaSlice;

use super::context::Gpu;
use super::kernels::gemm_mma::Bf16Operands;
use super::kernels::gemm_wgmma::Fp8Operands;
use super::kernels::{In, Out};
use super::matrix::{BlockPart, GpuMatrix, MatrixData, row_runs};
use super::plan::{Form, Kernel, Plan};
use crate::error::Result;
use crate::gpu::kernels::gemm_skinny::SKINNY_MAX_TOKENS;
use crate::kernel_args::MatmulShape;
use crate::tiles::QUANT_MAX_TOKENS;
use crate::weights::blocks::BlockType;

/// What the scratch holds of a matmul's input besides, or instead of, its f32 rows: the
/// kernel that made the input may have written it in the form the matmul reads too (a norm
/// rounding for the tensor cores, or making the integer GEMV's codes), and a matmul leaves
/// the form it read for a second matmul on the same input (up, after gate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// The f32 rows were written (a norm that makes the codes alone leaves them unwritten).
    pub rows: bool,
    /// The input in this form too, in the scratch (never `Form::F32`).
    pub copy: Option<Form>,
}

impl Held {
    /// The f32 rows alone.
    pub const ROWS: Held = Held {
        rows: true,
        copy: None,
    };

    /// The f32 rows and `form`'s copy.
    pub fn rows_and(form: Form) -> Held {
        Held {
            rows: true,
            copy: Some(form),
        }
    }

    /// `form`'s copy alone.
    pub fn only(form: Form) -> Held {
        Held {
            rows: false,
            copy: Some(form),
        }
    }
}

/// A matmul's input: `[n, n_in]` f32 rows, and what `held` says of them.
pub struct Input<'a> {
    pub rows: In<'a, f32>,
    pub held: Held,
}

/// Buffers a linear layer of several tokens needs besides its input and output, allocated
/// once for the largest pass.
pub struct MatmulScratch {
    /// `[max_tokens, widest input]` the input rounded to bf16 for the tensor cores
    pub x_bf16: CudaSlice<u16>,
    /// `[QUANT_MAX_TOKENS, widest input]` i8: the input as the integer GEMV's 8-bit codes
    pub codes: CudaSlice<u8>,
    /// `[QUANT_MAX_TOKENS, widest input / 32][2]`: the codes' scales, (d, d times the
    /// group's sum of codes)
    pub code_scales: CudaSlice<f32>,
    /// `[max_tokens, widest input]` e4m3 and `[max_tokens]` scales: the input of fp8's
    /// tensor-core GEMM; `None` where no matrix takes it
    pub x_fp8: Option<(CudaSlice<u8>, CudaSlice<f32>)>,
    /// `[largest layer matrix held in blocks]` bf16: such a matrix dequantized for the
    /// tensor cores (`Plan::dequantize`); `None` when none is
    pub w_bf16: Option<CudaSlice<u16>>,
    /// The split sums of the split kernels (skinny, `gemm_<type>`, the warpgroup GEMMs),
    /// `[k_splits, n, n_out]` for the largest any plan makes
    pub parts: CudaSlice<f32>,
}

impl MatmulScratch {
    /// `out = x w^T + bias` for the rows of `x`, as `plan` says. Returns what the scratch
    /// holds of `x` after it: the form the kernel read it in, for a second matmul on the
    /// same input.
    pub fn matmul(
        &mut self,
        g: &Gpu,
        out: &mut Out<f32>,
        x: &Input,
        w: &GpuMatrix,
        bias: Option<&In<f32>>,
        plan: &Plan,
    ) -> Result<Held> {
        let held = self.make_input(g, x, w.n_in, plan)?;
        self.launch(g, out, x, w, plan, (bias, false))?;
        Ok(held)
    }

    /// `out += x w^T` (a residual add) as `plan` says: in the kernel where the plan's
    /// kernel can add in place, else written into `tmp` (`[n, n_out]` or more) and added
    /// by `residual_add_f32`.
    pub fn add_matmul(
        &mut self,
        g: &Gpu,
        out: &mut Out<f32>,
        x: &Input,
        w: &GpuMatrix,
        plan: &Plan,
        tmp: &mut Out<f32>,
    ) -> Result<()> {
        self.make_input(g, x, w.n_in, plan)?;
        if plan.adds_in_place() {
            return self.launch(g, out, x, w, plan, (None, true));
        }
        let tmp = &mut tmp.slice_mut(..out.len());
        self.launch(g, tmp, x, w, plan, (None, false))?;
        g.residual_add_f32(out, &tmp.as_view())
    }

    /// Makes `x` into the form `plan` reads, unless the kernel before made it.
    fn make_input(&mut self, g: &Gpu, x: &Input, n_in: usize, plan: &Plan) -> Result<Held> {
        let (form, n) = (plan.input, x.rows.len() / n_in);
        if form == Form::F32 || x.held.copy == Some(form) {
            assert!(
                form != Form::F32 || x.held.rows,
                "the f32 rows were not written"
            );
            return Ok(match form {
                Form::F32 => x.held,
                _ => Held {
                    rows: x.held.rows,
                    copy: Some(form),
                },
            });
        }
        assert!(
            x.held.rows,
            "{form:?} made from f32 rows that were not written"
        );
        let len = n * n_in;
        let rows = &x.rows.slice(..len);
        match form {
            Form::Bf16 => g.f32_to_bf16(&mut self.x_bf16.slice_mut(..len), rows)?,
            Form::Codes => g.quantize_q8_f32(
                &mut self.codes.slice_mut(..len),
                &mut self.code_scales.slice_mut(..len / 16),
                rows,
                len,
            )?,
            Form::E4m3 => {
                let (codes, scales) = self.x_fp8.as_mut().expect("the plan checked x_fp8");
                g.quantize_fp8_f32(
                    &mut codes.slice_mut(..len),
                    &mut scales.slice_mut(..n),
                    rows,
                    n,
                    n_in,
                )?
            }
            Form::F32 => unreachable!("f32 is made by the kernel before"),
        }
        Ok(Held::rows_and(form))
    }

    /// The plan's kernel, on the input `make_input` made: `out (+)= x w^T + bias`, added
    /// to what `out` holds when `accumulate`.
    fn launch(
        &mut self,
        g: &Gpu,
        out: &mut Out<f32>,
        x: &Input,
        w: &GpuMatrix,
        plan: &Plan,
        (bias, accumulate): (Option<&In<f32>>, bool),
    ) -> Result<()> {
        let n_in = w.n_in;
        let n = x.rows.len() / n_in;
        match (plan.kernel, &w.data) {
            (Kernel::GemvBf16, MatrixData::Bf16(m)) => {
                g.gemv_bf16(out, &x.rows, &m.as_view(), bias, n_in, accumulate)
            }
            (Kernel::GemvBlocks, MatrixData::Blocks(parts)) => {
                self.gemv_blocks(g, out, x, parts, w, (bias, accumulate))
            }
            (Kernel::GemmBlocks { .. } | Kernel::WgmmaBlocks(_), MatrixData::Blocks(_)) => {
                self.gemm_blocks(g, out, w, n, plan.kernel, (bias, accumulate))
            }
            (Kernel::WgmmaFp8(tiles), _) => {
                let w = w
                    .as_fp8()
                    .expect("the plan took fp8's tensor cores for fp8");
                let (codes, scales) = self.x_fp8.as_ref().expect("the plan checked x_fp8");
                let w_scales = w.scales.as_ref().expect("fp8 has row scales");
                let ops = Fp8Operands {
                    x: codes.slice(..n * n_in),
                    x_scales: scales.slice(..n),
                    w: w.bytes.as_view(),
                    w_scales: w_scales.as_view(),
                    bias: bias.map(|b| b.slice(..)),
                };
                let parts = &mut self.parts.as_view_mut();
                g.gemm_wgmma_fp8_planned(tiles, out, ops, n_in, parts, accumulate)
            }
            (Kernel::Skinny { .. } | Kernel::WgmmaBf16(_) | Kernel::MmaBf16(_), _) => {
                self.dequantize(g, w, plan)?;
                self.gemm_bf16(g, out, w, n, plan.kernel, (bias, accumulate))
            }
            (kernel, _) => unreachable!("{kernel:?} for this matrix: the plan never makes it"),
        }
    }

    /// `out (+)= x w^T + bias` through the quantized GEMV: `QUANT_MAX_TOKENS` tokens a
    /// launch, one launch per run of rows of one type (or one for two runs a kernel takes
    /// together). For the GGUF types the tokens are made 8-bit codes first, once for all
    /// the runs (where the input's maker has not); fp8 multiplies the floats.
    fn gemv_blocks(
        &mut self,
        g: &Gpu,
        out: &mut Out<f32>,
        x: &Input,
        parts: &[BlockPart],
        w: &GpuMatrix,
        (bias, accumulate): (Option<&In<f32>>, bool),
    ) -> Result<()> {
        let (n_in, n_out) = (w.n_in, w.n_out);
        let n = x.rows.len() / n_in;
        let in_codes = parts.iter().any(|p| p.ty != BlockType::Fp8);
        // The codes of up to `QUANT_MAX_TOKENS` tokens were made for the plan (its input).
        let made = n <= QUANT_MAX_TOKENS;
        for first in (0..n).step_by(QUANT_MAX_TOKENS) {
            let tokens = (n - first).min(QUANT_MAX_TOKENS);
            let rows = x.rows.slice(first * n_in..(first + tokens) * n_in);
            let (len, groups) = (tokens * n_in, tokens * n_in / 16);
            if in_codes && !made {
                let (codes, scales) = (&mut self.codes, &mut self.code_scales);
                g.quantize_q8_f32(
                    &mut codes.slice_mut(..len),
                    &mut scales.slice_mut(..groups),
                    &rows,
                    len,
                )?;
            }
            let (codes, scales) = (self.codes.slice(..len), self.code_scales.slice(..groups));
            // Two runs whose pair of types one kernel takes: one launch.
            if let [a, b] = parts
                && g.kernels.two_types(a.ty, b.ty).is_some()
            {
                let start = first * n_out;
                g.gemv_codes_two(
                    &mut out.slice_mut(start..start + tokens * n_out),
                    &codes,
                    &scales,
                    (&a.view(), &b.view()),
                    bias,
                    MatmulShape::new(tokens, n_in, n_out, n_out, accumulate),
                )?;
                continue;
            }
            for (row, p) in row_runs(parts) {
                let start = first * n_out + row;
                let out = &mut out.slice_mut(start..start + (tokens - 1) * n_out + p.rows);
                let bias = bias.map(|b| b.slice(row..row + p.rows));
                let (w, bias) = (&p.view(), bias.as_ref());
                let shape = MatmulShape::new(tokens, n_in, p.rows, n_out, accumulate);
                match &p.scales {
                    Some(_) => g.gemv_blocks(out, &rows, w, bias, shape)?,
                    None => g.gemv_codes(out, &codes, &scales, w, bias, shape)?,
                }
            }
        }
        Ok(())
    }

    /// `out (+)= x w^T + bias` for `n` tokens rounded into `x_bf16`, through `gemm_<type>`
    /// or `gemm_wgmma_<type>`: a launch per run of rows of one type; a split reduction
    /// leaves every run's parts in `parts`, which one `gemm_skinny_reduce_f32` adds for the
    /// matrix.
    fn gemm_blocks(
        &mut self,
        g: &Gpu,
        out: &mut Out<f32>,
        w: &GpuMatrix,
        n: usize,
        kernel: Kernel,
        (bias, accumulate): (Option<&In<f32>>, bool),
    ) -> Result<()> {
        let MatrixData::Blocks(parts) = &w.data else {
            unreachable!("gemm_blocks runs the blocks' GEMMs")
        };
        let (n_in, n_out) = (w.n_in, w.n_out);
        let splits = match kernel {
            Kernel::GemmBlocks { splits } => splits,
            Kernel::WgmmaBlocks(tiles) => tiles.k_splits,
            _ => unreachable!("gemm_blocks runs the blocks' GEMMs"),
        };
        let x = &self.x_bf16.slice(..n * n_in);
        for (row, p) in row_runs(parts) {
            let w = &p.view();
            let last = row + (n - 1) * n_out + p.rows;
            let (out, bias, accumulate) = match splits {
                1 => (
                    &mut out.slice_mut(row..last),
                    bias.map(|b| b.slice(row..row + p.rows)),
                    accumulate,
                ),
                _ => {
                    let end = last + (splits - 1) * n * n_out;
                    (&mut self.parts.slice_mut(row..end), None, false)
                }
            };
            let bias = bias.as_ref();
            let shape = MatmulShape::new(n, n_in, p.rows, n_out, accumulate);
            match kernel {
                Kernel::WgmmaBlocks(tiles) => g.gemm_wgmma_blocks(out, x, w, bias, shape, tiles)?,
                _ => g.gemm_blocks(out, x, w, bias, shape, splits)?,
            }
        }
        if splits == 1 {
            return Ok(());
        }
        let parts = &self.parts.slice(..splits * n * n_out);
        g.gemm_skinny_reduce_f32(
            &mut out.slice_mut(..n * n_out),
            parts,
            bias,
            n_out,
            accumulate,
        )
    }

    /// Dequantizes a matrix held in blocks into `w_bf16`, where the plan reads it so.
    fn dequantize(&mut self, g: &Gpu, w: &GpuMatrix, plan: &Plan) -> Result<()> {
        let MatrixData::Blocks(parts) = &w.data else {
            return Ok(());
        };
        assert!(plan.dequantize, "{:?} reads bf16 weights", plan.kernel);
        let scratch = self.w_bf16.as_mut().expect("a bf16 scratch for blocks");
        for (row, p) in row_runs(parts) {
            let out = &mut scratch.slice_mut(row * w.n_in..(row + p.rows) * w.n_in);
            // SAFETY: no row list: the kernel reads the part's own rows in order.
            unsafe { g.dequant_blocks(Some(out), None, &p.view(), None, p.rows, w.n_in) }?;
        }
        Ok(())
    }

    /// The bf16 tensor-core GEMMs of `n` tokens rounded into `x_bf16`, over the matrix's own
    /// bf16 or its blocks dequantized into `w_bf16`: the skinny kernel (`SKINNY_MAX_TOKENS`
    /// tokens a launch), or the warpgroup or `mma` GEMM, which add into `out` only through a
    /// split's in-order sum.
    fn gemm_bf16(
        &mut self,
        g: &Gpu,
        out: &mut Out<f32>,
        w: &GpuMatrix,
        n: usize,
        kernel: Kernel,
        (bias, accumulate): (Option<&In<f32>>, bool),
    ) -> Result<()> {
        let (n_in, n_out) = (w.n_in, w.n_out);
        let weights = match &w.data {
            MatrixData::Bf16(m) => m.as_view(),
            MatrixData::Blocks(_) => {
                let scratch = self.w_bf16.as_ref().expect("dequantized just before");
                scratch.slice(..n_out * n_in)
            }
        };
        // The operands of tokens `rows`.
        let ops = |rows: std::ops::Range<usize>| Bf16Operands {
            x: self.x_bf16.slice(rows.start * n_in..rows.end * n_in),
            w: weights.slice(..),
            bias: bias.map(|b| b.slice(..)),
        };
        let parts = &mut self.parts.as_view_mut();
        match kernel {
            Kernel::Skinny { splits } => {
                for first in (0..n).step_by(SKINNY_MAX_TOKENS) {
                    let rows = first..(first + SKINNY_MAX_TOKENS).min(n);
                    let out = &mut out.slice_mut(rows.start * n_out..rows.end * n_out);
                    g.gemm_skinny_planned(splits, out, ops(rows), n_in, accumulate, parts)?;
                }
                Ok(())
            }
            Kernel::WgmmaBf16(tiles) => {
                g.gemm_wgmma_planned(tiles, out, ops(0..n), n_in, parts, accumulate)
            }
            Kernel::MmaBf16(tiles) => {
                assert!(!accumulate, "gemm_mma_bf16 writes its output");
                g.gemm_mma_planned(tiles, out, ops(0..n), n_in)
            }
            _ => unreachable!("gemm_bf16 runs the bf16 GEMMs"),
        }
    }
}
