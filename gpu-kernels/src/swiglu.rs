//! SwiGLU, the MLP's gate: `silu(gate) * up`.

use crate::device::{exp, f32_to_bf16, global_idx_x};

/// `out[i] = gate[i] / (1 + e^-gate[i]) * up[i]`.
///
/// - `out`, `gate`, `up`: `[n]` f32 (`n = tokens * ffn_dim`)
///
/// Thread mapping: one thread per element. `e^x` is the fast `ex2.approx` one.
///
/// # Safety
/// All three buffers hold `n` floats.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn swiglu_f32(
    out: *mut f32,
    gate: *const f32,
    up: *const f32,
    n: u32,
) {
    crate::device::wait_for_previous_kernel();
    let i = global_idx_x();
    if i < n as usize {
        // SAFETY: i < n.
        unsafe {
            let g = *gate.add(i);
            *out.add(i) = g / (1.0 + exp(-g)) * *up.add(i);
        }
    }
}

/// `swiglu_f32`, each output also rounded to bf16 into `out_bf16` (`[n]`, as `u16` bits,
/// rounded as `f32_to_bf16` rounds): the down projection's input, without a rounding launch
/// of its own.
///
/// # Safety
/// All four buffers hold `n` values.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn swiglu_f32_bf16(
    out: *mut f32,
    out_bf16: *mut u16,
    gate: *const f32,
    up: *const f32,
    n: u32,
) {
    crate::device::wait_for_previous_kernel();
    let i = global_idx_x();
    if i < n as usize {
        // SAFETY: i < n.
        unsafe {
            let g = *gate.add(i);
            let v = g / (1.0 + exp(-g)) * *up.add(i);
            *out.add(i) = v;
            *out_bf16.add(i) = f32_to_bf16(v);
        }
    }
}
