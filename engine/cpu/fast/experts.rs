//! The fast backend's mixture of experts: the router in f32, then each expert's SwiGLU MLP
//! on the rows of the tokens that chose it, through the same matmuls as a dense MLP (the
//! weights as stored).

use super::math::swiglu_f32;
use super::matmul::{Input, Job, timed_matmul};
use super::timed::Recorder;
use super::weights::Matrix;
use crate::cpu::experts::by_expert;
use crate::cpu::ops::dot;
use crate::model::Experts;
use crate::traffic;

/// `out = sum over each token's chosen experts of weight * down(silu(gate(x)) * up(x))`.
/// `out`, `x`: `[n, dim]`, `x` normed; `input` the pass's (its flags follow the rows).
pub fn experts(rec: &mut Recorder, out: &mut [f32], x: &[f32], e: &Experts<Matrix>, input: &Input) {
    let moe = &e.moe;
    let dim = e.router.len() / moe.n_experts;
    let (n, f) = (x.len() / dim, moe.expert_ffn_dim);
    let mut logits = vec![0.0; n * moe.n_experts];
    rec.time(
        "router_f32",
        || traffic::matmul_f32(n, dim, moe.n_experts, false),
        || {
            for (row, l) in x
                .chunks_exact(dim)
                .zip(logits.chunks_exact_mut(moe.n_experts))
            {
                for (l, w) in l.iter_mut().zip(e.router.chunks_exact(dim)) {
                    *l = dot(row, w);
                }
            }
        },
    );
    out.fill(0.0);
    for (expert, tokens) in by_expert(&logits, moe).iter().enumerate() {
        if tokens.is_empty() {
            continue;
        }
        let m = tokens.len();
        let ids: Vec<usize> = tokens.iter().map(|p| p.0).collect();
        let rows: Vec<f32> = ids
            .iter()
            .flat_map(|&t| &x[t * dim..(t + 1) * dim])
            .copied()
            .collect();
        let mut input = input.of_rows(n, &ids);
        let (mut gate, mut up, mut hidden) = (vec![0.0; m * f], vec![0.0; m * f], vec![0.0; m * f]);
        let mut down = vec![0.0; m * dim];
        let mut gate_up = [
            Job {
                w: &e.gate[expert],
                bias: None,
                out: &mut gate,
            },
            Job {
                w: &e.up[expert],
                bias: None,
                out: &mut up,
            },
        ];
        timed_matmul(rec, &mut gate_up, &rows, dim, &mut input);
        rec.time(
            "swiglu_f32",
            || traffic::swiglu_f32(m * f),
            || swiglu_f32(&mut hidden, &gate, &up),
        );
        let mut down_job = [Job {
            w: &e.down[expert],
            bias: None,
            out: &mut down,
        }];
        timed_matmul(rec, &mut down_job, &hidden, f, &mut input);
        for (&(t, w), d) in tokens.iter().zip(down.chunks_exact(dim)) {
            for (o, d) in out[t * dim..(t + 1) * dim].iter_mut().zip(d) {
                *o += w * d;
            }
        }
    }
}
