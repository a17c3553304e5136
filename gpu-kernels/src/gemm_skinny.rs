//! A matmul for a few to a hundred-odd tokens: batched decode, one token for each of many
//! sequences. It sits between the GEMV (one token: memory-bound, CUDA cores) and the prompt's
//! GEMM (hundreds of tokens: compute-bound, tensor cores in large tiles).
//!
//! At 8 to 128 tokens a step must still read every weight exactly once (the weights are what
//! cost: 16 GB for an 8B model, a few hundred KB of activations beside them), and it does
//! 2 x tokens multiply-adds per weight: at 128 tokens more than the CUDA cores can do at the
//! speed memory delivers, so the products go to the tensor cores. The prompt GEMM's tiles are
//! 128 tokens tall; most of such a tile would be padding here, and a matrix of 4096 outputs
//! would have only 32 tiles for 132 SMs. So this kernel turns the product around ("swap A
//! and B"): the weights are the `mma`'s 16-row `a` operand and the tokens its 8-wide `b`, so
//! a warp covers 16 output features for all tokens in 8-token steps, and the GPU is filled
//! along the features, with the reduction split across blocks where they are too few.
//!
//! The weights stream through shared memory in stages of 64 along the reduction, by
//! asynchronous copies (`cp.async`), up to seven stages in flight while the tensor cores work
//! on the oldest: decode is a stream of weights, and the more bytes each SM has asked for,
//! the closer it runs to the memory's speed. The activations of the same 64 columns come
//! with each stage.
//!
//! Both operands are read from shared memory with plain 16-byte loads. The `mma` wants lane
//! `l` to hold elements `2(l%4), +1, +8, +9` of a 16-wide slice, not 8 consecutive ones;
//! but a dot product does not care in which order its terms come, as long as the weights and
//! the activations agree. So the kernel renumbers the reduction inside each 32-wide step:
//! lane `l`'s 8 consecutive elements `8(l%4) .. +8` play the parts of elements `2(l%4), +1,
//! +8, +9` of two `mma` steps, and the activations are read with the same renumbering.
//! Every weight and every activation meets its partner once. Rows are 128 bytes, and odd
//! rows keep their two 64-byte halves swapped, so that the eight lanes of a load phase (two
//! rows, four 16-byte pieces each) hit distinct banks.

use crate::device::{
    WARP, block_idx_x, block_idx_y, dynamic_shared, grid_dim_y, sync_threads, thread_idx_x,
};
use crate::mma::{
    cp_async_16, cp_async_commit, cp_async_wait, ld_shared_v4, mma_bf16_16816, shared_addr,
};
use crate::tiles::{
    REDUCE_MAX_PARTS, SKINNY_FEATURES, SKINNY_KC, SKINNY_THREADS, skinny_stage_bytes,
    skinny_stages, skinny_tiles,
};

/// 16-byte pieces in a 128-byte row of a stage (64 bf16).
const PIECES: usize = SKINNY_KC / 8;

/// Where piece `p` of row `r` of a stage's tile lives: 128-byte rows, odd rows with their
/// halves swapped.
#[inline(always)]
fn at(tile: u32, r: usize, p: usize) -> u32 {
    tile + (r * 128 + 16 * (p ^ ((r & 1) << 2))) as u32
}

/// Waits until at most `pending` of this thread's copy groups are in flight (a constant in
/// each body, so the match folds away); `gemm_blocks.rs`'s too.
#[inline(always)]
pub(crate) fn wait_pending(pending: usize) {
    match pending {
        0 => cp_async_wait::<0>(),
        1 => cp_async_wait::<1>(),
        2 => cp_async_wait::<2>(),
        3 => cp_async_wait::<3>(),
        4 => cp_async_wait::<4>(),
        5 => cp_async_wait::<5>(),
        _ => cp_async_wait::<6>(),
    }
}

/// `out[t, o] = (accumulate ? out[t, o] : 0) + sum_i x[t, i] * w[o, i] + bias[o]`, bf16
/// inputs, products summed in f32 on the tensor cores. With the reduction split across
/// `gridDim.y > 1` blocks, block `s` writes its part of the sum alone, unbiased, to
/// `out[s, t, o]`, and `gemm_skinny_reduce_f32` adds the parts in order.
///
/// - `out`: `[n, n_out]` f32, or `[gridDim.y, n, n_out]` when split
/// - `x`: `[n, n_in]` bf16 (as `u16` bits): the activations, rounded by `f32_to_bf16`
/// - `w`: `[n_out, n_in]` bf16
/// - `bias`: `[n_out]` f32, or null for none (always null when split)
///
/// Thread mapping: block `(256)`: 8 warps, each owning 16 output features (the block 128),
/// all `n` tokens in `n_tiles = ceil(n / 8)` tiles of 8. The block walks its part of the
/// reduction in stages of 64: the weights' `[128][64]` and the tokens' `[8 n_tiles][64]`
/// arrive by `cp.async`, `skinny_stages(n_tiles) - 1` stages ahead of the one being used.
/// Per 32-wide step a warp loads its two weight rows' 8 elements per lane (16 bytes each) and,
/// per token tile, the tokens' (16 bytes), and runs two `mma`s. Lane `l` accumulates
/// features `16 w + l / 4` and `+ 8` for tokens `8 j + 2 (l % 4)` and `+ 1` of every tile `j`.
///
/// Each output depends on its own token's activations and the weights alone, reduced in an
/// order fixed by `n_in` and the split: a token's result is the same whatever other tokens
/// share the launch (batch-invariant).
///
/// PRECONDITIONS: `1 <= n <= 8 * SKINNY_MAX_TILES`; `n_in % 8 == 0`; `x`, `w` 16-byte
/// aligned; block `(SKINNY_THREADS)`; grid `(ceil(n_out / 128), splits)`; dynamic shared
/// memory `skinny_shared_bytes(n)`; `bias` null and `accumulate == 0` when split; `x` does
/// not overlap `out`.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn gemm_skinny_bf16(
    out: *mut f32,
    x: *const u16,
    w: *const u16,
    bias: *const f32,
    n: u32,
    n_in: u32,
    n_out: u32,
    accumulate: u32,
) {
    crate::device::wait_for_previous_kernel();
    let args = Args {
        out,
        x,
        w,
        bias,
        n: n as usize,
        n_in: n_in as usize,
        n_out: n_out as usize,
        accumulate: accumulate != 0,
    };
    // One body per token-tile count, so that each keeps its accumulators in registers.
    // SAFETY: the preconditions, passed on.
    unsafe {
        match skinny_tiles(args.n) {
            1 => body::<1, 1>(&args),
            2 => body::<1, 2>(&args),
            4 => body::<1, 4>(&args),
            8 => body::<2, 4>(&args),
            _ => body::<2, 8>(&args),
        }
    }
}

struct Args {
    out: *mut f32,
    x: *const u16,
    w: *const u16,
    bias: *const f32,
    n: usize,
    n_in: usize,
    n_out: usize,
    accumulate: bool,
}

/// A lane's accumulators for `T` tiles of 8 tokens of one 16-feature slab, 4 floats per
/// tile. The compiler keeps an array in registers only when every loop over it is unrolled,
/// which it does for up to 8 tiles (a warp with more takes two slabs of features instead).
#[derive(Clone, Copy)]
struct Tiles<const T: usize>([[f32; 4]; T]);

/// One 32-wide step's renumbered weights of a 16-feature slab: the two `mma`s' `a`
/// operands.
type Slab = ([u32; 4], [u32; 4]);

impl<const T: usize> Tiles<T> {
    fn zero() -> Self {
        Tiles([[0.0; 4]; T])
    }

    /// Both `mma`s of one 32-wide step for every tile, the activations of tile `j` read at
    /// `x_at(j)`.
    #[inline(always)]
    fn step(&mut self, (a0, a1): Slab, x_at: impl Fn(usize) -> u32) {
        for (j, acc) in self.0.iter_mut().enumerate() {
            // SAFETY: the caller's addresses are inside its shared buffer, 16-byte aligned,
            // and published by a barrier.
            let xv = unsafe { ld_shared_v4(x_at(j)) };
            mma_bf16_16816(acc, a0, [xv[0], xv[1]]);
            mma_bf16_16816(acc, a1, [xv[2], xv[3]]);
        }
    }

    /// As `step` for two slabs of features, `self` and `other`, each tile's activations
    /// loaded once for both: half the shared-memory reads of two `step`s.
    #[inline(always)]
    fn step_pair(
        &mut self,
        other: &mut Self,
        (a0, a1): Slab,
        (b0, b1): Slab,
        x_at: impl Fn(usize) -> u32,
    ) {
        for (j, (acc, acc2)) in self.0.iter_mut().zip(other.0.iter_mut()).enumerate() {
            // SAFETY: as in `step`.
            let xv = unsafe { ld_shared_v4(x_at(j)) };
            mma_bf16_16816(acc, a0, [xv[0], xv[1]]);
            mma_bf16_16816(acc, a1, [xv[2], xv[3]]);
            mma_bf16_16816(acc2, b0, [xv[0], xv[1]]);
            mma_bf16_16816(acc2, b1, [xv[2], xv[3]]);
        }
    }
}

/// The kernel for `8 * M * T` tokens at most, each warp owning `16 M` features and `T` tiles
/// of tokens: `M = 1` (8 warps side by side along the features, every token) for few tokens,
/// `M = 2` (4 along the features times 2 along the tokens) for many, where each tile of
/// activations loaded from shared memory then feeds four `mma`s instead of two. Tiles past
/// `n` hold zeros and are not stored.
///
/// # Safety
/// `gemm_skinny_bf16`'s preconditions, and `n <= 8 * M * T`.
#[inline(always)]
unsafe fn body<const M: usize, const T: usize>(a: &Args) {
    let tid = thread_idx_x();
    let (lane, warp) = (tid % WARP, tid / WARP);
    let (g, q) = (lane / 4, lane % 4);
    let tiles = M * T; // the whole block's tiles of tokens
    let rows = tiles * 8;
    let stages = skinny_stages(tiles);
    let f_block = block_idx_x() * SKINNY_FEATURES;
    // This warp's slabs of features (rows of the weights' tile) and first token tile.
    let (slab, t0) = if M == 1 {
        (warp * 16, 0)
    } else {
        ((warp % 4) * 32, (warp / 4) * T)
    };

    // This block's stages of the reduction.
    let chunks = a.n_in.div_ceil(SKINNY_KC);
    let per_split = chunks.div_ceil(grid_dim_y());
    let first = (block_idx_y() * per_split).min(chunks);
    let count = per_split.min(chunks - first);

    // Shared: `stages` buffers, each the weights' `[128][64]` then the tokens' `[rows][64]`.
    let smem = shared_addr(dynamic_shared::<u16>());
    let w_tile = |b: usize| smem + (b * skinny_stage_bytes(tiles)) as u32;
    let x_tile = |b: usize| w_tile(b) + (SKINNY_FEATURES * 128) as u32;

    // Requests stage `i` of this block's share into buffer `i % stages`: thread `tid` takes
    // pieces `tid`, `tid + 256`, ... of the weights, then of the tokens; features past
    // `n_out`, tokens past `n` and columns past `n_in` are zero-filled.
    let request = |i: usize| {
        let (b, k0) = (i % stages, (first + i) * SKINNY_KC);
        let mut e = tid;
        while e < SKINNY_FEATURES * PIECES {
            let (r, p) = (e / PIECES, e % PIECES);
            let (f, k) = (f_block + r, k0 + 8 * p);
            let valid = f < a.n_out && k < a.n_in;
            let src = if valid {
                a.w.wrapping_add(f * a.n_in + k)
            } else {
                a.w
            };
            // SAFETY: inside buffer b; src, when valid, 8 weights of row f at a multiple of
            // 8 elements from w's aligned start.
            unsafe { cp_async_16(at(w_tile(b), r, p), src, valid) };
            e += SKINNY_THREADS;
        }
        let mut e = tid;
        while e < rows * PIECES {
            let (t, p) = (e / PIECES, e % PIECES);
            let k = k0 + 8 * p;
            let valid = t < a.n && k < a.n_in;
            let src = if valid {
                a.x.wrapping_add(t * a.n_in + k)
            } else {
                a.x
            };
            // SAFETY: as above, for token t's activations.
            unsafe { cp_async_16(at(x_tile(b), t, p), src, valid) };
            e += SKINNY_THREADS;
        }
    };

    let (mut acc, mut acc2) = (Tiles::<T>::zero(), Tiles::<T>::zero());
    // Stages 0 .. stages - 2 in flight before the first is used. Every thread commits one
    // group per stage, empty past the end, so that "all but the newest stages - 2 groups
    // have landed" always means "this stage has".
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
        let b = i % stages;
        let (w_rows, x_rows) = (w_tile(b), x_tile(b));
        // The two 32-wide steps (constant pieces: the operands stay in registers).
        for s in 0..2 {
            let p = 4 * s + q;
            // The renumbered weights of a 16-feature slab: this lane's 8 consecutive
            // elements of rows g and g + 8 are elements (2q, 2q+1), (2q+8, 2q+9) of the first
            // mma step (their first halves) and of the second.
            let weights = |r: usize| -> Slab {
                // SAFETY: inside buffer b, published by the barrier above.
                let (lo, hi) = unsafe {
                    (
                        ld_shared_v4(at(w_rows, r + g, p)),
                        ld_shared_v4(at(w_rows, r + g + 8, p)),
                    )
                };
                ([lo[0], hi[0], lo[1], hi[1]], [lo[2], hi[2], lo[3], hi[3]])
            };
            let x_at = |j: usize| at(x_rows, 8 * (t0 + j) + g, p);
            if M == 1 {
                acc.step(weights(slab), x_at);
            } else {
                acc.step_pair(&mut acc2, weights(slab), weights(slab + 16), x_at);
            }
        }
    }
    cp_async_wait::<0>();

    // acc[j] holds features f (elements 0, 1) and f + 8 (2, 3) of tokens 8(t0 + j) + 2q, +1.
    let split = grid_dim_y() > 1;
    let dst = if split {
        a.out.wrapping_add(block_idx_y() * a.n * a.n_out)
    } else {
        a.out
    };
    let store = |f0: usize| Store {
        dst,
        n: a.n,
        n_out: a.n_out,
        out_stride: a.n_out,
        split,
        accumulate: a.accumulate,
        bias: a.bias,
        f0,
        q,
    };
    let slabs = [(acc, slab), (acc2, slab + 16)];
    for &(tiles, slab) in &slabs[..M] {
        let st = store(f_block + slab + g);
        for (j, &tile_acc) in tiles.0.iter().enumerate() {
            // SAFETY: `st`'s fields describe this launch's output (preconditions).
            unsafe { st.tile(t0 + j, tile_acc) };
        }
    }
}

/// Where a lane's accumulators go (passed by value: a reference would need an address in
/// local memory); `gemm_blocks.rs`'s too.
#[derive(Clone, Copy)]
pub(crate) struct Store {
    pub dst: *mut f32,
    pub n: usize,
    pub n_out: usize,
    /// Floats from one token's outputs to the next's (`n_out`, or more where the matrix is
    /// some of a wider output's columns).
    pub out_stride: usize,
    pub split: bool,
    pub accumulate: bool,
    pub bias: *const f32,
    pub f0: usize,
    pub q: usize,
}

impl Store {
    /// Stores tile `j`: features `f0` (elements 0, 1) and `f0 + 8` (2, 3) of tokens
    /// `8j + 2q` and `+ 1`. Kept out of line: the unrolled loops that call it stay small
    /// enough for the compiler to unroll, which keeps the accumulators in registers.
    ///
    /// # Safety
    /// `dst` holds `[n, out_stride]` floats (`out_stride >= n_out`); `bias` null or
    /// `[n_out]`.
    #[inline(never)]
    pub unsafe fn tile(self, j: usize, acc: [f32; 4]) {
        for (e, &v) in acc.iter().enumerate() {
            let (t, f) = (8 * j + 2 * self.q + e % 2, self.f0 + 8 * (e / 2));
            if t < self.n && f < self.n_out {
                // SAFETY: t < n, f < n_out: inside dst.
                unsafe {
                    let o = self.dst.add(t * self.out_stride + f);
                    if self.split {
                        *o = v;
                    } else {
                        let prev = if self.accumulate { *o } else { 0.0 };
                        let b = if self.bias.is_null() {
                            0.0
                        } else {
                            *self.bias.add(f)
                        };
                        *o = prev + v + b;
                    }
                }
            }
        }
    }
}

/// The split reduction's second half: `out[i] = (accumulate ? out[i] : 0) + (sum over s in
/// order of parts[s, i]) + bias[i % n_out]`.
///
/// - `out`: `[len]` f32 (`len = n * n_out`)
/// - `parts`: `[splits, len]` f32, as `gemm_skinny_bf16` wrote them
/// - `bias`: `[n_out]` f32 or null
///
/// Thread mapping: one thread per output element, in blocks of 256. A thread issues all of
/// its loads before its first add: each waits a memory latency, and a loop that added as it
/// loaded waited one per part (a 32-sequence step's reduces went from 929 to 844 us on the
/// H200: docs/lessons.md#batched-decode-and-the-gemm).
///
/// PRECONDITIONS: `parts` does not overlap `out`; `1 <= splits <= REDUCE_MAX_PARTS`.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn gemm_skinny_reduce_f32(
    out: *mut f32,
    parts: *const f32,
    bias: *const f32,
    len: u32,
    n_out: u32,
    splits: u32,
    accumulate: u32,
) {
    crate::device::wait_for_previous_kernel();
    let (len, n_out) = (len as usize, n_out as usize);
    let i = crate::device::global_idx_x();
    if i >= len {
        return;
    }
    let splits = splits as usize;
    // SAFETY: i < len; parts holds splits * len floats; bias, when present, n_out.
    unsafe {
        let mut part = [0.0f32; REDUCE_MAX_PARTS];
        for s in 0..REDUCE_MAX_PARTS {
            if s < splits {
                part[s] = *parts.add(s * len + i);
            }
        }
        let prev = if accumulate != 0 { *out.add(i) } else { 0.0 };
        let b = if bias.is_null() {
            0.0
        } else {
            *bias.add(i % n_out)
        };
        // In order, from zero: the same sum as one part at a time.
        let mut sum = 0.0f32;
        for s in 0..REDUCE_MAX_PARTS {
            if s < splits {
                sum += part[s];
            }
        }
        *out.add(i) = prev + sum + b;
    }
}
