//! The storage types a weight can arrive in, with their GGUF block geometry.

use std::fmt;

/// A tensor's element type on disk. GGUF's quantized types store blocks of `block_len()`
/// elements in `block_bytes()` bytes; the plain types are blocks of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    /// IQ4_NL and IQ4_XS: 4-bit indices into a fixed non-uniform table of 16 values.
    IQ4NL,
    IQ4XS,
    /// Anything else a safetensors file may hold (integers, f64, ...): indexed, never loaded.
    Other(&'static str),
}

impl DType {
    /// GGML's type ids, as the GGUF tensor table lists them.
    pub fn from_ggml(id: u32) -> Option<DType> {
        Some(match id {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            6 => DType::Q5_0,
            7 => DType::Q5_1,
            8 => DType::Q8_0,
            9 => DType::Q8_1,
            10 => DType::Q2K,
            11 => DType::Q3K,
            12 => DType::Q4K,
            13 => DType::Q5K,
            14 => DType::Q6K,
            15 => DType::Q8K,
            20 => DType::IQ4NL,
            23 => DType::IQ4XS,
            30 => DType::BF16,
            _ => return None,
        })
    }

    /// Elements per block.
    pub fn block_len(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 | DType::Other(_) => 1,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 | DType::Q8_1 => 32,
            DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K | DType::Q8K => 256,
            DType::IQ4NL => 32,
            DType::IQ4XS => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q4_0 => 18,   // f16 scale, 16 bytes of 4-bit values
            DType::Q4_1 => 20,   // f16 scale, f16 min, 16 bytes of 4-bit values
            DType::Q5_0 => 22,   // f16 scale, 4 bytes of fifth bits, 16 bytes of nibbles
            DType::Q5_1 => 24,   // f16 scale, f16 min, 4 + 16 bytes
            DType::Q8_0 => 34,   // f16 scale, 32 i8
            DType::Q8_1 => 36,   // f16 scale, f16 sum, 32 i8
            DType::Q2K => 84,    // 16 scale bytes, 64 bytes of 2-bit values, f16 d, f16 dmin
            DType::Q3K => 110,   // 32 + 64 + 12 bytes, f16 d
            DType::Q4K => 144,   // f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes
            DType::Q5K => 176,   // f16 d, f16 dmin, 12 + 32 + 128 bytes
            DType::Q6K => 210,   // 128 low nibbles, 64 high-bit bytes, 16 i8 scales, f16 d
            DType::Q8K => 292,   // f32 d, 256 i8, 16 i16 sums
            DType::IQ4NL => 18,  // f16 scale, 16 bytes of 4-bit table indices
            DType::IQ4XS => 136, // f16 d, u16 + 4 bytes of 6-bit scales, 128 bytes of indices
            DType::Other(_) => 0,
        }
    }

    /// Whether rustle can turn this type into f32: every type in common use. Q8_1 and Q8_K
    /// are llama.cpp's scratch formats for activations, not found in model files.
    pub fn is_loadable(self) -> bool {
        matches!(
            self,
            DType::F32
                | DType::F16
                | DType::BF16
                | DType::Q4_0
                | DType::Q4_1
                | DType::Q5_0
                | DType::Q5_1
                | DType::Q8_0
                | DType::Q2K
                | DType::Q3K
                | DType::Q4K
                | DType::Q5K
                | DType::Q6K
                | DType::IQ4NL
                | DType::IQ4XS
        )
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let s = match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q8_1 => "q8_1",
            DType::Q2K => "q2_k",
            DType::Q3K => "q3_k",
            DType::Q4K => "q4_k",
            DType::Q5K => "q5_k",
            DType::Q6K => "q6_k",
            DType::Q8K => "q8_k",
            DType::IQ4NL => "iq4_nl",
            DType::IQ4XS => "iq4_xs",
            DType::Other(s) => s,
        };
        f.write_str(s)
    }
}
