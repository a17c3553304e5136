//! Rotary position embedding, rotate-half layout, in place.

use crate::args::Heads;
use crate::device::{
    block_dim_x, block_idx_x, f32_to_bf16, global_idx_x, sqrt, thread_idx_x,
    wait_for_previous_kernel, warp_sum,
};

/// In each head of each token, the pair `(x[i], x[i + d/2])` turns by the angle whose cos and
/// sin are `cos[pos, i]` and `sin[pos, i]` (tables computed on the host in f64).
///
/// A step of the lesson, kept and tested as the simplest form: the forward pass runs
/// `qkv_rope_write_bf16`, which does this for q and k and writes the cache in the same pass.
///
/// - `x`: `[n, n_heads, head_dim]` f32, rotated in place
/// - `positions`: `[n]` u32
/// - `cos`, `sin`: `[max_pos, head_dim / 2]` f32
///
/// Thread mapping: one thread per pair: `n * n_heads * head_dim / 2` threads.
///
/// PRECONDITIONS: every `positions[t] < max_pos`; `head_dim` even.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn rope_f32(
    x: *mut f32,
    positions: *const u32,
    cos: *const f32,
    sin: *const f32,
    n_heads: u32,
    head_dim: u32,
    n: u32,
) {
    crate::device::wait_for_previous_kernel();
    let (n_heads, head_dim) = (n_heads as usize, head_dim as usize);
    let half = head_dim / 2;
    let idx = global_idx_x();
    if idx >= n as usize * n_heads * half {
        return;
    }
    let (th, i) = (idx / half, idx % half); // th = t * n_heads + h
    let t = th / n_heads;
    // SAFETY: t < n, positions[t] < max_pos, i < half, th * head_dim + i + half < n * n_heads * head_dim.
    unsafe {
        let pos = *positions.add(t) as usize;
        let (c, s) = (*cos.add(pos * half + i), *sin.add(pos * half + i));
        let head = x.add(th * head_dim);
        let (a, b) = (*head.add(i), *head.add(i + half));
        *head.add(i) = a * c - b * s;
        *head.add(i + half) = b * c + a * s;
    }
}

/// The step between the fused q/k/v projection and attention, in one pass: RoPE on q and k,
/// q out to its own buffer, k and v into their cache slots, rounded to bf16 (the cache holds
/// half the bytes of f32: twice the tokens, and half the reading for attention).
///
/// - `q_out`: `[n, n_heads, head_dim]` f32, rotated queries
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * 16, n_kv_heads * head_dim]` bf16
/// - `qkv`: `[n, q_dim + 2 * kv_dim]` f32, each row `[q | k | v]` as the fused matmul wrote it
/// - `positions`, `slots`: `[n]` u32
/// - `cos`, `sin`: `[max_pos, head_dim / 2]` f32
/// - `heads`: the query and KV heads; `n`: the tokens
///
/// Thread mapping: one thread per unit of work in a row: `q_dim / 2` query pairs, then
/// `kv_dim / 2` key pairs, then `kv_dim` values; `n` rows of them. A thread reads its
/// token's position and slot, and its pair's cos and sin, before the wait for the kernel
/// before (the host wrote the first two, the tables never change): after it, only the row
/// the projection wrote.
///
/// PRECONDITIONS: `head_dim` even; `positions[t] < max_pos`; slots valid, and distinct
/// unless the tokens that share one write the same values; `positions`, `slots`, `cos` and
/// `sin` not written by the kernel before this one (they are read before the wait for it).
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn qkv_rope_write_bf16(
    q_out: *mut f32,
    k_cache: *mut u16,
    v_cache: *mut u16,
    qkv: *const f32,
    positions: *const u32,
    slots: *const u32,
    cos: *const f32,
    sin: *const f32,
    heads: Heads,
    n: u32,
) {
    let (head_dim, half) = (heads.head_dim as usize, heads.head_dim as usize / 2);
    let (q_dim, kv_dim) = (
        heads.n_heads as usize * head_dim,
        heads.n_kv_heads as usize * head_dim,
    );
    let units = q_dim / 2 + kv_dim / 2 + kv_dim;
    let idx = global_idx_x();
    if idx >= n as usize * units {
        crate::device::wait_for_previous_kernel();
        return;
    }
    let (t, u) = (idx / units, idx % units);
    // Pair `p` of the queries or keys, `(i, i + half)` of head `p / half`: its offsets in the
    // destination row.
    let pair = |p: usize| {
        (
            p / half * head_dim + p % half,
            p / half * head_dim + p % half + half,
        )
    };
    // SAFETY: t < n; every index below stays inside its row (q_dim + 2 kv_dim wide) or its
    // cache row (slots valid, preconditions).
    unsafe {
        // The host wrote the positions and slots, and the tables never change: all read
        // before the wait for the kernel before (the projection that writes qkv), so that
        // the angle's cos and sin are not a second load after it.
        let pos = *positions.add(t) as usize;
        let slot = *slots.add(t) as usize;
        let rotating = u < q_dim / 2 + kv_dim / 2;
        let p = if u < q_dim / 2 { u } else { u - q_dim / 2 };
        let (c, s) = if rotating {
            let i = p % half;
            (*cos.add(pos * half + i), *sin.add(pos * half + i))
        } else {
            (0.0, 0.0)
        };
        crate::device::wait_for_previous_kernel();
        let row = qkv.add(t * (q_dim + 2 * kv_dim));
        // The pair at (i, j) of `src`, rotated by position `pos`.
        let rotate = |src: *const f32, (i, j): (usize, usize)| {
            let (a, b) = (*src.add(i), *src.add(j));
            (a * c - b * s, b * c + a * s)
        };
        if u < q_dim / 2 {
            let (i, j) = pair(p);
            let (x, y) = rotate(row, (i, j));
            let dst = q_out.add(t * q_dim);
            *dst.add(i) = x;
            *dst.add(j) = y;
        } else if rotating {
            let (i, j) = pair(p);
            let (x, y) = rotate(row.add(q_dim), (i, j));
            let dst = k_cache.add(slot * kv_dim);
            *dst.add(i) = f32_to_bf16(x);
            *dst.add(j) = f32_to_bf16(y);
        } else {
            let i = u - q_dim / 2 - kv_dim / 2;
            *v_cache.add(slot * kv_dim + i) = f32_to_bf16(*row.add(q_dim + kv_dim + i));
        }
    }
}

/// `qkv_rope_write_bf16` for models that RMSNorm each query and key head before RoPE
/// (Qwen3): the norm, the rotation and the cache write in one pass. A norm kernel of its own
/// took 4.7 us a layer of a Qwen3-8B step timed launch by launch, and with graphs its tok/s
/// rose 1-3% when the norm moved here (docs/lessons.md, round 62).
///
/// - `q_out`, `k_cache`, `v_cache`, `qkv`, `positions`, `slots`, `cos`, `sin`, `heads`, `n`:
///   as `qkv_rope_write_bf16`
/// - `q_weight`, `k_weight`: `[head_dim]` f32, the norms of a query head and of a key head
///
/// Thread mapping: one warp per (token, head) of the row, `blockDim.x / 32` a block: the
/// `n_heads` query heads, then the `n_kv_heads` key heads, then the `n_kv_heads` value heads.
/// In a query or key head a lane holds the pairs `(i, i + head_dim / 2)` for `i = lane,
/// lane + 32, ...` (at most four), so the head's sum of squares is one warp shuffle and each
/// pair is normed and turned in registers. A value head is copied, rounded to bf16. The
/// position, slot, angles and norm weights a lane needs are read before the wait for the
/// kernel before (none of them is written by it).
///
/// PRECONDITIONS: as `qkv_rope_write_bf16`, and `head_dim <= 256`; `blockDim.x` a multiple
/// of 32 and at least `n * (n_heads + 2 * n_kv_heads)` warps in the grid; the weights not
/// written by the kernel before this one.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn qkv_norm_rope_write_bf16(
    q_out: *mut f32,
    k_cache: *mut u16,
    v_cache: *mut u16,
    qkv: *const f32,
    q_weight: *const f32,
    k_weight: *const f32,
    positions: *const u32,
    slots: *const u32,
    cos: *const f32,
    sin: *const f32,
    heads: Heads,
    eps: f32,
    n: u32,
) {
    const PAIRS: usize = 4;
    let (n_heads, n_kv_heads) = (heads.n_heads as usize, heads.n_kv_heads as usize);
    let (head_dim, half) = (heads.head_dim as usize, heads.head_dim as usize / 2);
    let (q_dim, kv_dim) = (n_heads * head_dim, n_kv_heads * head_dim);
    let units = n_heads + 2 * n_kv_heads;
    let (warp, lane) = (thread_idx_x() / 32, thread_idx_x() % 32);
    let unit = block_idx_x() * (block_dim_x() / 32) + warp;
    if unit >= n as usize * units {
        // A whole warp leaves, before the wait: it reads nothing the kernel before wrote.
        return;
    }
    let (t, h) = (unit / units, unit % units);
    // SAFETY: t < n and h < units, so every offset below is inside token t's row (q_dim +
    // 2 kv_dim wide), its q_out row, or its cache row (slots valid, preconditions); pair
    // indices stay below half <= 32 * PAIRS.
    unsafe {
        let pos = *positions.add(t) as usize;
        let slot = *slots.add(t) as usize;
        let row = qkv.add(t * (q_dim + 2 * kv_dim));
        if h >= n_heads + n_kv_heads {
            // A value head: rounded into the cache as it is.
            let at = (h - n_heads - n_kv_heads) * head_dim;
            wait_for_previous_kernel();
            let mut i = lane;
            while i < head_dim {
                *v_cache.add(slot * kv_dim + at + i) =
                    f32_to_bf16(*row.add(q_dim + kv_dim + at + i));
                i += 32;
            }
            return;
        }
        let query = h < n_heads;
        let weight = if query { q_weight } else { k_weight };
        // Each held pair's angle and the two weights of its elements.
        let mut angle = [(0.0f32, 0.0f32); PAIRS];
        let mut w = [(0.0f32, 0.0f32); PAIRS];
        for k in 0..PAIRS {
            let i = lane + 32 * k;
            if i < half {
                angle[k] = (*cos.add(pos * half + i), *sin.add(pos * half + i));
                w[k] = (*weight.add(i), *weight.add(i + half));
            }
        }
        wait_for_previous_kernel();
        // The head's values: query head h, or key head h - n_heads (the keys follow the
        // queries in the row, so the offset is the same expression).
        let src = row.add(h * head_dim);
        let mut pair = [(0.0f32, 0.0f32); PAIRS];
        let mut sum_sq = 0.0f32;
        for (k, p) in pair.iter_mut().enumerate() {
            let i = lane + 32 * k;
            if i < half {
                *p = (*src.add(i), *src.add(i + half));
                sum_sq += p.0 * p.0 + p.1 * p.1;
            }
        }
        // Every lane of the warp is here (the warp left whole or not at all). The norm as
        // `rmsnorm_f32` computes it: x * scale * weight.
        let scale = 1.0 / sqrt(warp_sum(sum_sq) / head_dim as f32 + eps);
        for k in 0..PAIRS {
            let i = lane + 32 * k;
            if i >= half {
                continue;
            }
            let (a, b) = (pair[k].0 * scale * w[k].0, pair[k].1 * scale * w[k].1);
            let (c, s) = angle[k];
            let (x, y) = (a * c - b * s, b * c + a * s);
            if query {
                let dst = q_out.add(t * q_dim + h * head_dim);
                *dst.add(i) = x;
                *dst.add(i + half) = y;
            } else {
                let dst = k_cache.add(slot * kv_dim + (h - n_heads) * head_dim);
                *dst.add(i) = f32_to_bf16(x);
                *dst.add(i + half) = f32_to_bf16(y);
            }
        }
    }
}
