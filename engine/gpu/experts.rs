//! A mixture of experts on the GPU, two ways.
//!
//! Stacked experts (bf16, or one GGUF type a matrix: `ExpertWeights::Stacked`) never leave
//! the device: the router's logits, each token's choice and the pairs grouped by expert
//! (`route_experts_f32`), each pair's row gathered, the grouped GEMVs of gate and up with
//! their SwiGLU and of down (`gemv_experts.rs`), and the outputs added back to each token's
//! row, weighted (`combine_experts_f32`). Eight launches a layer whatever the routing, so a
//! decode step replays as a CUDA graph; each chosen expert's weights read once a step.
//!
//! The others (fp8, an expert of several types: `ExpertWeights::Each`) are chosen on the
//! host (`cpu::experts::Routed`, the CPU's own routing): the logits copied back, the
//! routing up, then for each chosen expert its tokens gathered, its MLP over them through
//! the same plans as a dense MLP's, its outputs added back weighted. That waits on the host
//! between layers (no CUDA graph holds it), and every format the dense MLP reads works.

use cudarc::driver::CudaSlice;

use super::context::Gpu;
use super::kernels::Out;
use super::kernels::route::RoutingOut;
use super::matmul::{Held, Input, MatmulScratch};
use super::matrix::MatrixData;
use super::plan::{Caps, Rules};
use super::steps::{GateUp, Mlp, swiglu};
use super::weights::{ExpertWeights, GpuExperts, GpuMlp};
use crate::config::{Activation, Moe};
use crate::cpu::experts::Routed;
use crate::error::{Error, Result};
use crate::kernel_args::{MatmulShape, RouteShape, Routing, Runs};

/// The device and host buffers of a step's mixture of experts, for `max_tokens` tokens
/// (`pairs` below: `max_tokens * top_k`).
pub struct ExpertScratch {
    logits: CudaSlice<f32>, // [max_tokens, n_experts]
    rows: CudaSlice<f32>,   // [pairs, dim] the pairs' (or one expert's) token rows, gathered
    out: CudaSlice<f32>,    // [pairs, dim] the experts' outputs for them
    sum: CudaSlice<f32>,    // [max_tokens, dim] each token's weighted sum (host's routing)
    index: CudaSlice<u32>,  // [pairs] `Routed::index`, `Routing::index`
    weight: CudaSlice<f32>, // [pairs] `Routed::weight`, `Routing::choice_weight`
    // The device's routing (`kernel_args::Routing`) and the grouped GEMVs' inputs.
    choice: CudaSlice<u32>,     // [pairs]
    pair_of: CudaSlice<u32>,    // [pairs]
    run_expert: CudaSlice<u32>, // [n_experts]
    run_start: CudaSlice<u32>,  // [n_experts + 1]
    hidden: CudaSlice<f32>,     // [pairs, expert_ffn_dim]
    codes: CudaSlice<u8>,       // [pairs, max(dim, expert_ffn_dim)] a GEMV's input, 8-bit
    scales: CudaSlice<f32>,     // [pairs, max(dim, expert_ffn_dim) / 32][2]
    logits_host: Vec<f32>,
}

impl ExpertScratch {
    pub fn new(gpu: &Gpu, moe: &Moe, dim: usize, max_tokens: usize) -> Result<ExpertScratch> {
        let what = "the experts' scratch";
        let pairs = max_tokens * moe.top_k;
        let widest = dim.max(moe.expert_ffn_dim);
        Ok(ExpertScratch {
            logits: gpu.zeros(max_tokens * moe.n_experts, what)?,
            rows: gpu.zeros(pairs * dim, what)?,
            out: gpu.zeros(pairs * dim, what)?,
            sum: gpu.zeros(max_tokens * dim, what)?,
            index: gpu.zeros(pairs, what)?,
            weight: gpu.zeros(pairs, what)?,
            choice: gpu.zeros(pairs, what)?,
            pair_of: gpu.zeros(pairs, what)?,
            run_expert: gpu.zeros(moe.n_experts, what)?,
            run_start: gpu.zeros(moe.n_experts + 1, what)?,
            hidden: gpu.zeros(pairs * moe.expert_ffn_dim, what)?,
            codes: gpu.zeros(pairs * widest, what)?,
            scales: gpu.zeros(pairs * widest / 16, what)?,
            logits_host: vec![],
        })
    }
}

/// What one layer's experts step reads besides its weights: the plans' choices and the
/// activation of the experts' MLPs.
pub struct ExpertStep<'a> {
    pub caps: &'a Caps,
    pub rules: &'a Rules,
    pub act: Activation,
}

/// `x += sum over each token's chosen experts of weight * down(act(gate(xb)) * up(xb))`,
/// `x` and `xb` (the normed stream, f32 rows written) `[n, dim]`: `cpu::experts::experts_f32`
/// step for step, then the residual add. `mlp`: the MLP's `[n, ffn]` buffers (`ffn` at
/// least the experts' width).
pub fn experts(
    g: &Gpu,
    mm: &mut MatmulScratch,
    s: &mut ExpertScratch,
    (x, xb): (&mut Out<f32>, &Input),
    mlp: Mlp,
    e: &GpuExperts,
    step: &ExpertStep,
) -> Result<()> {
    let dim = e.router.n_in;
    let n = xb.rows.len() / dim;
    let (moe, ffn) = (&e.moe, e.moe.expert_ffn_dim);
    assert!(
        xb.held.rows,
        "the experts gather the normed rows themselves"
    );

    let logits = &mut s.logits.slice_mut(..n * moe.n_experts);
    let plan = step.caps.plan(step.rules, &e.router, n);
    mm.matmul(g, logits, xb, &e.router, None, &plan)?;
    let each = match &e.experts {
        ExpertWeights::Stacked(stack) => {
            assert!(step.act == Activation::Silu, "the grouped GEMVs' SwiGLU");
            return grouped(g, s, (x, xb), stack, moe);
        }
        ExpertWeights::Each(each) => each,
    };
    s.logits_host.resize(n * moe.n_experts, 0.0);
    g.stream
        .memcpy_dtoh(logits, &mut s.logits_host)
        .map_err(Error::driver("copying the router's logits"))?;
    g.sync()?;
    let routed = Routed::of(&s.logits_host, moe);
    let pairs = routed.index.len();
    g.stream
        .memcpy_htod(&routed.index, &mut s.index.slice_mut(..pairs))
        .map_err(Error::driver("uploading the routing"))?;
    g.stream
        .memcpy_htod(&routed.weight, &mut s.weight.slice_mut(..pairs))
        .map_err(Error::driver("uploading the routing"))?;

    let sum = &mut s.sum.slice_mut(..n * dim);
    g.stream
        .memset_zeros(sum)
        .map_err(Error::driver("clearing the experts' sum"))?;
    let Mlp { hidden, gate, up } = mlp;
    for &(expert, first, m) in &routed.runs {
        let index = &s.index.slice(first..first + m);
        let weight = &s.weight.slice(first..first + m);
        let rows = &mut s.rows.slice_mut(..m * dim);
        // SAFETY: the routing's indices are tokens of this pass (below n) and distinct
        // within an expert's run.
        unsafe { g.gather_rows_f32(rows, &xb.rows, index, dim) }?;
        let input = Input {
            rows: rows.as_view(),
            held: Held::ROWS,
        };
        let w = &each[expert];
        let gate_up = GateUp::plan(step.caps, step.rules, w, m, step.act);
        let down_plan = step.caps.plan(step.rules, &w.down, m);
        let buffers = Mlp {
            hidden: &mut hidden.slice_mut(..m * ffn),
            gate: &mut gate.slice_mut(..m * ffn),
            up: &mut up.slice_mut(..m * ffn),
        };
        let held = swiglu(g, mm, buffers, &input, w, &gate_up, None)?;
        let hidden_in = Input {
            rows: hidden.slice(..m * ffn),
            held,
        };
        let out = &mut s.out.slice_mut(..m * dim);
        mm.matmul(g, out, &hidden_in, &w.down, None, &down_plan)?;
        // SAFETY: as the gather's.
        unsafe { g.scatter_add_rows_f32(sum, &out.as_view(), index, weight, dim) }?;
    }
    g.residual_add_f32(x, &sum.as_view())
}

/// The stacked experts' step after the router's logits (in `s.logits`): routed, gathered,
/// multiplied and added back on the device (the module's first way).
fn grouped(
    g: &Gpu,
    s: &mut ExpertScratch,
    (x, xb): (&mut Out<f32>, &Input),
    stack: &GpuMlp,
    moe: &Moe,
) -> Result<()> {
    let (dim, f, k) = (stack.gate.n_in, moe.expert_ffn_dim, moe.top_k);
    let n = xb.rows.len() / dim;
    let pairs = n * k;
    let mut routing: RoutingOut = Routing {
        choice: s.choice.slice_mut(..pairs),
        choice_weight: s.weight.slice_mut(..pairs),
        index: s.index.slice_mut(..pairs),
        run_expert: s.run_expert.as_view_mut(),
        run_start: s.run_start.as_view_mut(),
        pair_of: s.pair_of.slice_mut(..pairs),
    };
    let logits = s.logits.slice(..n * moe.n_experts);
    g.route_experts_f32(&logits, &mut routing, RouteShape::new(n, moe))?;
    let rows = &mut s.rows.slice_mut(..pairs * dim);
    // SAFETY: the routing's tokens are this pass's (below n).
    unsafe { g.gather_rows_f32(rows, &xb.rows, &s.index.slice(..pairs), dim) }?;

    let (expert, start) = (s.run_expert.as_view(), s.run_start.as_view());
    let runs = Runs {
        expert: &expert,
        start: &start,
    };
    let hidden = &mut s.hidden.slice_mut(..pairs * f);
    let out = &mut s.out.slice_mut(..pairs * dim);
    let gate_up = MatmulShape::new(pairs, dim, f, f, false);
    let down = MatmulShape::new(pairs, f, dim, dim, false);
    // The runs' average length: the tensor cores' GEMVs where a pass's eight columns would be
    // mostly full (`Gpu::gemv_on_mma`, `Gpu::experts_bf16_on_mma`).
    let per_run = pairs.div_ceil(moe.n_experts.min(pairs));
    match (&stack.gate.data, &stack.up.data, &stack.down.data) {
        (MatrixData::Bf16(w_gate), MatrixData::Bf16(w_up), MatrixData::Bf16(w_down)) => {
            let (w_gate, w_up) = (w_gate.as_view(), w_up.as_view());
            let (x, w) = (&rows.as_view(), (&w_gate, Some(&w_up)));
            let mma = g.experts_bf16_on_mma(per_run, dim);
            g.gemv_experts_bf16(hidden, x, w, runs, gate_up, mma)?;
            let (x, w) = (&hidden.as_view(), (&w_down.as_view(), None));
            let mma = g.experts_bf16_on_mma(per_run, f);
            g.gemv_experts_bf16(out, x, w, runs, down, mma)?;
        }
        (MatrixData::Blocks(w_gate), MatrixData::Blocks(w_up), MatrixData::Blocks(w_down)) => {
            let (w_gate, w_up, w_down) = (w_gate[0].view(), w_up[0].view(), w_down[0].view());
            let codes = &mut s.codes.slice_mut(..pairs * dim);
            let scales = &mut s.scales.slice_mut(..pairs * dim / 16);
            g.quantize_q8_f32(codes, scales, &rows.as_view(), pairs * dim)?;
            let input = (&codes.as_view(), &scales.as_view());
            let mma = |ty| g.gemv_on_mma(ty, per_run);
            let up = (&w_gate, Some(&w_up));
            g.gemv_experts_codes(hidden, input, up, runs, gate_up, mma(w_gate.ty))?;
            let codes = &mut s.codes.slice_mut(..pairs * f);
            let scales = &mut s.scales.slice_mut(..pairs * f / 16);
            g.quantize_q8_f32(codes, scales, &hidden.as_view(), pairs * f)?;
            let input = (&codes.as_view(), &scales.as_view());
            g.gemv_experts_codes(out, input, (&w_down, None), runs, down, mma(w_down.ty))?;
        }
        _ => unreachable!("stacked experts are bf16 or GGUF blocks through and through"),
    }
    let choice = (&s.pair_of.slice(..pairs), &s.weight.slice(..pairs));
    // SAFETY: the routing's pairs are below n * k.
    unsafe { g.combine_experts_f32(x, &out.as_view(), choice, dim, k) }
}
