//! The twins of `gpu-kernels/src/route.rs`: a mixture of experts' routing, grouped by
//! expert for the grouped GEMVs, and the experts' outputs added back to each token.

use crate::config::Moe;
use crate::kernel_args::{RouteShape, Routing};

/// The experts token's router `logits` (`[n_experts]`) choose and their weights: a softmax
/// over every expert, the `top_k` most probable kept (the lower index first among equals),
/// their weights renormalized to sum to 1 where `moe.renormalize`. Mixtral's softmax over the
/// chosen logits alone is the same as renormalizing.
pub fn route(logits: &[f32], moe: &Moe) -> Vec<(usize, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    // Stable: among equal probabilities the lower index stays first.
    order.sort_by(|&a, &b| exp[b].total_cmp(&exp[a]));
    let mut chosen: Vec<(usize, f32)> = order[..moe.top_k]
        .iter()
        .map(|&e| (e, exp[e] / sum))
        .collect();
    if moe.renormalize {
        let kept: f32 = chosen.iter().map(|c| c.1).sum();
        for c in &mut chosen {
            c.1 /= kept;
        }
    }
    chosen
}

/// Each token's `top_k` experts from its `logits` (`[n_tokens, n_experts]`), grouped by
/// expert: `cpu::experts::route` token by token, then the pairs in expert order, tokens in
/// order within an expert (`kernel_args::Routing` lists the buffers).
pub fn route_experts_f32(
    logits: &[f32],
    r: &mut Routing<&mut [u32], &mut [f32]>,
    shape: RouteShape,
) {
    let [n, experts, k] = shape.sizes();
    let moe = Moe {
        n_experts: experts,
        top_k: k,
        expert_ffn_dim: 0,
        renormalize: shape.renormalize != 0,
    };
    for (t, row) in logits[..n * experts].chunks_exact(experts).enumerate() {
        for (s, (e, w)) in route(row, &moe).into_iter().enumerate() {
            r.choice[t * k + s] = e as u32;
            r.choice_weight[t * k + s] = w;
        }
    }
    let (mut run, mut at) = (0, 0);
    for e in 0..experts {
        let first = at;
        for p in 0..n * k {
            if r.choice[p] as usize == e {
                r.index[at] = (p / k) as u32;
                r.pair_of[p] = at as u32;
                at += 1;
            }
        }
        if at > first {
            r.run_expert[run] = e as u32;
            r.run_start[run] = first as u32;
            run += 1;
        }
    }
    for j in run..=experts {
        if j < experts {
            r.run_expert[j] = 0;
        }
        r.run_start[j] = at as u32;
    }
}

/// `x[t, :] += sum over s of choice_weight[t, s] * rows[pair_of[t, s], :]`, the sum in
/// choice order, then added.
///
/// - `x`: `[n_tokens, dim]`; `rows`: `[n_tokens * top_k, dim]`; `pair_of`,
///   `choice_weight`: `[n_tokens, top_k]`.
pub fn combine_experts_f32(
    x: &mut [f32],
    rows: &[f32],
    pair_of: &[u32],
    choice_weight: &[f32],
    dim: usize,
    top_k: usize,
) {
    for (t, xt) in x.chunks_exact_mut(dim).enumerate() {
        for (c, v) in xt.iter_mut().enumerate() {
            let mut sum = 0.0f32;
            for s in 0..top_k {
                let pair = pair_of[t * top_k + s] as usize;
                sum += choice_weight[t * top_k + s] * rows[pair * dim + c];
            }
            *v += sum;
        }
    }
}
