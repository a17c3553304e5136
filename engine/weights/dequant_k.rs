//! GGML's k-quants to f32: super-blocks of 256 values in sub-blocks of 16 or 32, each
//! sub-block with its own small integer scale (and min) under one or two f16 scales.
//!
//! Layouts (little-endian, blocks back to back along a row):
//! - Q2_K (256 values, 84 bytes): `scales: [u8; 16], q: [u8; 64], d: f16, dmin: f16`:
//!   sixteen sub-blocks of 16, each with a 4-bit scale (low nibble) and 4-bit min (high);
//!   2-bit values; x = d*sc*q - dmin*m
//! - Q3_K (256 values, 110 bytes): `hmask: [u8; 32], q: [u8; 64], scales: [u8; 12], d: f16`:
//!   2-bit low parts as in Q2_K, and a third bit in hmask whose *absence* subtracts 4 (q in
//!   -4..4); sixteen sub-blocks of 16 with 6-bit scales stored plus 32; x = d * sc * q
//! - Q4_K (256 values, 144 bytes): `d: f16, dmin: f16, scales: [u8; 12], q: [u8; 128]`:
//!   eight sub-blocks of 32, each with a 6-bit scale and 6-bit min; x = d*sc*nibble - dmin*m
//! - Q5_K (256 values, 176 bytes): `d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32],
//!   q: [u8; 128]`: Q4_K with a fifth bit per value, bit s of qh[l] for value l of sub-block s
//! - Q6_K (256 values, 210 bytes): `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`:
//!   6-bit values (4 low bits in ql, 2 high bits in qh) minus 32, sixteen sub-blocks of 16
//!   each with an i8 scale; x = d * scale * q
//!
//! Q2_K and Q3_K pack their 2-bit parts in planes: value `128*h + 32*k + l` is bits
//! `2k..2k+2` of `q[32*h + l]`, so one 32-byte run serves four runs of 32 values.

use half::f16;

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// The 2-bit part of value `i` (0..256) of a Q2_K or Q3_K block's planes `q`.
fn two_bits(q: &[u8], i: usize) -> u8 {
    let (half, k, l) = (i / 128, (i / 32) % 4, i % 32);
    (q[32 * half + l] >> (2 * k)) & 3
}

pub fn q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, q) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (i, y) in y.iter_mut().enumerate() {
        let s = scales[i / 16];
        *y = d * (s & 0x0f) as f32 * two_bits(q, i) as f32 - dmin * (s >> 4) as f32;
    }
}

/// Q3_K's sixteen 6-bit scales in 12 bytes: scale i takes its low 4 bits from nibble i / 8
/// of byte i % 8, and its top 2 bits from bits 2*(i/4).. of byte 8 + i % 4.
fn q3_k_scale(i: usize, s: &[u8]) -> f32 {
    let low = (s[i % 8] >> (4 * (i / 8))) & 0x0f;
    let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    ((low | (high << 4)) as i32 - 32) as f32
}

pub fn q3_k(b: &[u8], y: &mut [f32]) {
    let (hmask, q, scales) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    let dl: [f32; 16] = std::array::from_fn(|s| d * q3_k_scale(s, scales));
    for (i, y) in y.iter_mut().enumerate() {
        // Value i's third bit is bit i / 32 of hmask[i % 32]; set means no offset.
        let high = (hmask[i % 32] >> (i / 32)) & 1;
        let q = two_bits(q, i) as i32 - if high == 0 { 4 } else { 0 };
        *y = dl[i / 16] * q as f32;
    }
}

/// Q4_K and Q5_K pack eight 6-bit scales and eight 6-bit mins into 12 bytes: sub-blocks
/// 0..4 use the low 6 bits of bytes 0..4 (scales) and 4..8 (mins); sub-blocks 4..8 take
/// their low 4 bits from bytes 8..12 and their top 2 bits from the spare high bits of
/// bytes 0..8.
pub(crate) fn q4_k_scale_min(j: usize, s: &[u8]) -> (f32, f32) {
    if j < 4 {
        ((s[j] & 63) as f32, (s[j + 4] & 63) as f32)
    } else {
        let sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        let m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        (sc as f32, m as f32)
    }
}

pub fn q4_k(b: &[u8], y: &mut [f32]) {
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

pub fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qh, q) = (&b[4..16], &b[16..48], &b[48..176]);
    // The low four bits are laid out as in Q4_K: sub-block s is nibble s % 2 of the
    // 32-byte run s / 2.
    for (s, ys) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = q4_k_scale_min(s, scales);
        let (run, shift) = (&q[32 * (s / 2)..32 * (s / 2) + 32], 4 * (s % 2));
        for (l, y) in ys.iter_mut().enumerate() {
            let q = ((run[l] >> shift) & 0x0f) | (((qh[l] >> s) & 1) << 4);
            *y = d * sc * q as f32 - dmin * m;
        }
    }
}

pub fn q6_k(b: &[u8], y: &mut [f32]) {
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

    fn decode(f: fn(&[u8], &mut [f32]), b: &[u8]) -> Vec<f32> {
        let mut y = vec![0f32; 256];
        f(b, &mut y);
        y
    }

    // Values worked out by hand from the block layouts in the module header.

    #[test]
    fn q2_k_by_hand() {
        let mut b = vec![0u8; 84];
        b[80..82].copy_from_slice(&h(0.5)); // d
        b[82..84].copy_from_slice(&h(0.25)); // dmin
        b[0] = 3 | (4 << 4); // sub-block 0 (values 0..16): scale 3, min 4
        b[2] = 6 | (1 << 4); // sub-block 2 (values 32..48): scale 6, min 1
        b[16] = 0b00_00_11_10; // value 0: 2; value 32: 3 (the next plane of byte 0)
        let y = decode(q2_k, &b);
        assert_eq!(y[0], 0.5 * 3.0 * 2.0 - 0.25 * 4.0);
        assert_eq!(y[32], 0.5 * 6.0 * 3.0 - 0.25 * 1.0);
        assert_eq!(y[1], -1.0); // q = 0: only the min
    }

    #[test]
    fn q3_k_by_hand() {
        let mut b = vec![0u8; 110];
        b[108..110].copy_from_slice(&h(2.0));
        // Scale 0 = (3 | 2 << 4) - 32 = 3: low nibble of byte 96, bits 0..2 of byte 104.
        // Scale 8 = 0 - 32: high nibble of byte 96, bits 4..6 of byte 104.
        // Scale 5 = (1 | 1 << 4) - 32 = -15: low nibble of byte 101, bits 2..4 of byte 105.
        b[96] = 3;
        b[104] = 2;
        b[101] = 1;
        b[105] = 1 << 2;
        b[32] = 1; // value 0: low part 1
        b[0] = 1; // value 0: third bit set, no offset
        b[48] = 3 << 4; // value 80 (plane 2 of byte 16): low part 3
        b[16] = 1 << 2; // value 80: third bit (bit 80 / 32 of hmask[16]) set
        let y = decode(q3_k, &b);
        assert_eq!(y[0], 2.0 * 3.0 * 1.0);
        assert_eq!(y[1], 2.0 * 3.0 * -4.0); // low part 0, third bit clear
        assert_eq!(y[128], 2.0 * -32.0 * -4.0);
        assert_eq!(y[80], 2.0 * -15.0 * 3.0);
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
        let y = decode(q4_k, &b);
        assert_eq!(y[0], 1.0 * 2.0 * 4.0 - 0.5 * 3.0);
        assert_eq!(y[32], 1.0 * 5.0 * 7.0 - 0.5 * 1.0);
        assert_eq!(y[1], -1.5); // nibble 0
        assert_eq!(y[128], 3.0 * 2.0);
        assert_eq!(y[160], 17.0 * 1.0);
    }

    #[test]
    fn q5_k_by_hand() {
        let mut b = vec![0u8; 176];
        b[0..2].copy_from_slice(&h(1.0)); // d
        b[2..4].copy_from_slice(&h(0.5)); // dmin
        b[4] = 2; // sub-block 0: scale 2, min 0
        b[7] = 3; // sub-block 3: scale 3
        b[11] = 4; // sub-block 3: min 4
        b[16] = 1 | (1 << 3); // qh[0]: fifth bit of value 0 and of value 96 (sub-block 3)
        b[48] = 0x05; // value 0: 5 | 16 = 21
        b[48 + 32] = 0x20; // run 1, high nibble: value 96 = 2 | 16 = 18
        let y = decode(q5_k, &b);
        assert_eq!(y[0], 2.0 * 21.0);
        assert_eq!(y[96], 3.0 * 18.0 - 0.5 * 4.0);
        assert_eq!(y[97], -2.0); // q = 0
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
        let y = decode(q6_k, &b);
        assert_eq!(y[0], 0.5 * 2.0 * (33.0 - 32.0));
        assert_eq!(y[32], 0.5 * -3.0 * (21.0 - 32.0));
        assert_eq!(y[1], 0.5 * 2.0 * -32.0);
    }
}
