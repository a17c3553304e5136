//! The MLP's gates: SwiGLU, `silu(gate) * up` (Llama and most others), and GeGLU,
//! `gelu(gate) * up` with GELU's tanh form (Gemma 3).

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

/// GELU's tanh form, `x/2 (1 + tanh(u))` with `u = sqrt(2/pi) (x + 0.044715 x^3)`, written
/// as `x / (1 + e^(-2u))` (the same function: `(1 + tanh(u)) / 2` is the logistic of
/// `2u`), one `ex2.approx` where tanh would take more.
#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
    x / (1.0 + exp(-2.0 * u))
}

/// `out[i] = gelu(gate[i]) * up[i]`, GELU in its tanh form (`gelu_tanh`).
///
/// - `out`, `gate`, `up`: `[n]` f32 (`n = tokens * ffn_dim`)
///
/// Thread mapping: one thread per element.
///
/// # Safety
/// All three buffers hold `n` floats.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn geglu_f32(
    out: *mut f32,
    gate: *const f32,
    up: *const f32,
    n: u32,
) {
    crate::device::wait_for_previous_kernel();
    let i = global_idx_x();
    if i < n as usize {
        // SAFETY: i < n.
        unsafe { *out.add(i) = gelu_tanh(*gate.add(i)) * *up.add(i) };
    }
}

/// `geglu_f32`, each output also rounded to bf16 into `out_bf16` (`[n]`), as
/// `swiglu_f32_bf16` rounds.
///
/// # Safety
/// All four buffers hold `n` values.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn geglu_f32_bf16(
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
            let v = gelu_tanh(*gate.add(i)) * *up.add(i);
            *out.add(i) = v;
            *out_bf16.add(i) = f32_to_bf16(v);
        }
    }
}
