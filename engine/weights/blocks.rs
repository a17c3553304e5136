//! The quantized types the GPU keeps as they are stored (`gpu-kernels/src/quant_blocks.rs`
//! decodes them in registers), and rustle's own fp8: e4m3 values, one f32 scale per row,
//! made at load from 16- or 32-bit weights (`--weights fp8`).

use std::fmt;

use super::DType;
use super::dequant;

/// A matrix type the GPU's quantized kernels read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
    /// e4m3, `n_in` bytes a row, and an f32 scale per row beside the matrix.
    Fp8,
}

impl BlockType {
    pub const ALL: [BlockType; 9] = [
        BlockType::Q4_0,
        BlockType::Q4_1,
        BlockType::Q5_0,
        BlockType::Q5_1,
        BlockType::Q8_0,
        BlockType::Q4K,
        BlockType::Q5K,
        BlockType::Q6K,
        BlockType::Fp8,
    ];

    /// The GGUF type's block type, if the GPU reads it as it is.
    pub fn of(d: DType) -> Option<BlockType> {
        Some(match d {
            DType::Q4_0 => BlockType::Q4_0,
            DType::Q4_1 => BlockType::Q4_1,
            DType::Q5_0 => BlockType::Q5_0,
            DType::Q5_1 => BlockType::Q5_1,
            DType::Q8_0 => BlockType::Q8_0,
            DType::Q4K => BlockType::Q4K,
            DType::Q5K => BlockType::Q5K,
            DType::Q6K => BlockType::Q6K,
            _ => return None,
        })
    }

    /// The GGUF type of the same bytes (`None` for fp8, which is rustle's own).
    pub fn dtype(self) -> Option<DType> {
        Some(match self {
            BlockType::Q4_0 => DType::Q4_0,
            BlockType::Q4_1 => DType::Q4_1,
            BlockType::Q5_0 => DType::Q5_0,
            BlockType::Q5_1 => DType::Q5_1,
            BlockType::Q8_0 => DType::Q8_0,
            BlockType::Q4K => DType::Q4K,
            BlockType::Q5K => DType::Q5K,
            BlockType::Q6K => DType::Q6K,
            BlockType::Fp8 => return None,
        })
    }

    /// Weights per block.
    pub fn block_len(self) -> usize {
        self.dtype().map_or(32, DType::block_len)
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.dtype().map_or(32, DType::block_bytes)
    }

    /// Bytes of one row of `n_in` weights (a whole number of blocks: `fits`).
    pub fn row_bytes(self, n_in: usize) -> usize {
        n_in / self.block_len() * self.block_bytes()
    }

    /// Whether rows of `n_in` weights are whole blocks whose alignment the kernels' loads
    /// need (16 bytes for the k-quants and fp8, rows of whole 16-byte multiples).
    pub fn fits(self, n_in: usize) -> bool {
        n_in.is_multiple_of(self.block_len())
            && match self {
                BlockType::Q4K | BlockType::Q5K | BlockType::Fp8 => {
                    self.row_bytes(n_in).is_multiple_of(16)
                }
                BlockType::Q4_1 | BlockType::Q5_1 => self.row_bytes(n_in).is_multiple_of(4),
                _ => self.row_bytes(n_in).is_multiple_of(2),
            }
    }

    /// A row's weights as f32: `bytes` holds `row_bytes(n_in)`; `scale` is the row's fp8
    /// scale (ignored by the GGUF types).
    pub fn decode_row(self, bytes: &[u8], scale: f32, out: &mut [f32]) {
        match self.dtype() {
            Some(d) => {
                let v = dequant::to_f32(d, bytes, out.len()).expect("a whole row of blocks");
                out.copy_from_slice(&v);
            }
            None => {
                for (o, &b) in out.iter_mut().zip(bytes) {
                    *o = e4m3_to_f32(b) * scale;
                }
            }
        }
    }
}

impl fmt::Display for BlockType {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self.dtype() {
            Some(d) => d.fmt(f),
            None => f.write_str("fp8"),
        }
    }
}

/// Largest e4m3 value: 1.75 * 2^8.
pub const E4M3_MAX: f32 = 448.0;

/// An e4m3 byte's value: sign, 4 exponent bits biased by 7, 3 mantissa bits; exponent 0 is
/// subnormal (m / 8 * 2^-6); `S.1111.111` is NaN (never written by `f32_to_e4m3`).
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = ((b >> 3) & 0xf, b & 7);
    if e == 0xf && m == 7 {
        return f32::NAN;
    }
    let v = if e == 0 {
        m as f32 / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + m as f32 / 8.0) * 2f32.powi(e as i32 - 7)
    };
    sign * v
}

/// `x` rounded to the nearest e4m3 (ties to even), saturating at ±448.
pub fn f32_to_e4m3(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a.is_nan() || a >= E4M3_MAX {
        return sign | 0x7e;
    }
    // Steps of the scale the value falls in: 2^-9 below 2^-6 (subnormals), else 2^(e - 3).
    let e = if a < 2f32.powi(-6) {
        -6
    } else {
        a.log2().floor() as i32
    };
    let step = 2f32.powi(e - 3);
    let q = (a / step).round_ties_even() as u32; // 8..=16 for normals, 0..=8 below
    let (e, q) = if q == 16 { (e + 1, 8) } else { (e, q) };
    let bits = if q < 8 {
        q // subnormal (e == -6)
    } else {
        (((e + 7) as u32) << 3) | (q - 8)
    };
    sign | bits.min(0x7e) as u8
}

/// A `[rows, n_in]` matrix as e4m3 rows with one scale each: the row's largest magnitude
/// maps to 448. Returns (bytes, scales).
pub fn quantize_fp8(w: &[f32], n_in: usize) -> (Vec<u8>, Vec<f32>) {
    use rayon::prelude::*;
    let rows: Vec<(Vec<u8>, f32)> = w
        .par_chunks_exact(n_in)
        .map(|row| {
            let max = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let scale = if max > 0.0 { max / E4M3_MAX } else { 1.0 };
            (row.iter().map(|&v| f32_to_e4m3(v / scale)).collect(), scale)
        })
        .collect();
    let scales = rows.iter().map(|r| r.1).collect();
    (rows.into_iter().flat_map(|r| r.0).collect(), scales)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_e4m3_value_round_trips() {
        for b in 0..=255u8 {
            let v = e4m3_to_f32(b);
            if v.is_nan() {
                continue;
            }
            let back = f32_to_e4m3(v);
            // +0 and -0 are both exact.
            assert_eq!(e4m3_to_f32(back), v, "byte {b:#04x} = {v}");
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
    }

    #[test]
    fn e4m3_rounds_to_nearest_even_and_saturates() {
        // Between 1.0 (0x38) and 1.125 (0x39): the midpoint goes to the even mantissa.
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_e4m3(1.07), 0x39);
        // Between 1.125 and 1.25 the midpoint goes up, to the even 1.25 (0x3a).
        assert_eq!(f32_to_e4m3(1.1875), 0x3a);
        assert_eq!(f32_to_e4m3(1e6), 0x7e);
        assert_eq!(f32_to_e4m3(-1e6), 0xfe);
        // The largest subnormal rounds up into the smallest normal.
        assert_eq!(f32_to_e4m3(2f32.powi(-6) * 0.99), 0x08);
        assert_eq!(f32_to_e4m3(2f32.powi(-11)), 0x00);
    }

    #[test]
    fn fp8_rows_keep_each_rows_largest_value_and_a_relative_error_under_7_percent() {
        let w: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 31.5) / 10.0)
            .collect();
        let (q, s) = quantize_fp8(&w, 32);
        assert_eq!((q.len(), s.len()), (64, 2));
        for (r, row) in w.chunks(32).enumerate() {
            for (i, &v) in row.iter().enumerate() {
                let back = e4m3_to_f32(q[r * 32 + i]) * s[r];
                assert!((back - v).abs() <= v.abs() / 16.0 + 1e-6, "{v} -> {back}");
            }
        }
    }

    #[test]
    fn block_types_know_their_rows() {
        assert_eq!(BlockType::Q4K.row_bytes(4096), 16 * 144);
        assert!(BlockType::Q4K.fits(4096) && !BlockType::Q4K.fits(896));
        assert!(BlockType::Q8_0.fits(896) && BlockType::Q6K.fits(14336));
        assert_eq!(BlockType::Fp8.row_bytes(576), 576);
        assert_eq!(BlockType::of(DType::Q3K), None);
        assert_eq!(BlockType::Q6K.to_string(), "q6_k");
    }
}
