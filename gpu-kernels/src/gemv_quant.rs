//! Linear layers over quantized weights (`quant_blocks.rs`), the weights dequantized in
//! registers on their way from memory:
//! - `gemv_fp8`: up to `QUANT_MAX_TOKENS` tokens times an fp8 matrix, the decode step's
//!   matmul. Decode reads every weight once per token, so the fewer bytes a weight takes,
//!   the faster the step. (The GGUF types have their own, in integers: `gemv_codes.rs`.)
//! - `dequant_<type>`: rows of the matrix to bf16 (for the tensor-core GEMM of a prompt,
//!   which does enough arithmetic per weight that the extra pass costs little) or to f32
//!   (the embedding's rows for a batch's tokens).
//!
//! Each is written once, generic over the type (`gemv_blocks`, `dequant_blocks`), and
//! stamped out per type at the end of the file.

use crate::device::{
    WARP, block_dim_x, block_idx_x, dynamic_shared, fma, global_idx_x, pack_bf16x2, st_v4,
    sync_threads, thread_idx_x, wait_for_previous_kernel, warp_sum,
};
use crate::mma::{cp_async_16, cp_async_commit, cp_async_wait, ld_shared_v4, shared_addr};
use crate::quant_blocks::{Blocks, Fp8, GROUP, Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q5K, Q6K, Q8_0};
use crate::tiles::{
    DEQUANT_STAGE_WORDS, QUANT_MAX_TOKENS, QUANT_ROWS_PER_WARP, QUANT_STAGE_STRIDE,
};
use crate::unroll::unroll;

/// `sum_i w[i] * x[i]` over eight weights and the eight activations at shared address `x`
/// (two 16-byte loads), in two partial sums so that the adds do not all wait on each other.
///
/// # Safety
/// `x` is a 16-byte aligned shared address with 32 bytes to read.
#[inline(always)]
unsafe fn dot8_shared(w: &[f32; 8], x: u32) -> f32 {
    // SAFETY: the caller's guarantee.
    let (a, b) = unsafe { (ld_shared_v4(x), ld_shared_v4(x + 16)) };
    let mut s = [0.0f32; 2];
    unroll!(i < 4 => {
        s[0] = fma(w[i], f32::from_bits(a[i]), s[0]);
        s[1] = fma(w[4 + i], f32::from_bits(b[i]), s[1]);
    });
    s[0] + s[1]
}

/// What a row's sums are multiplied by: `Blocks::UNSCALE` and the row's scale (fp8), 1
/// for the GGUF types, whose scales are inside their blocks.
///
/// # Safety
/// `row_scales` is null or holds the row.
#[inline(always)]
unsafe fn row_scale<B: Blocks>(row_scales: *const f32, row: usize) -> f32 {
    if row_scales.is_null() {
        return B::UNSCALE;
    }
    // SAFETY: the caller's guarantee.
    B::UNSCALE * unsafe { *row_scales.add(row) }
}

/// `out[t, o] = (accumulate ? out[t, o] : 0) + scale[o] * sum_i w[o, i] x[t, i] + bias[o]`
/// for tokens `t < n_tokens`.
///
/// Thread mapping: each warp takes `QUANT_ROWS_PER_WARP` consecutive rows (the block's warps
/// consecutive runs of them); lane `l` takes groups `l, l + 32, ...` of every row. The block
/// walks the columns in stages of 32 groups (1024 columns, one group a lane): the threads
/// copy the stage's activations of every token into shared memory (`cp.async`) while each
/// lane's loads of its group of every row are in flight, then each lane decodes its group
/// to 32 floats once and multiplies them by every token's activations: the weights are read
/// once for all the tokens. The lanes meet in a shuffle reduction per (row, token).
///
/// Why shared memory: read from global memory, a lane's activations lie 128 bytes from its
/// neighbour's, so every 16-byte load of the warp touched 32 cache lines, and the L1 cache
/// spent more time on the activations than the memory did on the weights. In shared memory,
/// each group of 32 floats is followed by 4 of padding (`QUANT_STAGE_STRIDE`), so that the
/// lanes of a quarter-warp read 16 bytes each from eight different bank quads.
///
/// # Safety
/// `n_in % 32 == 0` and a whole number of blocks; `w` is `[n_out, n_in / BLOCK_LEN]`
/// blocks, aligned as `Blocks::load` asks; `x` is `[n_tokens, n_in]`, 16-byte aligned;
/// `out` is `[n_tokens, out_stride]` (this matrix's rows at columns `0..n_out`);
/// `row_scales` and `bias` are null or `[n_out]`; `n_tokens <= QUANT_MAX_TOKENS`; `x` does
/// not overlap `out`; the launch gives `n_tokens * 32 * QUANT_STAGE_STRIDE` floats of
/// dynamic shared memory.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn gemv_blocks<B: Blocks>(
    out: *mut f32,
    x: *const f32,
    w: *const u8,
    row_scales: *const f32,
    bias: *const f32,
    n_tokens: usize,
    n_in: usize,
    n_out: usize,
    out_stride: usize,
    accumulate: bool,
) {
    wait_for_previous_kernel();
    const R: usize = QUANT_ROWS_PER_WARP;
    let lane = thread_idx_x() % WARP;
    let warp = block_idx_x() * (block_dim_x() / WARP) + thread_idx_x() / WARP;
    let first = warp * R;
    // A warp past the matrix still stages activations for the others, and meets them at
    // every barrier; it loads nothing of its own and writes nothing.
    let live = first < n_out;
    let row_bytes = n_in / B::BLOCK_LEN * B::BLOCK_BYTES;
    // Rows past the matrix read its last row again and write nothing.
    let mut rows = [w; R];
    unroll!(r < R => {
        rows[r] = w.wrapping_add((first + r).min(n_out - 1) * row_bytes);
    });
    // [n_tokens][32 groups][QUANT_STAGE_STRIDE] f32
    let stage = shared_addr(dynamic_shared::<f32>());
    let groups = n_in / GROUP;
    let mut acc = [[0.0f32; QUANT_MAX_TOKENS]; R];
    let mut g0 = 0;
    while g0 < groups {
        let g = g0 + lane;
        let mine = live && g < groups;
        // This lane's loads first (a group past the row reads the row's first group of the
        // stage and is not used), so that they are in flight during the copies.
        let mut raw = [core::mem::MaybeUninit::<B::Raw>::uninit(); R];
        unroll!(r < R => {
            // SAFETY: g or g0 < n_in / 32 of a row inside the matrix (the preconditions).
            raw[r].write(unsafe { B::load(rows[r], if g < groups { g } else { g0 }) });
        });
        // The stage's activations, 16 bytes a copy: token t's group j, quarter q.
        let stage_groups = (groups - g0).min(WARP);
        let copies = n_tokens * stage_groups * 8;
        let mut c = thread_idx_x();
        while c < copies {
            let (t, j, q) = (c / (stage_groups * 8), c / 8 % stage_groups, c % 8);
            let at = ((t * WARP + j) * QUANT_STAGE_STRIDE + 4 * q) as u32;
            // SAFETY: t < n_tokens and g0 + j < groups: inside x, 16-byte aligned; the
            // shared offset is inside the launch's shared memory (preconditions).
            unsafe {
                let src = x.add(t * n_in + (g0 + j) * GROUP + 4 * q);
                cp_async_16(stage + 4 * at, src, true);
            }
            c += block_dim_x();
        }
        cp_async_commit();
        cp_async_wait::<0>();
        // SAFETY: every thread of the block reaches both barriers of every stage (the loop
        // bounds are the same for all).
        unsafe { sync_threads() };
        if mine {
            // SAFETY: every element was written just above.
            let raw = raw.map(|r| unsafe { r.assume_init() });
            unroll!(k < 4 => {
                let mut w = [[0.0f32; 8]; R];
                unroll!(r < R => {
                    w[r] = B::decode8(&raw[r], k);
                });
                unroll!(t < QUANT_MAX_TOKENS => {
                    if t < n_tokens {
                        let at = (t * WARP + lane) * QUANT_STAGE_STRIDE + 8 * k;
                        let xt = stage + 4 * at as u32;
                        unroll!(r < R => {
                            // SAFETY: token t's eight floats of this group, staged above.
                            acc[r][t] += unsafe { dot8_shared(&w[r], xt) };
                        });
                    }
                });
            });
        }
        // SAFETY: as above; the next stage overwrites what this one read.
        unsafe { sync_threads() };
        g0 += WARP;
    }
    if !live {
        return;
    }
    unroll!(r < R => {
        let row = first + r;
        // SAFETY: the scales, when present, hold every row of the matrix.
        let scale = unsafe { row_scale::<B>(row_scales, row.min(n_out - 1)) };
        unroll!(t < QUANT_MAX_TOKENS => {
            if t < n_tokens {
                let sum = warp_sum(acc[r][t]);
                if lane == 0 && row < n_out {
                    // SAFETY: row < n_out, t < n_tokens: inside out and bias.
                    unsafe {
                        let o = out.add(t * out_stride + row);
                        let b = if bias.is_null() { 0.0 } else { *bias.add(row) };
                        let prev = if accumulate { *o } else { 0.0 };
                        *o = prev + sum * scale + b;
                    }
                }
            }
        });
    });
}

/// Rows `rows[r]` (or row r itself where `rows` is null) of the matrix, dequantized, to row
/// r of `out_f32` if that is set, else of `out_bf16`: `[n_rows, n_in]` either way.
///
/// Thread mapping: one thread per (row, group), consecutive threads along a row, so a
/// block's groups are one run of the output. To f32 (the embedding's few rows) each thread
/// writes its group. To bf16 (whole matrices for the prompt's GEMM) the block's threads
/// first leave their groups in shared memory, then copy the block's run out 16 bytes a
/// thread, in order: written straight from the registers, a warp's 16-byte stores lay 64
/// bytes apart, and each filled half of 32 sectors where it could fill 16 whole.
///
/// # Safety
/// `w` as `gemv_blocks`; every `rows[r]` a row of the matrix; exactly one output set, with
/// `[n_rows, n_in]` elements, 16-byte aligned; `row_scales` null or one per row of `w`; a
/// bf16 output takes `dequant_shared_bytes(blockDim.x)` bytes of dynamic shared memory.
#[inline(always)]
unsafe fn dequant_blocks<B: Blocks>(
    out_bf16: *mut u16,
    out_f32: *mut f32,
    w: *const u8,
    row_scales: *const f32,
    rows: *const u32,
    n_rows: usize,
    n_in: usize,
) {
    wait_for_previous_kernel();
    let groups = n_in / GROUP;
    let total = n_rows * groups;
    let i = global_idx_x();
    // Group i's scale and bytes.
    // SAFETY (both): i < total; rows, the scales and the outputs as the preconditions say.
    let group = |i: usize| unsafe {
        let (r, g) = (i / groups, i % groups);
        let src = if rows.is_null() {
            r
        } else {
            *rows.add(r) as usize
        };
        let row = w.add(src * (n_in / B::BLOCK_LEN * B::BLOCK_BYTES));
        (row_scale::<B>(row_scales, src), B::load(row, g))
    };
    if !out_f32.is_null() {
        if i >= total {
            return;
        }
        let (scale, raw) = group(i);
        unroll!(k < 4 => {
            let v = B::decode8(&raw, k).map(|v| v * scale);
            // SAFETY: group i of the output, 16-byte aligned.
            unsafe {
                let p = out_f32.add(32 * i + 8 * k) as *mut u32;
                st_v4(p, [v[0], v[1], v[2], v[3]].map(f32::to_bits));
                st_v4(p.add(4), [v[4], v[5], v[6], v[7]].map(f32::to_bits));
            }
        });
        return;
    }
    // [blockDim.x][DEQUANT_STAGE_WORDS] u32: each thread's group as 16 bf16 pairs, padded
    // by a word so that the lanes' stores fall in different banks.
    let stage = dynamic_shared::<u32>();
    let t = thread_idx_x();
    if i < total {
        let (scale, raw) = group(i);
        unroll!(k < 4 => {
            let v = B::decode8(&raw, k).map(|v| v * scale);
            unroll!(j < 4 => {
                // SAFETY: thread t's words, inside the launch's shared memory.
                unsafe {
                    *stage.add(DEQUANT_STAGE_WORDS * t + 4 * k + j) =
                        pack_bf16x2(v[2 * j], v[2 * j + 1]);
                }
            });
        });
    }
    // SAFETY: every thread of the block reaches the barrier.
    unsafe { sync_threads() };
    let first = block_idx_x() * block_dim_x();
    let chunks = 4 * (total - first).min(block_dim_x());
    let mut c = t;
    while c < chunks {
        let (g, q) = (c / 4, c % 4);
        // SAFETY: group first + g < total was staged above; its 16 bytes q of the output
        // are inside it, 16-byte aligned.
        unsafe {
            let words = [0, 1, 2, 3].map(|j| *stage.add(DEQUANT_STAGE_WORDS * g + 4 * q + j));
            st_v4(out_bf16.add(32 * (first + g) + 8 * q) as *mut u32, words);
        }
        c += block_dim_x();
    }
}

/// `gemv_fp8`: `gemv_blocks` over fp8 rows. (The GGUF types multiply in integers instead,
/// `gemv_codes.rs`; fp8's values are not integers.)
///
/// # Safety
/// The host's launch wrapper checks `gemv_blocks`'s preconditions.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "gpu-kernel" fn gemv_fp8(
    out: *mut f32,
    x: *const f32,
    w: *const u8,
    row_scales: *const f32,
    bias: *const f32,
    n_tokens: u32,
    n_in: u32,
    n_out: u32,
    out_stride: u32,
    accumulate: u32,
) {
    // SAFETY: the wrapper's checks.
    unsafe {
        gemv_blocks::<Fp8>(
            out,
            x,
            w,
            row_scales,
            bias,
            n_tokens as usize,
            n_in as usize,
            n_out as usize,
            out_stride as usize,
            accumulate != 0,
        )
    }
}

/// `dequant_<type>`: `dequant_blocks` over each type, its sizes as `u32`s.
macro_rules! dequant_kernels {
    ($($ty:ident => $dequant:ident;)*) => {$(
        #[doc = concat!("`dequant_blocks` over `", stringify!($ty), "` weights.")]
        ///
        /// # Safety
        /// The host's launch wrapper checks `dequant_blocks`'s preconditions.
        #[unsafe(no_mangle)]
        pub unsafe extern "gpu-kernel" fn $dequant(
            out_bf16: *mut u16,
            out_f32: *mut f32,
            w: *const u8,
            row_scales: *const f32,
            rows: *const u32,
            n_rows: u32,
            n_in: u32,
        ) {
            // SAFETY: the wrapper's checks.
            unsafe {
                dequant_blocks::<$ty>(
                    out_bf16, out_f32, w, row_scales, rows, n_rows as usize, n_in as usize,
                )
            }
        }
    )*};
}

dequant_kernels! {
    Q4_0 => dequant_q4_0;
    Q4_1 => dequant_q4_1;
    Q5_0 => dequant_q5_0;
    Q5_1 => dequant_q5_1;
    Q8_0 => dequant_q8_0;
    Q4K => dequant_q4_k;
    Q5K => dequant_q5_k;
    Q6K => dequant_q6_k;
    Fp8 => dequant_fp8;
}
