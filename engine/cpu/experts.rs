//! A mixture of experts on the CPU: the router's choice for each token, and the reference
//! backend's MLP of experts (the fast backend's is `fast::experts`).

pub use super::ops::route;
use super::timed::Ops;
use crate::config::Moe;
use crate::model::Experts;

/// Each token's rows grouped by expert: for expert `e`, the (token, weight) pairs that chose
/// it, tokens in order. `logits`: `[n, n_experts]`.
pub fn by_expert(logits: &[f32], moe: &Moe) -> Vec<Vec<(usize, f32)>> {
    let mut groups = vec![vec![]; moe.n_experts];
    for (t, row) in logits.chunks_exact(moe.n_experts).enumerate() {
        for (e, w) in route(row, moe) {
            groups[e].push((t, w));
        }
    }
    groups
}

/// A batch's tokens grouped by the experts they chose, flat: for each expert chosen by some
/// token, a run of `index` (its tokens, in order) and `weight` (its weight for each), the
/// experts in order. What the GPU uploads in one copy each, and both backends walk.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Routed {
    /// `[n * top_k]`: the token of each (token, expert) pair.
    pub index: Vec<u32>,
    /// `[n * top_k]`: the router's weight of each pair.
    pub weight: Vec<f32>,
    /// (expert, first pair, pairs) for each expert some token chose.
    pub runs: Vec<(usize, usize, usize)>,
}

impl Routed {
    /// The routing of `logits` (`[n, n_experts]`), grouped by expert.
    pub fn of(logits: &[f32], moe: &Moe) -> Routed {
        let mut r = Routed::default();
        for (expert, tokens) in by_expert(logits, moe).iter().enumerate() {
            if tokens.is_empty() {
                continue;
            }
            r.runs.push((expert, r.index.len(), tokens.len()));
            r.index.extend(tokens.iter().map(|&(t, _)| t as u32));
            r.weight.extend(tokens.iter().map(|&(_, w)| w));
        }
        r
    }
}

/// `out = sum over each token's chosen experts of weight * down(silu(gate(x)) * up(x))`: the
/// MLP of a mixture of experts. `out`, `x`: `[n, dim]`, `x` normed. The GPU's step for step:
/// each expert's tokens gathered, its MLP over them, its outputs added back weighted, the
/// experts in order.
pub fn experts_f32(o: &mut Ops, out: &mut [f32], x: &[f32], e: &Experts<Vec<f32>>, dim: usize) {
    let moe = &e.moe;
    let n = x.len() / dim;
    let f = moe.expert_ffn_dim;
    let mut logits = vec![0.0; n * moe.n_experts];
    o.matmul_f32(&mut logits, x, &e.router, None, dim);
    out.fill(0.0);
    let routed = Routed::of(&logits, moe);
    for &(expert, first, m) in &routed.runs {
        let (index, weight) = (
            &routed.index[first..first + m],
            &routed.weight[first..first + m],
        );
        let mut rows = vec![0.0; m * dim];
        o.gather_rows_f32(&mut rows, x, index, dim);
        let (mut gate, mut up, mut hidden) = (vec![0.0; m * f], vec![0.0; m * f], vec![0.0; m * f]);
        let mut down = vec![0.0; m * dim];
        o.matmul_f32(&mut gate, &rows, &e.gate[expert], None, dim);
        o.matmul_f32(&mut up, &rows, &e.up[expert], None, dim);
        o.swiglu_f32(&mut hidden, &gate, &up);
        o.matmul_f32(&mut down, &hidden, &e.down[expert], None, f);
        o.scatter_add_rows_f32(out, &down, index, weight, dim);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::ops::{combine_experts_f32, route_experts_f32};
    use crate::kernel_args::{RouteShape, Routing};

    #[test]
    fn the_router_keeps_the_most_probable_and_renormalizes() {
        let moe = Moe {
            n_experts: 4,
            top_k: 2,
            expert_ffn_dim: 1,
            renormalize: true,
        };
        let chosen = route(&[0.0, 2.0, 1.0, 2.0], &moe);
        // Experts 1 and 3 tie for the best: both kept, the lower first, half each.
        assert_eq!(chosen.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 3]);
        assert!(chosen.iter().all(|c| (c.1 - 0.5).abs() < 1e-6));
        // Without renormalizing the weights are the softmax over all four.
        let raw = route(
            &[0.0, 2.0, 1.0, 2.0],
            &Moe {
                renormalize: false,
                ..moe
            },
        );
        let total: f32 = [0.0f32, 2.0, 1.0, 2.0].iter().map(|l| l.exp()).sum();
        assert!((raw[0].1 - 2f32.exp() / total).abs() < 1e-6);
        // Grouped by expert, tokens in order.
        let groups = by_expert(&[0.0, 2.0, 1.0, 2.0, 5.0, 0.0, 4.0, 0.0], &moe);
        let tokens: Vec<Vec<usize>> = groups
            .iter()
            .map(|g| g.iter().map(|p| p.0).collect())
            .collect();
        assert_eq!(tokens, vec![vec![1], vec![0], vec![1], vec![0]]);
        // Flat, as the GPU uploads it: every expert some token chose, in order.
        let routed = Routed::of(&[0.0, 2.0, 1.0, 2.0, 5.0, 0.0, 4.0, 0.0], &moe);
        assert_eq!(routed.index, vec![1, 0, 1, 0]);
        assert_eq!(
            routed.runs,
            vec![(0, 0, 1), (1, 1, 1), (2, 2, 1), (3, 3, 1)]
        );
        assert!((routed.weight.iter().sum::<f32>() - 2.0).abs() < 1e-6);
    }

    /// The twin's grouping is `Routed`'s (the host's routing, which the reference backend
    /// and the GPU's host path walk), and its add back is the weighted sum of each token's
    /// experts.
    #[test]
    fn the_routing_twin_groups_as_routed_does() {
        let moe = Moe {
            n_experts: 6,
            top_k: 2,
            expert_ffn_dim: 1,
            renormalize: true,
        };
        let n = 5;
        let logits: Vec<f32> = (0..n * 6)
            .map(|i| ((i * 7919) % 23) as f32 * 0.37)
            .collect();
        let (pairs, shape) = (n * 2, RouteShape::new(n, &moe));
        let (mut choice, mut weight, mut index) =
            (vec![0; pairs], vec![0.0; pairs], vec![0; pairs]);
        let (mut run_expert, mut run_start, mut pair_of) = (vec![9; 6], vec![9; 7], vec![0; pairs]);
        let mut r = Routing {
            choice: choice.as_mut_slice(),
            choice_weight: weight.as_mut_slice(),
            index: index.as_mut_slice(),
            run_expert: run_expert.as_mut_slice(),
            run_start: run_start.as_mut_slice(),
            pair_of: pair_of.as_mut_slice(),
        };
        route_experts_f32(&logits, &mut r, shape);
        let routed = Routed::of(&logits, &moe);
        assert_eq!(index, routed.index);
        for (j, &(expert, first, m)) in routed.runs.iter().enumerate() {
            assert_eq!((run_expert[j], run_start[j]), (expert as u32, first as u32));
            assert_eq!(run_start[j + 1], (first + m) as u32);
        }
        let used = routed.runs.len();
        assert!(run_start[used..].iter().all(|&s| s == pairs as u32));
        assert!(run_expert[used..].iter().all(|&e| e == 0));
        for p in 0..pairs {
            // Each choice's pair is a pair of its token, in its expert's run.
            let pair = pair_of[p] as usize;
            assert_eq!(index[pair] as usize, p / 2);
            let run = routed
                .runs
                .iter()
                .find(|r| r.1 <= pair && pair < r.1 + r.2)
                .unwrap();
            assert_eq!(run.0 as u32, choice[p]);
            assert_eq!(routed.weight[pair], weight[p]);
        }

        // Rows of one value a pair: each token gets its two weights times them, added.
        let dim = 3;
        let rows: Vec<f32> = (0..pairs * dim).map(|i| (i / dim) as f32).collect();
        let mut x = vec![1.0f32; n * dim];
        combine_experts_f32(&mut x, &rows, &pair_of, &weight, dim, 2);
        for t in 0..n {
            let want = 1.0
                + weight[2 * t] * pair_of[2 * t] as f32
                + weight[2 * t + 1] * pair_of[2 * t + 1] as f32;
            assert!((x[t * dim] - want).abs() < 1e-6);
        }
    }
}
