//! The prefill's matmul: many tokens against one weight tile, in bf16 on AVX-512 BF16.
//!
//! A tile is 32 weight rows, unpacked once (`unpack::row_f32`), rounded to bf16 and laid out
//! pair-major, `[cols / 2, 32]` u32: element (p, r) holds row r's values 2p and 2p + 1, the
//! pair `vdpbf16ps` multiplies. The kernel then walks the pairs once for a group of T tokens:
//! per pair, two loads of 16 rows each and, per token, its pair broadcast and two
//! `vdpbf16ps` into 2T accumulators that stay in registers (T = 12: 24 of the 32). Each
//! accumulator lane is one (token, row) output: no horizontal sums. The tile is reused by
//! every token group, so unpacking costs once per row per pass, not per token.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Weight rows per tile: two registers of 16 f32 lanes.
pub const TILE_ROWS: usize = 32;

/// `x` (`[n, cols]` f32) as bf16 pairs (`[n, ceil(cols / 2)]` u32; an odd row's last pair
/// padded with zero), each value rounded to nearest, ties to even.
#[inline(always)]
pub fn to_bf16_pairs(out: &mut [u32], x: &[f32], cols: usize) {
    for (o, x) in out
        .chunks_exact_mut(cols.div_ceil(2))
        .zip(x.chunks_exact(cols))
    {
        let pairs = x.chunks_exact(2);
        let odd = pairs.remainder().first().map(|&v| bf16_bits(v));
        for (o, p) in o.iter_mut().zip(pairs) {
            *o = bf16_bits(p[0]) | (bf16_bits(p[1]) << 16);
        }
        if let Some(v) = odd {
            o[o.len() - 1] = v;
        }
    }
}

/// f32 to bf16 bits, nearest even (a NaN's payload may round to infinity: activations
/// are finite).
#[inline(always)]
fn bf16_bits(v: f32) -> u32 {
    let b = v.to_bits();
    (b.wrapping_add(0x7fff + ((b >> 16) & 1))) >> 16
}

/// Packs row `r` (of a tile, 0..32) from its f32 values into `tile` (`[cols / 2, 32]`).
#[inline(always)]
pub fn pack_row(tile: &mut [u32], r: usize, row: &[f32]) {
    for (p, v) in row.chunks_exact(2).enumerate() {
        tile[p * TILE_ROWS + r] = bf16_bits(v[0]) | (bf16_bits(v[1]) << 16);
    }
}

/// `out[t, r] = sum over pairs p of tile(p, r) . x(t, p)` for `n` tokens and the tile's
/// first `rows` rows.
///
/// - `tile`: `[pairs, 32]` u32 bf16 pairs
/// - `x`: `[n, pairs]` u32 bf16 pairs
/// - `out`: `[n, out_stride]`, written at columns `0..rows` of each row
///
/// # Safety
/// The CPU must have AVX-512 F and BF16; the pointers must span the shapes above.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn tile_matmul(
    tile: *const u32,
    pairs: usize,
    x: *const u32,
    n: usize,
    out: *mut f32,
    out_stride: usize,
    rows: usize,
) {
    // A token's row of `x` is its pairs.
    let x_stride = pairs;
    let mut t = 0;
    // SAFETY (every call): token groups stay below n; the caller's spans hold them.
    unsafe {
        while t + 12 <= n {
            tokens::<12>(
                tile,
                pairs,
                x.add(t * x_stride),
                x_stride,
                out.add(t * out_stride),
                out_stride,
                rows,
            );
            t += 12;
        }
        if t + 8 <= n {
            tokens::<8>(
                tile,
                pairs,
                x.add(t * x_stride),
                x_stride,
                out.add(t * out_stride),
                out_stride,
                rows,
            );
            t += 8;
        }
        if t + 4 <= n {
            tokens::<4>(
                tile,
                pairs,
                x.add(t * x_stride),
                x_stride,
                out.add(t * out_stride),
                out_stride,
                rows,
            );
            t += 4;
        }
        while t < n {
            tokens::<1>(
                tile,
                pairs,
                x.add(t * x_stride),
                x_stride,
                out.add(t * out_stride),
                out_stride,
                rows,
            );
            t += 1;
        }
    }
}

/// One group of `T` tokens against the tile (see `tile_matmul`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
unsafe fn tokens<const T: usize>(
    tile: *const u32,
    pairs: usize,
    x: *const u32,
    x_stride: usize,
    out: *mut f32,
    out_stride: usize,
    rows: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; T];
    for p in 0..pairs {
        // SAFETY: p < pairs; the tile holds 32 u32 per pair, x `pairs` per token.
        unsafe {
            let w0: __m512bh =
                std::mem::transmute(_mm512_loadu_si512(tile.add(p * TILE_ROWS).cast()));
            let w1: __m512bh =
                std::mem::transmute(_mm512_loadu_si512(tile.add(p * TILE_ROWS + 16).cast()));
            for (t, acc) in acc.iter_mut().enumerate() {
                let xb: __m512bh =
                    std::mem::transmute(_mm512_set1_epi32(*x.add(t * x_stride + p) as i32));
                acc[0] = _mm512_dpbf16_ps(acc[0], w0, xb);
                acc[1] = _mm512_dpbf16_ps(acc[1], w1, xb);
            }
        }
    }
    // Rows past `rows` (a last tile that is not full) are padding: not stored.
    let lo: __mmask16 = if rows >= 16 {
        0xffff
    } else {
        (1u32 << rows) as u16 - 1
    };
    let hi: __mmask16 = if rows >= 32 {
        0xffff
    } else if rows > 16 {
        (1u32 << (rows - 16)) as u16 - 1
    } else {
        0
    };
    for (t, acc) in acc.iter().enumerate() {
        // SAFETY: the masks keep the stores within the `rows` columns the caller owns.
        unsafe {
            _mm512_mask_storeu_ps(out.add(t * out_stride), lo, acc[0]);
            _mm512_mask_storeu_ps(out.add(t * out_stride + 16), hi, acc[1]);
        }
    }
}
