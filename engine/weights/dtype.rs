//! The storage types a weight can arrive in, with their GGUF block geometry.

use std::fmt;

/// A tensor's element type on disk. GGUF's quantized types store blocks of `block_len()`
/// elements in `block_bytes()` bytes; the plain types are blocks of one. The named variants
/// are the types rustle reads (`LOADABLE`); every other type ggml defines is a `Ggml`.
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
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    /// IQ4_NL and IQ4_XS: 4-bit indices into a fixed non-uniform table of 16 values.
    IQ4NL,
    IQ4XS,
    /// A type ggml defines that rustle knows by name but does not read: its tensors are
    /// indexed (the block geometry places them in the file) and refused by name when loaded.
    Ggml(&'static GgmlType),
    /// Anything else a safetensors file may hold (integers, f64, ...): indexed, never loaded.
    Other(&'static str),
}

/// One of ggml's types that rustle does not read, with its block geometry.
#[derive(Debug, PartialEq, Eq)]
pub struct GgmlType {
    pub id: u32,
    /// ggml's name for it, lower case as rustle prints every type.
    pub name: &'static str,
    pub block_len: usize,
    pub block_bytes: usize,
}

/// Every type ggml defines beside the ones rustle reads: ids, names and block geometry as the
/// `gguf` Python package (0.19.0) lists them in `GGMLQuantizationType` and `GGML_QUANT_SIZES`.
/// Ids it does not list stay unknown: 4 and 5, 31 to 33 and 36 to 38 (types ggml has removed),
/// and any past 41.
static UNREAD: [GgmlType; 19] = [
    // llama.cpp's scratch formats for activations, not found in model files. Q8_1 is
    // ggml's `block_q8_1` (f16 d and s, 32 i8): 36 bytes, where the package still says 40.
    ggml(9, "q8_1", 32, 36),
    ggml(15, "q8_k", 256, 292),
    // The 1- to 3-bit i-quants (lattice codebooks).
    ggml(16, "iq2_xxs", 256, 66),
    ggml(17, "iq2_xs", 256, 74),
    ggml(18, "iq3_xxs", 256, 98),
    ggml(19, "iq1_s", 256, 50),
    ggml(21, "iq3_s", 256, 110),
    ggml(22, "iq2_s", 256, 82),
    ggml(29, "iq1_m", 256, 56),
    // Integers and f64.
    ggml(24, "i8", 1, 1),
    ggml(25, "i16", 1, 2),
    ggml(26, "i32", 1, 4),
    ggml(27, "i64", 1, 8),
    ggml(28, "f64", 1, 8),
    // Ternary, fp4 and 1-bit types.
    ggml(34, "tq1_0", 256, 54),
    ggml(35, "tq2_0", 256, 66),
    ggml(39, "mxfp4", 32, 17),
    ggml(40, "nvfp4", 64, 36),
    ggml(41, "q1_0", 128, 18),
];

const fn ggml(id: u32, name: &'static str, block_len: usize, block_bytes: usize) -> GgmlType {
    GgmlType {
        id,
        name,
        block_len,
        block_bytes,
    }
}

impl DType {
    /// The types rustle reads, in the order a refusal lists them.
    pub const LOADABLE: [DType; 15] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2K,
        DType::Q3K,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::IQ4NL,
        DType::IQ4XS,
    ];

    /// GGML's type ids, as the GGUF tensor table lists them; `None` for an id ggml does not
    /// define.
    pub fn from_ggml(id: u32) -> Option<DType> {
        Some(match id {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            6 => DType::Q5_0,
            7 => DType::Q5_1,
            8 => DType::Q8_0,
            10 => DType::Q2K,
            11 => DType::Q3K,
            12 => DType::Q4K,
            13 => DType::Q5K,
            14 => DType::Q6K,
            20 => DType::IQ4NL,
            23 => DType::IQ4XS,
            30 => DType::BF16,
            _ => return UNREAD.iter().find(|t| t.id == id).map(DType::Ggml),
        })
    }

    /// Elements per block.
    pub fn block_len(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 | DType::Other(_) => 1,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => 32,
            DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K => 256,
            DType::IQ4NL => 32,
            DType::IQ4XS => 256,
            DType::Ggml(t) => t.block_len,
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
            DType::Q2K => 84,    // 16 scale bytes, 64 bytes of 2-bit values, f16 d, f16 dmin
            DType::Q3K => 110,   // 32 + 64 + 12 bytes, f16 d
            DType::Q4K => 144,   // f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes
            DType::Q5K => 176,   // f16 d, f16 dmin, 12 + 32 + 128 bytes
            DType::Q6K => 210,   // 128 low nibbles, 64 high-bit bytes, 16 i8 scales, f16 d
            DType::IQ4NL => 18,  // f16 scale, 16 bytes of 4-bit table indices
            DType::IQ4XS => 136, // f16 d, u16 + 4 bytes of 6-bit scales, 128 bytes of indices
            DType::Ggml(t) => t.block_bytes,
            DType::Other(_) => 0,
        }
    }

    /// Whether rustle can turn this type into f32: every type in common use.
    pub fn is_loadable(self) -> bool {
        !matches!(self, DType::Ggml(_) | DType::Other(_))
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
            DType::Q2K => "q2_k",
            DType::Q3K => "q3_k",
            DType::Q4K => "q4_k",
            DType::Q5K => "q5_k",
            DType::Q6K => "q6_k",
            DType::IQ4NL => "iq4_nl",
            DType::IQ4XS => "iq4_xs",
            DType::Ggml(t) => t.name,
            DType::Other(s) => s,
        };
        f.write_str(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ggml_type_has_a_name_and_other_ids_none() {
        let named = |id| DType::from_ggml(id).map(|t| t.to_string());
        assert_eq!(named(16).as_deref(), Some("iq2_xxs"));
        assert_eq!(named(21).as_deref(), Some("iq3_s"));
        assert_eq!(named(29).as_deref(), Some("iq1_m"));
        assert_eq!(named(34).as_deref(), Some("tq1_0"));
        assert_eq!(named(12).as_deref(), Some("q4_k"));
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 1000, u32::MAX] {
            assert_eq!(DType::from_ggml(id), None, "ggml type {id}");
        }
        // Each id once, none of them a type rustle reads, each name unique.
        let ids: Vec<u32> = (0..64)
            .filter(|&id| DType::from_ggml(id).is_some())
            .collect();
        assert_eq!(ids.len(), DType::LOADABLE.len() + UNREAD.len());
        let mut names: Vec<String> = ids.iter().map(|&id| named(id).unwrap()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ids.len());
        for t in &UNREAD {
            assert!(!DType::Ggml(t).is_loadable());
        }
        assert!(DType::LOADABLE.iter().all(|t| t.is_loadable()));
    }
}
