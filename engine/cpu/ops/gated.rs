//! The MLP's gated activations, `out = act(gate) * up`: SwiGLU (Llama and most others) and
//! GeGLU (Gemma); `swiglu_f32` is the twin of the GPU's kernel of that name.

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

/// GELU's tanh form.
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
}
