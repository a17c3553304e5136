//! Residual add: the skip connection around attention and around the MLP; and the scale of
//! the stream Gemma 3 puts on its embeddings.

use crate::device::global_idx_x;

/// `x[i] += delta[i]` for `i < n`.
///
/// - `x`: `[n]` f32, the residual stream, updated in place.
/// - `delta`: `[n]` f32, the block's output.
///
/// Thread mapping: one thread per element, a one-dimensional grid of any block size.
///
/// PRECONDITIONS: `x` and `delta` each hold at least `n` elements and do not overlap.
///
/// # Safety
/// The caller (the host's launch wrapper) guarantees the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn residual_add_f32(x: *mut f32, delta: *const f32, n: u32) {
    crate::device::wait_for_previous_kernel();
    let i = global_idx_x();
    if i < n as usize {
        // SAFETY: i < n and both buffers hold n elements (preconditions).
        unsafe { *x.add(i) += *delta.add(i) };
    }
}

/// `x[i] *= scale` for `i < n`: Gemma 3's embeddings, times sqrt(hidden) before the first
/// layer.
///
/// - `x`: `[n]` f32, updated in place.
///
/// Thread mapping: one thread per element, a one-dimensional grid of any block size.
///
/// # Safety
/// `x` holds at least `n` elements.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn scale_f32(x: *mut f32, scale: f32, n: u32) {
    crate::device::wait_for_previous_kernel();
    let i = global_idx_x();
    if i < n as usize {
        // SAFETY: i < n.
        unsafe { *x.add(i) *= scale };
    }
}
