//! Rotary position embedding, rotate-half layout, in place.

use crate::device::global_idx_x;

/// In each head of each token, the pair `(x[i], x[i + d/2])` turns by the angle whose cos and
/// sin are `cos[pos, i]` and `sin[pos, i]` (tables computed on the host in f64).
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
