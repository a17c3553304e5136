//! Turning stored weights into f32: the plain float types and GGUF's block quantizations.
//!
//! Each quantized format stores a block of values as small integers plus one or two scales.
//! The layouts are GGML's (little-endian, blocks back to back along a row):
//! - Q8_0 (32 values, 34 bytes): `d: f16, q: [i8; 32]`;  x = d * q
//! - Q4_0 (32 values, 18 bytes): `d: f16, q: [u8; 16]`;  x = d * (nibble - 8)
//! - Q4_1 (32 values, 20 bytes): `d: f16, m: f16, q: [u8; 16]`;  x = d * nibble + m
//!   (in both 4-bit types byte j holds value j in its low nibble and value j + 16 in its high)
//! - Q4_K (256 values, 144 bytes): `d: f16, dmin: f16, scales: [u8; 12], q: [u8; 128]`:
//!   eight sub-blocks of 32, each with a 6-bit scale and 6-bit min; x = d*sc*nibble - dmin*m
//! - Q6_K (256 values, 210 bytes): `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`:
//!   6-bit values (4 low bits in ql, 2 high bits in qh) minus 32, sixteen sub-blocks of 16
//!   each with an i8 scale; x = d * scale * q

use half::{bf16, f16};

use super::dtype::DType;

/// Decodes `n` elements of type `dtype` from `bytes`. The caller has checked that `bytes`
/// holds exactly `n / block_len` blocks.
pub fn to_f32(dtype: DType, bytes: &[u8], n: usize) -> Result<Vec<f32>, String> {
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
        DType::Q4K => blocks.zip(outs).for_each(|(b, y)| q4_k(b, y)),
        DType::Q6K => blocks.zip(outs).for_each(|(b, y)| q6_k(b, y)),
        other => return Err(format!("rustle cannot dequantize {other} yet")),
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

/// Q4_K packs eight 6-bit scales and eight 6-bit mins into 12 bytes: sub-blocks 0..4 use the
/// low 6 bits of bytes 0..4 (scales) and 4..8 (mins); sub-blocks 4..8 take their low 4 bits
/// from bytes 8..12 and their top 2 bits from the spare high bits of bytes 0..8.
fn q4_k_scale_min(j: usize, s: &[u8]) -> (f32, f32) {
    if j < 4 {
        ((s[j] & 63) as f32, (s[j + 4] & 63) as f32)
    } else {
        let sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        let m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        (sc as f32, m as f32)
    }
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let q = &b[16..144];
    // Each 32-byte run of q holds two sub-blocks: the low nibbles, then the high nibbles.
    for chunk in 0..4 {
        let (sc_lo, m_lo) = q4_k_scale_min(2 * chunk, scales);
        let (sc_hi, m_hi) = q4_k_scale_min(2 * chunk + 1, scales);
        let qs = &q[32 * chunk..32 * chunk + 32];
        let ys = &mut y[64 * chunk..64 * chunk + 64];
        for l in 0..32 {
            ys[l] = d * sc_lo * (qs[l] & 0x0f) as f32 - dmin * m_lo;
            ys[l + 32] = d * sc_hi * (qs[l] >> 4) as f32 - dmin * m_hi;
        }
    }
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    // Two halves of 128 values; in each, value l + 32*k (k = 0..4) takes nibble k/2 of
    // ql[l + 32*(k%2)] and bits 2k..2k+2 of qh[l].
    for half in 0..2 {
        let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
        let sc = &scales[8 * half..];
        let ys = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q = [
                (ql[l] & 0x0f) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (k, &q) in q.iter().enumerate() {
                let scale = sc[is + 2 * k] as i8 as f32;
                ys[l + 32 * k] = d * scale * (q as i32 - 32) as f32;
            }
        }
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
    fn q4_k_by_hand() {
        let mut b = vec![0u8; 144];
        b[0..2].copy_from_slice(&h(1.0)); // d
        b[2..4].copy_from_slice(&h(0.5)); // dmin
        // sub-block 0: scale 2, min 3; sub-block 1: scale 5, min 1.
        b[4] = 2;
        b[5] = 5;
        b[8] = 3;
        b[9] = 1;
        // Bytes 12 and 13 (s[8], s[9]) give sub-blocks 4 and 5 their low 4 bits of scale;
        // the top two bits of byte 5 (s[1]) are the high bits of sub-block 5's scale.
        b[12] = 3; // sub-block 4: scale 3, min 0
        b[13] = 1; // sub-block 5: scale 1 | (s[1] >> 6) << 4
        b[5] |= 1 << 6; // s[1]'s low six bits stay 5, so sub-block 1 is unchanged; sub-block 5's scale becomes 17
        b[16] = 0x4 | (0x7 << 4); // value 0: nibble 4; value 32: nibble 7
        b[16 + 64] = 0x2 | (0x1 << 4); // value 128 (sub-block 4): 2; value 160 (sub-block 5): 1
        let y = to_f32(DType::Q4K, &b, 256).unwrap();
        assert_eq!(y[0], 1.0 * 2.0 * 4.0 - 0.5 * 3.0);
        assert_eq!(y[32], 1.0 * 5.0 * 7.0 - 0.5 * 1.0);
        assert_eq!(y[1], -1.5); // nibble 0
        assert_eq!(y[128], 3.0 * 2.0);
        assert_eq!(y[160], 17.0 * 1.0);
    }

    #[test]
    fn q6_k_by_hand() {
        let mut b = vec![0u8; 210];
        b[208..210].copy_from_slice(&h(0.5));
        b[192] = 2; // scale of values 0..16
        b[194] = (-3i8) as u8; // scale of values 32..48
        b[0] = 0x21; // value 0: low nibble 1; value 64: low nibble 2
        b[128] = 0b0000_0110; // value 0: high bits 2 (q = 1 | 32 = 33); value 32: high bits 1
        b[32] = 0x05; // value 32: low nibble 5 -> q = 5 | 16 = 21
        let y = to_f32(DType::Q6K, &b, 256).unwrap();
        assert_eq!(y[0], 0.5 * 2.0 * (33.0 - 32.0));
        assert_eq!(y[32], 0.5 * -3.0 * (21.0 - 32.0));
        assert_eq!(y[1], 0.5 * 2.0 * -32.0);
    }

    #[test]
    fn wrong_length_is_an_error() {
        assert!(to_f32(DType::Q4_1, &[0; 19], 32).is_err());
        assert!(to_f32(DType::Q4_1, &[0; 20], 31).is_err());
        assert!(
            to_f32(DType::Q5K, &[0; 176], 256)
                .unwrap_err()
                .contains("q5_k")
        );
    }
}
