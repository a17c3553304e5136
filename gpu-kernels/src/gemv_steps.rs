//! The GEMV as the lesson builds it, the steps before `gemv_bf16`: each a real kernel, held
//! to its CPU twin by the tests and timed on a model's shapes by `rustle bench --lesson`.
//!
//! A decode step reads every weight once, so a GEMV is as fast as its loads. Step 1 gives
//! each output row a thread: simple, and slow, because the 32 threads of a warp read 32
//! different rows, `n_in` apart, and every load instruction touches 32 memory segments for
//! 2 useful bytes each. Step 2 gives each row a warp: lane `l` reads elements `l, l + 32,
//! ...`, so one load instruction covers 64 contiguous bytes, and a shuffle reduction adds the
//! lanes' sums. `gemv_bf16`, step 3, loads 16 bytes per lane (512 per warp instruction) and
//! keeps four loads in flight before it uses any.
//!
//! Every kernel here, as every kernel of rustle, starts with `wait_for_previous_kernel`: the
//! host launches with programmatic dependent launch, and this is where a kernel waits for the
//! one before it (the lesson's chapter on CUDA graphs explains it).

use crate::device::{WARP, bf16_to_f32, global_idx_x, warp_sum};

/// Step 1: `out[o] = sum_i w[o, i] * x[i]`, one thread per output row.
///
/// - `out`: `[n_out]` f32
/// - `x`: `[n_in]` f32
/// - `w`: `[n_out, n_in]` bf16 (as `u16` bits)
///
/// Thread mapping: thread `o` (of blocks of 256) computes row `o`, walking it one weight at a
/// time.
///
/// # Safety
/// The buffers hold the lengths above; the grid covers at least `n_out` threads.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn gemv_step1_thread_per_row_bf16(
    out: *mut f32,
    x: *const f32,
    w: *const u16,
    n_in: u32,
    n_out: u32,
) {
    crate::device::wait_for_previous_kernel();
    let (o, n_in) = (global_idx_x(), n_in as usize);
    if o >= n_out as usize {
        return;
    }
    let mut sum = 0.0f32;
    // SAFETY: o < n_out and i < n_in: inside w, x and out.
    unsafe {
        let row = w.add(o * n_in);
        for i in 0..n_in {
            sum += bf16_to_f32(*row.add(i)) * *x.add(i);
        }
        *out.add(o) = sum;
    }
}

/// Step 2: the same product, one warp per output row.
///
/// - `out`, `x`, `w`: as `gemv_step1_thread_per_row_bf16`
///
/// Thread mapping: blocks of 256 threads, 8 warps; warp `k` of block `b` computes row
/// `8 b + k`, lane `l` summing elements `l, l + 32, ...`; `warp_sum` adds the 32 sums.
///
/// # Safety
/// The buffers hold the lengths above; blocks of 256 threads, the grid covering `n_out`
/// warps.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn gemv_step2_warp_per_row_bf16(
    out: *mut f32,
    x: *const f32,
    w: *const u16,
    n_in: u32,
    n_out: u32,
) {
    crate::device::wait_for_previous_kernel();
    let (lane, o, n_in) = (global_idx_x() % WARP, global_idx_x() / WARP, n_in as usize);
    // The whole warp leaves together: `warp_sum` needs all 32 lanes.
    if o >= n_out as usize {
        return;
    }
    let mut sum = 0.0f32;
    // SAFETY: o < n_out and i < n_in: inside w, x and out.
    unsafe {
        let row = w.add(o * n_in);
        let mut i = lane;
        while i < n_in {
            sum += bf16_to_f32(*row.add(i)) * *x.add(i);
            i += WARP;
        }
    }
    let sum = warp_sum(sum);
    if lane == 0 {
        // SAFETY: o < n_out.
        unsafe { *out.add(o) = sum };
    }
}
