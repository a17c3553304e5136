//! Greedy decoding on the GPU: the index of the largest logit, so only one number needs to
//! come back to the host.

use crate::device::{
    WARP, block_dim_x, dynamic_shared, shfl_xor, shfl_xor_u32, sync_threads, thread_idx_x,
};

/// Keeps the better of two (value, index) candidates: the larger value, and on a tie the
/// smaller index (the CPU twin's choice: the first maximum).
#[inline(always)]
fn better(v: f32, i: u32, ov: f32, oi: u32) -> (f32, u32) {
    if ov > v || (ov == v && oi < i) {
        (ov, oi)
    } else {
        (v, i)
    }
}

/// `out[r] = argmax_i logits[r, i]` (the first index on a tie), for every row `r`.
///
/// - `out`: `[rows]` u32
/// - `logits`: `[rows, n]` f32
///
/// Thread mapping: one block per row (`blockIdx.x`). Each thread scans a strided share of
/// the row, eight loads in flight; the candidates meet in a warp shuffle reduction, then
/// across warps through shared memory.
///
/// PRECONDITIONS: grid `(rows)`; `blockDim.x` a multiple of 32; dynamic shared memory
/// `2 * (blockDim.x / 32) * 4` bytes; `n >= 1`.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn argmax_f32(out: *mut u32, logits: *const f32, n: u32) {
    crate::device::wait_for_previous_kernel();
    let n = n as usize;
    let row = crate::device::block_idx_x();
    // SAFETY: row < rows (the grid); the row's n logits and its output slot are there.
    let (out, logits) = unsafe { (out.add(row), logits.add(row * n)) };
    let (tid, lane, warp) = (thread_idx_x(), thread_idx_x() % WARP, thread_idx_x() / WARP);
    let (mut v, mut idx) = (f32::NEG_INFINITY, u32::MAX);
    let bd = block_dim_x();
    // Eight independent loads per round: a single block must hide the memory latency alone.
    let mut i = tid;
    while i + 7 * bd < n {
        // SAFETY: i + 7 bd < n.
        let vals: [f32; 8] = core::array::from_fn(|k| unsafe { *logits.add(i + k * bd) });
        for (k, &val) in vals.iter().enumerate() {
            (v, idx) = better(v, idx, val, (i + k * bd) as u32);
        }
        i += 8 * bd;
    }
    while i < n {
        // SAFETY: i < n.
        (v, idx) = better(v, idx, unsafe { *logits.add(i) }, i as u32);
        i += bd;
    }
    let reduce = |mut v: f32, mut idx: u32| {
        let mut mask = 16;
        while mask > 0 {
            (v, idx) = better(v, idx, shfl_xor(v, mask), shfl_xor_u32(idx, mask));
            mask >>= 1;
        }
        (v, idx)
    };
    (v, idx) = reduce(v, idx);
    let n_warps = block_dim_x() / WARP;
    // [n_warps] values, then [n_warps] indices
    let sv = dynamic_shared::<f32>();
    // SAFETY: the launch gives 2 * n_warps words; every thread reaches the barrier.
    unsafe {
        let si = sv.add(n_warps) as *mut u32;
        if lane == 0 {
            *sv.add(warp) = v;
            *si.add(warp) = idx;
        }
        sync_threads();
        if warp == 0 {
            let (v, idx) = if lane < n_warps {
                (*sv.add(lane), *si.add(lane))
            } else {
                (f32::NEG_INFINITY, u32::MAX)
            };
            let (_, idx) = reduce(v, idx);
            if lane == 0 {
                *out = idx;
            }
        }
    }
}
