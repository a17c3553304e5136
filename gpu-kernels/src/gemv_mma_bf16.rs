//! bf16 weights times up to 8 tokens on the tensor cores: a block's 16 rows (of one matrix, or
//! of the gate and up with the SwiGLU) against the tokens, the body of the grouped experts'
//! `gemv_experts_mma_bf16` (`gemv_experts.rs`), which calls it for each 8 pairs of a run.
//!
//! `gemv_experts_bf16` multiplies a row by each pair in turn on the CUDA cores: at 64 sequences
//! of Qwen3-30B-A3B in bf16 (about 4 pairs an expert) and in its prompts (about 32) that is the
//! step's time, where round 75's tensor-core GEMV had cut Q4_K_M's (`gemv_mma.rs`). Here one
//! `mma.m16n8k16` (bf16 in, f32 sums) multiplies 16 rows by 8 tokens over 16 values: the
//! weights the first operand as stored, the activations, f32 rows, rounded to bf16 (as the
//! prompts' GEMMs round them) as the second.
//!
//! An `mma` sums over its 16 values of k whatever their order, so long as each lane holds the
//! same k in both operands: lane `t` (of the four a row or a token shares) loads 8
//! consecutive values of each of its two rows (one 16-byte load) and of its token (two), at
//! `8t` of a span of 32, and gives the first 4 to one `mma` and the last 4 to a second.

use crate::device::{WARP, block_idx_x, dynamic_shared, exp, ld_nc_v4, pack_bf16x2, thread_idx_x};
use crate::mma::mma_bf16_16816;
use crate::tiles::{MMA_GEMV_ROWS, MMA_GEMV_WARPS, QUANT_MAX_TOKENS};
use crate::unroll::unroll;

/// Values of k a warp takes at a time: two `mma`s' worth.
const SPAN: usize = 32;

/// `out[t, o] = sum_i w[o, i] x[t, i]` for the block's 16 rows o and `tokens` tokens t (with
/// `M` = 2, `silu(gate) * up` of `w[0]` and `w[1]`).
///
/// - `out`: `[tokens, out_stride]` f32, columns `block_idx_x() * 16 ..` (below `n_out`)
/// - `x`: `[tokens, n_in]` f32
/// - `w`: `M` matrices `[n_out, n_in]` bf16
///
/// Thread mapping: `MMA_GEMV_WARPS` warps, each the spans `warp, warp + MMA_GEMV_WARPS, ...`
/// of every row; their sums meet in shared memory (`[warps][M][16][8]` f32) and thread
/// `row * 8 + t` writes row `row` for token t.
///
/// # Safety
/// `1 <= tokens <= QUANT_MAX_TOKENS`; `n_in % 32 == 0`; `x` and every `w` 16-byte aligned and
/// read-only during the launch, `out` apart from them; `mma_gemv_shared_bytes(M)` bytes of
/// dynamic shared memory; every thread of the block calls it (a barrier inside), and the
/// caller orders any earlier use of that shared memory before the call.
#[inline(always)]
pub(crate) unsafe fn gemv_mma_bf16_pass<const M: usize>(
    out: *mut f32,
    x: *const f32,
    w: [*const u16; M],
    tokens: usize,
    (n_in, n_out, out_stride): (usize, usize, usize),
) {
    const R: usize = MMA_GEMV_ROWS;
    const T: usize = QUANT_MAX_TOKENS;
    let (warp, lane) = (thread_idx_x() / WARP, thread_idx_x() % WARP);
    let (g, t) = (lane / 4, lane % 4);
    let first = block_idx_x() * R;
    // Rows g and g + 8 of each matrix; rows past the matrix read its last row, written nowhere.
    let mut rows = [[core::ptr::null::<u16>(); 2]; M];
    unroll!(m < M => {
        unroll!(r < 2 => {
            rows[m][r] = w[m].wrapping_add((first + g + 8 * r).min(n_out - 1) * n_in + 8 * t);
        });
    });
    // Token g's row; tokens past the pass read its last one, written nowhere.
    let xs = x.wrapping_add(g.min(tokens - 1) * n_in + 8 * t);
    let mut acc = [[0.0f32; 4]; M];
    let mut k = warp * SPAN;
    while k < n_in {
        // SAFETY: k + 8t + 8 <= n_in (n_in a multiple of 32): inside every row and the token's.
        unsafe {
            let (x0, x1) = (
                ld_nc_v4(xs.add(k) as *const u32),
                ld_nc_v4(xs.add(k + 4) as *const u32),
            );
            let v = |i: usize| f32::from_bits(if i < 4 { x0[i] } else { x1[i - 4] });
            // k 8t..8t+3 of the span for the first mma, 8t+4..8t+7 for the second.
            let b = [
                [pack_bf16x2(v(0), v(1)), pack_bf16x2(v(2), v(3))],
                [pack_bf16x2(v(4), v(5)), pack_bf16x2(v(6), v(7))],
            ];
            unroll!(m < M => {
                let (lo, hi) = (
                    ld_nc_v4(rows[m][0].add(k) as *const u32),
                    ld_nc_v4(rows[m][1].add(k) as *const u32),
                );
                // a: (row g, the pair κ 2t), (row g + 8, the same), (row g, κ 2t + 8),
                // (row g + 8, the same): here k 8t + 4h + 0..2 and 8t + 4h + 2..4.
                unroll!(h < 2 => {
                    let a = [lo[2 * h], hi[2 * h], lo[2 * h + 1], hi[2 * h + 1]];
                    mma_bf16_16816(&mut acc[m], a, b[h]);
                });
            });
        }
        k += MMA_GEMV_WARPS * SPAN;
    }
    // [warps][M][R][T] f32: each warp's sums, `mma`'s layout (row g, tokens 2t and 2t + 1;
    // row g + 8, the same).
    let partial = dynamic_shared::<f32>();
    let at = |warp: usize, m: usize, row: usize, t: usize| ((warp * M + m) * R + row) * T + t;
    unroll!(m < M => {
        unroll!(i < 4 => {
            // SAFETY: inside the launch's shared memory (the preconditions).
            unsafe { *partial.add(at(warp, m, g + 8 * (i / 2), 2 * t + i % 2)) = acc[m][i] };
        });
    });
    // SAFETY: every thread of the block reaches this barrier.
    unsafe { crate::device::sync_threads() };
    let i = thread_idx_x();
    let (row, t) = (i / T, i % T);
    let o = first + row;
    if i >= R * T || t >= tokens || o >= n_out {
        return;
    }
    // The sum of the warps' sums of matrix m's row for token t, in warp order.
    let total = |m: usize| {
        let mut sum = 0.0;
        for warp in 0..MMA_GEMV_WARPS {
            // SAFETY: written above, before the barrier.
            sum += unsafe { *partial.add(at(warp, m, row, t)) };
        }
        sum
    };
    // SAFETY: o < n_out and t < tokens: inside out.
    unsafe {
        *out.add(t * out_stride + o) = if M == 2 {
            let (g, u) = (total(0), total(M - 1));
            g / (1.0 + exp(-g)) * u
        } else {
            total(0)
        };
    }
}
