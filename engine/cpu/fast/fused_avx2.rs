//! The fused decode kernels of `fused.rs` for CPUs with AVX2 but no AVX-512: most desktop and
//! laptop x86 chips (every AMD core before Zen 4, Intel's client cores since Alder Lake). The
//! same arithmetic, the same data; only the integer product changes. Without `vpdpbusd`, a
//! block's 32 codes times 32 activations is two instructions:
//!
//!   `vpmaddubsw`: u8 codes times i8 activations, adjacent pairs added into i16 lanes
//!   `vpmaddwd` by ones: adjacent i16 pairs added into i32 lanes
//!
//! which leaves the same eight i32 lanes (four products each) as `vpdpbusd` would. The i16
//! step saturates past 32767, so the codes must be small: 4- and 5-bit codes give at most
//! 2 * 31 * 127. Q8_0's codes are whole bytes, so its product is taken signed instead, as
//! |q| times x with q's sign moved onto x (`vpsignb`): at most 2 * 128 * 127, since the
//! activations never reach -128 (`dot::quantize_block` rounds into -127..=127); its offset
//! is then zero. Every sum is exact in integers; the f32 work is `fused.rs`'s.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::dot::hsum;
#[cfg(target_arch = "x86_64")]
use super::fused::{Act, half, halves, k_scales, nibbles, scale_times};
use crate::weights::DType;

/// Whether `dot_tokens_avx2` has a kernel for `dtype`: `fused::dot_tokens_vnni`'s types.
/// The others take the general path (codes in memory, `dot::dot_codes_avx2`).
pub fn has_kernel(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q4K
            | DType::Q6K
    )
}

/// `fused::dot_tokens_vnni` on AVX2: one stored row against `T` tokens, each block's codes
/// and scales made once for all of them; each token's sum made by the same operations in
/// the same order whatever `T` is (a guessed token's is its decode's, bit for bit).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `has_kernel(dtype)`; the row must hold whole
/// blocks of `dtype` for as many values as every token's activations.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub unsafe fn dot_tokens_avx2<const T: usize>(
    dtype: DType,
    row: &[u8],
    acts: &[Act; T],
) -> [f32; T] {
    let b = row.as_ptr();
    let n = acts[0].cols / dtype.block_len();
    debug_assert_eq!(row.len(), n * dtype.block_bytes());
    // Codes of at most 5 bits: `vpmaddubsw` cannot saturate.
    let small = |c: __m256i, x: __m256i| _mm256_maddubs_epi16(c, x);
    // SAFETY: the blocks and the activations span `cols` values (the caller's promise).
    unsafe {
        match dtype {
            DType::Q4_0 => tokens32(
                b,
                n,
                18,
                acts,
                |p| nibbles(p.add(2)),
                small,
                |p| scale_times(p, -8.0),
            ),
            DType::Q4_1 => tokens32(b, n, 20, acts, |p| nibbles(p.add(4)), small, |p| halves(p)),
            DType::Q5_0 => tokens32(
                b,
                n,
                22,
                acts,
                |p| fifth_bits(p.add(2), p.add(6)),
                small,
                |p| scale_times(p, -16.0),
            ),
            DType::Q5_1 => tokens32(
                b,
                n,
                24,
                acts,
                |p| fifth_bits(p.add(4), p.add(8)),
                small,
                |p| halves(p),
            ),
            DType::Q8_0 => {
                // The i8 codes as they are stored; |q| times x carrying q's sign.
                let codes = |p: *const u8| _mm256_loadu_si256(p.add(2).cast());
                let signed = |q: __m256i, x: __m256i| {
                    _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q))
                };
                tokens32(b, n, 34, acts, codes, signed, |p| scale_times(p, 0.0))
            }
            // The super-block types keep their one-token kernels: each token in turn.
            DType::Q4K => std::array::from_fn(|t| q4_k(b, n, &acts[t])),
            DType::Q6K => std::array::from_fn(|t| q6_k(b, n, &acts[t])),
            other => unreachable!("no AVX2 fused kernel for {other}"),
        }
    }
}

/// `fused::tokens32` with the product in two steps: `pairs(codes, x)` the i16 sums of
/// adjacent products, which one `vpmaddwd` by ones adds into `vpdpbusd`'s i32 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tokens32<const T: usize>(
    b: *const u8,
    n: usize,
    bytes: usize,
    acts: &[Act; T],
    codes: impl Fn(*const u8) -> __m256i,
    pairs: impl Fn(__m256i, __m256i) -> __m256i,
    scale_offset: impl Fn(*const u8) -> __m128,
) -> [f32; T] {
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); T];
        let mut off = [_mm_setzero_ps(); T];
        for i in 0..n {
            let blk = b.add(i * bytes);
            let c = codes(blk);
            let s = scale_offset(blk);
            for t in 0..T {
                let x = _mm256_loadu_si256(acts[t].q.add(32 * i).cast());
                let pair = _mm_castpd_ps(_mm_load_sd(acts[t].p.add(2 * i).cast()));
                let so = _mm_mul_ps(s, pair);
                let p = _mm256_madd_epi16(pairs(c, x), ones);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcastss_ps(so), acc[t]);
                off[t] = _mm_add_ps(off[t], so);
            }
        }
        std::array::from_fn(|t| hsum(acc[t]) + _mm_cvtss_f32(_mm_movehdup_ps(off[t])))
    }
}

/// `codes . xq` for the 32 values at `at`, as `vpdpbusd`'s eight i32 lanes (four products
/// each), the codes at most 6 bits (`vpmaddubsw` cannot saturate).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn product(codes: __m256i, a: &Act, at: usize) -> __m256 {
    unsafe {
        let x = _mm256_loadu_si256(a.q.add(at).cast());
        let pairs = _mm256_maddubs_epi16(codes, x);
        _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    }
}

/// `fused::q4_k` on AVX2: a row of Q4_K blocks against one token.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k(b: *const u8, n: usize, a: &Act) -> f32 {
    unsafe {
        let mask = _mm256_set1_epi8(0x0f);
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut off = 0f32;
        for i in 0..n {
            let blk = b.add(144 * i);
            let (d, dmin) = (half(blk), half(blk.add(2)));
            let (sc, m) = k_scales(&*(blk.add(4) as *const [u8; 12]));
            // Each 32-byte run of q: sub-block 2c in its low nibbles, 2c + 1 in its high.
            for c in 0..4 {
                let q = _mm256_loadu_si256(blk.add(16 + 32 * c).cast());
                let lo = _mm256_and_si256(q, mask);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
                let (j0, j1) = (8 * i + 2 * c, 8 * i + 2 * c + 1); // sub-blocks of the row
                let p0 = product(lo, a, 32 * j0);
                let p1 = product(hi, a, 32 * j1);
                let s0 = d * sc[2 * c] as f32 * *a.d.add(2 * j0);
                let s1 = d * sc[2 * c + 1] as f32 * *a.d.add(2 * j1);
                acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(s0), acc0);
                acc1 = _mm256_fmadd_ps(p1, _mm256_set1_ps(s1), acc1);
                off -= dmin
                    * (m[2 * c] as f32 * (*a.s.add(2 * j0) + *a.s.add(2 * j0 + 1))
                        + m[2 * c + 1] as f32 * (*a.s.add(2 * j1) + *a.s.add(2 * j1 + 1)));
            }
        }
        hsum(_mm256_add_ps(acc0, acc1)) + off
    }
}

/// `fused::q6_k` on AVX2: a row of Q6_K blocks against one token, each block's 16 scales
/// worked out at once in two 256-bit registers (runs 0-7, 8-15). Not inlined, as the AVX-512
/// form (round 78).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
unsafe fn q6_k(b: *const u8, n: usize, a: &Act) -> f32 {
    unsafe {
        let m4 = _mm256_set1_epi8(0x0f);
        let m2 = _mm256_set1_epi8(3);
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let (mut off_lo, mut off_hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in 0..n {
            let blk = b.add(210 * i);
            // d times each run's i8 scale, times the activations' scale of that run (for the
            // products) and its sum (for the offset of 32 the codes carry): runs 0-7, 8-15.
            let d = _mm256_set1_ps(half(blk.add(208)));
            let scales = _mm_loadu_si128(blk.add(192).cast());
            let ds_lo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scales)));
            let ds_hi = _mm256_mul_ps(
                d,
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(scales))),
            );
            let sv = [
                _mm256_mul_ps(ds_lo, _mm256_loadu_ps(a.d.add(16 * i))),
                _mm256_mul_ps(ds_hi, _mm256_loadu_ps(a.d.add(16 * i + 8))),
            ];
            off_lo = _mm256_fmadd_ps(ds_lo, _mm256_loadu_ps(a.s.add(16 * i)), off_lo);
            off_hi = _mm256_fmadd_ps(ds_hi, _mm256_loadu_ps(a.s.add(16 * i + 8)), off_hi);
            for (h, &sv) in sv.iter().enumerate() {
                // Value l + 32k of this half: nibble k / 2 of ql[l + 32 (k % 2)], bits
                // 2k..2k+2 of qh[l]; runs of 16 each with its own i8 scale.
                let ql0 = _mm256_loadu_si256(blk.add(64 * h).cast());
                let ql1 = _mm256_loadu_si256(blk.add(64 * h + 32).cast());
                let qh = _mm256_loadu_si256(blk.add(128 + 32 * h).cast());
                let high = |shift: i32| {
                    let v = match shift {
                        0 => qh,
                        2 => _mm256_srli_epi16(qh, 2),
                        4 => _mm256_srli_epi16(qh, 4),
                        _ => _mm256_srli_epi16(qh, 6),
                    };
                    _mm256_slli_epi16(_mm256_and_si256(v, m2), 4)
                };
                let codes = [
                    _mm256_or_si256(_mm256_and_si256(ql0, m4), high(0)),
                    _mm256_or_si256(_mm256_and_si256(ql1, m4), high(2)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), high(4)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), high(6)),
                ];
                for (k, &codes) in codes.iter().enumerate() {
                    // Chunk 4h + k of the block: runs 2k and 2k + 1 of this half's eight,
                    // lanes 0-3 and 4-7 of the product.
                    let p = product(codes, a, 32 * (8 * i + 4 * h + k));
                    let r = 2 * k as i32;
                    let idx = _mm256_setr_epi32(r, r, r, r, r + 1, r + 1, r + 1, r + 1);
                    let s = _mm256_permutevar8x32_ps(sv, idx);
                    if k % 2 == 0 {
                        acc0 = _mm256_fmadd_ps(p, s, acc0);
                    } else {
                        acc1 = _mm256_fmadd_ps(p, s, acc1);
                    }
                }
            }
        }
        hsum(_mm256_add_ps(acc0, acc1)) - 32.0 * hsum(_mm256_add_ps(off_lo, off_hi))
    }
}

/// Q5's codes without AVX-512's byte masks: bit j of the u32 at `qh` spread to byte j (each
/// byte takes the u32's byte j / 8, keeps bit j % 8, and becomes 16 where it is set), added
/// to the nibbles at `q`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn fifth_bits(qh: *const u8, q: *const u8) -> __m256i {
    unsafe {
        let bits = _mm256_set1_epi32((qh as *const i32).read_unaligned());
        // Bytes 0..16 (the low 128-bit lane) read the u32's bytes 0 and 1, 16..32 bytes 2 and 3.
        let spread = _mm256_shuffle_epi8(
            bits,
            _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                3, 3, 3, 3,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_add_epi8(nibbles(q), _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::cpu::fast::fused::tests::{FUSED_TYPES, against_the_general_path};

    /// The AVX2 kernels against the general path, Q5's spread bits and Q8_0's signed
    /// product among them.
    #[test]
    fn fused_kernels_match_the_general_path() {
        if !crate::cpu::fast::cpu_features::Features::detect().avx2 {
            eprintln!("no AVX2 here: its fused kernels are not run");
            return;
        }
        let types = FUSED_TYPES.into_iter().filter(|&t| has_kernel(t));
        // SAFETY: the CPU has AVX2, FMA and F16C; the rows hold whole blocks (the driver's).
        against_the_general_path("avx2", types, |dtype, row, acts| unsafe {
            (
                dot_tokens_avx2(dtype, row, acts),
                dot_tokens_avx2(dtype, row, &[acts[2]]),
            )
        });
    }
}
