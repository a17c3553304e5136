//! Text to token ids and back, through Hugging Face's `tokenizers` crate.
//!
//! A model folder brings its own `tokenizer.json`. A GGUF file brings the pieces in its
//! metadata (`tokenizer.ggml.*`); we rebuild the equivalent `tokenizer.json` from them and
//! hand it to the same crate, so both sources share one encoder.
//!
//! The crate panics on some inputs it half-accepts (a `tokenizer.json` cut inside its
//! decoder, a Replace normalizer with an empty pattern), so every call into it goes through
//! `guarded`, which turns such a panic into an error.

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Once;

use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::weights::gguf::{GgufFile, MetaValue};

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Tokens that end generation.
    pub eos_tokens: Vec<u32>,
    pub bos_token: Option<u32>,
    /// A Jinja chat template, if the model has one.
    pub chat_template: Option<String>,
    /// The text of the BOS and EOS tokens, which templates refer to as `bos_token`/`eos_token`.
    pub bos_text: String,
    pub eos_text: String,
}

fn tok_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

/// The most bytes of text one token stands for, generously: natural text averages about 4
/// and code under 10. A text longer than a context's worth of these cannot fit the context,
/// and is refused before it is tokenized (which costs about 180 bytes of memory per byte).
pub const MAX_BYTES_PER_TOKEN: usize = 32;

/// The longest GGUF vocabulary entry rustle accepts. Real pieces are a few dozen bytes;
/// rebuilding a SentencePiece vocabulary's merges costs the square of a piece's length.
const MAX_TOKEN_BYTES: usize = 1024;

thread_local! {
    /// Set while `guarded` runs: a panic then is answered with an error, not reported.
    static GUARDED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, a call into the `tokenizers` crate, turning a panic inside it into an error
/// that says what was being done. The panic hook (which reports a panic as a bug) is wrapped
/// once so that it stays quiet for the panics caught here.
fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T> {
    static QUIET_HOOK: Once = Once::new();
    QUIET_HOOK.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !GUARDED.with(Cell::get) {
                report(info);
            }
        }));
    });
    let outer = GUARDED.with(|g| g.replace(true));
    let result = std::panic::catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(outer));
    result.map_err(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let msg: String = msg.lines().next().unwrap_or("").chars().take(200).collect();
        Error::Tokenizer(format!("{what}: the tokenizers library failed ({msg})"))
    })
}

/// Parses a `tokenizer.json` (`source` names it in messages). The text is checked to be JSON
/// first, so a truncated file says so; padding and truncation are switched off, as a
/// generation prompt must be neither cut nor padded (and a corrupt padding length must not
/// size an allocation); one short text is encoded, so a tokenizer that fails on every text
/// is refused now rather than at the prompt.
fn parse_tokenizer_json(json: &[u8], source: &str) -> Result<tokenizers::Tokenizer> {
    serde_json::from_slice::<serde::de::IgnoredAny>(json)
        .map_err(|e| Error::Tokenizer(format!("{source}: not valid JSON: {e}")))?;
    let mut inner = guarded(source, || tokenizers::Tokenizer::from_bytes(json))?
        .map_err(|e| Error::Tokenizer(format!("{source}: {e}")))?;
    inner.with_padding(None);
    inner
        .with_truncation(None)
        .map_err(|e| Error::Tokenizer(format!("{source}: {e}")))?;
    guarded(&format!("{source}: encoding a test text"), || {
        inner.encode("Hello, world! 123", true)
    })?
    .map_err(|e| Error::Tokenizer(format!("{source}: encoding a test text: {e}")))?;
    Ok(inner)
}

impl Tokenizer {
    /// `text` as token ids. `special` adds what the model puts around a plain prompt (the BOS
    /// token for Llama 2); chat prompts pass false, their template writes those tokens itself.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        let enc = guarded("encoding", || self.inner.encode(text, special))?.map_err(tok_err)?;
        Ok(enc.get_ids().to_vec())
    }

    /// As `encode`, for a prompt that must fit `context` tokens: a text too long to fit even
    /// at `MAX_BYTES_PER_TOKEN` is refused before the (costly) tokenization.
    pub fn encode_prompt(&self, text: &str, special: bool, context: usize) -> Result<Vec<u32>> {
        if text.len() / MAX_BYTES_PER_TOKEN >= context {
            return Err(Error::PromptTooLongText {
                bytes: text.len(),
                context,
                per_token: MAX_BYTES_PER_TOKEN,
            });
        }
        self.encode(text, special)
    }

    /// Token ids as text, special tokens left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        guarded("decoding", || self.inner.decode(ids, true))?.map_err(tok_err)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The tokenizer as a `tokenizer.json` value (for a GGUF file, the one rebuilt from its
    /// metadata): the grammar engine reads each token's bytes from it.
    pub fn to_json(&self) -> Result<Value> {
        let text = self.inner.to_string(false).map_err(tok_err)?;
        serde_json::from_str(&text).map_err(tok_err)
    }

    pub fn id_of(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// A Hugging Face folder: `tokenizer.json`, plus `tokenizer_config.json` for the chat
    /// template and special tokens when it is there.
    pub fn from_hf_folder(
        dir: &Path,
        eos_from_config: &[u32],
        bos_from_config: Option<u32>,
    ) -> Result<Tokenizer> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(Error::Tokenizer(format!("{}: not found", path.display())));
        }
        let json = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let inner = parse_tokenizer_json(&json, &path.display().to_string())?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Value = match std::fs::read_to_string(&cfg_path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| Error::Format {
                path: cfg_path.clone(),
                format: "JSON",
                reason: e.to_string(),
            })?,
            Err(_) => Value::Null,
        };
        let token_text = |key: &str| -> Option<String> {
            match &cfg[key] {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
                _ => None,
            }
        };
        let chat_template = folder_chat_template(dir, &cfg)?;
        let bos_text = token_text("bos_token").unwrap_or_default();
        let eos_text = token_text("eos_token").unwrap_or_default();
        let mut eos_tokens = eos_from_config.to_vec();
        if let Some(id) = inner.token_to_id(&eos_text)
            && !eos_tokens.contains(&id)
        {
            eos_tokens.push(id);
        }
        let bos_token = bos_from_config.or_else(|| inner.token_to_id(&bos_text));
        Ok(Tokenizer {
            inner,
            eos_tokens,
            bos_token,
            chat_template,
            bos_text,
            eos_text,
        })
    }

    /// Rebuilds the tokenizer from a GGUF file's metadata.
    pub fn from_gguf(g: &GgufFile) -> Result<Tokenizer> {
        let strings = |key: &str| -> Result<Vec<String>> {
            g.get(key)
                .and_then(MetaValue::as_array)
                .ok_or_else(|| Error::Tokenizer(format!("GGUF metadata has no `{key}` array")))?
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| Error::Tokenizer(format!("`{key}` holds a non-string")))
                })
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        if let Some((i, t)) = tokens
            .iter()
            .enumerate()
            .find(|(_, t)| t.len() > MAX_TOKEN_BYTES)
        {
            return Err(Error::Tokenizer(format!(
                "GGUF token {i} is {} bytes long; rustle reads tokens of up to {MAX_TOKEN_BYTES}",
                t.len()
            )));
        }
        let types: Vec<i64> = match g
            .get("tokenizer.ggml.token_type")
            .and_then(MetaValue::as_array)
        {
            Some(a) => a.iter().map(|v| v.as_f64().unwrap_or(1.0) as i64).collect(),
            None => vec![1; tokens.len()],
        };
        if types.len() != tokens.len() {
            return Err(Error::Tokenizer(format!(
                "GGUF `tokenizer.ggml.token_type` has {} entries for {} tokens",
                types.len(),
                tokens.len()
            )));
        }
        // An id that does not fit a u32 names no token (ids past the vocabulary are caught
        // with the model's configuration).
        let id = |key: &str| {
            g.get(key)
                .and_then(MetaValue::as_u64)
                .and_then(|v| u32::try_from(v).ok())
        };
        let bos = id("tokenizer.ggml.bos_token_id");
        let eos = id("tokenizer.ggml.eos_token_id");
        let flag = |key: &str| g.get(key).and_then(MetaValue::as_bool);
        let model = g
            .get("tokenizer.ggml.model")
            .and_then(MetaValue::as_str)
            .unwrap_or("gpt2");
        let pre = g
            .get("tokenizer.ggml.pre")
            .and_then(MetaValue::as_str)
            .unwrap_or("default");
        let json = match model {
            "gpt2" => {
                let merges = strings("tokenizer.ggml.merges")?;
                bpe_json(&tokens, &types, &merges, pre)?
            }
            "llama" => {
                let scores: Vec<f64> = g
                    .get("tokenizer.ggml.scores")
                    .and_then(MetaValue::as_array)
                    .ok_or_else(|| Error::Tokenizer("GGUF `llama` tokenizer has no scores".into()))?
                    .iter()
                    .map(|v| v.as_f64().unwrap_or(0.0))
                    .collect();
                let unk = id("tokenizer.ggml.unknown_token_id").unwrap_or(0) as usize;
                let space_prefix = flag("tokenizer.ggml.add_space_prefix").unwrap_or(true);
                spm_json(&tokens, &types, &scores, unk, space_prefix)?
            }
            other => {
                return Err(Error::Tokenizer(format!(
                    "GGUF tokenizer model {other:?} is not supported (gpt2 and llama are)"
                )));
            }
        };
        let add_bos = flag("tokenizer.ggml.add_bos_token").unwrap_or(model == "llama");
        let json = with_bos_post_processor(json, add_bos.then_some(bos).flatten(), &tokens);
        let inner = parse_tokenizer_json(
            json.to_string().as_bytes(),
            "the tokenizer rebuilt from GGUF metadata",
        )?;
        let text_of = |id: Option<u32>| {
            id.and_then(|i| tokens.get(i as usize))
                .cloned()
                .unwrap_or_default()
        };
        Ok(Tokenizer {
            inner,
            eos_tokens: eos.into_iter().collect(),
            bos_token: bos,
            chat_template: g
                .get("tokenizer.chat_template")
                .and_then(MetaValue::as_str)
                .map(str::to_owned),
            bos_text: text_of(bos),
            eos_text: text_of(eos),
        })
    }
}

/// The folder's chat template: `chat_template.jinja` (where transformers 5 saves it), else
/// `chat_template.json` (`{"chat_template": ...}`, as processors save it), else
/// `tokenizer_config.json`'s `chat_template`: a string, or a list of named templates of
/// which the one named "default" is used.
fn folder_chat_template(dir: &Path, tokenizer_config: &Value) -> Result<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        let text = std::fs::read(&jinja).map_err(|e| Error::io(&jinja, e))?;
        return String::from_utf8(text)
            .map(Some)
            .map_err(|_| Error::Format {
                path: jinja,
                format: "chat template",
                reason: "not UTF-8 text".into(),
            });
    }
    let json = dir.join("chat_template.json");
    let from_json;
    let holder = if json.is_file() {
        let text = std::fs::read_to_string(&json).map_err(|e| Error::io(&json, e))?;
        from_json = serde_json::from_str::<Value>(&text).map_err(|e| Error::Format {
            path: json.clone(),
            format: "JSON",
            reason: e.to_string(),
        })?;
        &from_json
    } else {
        tokenizer_config
    };
    Ok(match &holder["chat_template"] {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(str::to_owned),
        _ => None,
    })
}

/// GGUF token type 3: a control token (`<|im_end|>`): matched whole, never split.
const CONTROL: i64 = 3;
/// GGUF token type 4: a user-defined token, matched whole but printed as text.
const USER_DEFINED: i64 = 4;
/// GGUF token type 5: an unused id, such as the `[PAD151700]` entries converters add to fill
/// a vocabulary out to the embedding's rows. transformers' tokenizer has no such ids and
/// decodes them as nothing; as special tokens they are skipped the same way.
const UNUSED: i64 = 5;

fn added_tokens(tokens: &[String], types: &[i64]) -> Vec<Value> {
    tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|(_, (_, t))| [CONTROL, USER_DEFINED, UNUSED].contains(t))
        .map(|(i, (tok, t))| {
            json!({"id": i, "content": tok, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": *t != USER_DEFINED})
        })
        .collect()
}

/// Llama 3's split pattern (GGUF `pre` = `llama-bpe`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: the same, but digits one at a time.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o's (tiktoken's `o200k_base`; GGUF `pre` = `gpt-4o`: Phi-4-mini): a word is an
/// optional leading symbol, capitals then lowercase letters (so "HelloWorld" is two words),
/// and a contraction's suffix; numbers go three digits at a time; a run of symbols takes
/// the line breaks and slashes after it.
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A byte-level BPE `tokenizer.json` (GPT-2 style, GGUF model `gpt2`).
fn bpe_json(tokens: &[String], types: &[i64], merges: &[String], pre: &str) -> Result<Value> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
    let (normalizer, pre_tokenizer, ignore_merges) = match pre {
        "default" | "gpt2" => (Value::Null, byte_level(true), false),
        "smollm" => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
            false,
        ),
        "llama-bpe" | "llama3" => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false)]}),
            true,
        ),
        "qwen2" => (
            json!({"type": "NFC"}),
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2_SPLIT), byte_level(false)]}),
            false,
        ),
        "gpt-4o" => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [split(GPT4O_SPLIT), byte_level(false)]}),
            false,
        ),
        other => {
            return Err(Error::Tokenizer(format!(
                "GGUF pre-tokenizer {other:?} is not supported (default, gpt2, smollm, llama-bpe, qwen2, gpt-4o are)"
            )));
        }
    };
    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    Ok(json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added_tokens(tokens, types),
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignore_merges,
                  "vocab": vocab, "merges": merges}
    }))
}

/// A SentencePiece-style BPE `tokenizer.json` (GGUF model `llama`: Llama 2, TinyLlama,
/// Mistral). The file has scores, not merges: a pair may merge when the joined piece is in
/// the vocabulary, and pieces with higher scores merge first.
fn spm_json(
    tokens: &[String],
    types: &[i64],
    scores: &[f64],
    unk: usize,
    space_prefix: bool,
) -> Result<Value> {
    if scores.len() != tokens.len() {
        return Err(Error::Tokenizer(format!(
            "{} tokens but {} scores",
            tokens.len(),
            scores.len()
        )));
    }
    let ids: std::collections::HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut merges: Vec<(f64, usize, usize, &str, &str)> = vec![];
    for (i, piece) in tokens.iter().enumerate() {
        if types[i] != 1 {
            continue; // only normal pieces come from merges
        }
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) {
                merges.push((scores[i], li, ri, l, r));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let merges: Vec<Value> = merges.iter().map(|m| json!([m.3, m.4])).collect();
    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    let mut normalizers = vec![];
    if space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}));
    Ok(json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added_tokens(tokens, types),
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": if space_prefix { 1 } else { 0 }, "stop": 0}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": tokens.get(unk),
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    }))
}

/// Adds a post-processor that puts `bos` before every plain prompt.
fn with_bos_post_processor(mut json: Value, bos: Option<u32>, tokens: &[String]) -> Value {
    if let Some(text) = bos.and_then(|id| tokens.get(id as usize)) {
        let id = bos.unwrap();
        json["post_processor"] = json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": text, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": text, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {text.as_str(): {"id": text, "ids": [id], "tokens": [text]}}
        });
    }
    json
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::gguf::tests::Writer;

    fn gguf_tokenizer(w: &Writer) -> Tokenizer {
        let dir = std::env::temp_dir().join(format!("rustle-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("t{}.gguf", rand::random::<u32>()));
        std::fs::write(&path, w.finish()).unwrap();
        let g = GgufFile::open(&path).unwrap();
        Tokenizer::from_gguf(&g).unwrap()
    }

    #[test]
    fn gpt2_style_bpe_from_metadata_round_trips() {
        // Byte-level alphabet: 'Ġ' stands for a space.
        let tokens = [
            "<|end|>", "a", "b", "c", "Ġ", "1", "2", "ab", "Ġa", "Ġab", "abc", "[PAD11]",
        ];
        let mut w = Writer::new();
        w.meta_str("tokenizer.ggml.model", "gpt2")
            .meta_str("tokenizer.ggml.pre", "smollm")
            .meta_strs("tokenizer.ggml.tokens", &tokens)
            .meta_i32s(
                "tokenizer.ggml.token_type",
                &[3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 5],
            )
            .meta_strs("tokenizer.ggml.merges", &["Ġ a", "Ġa b", "a b", "ab c"])
            .meta_u32("tokenizer.ggml.eos_token_id", 0)
            .meta_bool("tokenizer.ggml.add_bos_token", false);
        let t = gguf_tokenizer(&w);
        let ids = t.encode("abc ab12<|end|>", true).unwrap();
        // "abc" | " ab" | "1" | "2" (digits split one by one) | the control token whole.
        assert_eq!(ids, vec![10, 9, 5, 6, 0]);
        assert_eq!(t.decode(&ids).unwrap(), "abc ab12");
        // An unused id (a converter's padding of the vocabulary) decodes as nothing.
        assert_eq!(t.decode(&[7, 11, 3]).unwrap(), "abc");
        assert_eq!(t.eos_tokens, vec![0]);
        assert_eq!(t.eos_text, "<|end|>");
    }

    /// GPT-4o's split: merges that would cross its word and number boundaries never apply
    /// under it, and do under GPT-2's, which keeps "HelloWorld" and "12345" whole.
    #[test]
    fn gpt4o_splits_words_at_capitals_and_numbers_in_threes() {
        let mut tokens: Vec<String> = ["H", "e", "l", "o", "W", "r", "d", "1", "2", "3", "4", "5"]
            .map(String::from)
            .to_vec();
        tokens.extend(["oW", "34", "He", "ll"].map(String::from));
        let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let tokenize = |pre: &str| {
            let mut w = Writer::new();
            w.meta_str("tokenizer.ggml.model", "gpt2")
                .meta_str("tokenizer.ggml.pre", pre)
                .meta_strs("tokenizer.ggml.tokens", &tokens)
                .meta_i32s("tokenizer.ggml.token_type", &vec![1; tokens.len()])
                .meta_strs("tokenizer.ggml.merges", &["o W", "3 4", "H e", "l l"])
                .meta_bool("tokenizer.ggml.add_bos_token", false);
            let t = gguf_tokenizer(&w);
            let ids = t.encode("HelloWorld12345", false).unwrap();
            assert_eq!(t.decode(&ids).unwrap(), "HelloWorld12345");
            ids.iter().map(|&i| tokens[i as usize]).collect::<Vec<_>>()
        };
        // "Hello" | "World" | "123" | "45".
        assert_eq!(
            tokenize("gpt-4o"),
            [
                "He", "ll", "o", "W", "o", "r", "l", "d", "1", "2", "3", "4", "5"
            ]
        );
        // "HelloWorld" | "12345".
        assert_eq!(
            tokenize("gpt2"),
            ["He", "ll", "oW", "o", "r", "l", "d", "1", "2", "34", "5"]
        );
    }

    #[test]
    fn sentencepiece_style_from_scores() {
        let tokens = [
            "<unk>",
            "<s>",
            "</s>",
            "\u{2581}",
            "h",
            "i",
            "\u{2581}h",
            "\u{2581}hi",
            "<0x21>",
        ];
        let mut w = Writer::new();
        w.meta_str("tokenizer.ggml.model", "llama")
            .meta_strs("tokenizer.ggml.tokens", &tokens)
            .meta_i32s("tokenizer.ggml.token_type", &[2, 3, 3, 1, 1, 1, 1, 1, 6])
            .meta_u32("tokenizer.ggml.bos_token_id", 1)
            .meta_u32("tokenizer.ggml.eos_token_id", 2);
        // Integer scores read as numbers just as f32 ones do.
        w.meta_i32s("tokenizer.ggml.scores", &[0, 0, 0, -1, -2, -3, -4, -5, 0]);
        let t = gguf_tokenizer(&w);
        // BOS added for a plain prompt; "hi" gets the space prefix and merges to "▁hi";
        // "!" has no piece and falls back to its byte token.
        let ids = t.encode("hi!", true).unwrap();
        assert_eq!(ids, vec![1, 7, 8]);
        assert_eq!(t.decode(&ids).unwrap(), "hi!");
        assert_eq!(t.encode("hi", false).unwrap(), vec![7]);
    }

    #[test]
    fn unsupported_pre_tokenizer_is_named() {
        let mut w = Writer::new();
        w.meta_str("tokenizer.ggml.model", "gpt2")
            .meta_str("tokenizer.ggml.pre", "falcon")
            .meta_strs("tokenizer.ggml.tokens", &["a"])
            .meta_strs("tokenizer.ggml.merges", &[]);
        let dir = std::env::temp_dir();
        let path = dir.join(format!("rustle-tok-bad-{}.gguf", std::process::id()));
        std::fs::write(&path, w.finish()).unwrap();
        let g = GgufFile::open(&path).unwrap();
        let e = Tokenizer::from_gguf(&g).err().unwrap().to_string();
        assert!(e.contains("falcon"), "{e}");
    }

    #[test]
    fn a_panic_in_the_library_is_an_error() {
        let e = guarded("probing", || -> u32 { panic!("inside the crate") }).unwrap_err();
        assert_eq!(
            e.to_string(),
            "tokenizer: probing: the tokenizers library failed (inside the crate)"
        );
        // Nested calls restore the outer state.
        let ok = guarded("outer", || guarded("inner", || 1).unwrap() + 1).unwrap();
        assert_eq!(ok, 2);
        assert!(!GUARDED.with(Cell::get));
    }

    #[test]
    fn token_types_must_match_the_tokens() {
        let mut w = Writer::new();
        w.meta_str("tokenizer.ggml.model", "llama")
            .meta_strs("tokenizer.ggml.tokens", &["<unk>", "a", "b"])
            .meta_i32s("tokenizer.ggml.token_type", &[2, 1])
            .meta_i32s("tokenizer.ggml.scores", &[0, 0, 0]);
        let path =
            std::env::temp_dir().join(format!("rustle-tok-types-{}.gguf", std::process::id()));
        std::fs::write(&path, w.finish()).unwrap();
        let e = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap())
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "tokenizer: GGUF `tokenizer.ggml.token_type` has 2 entries for 3 tokens"
        );
    }

    #[test]
    fn chat_templates_are_found_where_transformers_saves_them() {
        let dir = std::env::temp_dir().join(format!("rustle-tok-chat-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let named = json!({"chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "named default"}]});
        assert_eq!(
            folder_chat_template(&dir, &named).unwrap().as_deref(),
            Some("named default")
        );
        assert_eq!(
            folder_chat_template(&dir, &json!({"chat_template": "plain"}))
                .unwrap()
                .as_deref(),
            Some("plain")
        );
        assert_eq!(folder_chat_template(&dir, &Value::Null).unwrap(), None);
        // chat_template.json (processors) beats tokenizer_config.json ...
        std::fs::write(
            dir.join("chat_template.json"),
            r#"{"chat_template": "from json"}"#,
        )
        .unwrap();
        assert_eq!(
            folder_chat_template(&dir, &named).unwrap().as_deref(),
            Some("from json")
        );
        // ... and chat_template.jinja (transformers 5) beats both.
        std::fs::write(dir.join("chat_template.jinja"), "from jinja").unwrap();
        assert_eq!(
            folder_chat_template(&dir, &named).unwrap().as_deref(),
            Some("from jinja")
        );
    }
}
