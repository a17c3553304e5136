//! The CPU twins of `gpu-kernels/src/gemv_quant.rs`, `gemv_codes.rs`, `gemm_blocks.rs` and
//! the fp8 prefill (`quantize_fp8.rs`, `gemm_wgmma_fp8`): the quantized GEMV, tensor-core
//! GEMM and dequantizer of each block type, the activations' 8-bit codes, and fp8's
//! activations and GEMM, same names and
//! argument order, over the same bytes. Each row is decoded whole (`BlockType::decode_row`,
//! the loader's dequantizers) and multiplied in f32, so the GPU's register decoding is held
//! against the decoders that are themselves checked against the `gguf` package.

use super::twins::gemv_twins;
use crate::kernel_args::{Blocks, MatmulShape};
use crate::weights::blocks::{BlockType, e4m3_to_f32};

/// A matrix of quantized rows on the host (`kernel_args::Blocks`): its block type, its
/// bytes, and fp8's row scales.
pub type BlocksRef<'a> = Blocks<&'a [u8], &'a [f32]>;

/// `out[t * out_stride + o] = (accumulate ? .. : 0) + w[o] . x[t] + bias[o]` for
/// `t < n_tokens`, `o < n_out`: what every quantized GEMV on the GPU computes. `w`:
/// `[n_out]` rows of `w.ty.row_bytes(n_in)`, with fp8's scales, one per row.
pub fn gemv_blocks(
    out: &mut [f32],
    x: &[f32],
    w: BlocksRef,
    bias: Option<&[f32]>,
    shape: MatmulShape,
) {
    let [n_tokens, n_in, n_out, out_stride] = shape.sizes();
    let accumulate = shape.accumulates();
    let Blocks {
        ty,
        bytes: w,
        row_scales,
    } = w;
    let row_bytes = ty.row_bytes(n_in);
    assert!(w.len() == n_out * row_bytes && x.len() >= n_tokens * n_in);
    let mut row = vec![0.0f32; n_in];
    for o in 0..n_out {
        let scale = row_scales.map_or(1.0, |s| s[o]);
        ty.decode_row(&w[o * row_bytes..(o + 1) * row_bytes], scale, &mut row);
        for t in 0..n_tokens {
            let dot: f32 = row
                .iter()
                .zip(&x[t * n_in..(t + 1) * n_in])
                .map(|(w, x)| w * x)
                .sum();
            let at = &mut out[t * out_stride + o];
            let prev = if accumulate { *at } else { 0.0 };
            *at = prev + dot + bias.map_or(0.0, |b| b[o]);
        }
    }
}

/// `quantize_q8_f32` on the GPU: each group of 32 values of `x[..n]` to codes
/// `round(x / d)` (ties to even) with `d = max |x| / 127`, and `scales[g] = (d, d * sum of
/// the codes)`: the same divisions and roundings, so the same bits.
pub fn quantize_q8_f32(codes: &mut [u8], scales: &mut [f32], x: &[f32], n: usize) {
    assert!(n.is_multiple_of(32) && codes.len() >= n && scales.len() >= n / 16);
    for (g, group) in x[..n].chunks_exact(32).enumerate() {
        let max = group.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = max / 127.0;
        let mut sum = 0i32;
        for (i, &v) in group.iter().enumerate() {
            let q = if max > 0.0 {
                (v / d).round_ties_even() as i32
            } else {
                0
            };
            codes[32 * g + i] = q as i8 as u8;
            sum += q;
        }
        scales[2 * g] = d;
        scales[2 * g + 1] = d * sum as f32;
    }
}

/// `rmsnorm_q8_f32` on the GPU: `rmsnorm_f32` of `x` (`[n, dim]`, `dim = weight.len()`),
/// then `quantize_q8_f32` of the normed rows. The GPU sums each row's squares in another
/// order, so its codes may differ by one where a value sits on a rounding's edge.
pub fn rmsnorm_q8_f32(codes: &mut [u8], scales: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let mut normed = vec![0.0; x.len()];
    super::ops::rmsnorm_f32(&mut normed, x, weight, eps);
    quantize_q8_f32(codes, scales, &normed, x.len());
}

/// `attention_combine_q8_f32` on the GPU: `attention_combine_f32`, then `quantize_q8_f32`
/// of its output (`codes` `[n, n_heads * head_dim]`, `scales` two floats a group of 32).
pub fn attention_combine_q8_f32(
    out: &mut [f32],
    (codes, scales): (&mut [u8], &mut [f32]),
    partial_o: &[f32],
    partial_ml: &[f32],
    positions: &[u32],
    splits: super::ops::Splits,
) {
    super::ops::attention_combine_f32(out, partial_o, partial_ml, positions, splits);
    quantize_q8_f32(codes, scales, out, out.len());
}

/// `gemv_<type>` of the GGUF types on the GPU: `gemv_blocks` of the values the codes stand
/// for (`d * code`, `quantize_q8_f32`'s `codes` `[n_tokens, n_in]` and `scales`). The GPU
/// sums the same products in integers first, then scales them: the same sum, rounded
/// differently.
pub fn gemv_codes(
    out: &mut [f32],
    codes: &[u8],
    scales: &[f32],
    w: BlocksRef,
    bias: Option<&[f32]>,
    shape: MatmulShape,
) {
    let [n_tokens, n_in, ..] = shape.sizes();
    assert!(
        w.ty != BlockType::Fp8,
        "fp8 multiplies its activations as they are: gemv_blocks"
    );
    let x: Vec<f32> = codes[..n_tokens * n_in]
        .iter()
        .enumerate()
        .map(|(i, &q)| scales[2 * (i / 32)] * q as i8 as f32)
        .collect();
    gemv_blocks(out, &x, w, bias, shape)
}

/// `gemv_swiglu_<type>` on the GPU: `out[t, o] = silu(g) * u`, `g` and `u` the gate's and
/// up's `gemv_codes` of the token (`swiglu_f32` of the two).
pub fn gemv_swiglu_codes(
    out: &mut [f32],
    codes: &[u8],
    scales: &[f32],
    w_gate: BlocksRef,
    w_up: BlocksRef,
    shape: MatmulShape,
) {
    let [n_tokens, n_in, n_out, out_stride] = shape.sizes();
    let mut sums = [
        vec![0.0f32; n_tokens * n_out],
        vec![0.0f32; n_tokens * n_out],
    ];
    // Each matrix's sums alone, `[n_tokens, n_out]`.
    let sums_shape = MatmulShape::new(n_tokens, n_in, n_out, n_out, false);
    for (sum, w) in sums.iter_mut().zip([w_gate, w_up]) {
        gemv_codes(sum, codes, scales, w, None, sums_shape);
    }
    for t in 0..n_tokens {
        let row = t * n_out..(t + 1) * n_out;
        crate::cpu::ops::swiglu_f32(
            &mut out[t * out_stride..t * out_stride + n_out],
            &sums[0][row.clone()],
            &sums[1][row],
        );
    }
}

/// Rows `rows[r]` (or r) of the matrix as f32 into `out_f32` when given, else rounded to
/// bf16 into `out_bf16`: `dequant_blocks` on the GPU.
pub fn dequant_blocks(
    out_bf16: Option<&mut [u16]>,
    out_f32: Option<&mut [f32]>,
    w: BlocksRef,
    rows: Option<&[u32]>,
    n_rows: usize,
    n_in: usize,
) {
    let Blocks {
        ty,
        bytes: w,
        row_scales,
    } = w;
    let row_bytes = ty.row_bytes(n_in);
    let mut values = vec![0.0f32; n_rows * n_in];
    for (r, v) in values.chunks_exact_mut(n_in).enumerate() {
        let src = rows.map_or(r, |rows| rows[r] as usize);
        let scale = row_scales.map_or(1.0, |s| s[src]);
        ty.decode_row(&w[src * row_bytes..(src + 1) * row_bytes], scale, v);
    }
    match (out_f32, out_bf16) {
        (Some(out), _) => out[..values.len()].copy_from_slice(&values),
        (None, Some(out)) => super::ops::f32_to_bf16(&mut out[..values.len()], &values),
        (None, None) => panic!("dequant_blocks needs an output"),
    }
}

/// `gemv_fp8` on the GPU: out (`[n_tokens, out_stride]`, columns `0..n_out`) (+)= x
/// `[n_tokens, n_in]` times the e4m3 rows' values, each row's sum times its scale, + bias.
/// As the tensor cores take them, the activations are rounded to f16 first, scaled by 2^-8
/// so that values up to 2^24 fit (`fp8_activation`); the e4m3 values are exact in f16.
pub fn gemv_fp8(
    out: &mut [f32],
    x: &[f32],
    w: &[u8],
    row_scales: Option<&[f32]>,
    bias: Option<&[f32]>,
    shape: MatmulShape,
) {
    let [n_tokens, n_in, n_out, out_stride] = shape.sizes();
    let accumulate = shape.accumulates();
    let scales = row_scales.expect("fp8 rows come with their scales");
    let x: Vec<f32> = x[..n_tokens * n_in]
        .iter()
        .map(|&v| fp8_activation(v))
        .collect();
    for (t, x) in x.chunks_exact(n_in).enumerate() {
        let out = &mut out[t * out_stride..t * out_stride + n_out];
        for (o, y) in out.iter_mut().enumerate() {
            let row = &w[o * n_in..(o + 1) * n_in];
            let sum: f32 = row.iter().zip(x).map(|(&b, &v)| e4m3_to_f32(b) * v).sum();
            let prev = if accumulate { *y } else { 0.0 };
            *y = prev + sum * scales[o] + bias.map_or(0.0, |b| b[o]);
        }
    }
}

/// `gemv_swiglu_fp8` on the GPU: out (`[n_tokens, out_stride]`, columns `0..n_out`) =
/// silu(gate) * up, gate and up `gemv_fp8` of x by `w_gate` and `w_up`.
pub fn gemv_swiglu_fp8(
    out: &mut [f32],
    x: &[f32],
    w_gate: &[u8],
    w_up: &[u8],
    gate_scales: &[f32],
    up_scales: &[f32],
    shape: MatmulShape,
) {
    let [n_tokens, n_in, n_out, out_stride] = shape.sizes();
    // Each matrix's sums alone, `[n_tokens, n_out]`.
    let sums_shape = MatmulShape::new(n_tokens, n_in, n_out, n_out, false);
    let [gate, up] = [(w_gate, gate_scales), (w_up, up_scales)].map(|(w, scales)| {
        let mut sums = vec![0.0; n_tokens * n_out];
        gemv_fp8(&mut sums, x, w, Some(scales), None, sums_shape);
        sums
    });
    for t in 0..n_tokens {
        let out = &mut out[t * out_stride..t * out_stride + n_out];
        let rows = t * n_out..(t + 1) * n_out;
        super::ops::swiglu_f32(out, &gate[rows.clone()], &up[rows]);
    }
}

/// An activation as `gemv_fp8` multiplies it: times 2^-8, rounded to nearest-even f16,
/// times 2^8 (both exact).
pub fn fp8_activation(v: f32) -> f32 {
    half::f16::from_f32(v / 256.0).to_f32() * 256.0
}

gemv_twins! {
    Q4_0 => gemv_q4_0, gemv_swiglu_q4_0;
    Q4_1 => gemv_q4_1, gemv_swiglu_q4_1;
    Q5_0 => gemv_q5_0, gemv_swiglu_q5_0;
    Q5_1 => gemv_q5_1, gemv_swiglu_q5_1;
    Q8_0 => gemv_q8_0, gemv_swiglu_q8_0;
    Q4K => gemv_q4_k, gemv_swiglu_q4_k;
    Q5K => gemv_q5_k, gemv_swiglu_q5_k;
    Q6K => gemv_q6_k, gemv_swiglu_q6_k;
}

/// The two-type GEMVs' twins (`gemv_q4_k_q6_k`, ...): `gemv_codes` over the rows of the
/// first type (`w`, the kernel's `n_first` of them: as `Gpu::gemv_codes_two`, its bytes
/// say how many), then over the rest of the second (`w_b`).
macro_rules! two_type_twins {
    ($($a:ident, $b:ident => $name:ident;)*) => {$(
        #[doc = concat!("`gemv_codes` over `", stringify!($a), "` rows, then `", stringify!($b), "` rows.")]
        pub fn $name(
            out: &mut [f32],
            codes: &[u8],
            scales: &[f32],
            w: &[u8],
            w_b: &[u8],
            bias: Option<&[f32]>,
            shape: MatmulShape,
        ) {
            let (a, b) = (BlockType::$a, BlockType::$b);
            let n_first = w.len() / a.row_bytes(shape.n_in as usize);
            let first = MatmulShape { n_out: n_first as u32, ..shape };
            let rest = MatmulShape { n_out: shape.n_out - n_first as u32, ..shape };
            let (w, w_b) = (
                Blocks { ty: a, bytes: w, row_scales: None },
                Blocks { ty: b, bytes: w_b, row_scales: None },
            );
            gemv_codes(out, codes, scales, w, bias.map(|b| &b[..n_first]), first);
            gemv_codes(
                &mut out[n_first..], codes, scales, w_b, bias.map(|b| &b[n_first..]), rest,
            );
        }
    )*};
}

two_type_twins! {
    Q4K, Q6K => gemv_q4_k_q6_k;
    Q5K, Q6K => gemv_q5_k_q6_k;
}

/// The streamed gate-and-up GEMVs' twins (`gemv_swiglu_stream_q4_k`, ...): each
/// `gemv_swiglu_<type>`'s, with the kernel's stage count last, which changes how the GPU
/// reads the weights and nothing of the result.
macro_rules! swiglu_stream_twins {
    ($($swiglu:ident => $stream:ident;)*) => {$(
        #[doc = concat!("`", stringify!($swiglu), "`, whatever the stages.")]
        pub fn $stream(
            out: &mut [f32],
            codes: &[u8],
            scales: &[f32],
            w_gate: &[u8],
            w_up: &[u8],
            shape: MatmulShape,
            _stages: usize,
        ) {
            $swiglu(out, codes, scales, w_gate, w_up, shape)
        }
    )*};
}

swiglu_stream_twins! {
    gemv_swiglu_q4_0 => gemv_swiglu_stream_q4_0;
    gemv_swiglu_q4_1 => gemv_swiglu_stream_q4_1;
    gemv_swiglu_q5_0 => gemv_swiglu_stream_q5_0;
    gemv_swiglu_q5_1 => gemv_swiglu_stream_q5_1;
    gemv_swiglu_q8_0 => gemv_swiglu_stream_q8_0;
    gemv_swiglu_q4_k => gemv_swiglu_stream_q4_k;
    gemv_swiglu_q5_k => gemv_swiglu_stream_q5_k;
    gemv_swiglu_q6_k => gemv_swiglu_stream_q6_k;
}

/// The streamed GEMVs' twins of one matrix (`gemv_stream_q4_k`, ...; the k-quants, which
/// stream their output head): each `gemv_<type>`'s, with the kernel's stage count last,
/// which changes how the GPU reads the weights, not what it computes.
macro_rules! gemv_stream_twins {
    ($($gemv:ident => $stream:ident;)*) => {$(
        #[doc = concat!("`", stringify!($gemv), "`, whatever the stages.")]
        pub fn $stream(
            out: &mut [f32],
            codes: &[u8],
            scales: &[f32],
            w: &[u8],
            bias: Option<&[f32]>,
            shape: MatmulShape,
            _stages: usize,
        ) {
            $gemv(out, codes, scales, w, bias, shape)
        }
    )*};
}

gemv_stream_twins! {
    gemv_q4_k => gemv_stream_q4_k;
    gemv_q5_k => gemv_stream_q5_k;
    gemv_q6_k => gemv_stream_q6_k;
}

/// Row `bytes` of `ty` as `gemm_<type>` hands it to the tensor cores, bf16 values in `out`:
/// the k-quants and Q8_0 with each (sub-)block's scale (and min) rounded to bf16 and every
/// `q * scale - min` rounded once, as `fma.rn.bf16x2` does; the other types decoded in f32
/// (`decode_row`, as `dequant_<type>`) and rounded.
fn tensor_core_row(ty: BlockType, bytes: &[u8], out: &mut [f32]) {
    use crate::weights::dequant_k::q4_k_scale_min;
    use half::{bf16, f16};
    let f16_at = |b: &[u8], at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
    let round = |v: f32| bf16::from_f32(v).to_f64();
    // One rounding of the exact q * scale + offset (exact in f64: a few bits each).
    let fma = |q: u8, scale: f64, offset: f64| bf16::from_f64(q as f64 * scale + offset).to_f32();
    match ty {
        BlockType::Q4K | BlockType::Q5K => {
            let (len, q_at) = if ty == BlockType::Q4K {
                (144, 16)
            } else {
                (176, 48)
            };
            for (b, y) in bytes.chunks_exact(len).zip(out.chunks_exact_mut(256)) {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                for (j, y) in y.chunks_exact_mut(32).enumerate() {
                    let (sc, m) = q4_k_scale_min(j, &b[4..16]);
                    let (scale, min) = (round(d * sc), round(-(dmin * m)));
                    for (l, y) in y.iter_mut().enumerate() {
                        let mut q = (b[q_at + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0xf;
                        if ty == BlockType::Q5K {
                            q |= ((b[16 + l] >> j) & 1) << 4;
                        }
                        *y = fma(q, scale, min);
                    }
                }
            }
        }
        BlockType::Q8_0 => {
            for (b, y) in bytes.chunks_exact(34).zip(out.chunks_exact_mut(32)) {
                let scale = round(f16_at(b, 0));
                for (y, &q) in y.iter_mut().zip(&b[2..]) {
                    *y = bf16::from_f64(q as i8 as f64 * scale).to_f32();
                }
            }
        }
        BlockType::Q6K => {
            for (b, y) in bytes.chunks_exact(210).zip(out.chunks_exact_mut(256)) {
                let d = f16_at(b, 208);
                for (i, y) in y.iter_mut().enumerate() {
                    let (half, m, l) = (i / 128, (i % 128) / 32, i % 32);
                    let low = (b[64 * half + 32 * (m % 2) + l] >> (4 * (m / 2))) & 0xf;
                    let high = (b[128 + 32 * half + l] >> (2 * m)) & 3;
                    let scale = round(b[192 + 8 * half + 2 * m + l / 16] as i8 as f32 * d);
                    *y = fma(low | high << 4, scale, -32.0 * scale);
                }
            }
        }
        _ => {
            ty.decode_row(bytes, 1.0, out);
            for v in out.iter_mut() {
                *v = bf16::from_f32(*v).to_f32();
            }
        }
    }
}

/// `gemm_<type>` on the GPU, for `t < n` and `o < n_out`:
/// `out[t * out_stride + o] = (accumulate ? .. : 0) + w[o] . x[t] + bias[o]`, the weights as
/// the kernel makes them for the tensor cores (`tensor_core_row`), `x` `[n, n_in]` bf16 bits,
/// the products summed in f32 (the GPU's tensor cores add them in another order).
pub fn gemm_blocks(
    out: &mut [f32],
    x: &[u16],
    w: BlocksRef,
    bias: Option<&[f32]>,
    shape: MatmulShape,
) {
    let [n, n_in, n_out, out_stride] = shape.sizes();
    let accumulate = shape.accumulates();
    let (ty, w) = (w.ty, w.bytes);
    let row_bytes = ty.row_bytes(n_in);
    assert!(w.len() == n_out * row_bytes && x.len() >= n * n_in && n_out <= out_stride);
    let x: Vec<f32> = x[..n * n_in]
        .iter()
        .map(|&b| half::bf16::from_bits(b).to_f32())
        .collect();
    let mut row = vec![0.0f32; n_in];
    for o in 0..n_out {
        tensor_core_row(ty, &w[o * row_bytes..(o + 1) * row_bytes], &mut row);
        for t in 0..n {
            let dot: f32 = row
                .iter()
                .zip(&x[t * n_in..(t + 1) * n_in])
                .map(|(a, b)| a * b)
                .sum();
            let o_at = &mut out[t * out_stride + o];
            let prev = if accumulate { *o_at } else { 0.0 };
            *o_at = prev + dot + bias.map_or(0.0, |b| b[o]);
        }
    }
}

/// The tensor-core GEMM twins by kernel name: `gemm_q4_k`, ..., and the warpgroup GEMM's
/// `gemm_wgmma_q8_0`, `gemm_wgmma_q4_k`, ... (the same sums for any number of tokens), each
/// `gemm_blocks` of its type.
macro_rules! gemm_twins {
    ($($ty:ident => $gemm:ident;)*) => {$(
        #[doc = concat!("`gemm_blocks` over `", stringify!($ty), "` weights.")]
        pub fn $gemm(
            out: &mut [f32],
            x: &[u16],
            w: &[u8],
            bias: Option<&[f32]>,
            shape: MatmulShape,
        ) {
            let w = Blocks { ty: BlockType::$ty, bytes: w, row_scales: None };
            gemm_blocks(out, x, w, bias, shape)
        }
    )*};
}

gemm_twins! {
    Q4_0 => gemm_wgmma_q4_0;
    Q4_1 => gemm_wgmma_q4_1;
    Q5_0 => gemm_wgmma_q5_0;
    Q5_1 => gemm_wgmma_q5_1;
    Q8_0 => gemm_wgmma_q8_0;
    Q4K => gemm_wgmma_q4_k;
    Q5K => gemm_wgmma_q5_k;
    Q6K => gemm_wgmma_q6_k;
    Q4_0 => gemm_q4_0;
    Q4_1 => gemm_q4_1;
    Q5_0 => gemm_q5_0;
    Q5_1 => gemm_q5_1;
    Q8_0 => gemm_q8_0;
    Q4K => gemm_q4_k;
    Q5K => gemm_q5_k;
    Q6K => gemm_q6_k;
}

/// The dequantizer twins by kernel name: `dequant_q4_k`, ..., each `dequant_blocks` of its
/// type.
macro_rules! dequant_twins {
    ($($ty:ident => $dequant:ident;)*) => {$(
        #[doc = concat!("`dequant_blocks` over `", stringify!($ty), "` weights.")]
        pub fn $dequant(
            out_bf16: Option<&mut [u16]>,
            out_f32: Option<&mut [f32]>,
            w: &[u8],
            row_scales: Option<&[f32]>,
            rows: Option<&[u32]>,
            n_rows: usize,
            n_in: usize,
        ) {
            let w = Blocks { ty: BlockType::$ty, bytes: w, row_scales };
            dequant_blocks(out_bf16, out_f32, w, rows, n_rows, n_in)
        }
    )*};
}

dequant_twins! {
    Q4_0 => dequant_q4_0;
    Q4_1 => dequant_q4_1;
    Q5_0 => dequant_q5_0;
    Q5_1 => dequant_q5_1;
    Q8_0 => dequant_q8_0;
    Q4K => dequant_q4_k;
    Q5K => dequant_q5_k;
    Q6K => dequant_q6_k;
    Fp8 => dequant_fp8;
}

/// Random blocks of `ty` for `rows` rows of `n_in` (tests and synthetic benchmark weights):
/// random bytes, with every f16 scale field set so the weights come out about
/// ±`magnitude` (fp8: random finite e4m3 bytes, `row_scales` of magnitude / 448).
pub fn random_blocks(
    ty: BlockType,
    rows: usize,
    n_in: usize,
    magnitude: f32,
    seed: u32,
) -> (Vec<u8>, Option<Vec<f32>>) {
    use rayon::prelude::*;
    let n = rows * ty.row_bytes(n_in);
    let mut bytes: Vec<u8> = (0..n.div_ceil(4))
        .into_par_iter()
        .flat_map_iter(|i| super::ops::hash32(seed, i as u32).to_le_bytes())
        .collect();
    bytes.truncate(n);
    if ty == BlockType::Fp8 {
        // 0x7f and 0xff are NaN: move them one step down.
        bytes.par_iter_mut().for_each(|b| {
            if *b & 0x7f == 0x7f {
                *b -= 1
            }
        });
        return (bytes, Some(vec![magnitude / 448.0; rows]));
    }
    // (offset of an f16 scale field in the block, the largest quantized magnitude it
    // multiplies), so that d * that is `magnitude`.
    let fields: &[(usize, f32)] = match ty {
        BlockType::Q4_0 => &[(0, 8.0)],
        BlockType::Q4_1 => &[(0, 15.0), (2, -7.5)],
        BlockType::Q5_0 => &[(0, 16.0)],
        BlockType::Q5_1 => &[(0, 31.0), (2, -15.5)],
        BlockType::Q8_0 => &[(0, 127.0)],
        // d multiplies a 6-bit scale and a 4- or 5-bit value; dmin a 6-bit min.
        BlockType::Q4K => &[(0, 63.0 * 15.0), (2, 63.0 * 7.5)],
        BlockType::Q5K => &[(0, 63.0 * 31.0), (2, 63.0 * 15.5)],
        BlockType::Q6K => &[(208, 127.0 * 32.0)],
        BlockType::Fp8 => unreachable!(),
    };
    bytes
        .par_chunks_exact_mut(ty.block_bytes())
        .for_each(|block| {
            for &(at, q) in fields {
                let d = half::f16::from_f32(magnitude / q);
                block[at..at + 2].copy_from_slice(&d.to_le_bytes());
            }
        });
    (bytes, None)
}

/// `quantize_fp8_f32` on the GPU: each row of `x` (`[n, n_in]`) to e4m3 `codes` with
/// `scales[t] = max |x[t]| / 448` (1 for a row of zeros), the way `--weights fp8` quantizes
/// a matrix's rows at load: the same division and rounding, so the same bytes.
pub fn quantize_fp8_f32(codes: &mut [u8], scales: &mut [f32], x: &[f32], n_in: usize) {
    let (c, s) = crate::weights::blocks::quantize_fp8(x, n_in);
    codes.copy_from_slice(&c);
    scales.copy_from_slice(&s);
}

/// `gemm_wgmma_fp8` on the GPU: `out[t, o] = x_scales[t] w_scales[o] sum_i x[t, i] w[o, i] +
/// bias[o]` for e4m3 `x` (`[n, n_in]`) and `w` (`[n_out, n_in]`), the products of the bytes'
/// values summed in f32, then scaled.
pub fn gemm_wgmma_fp8(
    out: &mut [f32],
    x: &[u8],
    x_scales: &[f32],
    w: &[u8],
    w_scales: &[f32],
    bias: Option<&[f32]>,
    n_in: usize,
) {
    use rayon::prelude::*;
    let n_out = w_scales.len();
    let w: Vec<f32> = w.iter().map(|&b| e4m3_to_f32(b)).collect();
    out.par_chunks_mut(n_out)
        .zip(x.par_chunks(n_in))
        .zip(x_scales)
        .for_each(|((y, xr), &xs)| {
            let xr: Vec<f32> = xr.iter().map(|&b| e4m3_to_f32(b)).collect();
            for (o, y) in y.iter_mut().enumerate() {
                let row = &w[o * n_in..(o + 1) * n_in];
                let dot: f32 = row.iter().zip(&xr).map(|(a, b)| a * b).sum();
                *y = dot * (xs * w_scales[o]) + bias.map_or(0.0, |b| b[o]);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `gemv_fp8`'s twin against the f32 GEMV of the same rows: apart by the activations'
    /// rounding to f16 only, and an activation past f16's 65504 (an outlier of the hidden
    /// state) still multiplied, not infinite.
    #[test]
    fn gemv_fp8_rounds_only_the_activations_to_f16() {
        let (n_in, n_out, n_tokens, stride) = (256, 5, 3, 6);
        let (w, scales) = random_blocks(BlockType::Fp8, n_out, n_in, 0.5, 3);
        let scales = scales.as_deref();
        let mut x: Vec<f32> = (0..n_tokens * n_in)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        x[5] = 1.0e6;
        let rounded: Vec<f32> = x.iter().map(|&v| fp8_activation(v)).collect();
        // Every activation within f16's half step of itself, the outlier too (finite).
        assert!(
            rounded
                .iter()
                .zip(&x)
                .all(|(r, v)| (r - v).abs() <= v.abs() / 2048.0)
        );
        let start = vec![0.25f32; n_tokens * stride];
        let (mut got, mut same, mut apart) = (start.clone(), start.clone(), start);
        let shape = MatmulShape::new(n_tokens, n_in, n_out, stride, true);
        gemv_fp8(&mut got, &x, &w, scales, None, shape);
        let blocks = Blocks {
            ty: BlockType::Fp8,
            bytes: &w[..],
            row_scales: scales,
        };
        for (out, x) in [(&mut same, &rounded), (&mut apart, &x)] {
            gemv_blocks(out, x, blocks, None, shape);
        }
        // From the f32 sums, no further than f16's half step of every product.
        let mut all = vec![0f32; n_out * n_in];
        dequant_blocks(None, Some(&mut all), blocks, None, n_out, n_in);
        for t in 0..n_tokens {
            for o in 0..n_out {
                let [g, s, a] = [&got, &same, &apart].map(|v| v[t * stride + o]);
                let x = &x[t * n_in..(t + 1) * n_in];
                let products: f32 = (0..n_in).map(|i| (all[o * n_in + i] * x[i]).abs()).sum();
                assert!((g - s).abs() <= 1e-5 * (1.0 + s.abs()), "{g} against {s}");
                assert!(
                    (g - a).abs() <= products / 2048.0,
                    "{g} against the f32 sums' {a}"
                );
            }
        }
    }

    /// The twin's sums against a plain dot product of the decoded rows, with a stride, a
    /// bias, accumulation and several tokens; random blocks stay in ±magnitude.
    #[test]
    fn gemv_blocks_is_the_decoded_rows_times_x() {
        for ty in BlockType::ALL {
            let (n_in, n_out, n_tokens, stride) = (512, 3, 2, 5);
            let (w, scales) = random_blocks(ty, n_out, n_in, 0.5, 7);
            let x: Vec<f32> = (0..n_tokens * n_in).map(|i| (i % 7) as f32 - 3.0).collect();
            let mut out = vec![1.0f32; n_tokens * stride];
            let bias = [0.5, -0.5, 0.25];
            let blocks = Blocks {
                ty,
                bytes: &w[..],
                row_scales: scales.as_deref(),
            };
            let shape = MatmulShape::new(n_tokens, n_in, n_out, stride, true);
            gemv_blocks(&mut out, &x, blocks, Some(&bias), shape);
            let mut all = vec![0.0f32; n_out * n_in];
            dequant_blocks(None, Some(&mut all), blocks, None, n_out, n_in);
            assert!(all.iter().all(|v| v.abs() <= 0.5 * 1.01), "{ty}: magnitude");
            for t in 0..n_tokens {
                for o in 0..n_out {
                    let want: f32 = (0..n_in).map(|i| all[o * n_in + i] * x[t * n_in + i]).sum();
                    let got = out[t * stride + o] - 1.0 - bias[o];
                    assert!((got - want).abs() < 1e-3 * (1.0 + want.abs()), "{ty}");
                }
                // Columns past n_out are untouched.
                assert_eq!(out[t * stride + 3..t * stride + 5], [1.0, 1.0]);
            }
        }
    }

    /// The codes stand for x within half a step of each group's scale, the largest value of
    /// a group is ±127, and the second scale is d times the codes' sum.
    #[test]
    fn quantize_q8_rounds_each_group_to_its_scale() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let (mut codes, mut scales) = (vec![0u8; 96], vec![0f32; 6]);
        quantize_q8_f32(&mut codes, &mut scales, &x, 96);
        for g in 0..3 {
            let d = scales[2 * g];
            let group = &x[32 * g..32 * g + 32];
            let max = group.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert_eq!(d, max / 127.0);
            let q: Vec<i32> = codes[32 * g..32 * g + 32]
                .iter()
                .map(|&c| c as i8 as i32)
                .collect();
            assert_eq!(q.iter().map(|q| q.abs()).max(), Some(127));
            for (v, q) in group.iter().zip(&q) {
                assert!((v - d * *q as f32).abs() <= 0.5 * d * 1.0001);
            }
            assert_eq!(scales[2 * g + 1], d * q.iter().sum::<i32>() as f32);
        }
        // An all-zero group has codes and scales of zero.
        quantize_q8_f32(&mut codes, &mut scales, &[0.0; 32], 32);
        assert!(codes[..32].iter().all(|&c| c == 0) && scales[..2] == [0.0, 0.0]);
    }

    /// The weights `gemm_<type>` gives the tensor cores are bf16 values within a few bf16
    /// steps of the dequantizer's floats: the same rounding of the 32-weight types, and for
    /// the k-quants the bf16 scale and min (each off by at most half a step) before one
    /// rounding. A decoder that read the wrong nibble or scale would be far off.
    #[test]
    fn tensor_core_rows_stay_near_the_dequantized_ones() {
        for ty in BlockType::ALL.into_iter().filter(|&t| t != BlockType::Fp8) {
            let n_in = 1024;
            let (w, _) = random_blocks(ty, 2, n_in, 0.5, 11);
            let (mut tc, mut exact) = (vec![0.0f32; n_in], vec![0.0f32; n_in]);
            for r in 0..2 {
                let row = &w[r * ty.row_bytes(n_in)..(r + 1) * ty.row_bytes(n_in)];
                tensor_core_row(ty, row, &mut tc);
                ty.decode_row(row, 1.0, &mut exact);
                for (i, (&a, &b)) in tc.iter().zip(&exact).enumerate() {
                    assert_eq!(a, half::bf16::from_f32(a).to_f32(), "{ty}: {a} is not bf16");
                    // Eight bf16 steps (2^-8) of the largest weight of its group of 32.
                    let group = &exact[i / 32 * 32..i / 32 * 32 + 32];
                    let big = group.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    assert!(
                        (a - b).abs() <= 8.0 * big / 256.0,
                        "{ty}: weight {i}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn dequant_blocks_gathers_rows() {
        let (w, _) = random_blocks(BlockType::Q8_0, 4, 64, 1.0, 3);
        let mut all = vec![0.0f32; 4 * 64];
        dequant_q8_0(None, Some(&mut all), &w, None, None, 4, 64);
        let mut two = vec![0.0f32; 2 * 64];
        dequant_q8_0(None, Some(&mut two), &w, None, Some(&[3, 1]), 2, 64);
        assert_eq!(two[..64], all[3 * 64..]);
        assert_eq!(two[64..], all[64..128]);
    }

    /// A row of -2s normed by a weight of ones is -1s, exactly: every code -127, d 1/127,
    /// and the second scale d times -32 * 127.
    #[test]
    fn rmsnorm_q8_of_a_constant_row_is_all_minus_127() {
        let (mut codes, mut scales) = (vec![0u8; 64], vec![0f32; 4]);
        rmsnorm_q8_f32(&mut codes, &mut scales, &[-2.0; 64], &[1.0; 64], 0.0);
        assert!(codes.iter().all(|&c| c as i8 == -127));
        let d = 1.0f32 / 127.0;
        assert_eq!(scales, [d, d * -4064.0, d, d * -4064.0]);
    }
}
