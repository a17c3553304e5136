//! The grammar masks on a real vocabulary (the tiny Qwen3's byte-level BPE): a random walk
//! through the allowed tokens always ends in text the grammar accepts.

use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

/// The tiny Qwen3's tokenizer, with its config's end token: id 256, which is also the text
/// "he" (the tiny model's quirk, kept: where the grammar cannot end, it is text).
fn tokenizer() -> Arc<Tokenizer> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/tiny-qwen3");
    let tok = Tokenizer::from_hf_folder(&dir, &[256], None).unwrap();
    assert!(tok.eos_tokens.contains(&256) && tok.decode(&[256]).unwrap() == "he");
    Arc::new(tok)
}

fn allowed(mask: &[u32], t: usize) -> bool {
    (mask[t / 32] >> (t % 32)) & 1 == 1
}

/// Tokens chosen at random among those each mask allows (an end token as soon as one is
/// allowed, half the time), until the constraint finishes, an end token is chosen, or
/// `limit` tokens; the text and whether it ended.
fn walk(g: &Grammars, spec: &GrammarSpec, tok: &Tokenizer, seed: u64, limit: usize) -> String {
    let mut c = g.compile(spec).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ids = vec![];
    for _ in 0..limit {
        let mask = c.mask().to_vec();
        let choices: Vec<usize> = (0..g.vocab).filter(|&t| allowed(&mask, t)).collect();
        assert!(!choices.is_empty(), "a mask with nothing allowed");
        let ends: Vec<usize> = choices
            .iter()
            .copied()
            .filter(|&t| tok.eos_tokens.contains(&(t as u32)))
            .collect();
        let t = if !ends.is_empty() && rng.random::<bool>() {
            ends[0]
        } else {
            choices[rng.random_range(0..choices.len())]
        };
        if tok.eos_tokens.contains(&(t as u32)) && c.may_end() {
            break;
        }
        c.accept(t as u32);
        ids.push(t as u32);
        if c.is_finished() {
            break;
        }
    }
    tok.decode(&ids).unwrap()
}

#[test]
fn random_walks_through_a_schema_give_valid_json() {
    let tok = tokenizer();
    let g = Grammars::new(tok.clone(), tok.vocab_size() + 7).unwrap();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}
        },
        "required": ["name", "n", "ok", "tags"],
        "additionalProperties": false
    });
    for seed in 0..20 {
        let text = walk(
            &g,
            &GrammarSpec::JsonSchema(schema.clone()),
            &tok,
            seed,
            400,
        );
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 4, "{text}");
        assert!(o["name"].as_str().unwrap().chars().count() <= 6, "{text}");
        assert!((0..=99).contains(&o["n"].as_i64().unwrap()), "{text}");
        assert!(o["ok"].is_boolean(), "{text}");
        let tags = o["tags"].as_array().unwrap();
        assert!(
            tags.len() <= 3 && tags.iter().all(|t| t == "a" || t == "b"),
            "{text}"
        );
        // The layout: one space after each separator, nothing else between tokens.
        assert!(text.starts_with("{\"") && !text.contains("\n"), "{text}");
    }
}

#[test]
fn the_first_mask_of_a_json_object_allows_only_an_opening_brace() {
    let tok = tokenizer();
    let g = Grammars::new(tok.clone(), tok.vocab_size()).unwrap();
    let mut c = g.compile(&GrammarSpec::JsonObject).unwrap();
    let mask = c.mask().to_vec();
    let n = (0..g.vocab).filter(|&t| allowed(&mask, t)).count();
    assert!(n > 0);
    for t in (0..g.vocab).filter(|&t| allowed(&mask, t)) {
        let text = tok.decode(&[t as u32]).unwrap();
        assert!(text.starts_with('{'), "token {t} ({text:?}) allowed first");
    }
    // An end token is not allowed before the object closes.
    assert!(!tok.eos_tokens.iter().any(|&e| allowed(&mask, e as usize)));
}

#[test]
fn a_regex_is_matched_whole_and_then_ends() {
    let tok = tokenizer();
    let g = Grammars::new(tok.clone(), tok.vocab_size()).unwrap();
    for seed in 0..10 {
        let text = walk(
            &g,
            &GrammarSpec::Regex("(yes|no), [0-9]{2}".into()),
            &tok,
            seed,
            50,
        );
        let (word, num) = text.split_once(", ").unwrap_or_else(|| panic!("{text:?}"));
        assert!(word == "yes" || word == "no", "{text:?}");
        assert!(
            num.len() == 2 && num.chars().all(|c| c.is_ascii_digit()),
            "{text:?}"
        );
    }
}

#[test]
fn a_lark_grammar_with_embedded_json() {
    let tok = tokenizer();
    let g = Grammars::new(tok.clone(), tok.vocab_size()).unwrap();
    let lark = r#"start: "<call>" %json {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x"], "additionalProperties": false} "</call>""#;
    for seed in 0..5 {
        let text = walk(&g, &GrammarSpec::Lark(lark.into()), &tok, seed, 50);
        let inner = text
            .strip_prefix("<call>")
            .and_then(|t| t.strip_suffix("</call>"))
            .unwrap_or_else(|| panic!("{text:?}"));
        let v: Value = serde_json::from_str(inner).unwrap();
        assert!(
            v["x"].as_i64().is_some_and(|x| (0..=9).contains(&x)),
            "{text}"
        );
    }
}

#[test]
fn bad_grammars_are_refused_with_the_reason() {
    let tok = tokenizer();
    let g = Grammars::new(tok.clone(), tok.vocab_size()).unwrap();
    let e = g
        .compile(&GrammarSpec::Lark("start: nothing_defined".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("nothing_defined"), "{e}");
    let e = g
        .compile(&GrammarSpec::JsonSchema(json!({"type": "no-such-type"})))
        .unwrap_err()
        .to_string();
    assert!(e.contains("the grammar"), "{e}");
}
