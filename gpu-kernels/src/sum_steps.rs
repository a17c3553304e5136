//! The reductions as the lesson builds them, alone: the sum of each row of a matrix, first by
//! one warp (`warp_sum`), then by one block (`block_sum`). Each is a real kernel, held to its
//! CPU twin by the tests and timed by `rustle bench --lesson` beside `rmsnorm_f32`, whose
//! block reduction they isolate.
//!
//! Step 1 gives a row to a warp: lane `l` adds elements `l, l + 32, ...`, then five shuffles
//! add the 32 lanes' sums, no shared memory, no barrier. A long row is then a long chain of
//! loads per lane (each add waits for its load before the next load issues): 4096 floats
//! are 128 rounds. Step 2 gives a row to a block of 1024 threads: each thread adds a few
//! elements (4 rounds for a 4096-wide row), each warp reduces with shuffles, and the warps
//! meet in shared memory (`block_sum`: two barriers). RMSNorm reduces its row the same way,
//! its loads issued before any add (the lesson's chapter 4).

use crate::device::{
    WARP, block_dim_x, block_idx_x, block_sum, dynamic_shared, global_idx_x, thread_idx_x, warp_sum,
};

/// Step 1: `out[r] = sum_i x[r, i]`, one warp per row.
///
/// - `out`: `[n_rows]` f32
/// - `x`: `[n_rows, n_cols]` f32
///
/// Thread mapping: blocks of 256 threads, 8 warps; warp `k` of block `b` sums row `8 b + k`,
/// lane `l` adding elements `l, l + 32, ...`; `warp_sum` adds the 32 lanes' sums and lane 0
/// writes the row's.
///
/// # Safety
/// The buffers hold the lengths above; the grid covers at least `32 n_rows` threads.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn sum_step1_warp_f32(
    out: *mut f32,
    x: *const f32,
    n_cols: u32,
    n_rows: u32,
) {
    crate::device::wait_for_previous_kernel();
    let (lane, r, n_cols) = (
        global_idx_x() % WARP,
        global_idx_x() / WARP,
        n_cols as usize,
    );
    // The whole warp leaves together: `warp_sum` needs all 32 lanes.
    if r >= n_rows as usize {
        return;
    }
    let mut sum = 0.0f32;
    // SAFETY: r < n_rows and i < n_cols: inside x.
    unsafe {
        let row = x.add(r * n_cols);
        let mut i = lane;
        while i < n_cols {
            sum += *row.add(i);
            i += WARP;
        }
    }
    let sum = warp_sum(sum);
    if lane == 0 {
        // SAFETY: r < n_rows.
        unsafe { *out.add(r) = sum };
    }
}

/// Step 2: the same sums, one block per row.
///
/// - `out`, `x`: as `sum_step1_warp_f32`
///
/// Thread mapping: block `r` sums row `r`; thread `t` adds elements `t, t + blockDim.x, ...`,
/// `block_sum` adds the block's sums (each warp's by shuffles, then the warps' through 32
/// floats of dynamic shared memory) and thread 0 writes the row's.
///
/// # Safety
/// The buffers hold the lengths above; one block per row (`gridDim.x = n_rows`); `blockDim.x`
/// a multiple of 32, at most 1024; 32 floats (128 bytes) of dynamic shared memory.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn sum_step2_block_f32(
    out: *mut f32,
    x: *const f32,
    n_cols: u32,
    n_rows: u32,
) {
    crate::device::wait_for_previous_kernel();
    let (r, t, n_cols) = (block_idx_x(), thread_idx_x(), n_cols as usize);
    // The whole block leaves together: `block_sum` needs every thread.
    if r >= n_rows as usize {
        return;
    }
    let mut sum = 0.0f32;
    // SAFETY: r < n_rows and i < n_cols: inside x.
    unsafe {
        let row = x.add(r * n_cols);
        let mut i = t;
        while i < n_cols {
            sum += *row.add(i);
            i += block_dim_x();
        }
    }
    // SAFETY: every thread of the block gets here; the block size and the 32 floats of shared
    // memory are preconditions.
    let total = unsafe { block_sum(sum, dynamic_shared::<f32>()) };
    if t == 0 {
        // SAFETY: r < n_rows.
        unsafe { *out.add(r) = total };
    }
}
