//! `gemm_wgmma_<type>`: a prompt's linear layer (more than 64 tokens) over GGUF blocks on
//! Hopper's warpgroup tensor cores, the weights dequantized in registers on their way in.
//!
//! Before this kernel a prompt dequantized each matrix to bf16 (`dequant_<type>`) and ran
//! `gemm_wgmma_bf16` on it: for Q8_0 two bytes written and read again for every byte of
//! blocks, 6.4 of the 23.9 ms a 512-token prompt of the 8B shape took on the H200
//! (docs/lessons.md#prefill-on-tensor-cores). A first try decoded the blocks into the bf16
//! tile the tensor cores read from shared memory, and the decoding's instructions (a swizzled
//! store of every pair, then the warpgroup's reads) left the GEMM at 307 TFLOP/s.
//!
//! Here the weights are the product's first operand, which `wgmma` also takes from
//! registers (`Accumulators::mma_bf16_rs`): a warpgroup owns 64 output features, each thread
//! the `mma.sync` A-fragment of two of them, and it decodes its own weights straight into
//! that fragment, no shared-memory round trip. The tokens are the product's `N` (128 or 256
//! of them a tile), read from a swizzled shared tile by descriptor as `gemm_wgmma_bf16`
//! reads its weights. A step decodes its four fragments while the tensor cores still run
//! the step before: the decoding hides under the products.
//!
//! The weights stream through shared memory in stages of 256 weights a row (four steps),
//! copied by `cp.async` in whole 16-byte pieces (a row's run of 256 weights is 144 bytes in
//! Q4_0 and Q4_K, 160 in Q4_1, 176 in Q5_0 and Q5_K, 192 in Q5_1, 272 in Q8_0; Q6_K's 210
//! start at any even offset, and take the 14 pieces around them), two stages held: one
//! being decoded, the next arriving. A lane reads only its own elements
//! (`K16Parts::load_k16`), in the reduction's own order, since the activations reach the
//! tensor cores unrenumbered.

use crate::block_parts::{K16Parts, Shared};
use crate::device::{
    WARP, block_idx_x, block_idx_y, block_idx_z, dynamic_shared, grid_dim_z, sync_threads,
    thread_idx_x, wait_for_previous_kernel,
};
use crate::gemm_blocks::Args;
use crate::gemm_skinny::Store;
use crate::mma::{cp_async_16, cp_async_commit, cp_async_wait, shared_addr};
use crate::quant_blocks::{Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q5K, Q6K, Q8_0};
use crate::tiles::{
    WGMMA_BK, WGMMA_BLOCKS_ROWS, WGMMA_BLOCKS_STAGE_K, WGMMA_BLOCKS_WIDTHS, WGMMA_STAGES,
    WGMMA_THREADS, wgmma_blocks_run, wgmma_blocks_run_stride,
};
use crate::unroll::unroll;
use crate::wgmma::{self, Accumulators, descriptor_sw128, swizzle_128b};

/// Batches of products (steps) a warpgroup leaves running when it reaches the next step's
/// barrier: the next step's decoding runs under them.
const LAG: usize = 1;
/// Steps requested ahead of the one being multiplied: every buffer but that one's and the
/// LAG ones still being read.
const AHEAD: usize = WGMMA_STAGES - 1 - LAG;
/// 16-byte chunks along a token's row of a step (64 bf16).
const X_CHUNKS: usize = WGMMA_BK * 2 / 16;
/// Bytes of a step's tile of tokens: `[256][64]` bf16, a whole number of swizzle periods.
const X_TILE_BYTES: usize = WGMMA_BLOCKS_WIDTHS[1] * WGMMA_BK * 2;
/// Steps in a stage of the weights.
const STAGE_STEPS: usize = WGMMA_BLOCKS_STAGE_K / WGMMA_BK;
/// Groups of 32 weights in a step.
const STEP_GROUPS: usize = WGMMA_BK / 32;

/// The kernel for tiles of `A::N` tokens over weights of type `B`.
///
/// # Safety
/// The kernel's preconditions.
#[inline(always)]
unsafe fn body<B: K16Parts, A: Accumulators>(a: &Args) {
    let tid = thread_idx_x();
    let (group, warp, lane) = (tid / 128, tid % 128 / WARP, tid % WARP);
    let (g, q) = (lane / 4, lane % 4);
    let first_row = block_idx_x() * WGMMA_BLOCKS_ROWS;
    let t0 = block_idx_y() * A::N;
    // This lane's rows, g and g + 8 of its warp's 16, of its warpgroup's 64.
    let r_lo = 64 * group + 16 * warp + g;
    // A run's bytes in memory and in shared memory (whole 16-byte pieces around it).
    let run_bytes = wgmma_blocks_run(B::BLOCK_LEN, B::BLOCK_BYTES);
    let run_stride = wgmma_blocks_run_stride(B::BLOCK_LEN, B::BLOCK_BYTES);
    let row_bytes = a.n_in / B::BLOCK_LEN * B::BLOCK_BYTES;

    // This block's stages of the reduction (a split is whole stages), and their steps.
    let all_stages = a.n_in / WGMMA_BLOCKS_STAGE_K;
    let per_split = all_stages.div_ceil(grid_dim_z());
    let first = (block_idx_z() * per_split).min(all_stages);
    let steps = STAGE_STEPS * per_split.min(all_stages - first);
    // Where stage i's run starts in its first piece: 0 unless runs are not whole pieces
    // (Q6_K); rows are (a precondition), so it is the same for every row.
    let skew = |i: usize| ((first + i) * run_bytes % 16) as u32;

    // Shared: `WGMMA_STAGES` buffers of the tokens' swizzled `[256][64]` tile, then two of
    // the rows' `[128][run_stride]` runs. The swizzle repeats every 1024 bytes and the
    // hardware reads it from the address bits: the buffers start on a 1024-byte boundary
    // (the launch asks for 1 KiB to spare).
    let smem = (shared_addr(dynamic_shared::<u8>()) + 1023) & !1023;
    let x_tile = |s: usize| smem + (s * X_TILE_BYTES) as u32;
    let w_tile =
        |b: usize| smem + (WGMMA_STAGES * X_TILE_BYTES + b * WGMMA_BLOCKS_ROWS * run_stride) as u32;

    // Requests step `t` into buffer `s`: chunks `tid`, `tid + 256`, ... of the tokens' rows
    // (tokens past `n` zero-filled); and, every `STAGE_STEPS` steps, the rows' runs of a
    // stage (rows past the matrix skipped) into the weights' other buffer: the whole 16-byte
    // pieces around each run (rows are whole pieces, a precondition; so is a run, but for
    // Q6_K's).
    let request = |s: usize, t: usize| {
        // Stage i rides with step 4i - AHEAD (stage 0 with step 0): requested at step 4i - 4,
        // as stage i - 1 begins, a whole stage ahead, since its rows come from memory (a
        // step's tokens come from L2). Its buffer's stage before, i - 2, was last decoded at
        // step 4i - 5.
        let stage = match t {
            0 => Some(0),
            _ if (t + AHEAD).is_multiple_of(STAGE_STEPS) => Some((t + AHEAD) / STAGE_STEPS),
            _ => None,
        };
        if let Some(i) = stage.filter(|&i| i * STAGE_STEPS < steps) {
            let pieces = run_stride / 16;
            let start = ((first + i) * run_bytes) & !15;
            let mut e = tid;
            while e < WGMMA_BLOCKS_ROWS * pieces {
                let (r, p) = (e / pieces, e % pieces);
                if first_row + r < a.n_out {
                    // The pieces around the run end inside the row: both are whole pieces.
                    let from = (first_row + r) * row_bytes + start + 16 * p;
                    let to = w_tile(i % 2) + (r * run_stride + 16 * p) as u32;
                    // SAFETY: inside the weights' buffer; 16 aligned bytes of row
                    // first_row + r of w.
                    unsafe { cp_async_16(to, a.w.wrapping_add(from), true) };
                }
                e += WGMMA_THREADS;
            }
        }
        let k0 = first * WGMMA_BLOCKS_STAGE_K + t * WGMMA_BK;
        for j in 0..A::N * X_CHUNKS / WGMMA_THREADS {
            let c = tid + WGMMA_THREADS * j;
            let (row, chunk) = (c / X_CHUNKS, c % X_CHUNKS);
            let valid = t0 + row < a.n;
            let src = if valid {
                a.x.wrapping_add((t0 + row) * a.n_in + k0 + 8 * chunk)
            } else {
                a.x
            };
            // SAFETY: inside buffer s's swizzled tile; src, when valid, 8 activations of a
            // token at a multiple of 8 from x's aligned start, k0 + 64 <= n_in.
            unsafe { cp_async_16(x_tile(s) + swizzle_128b(row, chunk) as u32, src, valid) };
        }
    };

    let mut acc = A::zeros();
    // Step `t`: this lane's four fragments decoded into `frags` (two groups of 32, each the
    // first operand of two 16-deep products), the products issued, the step `AHEAD` on
    // requested. The products read `frags` after the call returns, until a `wait_group`
    // covers them, so consecutive steps take different arrays (the loop below runs steps
    // in pairs): in a loop the compiler kept rolled one array would be rewritten under the
    // products of the step before. A macro, not a closure: called three times, a closure
    // is kept out of line, and the accumulators go through local memory.
    macro_rules! step {
        ($t:expr, $frags:ident) => {{
            let (t, frags, acc) = ($t, &mut $frags, &mut acc);
            cp_async_wait::<{ (AHEAD - 1) as u32 }>();
            wgmma::fence_proxy_async_shared();
            // Step t is in shared memory for everyone; and both warpgroups are done with step
            // t - 1 - LAG (each waited for it at the end of step t - 1), whose buffer is
            // refilled below.
            // SAFETY: all threads run the same number of steps.
            unsafe { sync_threads() };
            let s = t % WGMMA_STAGES;
            // The step's first group of 32 in the run: in block `g / per_block` of it, group
            // `g0` of that block (Q8_0: the step's first of two blocks; the k-quants: group
            // 2 (t % 4) of their one block).
            let (stage, g) = (t / STAGE_STEPS, STEP_GROUPS * (t % STAGE_STEPS));
            let per_block = B::BLOCK_LEN / 32;
            let (block, g0) = (g / per_block, g % per_block);
            let run_at = w_tile(stage % 2) + skew(stage) + (block * B::BLOCK_BYTES) as u32;
            let row_at = |r: usize| Shared(run_at + (r * run_stride) as u32);
            let (lo_row, hi_row) = (row_at(r_lo), row_at(r_lo + 8));
            unroll!(grp < 2 => {
                // SAFETY: the step's runs hold whole blocks, published by the barrier (rows past
                // the matrix read what the buffer held: their sums are never stored).
                let (lo, hi) = unsafe {
                    (
                        B::decode_bf16(&B::load_k16(lo_row, g0 + grp, q)),
                        B::decode_bf16(&B::load_k16(hi_row, g0 + grp, q)),
                    )
                };
                frags[2 * grp] = [lo[0], hi[0], lo[1], hi[1]];
                frags[2 * grp + 1] = [lo[2], hi[2], lo[3], hi[3]];
            });
            // The fragments' registers are written: order them before the products.
            wgmma::fence();
            unroll!(k < 4 => {
                let b = descriptor_sw128(x_tile(s) + 32 * k as u32);
                // SAFETY: the whole warpgroup is here, the descriptor names a 1024-byte-aligned
                // swizzled tile of this block's shared memory, and `fence` came first.
                unsafe { acc.mma_bf16_rs(frags[k], b) };
            });
            wgmma::commit_group();
            let ahead = t + AHEAD;
            if ahead < steps {
                request(ahead % WGMMA_STAGES, ahead);
            }
            cp_async_commit();
            // All but the newest LAG batches of products are done: the other array and the
            // buffers of the steps before are free.
            wgmma::wait_group::<{ LAG as u32 }>();
        }};
    }

    // The pipeline, as `gemm_wgmma_bf16`'s: one copy group per step, empty or not, so that
    // "all but the newest AHEAD - 1 groups have landed" always means "step t has".
    for t in 0..AHEAD {
        if t < steps {
            request(t, t);
        }
        cp_async_commit();
    }
    let (mut even, mut odd) = ([[0u32; 4]; 4], [[0u32; 4]; 4]);
    let mut t = 0;
    while t + 1 < steps {
        step!(t, even);
        step!(t + 1, odd);
        t += 2;
    }
    if t < steps {
        step!(t, even);
    }
    wgmma::wait_group::<0>();
    cp_async_wait::<0>();
    acc.pin();

    // Word 4j + 2h + e of the accumulators is feature `r_lo + 8h`, token `8j + 2q + e` of
    // the tile: `Store`'s layout, tile j.
    let split = grid_dim_z() > 1;
    let part = if split { block_idx_z() * a.n } else { 0 };
    let st = Store {
        dst: a.out.wrapping_add((part + t0) * a.out_stride),
        n: a.n - t0,
        n_out: a.n_out,
        out_stride: a.out_stride,
        split,
        accumulate: a.accumulate,
        bias: a.bias,
        f0: first_row + r_lo,
        q,
    };
    acc.for_each_block(|j, v| {
        // SAFETY: `st` describes this launch's output from the tile's first token on.
        unsafe { st.tile(j, v) }
    });
}

/// `gemm_wgmma_<type>` for each type with `K16Parts`.
macro_rules! wgmma_blocks_kernels {
    ($($ty:ident => $name:ident;)*) => {$(
        #[doc = concat!("`out[t, o] (+)= sum_i x[t, i] w[o, i] + bias[o]` over `",
            stringify!($ty), "` weights, on the warpgroup tensor cores.")]
        ///
        /// - `out`: `[n, out_stride]` f32, this matrix's columns `0..n_out`; or, with the
        ///   reduction split across `gridDim.z > 1` blocks, `[gridDim.z, n, out_stride]`:
        ///   block `z` writes its part alone, unbiased, and `gemm_skinny_reduce_f32` adds
        ///   the parts in order
        /// - `x`: `[n, n_in]` bf16 (as `u16` bits), from `f32_to_bf16`
        /// - `w`: `[n_out]` rows of `n_in / BLOCK_LEN` blocks
        /// - `bias`: `[n_out]` f32, or null (always null when split)
        /// - `tile_t`: tokens a block tile takes, 128 or 256 (any other value runs 256)
        ///
        /// Thread mapping: block `(256)` = two warpgroups takes 128 features by `tile_t`
        /// tokens; warpgroup `h` owns features `64 h ..` for all the tile's tokens, thread
        /// `t` of it rows `16 (t / 32) + t % 32 / 4` and `+ 8`; grid `(ceil(n_out / 128),
        /// ceil(n / tile_t), splits)`. Each 64-deep step copies a `tile_t x 64` slice of `x`
        /// into one of `WGMMA_STAGES` buffers, each fourth the rows' next 256 weights.
        ///
        /// PRECONDITIONS: `n_in % 256 == 0`, rows of whole 16-byte pieces (`n_in /
        /// BLOCK_LEN * BLOCK_BYTES % 16 == 0`); `w` and `x` 16-byte aligned, `x` not
        /// overlapping `out` (a split past the last stage of 256 stores zeros);
        /// `wgmma_blocks_shared_bytes` of dynamic shared memory; `bias` null and
        /// `accumulate == 0` when split.
        ///
        /// # Safety
        /// The host's launch wrapper checks the preconditions.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "gpu-kernel" fn $name(
            out: *mut f32,
            x: *const u16,
            w: *const u8,
            bias: *const f32,
            n: u32,
            n_in: u32,
            n_out: u32,
            out_stride: u32,
            accumulate: u32,
            tile_t: u32,
        ) {
            wait_for_previous_kernel();
            let args = Args::new(out, x, w, bias, n, n_in, n_out, out_stride, accumulate);
            // One body per tile width, so that each keeps its accumulators in registers.
            // SAFETY: the preconditions, passed on.
            unsafe {
                match tile_t {
                    128 => body::<$ty, [f32; 64]>(&args),
                    _ => body::<$ty, [f32; 128]>(&args),
                }
            }
        }
    )*};
}

wgmma_blocks_kernels! {
    Q4_0 => gemm_wgmma_q4_0;
    Q4_1 => gemm_wgmma_q4_1;
    Q5_0 => gemm_wgmma_q5_0;
    Q5_1 => gemm_wgmma_q5_1;
    Q8_0 => gemm_wgmma_q8_0;
    Q4K => gemm_wgmma_q4_k;
    Q5K => gemm_wgmma_q5_k;
    Q6K => gemm_wgmma_q6_k;
}
