//! The integer GEMV on the tensor cores (`gemv_mma_<type>`, `gemv_swiglu_mma_<type>`) against
//! its twins, for Q4_1, Q8_0, Q4_K and Q6_K: every token count it takes, one row to rows past
//! a block's 16 and ending inside them, Q6_K and Q8_0 rows of an odd number of blocks (every
//! other row 2 bytes past a 4-byte boundary), a wider output row, bias and accumulation. Columns past `n_out` must stay as
//! they were (poison).

use rand::Rng;
use rand::rngs::StdRng;
use rustle::cpu::quant_mma::{
    gemv_mma_q4_1, gemv_mma_q4_k, gemv_mma_q6_k, gemv_mma_q8_0, gemv_swiglu_mma_q4_1,
    gemv_swiglu_mma_q4_k, gemv_swiglu_mma_q6_k, gemv_swiglu_mma_q8_0,
};
use rustle::gpu::Gpu;
use rustle::kernel_args::MatmulShape;
use rustle::weights::blocks::BlockType;

use super::{
    LONG_REDUCTION, SWIGLU_OF_SUMS, assert_strided, down, normal, on_device, q8_codes, up,
};

type Twin = fn(&mut [f32], &[u8], &[f32], &[u8], Option<&[f32]>, MatmulShape);
type SwigluTwin = fn(&mut [f32], &[u8], &[f32], &[u8], &[u8], MatmulShape);

const TYPES: [(BlockType, Twin, SwigluTwin); 4] = [
    (BlockType::Q4_1, gemv_mma_q4_1, gemv_swiglu_mma_q4_1),
    (BlockType::Q8_0, gemv_mma_q8_0, gemv_swiglu_mma_q8_0),
    (BlockType::Q4K, gemv_mma_q4_k, gemv_swiglu_mma_q4_k),
    (BlockType::Q6K, gemv_mma_q6_k, gemv_swiglu_mma_q6_k),
];

pub fn gemv_mma_blocks(g: &Gpu, rng: &mut StdRng) {
    // (n_in, n_out, stride, bias, accumulate); every token count 1 to 8 on each shape whose
    // rows are whole blocks of the type. 96 and 576 (the default model's width): rows of an
    // odd and an even number of 32-weight blocks.
    let shapes = [
        (96, 19, 19, true, false),
        (576, 40, 41, false, true),
        (256, 1, 3, false, false),
        (768, 37, 40, true, false),
        (4096, 48, 48, false, true),
        (14336, 17, 17, true, true),
        (1280, 300, 301, false, false),
    ];
    for (ty, twin, _) in TYPES {
        for (n_in, n_out, stride, bias, accumulate) in shapes {
            if n_in % ty.block_len() != 0 {
                continue;
            }
            let (w, scales) =
                rustle::cpu::quant::random_blocks(ty, n_out, n_in, 0.05, rng.random());
            let w_dev = on_device(g, &w, &scales);
            let b = bias.then(|| normal(rng, n_out, 1.0));
            let b_dev = b.as_ref().map(|b| up(g, b));
            let b_view = b_dev.as_ref().map(|b| b.as_view());
            for n_tokens in 1..=8 {
                let x = normal(rng, n_tokens * n_in, 1.0);
                let (codes, code_scales) = q8_codes(&x);
                let start: Vec<f32> = match accumulate {
                    true => normal(rng, n_tokens * stride, 1.0),
                    false => vec![f32::NAN; n_tokens * stride],
                };
                let shape = MatmulShape::new(n_tokens, n_in, n_out, stride, accumulate);
                let mut cpu = start.clone();
                twin(&mut cpu, &codes, &code_scales, &w, b.as_deref(), shape);
                let mut out = up(g, &start);
                g.gemv_mma(
                    &mut out.as_view_mut(),
                    &up(g, &codes).as_view(),
                    &up(g, &code_scales).as_view(),
                    &w_dev.view(ty),
                    b_view.as_ref(),
                    shape,
                )
                .unwrap();
                let what = format!(
                    "gemv_mma {ty} {n_out} x {n_in}, {n_tokens} tokens, stride {stride}, bias {bias}, accumulate {accumulate}"
                );
                assert_strided(
                    &what,
                    &down(g, &out),
                    &cpu,
                    Some(&start),
                    shape,
                    LONG_REDUCTION,
                );
            }
        }
    }
}

pub fn gemv_swiglu_mma_blocks(g: &Gpu, rng: &mut StdRng) {
    for (ty, _, twin) in TYPES {
        let shapes = [
            (96, 21, 21),
            (256, 40, 40),
            (768, 37, 40),
            (4096, 1000, 1000),
        ];
        for (n_in, n_out, stride) in shapes {
            if n_in % ty.block_len() != 0 {
                continue;
            }
            let [(w_gate, gate_scales), (w_up, up_scales)] = [0.05, 0.05]
                .map(|s| rustle::cpu::quant::random_blocks(ty, n_out, n_in, s, rng.random()));
            let gate_dev = on_device(g, &w_gate, &gate_scales);
            let up_dev = on_device(g, &w_up, &up_scales);
            for n_tokens in 1..=8 {
                let x = normal(rng, n_tokens * n_in, 1.0);
                let (codes, code_scales) = q8_codes(&x);
                let start = vec![f32::NAN; n_tokens * stride];
                let shape = MatmulShape::new(n_tokens, n_in, n_out, stride, false);
                let mut cpu = start.clone();
                twin(&mut cpu, &codes, &code_scales, &w_gate, &w_up, shape);
                let mut out = up(g, &start);
                g.gemv_swiglu_mma(
                    &mut out.as_view_mut(),
                    &up(g, &codes).as_view(),
                    &up(g, &code_scales).as_view(),
                    &gate_dev.view(ty),
                    &up_dev.view(ty),
                    shape,
                )
                .unwrap();
                let what = format!(
                    "gemv_swiglu_mma {ty} {n_out} x {n_in}, {n_tokens} tokens, stride {stride}"
                );
                assert_strided(&what, &down(g, &out), &cpu, None, shape, SWIGLU_OF_SUMS);
            }
        }
    }
}
