//! Which vector instructions this CPU has, found once: every kernel picks its form from it.

use std::sync::OnceLock;

/// Which vector instructions the kernels may use, found once at run time. The x86 fields are
/// false on Arm and the Arm fields false on x86.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// AVX2, FMA and F16C: the compiler's vectorized loops (unpacking, attention)
    pub avx2: bool,
    /// AVX-512 F, VL and VNNI (with `avx2`): the integer dot product
    pub vnni: bool,
    /// AVX-512 F, BW, VL and BF16 (with `avx2`): the prefill's bf16 tiles
    pub bf16: bool,
    /// NEON (Advanced SIMD), which every aarch64 CPU has: the integer dot product widened to
    /// 16 and 32 bits. The compiler vectorizes the plain loops with it anyway, as it is part
    /// of the aarch64 target; this field only picks the hand-written forms.
    pub neon: bool,
    /// Arm's `sdot` (with `neon`, Armv8.2 and later, e.g. Cortex-A76, Neoverse N1): the
    /// integer dot product four i8 products to an i32 lane
    pub dotprod: bool,
    /// Arm's `usdot` (with `neon`, Armv8.6 and later, e.g. Neoverse V1, Apple M2): u8 codes
    /// times i8 activations in one instruction, as `vpdpbusd` does
    pub i8mm: bool,
}

impl Features {
    /// What this CPU has, unless `RUSTLE_CPU_PORTABLE=1`: then nothing, and every kernel
    /// runs its plain-Rust form. (`rustle` refuses a bad value of any knob before it runs a
    /// command, so only a library caller can meet the panic here.)
    pub fn detect() -> Features {
        let knobs = crate::knobs::Knobs::from_env().unwrap_or_else(|e| panic!("{e}"));
        Features::detect_unless(knobs.cpu_portable)
    }

    /// `detect` with `RUSTLE_CPU_PORTABLE`'s value given (tests set none in the process).
    fn detect_unless(portable: bool) -> Features {
        if portable {
            return Features::default();
        }
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            let avx512 = avx2 && has!("avx512f") && has!("avx512vl") && has!("avx512bw");
            Features {
                avx2,
                vnni: avx512 && has!("avx512vnni"),
                bf16: avx512 && has!("avx512bf16"),
                ..Default::default()
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            use std::arch::is_aarch64_feature_detected as has;
            let neon = has!("neon");
            Features {
                neon,
                dotprod: neon && has!("dotprod"),
                i8mm: neon && has!("i8mm"),
                ..Default::default()
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        Features::default()
    }

    /// "AVX-512 VNNI and BF16", "NEON with dot products", for messages.
    pub fn describe(self) -> &'static str {
        if self.neon {
            return match (self.i8mm, self.dotprod) {
                (true, _) => "NEON with mixed-sign dot products (i8mm)",
                (false, true) => "NEON with dot products",
                (false, false) => "NEON",
            };
        }
        match (self.vnni, self.bf16, self.avx2) {
            (true, true, _) => "AVX-512 VNNI and BF16",
            (true, false, _) => "AVX-512 VNNI",
            (false, true, _) => "AVX-512 BF16",
            (false, false, true) => "AVX2",
            (false, false, false) => "portable Rust",
        }
    }
}

/// The features the kernels use in this process.
pub fn features() -> Features {
    static F: OnceLock<Features> = OnceLock::new();
    *F.get_or_init(Features::detect)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `RUSTLE_CPU_PORTABLE=1` turns every form off, on either architecture.
    #[test]
    fn portable_turns_everything_off_and_says_so() {
        let f = Features::detect_unless(true);
        assert_eq!(f, Features::default());
        assert_eq!(f.describe(), "portable Rust");
        let arm = Features {
            neon: true,
            dotprod: true,
            ..Default::default()
        };
        assert_eq!(arm.describe(), "NEON with dot products");
    }
}
