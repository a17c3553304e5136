//! `gemm_<type>`: a linear layer of 1 to 64 tokens (a batched decode step, a short prompt)
//! over GGUF weights on the tensor cores, the weights dequantized in registers on their way
//! to the `mma`, never written out as bf16.
//!
//! Up to 8 tokens the integer GEMV (`gemv_codes.rs`) reads every weight once for all of them.
//! Past 8 its registers run out, and before this kernel the matrix was dequantized to bf16
//! (`dequant_<type>`: two bytes written and read again for every weight, each step) for the
//! skinny matmul: at 16 sequences a Q4_K_M step cost twice a bf16 one. Here each weight is
//! read once, in its few bits, and turned into bf16 in the registers of the lane that feeds
//! it to the tensor cores.
//!
//! The shape is the skinny matmul's (`gemm_skinny.rs`): the weights are the `mma`'s 16-row
//! `a` operand and the tokens its 8-wide `b`, a warp owns 16 output rows for every token, 8
//! warps make a block of 128 rows, and the reduction is split across blocks where a matrix
//! has too few rows to fill the GPU (`gemm_skinny_reduce_f32` adds the parts in order). The
//! reduction is renumbered the same way too: inside a 32-wide step, lane `l`'s eight
//! consecutive weights `8 (l % 4) ..` play the `mma`'s elements `2 (l % 4), +1, +8, +9` of
//! two `mma`s, and the activations are read with the same renumbering. That is what makes a
//! lane's share of a group of 32 one run of bytes (`block_parts.rs`).
//!
//! The weights stream through shared memory in stages of 256 weights a row (a k-quant
//! block, eight of the others), with the tokens' activations of the same 256 columns, by
//! asynchronous copies (`cp.async`), the next stages in flight while the warps decode and
//! multiply the oldest: decode is a stream of weights, and the more bytes each SM has asked
//! for, the closer it runs to the memory's speed. Blocks of 18, 22, 34 or 210 bytes start at
//! any even address, so a row's run is copied in 16-byte pieces from the aligned address at
//! or before it, and lands at the same address mod 16 in shared memory: every load of
//! `block_parts.rs` keeps its alignment. (Two first versions read at 530 GB/s: one loaded
//! each lane's weights straight into registers one stage ahead, the other read the
//! activations from global memory, which waited on L2 at every group.)

use crate::args::MatmulShape;
use crate::block_parts::{Parts, Shared};
use crate::device::{
    WARP, block_idx_x, block_idx_y, dynamic_shared, grid_dim_y, sync_threads, thread_idx_x,
    wait_for_previous_kernel,
};
use crate::gemm_skinny::{Store, wait_pending};
use crate::mma::{
    cp_async_16, cp_async_16_part, cp_async_commit, cp_async_wait, ld_shared_v4, mma_bf16_16816,
    shared_addr,
};
use crate::quant_blocks::{Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q5K, Q6K, Q8_0};
use crate::tiles::{
    BLOCKS_MMA_ROWS, BLOCKS_MMA_STAGE_K, BLOCKS_MMA_THREADS, blocks_mma_pitch,
    blocks_mma_stage_bytes, blocks_mma_stages, skinny_tiles,
};
use crate::unroll::unroll;

/// The arguments of a GEMM over GGUF blocks, as its body uses them (`gemm_<type>`'s and
/// `gemm_wgmma_<type>`'s).
pub(crate) struct Args {
    pub out: *mut f32,
    pub x: *const u16,
    pub w: *const u8,
    pub bias: *const f32,
    pub n: usize,
    pub n_in: usize,
    pub n_out: usize,
    pub out_stride: usize,
    pub accumulate: bool,
}

impl Args {
    /// From a kernel's arguments, in their order.
    #[inline(always)]
    pub(crate) fn new(
        out: *mut f32,
        x: *const u16,
        w: *const u8,
        bias: *const f32,
        shape: MatmulShape,
    ) -> Args {
        let [n, n_in, n_out, out_stride] = shape.sizes();
        Args {
            out,
            x,
            w,
            bias,
            n,
            n_in,
            n_out,
            out_stride,
            accumulate: shape.accumulates(),
        }
    }
}

/// 16-byte pieces in a token's row of a stage (256 bf16).
const X_PIECES: usize = BLOCKS_MMA_STAGE_K / 8;

/// Where piece `p` of token row `t` of a stage's activations lives: 512-byte rows, odd rows
/// with each 128 bytes' halves swapped, so that the eight lanes of a load phase (two rows,
/// four pieces each) hit distinct banks.
#[inline(always)]
fn x_at(tile: u32, t: usize, p: usize) -> u32 {
    tile + (t * 512 + 16 * (p ^ ((t & 1) << 2))) as u32
}

/// The body for `T` tiles of 8 tokens (`n <= 8 T`; tiles past `n` hold zeros and are not
/// stored).
///
/// # Safety
/// The kernel's preconditions.
#[inline(always)]
unsafe fn body<B: Parts, const T: usize>(a: &Args) {
    let tid = thread_idx_x();
    let (lane, warp) = (tid % WARP, tid / WARP);
    let (g, q) = (lane / 4, lane % 4);
    // This lane's rows are g and g + 8 of its warp's 16 (the block's `r_lo`, `r_lo + 8`).
    let first_row = block_idx_x() * BLOCKS_MMA_ROWS;
    let r_lo = 16 * warp + g;
    let row_bytes = a.n_in / B::BLOCK_LEN * B::BLOCK_BYTES;
    let stage_bytes = BLOCKS_MMA_STAGE_K / B::BLOCK_LEN * B::BLOCK_BYTES;
    let pitch = blocks_mma_pitch(B::BLOCK_LEN, B::BLOCK_BYTES);
    let w_len = a.n_out * row_bytes;

    // This block's stages of the reduction.
    let stages = a.n_in / BLOCKS_MMA_STAGE_K;
    let per_split = stages.div_ceil(grid_dim_y());
    let first = (block_idx_y() * per_split).min(stages);
    let count = per_split.min(stages - first);

    // Shared: `stages` buffers, each the rows' `[128][pitch]` bytes (each row's run of
    // blocks for the stage, at the same address mod 16 as in global memory), then the
    // tokens' `[8 T][256]` bf16.
    let stages = blocks_mma_stages(T, B::BLOCK_LEN, B::BLOCK_BYTES);
    let smem = shared_addr(dynamic_shared::<u8>());
    let w_tile =
        |b: usize| smem + (b * blocks_mma_stage_bytes(T, B::BLOCK_LEN, B::BLOCK_BYTES)) as u32;
    let x_tile = |b: usize| w_tile(b) + (BLOCKS_MMA_ROWS * pitch) as u32;
    // Where row r's run of stage i starts in global memory, as an offset into w.
    let run = |r: usize, i: usize| (first_row + r) * row_bytes + (first + i) * stage_bytes;
    // Requests stage `i` into buffer `i % stages`: thread `tid` takes pieces `tid`, `tid +
    // 256`, ... of the rows' runs, each 16 aligned bytes (rows past the matrix skipped,
    // bytes past its end zero-filled), then of the tokens' activations (tokens past `n`
    // zero-filled).
    let pieces = pitch / 16;
    let request = |i: usize| {
        let b = i % stages;
        let mut e = tid;
        while e < BLOCKS_MMA_ROWS * pieces {
            let (r, p) = (e / pieces, e % pieces);
            let start = run(r, i);
            let at = (a.w as usize + start) & !15;
            let from = at + 16 * p - a.w as usize;
            if first_row + r < a.n_out && from < start + stage_bytes {
                let bytes = (w_len - from).min(16) as u32;
                // SAFETY: inside buffer b (pitch holds every piece of the run); the piece
                // starts inside w (w is 16-byte aligned, so `at` is not before it) and reads
                // only the bytes before w's end.
                unsafe {
                    cp_async_16_part(
                        w_tile(b) + (r * pitch + 16 * p) as u32,
                        a.w.wrapping_add(from),
                        bytes,
                    )
                };
            }
            e += BLOCKS_MMA_THREADS;
        }
        let k0 = (first + i) * BLOCKS_MMA_STAGE_K;
        let mut e = tid;
        while e < 8 * T * X_PIECES {
            let (t, p) = (e / X_PIECES, e % X_PIECES);
            let valid = t < a.n;
            let src = if valid {
                a.x.wrapping_add(t * a.n_in + k0 + 8 * p)
            } else {
                a.x
            };
            // SAFETY: inside buffer b; src, when valid, 8 activations of token t at a
            // multiple of 8 from x's aligned start, k0 + 256 <= n_in.
            unsafe { cp_async_16(x_at(x_tile(b), t, p), src, valid) };
            e += BLOCKS_MMA_THREADS;
        }
    };

    let mut acc = [[0.0f32; 4]; T];
    // Stages 0 .. stages - 2 in flight before the first is used; one copy group per stage,
    // empty past the end, so that "all but the newest stages - 2 groups have landed" always
    // means "this stage has".
    for i in 0..stages - 1 {
        if i < count {
            request(i);
        }
        cp_async_commit();
    }
    for i in 0..count {
        wait_pending(stages - 2);
        // Every thread's copies of stage i are visible, and every warp is done with stage
        // i - 1, whose buffer the next request refills.
        // SAFETY: every thread reaches it (the loop bounds are block-uniform).
        unsafe { sync_threads() };
        if i + stages - 1 < count {
            request(i + stages - 1);
        }
        cp_async_commit();
        let (tile, xs) = (w_tile(i % stages), x_tile(i % stages));
        let row_at =
            |r: usize| Shared(tile + (r * pitch + ((a.w as usize + run(r, i)) & 15)) as u32);
        let (lo_row, hi_row) = (row_at(r_lo), row_at(r_lo + 8));
        for grp in 0..BLOCKS_MMA_STAGE_K / 32 {
            // Rows g and g + 8's eight weights: elements (2q, 2q+1), (2q+8, 2q+9) of the
            // first mma (their first halves) and of the second.
            // SAFETY: the stage's runs hold whole blocks, published by the barrier.
            let (lo, hi) = unsafe {
                (
                    B::decode_bf16(&B::load_part(lo_row, grp, q)),
                    B::decode_bf16(&B::load_part(hi_row, grp, q)),
                )
            };
            let (a0, a1) = ([lo[0], hi[0], lo[1], hi[1]], [lo[2], hi[2], lo[3], hi[3]]);
            unroll!(j < T => {
                // SAFETY: inside buffer i % stages, 16-byte aligned, published by the barrier.
                let xv = unsafe { ld_shared_v4(x_at(xs, 8 * j + g, 4 * grp + q)) };
                mma_bf16_16816(&mut acc[j], a0, [xv[0], xv[1]]);
                mma_bf16_16816(&mut acc[j], a1, [xv[2], xv[3]]);
            });
        }
    }
    cp_async_wait::<0>();

    // acc[j] holds rows `first_row + r_lo` (elements 0, 1) and `+ 8` (2, 3) of tokens 8j +
    // 2q, +1.
    let split = grid_dim_y() > 1;
    let st = Store {
        dst: if split {
            a.out.wrapping_add(block_idx_y() * a.n * a.out_stride)
        } else {
            a.out
        },
        n: a.n,
        n_out: a.n_out,
        out_stride: a.out_stride,
        split,
        accumulate: a.accumulate,
        bias: a.bias,
        f0: first_row + r_lo,
        q,
    };
    unroll!(j < T => {
        // SAFETY: `st` describes this launch's output (the preconditions).
        unsafe { st.tile(j, acc[j]) };
    });
}

/// `gemm_<type>` for each GGUF type with `Parts`.
macro_rules! blocks_kernels {
    ($($ty:ident => $name:ident;)*) => {$(
        #[doc = concat!("`out[t, o] (+)= sum_i x[t, i] w[o, i] + bias[o]` over `",
            stringify!($ty), "` weights, on the tensor cores.")]
        ///
        /// - `out`: `[n, out_stride]` f32, this matrix's columns `0..n_out`; or, with the
        ///   reduction split across `gridDim.y > 1` blocks, `[gridDim.y, n, out_stride]`:
        ///   block row `s` writes its part alone, unbiased, and `gemm_skinny_reduce_f32`
        ///   adds the parts in order
        /// - `x`: `[n, n_in]` bf16 (as `u16` bits), from `f32_to_bf16`
        /// - `w`: `[n_out]` rows of `n_in / BLOCK_LEN` blocks
        /// - `bias`: `[n_out]` f32, or null (always null when split)
        /// - `shape`: `n` (its `n_tokens`), `n_in`, `n_out`, `out_stride` and `accumulate`
        ///   (`MatmulShape`)
        ///
        /// Thread mapping: block `(BLOCKS_MMA_THREADS)`, 8 warps of 16 rows each; grid
        /// `(ceil(n_out / BLOCKS_MMA_ROWS), splits)`. Lane `l` of warp `w` accumulates rows
        /// `128 b + 16 w + l / 4` and `+ 8` for tokens `8 j + 2 (l % 4)`, `+ 1` of every
        /// tile `j`. A token's sums do not depend on the other tokens of the launch.
        ///
        /// PRECONDITIONS: `1 <= n <= 64`; `n_in % BLOCKS_MMA_STAGE_K == 0`; `w` 16-byte
        /// aligned; `x` 16-byte aligned and not overlapping `out`; every split has at least
        /// one stage; dynamic shared memory `blocks_mma_shared_bytes(n, BLOCK_LEN,
        /// BLOCK_BYTES)`; `bias` null and `accumulate == 0` when split.
        ///
        /// # Safety
        /// The host's launch wrapper checks the preconditions.
        #[unsafe(no_mangle)]
        pub unsafe extern "gpu-kernel" fn $name(
            out: *mut f32,
            x: *const u16,
            w: *const u8,
            bias: *const f32,
            shape: MatmulShape,
        ) {
            wait_for_previous_kernel();
            let args = Args::new(out, x, w, bias, shape);
            // One body per token-tile count, so that each keeps its accumulators in
            // registers.
            // SAFETY: the preconditions, passed on.
            unsafe {
                match skinny_tiles(args.n) {
                    1 => body::<$ty, 1>(&args),
                    2 => body::<$ty, 2>(&args),
                    4 => body::<$ty, 4>(&args),
                    _ => body::<$ty, 8>(&args),
                }
            }
        }
    )*};
}

blocks_kernels! {
    Q4_0 => gemm_q4_0;
    Q4_1 => gemm_q4_1;
    Q5_0 => gemm_q5_0;
    Q5_1 => gemm_q5_1;
    Q8_0 => gemm_q8_0;
    Q4K => gemm_q4_k;
    Q5K => gemm_q5_k;
    Q6K => gemm_q6_k;
}
