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

/// GELU's tanh form, in f64: for a gate far below zero `1 + tanh(u)` cancels to a few
/// bits in f32 (a gate of -3 kept about 9 of 24), where the kernel's logistic form
/// (`gpu-kernels/src/swiglu.rs`) keeps them all; the twin must be the more exact of the two.
fn gelu_tanh(x: f32) -> f32 {
    let x = x as f64;
    let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    (0.5 * x * (1.0 + u.tanh())) as f32
}

#[cfg(test)]
mod tests {
    /// Far below zero the tanh form in f64 agrees with the logistic form, `x / (1 + e^(-2u))`,
    /// to f32's rounding, where the same tanh form in f32 loses most of its bits.
    #[test]
    fn gelu_keeps_its_bits_below_zero() {
        for x in [-1.0f32, -3.0, -4.5, -6.0, 0.5, 3.0] {
            let xd = x as f64;
            let u = (2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd * xd * xd);
            let logistic = (xd / (1.0 + (-2.0 * u).exp())) as f32;
            let got = super::gelu_tanh(x);
            assert!(
                ((got - logistic) / logistic).abs() < 1e-6,
                "{x}: {got} vs {logistic}"
            );
        }
    }
}
