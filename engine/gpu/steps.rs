//! The forward pass's steps that are more than one launch wrapper: the embedding lookup of
//! either matrix format, the norms that make a matmul's input in the form its plan reads,
//! and the MLP's gate, up and SwiGLU, fused where one kernel takes them.

use cudarc::driver::CudaSlice;

use super::context::Gpu;
use super::kernels::{In, Out};
use super::matmul::{Held, Input, MatmulScratch};
use super::matrix::{GpuMatrix, MatrixData};
use super::plan::{Caps, Form, Plan, Rules};
use super::weights::GpuMlp;
use crate::config::Activation;
use crate::error::Result;
use crate::kernel_args::MatmulShape;
use crate::weights::blocks::BlockType;

/// The copy a kernel that makes a matmul input writes besides its f32 rows: bf16 where the
/// pass rounds for the tensor cores (a GEMV among the readers then makes its own codes
/// from the f32 rows, as it would at any token count: the batch-invariant mode needs it);
/// the integer GEMV's codes (instead of the rows) where every matmul that reads the input
/// takes them; none otherwise. `inputs`: the forms those matmuls' plans read.
pub fn copy_for(rules: &Rules, n: usize, inputs: &[Form]) -> Option<Form> {
    if rules.rounds(n) {
        return Some(Form::Bf16);
    }
    inputs
        .iter()
        .all(|&f| f == Form::Codes)
        .then_some(Form::Codes)
}

/// `x` `[n, dim]` = the rows of `table` that `tokens` (`[n]`) name, in f32: a bf16 table's
/// gather, or a table of blocks dequantized row by row.
pub fn embed(g: &Gpu, x: &mut Out<f32>, table: &GpuMatrix, tokens: &In<u32>) -> Result<()> {
    let dim = table.n_in;
    // SAFETY: every token id is inside the vocabulary: the engine and the runner check ids
    // on the host before a batch is built (padding rows use id 0).
    match &table.data {
        MatrixData::Bf16(t) => unsafe { g.embedding_bf16(x, &t.as_view(), tokens, dim) },
        MatrixData::Blocks(parts) => {
            let p = &parts[0];
            unsafe { g.dequant_blocks(None, Some(x), &p.view(), Some(tokens), tokens.len(), dim) }
        }
    }
}

/// `xb = rmsnorm(x) * weight` (`[n, dim]` each), with `copy` (`copy_for`): rounded to bf16
/// into the scratch in the same launch, or made the integer GEMV's codes there instead of
/// `xb` (which it leaves unwritten), or `xb` alone.
pub fn rmsnorm(
    g: &Gpu,
    mm: &mut MatmulScratch,
    xb: &mut Out<f32>,
    x: &In<f32>,
    weight: &In<f32>,
    eps: f32,
    copy: Option<Form>,
) -> Result<Held> {
    let (len, dim) = (x.len(), weight.len());
    match copy {
        Some(Form::Bf16) => {
            let xb_bf16 = &mut mm.x_bf16.slice_mut(..len);
            g.rmsnorm_f32_bf16(xb, xb_bf16, x, weight, eps, dim)?;
            Ok(Held::rows_and(Form::Bf16))
        }
        Some(Form::Codes) => {
            let (codes, scales) = (&mut mm.codes, &mut mm.code_scales);
            let (codes, scales) = (
                &mut codes.slice_mut(..len),
                &mut scales.slice_mut(..len / 16),
            );
            g.rmsnorm_q8_f32(codes, scales, x, weight, eps, dim)?;
            Ok(Held::only(Form::Codes))
        }
        _ => {
            g.rmsnorm_f32(xb, x, weight, eps, dim)?;
            Ok(Held::ROWS)
        }
    }
}

/// How a layer's gate, up and SwiGLU run for `n` tokens.
#[derive(Clone, Copy, Debug)]
pub enum GateUp {
    /// `gemv_swiglu_bf16`: one token over bf16 weights.
    Bf16,
    /// `gemv_swiglu_<type>`: gate and up of one GGUF type, on their input's codes.
    Codes(BlockType),
    /// `gemv_swiglu_fp8`: fp8 gate and up.
    Fp8,
    /// The two matmuls on their plans, then `swiglu_f32` or `geglu_f32` as `act` says
    /// (rounding its output for the down projection's tensor cores where the pass rounds).
    Two {
        gate: Plan,
        up: Plan,
        act: Activation,
    },
}

impl GateUp {
    /// One fused GEMV for tokens kept in f32 (a token over bf16 or fp8; up to
    /// `Rules::gemv_tokens` over gate and up of one GGUF type), else the two matmuls. The
    /// fused GEMVs are SwiGLU's: another activation (Gemma 3's GeGLU) takes the two matmuls.
    pub fn plan(caps: &Caps, rules: &Rules, w: &GpuMlp, n: usize, act: Activation) -> GateUp {
        if !rules.rounds(n) && act == Activation::Silu {
            if n == 1 && w.gate.as_bf16().is_some() && w.up.as_bf16().is_some() {
                return GateUp::Bf16;
            }
            if let (MatrixData::Blocks(gate), MatrixData::Blocks(up)) = (&w.gate.data, &w.up.data)
                && let ([gate], [up]) = (gate.as_slice(), up.as_slice())
                && gate.ty == up.ty
                && gate.ty != BlockType::Fp8
            {
                return GateUp::Codes(gate.ty);
            }
            if w.gate.as_fp8().is_some() && w.up.as_fp8().is_some() {
                return GateUp::Fp8;
            }
        }
        GateUp::Two {
            gate: caps.plan(rules, &w.gate, n),
            up: caps.plan(rules, &w.up, n),
            act,
        }
    }

    /// The forms the plan reads its input in: what the norm before it makes.
    pub fn inputs(&self) -> Vec<Form> {
        match self {
            GateUp::Bf16 | GateUp::Fp8 => vec![Form::F32],
            GateUp::Codes(_) => vec![Form::Codes],
            GateUp::Two { gate, up, .. } => vec![gate.input, up.input],
        }
    }
}

/// The MLP's `[n, ffn_dim]` buffers: the SwiGLU's result and the two matmuls' outputs.
pub struct Mlp<'a, 'b> {
    pub hidden: &'a mut Out<'b, f32>,
    pub gate: &'a mut Out<'b, f32>,
    pub up: &'a mut Out<'b, f32>,
}

/// The MLP `w`'s `hidden = act(x w_gate^T) * (x w_up^T)` as `plan` says (SwiGLU's silu, or
/// GeGLU's GELU), the SwiGLU's output
/// rounded to bf16 too where `copy` asks (`copy_for` of the down projection's plan). Returns
/// what it made of `hidden`.
pub fn swiglu(
    g: &Gpu,
    mm: &mut MatmulScratch,
    out: Mlp,
    x: &Input,
    w: &GpuMlp,
    plan: &GateUp,
    copy: Option<Form>,
) -> Result<Held> {
    let (dim, ffn) = (w.gate.n_in, w.gate.n_out);
    let n = x.rows.len() / dim;
    let Mlp { hidden, gate, up } = out;
    match *plan {
        GateUp::Bf16 => {
            let (w_gate, w_up) = (w.gate.as_bf16(), w.up.as_bf16());
            let (w_gate, w_up) = (w_gate.expect("bf16 gate"), w_up.expect("bf16 up"));
            g.gemv_swiglu_bf16(
                hidden,
                &x.rows,
                &w_gate.as_view(),
                &w_up.as_view(),
                dim,
                ffn,
            )?;
        }
        GateUp::Codes(_) => {
            let (MatrixData::Blocks(w_gate), MatrixData::Blocks(w_up)) = (&w.gate.data, &w.up.data)
            else {
                unreachable!("GateUp::Codes is for blocks")
            };
            let (len, groups) = (n * dim, n * dim / 16);
            if x.held.copy != Some(Form::Codes) {
                let (codes, scales) = (&mut mm.codes, &mut mm.code_scales);
                let (codes, scales) =
                    (&mut codes.slice_mut(..len), &mut scales.slice_mut(..groups));
                g.quantize_q8_f32(codes, scales, &x.rows, len)?;
            }
            g.gemv_swiglu_codes(
                hidden,
                &mm.codes.slice(..len),
                &mm.code_scales.slice(..groups),
                &w_gate[0].view(),
                &w_up[0].view(),
                MatmulShape::new(n, dim, ffn, ffn, false),
            )?;
        }
        GateUp::Fp8 => {
            let (w_gate, w_up) = (w.gate.as_fp8(), w.up.as_fp8());
            let (w_gate, w_up) = (w_gate.expect("fp8 gate"), w_up.expect("fp8 up"));
            let shape = MatmulShape::new(n, dim, ffn, ffn, false);
            g.gemv_swiglu_fp8(hidden, &x.rows, &w_gate.view(), &w_up.view(), shape)?;
        }
        GateUp::Two {
            gate: gate_plan,
            up: up_plan,
            act,
        } => {
            // Up reads the input in the form gate's matmul left it.
            let held = mm.matmul(g, gate, x, &w.gate, None, &gate_plan)?;
            let x = Input {
                rows: x.rows.slice(..),
                held,
            };
            mm.matmul(g, up, &x, &w.up, None, &up_plan)?;
            let (gate, up) = (&gate.as_view(), &up.as_view());
            if copy == Some(Form::Bf16) {
                // The down projection's input, rounded for its tensor cores by the same
                // launch (the matmuls are done with the scratch).
                let bf16 = &mut mm.x_bf16.slice_mut(..n * ffn);
                g.gated(act, hidden, Some(bf16), gate, up)?;
                return Ok(Held::rows_and(Form::Bf16));
            }
            g.gated(act, hidden, None, gate, up)?;
        }
    }
    Ok(Held::ROWS)
}

/// Where a block's output goes: `x` `[n, dim]` the residual stream it is added to, `xb` and
/// `post` `[n, dim]` scratch for the output before its add and normed.
pub struct BlockOut<'a, 'b> {
    pub x: &'a mut Out<'b, f32>,
    pub xb: &'a mut Out<'b, f32>,
    pub post: &'a mut Out<'b, f32>,
}

/// `x += input w^T` (o_proj after attention, down after the MLP), or where the layer has a
/// post-norm (Gemma 3), `x += rmsnorm(input w^T) * norm`.
pub fn add_output(
    g: &Gpu,
    mm: &mut MatmulScratch,
    out: BlockOut,
    input: &Input,
    (w, plan): (&GpuMatrix, &Plan),
    norm: Option<&CudaSlice<f32>>,
    eps: f32,
) -> Result<()> {
    let BlockOut { x, xb, post } = out;
    let Some(norm) = norm else {
        return mm.add_matmul(g, x, input, w, plan, xb);
    };
    mm.matmul(g, xb, input, w, None, plan)?;
    g.rmsnorm_f32(post, &xb.as_view(), &norm.as_view(), eps, w.n_out)?;
    g.residual_add_f32(x, &post.as_view())
}
