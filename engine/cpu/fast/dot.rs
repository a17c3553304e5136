//! Activations quantized per block of 32 to 8 bits, and the dot product of such a row with a
//! weight row unpacked to codes (`unpack.rs`): the decode's matmul, one token at a time.
//!
//! With x[i] ~ xd[i / 32] * xq[i] and w[i] = scale[i / 16] * u[i] + offset[i / 16]:
//!
//!   w . x = sum over runs j of scale[j] * xd[j / 2] * (sum of u[i] * xq[i] in run j)
//!         + sum over runs j of offset[j] * xs[j]
//!
//! where `xs[j]` is run j's activations summed (`xd * sum xq`). The first sum is integer
//! work: u8 codes times i8 activations, four products at a time into i32 lanes (AVX-512
//! VNNI's `vpdpbusd`), a lane group of four per run of 16. On Arm a run of 16 is one NEON
//! register and its product four i32 lanes, made by whichever instruction the CPU has:
//! `usdot` (i8mm: u8 times i8, as `vpdpbusd`), `sdot` (dotprod: i8 times i8, so the codes
//! are shifted by -128 and 128 times the activations' sum added back), or widening
//! multiplies (plain NEON).

#[cfg(target_arch = "aarch64")]
use std::arch::aarch64::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::unpack::RUN;

/// `n` rows of activations, each quantized in blocks of 32: the form the decode's integer
/// dot products read.
#[derive(Default)]
pub struct Q8Rows {
    pub cols: usize,
    /// `[n, cols]` x / xd, rounded
    pub q: Vec<i8>,
    /// `[n, cols / 16]` the scale of each run's block (two runs share one), so that a run's
    /// scale is one load
    pub d: Vec<f32>,
    /// `[n, cols / 16]` each run's sum of activations as quantized, `d * sum q`
    pub sums: Vec<f32>,
    /// `[n, cols / 32, 2]` each block's (scale, sum over its 32): the pair a 32-value
    /// weight block's (scale, offset) multiplies in one instruction (`fused.rs`)
    pub pairs: Vec<f32>,
}

impl Q8Rows {
    /// Quantizes `x` (`[n, cols]`, cols a multiple of 32) in place of what it held; grows
    /// only when a larger batch arrives.
    pub fn quantize(&mut self, x: &[f32], cols: usize) {
        let n = x.len() / cols;
        self.cols = cols;
        self.q.resize(n * cols, 0);
        self.d.resize(n * cols / RUN, 0.0);
        self.sums.resize(n * cols / RUN, 0.0);
        self.pairs.resize(n * cols / RUN, 0.0);
        #[cfg(target_arch = "x86_64")]
        if super::cpu_features::features().avx2 {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn wide(a: &mut Q8Rows, x: &[f32]) {
                a.quantize_blocks(x)
            }
            // SAFETY: the CPU has AVX2 and FMA (`Features`).
            return unsafe { wide(self, x) };
        }
        self.quantize_blocks(x)
    }

    #[inline(always)]
    fn quantize_blocks(&mut self, x: &[f32]) {
        let blocks = x.chunks_exact(32).zip(self.q.chunks_exact_mut(32)).zip(
            self.d
                .chunks_exact_mut(2)
                .zip(self.sums.chunks_exact_mut(2)),
        );
        for ((x, q), (d, sums)) in blocks {
            quantize_block(x, q, d, sums);
        }
        let pairs = self.pairs.chunks_exact_mut(2);
        for ((p, d), s) in pairs
            .zip(self.d.chunks_exact(2))
            .zip(self.sums.chunks_exact(2))
        {
            p[0] = d[0];
            p[1] = s[0] + s[1];
        }
    }

    /// Row `t`'s (scale, sum) per block of 32: `[cols / 32, 2]`.
    pub fn pairs(&self, t: usize) -> &[f32] {
        let r = self.cols / RUN;
        &self.pairs[t * r..(t + 1) * r]
    }

    /// Row `t`: (codes, run scales, run sums).
    pub fn row(&self, t: usize) -> (&[i8], &[f32], &[f32]) {
        let (c, r) = (self.cols, self.cols / RUN);
        (
            &self.q[t * c..(t + 1) * c],
            &self.d[t * r..(t + 1) * r],
            &self.sums[t * r..(t + 1) * r],
        )
    }
}

/// One block of 32: scale = max |x| / 127, q = x / scale rounded to nearest (ties even).
#[inline(always)]
fn quantize_block(x: &[f32], q: &mut [i8], d: &mut [f32], sums: &mut [f32]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = amax / 127.0;
    let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    for (q, &x) in q.iter_mut().zip(x) {
        *q = (x * inv).round_ties_even() as i8;
    }
    for (run, (d, s)) in d.iter_mut().zip(sums.iter_mut()).enumerate() {
        let sum: i32 = q[RUN * run..RUN * (run + 1)]
            .iter()
            .map(|&q| q as i32)
            .sum();
        *d = scale;
        *s = scale * sum as f32;
    }
}

/// Sum of `a[i] * b[i]`: the reference's, eight lanes the compiler keeps in a vector.
pub use crate::cpu::ops::dot as dot_f32;

/// A weight row as codes (`u`: `[cols]`, `scale`, `offset`: `[cols / 16]`) against one
/// quantized activation row (`xq`: `[cols]`, `xd`, `xs`: `[cols / 16]`): the portable form.
#[inline(always)]
pub fn dot_codes(
    u: &[u8],
    scale: &[f32],
    offset: &[f32],
    xq: &[i8],
    xd: &[f32],
    xs: &[f32],
) -> f32 {
    let mut acc = [0f32; 4];
    let runs = u
        .chunks_exact(RUN)
        .zip(xq.chunks_exact(RUN))
        .zip(scale.iter().zip(xd));
    for (j, ((u, x), (s, d))) in runs.enumerate() {
        let mut i = 0i32;
        for k in 0..RUN {
            i += u[k] as i32 * x[k] as i32;
        }
        acc[j % 4] += s * d * i as f32;
    }
    acc.iter().sum::<f32>() + dot_f32(offset, xs)
}

/// `dot_codes` with AVX-512 VNNI: 64 codes per `vpdpbusd`, four runs of 16, each run's
/// four i32 lanes scaled by its weight scale times its activation scale.
///
/// # Safety
/// The CPU must have AVX-512 F, VL, VNNI, and `u.len()` must be a multiple of 32, the other
/// slices as `dot_codes` says.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
pub unsafe fn dot_codes_vnni(
    u: &[u8],
    scale: &[f32],
    offset: &[f32],
    xq: &[i8],
    xd: &[f32],
    xs: &[f32],
) -> f32 {
    let n = u.len();
    debug_assert!(n.is_multiple_of(32) && xq.len() >= n && scale.len() >= n / RUN);
    debug_assert!(xd.len() >= n / RUN);
    // SAFETY (all loads): i + 64 <= n (32 in the tail), and the runs' arrays hold n / 16
    // values, as the caller promises.
    let sum = unsafe {
        let (u, xq, s, d) = (u.as_ptr(), xq.as_ptr(), scale.as_ptr(), xd.as_ptr());
        // Lane l of a 64-code product belongs to run l / 4 of the four.
        let runs = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut i = 0;
        while i + 128 <= n {
            let p0 = _mm512_dpbusd_epi32(
                _mm512_setzero_si512(),
                _mm512_loadu_si512(u.add(i).cast()),
                _mm512_loadu_si512(xq.add(i).cast()),
            );
            let p1 = _mm512_dpbusd_epi32(
                _mm512_setzero_si512(),
                _mm512_loadu_si512(u.add(i + 64).cast()),
                _mm512_loadu_si512(xq.add(i + 64).cast()),
            );
            let j = i / RUN;
            let sd0 = _mm_mul_ps(_mm_loadu_ps(s.add(j)), _mm_loadu_ps(d.add(j)));
            let sd1 = _mm_mul_ps(_mm_loadu_ps(s.add(j + 4)), _mm_loadu_ps(d.add(j + 4)));
            let sv0 = _mm512_permutexvar_ps(runs, _mm512_castps128_ps512(sd0));
            let sv1 = _mm512_permutexvar_ps(runs, _mm512_castps128_ps512(sd1));
            acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), sv0, acc0);
            acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), sv1, acc1);
            i += 128;
        }
        while i + 64 <= n {
            let p = _mm512_dpbusd_epi32(
                _mm512_setzero_si512(),
                _mm512_loadu_si512(u.add(i).cast()),
                _mm512_loadu_si512(xq.add(i).cast()),
            );
            let j = i / RUN;
            let sd = _mm_mul_ps(_mm_loadu_ps(s.add(j)), _mm_loadu_ps(d.add(j)));
            let sv = _mm512_permutexvar_ps(runs, _mm512_castps128_ps512(sd));
            acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sv, acc0);
            i += 64;
        }
        let mut sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
        if i < n {
            // One block of 32 left: two runs.
            let p = _mm256_dpbusd_epi32(
                _mm256_setzero_si256(),
                _mm256_loadu_si256(u.add(i).cast()),
                _mm256_loadu_si256(xq.add(i).cast()),
            );
            let mut lanes = [0i32; 8];
            _mm256_storeu_si256(lanes.as_mut_ptr().cast(), p);
            let j = i / RUN;
            let (a, b): (i32, i32) = (lanes[..4].iter().sum(), lanes[4..].iter().sum());
            sum += *s.add(j) * *d.add(j) * a as f32 + *s.add(j + 1) * *d.add(j + 1) * b as f32;
        }
        sum
    };
    sum + dot_f32(offset, xs)
}

/// Horizontal sum of eight lanes.
///
/// # Safety
/// The CPU must have AVX2 (a safe call only from code compiled with it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// `dot_codes` with AVX2: a run of 16 codes and 16 activations widened to i16, multiplied
/// and added in pairs (`vpmaddwd`: exact, at most 2 * 255 * 127 a lane, so any code the
/// unpacking makes) into eight i32 lanes, which the run's weight scale times activation
/// scale multiplies into an f32 accumulator; two runs a step, each into its own.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `u.len()` a multiple of 16, the other slices as
/// `dot_codes` says.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_codes_avx2(
    u: &[u8],
    scale: &[f32],
    offset: &[f32],
    xq: &[i8],
    xd: &[f32],
    xs: &[f32],
) -> f32 {
    let runs = u.len() / RUN;
    debug_assert!(u.len().is_multiple_of(RUN) && xq.len() >= u.len());
    debug_assert!(scale.len() >= runs && xd.len() >= runs);
    // SAFETY (all loads): run j's 16 codes and activations lie below u.len(), and its scales
    // below `runs`, as the caller promises.
    let sum = unsafe {
        let (u, xq, s, d) = (u.as_ptr(), xq.as_ptr(), scale.as_ptr(), xd.as_ptr());
        let run = |j: usize| {
            let c = _mm256_cvtepu8_epi16(_mm_loadu_si128(u.add(RUN * j).cast()));
            let x = _mm256_cvtepi8_epi16(_mm_loadu_si128(xq.add(RUN * j).cast()));
            let sd = _mm256_set1_ps(*s.add(j) * *d.add(j));
            (_mm256_cvtepi32_ps(_mm256_madd_epi16(c, x)), sd)
        };
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut j = 0;
        while j + 2 <= runs {
            let ((p0, sd0), (p1, sd1)) = (run(j), run(j + 1));
            acc0 = _mm256_fmadd_ps(p0, sd0, acc0);
            acc1 = _mm256_fmadd_ps(p1, sd1, acc1);
            j += 2;
        }
        if j < runs {
            let (p, sd) = run(j);
            acc0 = _mm256_fmadd_ps(p, sd, acc0);
        }
        hsum(_mm256_add_ps(acc0, acc1))
    };
    sum + dot_f32(offset, xs)
}

/// `dot_codes` on NEON, with `run(u, x)` the integer product of one run of 16 codes and 16
/// activations as four i32 lanes (their sum the run's product; exact: at most 16 * 255 * 128
/// in magnitude). Four runs a step, each into its own f32 accumulator, scaled by its weight
/// scale times its activation scale (one lane of a four-run vector of them).
///
/// # Safety
/// `u.len()` a multiple of 32, the other slices as `dot_codes` says; `run` reads 16 values
/// at each pointer it is given.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn dot_codes_runs(
    u: &[u8],
    scale: &[f32],
    offset: &[f32],
    xq: &[i8],
    xd: &[f32],
    xs: &[f32],
    run: impl Fn(*const u8, *const i8) -> int32x4_t,
) -> f32 {
    let n = u.len();
    debug_assert!(n.is_multiple_of(32) && xq.len() >= n && scale.len() >= n / RUN);
    debug_assert!(xd.len() >= n / RUN);
    // SAFETY (all loads): i + 64 <= n (32 in the tail), and the runs' arrays hold n / 16
    // values, as the caller promises.
    let sum = unsafe {
        let (u, xq, s, d) = (u.as_ptr(), xq.as_ptr(), scale.as_ptr(), xd.as_ptr());
        let p = |i: usize| vcvtq_f32_s32(run(u.add(i), xq.add(i)));
        let mut acc = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        while i + 64 <= n {
            let j = i / RUN;
            let sd = vmulq_f32(vld1q_f32(s.add(j)), vld1q_f32(d.add(j)));
            acc[0] = vfmaq_laneq_f32::<0>(acc[0], p(i), sd);
            acc[1] = vfmaq_laneq_f32::<1>(acc[1], p(i + 16), sd);
            acc[2] = vfmaq_laneq_f32::<2>(acc[2], p(i + 32), sd);
            acc[3] = vfmaq_laneq_f32::<3>(acc[3], p(i + 48), sd);
            i += 64;
        }
        if i < n {
            // One block of 32 left: two runs.
            let j = i / RUN;
            let sd = vmul_f32(vld1_f32(s.add(j)), vld1_f32(d.add(j)));
            acc[0] = vfmaq_lane_f32::<0>(acc[0], p(i), sd);
            acc[1] = vfmaq_lane_f32::<1>(acc[1], p(i + 16), sd);
        }
        vaddvq_f32(vaddq_f32(
            vaddq_f32(acc[0], acc[1]),
            vaddq_f32(acc[2], acc[3]),
        ))
    };
    sum + dot_f32(offset, xs)
}

/// `dot_codes` with i8mm's `usdot`: a run of 16 codes times activations in one instruction.
///
/// # Safety
/// The CPU must have NEON and i8mm, and `u.len()` must be a multiple of 32, the other slices
/// as `dot_codes` says.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon,i8mm")]
pub unsafe fn dot_codes_usdot(
    u: &[u8],
    scale: &[f32],
    offset: &[f32],
    xq: &[i8],
    xd: &[f32],
    xs: &[f32],
) -> f32 {
    use super::neon::usdot;
    // SAFETY: the caller's promises; each run reads 16 values at i < n.
    unsafe {
        dot_codes_runs(u, scale, offset, xq, xd, xs, |u, x| {
            usdot(vdupq_n_s32(0), vld1q_u8(u), vld1q_s8(x))
        })
    }
}

/// `dot_codes` with dotprod's `sdot`, which multiplies i8 by i8: the codes shifted to i8 (the
/// top bit flipped: u - 128), and the 128 they lost times the run's activations added back,
/// the activations' sum a second `sdot` against ones. Exact, as the others: u . x =
/// (u - 128) . x + 128 * (1 . x).
///
/// # Safety
/// The CPU must have NEON and dotprod, and `u.len()` must be a multiple of 32, the other
/// slices as `dot_codes` says.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn dot_codes_sdot(
    u: &[u8],
    scale: &[f32],
    offset: &[f32],
    xq: &[i8],
    xd: &[f32],
    xs: &[f32],
) -> f32 {
    use super::neon::sdot;
    let (flip, ones, zero) = (vdupq_n_u8(0x80), vdupq_n_s8(1), vdupq_n_s32(0));
    // SAFETY: the caller's promises; each run reads 16 values at i < n.
    unsafe {
        dot_codes_runs(u, scale, offset, xq, xd, xs, |u, x| {
            let x = vld1q_s8(x);
            let shifted = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(u), flip));
            let sum = sdot(zero, ones, x);
            vaddq_s32(sdot(zero, shifted, x), vshlq_n_s32::<7>(sum))
        })
    }
}

/// `dot_codes` on plain NEON: codes and activations widened to i16, where each product fits
/// (255 * -128 = -32640), multiplied 8 at a time, and neighbouring products added in pairs
/// into the four i32 lanes.
///
/// # Safety
/// The CPU must have NEON, and `u.len()` must be a multiple of 32, the other slices as
/// `dot_codes` says.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
pub unsafe fn dot_codes_neon(
    u: &[u8],
    scale: &[f32],
    offset: &[f32],
    xq: &[i8],
    xd: &[f32],
    xs: &[f32],
) -> f32 {
    // SAFETY: the caller's promises; each run reads 16 values at i < n.
    unsafe {
        dot_codes_runs(u, scale, offset, xq, xd, xs, |u, x| {
            let (u, x) = (vld1q_u8(u), vld1q_s8(x));
            let u_lo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(u)));
            let u_hi = vreinterpretq_s16_u16(vmovl_high_u8(u));
            let lo = vmulq_s16(u_lo, vmovl_s8(vget_low_s8(x)));
            let hi = vmulq_s16(u_hi, vmovl_high_s8(x));
            vpadalq_s16(vpaddlq_s16(lo), hi)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-2f32..2.0)).collect()
    }

    #[test]
    fn quantized_activations_stay_within_half_a_step() {
        let x = random(3 * 96, 1);
        let mut a = Q8Rows::default();
        a.quantize(&x, 96);
        for t in 0..3 {
            let (q, d, sums) = a.row(t);
            for (i, &xi) in x[t * 96..(t + 1) * 96].iter().enumerate() {
                let back = d[i / RUN] * q[i] as f32;
                assert!((back - xi).abs() <= 0.5 * d[i / RUN] + 1e-6, "{t} {i}");
            }
            for (j, &s) in sums.iter().enumerate() {
                let want: f32 = q[RUN * j..RUN * (j + 1)].iter().map(|&q| q as f32).sum();
                assert!((s - d[j] * want).abs() <= 1e-4 * (1.0 + s.abs()));
            }
        }
        // A block of zeros quantizes to zeros, not NaN.
        a.quantize(&[0.0; 32], 32);
        assert_eq!(a.row(0).1, &[0.0, 0.0]);
    }

    /// The integer dot product against the same sum done in f32 over the values the codes
    /// and the quantized activations stand for: equal to rounding.
    #[test]
    fn code_dot_products_match_f32_on_what_they_stand_for() {
        let mut rng = StdRng::seed_from_u64(2);
        for cols in [32, 64, 96, 576, 1536] {
            let u: Vec<u8> = (0..cols).map(|_| rng.random()).collect();
            let scale: Vec<f32> = (0..cols / RUN)
                .map(|_| rng.random_range(-0.1..0.1))
                .collect();
            let offset: Vec<f32> = (0..cols / RUN)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let mut a = Q8Rows::default();
            a.quantize(&random(cols, cols as u64), cols);
            let (xq, xd, xs) = a.row(0);
            let mut want = 0f64;
            for i in 0..cols {
                let w = scale[i / RUN] as f64 * u[i] as f64 + offset[i / RUN] as f64;
                want += w * xd[i / RUN] as f64 * xq[i] as f64;
            }
            let got = dot_codes(&u, &scale, &offset, xq, xd, xs);
            let tol = 1e-4 * (1.0 + want.abs());
            assert!((got as f64 - want).abs() < tol, "{cols}: {got} vs {want}");
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx512vl")
            {
                // SAFETY: the features are there; lengths as the function asks.
                let fast = unsafe { dot_codes_vnni(&u, &scale, &offset, xq, xd, xs) };
                assert!((fast as f64 - want).abs() < tol, "{cols}: {fast} vs {want}");
            }
            #[cfg(target_arch = "x86_64")]
            if crate::cpu::fast::cpu_features::Features::detect().avx2 {
                // SAFETY: the features are there; lengths as the function asks.
                let fast = unsafe { dot_codes_avx2(&u, &scale, &offset, xq, xd, xs) };
                assert!(
                    (fast as f64 - want).abs() < tol,
                    "avx2 {cols}: {fast} vs {want}"
                );
            }
            #[cfg(target_arch = "aarch64")]
            {
                use std::arch::is_aarch64_feature_detected as has;
                type Form = unsafe fn(&[u8], &[f32], &[f32], &[i8], &[f32], &[f32]) -> f32;
                let forms: [(&str, bool, Form); 3] = [
                    ("usdot", has!("i8mm"), dot_codes_usdot),
                    ("sdot", has!("dotprod"), dot_codes_sdot),
                    ("neon", has!("neon"), dot_codes_neon),
                ];
                for (name, _, form) in forms.into_iter().filter(|f| f.1) {
                    // SAFETY: the CPU has the form's features; lengths as the function asks.
                    let fast = unsafe { form(&u, &scale, &offset, xq, xd, xs) };
                    let msg = format!("{name}, {cols}: {fast} vs {want}");
                    assert!((fast as f64 - want).abs() < tol, "{msg}");
                }
            }
        }
    }
}
