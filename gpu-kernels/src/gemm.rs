//! GEMM: many tokens' activations times a bf16 weight matrix, tiled through shared memory so
//! each weight loaded from memory serves 64 tokens. The first step of the lesson, in plain
//! SIMT arithmetic (16 TFLOP/s on an H200); the prefill runs `gemm_mma_bf16`, its
//! tensor-core successor, about fifteen times faster, or on Hopper `gemm_wgmma_bf16`.
//! Nothing in the forward pass launches this one (the early rounds of the benchmark notebook,
//! `bench/history/rounds.md`, call it `gemm_bf16`).

use crate::device::{
    bf16_to_f32, block_idx_x, block_idx_y, dynamic_shared, sync_threads, thread_idx_x, thread_idx_y,
};

/// Tokens per block tile.
pub const BM: usize = 64;
/// Output features per block tile.
pub const BN: usize = 64;
/// Depth of one shared-memory step.
pub const BK: usize = 16;
/// Padded row length of a shared tile: 65, not 64, so a column write touches 32 banks.
const PAD: usize = BM + 1;
/// Each thread's outputs: `TM x TN`, spread 16 apart so neighbouring threads write
/// neighbouring addresses.
const TM: usize = 4;
const TN: usize = 4;

/// `out[t, o] = sum_i x[t, i] * w[o, i] + bias[o]`.
///
/// Step 1 of the lesson's GEMM, kept and tested: the prompt runs `gemm_wgmma_bf16`
/// (or `gemm_mma_bf16`), batched decode `gemm_skinny_bf16`.
///
/// - `out`: `[n, n_out]` f32
/// - `x`: `[n, n_in]` f32
/// - `w`: `[n_out, n_in]` bf16 (as `u16` bits)
/// - `bias`: `[n_out]` f32, or null for none
///
/// Thread mapping: a 16 x 16 block computes a 64-token x 64-feature tile of `out`; thread
/// `(tx, ty)` owns outputs `(ty + 16 i, tx + 16 j)` for `i, j < 4`. Each step stages a
/// `64 x 16` slice of `x` and of `w` in shared memory, stored transposed (`[k][row]`, rows
/// padded to 65) so that the inner loop reads consecutive addresses. Edges past `n`, `n_in`
/// or `n_out` load zeros and store nothing.
///
/// PRECONDITIONS: block `(16, 16)`; grid `(ceil(n_out / 64), ceil(n / 64))`;
/// `2 * 16 * 65 * 4 = 8320` bytes of dynamic shared memory.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn gemm_step1_simt_bf16(
    out: *mut f32,
    x: *const f32,
    w: *const u16,
    bias: *const f32,
    n: u32,
    n_in: u32,
    n_out: u32,
) {
    crate::device::wait_for_previous_kernel();
    let (n, n_in, n_out) = (n as usize, n_in as usize, n_out as usize);
    let (tx, ty) = (thread_idx_x(), thread_idx_y());
    let tid = ty * 16 + tx;
    let (m0, n0) = (block_idx_y() * BM, block_idx_x() * BN);
    // xs: [BK][PAD] slice of x, transposed; ws: [BK][PAD] slice of w, transposed.
    let xs = dynamic_shared::<f32>();
    // SAFETY: the launch gives two tiles of BK * PAD floats.
    let ws = unsafe { xs.add(BK * PAD) };
    let mut acc = [[0.0f32; TN]; TM];

    let mut k0 = 0;
    while k0 < n_in {
        // Stage: 256 threads move 64 x 16 values of each operand, 4 each; 16 consecutive
        // threads read 16 consecutive values of one row (coalesced).
        for r in 0..4 {
            let idx = tid + 256 * r;
            let (row, k) = (idx / BK, idx % BK);
            let (gm, gn, gk) = (m0 + row, n0 + row, k0 + k);
            // SAFETY: reads are guarded by the bounds; the tiles hold BK * PAD floats each.
            unsafe {
                *xs.add(k * PAD + row) = if gm < n && gk < n_in {
                    *x.add(gm * n_in + gk)
                } else {
                    0.0
                };
                *ws.add(k * PAD + row) = if gn < n_out && gk < n_in {
                    bf16_to_f32(*w.add(gn * n_in + gk))
                } else {
                    0.0
                };
            }
        }
        // SAFETY: every thread of the block reaches both barriers.
        unsafe { sync_threads() };
        for k in 0..BK {
            let mut a = [0.0f32; TM];
            let mut b = [0.0f32; TN];
            for i in 0..TM {
                // SAFETY: k < BK, ty + 16 i < 64.
                a[i] = unsafe { *xs.add(k * PAD + ty + 16 * i) };
            }
            for j in 0..TN {
                // SAFETY: as above.
                b[j] = unsafe { *ws.add(k * PAD + tx + 16 * j) };
            }
            for i in 0..TM {
                for j in 0..TN {
                    acc[i][j] += a[i] * b[j];
                }
            }
        }
        // The next step overwrites the tiles: wait until everyone has read them.
        // SAFETY: as above.
        unsafe { sync_threads() };
        k0 += BK;
    }

    for i in 0..TM {
        for j in 0..TN {
            let (gm, gn) = (m0 + ty + 16 * i, n0 + tx + 16 * j);
            if gm < n && gn < n_out {
                // SAFETY: in bounds by the guard; bias, when present, holds n_out floats.
                unsafe {
                    let b = if bias.is_null() { 0.0 } else { *bias.add(gn) };
                    *out.add(gm * n_out + gn) = acc[i][j] + b;
                }
            }
        }
    }
}
