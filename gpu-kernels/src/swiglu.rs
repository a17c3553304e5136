//! SwiGLU, the MLP's gate: `silu(gate) * up`.

use crate::device::{exp, global_idx_x};

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
