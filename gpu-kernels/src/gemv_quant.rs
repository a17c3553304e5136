//! Linear layers over quantized weights (`quant_blocks.rs`), the weights dequantized in
//! registers on their way from memory:
//! - `gemv_fp8`: up to `QUANT_MAX_TOKENS` tokens times an fp8 matrix, the decode step's
//!   matmul. Decode reads every weight once per token, so the fewer bytes a weight takes,
//!   the faster the step. (The GGUF types have their own, in integers: `gemv_codes.rs`.)
//! - `dequant_<type>`: rows of the matrix to bf16 (for the tensor-core GEMM of a prompt,
//!   which does enough arithmetic per weight that the extra pass costs little) or to f32
//!   (the embedding's rows for a batch's tokens), written once, generic over the type
//!   (`dequant_blocks`), and stamped out per type at the end of the file.

use crate::device::{
    WARP, block_dim_x, block_idx_x, dynamic_shared, fma, global_idx_x, ld_nc_u32, ld_nc_v4,
    pack_bf16x2, st_v4, sync_threads, thread_idx_x, thread_idx_y, wait_for_previous_kernel,
    warp_sum,
};
use crate::gemv::row_part;
use crate::quant_blocks::{Blocks, Fp8, GROUP, Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q5K, Q6K, Q8_0, fp8x4};
use crate::tiles::{DEQUANT_STAGE_WORDS, FP8_UNROLL, FP8_WARP_STEP, QUANT_MAX_TOKENS};
use crate::unroll::unroll;

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

/// fp8 weights (columns) in one warp's chunk: 32 lanes x 4 places x 4 bytes; a step
/// (`FP8_WARP_STEP`, shared with the host's launch) is `FP8_UNROLL` of them.
const FP8_WARP_CHUNK: usize = FP8_WARP_STEP / FP8_UNROLL;

/// `sum_j w[j] x[j]` over the four fp8 weights of `word` and the four activations at `x`
/// (one 16-byte load), 2^-120 times the true sum (`fp8x4`).
///
/// # Safety
/// `x` is 16-byte aligned, holds 4 floats and is read-only during the kernel.
#[inline(always)]
unsafe fn dot4_fp8(word: u32, x: *const f32) -> f32 {
    // SAFETY: the caller's guarantee.
    let xs = unsafe { ld_nc_v4(x as *const u32) };
    let w = fp8x4(word);
    let x = xs.map(f32::from_bits);
    let half = fma(w[0], x[0], w[1] * x[1]);
    fma(w[2], x[2], fma(w[3], x[3], half))
}

/// One step of a warp's walk along its part of a row, for one token: `FP8_UNROLL` chunks
/// of 512 columns from column `c`, every load issued before any is used. Word q of chunk k
/// holds the 4 columns at `c + 512 k + 128 q + 4 lane`, so that the warp's loads of a word,
/// and of its 4 activations, are 128 and 512 bytes in a row. (A lane that took 16 columns
/// in a row read its activations 64 bytes from its neighbour's: every 16-byte load of the
/// warp touched 16 cache lines.) With `CHECKED`, for the part's last step, words at or past
/// `end` are left out; without it every word is inside, and the addresses are the same
/// register plus constants. (A check on every word put a branch around every load, and fp8
/// decoded at 0.89 times this speed: BENCHMARKS.md round 29.)
///
/// # Safety
/// `w_row` is a row of the matrix and `x_t` the token's activations (16-byte aligned);
/// `c` and `end` are inside the row, `end - c` whole 16s of columns, and without `CHECKED`
/// at least a step.
#[inline(always)]
unsafe fn fp8_step<const CHECKED: bool>(
    w_row: *const u8,
    x_t: *const f32,
    c: usize,
    end: usize,
    lane: usize,
) -> f32 {
    const U: usize = FP8_UNROLL;
    let first = c + 4 * lane;
    let inside = |at: usize| !CHECKED || first + at < end;
    let mut words = [[0u32; 4]; U];
    unroll!(k < U => {
        unroll!(q < 4 => {
            let at = k * FP8_WARP_CHUNK + 128 * q;
            if inside(at) {
                // SAFETY: 4 bytes of the row inside the part, 4-byte aligned.
                words[k][q] = unsafe { ld_nc_u32(w_row.add(first + at) as *const u32) };
            }
        });
    });
    let mut sums = [0.0f32; 2];
    unroll!(k < U => {
        unroll!(q < 4 => {
            let at = k * FP8_WARP_CHUNK + 128 * q;
            if inside(at) {
                // SAFETY: the token's 4 activations at the word's columns, 16-byte aligned.
                sums[q % 2] += unsafe { dot4_fp8(words[k][q], x_t.add(first + at)) };
            }
        });
    });
    sums[0] + sums[1]
}

/// `out[t, o] = (accumulate ? out[t, o] : 0) + scale[o] * sum_i w[o, i] x[t, i] + bias[o]`
/// for tokens `t < n_tokens`, over fp8 rows: the decode step's matmul for `--weights fp8`.
///
/// - `out`: `[n_tokens, out_stride]` f32, this matrix's rows at columns `0..n_out`
/// - `x`: `[n_tokens, n_in]` f32
/// - `w`: `[n_out, n_in]` e4m3; `row_scales`: `[n_out]` f32
/// - `bias`: null or `[n_out]` f32
///
/// Thread mapping: `gemv_bf16`'s. A block is `(32 * parts, rows)`: each of its `rows` rows
/// is read by `parts` warps side by side (`row_part`), each warp walking its part in steps
/// of `FP8_UNROLL` chunks of 512 columns (`fp8_step`): a lane loads 4 bytes of each of 4
/// places in a chunk, all the step's loads in flight before it uses any, and multiplies
/// them by the token's activations, which it reads from global memory: every block reads
/// the same few, so they stay in L1. Tokens one after the other (a token after the first
/// finds the weights in L1). A warp's lanes meet in shuffles, a row's warps in shared
/// memory.
///
/// Measured (BENCHMARKS.md round 29): the first version staged the activations in shared
/// memory, 1024 columns a step with two barriers each, and decoded at 0.31 of the copy
/// bandwidth; this walk, 0.36. `ncu` finds it issuing an instruction every other cycle
/// per scheduler, its warps waiting on L1 for the activations, four bytes of which come
/// with every weight's byte.
///
/// # Safety
/// `n_in % 32 == 0`; `w` and `x` 16-byte aligned; `1 <= n_tokens <= QUANT_MAX_TOKENS`;
/// `blockDim.x` a multiple of 32; the launch gives `fp8_shared_bytes(warps)` bytes of
/// dynamic shared memory; `x` does not overlap `out`.
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
    wait_for_previous_kernel();
    const T: usize = QUANT_MAX_TOKENS;
    let (n_tokens, n_in, n_out) = (n_tokens as usize, n_in as usize, n_out as usize);
    let out_stride = out_stride as usize;
    let lane = thread_idx_x() % WARP;
    let (row, part, start, end) = row_part(n_in, 16);
    let live = row < n_out;
    let w_row = w.wrapping_add(row * n_in);
    // [warps][T] f32: each warp's sums, then a row's warps added in order.
    let shared = dynamic_shared::<f32>();
    let parts = block_dim_x() / WARP;
    let warp = thread_idx_y() * parts + part;
    // Tokens one after the other, in a loop the compiler keeps rolled: the sums of all
    // eight at once held a thread to 80 registers and an SM to 24 warps, and ran at 0.9
    // times this loop's speed (round 29; `gemv_codes` found the same). A token after the
    // first finds its weights in L1.
    for t in 0..n_tokens {
        let mut sum = 0.0f32;
        let (mut c, x_t) = (start, x.wrapping_add(t * n_in));
        if live {
            // SAFETY (both): the part of a row inside the matrix; whole steps, then the
            // rest (whole 16s of columns: `row_part`).
            while c + FP8_WARP_STEP <= end {
                sum += unsafe { fp8_step::<false>(w_row, x_t, c, end, lane) };
                c += FP8_WARP_STEP;
            }
            if c < end {
                sum += unsafe { fp8_step::<true>(w_row, x_t, c, end, lane) };
            }
        }
        let v = warp_sum(sum);
        if lane == 0 {
            // SAFETY: warp < the block's warps, t < T: inside the shared memory.
            unsafe { *shared.add(warp * T + t) = v };
        }
    }
    // SAFETY: every thread of the block reaches the barrier.
    unsafe { sync_threads() };
    let t = thread_idx_x();
    if live && t < n_tokens {
        let mut sum = 0.0;
        for p in 0..parts {
            // SAFETY: written above, before the barrier.
            sum += unsafe { *shared.add((thread_idx_y() * parts + p) * T + t) };
        }
        // SAFETY: row < n_out, t < n_tokens: inside out, the scales and bias.
        unsafe {
            let scale = row_scale::<Fp8>(row_scales, row);
            let o = out.add(t * out_stride + row);
            let b = if bias.is_null() { 0.0 } else { *bias.add(row) };
            let prev = if accumulate != 0 { *o } else { 0.0 };
            *o = prev + sum * scale + b;
        }
    }
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
/// `w` is whole blocks of the type, aligned as `Blocks::load` asks; every `rows[r]` a row of the matrix; exactly one output set, with
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
