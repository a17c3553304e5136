//! tokenizer.json: components swapped for valid and broken ones, values anywhere in the
//! tree, truncation (inside the decoder too), bits.

use std::time::Instant;

use libtest_mimic::Failed;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustle::tokenizer::Tokenizer;
use serde_json::{Value, json};

use crate::common::tiny;
use crate::folder::Folder;
use crate::tally::{Outcome, Tally};
use crate::values::{flip, mutate_tree, pick, truncate};

/// Tokenizer components a `tokenizer.json` may hold, valid and not: the failures the
/// campaign found (an empty Replace pattern), patterns that do not compile, padding and
/// truncation sizes that would allocate or cut.
pub(crate) fn tokenizer_parts() -> Vec<Value> {
    vec![
        json!({"type": "Replace", "pattern": {"String": ""}, "content": "x"}),
        json!({"type": "Replace", "pattern": {"Regex": ""}, "content": "x"}),
        json!({"type": "Replace", "pattern": {"Regex": "("}, "content": "x"}),
        json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}),
        json!({"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}),
        json!({"type": "Sequence", "normalizers": [{"type": "Replace", "pattern": {"String": ""}, "content": ""}]}),
        json!({"type": "Prepend", "prepend": ""}),
        json!({"type": "Strip", "strip_left": true, "strip_right": true}),
        json!({"type": "Split", "pattern": {"Regex": ""}, "behavior": "Isolated", "invert": false}),
        json!({"type": "Split", "pattern": {"Regex": "(?!x)"}, "behavior": "Removed", "invert": true}),
        json!({"type": "Split", "pattern": {"String": ""}, "behavior": "Isolated", "invert": false}),
        json!({"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "always", "split": true}),
        json!({"type": "Whitespace"}),
        json!({"type": "Punctuation", "behavior": "Isolated"}),
        json!({"type": "Digits", "individual_digits": false}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
        json!({"type": "Strip", "content": " ", "start": 100000, "stop": 100000}),
        json!({"type": "WordPiece", "prefix": "##", "cleanup": true}),
        json!({"type": "CTC", "pad_token": "<pad>", "word_delimiter_token": "|", "cleanup": true}),
        json!({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}], "pair": [], "special_tokens": {}}),
        json!({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|end|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {"<|end|>": {"id": "<|end|>", "ids": [4294967295u32], "tokens": ["<|end|>"]}}}),
        json!({"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]}),
        json!({"strategy": {"Fixed": 1u64 << 40}, "direction": "Right", "pad_to_multiple_of": null, "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"}),
        json!({"strategy": "BatchLongest", "direction": "Left", "pad_to_multiple_of": 1u64 << 40, "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"}),
        json!({"direction": "Right", "max_length": 0, "strategy": "LongestFirst", "stride": 0}),
        json!({"direction": "Right", "max_length": 1, "strategy": "LongestFirst", "stride": 5}),
        json!({"id": 4294967295u32, "content": "x", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}),
        json!({"id": 3, "content": "", "single_word": true, "lstrip": true, "rstrip": true, "normalized": true, "special": false}),
        json!({"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "zz"}),
        json!({"type": "Unigram", "unk_id": 5, "vocab": [["a", 0.0]], "byte_fallback": true}),
        json!({"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100, "vocab": {}}),
        json!(["Ġ", "t"]),
        json!("Ġ x"),
        json!(""),
    ]
}

pub(crate) const TOKENIZER_KEYS: [&str; 7] = [
    "normalizer",
    "pre_tokenizer",
    "post_processor",
    "decoder",
    "padding",
    "truncation",
    "added_tokens",
];

pub(crate) fn cases(n: usize) -> Result<(), Failed> {
    let started = Instant::now();
    let folder = Folder::new("mutation-tokenizer");
    let parts = tokenizer_parts();
    let base = tiny::hf_tokenizer();
    let base_text = base.to_string().into_bytes();
    let decoder_at = base_text
        .windows(9)
        .position(|w| w == b"\"decoder\"")
        .unwrap();
    let mut tally = Tally::default();
    for case in 0..n {
        let seed = 4_000_000 + case as u64;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut tok = base.clone();
        let (bytes, what) = match rng.random_range(0..10) {
            0..=2 => {
                let key = *pick(&mut rng, &TOKENIZER_KEYS);
                let p = pick(&mut rng, &parts).clone();
                let d = format!("{key} = {p}");
                if key == "added_tokens" {
                    tok[key].as_array_mut().unwrap().push(p);
                } else {
                    tok[key] = p;
                }
                (tok.to_string().into_bytes(), d)
            }
            3..=5 => {
                let d = mutate_tree(&mut rng, &mut tok, &parts);
                (tok.to_string().into_bytes(), d)
            }
            6 => {
                // Cut inside the decoder, where the crate itself panicked.
                let at = decoder_at + rng.random_range(0..120);
                (
                    base_text[..at].to_vec(),
                    format!("cut at byte {at}, in the decoder"),
                )
            }
            7 => {
                let mut b = base_text.clone();
                let d = truncate(&mut rng, &mut b);
                (b, d)
            }
            _ => {
                let mut b = base_text.clone();
                let len = b.len();
                let d = flip(&mut rng, &mut b, len);
                (b, d)
            }
        };
        let name = format!("tokenizer.json seed {seed}: {what}");
        folder.with("tokenizer.json", Some(&bytes), |dir| {
            tally.run(name, || {
                match Tokenizer::from_hf_folder(dir, &[260], None) {
                    Err(e) => Outcome::Refused(e.to_string()),
                    Ok(t) => {
                        let ran = ["the hello 12<|end|>", "", " \u{2581} ünï 🦀 \n\t"]
                            .iter()
                            .all(|text| match t.encode(text, true) {
                                Ok(ids) => t.decode(&ids).is_ok(),
                                Err(_) => false,
                            });
                        Outcome::Loaded(ran)
                    }
                }
            });
        });
    }
    tally.finish("tokenizer", started)
}
