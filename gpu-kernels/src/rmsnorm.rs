//! RMSNorm: each row scaled to unit root-mean-square, then by a learned weight.

use crate::device::{
    block_dim_x, block_idx_x, block_idx_y, block_sum, dynamic_shared, f32_to_bf16, sqrt,
    thread_idx_x, wait_for_previous_kernel,
};
use crate::gemv_codes::write_code;

/// `out[r, i] = x[r, i] / sqrt(mean_j x[r, j]^2 + eps) * weight[i]`.
///
/// - `out`, `x`: `[n_rows, dim]` f32 (may be the same buffer)
/// - `weight`: `[dim]` f32
///
/// Thread mapping: one block per row. Each thread loads its (up to) eight elements
/// `t, t + blockDim, ...` at once, keeps them in registers, and sums their squares; a block
/// reduction (warp shuffles, then one float per warp in shared memory) gives the row's sum.
/// With 1024 threads a row of up to 8192 is one round of loads, not a chain of them (a
/// decode step has a single row, so nothing else hides the latency); longer rows loop. The
/// weights of a thread's elements are loaded before the wait for the kernel before, which
/// cannot have written them, so that no load is left after the reduction.
///
/// PRECONDITIONS: `blockDim.x` a multiple of 32, at most 1024; 32 floats (128 bytes) of
/// dynamic shared memory; `weight` not written by the kernel before this one (it is read
/// before the wait for it).
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn rmsnorm_f32(
    out: *mut f32,
    x: *const f32,
    weight: *const f32,
    eps: f32,
    dim: u32,
) {
    // SAFETY: the same preconditions; no second output.
    unsafe { rmsnorm(out, core::ptr::null_mut(), x, weight, eps, dim) }
}

/// `rmsnorm_f32`, each output also rounded to bf16 into `out_bf16` (`[n_rows, dim]`, as
/// `u16` bits, rounded as `f32_to_bf16` rounds): the input of the tensor-core matmul that
/// follows, which would otherwise take a launch of `f32_to_bf16` of its own.
///
/// PRECONDITIONS and thread mapping: as `rmsnorm_f32`.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn rmsnorm_f32_bf16(
    out: *mut f32,
    out_bf16: *mut u16,
    x: *const f32,
    weight: *const f32,
    eps: f32,
    dim: u32,
) {
    // SAFETY: the preconditions, passed on.
    unsafe { rmsnorm(out, out_bf16, x, weight, eps, dim) }
}

/// `rmsnorm_f32` whose output is made 8-bit codes as `quantize_q8_f32` makes them: the
/// input of a GEMV over GGUF blocks, in one launch where the norm and the codes took two.
///
/// - `codes`: `[n_rows, dim]` i8; `scales`: `[n_rows, dim / 32][2]` f32
/// - `x`: `[n_rows, dim]` f32; `weight`: `[dim]` f32
///
/// Thread mapping: block `(b, r)` writes the codes of row r's values `b * blockDim ..
/// (b + 1) * blockDim`, a warp a group of 32. The norm needs the whole row's sum of squares
/// first, and a grid has no barrier, so every block of the row sums all of it: a decode
/// step's row is 16 KB, read from L2 by a handful of blocks. (One block doing the whole row,
/// its norm and then every group, took longer than the two launches it replaced on the
/// H200: docs/lessons.md#tried-and-dropped.)
///
/// PRECONDITIONS: `dim % 32 == 0`; `blockDim.x` a multiple of 32, at most 1024; a grid of
/// `(dim.div_ceil(blockDim.x), n_rows)`; 32 floats (128 bytes) of dynamic shared memory;
/// `weight` not written by the kernel before this one (it is read before the wait for it).
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn rmsnorm_q8_f32(
    codes: *mut u8,
    scales: *mut f32,
    x: *const f32,
    weight: *const f32,
    eps: f32,
    dim: u32,
) {
    const HELD: usize = 8;
    let dim = dim as usize;
    let (t, bd) = (thread_idx_x(), block_dim_x());
    let row = block_idx_y() * dim;
    let i = block_idx_x() * bd + t;
    // SAFETY (all accesses): row + i < n_rows * dim for every i < dim read or written.
    unsafe {
        // This thread's weight before the wait for the kernel before (no kernel writes the
        // weights): it meets the row's sum in a register instead of being loaded after it.
        let w = if i < dim { *weight.add(i) } else { 0.0 };
        wait_for_previous_kernel();
        let x = x.add(row);
        // The row's squares in rounds of HELD loads a thread, all issued before any is
        // added: each round waits for L2 once, not HELD times.
        let mut sum_sq = 0.0f32;
        let mut first = 0;
        while first < dim {
            let mut held = [0.0f32; HELD];
            for (k, h) in held.iter_mut().enumerate() {
                let i = first + t + k * bd;
                if i < dim {
                    *h = *x.add(i);
                }
            }
            for h in held {
                sum_sq += h * h;
            }
            first += HELD * bd;
        }
        // All threads call it; the launch gives 32 floats of shared memory.
        let total = block_sum(sum_sq, dynamic_shared::<f32>());
        let scale = 1.0 / sqrt(total / dim as f32 + eps);
        // dim is whole groups, so a warp leaves here whole or not at all.
        if i >= dim {
            return;
        }
        // The same product, in the same order, as `rmsnorm_f32`'s.
        write_code(
            codes.add(row),
            scales.add(row / 16),
            i,
            *x.add(i) * scale * w,
        );
    }
}

/// The body of both kernels, their wait for the kernel before included (after the weights'
/// loads): `out_bf16` null for none.
///
/// # Safety
/// As `rmsnorm_f32`.
#[inline(always)]
unsafe fn rmsnorm(
    out: *mut f32,
    out_bf16: *mut u16,
    x: *const f32,
    weight: *const f32,
    eps: f32,
    dim: u32,
) {
    const HELD: usize = 8;
    let dim = dim as usize;
    let (t, bd) = (thread_idx_x(), block_dim_x());
    // SAFETY (all accesses): row + i < n_rows * dim for every i < dim read or written.
    unsafe {
        // The weights of the elements a thread holds, before the wait for the kernel before
        // (no kernel writes them): they meet the row's sum in registers instead of being
        // loaded after it.
        let mut weights = [0.0f32; HELD];
        for (k, w) in weights.iter_mut().enumerate() {
            let i = t + k * bd;
            if i < dim {
                *w = *weight.add(i);
            }
        }
        wait_for_previous_kernel();
        let row = block_idx_x() * dim;
        let (x, out) = (x.add(row), out.add(row));
        let store = |i: usize, v: f32| {
            *out.add(i) = v;
            if !out_bf16.is_null() {
                *out_bf16.add(row + i) = f32_to_bf16(v);
            }
        };
        let mut held = [0.0f32; HELD];
        let mut sum_sq = 0.0f32;
        for (k, h) in held.iter_mut().enumerate() {
            let i = t + k * bd;
            if i < dim {
                *h = *x.add(i);
                sum_sq += *h * *h;
            }
        }
        let mut i = t + HELD * bd;
        while i < dim {
            let v = *x.add(i);
            sum_sq += v * v;
            i += bd;
        }
        // All threads call it; the launch gives 32 floats of shared memory.
        let total = block_sum(sum_sq, dynamic_shared::<f32>());
        let scale = 1.0 / sqrt(total / dim as f32 + eps);
        // Every read of x happened before block_sum's barriers, so writing in place is safe;
        // the tail re-reads only its own elements.
        for (k, h) in held.iter().enumerate() {
            let i = t + k * bd;
            if i < dim {
                store(i, *h * scale * weights[k]);
            }
        }
        let mut i = t + HELD * bd;
        while i < dim {
            store(i, *x.add(i) * scale * *weight.add(i));
            i += bd;
        }
    }
}
