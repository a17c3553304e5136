//! Turning stored weights into f32: the plain float types and GGUF's block quantizations.
//!
//! Each quantized format stores a block of values as small integers plus one or two scales.
//! The layouts are GGML's (little-endian, blocks back to back along a row); the k-quants
//! (Q2_K to Q6_K) are in `dequant_k.rs`, the rest here:
//! - Q8_0 (32 values, 34 bytes): `d: f16, q: [i8; 32]`;  x = d * q
//! - Q4_0 (32 values, 18 bytes): `d: f16, q: [u8; 16]`;  x = d * (nibble - 8)
//! - Q4_1 (32 values, 20 bytes): `d: f16, m: f16, q: [u8; 16]`;  x = d * nibble + m
//!   (in both 4-bit types byte j holds value j in its low nibble and value j + 16 in its high)
//! - Q5_0 (32 values, 22 bytes): `d: f16, qh: [u8; 4], q: [u8; 16]`;  x = d * (q - 16), the
//!   low four bits of q in nibbles as Q4_0, the fifth of value j in bit j of qh (a u32)
//! - Q5_1 (32 values, 24 bytes): `d: f16, m: f16, qh: [u8; 4], q: [u8; 16]`;  x = d * q + m
//! - IQ4_NL (32 values, 18 bytes): `d: f16, q: [u8; 16]`, nibbles as Q4_0;
//!   x = d * LEVELS[nibble], sixteen fixed levels that crowd near zero as weights do
//! - IQ4_XS (256 values, 136 bytes): `d: f16, scales_h: u16, scales_l: [u8; 4], q: [u8; 128]`:
//!   eight sub-blocks of 32, each a 6-bit scale stored plus 32 (low 4 bits in nibble s % 2
//!   of scales_l[s / 2], top 2 in bits 2s.. of scales_h) and 16 bytes of IQ4_NL nibbles;
//!   x = d * scale * LEVELS[nibble]

use half::{bf16, f16};

use super::dequant_k;
use super::dtype::DType;

/// Decodes `n` elements of type `dtype` from `bytes`. The caller has checked that `bytes`
/// holds exactly `n / block_len` blocks.
pub fn to_f32(dtype: DType, bytes: &[u8], n: usize) -> Result<Vec<f32>, String> {
    let unsupported = || format!("rustle cannot dequantize {dtype}");
    if !dtype.is_loadable() {
        return Err(unsupported());
    }
    let block_len = dtype.block_len();
    if !n.is_multiple_of(block_len) || bytes.len() != n / block_len * dtype.block_bytes() {
        return Err(format!(
            "{n} {dtype} elements need {} bytes, found {}",
            n.div_ceil(block_len) * dtype.block_bytes(),
            bytes.len()
        ));
    }
    let mut out = vec![0f32; n];
    let blocks = bytes.chunks_exact(dtype.block_bytes());
    let outs = out.chunks_exact_mut(block_len);
    match dtype {
        DType::F32 => blocks
            .zip(outs)
            .for_each(|(b, y)| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DType::F16 => blocks.zip(outs).for_each(|(b, y)| y[0] = f16_at(b, 0)),
        DType::BF16 => blocks
            .zip(outs)
            .for_each(|(b, y)| y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        DType::Q8_0 => blocks.zip(outs).for_each(|(b, y)| q8_0(b, y)),
        DType::Q4_0 => blocks.zip(outs).for_each(|(b, y)| q4_0(b, y)),
        DType::Q4_1 => blocks.zip(outs).for_each(|(b, y)| q4_1(b, y)),
        DType::Q5_0 => blocks.zip(outs).for_each(|(b, y)| q5_0(b, y)),
        DType::Q5_1 => blocks.zip(outs).for_each(|(b, y)| q5_1(b, y)),
        DType::IQ4NL => blocks.zip(outs).for_each(|(b, y)| iq4_nl(b, y)),
        DType::IQ4XS => blocks.zip(outs).for_each(|(b, y)| iq4_xs(b, y)),
        DType::Q2K => blocks.zip(outs).for_each(|(b, y)| dequant_k::q2_k(b, y)),
        DType::Q3K => blocks.zip(outs).for_each(|(b, y)| dequant_k::q3_k(b, y)),
        DType::Q4K => blocks.zip(outs).for_each(|(b, y)| dequant_k::q4_k(b, y)),
        DType::Q5K => blocks.zip(outs).for_each(|(b, y)| dequant_k::q5_k(b, y)),
        DType::Q6K => blocks.zip(outs).for_each(|(b, y)| dequant_k::q6_k(b, y)),
        DType::Ggml(_) | DType::Other(_) => return Err(unsupported()),
    }
    Ok(out)
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..34]) {
        *y = d * (q as i8) as f32;
    }
}

fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = d * ((q & 0x0f) as i32 - 8) as f32;
        y[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (j, &q) in b[4..20].iter().enumerate() {
        y[j] = d * (q & 0x0f) as f32 + m;
        y[j + 16] = d * (q >> 4) as f32 + m;
    }
}

/// The 32 five-bit values of a Q5_0 or Q5_1 block: the low four bits as in Q4_0, the
/// fifth of value j in bit j of `qh` read as a little-endian u32.
fn five_bits(qh: &[u8], q: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let fifth = |j: usize| ((qh >> j) & 1) as u8;
    let mut out = [0u8; 32];
    for (j, &q) in q.iter().enumerate() {
        out[j] = (q & 0x0f) | (fifth(j) << 4);
        out[j + 16] = (q >> 4) | (fifth(j + 16) << 4);
    }
    out
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (y, q) in y.iter_mut().zip(five_bits(&b[2..6], &b[6..22])) {
        *y = d * (q as i32 - 16) as f32;
    }
}

fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (y, q) in y.iter_mut().zip(five_bits(&b[4..8], &b[8..24])) {
        *y = d * q as f32 + m;
    }
}

/// The sixteen levels an IQ4_NL or IQ4_XS nibble indexes: finer near zero, where most
/// weights are, than sixteen even steps would be.
const IQ4_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Sixteen bytes of IQ4 nibbles (value j low, value j + 16 high) times `d`.
fn iq4_run(d: f32, q: &[u8], y: &mut [f32]) {
    for (j, &q) in q.iter().enumerate() {
        y[j] = d * IQ4_LEVELS[(q & 0x0f) as usize] as f32;
        y[j + 16] = d * IQ4_LEVELS[(q >> 4) as usize] as f32;
    }
}

fn iq4_nl(b: &[u8], y: &mut [f32]) {
    iq4_run(f16_at(b, 0), &b[2..18], y);
}

fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let (scales_l, q) = (&b[4..8], &b[8..136]);
    for (s, (q, y)) in q.chunks_exact(16).zip(y.chunks_exact_mut(32)).enumerate() {
        let low = (scales_l[s / 2] >> (4 * (s % 2))) & 0x0f;
        let high = ((scales_h >> (2 * s)) & 3) as u8;
        let scale = (low | (high << 4)) as i32 - 32;
        iq4_run(d * scale as f32, q, y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    // Values worked out by hand from the block layouts in the module header.

    #[test]
    fn q8_0_by_hand() {
        let mut b = vec![];
        b.extend(h(0.5));
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let y = to_f32(DType::Q8_0, &b, 32).unwrap();
        assert_eq!(y[0], -8.0);
        assert_eq!(y[16], 0.0);
        assert_eq!(y[31], 7.5);
    }

    #[test]
    fn q4_0_by_hand() {
        let mut b = vec![];
        b.extend(h(2.0));
        // byte j: low nibble j (value j), high nibble 15 - j (value j + 16)
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = to_f32(DType::Q4_0, &b, 32).unwrap();
        assert_eq!(y[0], -16.0); // 2 * (0 - 8)
        assert_eq!(y[15], 14.0); // 2 * (15 - 8)
        assert_eq!(y[16], 14.0); // high nibble of byte 0 is 15
        assert_eq!(y[31], -16.0);
    }

    #[test]
    fn q4_1_by_hand() {
        let mut b = vec![];
        b.extend(h(0.25));
        b.extend(h(-1.0));
        b.extend((0..16u8).map(|j| j | (3 << 4)));
        let y = to_f32(DType::Q4_1, &b, 32).unwrap();
        assert_eq!(y[0], -1.0);
        assert_eq!(y[8], 1.0); // 0.25 * 8 - 1
        assert_eq!(y[20], -0.25); // 0.25 * 3 - 1
    }

    #[test]
    fn q5_0_and_q5_1_by_hand() {
        // qh = 0x8000_0001: the fifth bit of value 0 and of value 31.
        let qh = [0x01, 0x00, 0x00, 0x80];
        let q = (0..16u8).map(|j| j | (15 << 4)); // value j: nibble j; value j + 16: 15
        let mut b = vec![];
        b.extend(h(0.5));
        b.extend(qh);
        b.extend(q.clone());
        let y = to_f32(DType::Q5_0, &b, 32).unwrap();
        assert_eq!(y[0], 0.5 * (16.0 - 16.0)); // 0 | 16
        assert_eq!(y[1], 0.5 * (1.0 - 16.0));
        assert_eq!(y[16], 0.5 * (15.0 - 16.0));
        assert_eq!(y[31], 0.5 * (31.0 - 16.0)); // 15 | 16
        let mut b = vec![];
        b.extend(h(0.5));
        b.extend(h(-2.0));
        b.extend(qh);
        b.extend(q);
        let y = to_f32(DType::Q5_1, &b, 32).unwrap();
        assert_eq!(y[0], 0.5 * 16.0 - 2.0);
        assert_eq!(y[31], 0.5 * 31.0 - 2.0);
    }

    #[test]
    fn iq4_nl_and_iq4_xs_by_hand() {
        let mut b = vec![];
        b.extend(h(0.5));
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = to_f32(DType::IQ4NL, &b, 32).unwrap();
        assert_eq!(y[0], 0.5 * -127.0);
        assert_eq!(y[8], 0.5 * 1.0);
        assert_eq!(y[16], 0.5 * 113.0);
        // IQ4_XS sub-block 1: scale (low 3 | high 2 << 4) - 32 = 3; sub-block 2: 0 - 32.
        let mut b = vec![0u8; 136];
        b[0..2].copy_from_slice(&h(0.25));
        b[2..4].copy_from_slice(&(2u16 << 2).to_le_bytes()); // scales_h: sub-block 1 gets 2
        b[4] = 3 << 4; // scales_l[0], high nibble: sub-block 1's low bits
        b[8 + 16] = 0x9 | (0xf << 4); // sub-block 1: value 32 is level 9, value 48 level 15
        let y = to_f32(DType::IQ4XS, &b, 256).unwrap();
        assert_eq!(y[32], 0.25 * 3.0 * 13.0);
        assert_eq!(y[48], 0.25 * 3.0 * 113.0);
        assert_eq!(y[64], 0.25 * -32.0 * -127.0); // sub-block 2, nibble 0
    }

    #[test]
    fn every_loadable_type_decodes_and_no_other() {
        let others = [DType::Other("i64")];
        for dtype in (0..64).filter_map(DType::from_ggml).chain(others) {
            let n = dtype.block_len();
            let got = to_f32(dtype, &vec![0; dtype.block_bytes()], n);
            assert_eq!(got.is_ok(), dtype.is_loadable(), "{dtype}: {got:?}");
        }
    }

    #[test]
    fn wrong_length_is_an_error() {
        assert!(to_f32(DType::Q4_1, &[0; 19], 32).is_err());
        assert!(to_f32(DType::Q4_1, &[0; 20], 31).is_err());
        assert!(
            to_f32(DType::from_ggml(15).unwrap(), &[0; 292], 256)
                .unwrap_err()
                .contains("q8_k")
        );
    }
}
