//! `quantize_fp8_f32`: a prompt's activations to e4m3 with one scale a token, the input of
//! `gemm_wgmma_fp8` (Hopper's fp8 tensor cores multiply two fp8 operands, so the
//! activations are made fp8 too, as the weights were at load).

use crate::device::{
    block_dim_x, block_idx_x, block_max, dynamic_shared, ld_nc_v4, pack_e4m3x4, thread_idx_x,
};
use crate::unroll::unroll;

/// Largest e4m3 value: 1.75 * 2^8.
const E4M3_MAX: f32 = 448.0;
/// 16-byte pieces of its row a thread keeps in registers between the two passes: with 1024
/// threads, rows of up to 16384 floats are read from memory once.
const HELD: usize = 4;

/// `scales[t] = max_i |x[t, i]| / 448` (1 for a row of zeros) and
/// `codes[t, i] = e4m3(x[t, i] / scales[t])`, rounded to the nearest: each token's largest
/// value becomes e4m3's largest, as `--weights fp8` does for each row of a matrix.
///
/// - `codes`: `[n, n_in]` e4m3
/// - `scales`: `[n]` f32
/// - `x`: `[n, n_in]` f32
///
/// Thread mapping: one block per token. Each thread takes 4 floats at a time (`i = 4 t,
/// 4 t + 4 blockDim, ...`, one 16-byte load), its first `HELD` pieces kept in registers: all
/// of the row's loads are issued at once for the largest magnitude (a block reduction), and
/// the pieces are divided and rounded from registers into one 4-byte store each. Pieces past
/// `HELD` (rows longer than `4 HELD blockDim`) are read again.
///
/// PRECONDITIONS: `n_in % 4 == 0`; `x` 16-byte and `codes` 4-byte aligned; grid `(n)`;
/// `blockDim.x` a multiple of 32, at most 1024; 32 floats (128 bytes) of dynamic shared
/// memory.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn quantize_fp8_f32(
    codes: *mut u8,
    scales: *mut f32,
    x: *const f32,
    n_in: u32,
) {
    crate::device::wait_for_previous_kernel();
    let (n_in, token) = (n_in as usize, block_idx_x());
    let (first, stride) = (4 * thread_idx_x(), 4 * block_dim_x());
    // SAFETY (all accesses): the token's row, at 4-float steps inside it (n_in % 4 == 0),
    // aligned by the preconditions; the scratch is the launch's 32 floats.
    unsafe {
        let x = x.add(token * n_in);
        let codes = codes.add(token * n_in);
        let load = |i: usize| ld_nc_v4(x.add(i) as *const u32).map(f32::from_bits);
        let largest = |v: [f32; 4]| v.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let mut held = [[0.0f32; 4]; HELD];
        let mut max = 0.0f32;
        unroll!(h < HELD => {
            let i = first + h * stride;
            if i < n_in {
                held[h] = load(i);
            }
        });
        unroll!(h < HELD => {
            max = max.max(largest(held[h]));
        });
        for i in (first + HELD * stride..n_in).step_by(stride) {
            max = max.max(largest(load(i)));
        }
        let max = block_max(max, dynamic_shared::<f32>());
        let scale = if max > 0.0 { max / E4M3_MAX } else { 1.0 };
        if thread_idx_x() == 0 {
            *scales.add(token) = scale;
        }
        let store = |i: usize, v: [f32; 4]| {
            *(codes.add(i) as *mut u32) = pack_e4m3x4(v.map(|v| v / scale));
        };
        unroll!(h < HELD => {
            let i = first + h * stride;
            if i < n_in {
                store(i, held[h]);
            }
        });
        for i in (first + HELD * stride..n_in).step_by(stride) {
            store(i, load(i));
        }
    }
}
