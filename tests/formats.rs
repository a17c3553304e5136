//! File formats against independent implementations: GGUF dequantization against the
//! `gguf` Python package (tests/golden/make_dequant.py), and the default model's GGUF
//! header, metadata and tokenizer.

use rustle::loader;
use rustle::tokenizer::Tokenizer;
use rustle::weights::DType;
use rustle::weights::dequant::to_f32;
use rustle::weights::gguf::GgufFile;
use serde::Deserialize;

#[derive(Deserialize)]
struct Dequant {
    cases: Vec<DequantCase>,
    ggml_types: Vec<GgmlTypeRow>,
}

/// One entry of the package's `GGMLQuantizationType`, with its `GGML_QUANT_SIZES`.
#[derive(Deserialize)]
struct GgmlTypeRow {
    id: u32,
    name: String,
    block_len: usize,
    block_bytes: usize,
}

#[derive(Deserialize)]
struct DequantCase {
    #[serde(rename = "type")]
    ty: String,
    bytes_hex: String,
    values: Vec<f32>,
}

fn dtype(name: &str) -> DType {
    match name {
        "f32" => DType::F32,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "q8_0" => DType::Q8_0,
        "q4_0" => DType::Q4_0,
        "q4_1" => DType::Q4_1,
        "q5_0" => DType::Q5_0,
        "q5_1" => DType::Q5_1,
        "q2_k" => DType::Q2K,
        "q3_k" => DType::Q3K,
        "q4_k" => DType::Q4K,
        "q5_k" => DType::Q5K,
        "q6_k" => DType::Q6K,
        "iq4_nl" => DType::IQ4NL,
        "iq4_xs" => DType::IQ4XS,
        other => panic!("unexpected type {other}"),
    }
}

#[test]
fn dequantization_matches_the_gguf_package() {
    let text = std::fs::read_to_string("tests/golden/dequant.json").unwrap();
    let golden: Dequant = serde_json::from_str(&text).unwrap();
    let mut seen = vec![];
    for case in &golden.cases {
        let bytes: Vec<u8> = (0..case.bytes_hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&case.bytes_hex[i..i + 2], 16).unwrap())
            .collect();
        let ours = to_f32(dtype(&case.ty), &bytes, case.values.len()).unwrap();
        for (i, (a, b)) in ours.iter().zip(&case.values).enumerate() {
            // Both compute in f32 from the same f16 scales; allow one rounding step.
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                "{} element {i}: rustle {a}, gguf {b}",
                case.ty
            );
        }
        seen.push(case.ty.clone());
    }
    assert_eq!(
        seen,
        [
            "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k", "q5_0", "q5_1", "q2_k",
            "q3_k", "q5_k", "iq4_nl", "iq4_xs"
        ]
    );
}

/// Every type ggml defines has rustle's name for it (so a file holding one is refused by
/// name) and the same block geometry (so its tensors are placed right in the file); every
/// other id is unknown.
#[test]
fn every_ggml_type_is_named_as_the_gguf_package_names_it() {
    let text = std::fs::read_to_string("tests/golden/dequant.json").unwrap();
    let golden: Dequant = serde_json::from_str(&text).unwrap();
    for t in &golden.ggml_types {
        let ours = DType::from_ggml(t.id).unwrap_or_else(|| panic!("ggml type {}", t.id));
        assert_eq!(ours.to_string(), t.name, "ggml type {}", t.id);
        // The package lists Q8_1 with f32 scales (40 bytes); ggml's block_q8_1 has f16 ones.
        let bytes = if t.name == "q8_1" { 36 } else { t.block_bytes };
        assert_eq!(
            (ours.block_len(), ours.block_bytes()),
            (t.block_len, bytes),
            "{}",
            t.name
        );
    }
    for id in 0..1024 {
        if !golden.ggml_types.iter().any(|t| t.id == id) {
            assert_eq!(DType::from_ggml(id), None, "ggml type {id}");
        }
    }
}

#[test]
fn default_model_gguf_header_and_metadata() {
    let path = loader::resolve_model_path(None).unwrap();
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.tensors.len(), 272);
    let get = |k: &str| g.get(k).unwrap_or_else(|| panic!("{k}"));
    assert_eq!(get("general.architecture").as_str(), Some("llama"));
    assert_eq!(get("llama.block_count").as_u64(), Some(30));
    assert_eq!(get("llama.attention.head_count_kv").as_u64(), Some(3));
    let embd = g
        .tensors
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .unwrap();
    assert_eq!(
        (embd.dims.clone(), embd.dtype),
        (vec![576, 49152], DType::Q8_0)
    );
    let q = g
        .tensors
        .iter()
        .find(|t| t.name == "blk.0.attn_q.weight")
        .unwrap();
    assert_eq!((q.dims.clone(), q.dtype), (vec![576, 576], DType::Q4_1));
}

#[test]
fn default_model_tokenizer_round_trips() {
    let path = loader::resolve_model_path(None).unwrap();
    let t = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    assert_eq!(t.eos_tokens, vec![2]);
    assert_eq!(t.id_of("<|im_end|>"), Some(2));
    for text in [
        "The capital of France is",
        "  leading spaces, tabs\tand\nnewlines",
        "digits 1234567890 split one by one",
        "unicode: café, 東京, emoji 🦀",
        "<|im_start|>user\nhi<|im_end|>",
    ] {
        let ids = t.encode(text, true).unwrap();
        let back = t.decode(&ids).unwrap();
        let specials_removed = text.replace("<|im_start|>", "").replace("<|im_end|>", "");
        assert_eq!(back, specials_removed, "{ids:?}");
    }
    // SmolLM's pre-tokenizer splits digits one by one; no BOS is added.
    let ids = t.encode("2024", true).unwrap();
    assert_eq!(ids.len(), 4);
    // Control tokens are matched whole.
    assert_eq!(t.encode("<|im_start|>", false).unwrap(), vec![1]);
}
