//! RMSNorm: each row scaled to unit root-mean-square, then by a learned weight.

use crate::device::{block_dim_x, block_idx_x, block_sum, dynamic_shared, sqrt, thread_idx_x};

/// `out[r, i] = x[r, i] / sqrt(mean_j x[r, j]^2 + eps) * weight[i]`.
///
/// - `out`, `x`: `[n_rows, dim]` f32 (may be the same buffer)
/// - `weight`: `[dim]` f32
///
/// Thread mapping: one block per row; the block's threads stride over the row, sum their
/// squares, and combine them with a block reduction (warp shuffles, then one float per warp
/// in shared memory).
///
/// PRECONDITIONS: `blockDim.x` a multiple of 32, at most 1024; 32 floats (128 bytes) of
/// dynamic shared memory.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn rmsnorm_f32(out: *mut f32, x: *const f32, weight: *const f32, eps: f32, dim: u32) {
    let dim = dim as usize;
    let row = block_idx_x() * dim;
    let mut sum_sq = 0.0f32;
    let mut i = thread_idx_x();
    while i < dim {
        // SAFETY: row + i < n_rows * dim.
        let v = unsafe { *x.add(row + i) };
        sum_sq += v * v;
        i += block_dim_x();
    }
    // SAFETY: all threads call it; the launch gives 32 floats of shared memory.
    let total = unsafe { block_sum(sum_sq, dynamic_shared::<f32>()) };
    let scale = 1.0 / sqrt(total / dim as f32 + eps);
    let mut i = thread_idx_x();
    while i < dim {
        // SAFETY: as above; every read of x happened before block_sum's barriers, so writing
        // in place is safe.
        unsafe { *out.add(row + i) = *x.add(row + i) * scale * *weight.add(i) };
        i += block_dim_x();
    }
}
