//! The twins of `gpu-kernels/src/gemv_experts.rs`: a mixture of experts' grouped GEMVs,
//! each run of pairs (`kernel_args::Runs`) through its expert's matrix of the stack, as the
//! dense GEMVs' twins compute it (`quant::gemv_codes`, `ops::gemv_bf16`).

use super::ops::{gemv_bf16, gemv_swiglu_bf16};
use super::quant::{BlocksRef, gemv_codes, gemv_swiglu_codes};
use crate::kernel_args::{Blocks, MatmulShape, Runs};
use crate::weights::blocks::BlockType;

/// Each run j below the grid's `min(n_experts, pairs)`: its expert and pairs.
fn runs(r: Runs<&[u32]>, pairs: usize) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> {
    let n = r.expert.len().min(pairs);
    (0..n).map(move |j| {
        let range = r.start[j] as usize..r.start[j + 1] as usize;
        (r.expert[j] as usize, range)
    })
}

/// `gemv_experts_<type>`'s and `gemv_swiglu_experts_<type>`'s work for one type: run by run,
/// `gemv_codes` (or its SwiGLU) of the run's pairs with its expert's matrices (`w` the gate
/// with `w_up`).
fn experts_codes<'a>(
    out: &mut [f32],
    (codes, scales): (&[u8], &[f32]),
    (ty, w, w_up): (BlockType, &'a [u8], Option<&'a [u8]>),
    r: Runs<&[u32]>,
    shape: MatmulShape,
) {
    let [pairs, n_in, n_out, out_stride] = shape.sizes();
    let matrix = n_out * ty.row_bytes(n_in);
    let blocks = |w: &'a [u8], e: usize| -> BlocksRef<'a> {
        Blocks {
            ty,
            bytes: &w[e * matrix..(e + 1) * matrix],
            row_scales: None,
        }
    };
    for (e, p) in runs(r, pairs) {
        let (out, codes, scales) = (
            &mut out[p.start * out_stride..p.end * out_stride],
            &codes[p.start * n_in..p.end * n_in],
            &scales[p.start * n_in / 16..p.end * n_in / 16],
        );
        let shape = MatmulShape::new(p.len(), n_in, n_out, out_stride, false);
        match w_up {
            None => gemv_codes(out, codes, scales, blocks(w, e), None, shape),
            Some(up) => gemv_swiglu_codes(out, codes, scales, blocks(w, e), blocks(up, e), shape),
        }
    }
}

/// Grouped GEMV twins by kernel name, each `experts_codes` of its type.
macro_rules! experts_twins {
    ($($ty:ident => $gemv:ident, $swiglu:ident;)*) => {$(
        #[doc = concat!("`gemv_codes` over each run's `", stringify!($ty), "` expert.")]
        pub fn $gemv(
            out: &mut [f32],
            codes: &[u8],
            scales: &[f32],
            w: &[u8],
            runs: Runs<&[u32]>,
            shape: MatmulShape,
        ) {
            experts_codes(out, (codes, scales), (BlockType::$ty, w, None), runs, shape)
        }

        #[doc = concat!("`gemv_swiglu_codes` over each run's `", stringify!($ty), "` expert.")]
        pub fn $swiglu(
            out: &mut [f32],
            codes: &[u8],
            scales: &[f32],
            w_gate: &[u8],
            w_up: &[u8],
            runs: Runs<&[u32]>,
            shape: MatmulShape,
        ) {
            let w = (BlockType::$ty, w_gate, Some(w_up));
            experts_codes(out, (codes, scales), w, runs, shape)
        }
    )*};
}

experts_twins! {
    Q4_0 => gemv_experts_q4_0, gemv_swiglu_experts_q4_0;
    Q4_1 => gemv_experts_q4_1, gemv_swiglu_experts_q4_1;
    Q5_0 => gemv_experts_q5_0, gemv_swiglu_experts_q5_0;
    Q5_1 => gemv_experts_q5_1, gemv_swiglu_experts_q5_1;
    Q8_0 => gemv_experts_q8_0, gemv_swiglu_experts_q8_0;
    Q4K => gemv_experts_q4_k, gemv_swiglu_experts_q4_k;
    Q5K => gemv_experts_q5_k, gemv_swiglu_experts_q5_k;
    Q6K => gemv_experts_q6_k, gemv_swiglu_experts_q6_k;
}

// The tensor cores' grouped GEMVs compute the same sums (`quant_mma.rs`'s twins are
// `gemv_codes` too).
experts_twins! {
    Q4_1 => gemv_experts_mma_q4_1, gemv_swiglu_experts_mma_q4_1;
    Q8_0 => gemv_experts_mma_q8_0, gemv_swiglu_experts_mma_q8_0;
    Q4K => gemv_experts_mma_q4_k, gemv_swiglu_experts_mma_q4_k;
    Q6K => gemv_experts_mma_q6_k, gemv_swiglu_experts_mma_q6_k;
}

/// `gemv_bf16` of each run's pairs, a pair at a time, with its expert's matrix.
///
/// - `out`: `[pairs, n_out]`; `x`: `[pairs, n_in]`; `w`: `[n_experts, n_out, n_in]` bf16.
pub fn gemv_experts_bf16(
    out: &mut [f32],
    x: &[f32],
    w: &[u16],
    runs: Runs<&[u32]>,
    shape: MatmulShape,
) {
    let [pairs, n_in, n_out, _] = shape.sizes();
    for (e, range) in self::runs(runs, pairs) {
        let w = &w[e * n_out * n_in..(e + 1) * n_out * n_in];
        for p in range {
            let (out, x) = (
                &mut out[p * n_out..(p + 1) * n_out],
                &x[p * n_in..(p + 1) * n_in],
            );
            gemv_bf16(out, x, w, None, n_in, false);
        }
    }
}

/// `gemv_swiglu_bf16` of each run's pairs, a pair at a time, with its expert's gate and up.
pub fn gemv_swiglu_experts_bf16(
    out: &mut [f32],
    x: &[f32],
    w_gate: &[u16],
    w_up: &[u16],
    runs: Runs<&[u32]>,
    shape: MatmulShape,
) {
    let [pairs, n_in, n_out, _] = shape.sizes();
    let matrix = n_out * n_in;
    for (e, range) in self::runs(runs, pairs) {
        let (gate, up) = (
            &w_gate[e * matrix..(e + 1) * matrix],
            &w_up[e * matrix..(e + 1) * matrix],
        );
        for p in range {
            let (out, x) = (
                &mut out[p * n_out..(p + 1) * n_out],
                &x[p * n_in..(p + 1) * n_in],
            );
            gemv_swiglu_bf16(out, x, gate, up, n_in);
        }
    }
}

/// x rounded to bf16 and back, as the tensor cores' grouped GEMVs take their activations.
fn bf16_rounded(x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| half::bf16::from_f32(v).to_f32())
        .collect()
}

/// `gemv_experts_bf16` of x rounded to bf16: the tensor cores' grouped GEMV multiplies the
/// weights by bf16 activations (`gemv_mma_bf16_pass`).
pub fn gemv_experts_mma_bf16(
    out: &mut [f32],
    x: &[f32],
    w: &[u16],
    runs: Runs<&[u32]>,
    shape: MatmulShape,
) {
    gemv_experts_bf16(out, &bf16_rounded(x), w, runs, shape)
}

/// `gemv_swiglu_experts_bf16` of x rounded to bf16 (as `gemv_experts_mma_bf16`).
pub fn gemv_swiglu_experts_mma_bf16(
    out: &mut [f32],
    x: &[f32],
    w_gate: &[u16],
    w_up: &[u16],
    runs: Runs<&[u32]>,
    shape: MatmulShape,
) {
    gemv_swiglu_experts_bf16(out, &bf16_rounded(x), w_gate, w_up, runs, shape)
}
