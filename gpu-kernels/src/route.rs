//! A mixture of experts' routing, on the device: each token's choice of experts from its
//! router logits, the tokens grouped by expert for the grouped GEMVs (`gemv_experts.rs`),
//! and the experts' outputs added back to each token's row, weighted. With these the host
//! never reads the choice, so a step of a mixture of experts holds no wait on the host and
//! replays as a CUDA graph.
//!
//! The grouping is `cpu::experts::Routed`'s, laid out for kernels: the (token, expert)
//! pairs in expert order, tokens in order within an expert (`index`); one run of pairs per
//! chosen expert, the experts in order (`run_expert`, `run_start`), the runs past the last
//! chosen expert empty; and where each token's choices landed (`pair_of`).

use crate::args::RouteShape;
use crate::device::{
    WARP, ballot, block_dim_x, block_idx_x, block_idx_y, dynamic_shared, exp, shfl_up_u32,
    shfl_xor, shfl_xor_u32, sync_threads, thread_idx_x, wait_for_previous_kernel, warp_max,
    warp_sum,
};
use crate::tiles::ROUTE_SHARED_PAIRS;

/// The larger of two (probability, expert) candidates, the lower expert among equals: the
/// CPU's stable order.
#[inline(always)]
fn better(a: (f32, u32), b: (f32, u32)) -> (f32, u32) {
    if b.0 > a.0 || (b.0 == a.0 && b.1 < a.1) {
        b
    } else {
        a
    }
}

/// Routes `n_tokens` tokens to their `top_k` experts and groups them by expert.
///
/// - `logits`: `[n_tokens, n_experts]` f32, the router's
/// - `choice`: `[n_tokens, top_k]` u32, each token's experts, the most probable first
/// - `choice_weight`: `[n_tokens, top_k]` f32, their weights: the softmax over every
///   expert's logit, renormalized over the kept ones where `shape.renormalize`
/// - `index`: `[n_tokens * top_k]` u32, the token of each pair, pairs grouped by expert
/// - `run_expert`: `[n_experts]` u32, the expert of run j (0 for the empty runs at the end)
/// - `run_start`: `[n_experts + 1]` u32, run j's pairs `run_start[j] .. run_start[j + 1]`
/// - `pair_of`: `[n_tokens, top_k]` u32, the pair that token t's choice s became
///
/// Thread mapping: one block. First each warp takes a token at a time: its lanes find the
/// largest logit and the sum of the exponentials (shuffles), leave the exponentials in the
/// warp's row of shared memory, and pick the `top_k` largest one after another, a warp
/// argmax each (the chosen one then marked -1, below any exponential); the choices also go
/// to shared memory, where they fit (`ROUTE_SHARED_PAIRS`). Then a warp counts an expert's
/// pairs, 32 choices a ballot; warp 0 lays the runs out, each lane a slice of the experts,
/// the slices' offsets from a scan of shuffles; and a warp writes an expert's pairs in
/// token order, each lane's place from the ballot's lanes below it. Each expert's walk is the
/// same work whatever the others chose, and the order of everything written is fixed, so the
/// same logits give the same grouping every run.
///
/// # Safety
/// The buffers are as listed and do not overlap; `1 <= top_k <= n_experts`; one block of
/// `blockDim.x` threads (a multiple of 32) with `route_shared_bytes(blockDim.x / 32,
/// n_experts, n_tokens * top_k)` bytes of dynamic shared memory.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn route_experts_f32(
    logits: *const f32,
    choice: *mut u32,
    choice_weight: *mut f32,
    index: *mut u32,
    run_expert: *mut u32,
    run_start: *mut u32,
    pair_of: *mut u32,
    shape: RouteShape,
) {
    wait_for_previous_kernel();
    let [n, experts, k] = shape.sizes();
    let pairs = n * k;
    let (warp, lane) = (thread_idx_x() / WARP, thread_idx_x() % WARP);
    let warps = block_dim_x() / WARP;
    // SAFETY (all shared memory below): `route_shared_bytes`' layout: `[warps][experts]` f32
    // probabilities, `[experts]` u32 counts, `[experts]` u32 starts, the runs' count and
    // the pairs', then the choices as u16 where they fit.
    let shared = dynamic_shared::<f32>();
    let probs = unsafe { shared.add(warp * experts) };
    let counts = unsafe { shared.add(warps * experts) } as *mut u32;
    let starts = unsafe { counts.add(experts) };
    let totals = unsafe { starts.add(experts) };
    let staged = pairs <= ROUTE_SHARED_PAIRS;
    let sel = unsafe { totals.add(2) } as *mut u16;
    // The expert of choice p, from shared memory where staged.
    // SAFETY: p < pairs, written before the barrier that precedes every call.
    let chosen = |p: usize| unsafe {
        if staged {
            *sel.add(p) as usize
        } else {
            *choice.add(p) as usize
        }
    };

    let mut t = warp;
    while t < n {
        // SAFETY: t < n: the token's row of logits; e < experts below.
        let row = unsafe { logits.add(t * experts) };
        let mut max = f32::NEG_INFINITY;
        let mut e = lane;
        while e < experts {
            max = max.max(unsafe { *row.add(e) });
            e += WARP;
        }
        let max = warp_max(max);
        let mut sum = 0.0f32;
        let mut e = lane;
        while e < experts {
            let p = exp(unsafe { *row.add(e) } - max);
            unsafe { *probs.add(e) = p };
            sum += p;
            e += WARP;
        }
        let sum = warp_sum(sum);
        let mut kept = 0.0f32;
        for s in 0..k {
            let mut best = (-1.0f32, u32::MAX);
            let mut e = lane;
            while e < experts {
                best = better(best, (unsafe { *probs.add(e) }, e as u32));
                e += WARP;
            }
            let mut mask = 16;
            while mask > 0 {
                let other = (shfl_xor(best.0, mask), shfl_xor_u32(best.1, mask));
                best = better(best, other);
                mask >>= 1;
            }
            // Every lane holds the winner; its owner marks it taken. (Only logits of NaN
            // leave no winner: the last expert then stands in, inside every buffer.)
            let (p, e) = (best.0, (best.1 as usize).min(experts - 1));
            if e % WARP == lane {
                unsafe { *probs.add(e) = -1.0 };
            }
            kept += p / sum;
            if lane == 0 {
                // SAFETY: t * k + s < pairs.
                unsafe {
                    *choice.add(t * k + s) = e as u32;
                    *choice_weight.add(t * k + s) = p / sum;
                    if staged {
                        *sel.add(t * k + s) = e as u16;
                    }
                }
            }
        }
        if shape.renormalize != 0 && lane == 0 {
            for s in 0..k {
                // SAFETY: as above; the lane's own writes.
                unsafe { *choice_weight.add(t * k + s) /= kept };
            }
        }
        t += warps;
    }
    // SAFETY: every thread reaches the barrier; it orders the choices (shared memory, and
    // global memory of this block's) before the walks that read them.
    unsafe { sync_threads() };

    // Warp w counts experts w, w + warps, ...: its lanes look at 32 choices at a time, and a
    // ballot says which of them chose the expert.
    let mut e = warp;
    while e < experts {
        let mut count = 0;
        let mut p = lane;
        while p < pairs.next_multiple_of(WARP) {
            count += ballot(p < pairs && chosen(p) == e).count_ones();
            p += WARP;
        }
        if lane == 0 {
            unsafe { *counts.add(e) = count };
        }
        e += warps;
    }
    unsafe { sync_threads() };
    if warp == 0 {
        // Lane l lays out experts [lo, hi): its pairs and its chosen experts, their offsets
        // the lanes' before it (an exclusive scan of shuffles).
        let per = experts.div_ceil(WARP);
        let (lo, hi) = ((lane * per).min(experts), ((lane + 1) * per).min(experts));
        let (mut mine, mut used) = (0u32, 0u32);
        for e in lo..hi {
            let c = unsafe { *counts.add(e) };
            mine += c;
            used += (c > 0) as u32;
        }
        let (mut before, mut runs_before) = (mine, used);
        let mut delta = 1;
        while delta < WARP as u32 {
            let (b, r) = (shfl_up_u32(before, delta), shfl_up_u32(runs_before, delta));
            if lane as u32 >= delta {
                before += b;
                runs_before += r;
            }
            delta <<= 1;
        }
        if lane == WARP - 1 {
            // SAFETY: the two totals' slots.
            unsafe { (*totals, *totals.add(1)) = (runs_before, before) };
        }
        let (mut start, mut run) = (before - mine, (runs_before - used) as usize);
        for e in lo..hi {
            // SAFETY: e < experts; run < the runs, at most experts.
            unsafe {
                *starts.add(e) = start;
                let c = *counts.add(e);
                if c > 0 {
                    *run_expert.add(run) = e as u32;
                    *run_start.add(run) = start;
                    run += 1;
                }
                start += c;
            }
        }
    }
    unsafe { sync_threads() };
    // The empty runs after the last, each starting (and ending) where every pair has.
    let (used, total) = unsafe { (*totals as usize, *totals.add(1)) };
    let mut j = used + thread_idx_x();
    while j <= experts {
        // SAFETY: j <= experts: run_start holds experts + 1, run_expert experts.
        unsafe {
            if j < experts {
                *run_expert.add(j) = 0;
            }
            *run_start.add(j) = total;
        }
        j += block_dim_x();
    }
    // Warp w writes experts w, w + warps, ...'s pairs in order: of each 32 choices, a lane
    // that chose the expert writes its pair at the run's next place plus the lanes below it
    // that chose it too.
    let mut e = warp;
    while e < experts {
        let mut at = unsafe { *starts.add(e) } as usize;
        let mut p = lane;
        while p < pairs.next_multiple_of(WARP) {
            let mine = p < pairs && chosen(p) == e;
            let mask = ballot(mine);
            if mine {
                let slot = at + (mask & ((1u32 << lane) - 1)).count_ones() as usize;
                // SAFETY: p < pairs; slot stays below expert e's run's end (its count).
                unsafe {
                    *index.add(slot) = (p / k) as u32;
                    *pair_of.add(p) = slot as u32;
                }
            }
            at += mask.count_ones() as usize;
            p += WARP;
        }
        e += warps;
    }
}

/// `x[t, :] += sum over s < top_k of choice_weight[t, s] * rows[pair_of[t, s], :]`: each
/// token's experts' outputs, weighted, added to its residual row (the sum first, in choice
/// order, then the add).
///
/// - `x`: `[n_tokens, dim]` f32, the residual stream, updated in place
/// - `rows`: `[n_tokens * top_k, dim]` f32, the experts' outputs in pair order
/// - `pair_of`, `choice_weight`: `[n_tokens, top_k]`, as `route_experts_f32` left them
///
/// Thread mapping: grid `(ceil(dim / blockDim.x), n_tokens)`, a thread a column of a token.
///
/// # Safety
/// The buffers are as listed, every `pair_of` below `n_tokens * top_k`; `x` overlaps no
/// input; the grid's y is `n_tokens`.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn combine_experts_f32(
    x: *mut f32,
    rows: *const f32,
    pair_of: *const u32,
    choice_weight: *const f32,
    dim: u32,
    top_k: u32,
) {
    wait_for_previous_kernel();
    let (t, dim, k) = (block_idx_y(), dim as usize, top_k as usize);
    let col = block_idx_x() * block_dim_x() + thread_idx_x();
    if col < dim {
        let mut sum = 0.0f32;
        for s in 0..k {
            // SAFETY: t < n_tokens, s < k; the pair's row inside rows (preconditions).
            unsafe {
                let pair = *pair_of.add(t * k + s) as usize;
                sum += *choice_weight.add(t * k + s) * *rows.add(pair * dim + col);
            }
        }
        // SAFETY: t < n_tokens, col < dim.
        unsafe { *x.add(t * dim + col) += sum };
    }
}
