//! The decode step's fused gate-and-up GEMV with its weights streamed into shared memory by
//! the copy engine: `gemv_swiglu_stream_<type>`, the same sums as `gemv_swiglu_<type>`
//! (`gemv_codes.rs`), read another way; and the output head's GEMV over the k-quants,
//! `gemv_stream_<type>`, streamed the same way, the same sums as `gemv_<type>`.
//!
//! `gemv_codes`'s blocks each load two rows, wait, multiply and exit: the memory works in
//! bursts (`ncu` on the H200). Here a grid that fits on the GPU at once walks the
//! two matrices in tiles of a row of each per warp. One thread of each block keeps `stages`
//! tiles on their way into shared memory, two bulk copies a tile (`bulk_copy.rs`: one
//! instruction for some kilobytes, no registers held), so that the memory does not wait for
//! a block's arithmetic. The first tiles are requested before the wait for the kernel before
//! (the weights do not depend on it), so that they arrive while the norm before still runs.
//!
//! The gate and up GEMV streams: it is the longest grid of a decode step (two matrices of
//! 14336 rows on Llama 3 8B). So does the output head (128256 rows) where it is a k-quant,
//! whose `gemv_<type>` reads a long matrix at about 1.4 times its bytes' time (H200):
//! Q4_K_M's Q6_K head in 111 us where `gemv_q6_k` took 145. Q8_0's
//! `gemv_q8_0`, near the read bandwidth already, gained nothing by it. The same streaming
//! on the other matrices (q, k, v, o, down) measured as fast as `gemv_<type>` or slower: a
//! block's share of a small matrix is one or two tiles, and nothing is left to overlap
//! (docs/lessons.md#quantized-gemvs). The down projection alone, its long rows split
//! between a block's 8 warps, read no faster than `gemv_<type>` either, and Q4_K_M's and
//! Q8_0's steps lost by it (H200).
//!
//! The activations' codes are read by every warp for every row, and a k-quant lane's span
//! of them is 64 bytes from its neighbour's: from global memory each 16-byte load of the
//! warp touched 16 cache lines, and the warps waited on those loads more than on anything
//! else (`ncu` on the H200). So a k-quant block of 4 warps or more first copies
//! its tokens' codes into shared memory, each span's 16-byte pieces apart (piece p of every
//! span together), and its scales span by span: a warp's 32 consecutive spans then read 512
//! consecutive bytes with each load. (Smaller blocks, and the 32-weight types, whose lanes
//! are 32 bytes apart, lost by it more often than they gained: `stream_copies_codes`.)
//!
//! Thread mapping: warp w takes output `tile * warps + w` of each of its block's tiles (tiles
//! `block, block + grid, ...`), lane l its spans `l, l + 32, ...` of that row of both
//! matrices; each sum is one warp reduction, no shared memory and no barrier between warps
//! but the one that frees a stage for the next copy.

use crate::block_parts::Shared;
use crate::bulk_copy::{
    barrier_init, bulk_copy_to_shared, expect_bytes, fence_barrier_init, wait_phase,
};
use crate::codes::{Bytes, Codes};
use crate::device::{
    WARP, block_dim_x, block_idx_x, dynamic_shared, exp, grid_dim_x, ld_nc_u32, ld_nc_v4,
    store_output, sync_threads, thread_idx_x, wait_for_previous_kernel, warp_sum,
};
use crate::gemv_codes::span_codes;
use crate::mma::{ld_shared_v4, shared_addr, st_shared_u32, st_shared_v4};
use crate::quant_blocks::{Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q5K, Q6K, Q8_0};
use crate::tiles::{STREAM_BARRIER_BYTES, stream_codes_bytes, stream_copies_codes};
use crate::unroll::unroll;

/// `out[t, o] = silu(g) * u` for g and u row o of `w` (the gate) and of `w_up` times token
/// t, x as `quantize_q8_f32` left it: `gemv_swiglu_<type>`'s sums, each row's in another
/// order. Without `SWIGLU`, one matrix, `gemv_<type>`'s: `out[t, o] = (accumulate ? out[t,
/// o] : 0) + g + bias[o]` (`w_up` unused).
///
/// - `out`: `[n_tokens, out_stride]` f32, columns `0..n_out`
/// - `codes`: `[n_tokens, n_in]` i8; `scales`: `[n_tokens, n_in / 32][2]` f32
/// - `w`, `w_up`: `[n_out, n_in / BLOCK_LEN]` blocks each, as the file has them
/// - `bias`: null or `[n_out]` (without `SWIGLU`)
///
/// Shared memory: `[stages]` barriers in the first `STREAM_BARRIER_BYTES`; then, with
/// `COPIES`, the tokens' codes, `[n_tokens][2 * GROUPS][spans]` pieces of 16 bytes
/// (`copy_codes`), and their scales, `[n_tokens][spans][GROUPS][2]` f32,
/// `stream_codes_bytes(BLOCK_LEN, warps, n_tokens, n_in)` in all; then `[stages]` slots of
/// a tile each: `[warps][row bytes]` of `w`, then, with `SWIGLU`, as many of `w_up`.
///
/// # Safety
/// As `gemv_codes`, and: a row is whole 16-byte pieces (the matrices 16-byte aligned);
/// `1 <= stages <= STREAM_BARRIER_BYTES / 8`; the launch gives `stream_shared_bytes(stages,
/// slot bytes, stream_codes_bytes(BLOCK_LEN, warps, n_tokens, n_in))` bytes of dynamic
/// shared memory and at most `n_out.div_ceil(blockDim.x / 32)` blocks; a tile's bytes are
/// below 2^20; `COPIES` is `stream_copies_codes(BLOCK_LEN, warps)`. (A constant, so that
/// each way is compiled apart: tested at run time inside the loop, it took Q4_K's kernel
/// from 93 registers to 105, and an SM from five blocks to four.)
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn gemv_stream<B: Codes, const COPIES: bool, const SWIGLU: bool>(
    out: *mut f32,
    codes: *const u8,
    scales: *const f32,
    w: *const u8,
    w_up: *const u8,
    bias: *const f32,
    n_tokens: usize,
    n_in: usize,
    n_out: usize,
    out_stride: usize,
    accumulate: bool,
    stages: usize,
) {
    let warps = block_dim_x() / WARP;
    let (warp, lane) = (thread_idx_x() / WARP, thread_idx_x() % WARP);
    let row_bytes = n_in / B::BLOCK_LEN * B::BLOCK_BYTES;
    // A tile's rows of one matrix; its slot holds both matrices' with `SWIGLU`.
    let (tile_bytes, matrices) = (warps * row_bytes, if SWIGLU { 2 } else { 1 });
    let tiles = n_out.div_ceil(warps);
    // This block's tiles: block, block + grid, ...; fill i is the i-th of them.
    let (first, step) = (block_idx_x(), grid_dim_x());
    let fills = if first < tiles {
        (tiles - first).div_ceil(step)
    } else {
        0
    };
    let base = shared_addr(dynamic_shared::<u8>());
    let bar = |i: usize| base + (8 * (i % stages)) as u32;
    let copy = base + STREAM_BARRIER_BYTES as u32; // the codes' copy, with `COPIES`
    let slots = STREAM_BARRIER_BYTES + stream_codes_bytes(B::BLOCK_LEN, warps, n_tokens, n_in);
    let slot = |i: usize| base + (slots + i % stages * matrices * tile_bytes) as u32;
    // Thread 0 asks for fill i: the tile's rows of each matrix into its slot.
    let request = |i: usize| {
        let tile = first + i * step;
        let bytes = (warps.min(n_out - tile * warps) * row_bytes) as u32;
        let from = tile * tile_bytes;
        // SAFETY: the tile's rows are inside the matrices, whole 16-byte pieces at 16-byte
        // aligned addresses (the preconditions), and the slot is free: its last reader
        // passed the barrier before this request.
        unsafe {
            expect_bytes(bar(i), matrices as u32 * bytes);
            bulk_copy_to_shared(slot(i), w.add(from), bytes, bar(i));
            if SWIGLU {
                bulk_copy_to_shared(slot(i) + tile_bytes as u32, w_up.add(from), bytes, bar(i));
            }
        }
    };
    if thread_idx_x() == 0 {
        for i in 0..stages {
            // SAFETY: barrier i is inside the barriers' bytes (stages is at most their
            // number); no thread uses it before the block's barrier below.
            unsafe { barrier_init(base + 8 * i as u32, 1) };
        }
        fence_barrier_init();
    }
    // SAFETY: every thread of the block reaches this barrier.
    unsafe { sync_threads() };
    if thread_idx_x() == 0 {
        for i in 0..stages.min(fills) {
            request(i);
        }
    }
    // The weights are on their way; the activations' codes are the kernel before's.
    wait_for_previous_kernel();
    let (groups, spans) = (n_in / 32, n_in / (32 * B::GROUPS));
    if COPIES {
        // SAFETY: the codes and scales as the preconditions list; the copy is the
        // launch's shared memory after the barriers, which nothing else uses.
        unsafe { copy_codes::<B>(copy, codes, scales, n_tokens, n_in) };
        // SAFETY: every thread of the block reaches this barrier.
        unsafe { sync_threads() };
    }
    for i in 0..fills {
        // SAFETY: barrier i % stages was initialized; its (i / stages)-th fill was asked for.
        unsafe { wait_phase(bar(i), (i / stages % 2) as u32) };
        let o = (first + i * step) * warps + warp;
        if o < n_out {
            let row = Shared(slot(i) + (warp * row_bytes) as u32);
            let up = row.add(tile_bytes);
            for t in 0..n_tokens {
                let (mut g, mut u) = (0.0f32, 0.0f32);
                let mut s = lane;
                while s < spans {
                    // SAFETY: token t's span s is in the copy (copied before the
                    // barrier above) or inside codes and scales; span s of the rows in the
                    // slot, which the barrier's phase says have landed.
                    unsafe {
                        let (x, d, ds) = if COPIES {
                            copied_codes::<B>(copy, n_tokens, n_in, t, s)
                        } else {
                            span_codes::<B>(codes, scales, t * groups, s)
                        };
                        g += B::dot(&B::load_span(row, s), &x, d, ds);
                        if SWIGLU {
                            u += B::dot(&B::load_span(up, s), &x, d, ds);
                        }
                    }
                    s += WARP;
                }
                let g = warp_sum(g);
                let u = if SWIGLU { warp_sum(u) } else { 0.0 };
                if lane == 0 {
                    // SAFETY: o < n_out, t < n_tokens: inside out (and bias).
                    unsafe {
                        let at = out.add(t * out_stride + o);
                        if SWIGLU {
                            *at = g / (1.0 + exp(-g)) * u;
                        } else {
                            store_output(at, g, bias, o, accumulate);
                        }
                    }
                }
            }
        }
        // Every warp is done with the slot: it takes the fill `stages` on.
        // SAFETY: every thread of the block reaches this barrier, as many times.
        unsafe { sync_threads() };
        if thread_idx_x() == 0 && i + stages < fills {
            request(i + stages);
        }
    }
}

/// Copies `n_tokens` tokens' codes and scales (as `quantize_q8_f32` left them) into the
/// block's shared memory at address `copy`, in the order `copied_codes` reads them: the
/// codes of span s's group k (`B::group(s, k)`) as pieces `2k` and `2k + 1` of 16 bytes,
/// piece p of every span together; its scales span by span. A thread a piece, then a
/// thread a span's scales; the writes are consecutive, the reads one-off.
///
/// # Safety
/// `codes` and `scales` hold the tokens' groups (16-byte aligned); the copy has
/// `stream_codes_bytes(B::BLOCK_LEN, blockDim.x / 32, n_tokens, n_in)` bytes; the block
/// reaches a barrier before any thread reads it.
#[inline(always)]
unsafe fn copy_codes<B: Codes>(
    copy: u32,
    codes: *const u8,
    scales: *const f32,
    n_tokens: usize,
    n_in: usize,
) {
    let spans = n_in / (32 * B::GROUPS);
    let pieces = 2 * B::GROUPS * spans;
    let mut j = thread_idx_x();
    while j < n_tokens * pieces {
        let (t, at) = (j / pieces, j % pieces);
        let (p, s) = (at / spans, at % spans);
        let group = t * n_in / 32 + B::group(s, p / 2);
        // SAFETY: group and its piece are inside the token's codes, 16-byte aligned; the
        // piece's place is inside the copy (the caller's).
        unsafe {
            let v = ld_nc_v4(codes.add(32 * group + 16 * (p % 2)) as *const u32);
            st_shared_v4(copy + (t * n_in + 16 * at) as u32, v);
        }
        j += block_dim_x();
    }
    let scales_at = copy + (n_tokens * n_in) as u32;
    let mut j = thread_idx_x();
    while j < n_tokens * spans {
        let (t, s) = (j / spans, j % spans);
        unroll!(k < 2 => {
            if k < B::GROUPS {
                let group = t * n_in / 32 + B::group(s, k);
                let to = scales_at + (8 * (j * B::GROUPS + k)) as u32;
                // SAFETY: the group's two scales are inside `scales`; their place inside
                // the copy (the caller's).
                unsafe {
                    let from = scales.add(2 * group) as *const u32;
                    st_shared_u32(to, ld_nc_u32(from));
                    st_shared_u32(to + 4, ld_nc_u32(from.add(1)));
                }
            }
        });
        j += block_dim_x();
    }
}

/// Token t's codes of span s from the copy `copy_codes` made: `span_codes`'s values
/// (four codes a word, each group's `d` and `d` times the sum of its codes), each load a
/// warp's 512 consecutive bytes where its lanes take consecutive spans.
///
/// # Safety
/// `copy_codes` made the copy for `n_tokens` tokens of `n_in`, and the block has passed
/// a barrier since; `t < n_tokens`, `s` below the spans.
#[inline(always)]
unsafe fn copied_codes<B: Codes>(
    copy: u32,
    n_tokens: usize,
    n_in: usize,
    t: usize,
    s: usize,
) -> ([[u32; 8]; 2], [f32; 2], [f32; 2]) {
    let spans = n_in / (32 * B::GROUPS);
    let token = copy + (t * n_in) as u32;
    let scales = copy + (n_tokens * n_in + 8 * B::GROUPS * (t * spans + s)) as u32;
    let mut x = [[0u32; 8]; 2];
    unroll!(k < 2 => {
        if k < B::GROUPS {
            // SAFETY: pieces 2k and 2k + 1 of span s are inside the copy (the caller's).
            unsafe {
                let a = ld_shared_v4(token + (16 * (2 * k * spans + s)) as u32);
                let b = ld_shared_v4(token + (16 * ((2 * k + 1) * spans + s)) as u32);
                x[k] = [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]];
            }
        }
    });
    // SAFETY: the span's scales are inside the copy, 8 * GROUPS bytes at a multiple of as
    // many (the caller's).
    let [d0, ds0, d1, ds1] = unsafe {
        if B::GROUPS == 2 {
            ld_shared_v4(scales)
        } else {
            let sc = Shared(scales);
            [sc.u32(0), sc.u32(4), 0, 0]
        }
    };
    let f = f32::from_bits;
    (x, [f(d0), f(d1)], [f(ds0), f(ds1)])
}

/// `gemv_stream` over `B`, compiled apart for a block that copies its codes and for one
/// that does not (`stream_copies_codes` of its warps).
///
/// # Safety
/// `gemv_stream`'s preconditions but `COPIES`'.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn gemv_stream_either<B: Codes, const SWIGLU: bool>(
    out: *mut f32,
    codes: *const u8,
    scales: *const f32,
    w: *const u8,
    w_up: *const u8,
    bias: *const f32,
    sizes: [u32; 4],
    accumulate: bool,
    stages: u32,
) {
    let [n_tokens, n_in, n_out, out_stride] = sizes.map(|v| v as usize);
    let stages = stages as usize;
    // SAFETY: the caller's; COPIES as the block's warps take it.
    unsafe {
        if stream_copies_codes(B::BLOCK_LEN, block_dim_x() / WARP) {
            gemv_stream::<B, true, SWIGLU>(
                out, codes, scales, w, w_up, bias, n_tokens, n_in, n_out, out_stride, accumulate,
                stages,
            )
        } else {
            gemv_stream::<B, false, SWIGLU>(
                out, codes, scales, w, w_up, bias, n_tokens, n_in, n_out, out_stride, accumulate,
                stages,
            )
        }
    }
}

/// `gemv_stream_<type>`: one matrix, as `gemv_<type>`, with its stages last; the sizes as
/// `u32`s.
macro_rules! stream_kernels {
    ($($ty:ident => $gemv:ident;)*) => {$(
        #[doc = concat!("`gemv_stream` over one matrix of `", stringify!($ty), "` weights.")]
        ///
        /// # Safety
        /// The host's launch wrapper checks `gemv_stream`'s preconditions.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "gpu-kernel" fn $gemv(
            out: *mut f32,
            codes: *const u8,
            scales: *const f32,
            w: *const u8,
            bias: *const f32,
            n_tokens: u32,
            n_in: u32,
            n_out: u32,
            out_stride: u32,
            accumulate: u32,
            stages: u32,
        ) {
            let sizes = [n_tokens, n_in, n_out, out_stride];
            // SAFETY: the wrapper's checks.
            unsafe {
                gemv_stream_either::<$ty, false>(
                    out, codes, scales, w, w, bias, sizes, accumulate != 0, stages,
                )
            }
        }
    )*};
}

/// `gemv_swiglu_stream_<type>`: the gate and up matrices, as `gemv_swiglu_<type>`, with
/// its stages last; the sizes as `u32`s.
macro_rules! swiglu_stream_kernels {
    ($($ty:ident => $swiglu:ident;)*) => {$(
        #[doc = concat!("`gemv_stream` over the gate and up matrices of `", stringify!($ty), "` weights.")]
        ///
        /// # Safety
        /// The host's launch wrapper checks `gemv_stream`'s preconditions.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "gpu-kernel" fn $swiglu(
            out: *mut f32,
            codes: *const u8,
            scales: *const f32,
            w_gate: *const u8,
            w_up: *const u8,
            n_tokens: u32,
            n_in: u32,
            n_out: u32,
            out_stride: u32,
            stages: u32,
        ) {
            let sizes = [n_tokens, n_in, n_out, out_stride];
            // SAFETY: the wrapper's checks.
            unsafe {
                gemv_stream_either::<$ty, true>(
                    out, codes, scales, w_gate, w_up, core::ptr::null(), sizes, false, stages,
                )
            }
        }
    )*};
}

stream_kernels! {
    Q4K => gemv_stream_q4_k;
    Q5K => gemv_stream_q5_k;
    Q6K => gemv_stream_q6_k;
}

swiglu_stream_kernels! {
    Q4_0 => gemv_swiglu_stream_q4_0;
    Q4_1 => gemv_swiglu_stream_q4_1;
    Q5_0 => gemv_swiglu_stream_q5_0;
    Q5_1 => gemv_swiglu_stream_q5_1;
    Q8_0 => gemv_swiglu_stream_q8_0;
    Q4K => gemv_swiglu_stream_q4_k;
    Q5K => gemv_swiglu_stream_q5_k;
    Q6K => gemv_swiglu_stream_q6_k;
}
