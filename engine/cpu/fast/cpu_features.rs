//! Which vector instructions this CPU has, found once: every kernel picks its form from it.

use std::sync::OnceLock;

/// Which vector instructions the kernels may use, found once at run time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// AVX2, FMA and F16C: the compiler's vectorized loops (unpacking, attention)
    pub avx2: bool,
    /// AVX-512 F, VL and VNNI (with `avx2`): the integer dot product
    pub vnni: bool,
    /// AVX-512 F, BW, VL and BF16 (with `avx2`): the prefill's bf16 tiles
    pub bf16: bool,
}

impl Features {
    /// What this CPU has, unless `RUSTLE_CPU_PORTABLE` is set (to anything but 0): then
    /// nothing, and every kernel runs its plain-Rust form.
    pub fn detect() -> Features {
        if std::env::var("RUSTLE_CPU_PORTABLE").is_ok_and(|v| v != "0") {
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
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Features::default()
    }

    /// "AVX-512 VNNI and BF16", for messages.
    pub fn describe(self) -> &'static str {
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
