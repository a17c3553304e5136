//! Every quantized block type in one form the kernels share: a row becomes unsigned 8-bit
//! codes `u` and, per run of 16 values, a scale and an offset, with
//!
//!   value[i] = scale[i / 16] * u[i] + offset[i / 16]
//!
//! So one integer dot product (u8 codes against i8 activations, `dot.rs`) serves every type:
//! a signed type is shifted to unsigned and the shift moved into the offset (Q4_0's
//! `nibble - 8` is u = nibble, offset = -8d; Q8_0's i8 is u = q + 128, offset = -128d), and a
//! type whose sub-blocks are 32 long repeats its scale for both runs of 16. The block layouts
//! are GGML's, as `weights::dequant` and `dequant_k` describe them.
//!
//! The functions are plain Rust over fixed-size runs so that the compiler vectorizes them
//! inside the kernels' `#[target_feature]` functions, which inline them.

use half::f16;

use super::weights::Matrix;
use crate::weights::DType;

/// Values per scale/offset pair.
pub const RUN: usize = 16;

/// Whether `dtype` is a block quantization (unpacked to codes) rather than a float type.
pub fn is_quantized(dtype: DType) -> bool {
    !matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Row `r` of a quantized `m` as codes `[cols]`, scales and offsets `[cols / 16]`.
#[inline(always)]
pub fn unpack_row(m: &Matrix, r: usize, u: &mut [u8], scale: &mut [f32], offset: &mut [f32]) {
    let row = m.row(r);
    let (bl, bb) = (m.dtype.block_len(), m.dtype.block_bytes());
    let runs = bl / RUN;
    let blocks = row.chunks_exact(bb).zip(u.chunks_exact_mut(bl)).zip(
        scale
            .chunks_exact_mut(runs)
            .zip(offset.chunks_exact_mut(runs)),
    );
    macro_rules! each {
        ($f:expr) => {
            for ((b, u), (s, o)) in blocks {
                $f(b, u, s, o)
            }
        };
    }
    match m.dtype {
        DType::Q4_0 => each!(q4_0),
        DType::Q4_1 => each!(q4_1),
        DType::Q5_0 => each!(q5_0),
        DType::Q5_1 => each!(q5_1),
        DType::Q8_0 => each!(q8_0),
        DType::IQ4NL => each!(iq4_nl),
        DType::IQ4XS => each!(iq4_xs),
        DType::Q2K => each!(q2_k),
        DType::Q3K => each!(q3_k),
        DType::Q4K => each!(q4_k),
        DType::Q5K => each!(q5_k),
        DType::Q6K => each!(q6_k),
        other => unreachable!("{other} is not a block quantization"),
    }
}

/// Row `r` of `m`, any type, as f32 `[cols]`. `u`, `scale`, `offset`: scratch of
/// `unpack_row`'s sizes (unused for float types).
#[inline(always)]
pub fn row_f32(
    m: &Matrix,
    r: usize,
    out: &mut [f32],
    u: &mut [u8],
    scale: &mut [f32],
    offset: &mut [f32],
) {
    let row = m.row(r);
    match m.dtype {
        DType::F32 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::BF16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
            }
        }
        DType::F16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        _ => {
            unpack_row(m, r, u, scale, offset);
            codes_to_f32(out, u, scale, offset);
        }
    }
}

/// `out[i] = scale[i / 16] * u[i] + offset[i / 16]`
#[inline(always)]
pub fn codes_to_f32(out: &mut [f32], u: &[u8], scale: &[f32], offset: &[f32]) {
    for (((o, u), &s), &m) in out
        .chunks_exact_mut(RUN)
        .zip(u.chunks_exact(RUN))
        .zip(scale)
        .zip(offset)
    {
        for (o, &u) in o.iter_mut().zip(u) {
            *o = s * u as f32 + m;
        }
    }
}

/// Sixteen bytes of nibbles to 32 codes: value j is byte j's low nibble, value j + 16 its
/// high nibble.
#[inline(always)]
fn nibbles(q: &[u8], u: &mut [u8]) {
    let (lo, hi) = u.split_at_mut(16);
    for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&q[..16]) {
        *l = q & 0x0f;
        *h = q >> 4;
    }
}

/// Nibbles plus a fifth bit per value, bit j of `qh` (a little-endian u32) for value j.
#[inline(always)]
fn five_bits(qh: &[u8], q: &[u8], u: &mut [u8]) {
    nibbles(q, u);
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    for (j, u) in u.iter_mut().enumerate().take(32) {
        *u |= (((qh >> j) & 1) as u8) << 4;
    }
}

#[inline(always)]
fn fill(s: &mut [f32], o: &mut [f32], scale: f32, offset: f32) {
    s.fill(scale);
    o.fill(offset);
}

#[inline(always)]
fn q4_0(b: &[u8], u: &mut [u8], s: &mut [f32], o: &mut [f32]) {
    let d = f16_at(b, 0);
    nibbles(&b[2..18], u);
    fill(s, o, d, -8.0 * d);
}

#[inline(always)]
fn q4_1(b: &[u8], u: &mut [u8], s: &mut [f32], o: &mut [f32]) {
    nibbles(&b[4..20], u);
    fill(s, o, f16_at(b, 0), f16_at(b, 2));
}

#[inline(always)]
fn q5_0(b: &[u8], u: &mut [u8], s: &mut [f32], o: &mut [f32]) {
    let d = f16_at(b, 0);
    five_bits(&b[2..6], &b[6..22], u);
    fill(s, o, d, -16.0 * d);
}

#[inline(always)]
fn q5_1(b: &[u8], u: &mut [u8], s: &mut [f32], o: &mut [f32]) {
    five_bits(&b[4..8], &b[8..24], u);
    fill(s, o, f16_at(b, 0), f16_at(b, 2));
}

#[inline(always)]
fn q8_0(b: &[u8], u: &mut [u8], s: &mut [f32], o: &mut [f32]) {
    let d = f16_at(b, 0);
    // i8 + 128 as u8 is the i8's bits with the top one flipped.
    for (u, &q) in u.iter_mut().zip(&b[2..34]) {
        *u = q ^ 0x80;
    }
    fill(s, o, d, -128.0 * d);
}

/// IQ4's sixteen levels (`weights::dequant`'s table), each plus 128 as a code.
const IQ4_CODES: [u8; 16] = {
    let levels: [i8; 16] = [
        -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
    ];
    let mut c = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        c[i] = (levels[i] as i16 + 128) as u8;
        i += 1;
    }
    c
};

#[inline(always)]
fn iq4_run(q: &[u8], u: &mut [u8]) {
    nibbles(q, u);
    for u in u.iter_mut().take(32) {
        *u = IQ4_CODES[*u as usize];
    }
}

#[inline(always)]
fn iq4_nl(b: &[u8], u: &mut [u8], s: &mut [f32], o: &mut [f32]) {
    let d = f16_at(b, 0);
    iq4_run(&b[2..18], u);
    fill(s, o, d, -128.0 * d);
}

#[inline(always)]
fn iq4_xs(b: &[u8], u: &mut [u8], s: &mut [f32], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let (scales_l, q) = (&b[4..8], &b[8..136]);
    for sub in 0..8 {
        let low = (scales_l[sub / 2] >> (4 * (sub % 2))) & 0x0f;
        let high = ((scales_h >> (2 * sub)) & 3) as u8;
        let ds = d * ((low | (high << 4)) as i32 - 32) as f32;
        iq4_run(&q[16 * sub..16 * sub + 16], &mut u[32 * sub..32 * sub + 32]);
        fill(
            &mut s[2 * sub..2 * sub + 2],
            &mut o[2 * sub..2 * sub + 2],
            ds,
            -128.0 * ds,
        );
    }
}

/// Q2_K's and Q3_K's 2-bit planes: value `128h + 32k + l` is bits `2k..2k+2` of
/// `q[32h + l]`.
#[inline(always)]
fn two_bit_planes(q: &[u8], u: &mut [u8]) {
    for h in 0..2 {
        for k in 0..4 {
            let run = &mut u[128 * h + 32 * k..128 * h + 32 * k + 32];
            for (u, &q) in run.iter_mut().zip(&q[32 * h..32 * h + 32]) {
                *u = (q >> (2 * k)) & 3;
            }
        }
    }
}

#[inline(always)]
fn q2_k(b: &[u8], u: &mut [u8], s: &mut [f32], o: &mut [f32]) {
    let (scales, q) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    two_bit_planes(q, u);
    for (j, &sc) in scales.iter().enumerate() {
        s[j] = d * (sc & 0x0f) as f32;
        o[j] = -dmin * (sc >> 4) as f32;
    }
}

#[inline(always)]
fn q3_k(b: &[u8], u: &mut [u8], s: &mut [f32], o: &mut [f32]) {
    let (hmask, q, scales) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    two_bit_planes(q, u);
    // The third bit of value i is bit i / 32 of hmask[i % 32]; set means q = low part,
    // clear means low part - 4: as a code, low part + 4 * bit, offset -4.
    for k in 0..8 {
        for (l, u) in u[32 * k..32 * k + 32].iter_mut().enumerate() {
            *u |= ((hmask[l] >> k) & 1) << 2;
        }
    }
    for j in 0..16 {
        let low = (scales[j % 8] >> (4 * (j / 8))) & 0x0f;
        let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
        let ds = d * ((low | (high << 4)) as i32 - 32) as f32;
        s[j] = ds;
        o[j] = -4.0 * ds;
    }
}

/// Q4_K's and Q5_K's eight 6-bit scales and mins in 12 bytes (`dequant_k`'s layout).
#[inline(always)]
fn k_scale_min(j: usize, s: &[u8]) -> (f32, f32) {
    if j < 4 {
        ((s[j] & 63) as f32, (s[j + 4] & 63) as f32)
    } else {
        let sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        let m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        (sc as f32, m as f32)
    }
}

#[inline(always)]
fn q4_k(b: &[u8], u: &mut [u8], s: &mut [f32], o: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, q) = (&b[4..16], &b[16..144]);
    // Each 32-byte run of q holds two sub-blocks of 32: the low nibbles, then the high.
    for c in 0..4 {
        let (lo, hi) = u[64 * c..64 * c + 64].split_at_mut(32);
        for ((l, h), &q) in lo
            .iter_mut()
            .zip(hi.iter_mut())
            .zip(&q[32 * c..32 * c + 32])
        {
            *l = q & 0x0f;
            *h = q >> 4;
        }
    }
    for sub in 0..8 {
        let (sc, m) = k_scale_min(sub, scales);
        fill(
            &mut s[2 * sub..2 * sub + 2],
            &mut o[2 * sub..2 * sub + 2],
            d * sc,
            -dmin * m,
        );
    }
}

#[inline(always)]
fn q5_k(b: &[u8], u: &mut [u8], s: &mut [f32], o: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qh, q) = (&b[4..16], &b[16..48], &b[48..176]);
    for c in 0..4 {
        let (lo, hi) = u[64 * c..64 * c + 64].split_at_mut(32);
        let runs = lo
            .iter_mut()
            .zip(hi.iter_mut())
            .zip(&q[32 * c..32 * c + 32]);
        for (l, ((lo, hi), &q)) in runs.enumerate() {
            *lo = (q & 0x0f) | (((qh[l] >> (2 * c)) & 1) << 4);
            *hi = (q >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
        }
    }
    for sub in 0..8 {
        let (sc, m) = k_scale_min(sub, scales);
        fill(
            &mut s[2 * sub..2 * sub + 2],
            &mut o[2 * sub..2 * sub + 2],
            d * sc,
            -dmin * m,
        );
    }
}

#[inline(always)]
fn q6_k(b: &[u8], u: &mut [u8], s: &mut [f32], o: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    // Two halves of 128; in each, value l + 32k takes nibble k / 2 of ql[l + 32 (k % 2)] and
    // bits 2k..2k+2 of qh[l]; codes 0..64, offset -32.
    for h in 0..2 {
        let (ql, qh) = (&ql[64 * h..64 * h + 64], &qh[32 * h..32 * h + 32]);
        let u = &mut u[128 * h..128 * h + 128];
        for l in 0..32 {
            u[l] = (ql[l] & 0x0f) | ((qh[l] & 3) << 4);
            u[l + 32] = (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4);
            u[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            u[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    for (j, &sc) in scales.iter().enumerate() {
        let ds = d * sc as i8 as f32;
        s[j] = ds;
        o[j] = -32.0 * ds;
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::weights::dequant::to_f32;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    /// Random bytes for `rows` rows of `cols` values of `dtype`, with every f16 scale field
    /// replaced by a small finite value (random bits would hold infinities and NaNs).
    pub fn random_matrix(dtype: DType, rows: usize, cols: usize, seed: u64) -> Matrix {
        let mut rng = StdRng::seed_from_u64(seed);
        let bb = dtype.block_bytes();
        let n_blocks = rows * cols / dtype.block_len();
        let mut bytes: Vec<u8> = (0..n_blocks * bb).map(|_| rng.random()).collect();
        // Byte offsets of each block's f16 fields.
        let halves: &[usize] = match dtype {
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4NL | DType::IQ4XS => &[0],
            DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => &[0, 2],
            DType::Q2K => &[80, 82],
            DType::Q3K => &[108],
            DType::Q6K => &[208],
            DType::F16 => &[0],
            DType::BF16 | DType::F32 => &[],
            other => panic!("{other}"),
        };
        for block in bytes.chunks_exact_mut(bb) {
            for &at in halves {
                let v = rng.random_range(-0.05f32..0.05);
                let bits = match dtype {
                    DType::F16 => f16::from_f32(v * 20.0).to_le_bytes(),
                    _ => f16::from_f32(v).to_le_bytes(),
                };
                block[at..at + 2].copy_from_slice(&bits);
            }
            if dtype == DType::BF16 {
                let v = rng.random_range(-1f32..1.0);
                block.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
            }
            if dtype == DType::F32 {
                let v = rng.random_range(-1f32..1.0);
                block.copy_from_slice(&v.to_le_bytes());
            }
        }
        Matrix::new("test", dtype, rows, cols, bytes).unwrap()
    }

    pub const TYPES: [DType; 15] = DType::LOADABLE;

    #[test]
    fn every_type_unpacks_to_the_reference_dequantization() {
        for dtype in TYPES {
            let cols = 512;
            let m = random_matrix(dtype, 3, cols, 7);
            let want = to_f32(dtype, &m.bytes, 3 * cols).unwrap();
            let mut out = vec![f32::NAN; cols];
            let (mut u, mut s, mut o) = (vec![0; cols], vec![0.0; cols / 16], vec![0.0; cols / 16]);
            for r in 0..3 {
                row_f32(&m, r, &mut out, &mut u, &mut s, &mut o);
                for (i, (&got, &want)) in out.iter().zip(&want[r * cols..]).enumerate() {
                    // Codes times scale plus offset round differently from the reference's
                    // own order: a few ulps of the block's scale.
                    let tol = 1e-5 * (1.0 + want.abs());
                    assert!(
                        (got - want).abs() <= tol,
                        "{dtype} row {r} value {i}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
