//! bf16 to and from f32: the widening is exact, the rounding to nearest even; the latter the
//! twin of the GPU's `f32_to_bf16`.

/// A bf16 (the top half of an f32's bits) as f32.
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `out[i] = bf16(x[i])`, rounded to nearest even, as bits.
pub fn f32_to_bf16(out: &mut [u16], x: &[f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = half::bf16::from_f32(v).to_bits();
    }
}
