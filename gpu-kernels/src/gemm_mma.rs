//! GEMM on tensor cores with `mma.sync`: the prompt's matmuls on Ampere and Ada (Hopper runs
//! `gemm_wgmma_bf16`, which builds on this one).
//!
//! The SIMT `gemm_step1_simt_bf16` does one multiply-add per thread per instruction; here one warp-wide
//! `mma` instruction does 16 x 8 x 16 = 2048 of them. The kernel is the classic Ampere
//! shape: a block tile of the output, staged through shared memory in steps along the
//! reduction by asynchronous copies (`cp.async`, global to shared without passing through
//! registers), several steps in flight while the tensor cores work on the oldest, and
//! `ldmatrix` to bring tiles into the registers `mma` wants.

use crate::device::{
    WARP, block_idx_x, block_idx_y, block_idx_z, dynamic_shared, grid_dim_z, sync_threads,
    thread_idx_x,
};
use crate::mma::{
    cp_async_16, cp_async_commit, cp_async_wait, ldmatrix_x4, mma_bf16_16816, red_add_f32,
    shared_addr,
};
use crate::tiles::{MMA_BK, MMA_BM, MMA_BN, MMA_STAGES, MMA_STRIDE, MMA_THREADS};

const BK: usize = MMA_BK;
const STAGES: usize = MMA_STAGES;
/// Row length of a shared tile in bf16: 32 values and 8 of padding, 80 bytes. `ldmatrix`
/// reads 16 bytes from each of 8 rows at once; at 80 bytes apart those 8 land in 8
/// different 16-byte bank groups (at 64 bytes apart, four would collide).
const STRIDE: usize = MMA_STRIDE;
/// One operand tile in shared memory, in bytes: `[128][STRIDE]` bf16.
const TILE_BYTES: usize = MMA_BM * STRIDE * 2;
/// 16-byte chunks (8 values) along one row of a step.
const CHUNKS: usize = BK / 8;

/// `out[t, o] = sum_i x[t, i] * w[o, i] + bias[o]`, bf16 inputs, products summed in f32.
///
/// - `out`: `[n, n_out]` f32
/// - `x`: `[n, n_in]` bf16 (as `u16` bits): the activations, rounded by `f32_to_bf16`
/// - `w`: `[n_out, n_in]` bf16
/// - `bias`: `[n_out]` f32, or null for none
///
/// Thread mapping: block `(256)` computes a 128-token x 128-feature tile; warp `w` owns the
/// 64 x 32 sub-tile at tokens `64 (w % 2)`, features `32 (w / 2)`: 4 x 4 `mma` tiles of
/// 16 x 8, 64 f32 accumulators per lane. Each step of 32 along the reduction copies a
/// `128 x 32` slice of `x` and of `w` into one of four shared buffers; step `t + 3` is
/// requested as step `t` is computed. `w`'s rows are the columns of the product, so both
/// operands sit in shared memory as `[row][k]` and both go through the same non-transposing
/// `ldmatrix`. Past `n`, `n_in` or `n_out` the tiles hold zeros, and nothing is stored.
///
/// A launch with so few tiles that twice as many blocks still run at once (a short prompt
/// through a narrow matrix; the host's `gemm_plan::mma`) splits the reduction in two: `gridDim.z == 2`, each block summing half of the
/// steps and adding its result (and block 0 the bias) into an output the host has zeroed.
///
/// PRECONDITIONS: `n_in % 8 == 0`; `x` and `w` 16-byte aligned; block `(256)`; grid
/// `(ceil(n_out / 128), ceil(n / 128), 1 or 2)`, and `out` zeroed when 2;
/// `MMA_SHARED_BYTES` (81920) of dynamic shared memory.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn gemm_mma_bf16(
    out: *mut f32,
    x: *const u16,
    w: *const u16,
    bias: *const f32,
    n: u32,
    n_in: u32,
    n_out: u32,
) {
    crate::device::wait_for_previous_kernel();
    let (n, n_in, n_out) = (n as usize, n_in as usize, n_out as usize);
    let tid = thread_idx_x();
    let (lane, warp) = (tid % WARP, tid / WARP);
    let (warp_m, warp_n) = (64 * (warp % 2), 32 * (warp / 2));
    let (m0, n0) = (block_idx_y() * MMA_BM, block_idx_x() * MMA_BN);
    // Buffer s: x's tile, then w's.
    let smem = shared_addr(dynamic_shared::<u16>());
    let x_tile = |s: usize| smem + (2 * s * TILE_BYTES) as u32;
    let w_tile = |s: usize| smem + ((2 * s + 1) * TILE_BYTES) as u32;
    let at = |tile: u32, row: usize, k: usize| tile + ((row * STRIDE + k) * 2) as u32;

    // This block's share of the reduction: steps `first..first + steps` of `BK` each (all
    // of them unless the reduction is split across `gridDim.z` blocks).
    let all_steps = n_in.div_ceil(BK);
    let per_split = all_steps.div_ceil(grid_dim_z());
    let first = (block_idx_z() * per_split).min(all_steps);
    let steps = per_split.min(all_steps - first);

    // Requests step `t` (of this block's) into buffer `s`: each thread copies chunks `tid`, `tid + 256`, ... of
    // each operand's 128-row tile, neighbouring threads covering a row's consecutive bytes.
    let request = |s: usize, t: usize| {
        let k0 = (first + t) * BK;
        for j in 0..MMA_BM * CHUNKS / MMA_THREADS {
            let c = tid + MMA_THREADS * j;
            let (row, k) = (c / CHUNKS, (c % CHUNKS) * 8);
            let in_k = k0 + k < n_in;
            let (x_ok, w_ok) = (in_k && m0 + row < n, in_k && n0 + row < n_out);
            // SAFETY: a source is read only when valid: inside its matrix, and 16-byte
            // aligned (the base is, and n_in % 8 == 0); otherwise the base is named and
            // the 16 bytes are zero-filled. Destinations are inside buffer s.
            unsafe {
                let xs = if x_ok {
                    x.add((m0 + row) * n_in + k0 + k)
                } else {
                    x
                };
                cp_async_16(at(x_tile(s), row, k), xs, x_ok);
                let ws = if w_ok {
                    w.add((n0 + row) * n_in + k0 + k)
                } else {
                    w
                };
                cp_async_16(at(w_tile(s), row, k), ws, w_ok);
            }
        }
    };

    // acc[i][j]: the 16 x 8 tile at tokens warp_m + 16 i, features warp_n + 8 j.
    let mut acc = [[[0.0f32; 4]; 4]; 4];
    let compute = |s: usize, acc: &mut [[[f32; 4]; 4]; 4]| {
        for kk in (0..BK).step_by(16) {
            // The lane's row for each ldmatrix.x4 (see mma.rs for what comes back). x:
            // matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows
            // 8-15, k 8-15) = the four registers of an `a` operand.
            let mut a = [[0u32; 4]; 4];
            for (i, a) in a.iter_mut().enumerate() {
                let row = warp_m + 16 * i + lane % 8 + 8 * (lane / 8 % 2);
                // SAFETY: row < 128, k + 8 <= BK; all lanes take part.
                *a = unsafe { ldmatrix_x4(at(x_tile(s), row, kk + 8 * (lane / 16))) };
            }
            // w: matrices (features 0-7, k 0-7), (0-7, k 8-15), (8-15, k 0-7), (8-15,
            // k 8-15) = the `b` operands of two neighbouring 8-feature tiles.
            let mut b = [[0u32; 2]; 4];
            for pair in 0..2 {
                let row = warp_n + 16 * pair + lane % 8 + 8 * (lane / 16);
                // SAFETY: as above.
                let r = unsafe { ldmatrix_x4(at(w_tile(s), row, kk + 8 * (lane / 8 % 2))) };
                b[2 * pair] = [r[0], r[1]];
                b[2 * pair + 1] = [r[2], r[3]];
            }
            for (i, a) in a.iter().enumerate() {
                for (j, b) in b.iter().enumerate() {
                    mma_bf16_16816(&mut acc[i][j], *a, *b);
                }
            }
        }
    };

    // The pipeline. Every thread commits one copy group per step, empty or not, so that
    // "all but the newest STAGES - 2 groups have landed" always means "step t has".
    for t in 0..STAGES - 1 {
        if t < steps {
            request(t, t);
        }
        cp_async_commit();
    }
    for t in 0..steps {
        cp_async_wait::<{ (STAGES - 2) as u32 }>();
        // Step t is in shared memory for everyone, and everyone is done computing step
        // t - 1, whose buffer the request below refills.
        // SAFETY: all threads run the same number of steps.
        unsafe { sync_threads() };
        let ahead = t + STAGES - 1;
        if ahead < steps {
            request(ahead % STAGES, ahead);
        }
        cp_async_commit();
        compute(t % STAGES, &mut acc);
    }

    // Each lane holds, per tile, rows g and g + 8, columns 2t and 2t + 1.
    let (g, t2) = (lane / 4, 2 * (lane % 4));
    // Split in two, each block adds its half into the zeroed output: 0 + a + b and
    // 0 + b + a are the same float, so the result does not depend on which lands first.
    let split = grid_dim_z() > 1;
    let add_bias = !bias.is_null() && block_idx_z() == 0;
    let store = |row: usize, col: usize, v: f32| {
        if row < n && col < n_out {
            // SAFETY: in bounds by the guard; bias, when present, holds n_out floats.
            unsafe {
                let v = if add_bias { v + *bias.add(col) } else { v };
                let at = out.add(row * n_out + col);
                if split { red_add_f32(at, v) } else { *at = v }
            }
        }
    };
    let store_tile = |i: usize, j: usize, [c0, c1, c2, c3]: [f32; 4]| {
        let (row, col) = (m0 + warp_m + 16 * i + g, n0 + warp_n + 8 * j + t2);
        store(row, col, c0);
        store(row, col + 1, c1);
        store(row + 8, col, c2);
        store(row + 8, col + 1, c3);
    };
    let store_tiles = |i: usize, [j0, j1, j2, j3]: [[f32; 4]; 4]| {
        store_tile(i, 0, j0);
        store_tile(i, 1, j1);
        store_tile(i, 2, j2);
        store_tile(i, 3, j3);
    };
    // Calls with constant indices, not loops: the accumulators stay in registers (a loop
    // the compiler keeps rolled would index them, through memory).
    store_tiles(0, acc[0]);
    store_tiles(1, acc[1]);
    store_tiles(2, acc[2]);
    store_tiles(3, acc[3]);
}

/// `out[i] = bf16(x[i])`, rounded to nearest even: activations made ready for the
/// tensor cores (the GEMM's `x`), 2 bytes per value instead of 4.
///
/// - `out`: `[len]` bf16 (as `u16` bits)
/// - `x`: `[len]` f32
///
/// Thread mapping: one thread per pair of values, as many blocks as it takes.
///
/// PRECONDITIONS: `len % 2 == 0`; `out` 4-byte and `x` 8-byte aligned.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn f32_to_bf16(out: *mut u16, x: *const f32, len: u32) {
    crate::device::wait_for_previous_kernel();
    let i = 2 * crate::device::global_idx_x();
    if i < len as usize {
        // SAFETY: i + 1 < len (len is even); the pair is aligned by the preconditions.
        unsafe { *(out.add(i) as *mut u32) = crate::device::pack_bf16x2(*x.add(i), *x.add(i + 1)) };
    }
}

/// The tensor-core probe: how fast this GPU runs `mma.sync` (the instruction `gemm_mma_bf16`
/// is built on) when nothing else limits it, the ceiling a GEMM written with it can approach.
/// Each warp keeps 16 independent 16 x 8 accumulator tiles (as the GEMM's warps do) and
/// adds `a * b` into each, `iters` times, with operands in registers: no memory traffic.
/// Every element of `a` is the bf16 `a_bits` and of `b` `b_bits`, so every accumulator ends
/// at `iters * 16 * a * b` (exact for powers of two), and each thread writes the sum of its
/// 64: `out[thread] = 64 * iters * 16 * a * b`.
///
/// - `out`: `[gridDim.x * blockDim.x]` f32
///
/// PRECONDITIONS: `blockDim.x` a multiple of 32.
///
/// # Safety
/// `out` holds a float per thread of the launch.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn mma_probe_bf16(
    out: *mut f32,
    a_bits: u32,
    b_bits: u32,
    iters: u32,
) {
    crate::device::wait_for_previous_kernel();
    let pair = |bits: u32| (bits & 0xffff) | (bits << 16);
    let (a, b) = (pair(a_bits), pair(b_bits));
    let (a, b) = ([a; 4], [b; 2]);
    let mut acc = [[0.0f32; 4]; 16];
    for _ in 0..iters {
        for tile in acc.iter_mut() {
            mma_bf16_16816(tile, a, b);
        }
    }
    let mut sum = 0.0f32;
    for tile in acc {
        sum += tile[0] + tile[1] + tile[2] + tile[3];
    }
    // SAFETY: one float per thread (precondition).
    unsafe { *out.add(crate::device::global_idx_x()) = sum };
}
