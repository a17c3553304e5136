//! GGUF files: metadata values and types, vocabulary arrays, tensor table entries (dims,
//! types, offsets), alignment, header fields where the writer put them, truncation, bits.

use std::time::Instant;

use libtest_mimic::Failed;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::tiny::{self, Field, FieldKind, Gguf, Meta};
use crate::tally::{Tally, load_and_run};
use crate::values::{FLOATS, flip, interesting, pick, read_le, truncate};

pub(crate) const GGUF_KEYS: [&str; 22] = [
    "general.architecture",
    "general.alignment",
    "llama.block_count",
    "llama.context_length",
    "llama.embedding_length",
    "llama.feed_forward_length",
    "llama.attention.head_count",
    "llama.attention.head_count_kv",
    "llama.attention.key_length",
    "llama.attention.value_length",
    "llama.attention.layer_norm_rms_epsilon",
    "llama.rope.freq_base",
    "llama.rope.scaling.type",
    "llama.rope.scaling.factor",
    "llama.vocab_size",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.chat_template",
];

/// A value of some type for a metadata key: numbers from the interesting sets, strings a
/// loader might meet, arrays.
pub(crate) fn meta_value(rng: &mut StdRng, orig: Option<&Meta>) -> Meta {
    let was = match orig {
        Some(Meta::U32(v)) => *v as u64,
        Some(Meta::U64(v)) => *v,
        _ => 8,
    };
    let n = interesting(rng, was);
    match rng.random_range(0..11) {
        0 => Meta::U32(n as u32),
        // A value past u32 keeps its width: the wrapping ones are all past it.
        1..=3 => Meta::U64(n),
        4 => Meta::I32(-((n % 1000) as i32) - 1),
        5 => Meta::F32(*pick(rng, &FLOATS) as f32),
        6 => Meta::F64(*pick(rng, &FLOATS)),
        7 => Meta::Str(
            pick(
                rng,
                &[
                    "llama", "qwen2", "gpt2", "bert", "", "linear", "yarn", "llama3", "smollm",
                    "falcon", "qwen2",
                ],
            )
            .to_string(),
        ),
        8 => Meta::Bool(rng.random()),
        _ => Meta::Array(4, vec![Meta::U32(4); rng.random_range(0..4)]),
    }
}

/// What a GGUF mutation made: a changed file description, or (for byte-level changes)
/// the file's bytes; each with what was done.
pub(crate) enum Mutated {
    Spec(String),
    Bytes(Vec<u8>, String),
}

/// One structure-aware change to a GGUF file.
pub(crate) fn mutate_gguf(rng: &mut StdRng, g: &mut Gguf) -> Mutated {
    let tensor_names: Vec<String> = g.tensors.iter().map(|t| t.name.clone()).collect();
    let which = rng.random_range(0..16);
    Mutated::Spec(match which {
        // A metadata value: the keys the loader reads, the values that overflow or mean
        // nothing (the failures the campaign found among them).
        0..=2 => {
            let key = *pick(rng, &GGUF_KEYS);
            let v = meta_value(rng, g.get(key));
            let d = format!("metadata {key} = {v:?}");
            g.set(key, v);
            d
        }
        3 => {
            let i = rng.random_range(0..g.meta.len());
            let key = g.meta[i].0.clone();
            g.remove(&key);
            format!("metadata {key} removed")
        }
        4 => {
            let i = rng.random_range(0..g.meta.len());
            let dup = g.meta[i].clone();
            let d = format!("metadata {} twice", dup.0);
            g.meta.push(dup);
            d
        }
        // Vocabulary arrays of the wrong length, and odd entries.
        5 => {
            let key = *pick(
                rng,
                &[
                    "tokenizer.ggml.tokens",
                    "tokenizer.ggml.token_type",
                    "tokenizer.ggml.scores",
                    "tokenizer.ggml.merges",
                ],
            );
            let Some(Meta::Array(ty, items)) = g.get(key).cloned() else {
                return Mutated::Spec(format!("{key} absent, left alone"));
            };
            let mut items = items;
            let d = match rng.random_range(0..5) {
                0 => {
                    let n = rng.random_range(0..=items.len());
                    items.truncate(n);
                    format!("{key} cut to {n} entries")
                }
                1 if ty == 8 => {
                    let i = rng.random_range(0..items.len().max(1));
                    let s = pick(rng, &["", " ", "a", "zz qq", "a b c", "<|end|>"]).to_string();
                    if let Some(item) = items.get_mut(i) {
                        *item = Meta::Str(s.clone());
                    }
                    format!("{key}[{i}] = {s:?}")
                }
                2 if ty == 8 => {
                    items.push(Meta::Str("x".repeat(rng.random_range(1..5000))));
                    format!("{key}: a long entry added")
                }
                3 => {
                    let i = rng.random_range(0..items.len().max(1));
                    if let Some(item) = items.get(i).cloned() {
                        items.push(item);
                    }
                    format!("{key}[{i}] repeated at the end")
                }
                _ => {
                    let i = rng.random_range(0..items.len().max(1));
                    if i < items.len() {
                        items[i] = meta_value(rng, None);
                    }
                    format!("{key}[{i}] replaced (mixed types)")
                }
            };
            g.set(key, Meta::Array(ty, items));
            d
        }
        // Tensor table entries.
        6..=8 => {
            let i = rng.random_range(0..g.tensors.len());
            let t = &mut g.tensors[i];
            let name = t.name.clone();
            match rng.random_range(0..8) {
                0 => {
                    let k = rng.random_range(0..t.dims.len());
                    t.dims[k] = interesting(rng, t.dims[k]);
                    format!("{name}: dims {:?}", t.dims)
                }
                1 => {
                    t.dims.reverse();
                    format!("{name}: dims reversed")
                }
                2 => {
                    t.ggml_type = *pick(rng, &[0, 1, 2, 3, 8, 12, 14, 30, 5, 99]);
                    format!("{name}: ggml type {}", t.ggml_type)
                }
                3 => {
                    g.tensors.remove(i);
                    format!("{name} removed")
                }
                4 => {
                    let other = pick(rng, &tensor_names).clone();
                    t.name = other.clone();
                    format!("{name} renamed {other}")
                }
                5 => {
                    let dup = t.clone();
                    g.tensors.push(dup);
                    format!("{name} twice")
                }
                6 => {
                    // Where the writer would put it, moved off the alignment, or onto
                    // another tensor's bytes.
                    let at: u64 = g.tensors[..i]
                        .iter()
                        .map(|t| (t.data.len() as u64).div_ceil(32) * 32)
                        .sum();
                    let off = match rng.random_range(0..3) {
                        0 => at + rng.random_range(1..32),
                        1 => at.saturating_sub(32),
                        _ => interesting(rng, at),
                    };
                    g.tensors[i].offset = Some(off);
                    format!("{name}: offset {off} (writer's {at})")
                }
                _ => {
                    let n = rng.random_range(0..t.data.len().max(1));
                    t.data.truncate(n);
                    format!("{name}: data cut to {n} bytes")
                }
            }
        }
        9 if rng.random_bool(0.3) => {
            let v = *pick(rng, &[1u64 << 32, 1 << 62, (1 << 62) + 4, 1 << 63]);
            for k in ["head_count", "head_count_kv", "key_length", "value_length"] {
                g.set(&format!("llama.attention.{k}"), Meta::U64(v));
            }
            format!("every head count and width = {v}")
        }
        9 => {
            let a = *pick(rng, &[0u64, 1, 3, 8, 64, 1 << 40]);
            g.set("general.alignment", Meta::U64(a));
            if rng.random_bool(0.5) && a.is_power_of_two() && a <= 64 {
                g.alignment = a as usize;
            }
            format!("alignment {a} (written at {})", g.alignment)
        }
        10 => {
            g.version = *pick(rng, &[0, 1, 2, 4, u32::MAX]);
            format!("version {}", g.version)
        }
        // A header field where the writer put it, set to another value.
        11..=13 => {
            let (mut bytes, fields) = g.write();
            let f: Field = *pick(rng, &fields);
            let orig = read_le(&bytes[f.at..f.at + f.width]);
            let v = match f.kind {
                FieldKind::ValueType | FieldKind::TensorType => rng.random_range(0..16),
                FieldKind::NDims => rng.random_range(0..8),
                _ => interesting(rng, orig),
            };
            bytes[f.at..f.at + f.width].copy_from_slice(&v.to_le_bytes()[..f.width]);
            let d = format!("{:?} at byte {}: {orig} -> {v}", f.kind, f.at);
            return Mutated::Bytes(bytes, d);
        }
        14 => {
            let mut bytes = g.bytes();
            let d = truncate(rng, &mut bytes);
            return Mutated::Bytes(bytes, d);
        }
        _ => {
            let mut bytes = g.bytes();
            let header = bytes.len() / 3;
            let d = flip(rng, &mut bytes, header);
            return Mutated::Bytes(bytes, d);
        }
    })
}

pub(crate) fn cases(n: usize) -> Result<(), Failed> {
    let started = Instant::now();
    let dir = tiny::scratch_dir("mutation-gguf");
    let path = dir.join("model.gguf");
    let bases = [tiny::gguf_bpe(), tiny::gguf_spm()];
    let mut tally = Tally::default();
    for case in 0..n {
        let seed = 1_000_000 + case as u64;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut g = bases[case % 2].clone();
        let mut what = vec![];
        let mut bytes = None;
        for _ in 0..if rng.random_bool(0.2) { 2 } else { 1 } {
            match mutate_gguf(&mut rng, &mut g) {
                Mutated::Spec(d) => what.push(d),
                Mutated::Bytes(b, d) => {
                    what.push(d);
                    bytes = Some(b);
                    break;
                }
            }
        }
        let bytes = bytes.unwrap_or_else(|| g.bytes());
        std::fs::write(&path, &bytes).unwrap();
        let vocab = ["bpe", "spm"][case % 2];
        let name = format!("gguf seed {seed} ({vocab}): {}", what.join("; "));
        tally.run(name, || load_and_run(&path));
    }
    tally.finish("gguf", started)
}
