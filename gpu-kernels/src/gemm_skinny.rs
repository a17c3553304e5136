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
//! Weights go straight from global memory into registers, as in the GEMV: each lane loads 16
//! bytes (8 consecutive weights of a row) per instruction, a whole 128-deep chunk ahead of
//! its use. The `mma` wants lane `l` to hold elements `2(l%4), +1, +8, +9` of a 16-wide
//! slice, not 8 consecutive ones; but a dot product does not care in which order its terms
//! come, as long as the weights and the activations agree. So the kernel renumbers the
//! reduction inside each 32-wide step: lane `l`'s 8 consecutive elements `8(l%4) .. +8` play
//! the parts of elements `2(l%4), +1, +8, +9` of two `mma` steps, and the activations are read
//! with the same renumbering. Every weight and every activation meets its partner once.

use crate::device::{WARP, block_idx_x, block_idx_y, dynamic_shared, grid_dim_y, ld_nc_v4, sync_threads, thread_idx_x};
use crate::mma::{cp_async_16, cp_async_commit, cp_async_wait, ld_shared_v4, mma_bf16_16816, shared_addr};
use crate::tiles::{SKINNY_FEATURES, SKINNY_KC, SKINNY_STRIDE, SKINNY_THREADS, skinny_tiles};

/// 32-wide steps of the reduction in one chunk (spelled out as four calls in `body`).
const STEPS: usize = SKINNY_KC / 32;
const _: () = assert!(STEPS == 4);

/// One 32-wide step for every token tile: `w` holds this lane's 8 consecutive weights of its
/// two rows. Renumbered operands: they are elements (2q, 2q+1), (2q+8, 2q+9) of the first
/// `mma` step (the first half of each row's 8) and the same of the second.
#[inline(always)]
fn step<A: Accumulators>(acc: &mut A, w: [[u32; 4]; 2], x_at: impl Fn(usize) -> u32) {
    let (lo, hi) = (w[0], w[1]);
    acc.step([lo[0], hi[0], lo[1], hi[1]], [lo[2], hi[2], lo[3], hi[3]], x_at);
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
/// reduction in chunks of 128: the chunk of `x` (`[8 n_tiles][128]` bf16) arrives in shared
/// memory by `cp.async` into one of two buffers while the other is used; each lane loads its
/// two weight rows' 128-deep chunk (8 x 16 bytes) one chunk ahead, into registers. Then per
/// 32-wide step and token tile, one 16-byte shared load of activations and two `mma`s.
/// Lane `l` accumulates features `16 w + l / 4` and `+ 8` for tokens `8 j + 2 (l % 4)` and
/// `+ 1` of every tile `j`.
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
    let args = Args { out, x, w, bias, n: n as usize, n_in: n_in as usize, n_out: n_out as usize, accumulate: accumulate != 0 };
    // One body per token-tile count, so that each keeps its accumulators in registers.
    // SAFETY: the preconditions, passed on.
    unsafe {
        match skinny_tiles(args.n) {
            1 => body::<Tiles<1>>(&args),
            2 => body::<Tiles<2>>(&args),
            4 => body::<Tiles<4>>(&args),
            8 => body::<Tiles<8>>(&args),
            _ => body::<(Tiles<8>, Tiles<8>)>(&args),
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

/// A lane's accumulators for some tiles of 8 tokens, 4 floats per tile. The compiler keeps
/// an array in registers only when every loop over it is unrolled, which it does for up to 8
/// tiles: 16 tiles are two arrays of 8, each with its own unrolled loop.
trait Accumulators: Copy {
    const TILES: usize;
    fn zero() -> Self;
    /// Both `mma`s of one 32-wide step for every tile, the activations of tile `j` read at
    /// `x_at(j)`.
    fn step(&mut self, a0: [u32; 4], a1: [u32; 4], x_at: impl Fn(usize) -> u32);
    /// Tile `j`'s four accumulators, for every tile.
    fn each(&self, f: impl FnMut(usize, [f32; 4]));
}

#[derive(Clone, Copy)]
struct Tiles<const T: usize>([[f32; 4]; T]);

impl<const T: usize> Accumulators for Tiles<T> {
    const TILES: usize = T;
    fn zero() -> Self {
        Tiles([[0.0; 4]; T])
    }
    #[inline(always)]
    fn step(&mut self, a0: [u32; 4], a1: [u32; 4], x_at: impl Fn(usize) -> u32) {
        for (j, acc) in self.0.iter_mut().enumerate() {
            // SAFETY: the caller's addresses are inside its shared buffer, 16-byte aligned,
            // and published by a barrier.
            let xv = unsafe { ld_shared_v4(x_at(j)) };
            mma_bf16_16816(acc, a0, [xv[0], xv[1]]);
            mma_bf16_16816(acc, a1, [xv[2], xv[3]]);
        }
    }
    #[inline(always)]
    fn each(&self, mut f: impl FnMut(usize, [f32; 4])) {
        for (j, &acc) in self.0.iter().enumerate() {
            f(j, acc);
        }
    }
}

impl Accumulators for (Tiles<8>, Tiles<8>) {
    const TILES: usize = 16;
    fn zero() -> Self {
        (Tiles::zero(), Tiles::zero())
    }
    #[inline(always)]
    fn step(&mut self, a0: [u32; 4], a1: [u32; 4], x_at: impl Fn(usize) -> u32) {
        self.0.step(a0, a1, &x_at);
        self.1.step(a0, a1, |j| x_at(j + 8));
    }
    #[inline(always)]
    fn each(&self, mut f: impl FnMut(usize, [f32; 4])) {
        self.0.each(&mut f);
        self.1.each(|j, acc| f(j + 8, acc));
    }
}

/// The kernel for up to `8 * A::TILES` tokens (tiles past `n` hold zeros and are not
/// stored).
///
/// # Safety
/// `gemm_skinny_bf16`'s preconditions, and `n <= 8 * A::TILES`.
#[inline(always)]
unsafe fn body<A: Accumulators>(a: &Args) {
    let tid = thread_idx_x();
    let (lane, warp) = (tid % WARP, tid / WARP);
    let (g, q) = (lane / 4, lane % 4);
    let rows = A::TILES * 8;
    // This warp's two weight rows (features), clamped so that a row past `n_out` reads a
    // valid row; its results are not stored.
    let f0 = block_idx_x() * SKINNY_FEATURES + warp * 16 + g;
    let (r0, r1) = (f0.min(a.n_out - 1), (f0 + 8).min(a.n_out - 1));

    // This block's chunks of the reduction.
    let chunks = a.n_in.div_ceil(SKINNY_KC);
    let per_split = chunks.div_ceil(grid_dim_y());
    let first = (block_idx_y() * per_split).min(chunks);
    let last = (first + per_split).min(chunks);

    // Shared: two buffers of `[rows][SKINNY_STRIDE]` bf16, the chunk of x.
    let smem = shared_addr(dynamic_shared::<u16>());
    let buffer = |b: usize| smem + (b * rows * SKINNY_STRIDE * 2) as u32;

    // Requests chunk `c` of x into buffer `b`: 16 chunks of 16 bytes per token row, thread
    // `tid` taking `tid`, `tid + 256`, ...; rows past `n` and columns past `n_in` zero-filled.
    let stage = |c: usize, b: usize| {
        let mut i = tid;
        while i < rows * (SKINNY_KC / 8) {
            let (t, k) = (i / (SKINNY_KC / 8), c * SKINNY_KC + 8 * (i % (SKINNY_KC / 8)));
            let valid = t < a.n && k < a.n_in;
            let src = if valid { a.x.wrapping_add(t * a.n_in + k) } else { a.x };
            let dst = buffer(b) + ((t * SKINNY_STRIDE + 8 * (i % (SKINNY_KC / 8))) * 2) as u32;
            // SAFETY: dst inside buffer b (rows x SKINNY_STRIDE); src, when valid, 8 values
            // inside x at a multiple of 8 elements from its aligned start.
            unsafe { cp_async_16(dst, src, valid) };
            i += SKINNY_THREADS;
        }
        cp_async_commit();
    };

    // Loads this lane's weights of chunk `c`: for each 32-wide step, 8 consecutive weights
    // of each of its two rows. Past `n_in`, zeros.
    let load_w = |c: usize| -> [[[u32; 4]; 2]; STEPS] {
        let step = |s: usize| -> [[u32; 4]; 2] {
            let k = c * SKINNY_KC + 32 * s + 8 * q;
            if k >= a.n_in {
                return [[0; 4]; 2];
            }
            // SAFETY: rows r0, r1 < n_out; k + 8 <= n_in (n_in % 8 == 0); w aligned.
            unsafe {
                [
                    ld_nc_v4(a.w.add(r0 * a.n_in + k) as *const u32),
                    ld_nc_v4(a.w.add(r1 * a.n_in + k) as *const u32),
                ]
            }
        };
        [step(0), step(1), step(2), step(3)]
    };

    let mut acc = A::zero();
    if first < last {
        stage(first, 0);
        let mut cur = load_w(first);
        for c in first..last {
            let b = (c - first) % 2;
            let more = c + 1 < last;
            // The next chunk's activations and weights are requested before this one's are
            // used: one chunk of each always in flight.
            if more {
                stage(c + 1, 1 - b);
            }
            let next = if more { load_w(c + 1) } else { cur };
            if more {
                cp_async_wait::<1>();
            } else {
                cp_async_wait::<0>();
            }
            // SAFETY: every thread reaches both barriers (the loop bounds are block-uniform).
            unsafe { sync_threads() };
            // The four 32-wide steps spelled out, so that `cur` is indexed by constants and
            // stays in registers (a loop the compiler did not unroll would put it in local
            // memory).
            let x_at = |s: usize| move |j: usize| buffer(b) + (((8 * j + g) * SKINNY_STRIDE + 32 * s + 8 * q) * 2) as u32;
            step(&mut acc, cur[0], x_at(0));
            step(&mut acc, cur[1], x_at(1));
            step(&mut acc, cur[2], x_at(2));
            step(&mut acc, cur[3], x_at(3));
            // Nobody refills this buffer (two chunks on) before every warp is done with it.
            // SAFETY: as above.
            unsafe { sync_threads() };
            cur = next;
        }
    }

    // acc[j] holds features f0 (elements 0, 1) and f0 + 8 (2, 3) of tokens 8j + 2q, +1.
    let split = grid_dim_y() > 1;
    let dst = if split { a.out.wrapping_add(block_idx_y() * a.n * a.n_out) } else { a.out };
    let store = Store { dst, n: a.n, n_out: a.n_out, split, accumulate: a.accumulate, bias: a.bias, f0, q };
    // SAFETY: `store`'s fields describe this launch's output (preconditions).
    acc.each(|j, tile_acc| unsafe { store.tile(j, tile_acc) });
}

/// Where a lane's accumulators go (passed by value: a reference would need an address in
/// local memory).
#[derive(Clone, Copy)]
struct Store {
    dst: *mut f32,
    n: usize,
    n_out: usize,
    split: bool,
    accumulate: bool,
    bias: *const f32,
    f0: usize,
    q: usize,
}

impl Store {
    /// Stores tile `j`: features `f0` (elements 0, 1) and `f0 + 8` (2, 3) of tokens
    /// `8j + 2q` and `+ 1`. Kept out of line: the unrolled loops that call it stay small
    /// enough for the compiler to unroll, which keeps the accumulators in registers.
    ///
    /// # Safety
    /// `dst` holds `[n, n_out]` floats; `bias` null or `[n_out]`.
    #[inline(never)]
    unsafe fn tile(self, j: usize, acc: [f32; 4]) {
        for (e, &v) in acc.iter().enumerate() {
            let (t, f) = (8 * j + 2 * self.q + e % 2, self.f0 + 8 * (e / 2));
            if t < self.n && f < self.n_out {
                // SAFETY: t < n, f < n_out: inside dst.
                unsafe {
                    let o = self.dst.add(t * self.n_out + f);
                    if self.split {
                        *o = v;
                    } else {
                        let prev = if self.accumulate { *o } else { 0.0 };
                        let b = if self.bias.is_null() { 0.0 } else { *self.bias.add(f) };
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
/// Thread mapping: one thread per output element, in blocks of 256.
///
/// PRECONDITIONS: `parts` does not overlap `out`.
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
    // SAFETY: i < len; parts holds splits * len floats; bias, when present, n_out.
    unsafe {
        let mut sum = 0.0f32;
        for s in 0..splits as usize {
            sum += *parts.add(s * len + i);
        }
        let prev = if accumulate != 0 { *out.add(i) } else { 0.0 };
        let b = if bias.is_null() { 0.0 } else { *bias.add(i % n_out) };
        *out.add(i) = prev + sum + b;
    }
}
