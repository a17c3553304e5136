//! The MLP's gates: SwiGLU, `silu(gate) * up` (Llama and most others), and GeGLU,
//! `gelu(gate) * up` with GELU's tanh form (Gemma 3); each also in a form that writes its
//! output rounded to bf16 besides (the down projection's tensor-core input, without a
//! rounding launch of its own).

use crate::device::{exp, f32_to_bf16, global_idx_x};

/// `silu(x) = x / (1 + e^-x)`, with the fast `ex2.approx` exponential.
#[inline(always)]
fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
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

/// The body of the four kernels: `out[i] = act(gate[i]) * up[i]`, and where `out_bf16` is
/// not null, the same rounded to bf16 (as `f32_to_bf16` rounds) into it. One thread per
/// element.
///
/// # Safety
/// `out`, `gate`, `up` (and `out_bf16` where given) hold `n` values.
#[inline(always)]
unsafe fn gated(
    act: fn(f32) -> f32,
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
            let v = act(*gate.add(i)) * *up.add(i);
            *out.add(i) = v;
            if !out_bf16.is_null() {
                *out_bf16.add(i) = f32_to_bf16(v);
            }
        }
    }
}

/// `out[i] = silu(gate[i]) * up[i]`.
///
/// - `out`, `gate`, `up`: `[n]` f32 (`n = tokens * ffn_dim`)
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
    // SAFETY: the caller's promise.
    unsafe { gated(silu, out, core::ptr::null_mut(), gate, up, n) }
}

/// `swiglu_f32`, each output also rounded to bf16 into `out_bf16` (`[n]`, as `u16` bits).
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
    // SAFETY: the caller's promise.
    unsafe { gated(silu, out, out_bf16, gate, up, n) }
}

/// `out[i] = gelu(gate[i]) * up[i]`, GELU in its tanh form (`gelu_tanh`).
///
/// - `out`, `gate`, `up`: `[n]` f32 (`n = tokens * ffn_dim`)
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
    // SAFETY: the caller's promise.
    unsafe { gated(gelu_tanh, out, core::ptr::null_mut(), gate, up, n) }
}

/// `geglu_f32`, each output also rounded to bf16 into `out_bf16` (`[n]`, as `u16` bits).
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
    // SAFETY: the caller's promise.
    unsafe { gated(gelu_tanh, out, out_bf16, gate, up, n) }
}
