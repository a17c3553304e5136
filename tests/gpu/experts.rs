//! A mixture of experts' kernels on the device against their twins: the routing
//! (`route_experts_f32`: every choice, run and pair exactly, the weights within the
//! approximate `ex2`), the weighted add back (`combine_experts_f32`), and the grouped GEMVs
//! of every GGUF type and bf16 (`gemv_experts_<type>`, `gemv_swiglu_experts_<type>`, and on
//! the tensor cores `gemv_experts_mma_<type>` for the types that have it) over runs of one
//! pair to runs longer than a pass's `QUANT_MAX_TOKENS`, outputs poisoned.

use cudarc::driver::CudaSlice;
use rand::Rng;
use rand::rngs::StdRng;
use rustle::cpu::gemv_experts as twins;
use rustle::cpu::ops;
use rustle::gpu::Gpu;
use rustle::gpu::kernels::In;
use rustle::gpu::kernels::route::RoutingOut;
use rustle::gpu::matrix::to_bf16;
use rustle::kernel_args::{MatmulShape, RouteShape, Routing, Runs};
use rustle::weights::blocks::BlockType;

use super::{
    APPROX_EXP, ELEMENTWISE, LONG_REDUCTION, REDUCTION, SWIGLU_OF_SUMS, assert_close,
    assert_strided, down, normal, on_device, poisoned, q8_codes, up,
};

/// A routing on the host, as the twin writes it.
struct HostRouting {
    choice: Vec<u32>,
    choice_weight: Vec<f32>,
    index: Vec<u32>,
    run_expert: Vec<u32>,
    run_start: Vec<u32>,
    pair_of: Vec<u32>,
}

/// The twin's routing of `logits` (`[n, experts]`).
fn host_routing(logits: &[f32], shape: RouteShape) -> HostRouting {
    let (pairs, experts) = (shape.pairs(), shape.n_experts as usize);
    let mut r = HostRouting {
        choice: vec![u32::MAX; pairs],
        choice_weight: vec![f32::NAN; pairs],
        index: vec![u32::MAX; pairs],
        run_expert: vec![u32::MAX; experts],
        run_start: vec![u32::MAX; experts + 1],
        pair_of: vec![u32::MAX; pairs],
    };
    let mut view = Routing {
        choice: r.choice.as_mut_slice(),
        choice_weight: r.choice_weight.as_mut_slice(),
        index: r.index.as_mut_slice(),
        run_expert: r.run_expert.as_mut_slice(),
        run_start: r.run_start.as_mut_slice(),
        pair_of: r.pair_of.as_mut_slice(),
    };
    ops::route_experts_f32(logits, &mut view, shape);
    r
}

/// Logits of `n` tokens over `experts`, each token's `favoured` (if any) far above the rest,
/// so that every token chooses it and its run is long.
fn logits(rng: &mut StdRng, n: usize, experts: usize, favoured: Option<usize>) -> Vec<f32> {
    let mut l = normal(rng, n * experts, 2.0);
    if let Some(e) = favoured {
        for t in 0..n {
            l[t * experts + e] += 20.0;
        }
    }
    l
}

pub fn route_and_combine(g: &Gpu, rng: &mut StdRng) {
    let cases = [
        (1, 8, 2, true, None),
        (1, 128, 8, true, None),
        (7, 128, 8, false, None),
        (64, 128, 8, true, None),
        (300, 8, 2, true, Some(3)),
        (33, 60, 4, false, None),
    ];
    for (n, experts, k, renormalize, favoured) in cases {
        let shape = RouteShape {
            n_tokens: n,
            n_experts: experts,
            top_k: k,
            renormalize: renormalize as u32,
        };
        let (n, experts, k) = (n as usize, experts as usize, k as usize);
        let pairs = n * k;
        let logits = logits(rng, n, experts, favoured);
        let cpu = host_routing(&logits, shape);
        let u32s = |len: usize| up(g, &vec![u32::MAX; len]);
        let (mut choice, mut index, mut pair_of) = (u32s(pairs), u32s(pairs), u32s(pairs));
        let (mut run_expert, mut run_start) = (u32s(experts), u32s(experts + 1));
        let mut weight = poisoned(g, pairs);
        let mut r: RoutingOut = Routing {
            choice: choice.as_view_mut(),
            choice_weight: weight.as_view_mut(),
            index: index.as_view_mut(),
            run_expert: run_expert.as_view_mut(),
            run_start: run_start.as_view_mut(),
            pair_of: pair_of.as_view_mut(),
        };
        g.route_experts_f32(&up(g, &logits).as_view(), &mut r, shape)
            .unwrap();
        let what = format!("{n} tokens, top {k} of {experts}");
        assert_eq!(down(g, &choice), cpu.choice, "{what}: choices");
        assert_eq!(down(g, &index), cpu.index, "{what}: pairs' tokens");
        assert_eq!(
            down(g, &run_expert),
            cpu.run_expert,
            "{what}: runs' experts"
        );
        assert_eq!(down(g, &run_start), cpu.run_start, "{what}: runs' starts");
        assert_eq!(down(g, &pair_of), cpu.pair_of, "{what}: pairs of choices");
        let tol = APPROX_EXP + REDUCTION;
        assert_close(&what, &down(g, &weight), &cpu.choice_weight, tol);

        // The experts' outputs added back with the device's own routing.
        let dim = [64, 300, 2048][n % 3];
        let rows = normal(rng, pairs * dim, 1.0);
        let x = normal(rng, n * dim, 1.0);
        let mut expected = x.clone();
        ops::combine_experts_f32(
            &mut expected,
            &rows,
            &cpu.pair_of,
            &cpu.choice_weight,
            dim,
            k,
        );
        let mut x_dev = up(g, &x);
        unsafe {
            g.combine_experts_f32(
                &mut x_dev.as_view_mut(),
                &up(g, &rows).as_view(),
                (&pair_of.as_view(), &up(g, &cpu.choice_weight).as_view()),
                dim,
                k,
            )
        }
        .unwrap();
        assert_close(
            &format!("combine, {what}"),
            &down(g, &x_dev),
            &expected,
            ELEMENTWISE,
        );
    }
}

/// A routing's runs on the host (a twin's) and on the device (a kernel's).
struct CaseRuns {
    host_expert: Vec<u32>,
    host_start: Vec<u32>,
    expert: CudaSlice<u32>,
    start: CudaSlice<u32>,
}

impl CaseRuns {
    fn host(&self) -> Runs<&[u32]> {
        Runs {
            expert: &self.host_expert,
            start: &self.host_start,
        }
    }

    /// The device buffers as views, for a `Runs` of references to them.
    fn views(&self) -> (In<'_, u32>, In<'_, u32>) {
        (self.expert.as_view(), self.start.as_view())
    }
}

type CodesTwin = fn(&mut [f32], &[u8], &[f32], &[u8], Runs<&[u32]>, MatmulShape);
type SwigluCodesTwin = fn(&mut [f32], &[u8], &[f32], &[u8], &[u8], Runs<&[u32]>, MatmulShape);

const CODES_TYPES: [(BlockType, CodesTwin, SwigluCodesTwin); 8] = [
    (
        BlockType::Q4_0,
        twins::gemv_experts_q4_0,
        twins::gemv_swiglu_experts_q4_0,
    ),
    (
        BlockType::Q4_1,
        twins::gemv_experts_q4_1,
        twins::gemv_swiglu_experts_q4_1,
    ),
    (
        BlockType::Q5_0,
        twins::gemv_experts_q5_0,
        twins::gemv_swiglu_experts_q5_0,
    ),
    (
        BlockType::Q5_1,
        twins::gemv_experts_q5_1,
        twins::gemv_swiglu_experts_q5_1,
    ),
    (
        BlockType::Q8_0,
        twins::gemv_experts_q8_0,
        twins::gemv_swiglu_experts_q8_0,
    ),
    (
        BlockType::Q4K,
        twins::gemv_experts_q4_k,
        twins::gemv_swiglu_experts_q4_k,
    ),
    (
        BlockType::Q5K,
        twins::gemv_experts_q5_k,
        twins::gemv_swiglu_experts_q5_k,
    ),
    (
        BlockType::Q6K,
        twins::gemv_experts_q6_k,
        twins::gemv_swiglu_experts_q6_k,
    ),
];

/// The types with a grouped GEMV on the tensor cores, and its twins.
const MMA_TYPES: [(BlockType, CodesTwin, SwigluCodesTwin); 4] = [
    (
        BlockType::Q4_1,
        twins::gemv_experts_mma_q4_1,
        twins::gemv_swiglu_experts_mma_q4_1,
    ),
    (
        BlockType::Q8_0,
        twins::gemv_experts_mma_q8_0,
        twins::gemv_swiglu_experts_mma_q8_0,
    ),
    (
        BlockType::Q4K,
        twins::gemv_experts_mma_q4_k,
        twins::gemv_swiglu_experts_mma_q4_k,
    ),
    (
        BlockType::Q6K,
        twins::gemv_experts_mma_q6_k,
        twins::gemv_swiglu_experts_mma_q6_k,
    ),
];

/// (experts, top k, tokens, one expert favoured by every token, rows, inputs): a decode
/// token, a few, and a run of 20 pairs (three passes of a block).
const GROUPED_CASES: [(u32, u32, u32, Option<usize>, usize, usize); 4] = [
    (8, 2, 1, None, 37, 512),
    (128, 8, 1, None, 96, 256),
    (16, 4, 5, None, 64, 768),
    (8, 2, 20, Some(5), 40, 1024),
];

/// A case's routing, on the host and on the device.
fn grouped_routing(g: &Gpu, rng: &mut StdRng, case: (u32, u32, u32, Option<usize>)) -> CaseRuns {
    let (experts, k, n, favoured) = case;
    let shape = RouteShape {
        n_tokens: n,
        n_experts: experts,
        top_k: k,
        renormalize: 1,
    };
    let r = host_routing(&logits(rng, n as usize, experts as usize, favoured), shape);
    CaseRuns {
        expert: up(g, &r.run_expert),
        start: up(g, &r.run_start),
        host_expert: r.run_expert,
        host_start: r.run_start,
    }
}

pub fn gemv_experts_blocks(g: &Gpu, rng: &mut StdRng) {
    let dp4a = CODES_TYPES.map(|t| (t, false));
    let mma = MMA_TYPES.map(|t| (t, true));
    for ((ty, twin, swiglu_twin), on_mma) in dp4a.into_iter().chain(mma) {
        for (experts, k, n, favoured, n_out, n_in) in GROUPED_CASES {
            if !ty.fits(n_in) {
                continue;
            }
            let runs = grouped_routing(g, rng, (experts, k, n, favoured));
            let host_runs = runs.host();
            let (dev_expert, dev_start) = runs.views();
            let dev_runs = Runs {
                expert: &dev_expert,
                start: &dev_start,
            };
            let pairs = (n * k) as usize;
            let rows = experts as usize * n_out;
            let [(w, _), (w_up, _)] = [0.05, 0.05]
                .map(|s| rustle::cpu::quant::random_blocks(ty, rows, n_in, s, rng.random()));
            let (w_dev, up_dev) = (on_device(g, &w, &None), on_device(g, &w_up, &None));
            let x = normal(rng, pairs * n_in, 1.0);
            let (codes, scales) = q8_codes(&x);
            let (codes_dev, scales_dev) = (up(g, &codes), up(g, &scales));
            let (codes_view, scales_view) = (codes_dev.as_view(), scales_dev.as_view());
            let input = (&codes_view, &scales_view);
            let shape = MatmulShape::new(pairs, n_in, n_out, n_out, false);
            let what = format!(
                "{ty} {experts} experts of {n_out} x {n_in}, {n} tokens, top {k}, mma {on_mma}"
            );

            let mut cpu = vec![f32::NAN; pairs * n_out];
            twin(&mut cpu, &codes, &scales, &w, host_runs, shape);
            let mut out = poisoned(g, pairs * n_out);
            let view = w_dev.view(ty);
            g.gemv_experts_codes(
                &mut out.as_view_mut(),
                input,
                (&view, None),
                dev_runs,
                shape,
                on_mma,
            )
            .unwrap();
            assert_strided(&what, &down(g, &out), &cpu, None, shape, LONG_REDUCTION);

            let mut cpu = vec![f32::NAN; pairs * n_out];
            swiglu_twin(&mut cpu, &codes, &scales, &w, &w_up, host_runs, shape);
            let mut out = poisoned(g, pairs * n_out);
            let up_view = up_dev.view(ty);
            let w = (&view, Some(&up_view));
            g.gemv_experts_codes(&mut out.as_view_mut(), input, w, dev_runs, shape, on_mma)
                .unwrap();
            let what = format!("SwiGLU, {what}");
            assert_strided(&what, &down(g, &out), &cpu, None, shape, SWIGLU_OF_SUMS);
        }
    }
}

pub fn gemv_experts_bf16(g: &Gpu, rng: &mut StdRng) {
    for (experts, k, n, favoured, n_out, n_in) in GROUPED_CASES {
        let runs = grouped_routing(g, rng, (experts, k, n, favoured));
        let host_runs = runs.host();
        let (dev_expert, dev_start) = runs.views();
        let dev_runs = Runs {
            expert: &dev_expert,
            start: &dev_start,
        };
        let pairs = (n * k) as usize;
        let len = experts as usize * n_out * n_in;
        let [w, w_up] = [0, 1].map(|_| to_bf16(&normal(rng, len, 0.05)));
        let (w_dev, up_dev) = (up(g, &w), up(g, &w_up));
        let x = normal(rng, pairs * n_in, 1.0);
        let x_dev = up(g, &x);
        let shape = MatmulShape::new(pairs, n_in, n_out, n_out, false);
        // The CUDA cores' kernels, then the tensor cores' (x rounded to bf16, as their twins).
        for mma in [false, true] {
            let (twin, swiglu_twin): (GemvTwin, SwigluTwin) = match mma {
                false => (twins::gemv_experts_bf16, twins::gemv_swiglu_experts_bf16),
                true => (
                    twins::gemv_experts_mma_bf16,
                    twins::gemv_swiglu_experts_mma_bf16,
                ),
            };
            let what = format!(
                "bf16 {experts} experts of {n_out} x {n_in}, {n} tokens, top {k}, mma {mma}"
            );
            let mut cpu = vec![f32::NAN; pairs * n_out];
            twin(&mut cpu, &x, &w, host_runs, shape);
            let mut out = poisoned(g, pairs * n_out);
            let w_view = w_dev.as_view();
            let x_view = x_dev.as_view();
            let one = (&w_view, None);
            g.gemv_experts_bf16(&mut out.as_view_mut(), &x_view, one, dev_runs, shape, mma)
                .unwrap();
            assert_close(&what, &down(g, &out), &cpu, LONG_REDUCTION);

            let mut cpu = vec![f32::NAN; pairs * n_out];
            swiglu_twin(&mut cpu, &x, &w, &w_up, host_runs, shape);
            let mut out = poisoned(g, pairs * n_out);
            let up_view = up_dev.as_view();
            let two = (&w_view, Some(&up_view));
            g.gemv_experts_bf16(&mut out.as_view_mut(), &x_view, two, dev_runs, shape, mma)
                .unwrap();
            let what = format!("SwiGLU, {what}");
            assert_close(&what, &down(g, &out), &cpu, SWIGLU_OF_SUMS);
        }
    }
}

/// A bf16 grouped GEMV's twin, and its SwiGLU's.
type GemvTwin = fn(&mut [f32], &[f32], &[u16], Runs<&[u32]>, MatmulShape);
type SwigluTwin = fn(&mut [f32], &[f32], &[u16], &[u16], Runs<&[u32]>, MatmulShape);
