//! GEMV: one token's activations times a bf16 weight matrix. The decode step's workhorse,
//! limited by how fast the weights stream from memory.

use crate::device::{WARP, bf16x2_to_f32, block_dim_x, block_idx_x, ld_nc_v4, thread_idx_x, warp_sum};

/// `out[o] = sum_i w[o, i] * x[i] + bias[o]`.
///
/// - `out`: `[n_out]` f32
/// - `x`: `[n_in]` f32
/// - `w`: `[n_out, n_in]` bf16 (as `u16` bits), rows as PyTorch stores them
/// - `bias`: `[n_out]` f32, or null for none
///
/// Thread mapping: one warp per output row, `blockDim.x / 32` rows per block. Each lane reads
/// 8 weights (16 bytes, one `ld.global.nc.v4`) at a time, the warp 512 contiguous bytes, then
/// the lanes' partial sums meet in a shuffle reduction.
///
/// PRECONDITIONS: `n_in % 8 == 0` and `w` 16-byte aligned (so every 8-weight group is);
/// `blockDim.x` a multiple of 32.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn gemv_bf16(
    out: *mut f32,
    x: *const f32,
    w: *const u16,
    bias: *const f32,
    n_in: u32,
    n_out: u32,
) {
    let (n_in, n_out) = (n_in as usize, n_out as usize);
    let lane = thread_idx_x() % WARP;
    let row = block_idx_x() * (block_dim_x() / WARP) + thread_idx_x() / WARP;
    if row >= n_out {
        return; // a whole warp leaves together: no shuffle loses a partner
    }
    let mut sum = 0.0f32;
    let mut i = lane * 8;
    while i < n_in {
        // SAFETY: i + 8 <= n_in (n_in % 8 == 0); row * n_in + i is a multiple of 8 weights,
        // so 16-byte aligned; the weights are read-only during the launch.
        let packed = unsafe { ld_nc_v4(w.add(row * n_in + i) as *const u32) };
        for (j, pair) in packed.iter().enumerate() {
            let (w0, w1) = bf16x2_to_f32(*pair);
            // SAFETY: i + 2j + 1 < n_in.
            let (x0, x1) = unsafe { (*x.add(i + 2 * j), *x.add(i + 2 * j + 1)) };
            sum += w0 * x0 + w1 * x1;
        }
        i += WARP * 8;
    }
    let sum = warp_sum(sum);
    if lane == 0 {
        // SAFETY: row < n_out; bias, when present, holds n_out floats.
        unsafe {
            let b = if bias.is_null() { 0.0 } else { *bias.add(row) };
            *out.add(row) = sum + b;
        }
    }
}
