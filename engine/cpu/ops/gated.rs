//! The MLP's gated activations, `out = act(gate) * up`: SwiGLU (Llama and most others) and
//! GeGLU (Gemma); each the twin of the GPU's kernel of its name.

use super::bf16::f32_to_bf16;

/// SwiGLU: `out[i] = silu(gate[i]) * up[i]`, silu(x) = x / (1 + e^-x).
///
/// - `out`, `gate`, `up`: `[n, ffn_dim]`
pub fn swiglu_f32(out: &mut [f32], gate: &[f32], up: &[f32]) {
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

/// GeGLU (Gemma): `out[i] = gelu(gate[i]) * up[i]`, GELU in its tanh form,
/// `gelu(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
///
/// - `out`, `gate`, `up`: `[n, ffn_dim]`
pub fn geglu_f32(out: &mut [f32], gate: &[f32], up: &[f32]) {
    for ((o, &g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu_tanh(g) * u;
    }
}

/// `swiglu_f32`, the output also rounded to bf16 bits (to nearest even) into `out_bf16`. The twin
/// of the kernel of its name.
pub fn swiglu_f32_bf16(out: &mut [f32], out_bf16: &mut [u16], gate: &[f32], up: &[f32]) {
    swiglu_f32(out, gate, up);
    f32_to_bf16(out_bf16, out);
}

/// `geglu_f32`, the output also rounded to bf16 bits (to nearest even) into `out_bf16`. The twin
/// of the kernel of its name.
pub fn geglu_f32_bf16(out: &mut [f32], out_bf16: &mut [u16], gate: &[f32], up: &[f32]) {
    geglu_f32(out, gate, up);
    f32_to_bf16(out_bf16, out);
}

/// GELU's tanh form.
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
}
