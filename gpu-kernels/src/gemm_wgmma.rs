//! GEMM on Hopper's warpgroup tensor cores: the prefill matmuls near cuBLAS's speed (0.87 to
//! 0.93 of it on a 2048-token prompt of Llama 3 8B on the H200;
//! docs/lessons.md#prefill-on-tensor-cores).
//!
//! `gemm_mma_bf16` is the Ampere shape: every warp loads its operands from shared memory into
//! registers (`ldmatrix`) and multiplies them (`mma.sync`), and those loads compete with the
//! products for the warp's issue slots. Here each warpgroup (4 warps) names its operand
//! tiles in shared memory by descriptor and the tensor cores read them themselves
//! (`wgmma.mma_async`, see `wgmma.rs`): one instruction per 64 x 256 x 16 product (or 224,
//! 192, 128 wide), issued without waiting.
//!
//! The multiplying warps copy nothing: one thread of a ninth warp, the producer, fills the
//! stages ahead of them, each tile by one copy of the Tensor Memory Accelerator (tensor maps
//! made on the host, `engine/gpu/tensor_maps.rs`, lay them out in the 128-byte swizzle the
//! descriptors name). Barriers in shared memory say when a stage is full and when both
//! warpgroups are done with it.

//! `gemm_wgmma_fp8` is the same kernel on e4m3 bytes (`--weights fp8`): a step's 128 bytes
//! of a row are 128 values instead of 64, each product takes 32 of them instead of 16, and
//! the tensor cores multiply fp8 at twice the bf16 rate. Only the instruction and the
//! epilogue, which applies the two scales, differ.

use crate::bulk_copy::{
    arrive, barrier_init, expect_bytes, fence_barrier_init, tensor_copy_2d, wait_phase,
};
use crate::device::{
    block_idx_x, block_idx_y, block_idx_z, dynamic_shared, grid_dim_z, sync_threads, thread_idx_x,
};
use crate::mma::shared_addr;
use crate::tiles::{WGMMA_BK, WGMMA_BM, WGMMA_MAX_BN, WGMMA_STAGES, WGMMA_THREADS};

use crate::wgmma::{self, Accumulators, descriptor_sw128};
use core::ptr::null;

/// Bytes of a row in one step: 64 bf16 (`WGMMA_BK`) or 128 e4m3, one swizzled row.
const ROW_BYTES: usize = WGMMA_BK * 2;
/// Bytes of one stage: the `[WGMMA_BM][ROW_BYTES]` tile of `x`, then room for the widest
/// `[WGMMA_MAX_BN][ROW_BYTES]` tile of `w`.
const X_BYTES: usize = WGMMA_BM * ROW_BYTES;
const STAGE_BYTES: usize = X_BYTES + WGMMA_MAX_BN * ROW_BYTES;
/// Warps that multiply: the two warpgroups (`WGMMA_THREADS`); the block's last warp copies.
const CONSUMER_WARPS: u32 = (WGMMA_THREADS / 32) as u32;

/// `out[t, o] = sum_i x[t, i] * w[o, i] + bias[o]`, bf16 inputs, products summed in f32: the
/// same contract as `gemm_mma_bf16`, on sm_90a.
///
/// - `out`: `[n, n_out]` f32; split, `[gridDim.z, n, n_out]`
/// - `x`: `[n, n_in]` bf16 (as `u16` bits): the activations, rounded by `f32_to_bf16`
/// - `w`: `[n_out, n_in]` bf16
/// - `bias`: `[n_out]` f32, or null for none
/// - `tile_n`: the width of a block's tile of output features, 128, 192, 224 or 256 (what
///   fills the GPU best for this `n_out` is the host's choice; any other value runs 256)
/// - `w_map`: a `CUtensorMap` (128 bytes, 64-byte aligned, in global memory) of `w`: bf16,
///   `n_in x n_out`, boxes of 64 x `tile_n`, 128-byte swizzle (`engine/gpu/tensor_maps.rs`)
/// - `x_map`: the same of `x`: `n_in x n`, boxes of 64 x `WGMMA_BM`
///
/// Thread mapping: block `(288)` = two warpgroups that multiply and one warp that copies,
/// for a 128-token x `tile_n`-feature tile. Warpgroup `h` owns tokens `64 h .. 64 h + 64`
/// against all of the tile's features, one `m64n{tile_n}` product per 16 of the reduction,
/// `tile_n / 2` f32 accumulators per thread. The last warp (the producer) fills
/// `WGMMA_STAGES` shared buffers, each a step of 64 along the reduction: the `tile_n x 64`
/// slice of `w` and the `128 x 64` slice of `x`, each by one copy of the Tensor Memory
/// Accelerator. Each buffer has two barriers: "full" (the step has landed) and
/// "empty" (both warpgroups' products have read it), so the producer runs as far ahead as
/// the buffers allow and the multiplying warps wait for nothing but data. Past `n`, `n_in`
/// or `n_out` the tiles hold zeros, and nothing is stored.
///
/// `gridDim.z = k > 1` splits the reduction into `k` parts: with few tokens there are few
/// tiles (a few dozen for 4096 features), and only the split fills the GPU. Block `z` then
/// stores its part's sums, without the bias, as `out[z]` of an `out` of `[k, n, n_out]`; the
/// host adds the parts in order (`gemm_skinny_reduce_f32`), so that the result does not
/// depend on which part finished first (`red.add` of more than two parts would). A
/// warpgroup whose 64 rows are all past `n` (a tile of at most 64 tokens) multiplies
/// nothing.
///
/// PRECONDITIONS: `n_in % 8 == 0`; `x` and `w` 16-byte aligned; the maps as above; block
/// `(WGMMA_GEMM_THREADS)`; grid `(ceil(n_out / tile_n), ceil(n / WGMMA_BM), splits)`;
/// `WGMMA_SHARED_BYTES` of dynamic shared memory.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn gemm_wgmma_bf16(
    out: *mut f32,
    x: *const u16,
    w: *const u16,
    bias: *const f32,
    n: u32,
    n_in: u32,
    n_out: u32,
    tile_n: u32,
    w_map: *const u8,
    x_map: *const u8,
) {
    crate::device::wait_for_previous_kernel();
    let o = Operands {
        x_map,
        x_scales: null(),
        w_map,
        w_scales: null(),
        bias,
    };
    let (n, row_bytes) = (n as usize, 2 * n_in as usize);
    // `x` and `w` are read through their maps; they stay arguments so that the kernel's
    // list is its CPU twin's.
    let _ = (x, w);
    // SAFETY: the same preconditions, passed on (no scales: bf16 products are the values).
    unsafe { by_width::<false>(tile_n, out, o, n, row_bytes, n_out) }
}

/// `out[t, o] = x_scales[t] w_scales[o] sum_i x[t, i] w[o, i] + bias[o]`, e4m3 inputs,
/// products summed by the tensor cores (in their own accumulator, which keeps fewer bits
/// than an f32 sum; the tests bound the difference): `gemm_wgmma_bf16` on e4m3 bytes, for
/// the prefill of `--weights fp8`.
///
/// - `out`: as `gemm_wgmma_bf16`'s
/// - `x`: `[n, n_in]` e4m3, one scale a token: `x_scales` `[n]` f32 (`quantize_fp8_f32`)
/// - `w`: `[n_out, n_in]` e4m3, one scale a row: `w_scales` `[n_out]` f32
/// - `bias`, `tile_n`: as `gemm_wgmma_bf16`'s
/// - `w_map`, `x_map`: as `gemm_wgmma_bf16`'s, of bytes: boxes of 128 x `tile_n` and 128 x
///   `WGMMA_BM`
///
/// Thread mapping: `gemm_wgmma_bf16`'s, with a step of 128 along the reduction (a row's
/// 128 bytes, as there) in four `k32` products. Split, each part is scaled.
///
/// PRECONDITIONS: `n_in % 16 == 0`; `x` and `w` 16-byte aligned; launch as
/// `gemm_wgmma_bf16`.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn gemm_wgmma_fp8(
    out: *mut f32,
    x: *const u8,
    x_scales: *const f32,
    w: *const u8,
    w_scales: *const f32,
    bias: *const f32,
    n: u32,
    n_in: u32,
    n_out: u32,
    tile_n: u32,
    w_map: *const u8,
    x_map: *const u8,
) {
    crate::device::wait_for_previous_kernel();
    let o = Operands {
        x_map,
        x_scales,
        w_map,
        w_scales,
        bias,
    };
    let (n, row_bytes) = (n as usize, n_in as usize);
    // Read through their maps, as in `gemm_wgmma_bf16`.
    let _ = (x, w);
    // SAFETY: the same preconditions, passed on.
    unsafe { by_width::<true>(tile_n, out, o, n, row_bytes, n_out) }
}

/// `gemm::<A, FP8>` for the accumulators of a `tile_n`-wide tile.
///
/// # Safety
/// As the kernels.
#[inline(always)]
unsafe fn by_width<const FP8: bool>(
    tile_n: u32,
    out: *mut f32,
    o: Operands,
    n: usize,
    row_bytes: usize,
    n_out: u32,
) {
    let (n_out, rb) = (n_out as usize, row_bytes);
    // SAFETY: the caller's preconditions; the accumulators' type fixes the width.
    unsafe {
        match tile_n {
            128 => gemm::<[f32; 64], FP8>(out, o, n, rb, n_out),
            192 => gemm::<[f32; 96], FP8>(out, o, n, rb, n_out),
            224 => gemm::<[f32; 112], FP8>(out, o, n, rb, n_out),
            _ => gemm::<[f32; 128], FP8>(out, o, n, rb, n_out),
        }
    }
}

/// A GEMM's inputs: the activations' and weights' tensor maps, their scales (null for
/// bf16) and the bias (null for none).
#[derive(Clone, Copy)]
struct Operands {
    x_map: *const u8,
    x_scales: *const f32,
    w_map: *const u8,
    w_scales: *const f32,
    bias: *const f32,
}

/// The shared buffers of one block: `WGMMA_STAGES` stages of a tile of `x` and one of `w`,
/// 1024-byte aligned, then each stage's "full" and "empty" barriers.
#[derive(Clone, Copy)]
struct Stages {
    base: u32,
}

impl Stages {
    fn x_tile(self, s: usize) -> u32 {
        self.base + (s * STAGE_BYTES) as u32
    }
    fn w_tile(self, s: usize) -> u32 {
        self.base + (s * STAGE_BYTES + X_BYTES) as u32
    }
    fn full(self, s: usize) -> u32 {
        self.base + (WGMMA_STAGES * STAGE_BYTES + 8 * s) as u32
    }
    fn empty(self, s: usize) -> u32 {
        self.full(WGMMA_STAGES + s)
    }
}

/// The parity of the phase of a stage's barriers that step `t` waits for: the buffers are
/// used round and round, so step `t` is the `t / WGMMA_STAGES`-th fill of its buffer.
fn fill_parity(t: usize) -> u32 {
    ((t / WGMMA_STAGES) & 1) as u32
}

/// Both kernels with tiles `A::N` features wide: bf16 or (`FP8`) e4m3 operands, rows of
/// `row_bytes` bytes.
///
/// # Safety
/// As the kernels.
#[inline(always)]
unsafe fn gemm<A: Accumulators, const FP8: bool>(
    out: *mut f32,
    o: Operands,
    n: usize,
    row_bytes: usize,
    n_out: usize,
) {
    let tid = thread_idx_x();
    let (m0, n0) = (block_idx_y() * WGMMA_BM, block_idx_x() * A::N);
    // The swizzle repeats every 1024 bytes and the hardware reads it from the address bits:
    // the buffers start on a 1024-byte boundary (the launch asks for 1 KiB to spare).
    let st = Stages {
        base: (shared_addr(dynamic_shared::<u8>()) + 1023) & !1023,
    };
    if tid == 0 {
        for s in 0..WGMMA_STAGES {
            // SAFETY: one thread initializes each barrier, before the block syncs.
            unsafe {
                barrier_init(st.full(s), 1);
                barrier_init(st.empty(s), CONSUMER_WARPS);
            }
        }
        fence_barrier_init();
    }
    // SAFETY: every thread of the block is here, once.
    unsafe { sync_threads() };

    // This block's share of the reduction, as in `gemm_mma_bf16`.
    let all_steps = row_bytes.div_ceil(ROW_BYTES);
    let per_split = all_steps.div_ceil(grid_dim_z());
    let first = (block_idx_z() * per_split).min(all_steps);
    let steps = per_split.min(all_steps - first);

    if tid >= WGMMA_THREADS {
        if tid == WGMMA_THREADS {
            // SAFETY: the kernels' preconditions; one thread.
            unsafe { produce::<A, FP8>(st, o, (m0, n0), (first, steps)) };
        }
        return;
    }
    let group = tid / 128;
    // The four products of one step: along k, 32 bytes (16 bf16 or 32 e4m3) into the
    // swizzled rows at a time; this warpgroup's 64 rows of x start 64 rows (8 KiB) into the
    // tile. Four calls with constant offsets, not a loop: a loop the compiler keeps rolled
    // would index the accumulators, through memory.
    let multiply = |s: usize, acc: &mut A| {
        let x_rows = st.x_tile(s) + (group * 64 * ROW_BYTES) as u32;
        let product = |k_bytes: u32, acc: &mut A| {
            let a = descriptor_sw128(x_rows + k_bytes);
            let b = descriptor_sw128(st.w_tile(s) + k_bytes);
            // SAFETY: the whole warpgroup is here, the descriptors name 1024-byte-aligned
            // swizzled tiles in this block's shared memory, and `fence` came first.
            unsafe {
                match FP8 {
                    true => acc.mma_e4m3(a, b),
                    false => acc.mma_bf16(a, b),
                }
            };
        };
        product(0, acc);
        product(32, acc);
        product(64, acc);
        product(96, acc);
    };

    // Uniform across the warpgroup, as `wgmma` needs: all its rows are zeros past `n`.
    let has_rows = m0 + 64 * group < n;
    let mut acc = A::zeros();
    for t in 0..steps {
        let s = t % WGMMA_STAGES;
        // SAFETY: an initialized barrier; the producer fills step t into buffer s.
        unsafe { wait_phase(st.full(s), fill_parity(t)) };
        if has_rows {
            // The accumulators are ready for the products (zeroed, on the first step).
            wgmma::fence();
            multiply(s, &mut acc);
            wgmma::commit_group();
        }
        // All but the newest batch of products are done: step t - 1's buffer is free.
        wgmma::wait_group::<1>();
        if t > 0 && tid.is_multiple_of(32) {
            // SAFETY: an initialized barrier, one arrival per warp a step.
            unsafe { arrive(st.empty((t - 1) % WGMMA_STAGES)) };
        }
    }
    wgmma::wait_group::<0>();
    acc.pin();
    // SAFETY: the kernels' preconditions.
    unsafe { store::<A, FP8>(&acc, out, o, (m0 + 64 * group, n0), n, n_out) };
}

/// The producer: for each of the block's `steps` steps (from step `first` of the
/// reduction), waits until both warpgroups are done with the step's buffer, then arms its
/// full barrier with the step's bytes and asks the Tensor Memory Accelerator for the tile of
/// `w` and the tile of `x` (zeros past `n`, `n_out` and `n_in`), which count them off as they
/// land. The barrier's one arrival is the arming: the step is full when its bytes are in.
///
/// # Safety
/// As the kernels; one thread calls it.
#[inline(always)]
unsafe fn produce<A: Accumulators, const FP8: bool>(
    st: Stages,
    o: Operands,
    (m0, n0): (usize, usize),
    (first, steps): (usize, usize),
) {
    // bytes of the two boxes each step: their full size, zeros past the matrices included
    let bytes = ((A::N + WGMMA_BM) * ROW_BYTES) as u32;
    for t in 0..steps {
        let s = t % WGMMA_STAGES;
        let k0 = (first + t) * ROW_BYTES;
        // The maps' elements are 2 bytes (bf16) or 1 (e4m3); ROW_BYTES a step either way,
        // so the column in elements is the byte offset over the element size.
        let column = match FP8 {
            true => k0,
            false => k0 / 2,
        } as u32;
        // SAFETY: initialized barriers; a fresh barrier's phase "before the first" (the
        // opposite parity) counts as complete, so the first round passes at once. The maps
        // as the kernels require; buffer s is free (the wait) and 1024-byte aligned; the
        // barrier is armed with both boxes' bytes before either copy.
        unsafe {
            wait_phase(st.empty(s), fill_parity(t) ^ 1);
            expect_bytes(st.full(s), bytes);
            tensor_copy_2d(st.w_tile(s), o.w_map, column, n0 as u32, st.full(s));
            tensor_copy_2d(st.x_tile(s), o.x_map, column, m0 as u32, st.full(s));
        }
    }
}

/// Stores a warpgroup's accumulators: its 64 rows from `row_base`, the tile's columns from
/// `n0`, scaled (fp8) and biased (unsplit) as the kernels say.
///
/// # Safety
/// As the kernels.
#[inline(always)]
unsafe fn store<A: Accumulators, const FP8: bool>(
    acc: &A,
    out: *mut f32,
    o: Operands,
    (row_base, n0): (usize, usize),
    n: usize,
    n_out: usize,
) {
    let Operands {
        x_scales,
        w_scales,
        bias,
        ..
    } = o;
    // Thread t of the warpgroup holds rows 16 (t / 32) + g (+ 8), columns 8 j + c (+ 1).
    let lane = thread_idx_x() % 128;
    let row0 = row_base + 16 * (lane / 32) + lane % 32 / 4;
    let col0 = n0 + 2 * (lane % 4);
    // Split, this block's part of the output: `out[z]`, no bias.
    let split = grid_dim_z() > 1;
    let add_bias = !bias.is_null() && !split;
    // SAFETY: `out` holds gridDim.z parts of n * n_out when split.
    let out = unsafe { out.add(block_idx_z() * n * n_out) };
    // Two neighbouring columns at a time: one 8-byte store where both are inside and the
    // row's start keeps them 8-byte aligned (an even n_out).
    let pairs = n_out.is_multiple_of(2);
    let store = |row: usize, col: usize, [a, b]: [f32; 2]| {
        if row >= n || col >= n_out {
            return;
        }
        // SAFETY: in bounds by the guards; bias, when present, holds n_out floats, and the
        // scales, with fp8, n and n_out; the 8-byte store is aligned (out is, n_out and col
        // are even).
        unsafe {
            let both = col + 1 < n_out;
            let (a, b) = match FP8 {
                true => {
                    let xs = *x_scales.add(row);
                    let b_scale = if both { *w_scales.add(col + 1) } else { 0.0 };
                    (a * (xs * *w_scales.add(col)), b * (xs * b_scale))
                }
                false => (a, b),
            };
            let (a, b) = match add_bias {
                true => (
                    a + *bias.add(col),
                    if both { b + *bias.add(col + 1) } else { b },
                ),
                false => (a, b),
            };
            let at = out.add(row * n_out + col);
            if both && pairs {
                *(at as *mut Pair) = Pair([a, b]);
            } else {
                *at = a;
                if both {
                    *at.add(1) = b;
                }
            }
        }
    };
    acc.for_each_block(|j, [a, b, c, d]| {
        let col = col0 + 8 * j;
        store(row0, col, [a, b]);
        store(row0 + 8, col, [c, d]);
    });
}

/// Two floats the compiler may store as one 8-byte `st.global.v2.f32`.
#[repr(C, align(8))]
struct Pair([f32; 2]);
