//! A mixture of experts on the GPU: the router's logits on the device, the choice of each
//! token's experts on the host (`cpu::experts::Routed`, the CPU's own routing), then for each
//! chosen expert its tokens gathered into rows of their own, its MLP over them through the
//! same plans as a dense MLP's, and its outputs added back weighted.
//!
//! The host's choice costs one copy of the logits back and one of the routing up per layer,
//! so a step of a mixture of experts waits on the host between layers and is not replayed
//! as a CUDA graph. What it buys: every weight format the dense MLP reads (bf16, fp8, GGUF
//! blocks) works for the experts unchanged, each expert's weights read once a step however
//! many tokens chose it.

use cudarc::driver::CudaSlice;

use super::context::Gpu;
use super::kernels::Out;
use super::matmul::{Held, Input, MatmulScratch};
use super::plan::{Caps, Rules};
use super::steps::{GateUp, Mlp, swiglu};
use super::weights::GpuExperts;
use crate::config::{Activation, Moe};
use crate::cpu::experts::Routed;
use crate::error::{Error, Result};

/// The device and host buffers of a step's mixture of experts, for `max_tokens` tokens.
pub struct ExpertScratch {
    logits: CudaSlice<f32>, // [max_tokens, n_experts]
    rows: CudaSlice<f32>,   // [max_tokens, dim] one expert's tokens, gathered
    out: CudaSlice<f32>,    // [max_tokens, dim] the expert's output for them
    sum: CudaSlice<f32>,    // [max_tokens, dim] each token's weighted sum of its experts
    index: CudaSlice<u32>,  // [max_tokens * top_k] `Routed::index`
    weight: CudaSlice<f32>, // [max_tokens * top_k] `Routed::weight`
    logits_host: Vec<f32>,
}

impl ExpertScratch {
    pub fn new(gpu: &Gpu, moe: &Moe, dim: usize, max_tokens: usize) -> Result<ExpertScratch> {
        let what = "the experts' scratch";
        Ok(ExpertScratch {
            logits: gpu.zeros(max_tokens * moe.n_experts, what)?,
            rows: gpu.zeros(max_tokens * dim, what)?,
            out: gpu.zeros(max_tokens * dim, what)?,
            sum: gpu.zeros(max_tokens * dim, what)?,
            index: gpu.zeros(max_tokens * moe.top_k, what)?,
            weight: gpu.zeros(max_tokens * moe.top_k, what)?,
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
        let w = &e.experts[expert];
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
