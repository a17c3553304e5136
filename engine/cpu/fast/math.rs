//! e^x as plain arithmetic the compiler can vectorize (libm's `expf` is a call per value):
//! for SwiGLU's sigmoid and attention's softmax, within a few units in the last place.

/// e^x for finite x (clamped to about -87..88, where f32 ends): x = n ln 2 + r with
/// |r| <= ln 2 / 2, e^r by its Taylor series to r^6 (error below 2e-7 relative on that
/// interval), scaled by 2^n through the exponent bits.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts, so that n * LN2_HI is exact for the n that occur.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E).round_ties_even();
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// SwiGLU as `ops::swiglu_f32` computes it, with `exp_f32`: `out[i] = silu(gate[i]) * up[i]`.
#[inline(always)]
pub fn swiglu(out: &mut [f32], gate: &[f32], up: &[f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + exp_f32(-g)) * u;
    }
}

/// `swiglu`, compiled for AVX2 where the CPU has it.
pub fn swiglu_f32(out: &mut [f32], gate: &[f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::cpu_features::features().avx2 {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn wide(out: &mut [f32], gate: &[f32], up: &[f32]) {
            swiglu(out, gate, up)
        }
        // SAFETY: the CPU has AVX2 and FMA (`Features`).
        return unsafe { wide(out, gate, up) };
    }
    swiglu(out, gate, up)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_a_few_ulps_of_libm() {
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp_f32(x), x.exp());
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_7;
        }
        assert!(worst < 5e-7, "largest relative error {worst:e}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(-1000.0) >= 0.0 && exp_f32(-1000.0) < 1e-37);
    }

    #[test]
    fn swiglu_matches_the_reference() {
        let g: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) / 37.0).collect();
        let u: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin()).collect();
        let (mut a, mut b) = (vec![f32::NAN; 1000], vec![0f32; 1000]);
        swiglu_f32(&mut a, &g, &u);
        crate::cpu::ops::swiglu_f32(&mut b, &g, &u);
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-6 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }
}
