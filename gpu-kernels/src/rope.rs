//! Rotary position embedding, rotate-half layout, in place.

use crate::args::Heads;
use crate::device::{f32_to_bf16, global_idx_x};

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
