//! Arm's two integer dot-product instructions, wrapped once: stable Rust has NEON's other
//! intrinsics but not these (`vdotq_s32` and `vusdotq_s32` are nightly-only in `std::arch`),
//! so each is one line of `asm!` here and never in a kernel body.
//!
//! Both take 16 bytes from each operand and add four products into each i32 lane:
//! lane l of the result gains `a[4l] * b[4l] + ... + a[4l + 3] * b[4l + 3]`.

use std::arch::aarch64::*;
use std::arch::asm;

/// `acc + ` the four-product sums of `a` (i8) and `b` (i8): `sdot`, Armv8.2's dot product.
///
/// # Safety
/// The CPU must have dotprod (unsafe only where the caller's features do not say so).
#[target_feature(enable = "neon,dotprod")]
#[inline]
pub fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: the instruction reads and writes only these registers; the function's target
    // features say the CPU has it.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    acc
}

/// `acc + ` the four-product sums of `u` (u8) and `x` (i8): `usdot`, Armv8.6's mixed-sign
/// dot product (the i8mm extension), what `vpdpbusd` is on x86.
///
/// # Safety
/// The CPU must have i8mm (unsafe only where the caller's features do not say so).
#[target_feature(enable = "neon,i8mm")]
#[inline]
pub fn usdot(acc: int32x4_t, u: uint8x16_t, x: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: as in `sdot`.
    unsafe {
        asm!(
            "usdot {acc:v}.4s, {u:v}.16b, {x:v}.16b",
            acc = inout(vreg) acc,
            u = in(vreg) u,
            x = in(vreg) x,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each instruction against the four-product sums done in plain i32, on the extremes
    /// (codes 255 and 0, activations -128 and 127) and a spread between: where the CPU has it.
    #[test]
    fn dot_instructions_sum_four_products_a_lane() {
        let u: [u8; 16] = [
            255, 0, 255, 1, 128, 127, 200, 3, 255, 255, 255, 255, 9, 8, 7, 6,
        ];
        let x: [i8; 16] = [
            -128, 127, 127, -1, -128, 5, -77, 100, -128, -128, -128, -128, 1, -2, 3, -4,
        ];
        let want = |a: &dyn Fn(usize) -> i32| -> [i32; 4] {
            std::array::from_fn(|l| {
                (4 * l..4 * l + 4).map(|i| a(i) * x[i] as i32).sum::<i32>() + l as i32
            })
        };
        let bias = [0, 1, 2, 3];
        let lanes = |v: int32x4_t| {
            let mut o = [0i32; 4];
            // SAFETY: `o` holds four lanes.
            unsafe { vst1q_s32(o.as_mut_ptr(), v) };
            o
        };
        // SAFETY (loads): the arrays hold 16 bytes each.
        let (uv, xv, bv) = unsafe {
            (
                vld1q_u8(u.as_ptr()),
                vld1q_s8(x.as_ptr()),
                vld1q_s32(bias.as_ptr()),
            )
        };
        let mut ran = 0;
        if std::arch::is_aarch64_feature_detected!("i8mm") {
            // SAFETY: the CPU has i8mm.
            let got = lanes(unsafe { usdot(bv, uv, xv) });
            assert_eq!(got, want(&|i| u[i] as i32), "usdot");
            ran += 1;
        }
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            // SAFETY: the CPU has dotprod.
            let got = lanes(unsafe { sdot(bv, vreinterpretq_s8_u8(uv), xv) });
            assert_eq!(got, want(&|i| u[i] as i8 as i32), "sdot");
            ran += 1;
        }
        eprintln!("{ran} of 2 dot instructions checked on this CPU");
    }
}
