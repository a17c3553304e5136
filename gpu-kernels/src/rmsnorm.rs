//! RMSNorm: each row scaled to unit root-mean-square, then by a learned weight.

use crate::device::{block_dim_x, block_idx_x, block_sum, dynamic_shared, sqrt, thread_idx_x};

/// `out[r, i] = x[r, i] / sqrt(mean_j x[r, j]^2 + eps) * weight[i]`.
///
/// - `out`, `x`: `[n_rows, dim]` f32 (may be the same buffer)
/// - `weight`: `[dim]` f32
///
/// Thread mapping: one block per row. Each thread loads its (up to) eight elements
/// `t, t + blockDim, ...` at once, keeps them in registers, and sums their squares; a block
/// reduction (warp shuffles, then one float per warp in shared memory) gives the row's sum.
/// With 1024 threads a row of up to 8192 is one round of loads, not a chain of them (a
/// decode step has a single row, so nothing else hides the latency); longer rows loop.
///
/// PRECONDITIONS: `blockDim.x` a multiple of 32, at most 1024; 32 floats (128 bytes) of
/// dynamic shared memory.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn rmsnorm_f32(
    out: *mut f32,
    x: *const f32,
    weight: *const f32,
    eps: f32,
    dim: u32,
) {
    crate::device::wait_for_previous_kernel();
    const HELD: usize = 8;
    let dim = dim as usize;
    let (t, bd) = (thread_idx_x(), block_dim_x());
    // SAFETY (all accesses): row + i < n_rows * dim for every i < dim read or written.
    unsafe {
        let (x, out) = (x.add(block_idx_x() * dim), out.add(block_idx_x() * dim));
        let mut held = [0.0f32; HELD];
        let mut sum_sq = 0.0f32;
        for (k, h) in held.iter_mut().enumerate() {
            let i = t + k * bd;
            if i < dim {
                *h = *x.add(i);
                sum_sq += *h * *h;
            }
        }
        let mut i = t + HELD * bd;
        while i < dim {
            let v = *x.add(i);
            sum_sq += v * v;
            i += bd;
        }
        // All threads call it; the launch gives 32 floats of shared memory.
        let total = block_sum(sum_sq, dynamic_shared::<f32>());
        let scale = 1.0 / sqrt(total / dim as f32 + eps);
        // Every read of x happened before block_sum's barriers, so writing in place is safe;
        // the tail re-reads only its own elements.
        for (k, h) in held.iter().enumerate() {
            let i = t + k * bd;
            if i < dim {
                *out.add(i) = *h * scale * *weight.add(i);
            }
        }
        let mut i = t + HELD * bd;
        while i < dim {
            *out.add(i) = *x.add(i) * scale * *weight.add(i);
            i += bd;
        }
    }
}
