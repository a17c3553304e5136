//! GEMV: one token's activations times a bf16 weight matrix. The decode step's workhorse:
//! every weight is read once per token, so it runs at the speed memory delivers them, and
//! the kernel's job is to keep enough loads in flight to reach that speed.

use crate::device::{
    WARP, bf16x2_to_f32, block_dim_x, block_dim_y, block_idx_x, dynamic_shared, exp, ld_nc_v4,
    sync_threads, thread_idx_x, thread_idx_y, warp_sum,
};
use crate::unroll::unroll;

/// Weights one warp reads per 16-byte load instruction: 32 lanes x 8 bf16.
const WARP_CHUNK: usize = WARP * 8;
/// Loads each lane issues before it uses any: 4 x 16 bytes, 2 KiB per warp in flight.
const UNROLL: usize = 4;

/// `sum_j w[j] * x[j]` over 8 weights packed in 16 bytes and 8 activations at `x`.
///
/// # Safety
/// `x` is 16-byte aligned, holds 8 floats, and is not written during the kernel.
#[inline(always)]
unsafe fn dot8(w: [u32; 4], x: *const f32) -> f32 {
    // SAFETY: the caller's guarantee; two 16-byte loads of activations.
    let (xa, xb) = unsafe { (ld_nc_v4(x as *const u32), ld_nc_v4(x.add(4) as *const u32)) };
    let xs = [xa[0], xa[1], xa[2], xa[3], xb[0], xb[1], xb[2], xb[3]];
    let mut s = 0.0f32;
    for j in 0..4 {
        let (w0, w1) = bf16x2_to_f32(w[j]);
        s += w0 * f32::from_bits(xs[2 * j]) + w1 * f32::from_bits(xs[2 * j + 1]);
    }
    s
}

/// One lane's share of the dot product of weight row `w_row` (`[n_in]` bf16) with `x`:
/// the elements `lane * 8 + k * 256 .. + 8` for every k, four loads in flight at a time.
///
/// # Safety
/// `n_in % 8 == 0`; `w_row` and `x` 16-byte aligned and read-only during the kernel.
#[inline(always)]
unsafe fn row_dot(w_row: *const u16, x: *const f32, n_in: usize, lane: usize) -> f32 {
    let mut sum = 0.0f32;
    let mut i = lane * 8;
    // SAFETY (all loads): every index + 8 <= n_in, multiples of 8 elements from aligned bases.
    unsafe {
        while i + (UNROLL - 1) * WARP_CHUNK < n_in {
            let mut packed = [[0u32; 4]; UNROLL];
            for (k, p) in packed.iter_mut().enumerate() {
                *p = ld_nc_v4(w_row.add(i + k * WARP_CHUNK) as *const u32);
            }
            for (k, p) in packed.iter().enumerate() {
                sum += dot8(*p, x.add(i + k * WARP_CHUNK));
            }
            i += UNROLL * WARP_CHUNK;
        }
        while i < n_in {
            sum += dot8(ld_nc_v4(w_row.add(i) as *const u32), x.add(i));
            i += WARP_CHUNK;
        }
    }
    sum
}

/// `row_dot` of two rows with the same activations at once, `(a . x, b . x)`: the gate and
/// up rows of the SwiGLU. Both rows' loads go out before either is used, eight 16-byte loads
/// a lane in flight where `row_dot` has four, and each activation is read once for both;
/// each sum is added up in `row_dot`'s order, so its bits are `row_dot`'s.
///
/// Measured on an H100 (bench/history/rounds.md round 76): Qwen3-8B's gate and up (12,288
/// rows, a thin last wave of blocks) 72.3 -> 69.9 us and its decode 2.2-2.4% faster;
/// Llama-3-8B's (14,336 rows) 80.3 -> 82.2 us, its decode 0.5-0.8% slower; the grouped
/// experts' SwiGLU (Qwen3-30B-A3B in bf16) 10% faster at 64 sequences. Two loads a row in
/// flight (four in all, as before) gave Qwen3-8B 71.1 us and the experts less than before.
///
/// # Safety
/// `row_dot`'s, for both rows.
#[inline(always)]
unsafe fn row_dot_pair(
    (a, b): (*const u16, *const u16),
    x: *const f32,
    n_in: usize,
    lane: usize,
) -> (f32, f32) {
    let (mut sa, mut sb) = (0.0f32, 0.0f32);
    let mut i = lane * 8;
    // SAFETY (all loads): as in row_dot, for each row.
    unsafe {
        while i + (UNROLL - 1) * WARP_CHUNK < n_in {
            // Written out (`unroll!`): arrays indexed by a loop the compiler kept rolled
            // live in local memory, which made this 1.7 times slower (round 76).
            let mut pa = [[0u32; 4]; UNROLL];
            let mut pb = [[0u32; 4]; UNROLL];
            unroll!(k < UNROLL => {
                pa[k] = ld_nc_v4(a.add(i + k * WARP_CHUNK) as *const u32);
                pb[k] = ld_nc_v4(b.add(i + k * WARP_CHUNK) as *const u32);
            });
            unroll!(k < UNROLL => {
                let xk = x.add(i + k * WARP_CHUNK);
                sa += dot8(pa[k], xk);
                sb += dot8(pb[k], xk);
            });
            i += UNROLL * WARP_CHUNK;
        }
        while i < n_in {
            let xi = x.add(i);
            sa += dot8(ld_nc_v4(a.add(i) as *const u32), xi);
            sb += dot8(ld_nc_v4(b.add(i) as *const u32), xi);
            i += WARP_CHUNK;
        }
    }
    (sa, sb)
}

/// Where this thread's warp works: its output row, and the columns `[start, end)` of its
/// part of the row. A block is `(32 * parts, rows)`: `blockDim.y` rows, each shared by
/// `blockDim.x / 32` warps that take consecutive slices of the columns (a multiple of
/// `align` each, the weights of a lane's load). Small matrices use several parts, so that
/// enough loads are in flight to fill the GPU; large ones one.
#[inline(always)]
pub(crate) fn row_part(n_in: usize, align: usize) -> (usize, usize, usize, usize) {
    let parts = block_dim_x() / WARP;
    let row = block_idx_x() * block_dim_y() + thread_idx_y();
    let part = thread_idx_x() / WARP;
    let slice = n_in.div_ceil(parts * align) * align;
    let start = (part * slice).min(n_in);
    (row, part, start, (start + slice).min(n_in))
}

/// Adds up the parts of each row: every warp's lane 0 leaves its sum in shared memory, and
/// the row's first thread totals them. Returns the total in that thread, `None` elsewhere.
///
/// # Safety
/// Every thread of the block calls it (a barrier); shared memory holds one float per warp.
#[inline(always)]
unsafe fn combine_parts(sum: f32) -> Option<f32> {
    let parts = block_dim_x() / WARP;
    let (lane, part, y) = (thread_idx_x() % WARP, thread_idx_x() / WARP, thread_idx_y());
    let shared = dynamic_shared::<f32>();
    // SAFETY: y * parts + part < warps per block; every thread reaches the barrier.
    unsafe {
        if lane == 0 {
            *shared.add(y * parts + part) = sum;
        }
        sync_threads();
        if thread_idx_x() != 0 {
            return None;
        }
        let mut total = 0.0;
        for p in 0..parts {
            total += *shared.add(y * parts + p);
        }
        Some(total)
    }
}

/// `out[o] = (accumulate ? out[o] : 0) + sum_i w[o, i] * x[i] + bias[o]`. With `accumulate`
/// the residual add is fused: the output projection adds straight into the residual stream.
///
/// - `out`: `[n_out]` f32
/// - `x`: `[n_in]` f32
/// - `w`: `[n_out, n_in]` bf16 (as `u16` bits), rows as PyTorch stores them
/// - `bias`: `[n_out]` f32, or null for none
///
/// Thread mapping: block `(32 * parts, rows)`: `blockDim.y` output rows per block, each
/// read by `parts` warps side by side (see `row_part`). Each lane reads 8 weights (16 bytes,
/// one `ld.global.nc.v4`) per load and issues four before using them; a warp's lanes meet in
/// a shuffle reduction, a row's warps in shared memory.
///
/// PRECONDITIONS: `n_in % 8 == 0`; `w` and `x` 16-byte aligned; `blockDim.x` a multiple of
/// 32; one float of dynamic shared memory per warp; `x` does not overlap `out`.
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
    accumulate: u32,
) {
    crate::device::wait_for_previous_kernel();
    // SAFETY: the wrapper's checks.
    unsafe {
        gemv_bf16_token(
            out,
            x,
            w,
            bias,
            n_in as usize,
            n_out as usize,
            accumulate != 0,
        )
    }
}

/// `gemv_bf16`'s work for one token, after the wait: also the grouped GEMV's, a token of an
/// expert's run at a time (`gemv_experts.rs`).
///
/// # Safety
/// `gemv_bf16`'s preconditions; every thread of the block calls it (a barrier inside).
#[inline(always)]
pub(crate) unsafe fn gemv_bf16_token(
    out: *mut f32,
    x: *const f32,
    w: *const u16,
    bias: *const f32,
    n_in: usize,
    n_out: usize,
    accumulate: bool,
) {
    let lane = thread_idx_x() % WARP;
    let (row, _, start, end) = row_part(n_in, 8);
    let mut sum = 0.0f32;
    if row < n_out {
        // SAFETY: row < n_out; start is a multiple of 8 inside the row; the preconditions
        // cover the loads.
        sum = warp_sum(unsafe {
            row_dot(w.add(row * n_in + start), x.add(start), end - start, lane)
        });
    }
    // SAFETY: every thread gets here; shared memory holds a float per warp (launch).
    if let Some(total) = unsafe { combine_parts(sum) }
        && row < n_out
    {
        // SAFETY: row < n_out; bias, when present, holds n_out floats.
        unsafe {
            let b = if bias.is_null() { 0.0 } else { *bias.add(row) };
            let prev = if accumulate { *out.add(row) } else { 0.0 };
            *out.add(row) = prev + total + b;
        }
    }
}

/// The MLP's first half in one pass: `out[o] = silu(w_gate[o] . x) * (w_up[o] . x)`, with
/// silu(g) = g / (1 + e^-g). Reading the gate and up rows in the same warp halves the
/// activation reads and saves the launch and the round trip of the separate SwiGLU kernel.
///
/// - `out`: `[n_out]` f32 (`n_out` = ffn_dim)
/// - `x`: `[n_in]` f32
/// - `w_gate`, `w_up`: `[n_out, n_in]` bf16 each
///
/// Thread mapping and PRECONDITIONS: as `gemv_bf16`.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn gemv_swiglu_bf16(
    out: *mut f32,
    x: *const f32,
    w_gate: *const u16,
    w_up: *const u16,
    n_in: u32,
    n_out: u32,
) {
    crate::device::wait_for_previous_kernel();
    // SAFETY: the wrapper's checks.
    unsafe { gemv_swiglu_bf16_token(out, x, w_gate, w_up, n_in as usize, n_out as usize) }
}

/// `gemv_swiglu_bf16`'s work for one token, after the wait (as `gemv_bf16_token`).
///
/// # Safety
/// `gemv_swiglu_bf16`'s preconditions; every thread of the block calls it (barriers inside).
#[inline(always)]
pub(crate) unsafe fn gemv_swiglu_bf16_token(
    out: *mut f32,
    x: *const f32,
    w_gate: *const u16,
    w_up: *const u16,
    n_in: usize,
    n_out: usize,
) {
    let lane = thread_idx_x() % WARP;
    let (row, _, start, end) = row_part(n_in, 8);
    let (mut g, mut u) = (0.0f32, 0.0f32);
    if row < n_out {
        // SAFETY: as in gemv_bf16, for both matrices.
        let (sg, su) = unsafe {
            let rows = (w_gate.add(row * n_in + start), w_up.add(row * n_in + start));
            row_dot_pair(rows, x.add(start), end - start, lane)
        };
        (g, u) = (warp_sum(sg), warp_sum(su));
    }
    // The gate and up sums travel through shared memory one after the other.
    // SAFETY: every thread reaches both calls; a float per warp of shared memory.
    let g = unsafe { combine_parts(g) };
    // SAFETY: as above; the barrier inside orders this write after the first call's reads.
    unsafe { sync_threads() };
    let u = unsafe { combine_parts(u) };
    if let (Some(g), Some(u)) = (g, u)
        && row < n_out
    {
        // SAFETY: row < n_out.
        unsafe { *out.add(row) = g / (1.0 + exp(-g)) * u };
    }
}
