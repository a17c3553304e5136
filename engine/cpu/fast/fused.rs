//! The decode's dot products with the unpacking fused in, for the types model files mostly
//! hold (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K): each block's codes are made in a register
//! and go straight into `vpdpbusd`, never through memory as in the general path (`unpack`
//! then `dot::dot_codes_vnni`), which took the default model's decode 2 to 2.5 times as long
//! on this project's 2-core CPU (docs/lessons.md#the-cpu-fast-path). Same arithmetic as
//! there:
//!
//!   w . x = sum over runs of 16 j of scale[j] * xd[j] * (u . xq over run j)
//!         + sum over runs j of offset[j] * xs[j]
//!
//! with the codes u, scales and offsets of `unpack.rs` and the activations of `dot::Q8Rows`.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::dot::hsum;
use crate::weights::DType;

/// Whether `dot_tokens_vnni` has a kernel for `dtype`.
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

/// One token's quantized activations, as `dot::Q8Rows` gives them: `(xq, xd, xs, pairs)`:
/// `xq` `[cols]`, `xd` and `xs` `[cols / 16]` (`Q8Rows::row`), `pairs` `[cols / 32, 2]`
/// (`Q8Rows::pairs`).
pub type Q8Token<'a> = (&'a [i8], &'a [f32], &'a [f32], &'a [f32]);

/// One stored row against `T` tokens at once (a decode and the tokens guessed after it, or
/// a batch's decodes): each block's codes and scales are made once and go into every token's
/// product. Each token's sum is made by the same operations in the same order whatever `T`
/// is, so its result is bit for bit the one it gets alone: a guessed token's is its decode's.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and AVX-512 F, VL, BW, VNNI; `has_kernel(dtype)`; the
/// row must hold whole blocks of `dtype` for as many values as every token's activations
/// (`Act::cols`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
pub unsafe fn dot_tokens_vnni<const T: usize>(
    dtype: DType,
    row: &[u8],
    acts: &[Act; T],
) -> [f32; T] {
    let b = row.as_ptr();
    let n = acts[0].cols / dtype.block_len();
    debug_assert_eq!(row.len(), n * dtype.block_bytes());
    // SAFETY: the blocks and the activations span `cols` values (the caller's promise).
    unsafe {
        match dtype {
            DType::Q4_0 => tokens32(
                b,
                n,
                18,
                acts,
                |p| nibbles(p.add(2)),
                |p| scale_times(p, -8.0),
            ),
            DType::Q4_1 => tokens32(b, n, 20, acts, |p| nibbles(p.add(4)), |p| halves(p)),
            DType::Q5_0 => tokens32(
                b,
                n,
                22,
                acts,
                |p| fifth_bits(p.add(2), p.add(6)),
                |p| scale_times(p, -16.0),
            ),
            DType::Q5_1 => tokens32(
                b,
                n,
                24,
                acts,
                |p| fifth_bits(p.add(4), p.add(8)),
                |p| halves(p),
            ),
            DType::Q8_0 => {
                let flip = _mm256_set1_epi8(-128);
                let codes =
                    |p: *const u8| _mm256_xor_si256(_mm256_loadu_si256(p.add(2).cast()), flip);
                tokens32(b, n, 34, acts, codes, |p| scale_times(p, -128.0))
            }
            // The super-block types keep their one-token kernels: each token in turn.
            DType::Q4K => std::array::from_fn(|t| q4_k(b, n, &acts[t])),
            DType::Q6K => std::array::from_fn(|t| q6_k(b, n, &acts[t])),
            other => unreachable!("no fused kernel for {other}"),
        }
    }
}

/// The 32-value block types: one row's blocks against `T` tokens, `codes(b)` a block's
/// codes and `scale_offset(b)` its `[scale, offset, 0, 0]`, each made once a block; one
/// multiply turns it into `[scale * xd, offset * xsum]` against a token's activation block
/// pair: the first lane scales the block's product, the second adds up in a vector of its
/// own.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
unsafe fn tokens32<const T: usize>(
    b: *const u8,
    n: usize,
    bytes: usize,
    acts: &[Act; T],
    codes: impl Fn(*const u8) -> __m256i,
    scale_offset: impl Fn(*const u8) -> __m128,
) -> [f32; T] {
    unsafe {
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
                let p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), c, x);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcastss_ps(so), acc[t]);
                off[t] = _mm_add_ps(off[t], so);
            }
        }
        std::array::from_fn(|t| hsum(acc[t]) + _mm_cvtss_f32(_mm_movehdup_ps(off[t])))
    }
}

/// Pointers into one token's activations (`Q8Token`), made once for every row they meet.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub struct Act {
    /// Values in the row.
    pub(super) cols: usize,
    /// `[cols]` i8
    pub(super) q: *const i8,
    /// `[cols / 16]` the scale of each run
    pub(super) d: *const f32,
    /// `[cols / 16]` each run's sum
    pub(super) s: *const f32,
    /// `[cols / 32, 2]` each block's (scale, sum)
    pub(super) p: *const f32,
}

#[cfg(target_arch = "x86_64")]
impl Act {
    pub fn of((xq, xd, xs, pairs): Q8Token) -> Act {
        let cols = xq.len();
        assert!(xd.len() * 16 >= cols && xs.len() * 16 >= cols && pairs.len() * 16 >= cols);
        Act {
            cols,
            q: xq.as_ptr(),
            d: xd.as_ptr(),
            s: xs.as_ptr(),
            p: pairs.as_ptr(),
        }
    }
}

/// Sixteen bytes of nibbles as 32 codes in the order values are stored: low nibbles (values
/// 0..16), then high (16..32). The bytes go to both halves as they load; the high half is
/// shifted by 4 (a shift per 32-bit lane), and both masked: three instructions.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn nibbles(p: *const u8) -> __m256i {
    unsafe {
        let q = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
        let shifts = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
        _mm256_and_si256(_mm256_srlv_epi32(q, shifts), _mm256_set1_epi8(0x0f))
    }
}

/// The f16 at `p`, widened.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn half(p: *const u8) -> f32 {
    unsafe {
        let bits = (p as *const u16).read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }
}

/// `codes . xq` for the 32 values at `at`, as eight i32 lanes (four per run of 16).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
unsafe fn product(codes: __m256i, a: &Act, at: usize) -> __m256 {
    unsafe {
        let x = _mm256_loadu_si256(a.q.add(at).cast());
        _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), codes, x))
    }
}

/// `[d, k * d, 0, 0]` from the f16 d at `p`: d broadcast as it loads, widened, scaled.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn scale_times(p: *const u8, k: f32) -> __m128 {
    unsafe {
        let d = _mm_set1_epi16((p as *const i16).read_unaligned());
        _mm_mul_ps(_mm_cvtph_ps(d), _mm_setr_ps(1.0, k, 0.0, 0.0))
    }
}

/// `[d, m, 0, 0]` from the two f16 at `p`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn halves(p: *const u8) -> __m128 {
    unsafe { _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned())) }
}

/// Q5's codes: the nibbles at `q` with bit j of the u32 at `qh` as value j's fifth bit (the
/// u32 as a mask register: 16 added, as nibbles are below it, to the bytes it selects).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
unsafe fn fifth_bits(qh: *const u8, q: *const u8) -> __m256i {
    unsafe {
        let bits = (qh as *const u32).read_unaligned();
        let n = nibbles(q);
        _mm256_mask_add_epi8(n, bits, n, _mm256_set1_epi8(0x10))
    }
}

/// Whether `row_bf16` has a decoder for `dtype`: the 32-value block types.
pub fn has_bf16_decoder(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0
    )
}

/// A stored row as bf16 pairs for the prefill's tiles, with the decode's block decoders:
/// `out[p]` holds values 2p (low half) and 2p + 1, rounded to nearest even.
///
/// # Safety
/// The CPU must have the features below; `has_bf16_decoder(dtype)`; `row` whole blocks of
/// `dtype` and `out` half as many values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni,avx512bf16")]
pub unsafe fn row_bf16(dtype: DType, row: &[u8], out: &mut [u32]) {
    let n = row.len() / dtype.block_bytes();
    debug_assert!(out.len() * 2 >= n * 32);
    let (b, o) = (row.as_ptr(), out.as_mut_ptr());
    // SAFETY: n whole blocks in `row`, 16 pairs of `out` each (the caller's promise).
    unsafe {
        match dtype {
            DType::Q4_0 => {
                blocks_bf16(b, n, 18, o, |p| nibbles(p.add(2)), |p| scale_times(p, -8.0))
            }
            DType::Q4_1 => blocks_bf16(b, n, 20, o, |p| nibbles(p.add(4)), |p| halves(p)),
            DType::Q5_0 => blocks_bf16(
                b,
                n,
                22,
                o,
                |p| fifth_bits(p.add(2), p.add(6)),
                |p| scale_times(p, -16.0),
            ),
            DType::Q5_1 => blocks_bf16(
                b,
                n,
                24,
                o,
                |p| fifth_bits(p.add(4), p.add(8)),
                |p| halves(p),
            ),
            DType::Q8_0 => {
                let flip = _mm256_set1_epi8(-128);
                let codes =
                    |p: *const u8| _mm256_xor_si256(_mm256_loadu_si256(p.add(2).cast()), flip);
                blocks_bf16(b, n, 34, o, codes, |p| scale_times(p, -128.0))
            }
            other => unreachable!("no bf16 decoder for {other}"),
        }
    }
}

/// `n` blocks of 32: codes times scale plus offset, in f32, then rounded to 32 bf16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni,avx512bf16")]
#[inline]
unsafe fn blocks_bf16(
    b: *const u8,
    n: usize,
    bytes: usize,
    out: *mut u32,
    codes: impl Fn(*const u8) -> __m256i,
    scale_offset: impl Fn(*const u8) -> __m128,
) {
    unsafe {
        for i in 0..n {
            let blk = b.add(i * bytes);
            let c = codes(blk);
            let so = _mm512_castps128_ps512(scale_offset(blk));
            let s = _mm512_permutexvar_ps(_mm512_setzero_si512(), so);
            let o = _mm512_permutexvar_ps(_mm512_set1_epi32(1), so);
            let lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(c)));
            let hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256::<1>(c)));
            // Values 0..16 in the low half, 16..32 in the high.
            let bf = _mm512_cvtne2ps_pbh(_mm512_fmadd_ps(hi, s, o), _mm512_fmadd_ps(lo, s, o));
            _mm512_storeu_si512(
                out.add(16 * i).cast(),
                std::mem::transmute::<__m512bh, __m512i>(bf),
            );
        }
    }
}

/// Q4_K's eight 6-bit (scale, min) pairs (`unpack::k_scale_min`'s layout).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn k_scales(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 6) << 4);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
    (sc, m)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
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

/// A row of Q6_K blocks against one token. Each block's 16 scales are worked out at once in a
/// 512-bit register (d times each i8 scale, times the token's scale of each run for the
/// products, and its sums for the offset of 32 the codes carry), where a scalar pass a run of
/// 16 values was most of the kernel: 1.435 -> 0.663 ns a block of 32 in cache, Qwen3-30B-A3B's
/// decode on the CPU 1.2-1.4x (round 78). Not inlined: inlined into `dot_tokens_vnni` it slowed
/// that function's Q4_K arm by 14% (round 78).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline(never)]
unsafe fn q6_k(b: *const u8, n: usize, a: &Act) -> f32 {
    // Lanes 0-3 take run 2c of the block's half, lanes 4-7 run 2c + 1: the runs of chunk c
    // (of the 8 in a block, 32 values each) as `product`'s eight sums lie.
    const RUNS: [[i32; 16]; 8] = {
        let mut idx = [[0i32; 16]; 8];
        let mut c = 0;
        while c < 8 {
            let mut l = 0;
            while l < 8 {
                idx[c][l] = (2 * c + l / 4) as i32;
                l += 1;
            }
            c += 1;
        }
        idx
    };
    unsafe {
        let m4 = _mm256_set1_epi8(0x0f);
        let m2 = _mm256_set1_epi8(3);
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut off = _mm512_setzero_ps();
        for i in 0..n {
            let blk = b.add(210 * i);
            // The block's 16 runs at once: d times each run's i8 scale, times the
            // activations' scale of that run (for the products) and its sum (for the offset
            // of 32 the codes carry).
            let d = _mm512_set1_ps(half(blk.add(208)));
            let scales = _mm_loadu_si128(blk.add(192).cast());
            let ds = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(scales)));
            let sv = _mm512_mul_ps(ds, _mm512_loadu_ps(a.d.add(16 * i)));
            off = _mm512_fmadd_ps(ds, _mm512_loadu_ps(a.s.add(16 * i)), off);
            for h in 0..2 {
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
                    let c = 4 * h + k; // the chunk of the block: runs 2c and 2c + 1
                    let p = product(codes, a, 32 * (8 * i + c));
                    let idx = _mm512_loadu_si512(RUNS[c].as_ptr().cast());
                    let s = _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, sv));
                    if k % 2 == 0 {
                        acc0 = _mm256_fmadd_ps(p, s, acc0);
                    } else {
                        acc1 = _mm256_fmadd_ps(p, s, acc1);
                    }
                }
            }
        }
        hsum(_mm256_add_ps(acc0, acc1)) - 32.0 * _mm512_reduce_add_ps(off)
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
pub mod tests {
    use super::*;

    /// The bf16 decoders against the general path's f32 values rounded to bf16: equal, or
    /// one bf16 step apart where the fused multiply-add rounded the f32 differently.
    #[test]
    fn bf16_decoders_match_the_general_path() {
        use crate::cpu::fast::unpack::row_f32;
        if !crate::cpu::fast::cpu_features::Features::detect().bf16 {
            eprintln!("no AVX-512 BF16 here: the decoders are not run");
            return;
        }
        for dtype in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
        ] {
            let cols = 512;
            let m = crate::cpu::fast::unpack::tests::random_matrix(dtype, 2, cols, 4);
            let mut want = vec![0f32; cols];
            let (mut u, mut s, mut o) = (
                vec![0u8; cols],
                vec![0f32; cols / 16],
                vec![0f32; cols / 16],
            );
            let mut got = vec![0u32; cols / 2];
            for r in 0..2 {
                row_f32(&m, r, &mut want, &mut u, &mut s, &mut o);
                // SAFETY: the CPU has the features; the row is whole blocks of `cols` values.
                unsafe { row_bf16(dtype, m.row(r), &mut got) };
                for (i, &w) in want.iter().enumerate() {
                    let g = f32::from_bits((got[i / 2] >> (16 * (i % 2))) << 16);
                    let step = w.abs() / 128.0;
                    assert!(
                        (g - w).abs() <= step + 1e-30,
                        "{dtype} row {r} value {i}: {g} vs {w}"
                    );
                }
            }
        }
    }
    use crate::cpu::fast::dot::{Q8Rows, dot_codes};
    use crate::cpu::fast::unpack::tests::random_matrix;
    use crate::cpu::fast::unpack::{RUN, unpack_row};

    /// AVX-512 VNNI's fused kernels against the general path (`against_the_general_path`).
    #[test]
    fn fused_kernels_match_the_general_path() {
        if !crate::cpu::fast::cpu_features::Features::detect().vnni {
            eprintln!("no AVX-512 VNNI here: its fused kernels are not run");
            return;
        }
        let types = FUSED_TYPES.into_iter().filter(|&t| has_kernel(t));
        // SAFETY: the CPU has the features; the rows hold whole blocks (the driver's).
        against_the_general_path("vnni", types, |dtype, row, acts| unsafe {
            (
                dot_tokens_vnni(dtype, row, acts),
                dot_tokens_vnni(dtype, row, &[acts[2]]),
            )
        });
    }

    /// The types some fused kernel takes.
    pub const FUSED_TYPES: [DType; 7] = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4K,
        DType::Q6K,
    ];

    /// A fused kernel (`run(dtype, row, four tokens)`: the four tokens' sums, and the third
    /// token's alone) against the general path (codes in memory, portable dot product) on
    /// random blocks of each of `types` and activations: the same sums, to rounding; a token
    /// alone bit for bit as among four.
    pub fn against_the_general_path(
        kernel: &str,
        types: impl Iterator<Item = DType>,
        run: impl Fn(DType, &[u8], &[Act; 4]) -> ([f32; 4], [f32; 1]),
    ) {
        for dtype in types {
            for cols in [256, 768, 1536] {
                let m = random_matrix(dtype, 4, cols, cols as u64);
                // Four tokens of different activations against row 1.
                let x: Vec<f32> = (0..4 * cols)
                    .map(|i| ((i * 7919) % 201) as f32 / 50.0 - 2.0)
                    .collect();
                let mut a = Q8Rows::default();
                a.quantize(&x, cols);
                let token = |t: usize| {
                    let (xq, xd, xs) = a.row(t);
                    (xq, xd, xs, a.pairs(t))
                };
                let (mut u, mut s, mut o) = (
                    vec![0u8; cols],
                    vec![0f32; cols / RUN],
                    vec![0f32; cols / RUN],
                );
                unpack_row(&m, 1, &mut u, &mut s, &mut o);
                let acts: [Act; 4] = std::array::from_fn(|t| Act::of(token(t)));
                let (four, one) = run(dtype, m.row(1), &acts);
                for (t, &got) in four.iter().enumerate() {
                    let (xq, xd, xs) = a.row(t);
                    let want = dot_codes(&u, &s, &o, xq, xd, xs);
                    let tol = 1e-4 * (1.0 + want.abs()) + 1e-5 * cols as f32;
                    assert!(
                        (got - want).abs() < tol,
                        "{kernel} {dtype} {cols} token {t}: {got} vs {want}"
                    );
                }
                assert_eq!(
                    one[0].to_bits(),
                    four[2].to_bits(),
                    "{kernel} {dtype}: a token alone as among four"
                );
            }
        }
    }
}

/// Not a test: the fused kernels' speed on weights that stay in the core's cache (576 rows of
/// 1536), one token at a time and four through each row (a decode and three
/// guesses), so that kernel changes can be compared on a machine whose memory other work is
/// using. `cargo test --release -- --ignored --nocapture fused_speed`.
#[cfg(all(test, target_arch = "x86_64"))]
mod speed {
    use super::*;
    use crate::cpu::fast::dot::Q8Rows;
    use crate::cpu::fast::unpack::tests::random_matrix;

    #[test]
    #[ignore]
    fn fused_speed() {
        if !crate::cpu::fast::cpu_features::Features::detect().vnni {
            return;
        }
        // RUSTLE_SPEED_ROWS=49152: a matrix as large as the default model's head, out of cache.
        let rows: usize = std::env::var("RUSTLE_SPEED_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(576);
        // Whole super-blocks for the k-quants: 1536 values (a Llama-3.2-1B-sized row).
        let cols = 1536;
        let x: Vec<f32> = (0..4 * cols)
            .map(|i| ((i * 7919) % 201) as f32 / 50.0 - 2.0)
            .collect();
        let mut a = Q8Rows::default();
        a.quantize(&x, cols);
        let token = |t: usize| {
            let (xq, xd, xs) = a.row(t);
            (xq, xd, xs, a.pairs(t))
        };
        let acts: [Act; 4] = std::array::from_fn(|t| Act::of(token(t)));
        for dtype in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q8_0,
            DType::Q4K,
            DType::Q6K,
        ] {
            let m = random_matrix(dtype, rows, cols, 3);
            let mut sink = 0f32;
            let reps = (40 * 576 / rows).max(2);
            let t = std::time::Instant::now();
            for _ in 0..reps {
                for r in 0..rows {
                    for &a in &acts {
                        // SAFETY: the CPU has the features; rows hold `cols` values.
                        sink += unsafe { dot_tokens_vnni(dtype, m.row(r), &[a])[0] };
                    }
                }
            }
            let per = (reps * rows * cols / 32 * 4) as f64;
            let one = t.elapsed().as_secs_f64() * 1e9 / per;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                for r in 0..rows {
                    // SAFETY: as above.
                    let y = unsafe { dot_tokens_vnni(dtype, m.row(r), &acts) };
                    sink += y.iter().sum::<f32>();
                }
            }
            let four = t.elapsed().as_secs_f64() * 1e9 / per;
            eprintln!(
                "{dtype}: ns per block of 32 and token, one token a row {one:.3}, four {four:.3} ({sink:.0})"
            );
        }
    }
}
