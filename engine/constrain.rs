//! Constrained decoding: a grammar (a JSON schema, any JSON object, a Lark grammar or a
//! regular expression) turned into a token mask at every step, so that the sampler can only
//! choose tokens that keep the output inside the grammar.
//!
//! The grammar engine is `llguidance` (the one vLLM, SGLang and llama.cpp can use): it
//! compiles a grammar against the vocabulary's token bytes once, then answers "which tokens
//! may come next" from its lexer and Earley parser in tens of microseconds a step. Chosen
//! over writing our own for three reasons: JSON Schema is large (references, `anyOf`,
//! string formats) and its conversion to a grammar is where the bugs live; a mask must be
//! computed over the whole vocabulary at every step, which needs a token trie and careful
//! lexing to be cheap; and it is a Rust crate, so it runs in-process on the engine thread.
//!
//! A mask is `[ceil(vocab / 32)]` u32 words, bit `t % 32` of word `t / 32` set when token `t`
//! is allowed: the layout `mask_logits_f32` reads on the device (and its CPU twin on the
//! host), inside the batched sampler.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory, token_bytes_from_tokenizer_json};
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI's `json_object` mode).
    JsonObject,
    /// A JSON value valid under this JSON Schema.
    JsonSchema(Value),
    /// A grammar in llguidance's Lark syntax (`start: ...`), which may embed JSON schemas as
    /// `%json { ... }`.
    Lark(String),
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    Regex(String),
}

impl GrammarSpec {
    /// As llguidance takes it. JSON is written compactly apart from one space after `,` and
    /// `:` (as Python's `json.dumps` writes it): a model is never offered free whitespace,
    /// where a small one can loop on newlines until `max_tokens`.
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(with_layout(json!({"type": "object"})))
            }
            GrammarSpec::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(with_layout(schema.clone()))
            }
            GrammarSpec::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
        }
    }
}

/// `schema` with llguidance's layout options (`x-guidance`) set, unless it sets its own.
pub fn with_layout(mut schema: Value) -> Value {
    if let Value::Object(fields) = &mut schema {
        fields.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// The vocabulary as the grammar engine sees it: each token's bytes (special tokens marked so
/// that no grammar text can produce them) and the tokenizer, for the text a grammar forces.
struct Vocabulary {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Grammar literals are text; an encoding failure leaves the parser to find the
        // tokens byte by byte through the trie.
        self.tokenizer
            .encode(&String::from_utf8_lossy(s), false)
            .unwrap_or_default()
    }
}

fn engine_error(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(format!("the grammar engine: {e}"))
}

/// Compiles grammars for one model: built once (it walks the whole vocabulary), shared by
/// every request.
pub struct Grammars {
    factory: ParserFactory,
    /// Every token that ends generation: allowed wherever the grammar may end.
    eos: Arc<[u32]>,
    /// The model's vocabulary (its logits' width), which may exceed the tokenizer's.
    vocab: usize,
}

impl Grammars {
    /// The grammar engine over `tokenizer`'s tokens, for a model whose logits are `vocab`
    /// wide.
    pub fn new(tokenizer: Arc<Tokenizer>, vocab: usize) -> Result<Grammars> {
        let mut words =
            token_bytes_from_tokenizer_json(&tokenizer.to_json()?).map_err(engine_error)?;
        // Tokens past the tokenizer's (padding rows of the embedding) have no bytes and are
        // never allowed; tokenizer entries past the model's rows could never be produced.
        words.resize(vocab, vec![]);
        let eos: Arc<[u32]> = tokenizer.eos_tokens.iter().copied().collect();
        let Some(&first_eos) = eos.first() else {
            return Err(Error::Tokenizer(
                "the grammar engine needs an end-of-sequence token, and the model has none".into(),
            ));
        };
        let mut info = TokRxInfo::new(vocab as u32, first_eos);
        info.tok_bos = tokenizer.bos_token;
        let trie = TokTrie::from(&info, &words);
        let env = Arc::new(Vocabulary { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&(env as _)).map_err(engine_error)?;
        factory.quiet();
        Ok(Grammars {
            factory,
            eos,
            vocab,
        })
    }

    /// A fresh constraint for one request (clone it for each of `n` choices).
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint> {
        let parser = self
            .factory
            .create_parser(spec.top_level())
            .map_err(|e| Error::InvalidRequest(format!("the grammar: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::InvalidRequest(format!("the grammar: {e}")));
        }
        Ok(Constraint {
            matcher,
            eos: self.eos.clone(),
            mask: vec![0; self.vocab.div_ceil(32)],
            may_end: false,
        })
    }
}

/// One request's place in its grammar.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    eos: Arc<[u32]>,
    /// `[ceil(vocab / 32)]` the last mask computed.
    mask: Vec<u32>,
    /// Whether the grammar could end there.
    may_end: bool,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint {
    /// The tokens that may come next (`[ceil(vocab / 32)]`, bit set: allowed). Where the
    /// grammar may end, every end-of-sequence token is allowed too. Should the grammar engine
    /// fail (a bug, or a limit it enforces), only they are: the request ends with what it
    /// has, rather than with tokens the grammar never allowed.
    pub fn mask(&mut self) -> &[u32] {
        self.mask.fill(0);
        let allowed = self
            .matcher
            .compute_mask()
            .ok()
            .filter(|m| !m.is_zero() && !self.matcher.is_stopped());
        if let Some(m) = &allowed {
            let words = m.as_slice();
            let n = words.len().min(self.mask.len());
            self.mask[..n].copy_from_slice(&words[..n]);
        }
        self.may_end = allowed.is_none() || self.matcher.is_accepting().unwrap_or(true);
        if self.may_end {
            for &t in self.eos.iter() {
                if let Some(w) = self.mask.get_mut(t as usize / 32) {
                    *w |= 1 << (t % 32);
                }
            }
        }
        &self.mask
    }

    /// Whether the grammar could end where the last mask was computed. An end-of-sequence
    /// token chosen where it could not is text the grammar allowed (a model whose config
    /// names an ordinary token as its end), and the request goes on.
    pub fn may_end(&self) -> bool {
        self.may_end
    }

    /// Moves past `token`, the one chosen under the last mask.
    pub fn accept(&mut self, token: u32) {
        // A token the mask allowed is always accepted; an error here leaves the matcher in
        // its error state, whose mask allows only the end.
        let _ = self.matcher.consume_token(token);
    }

    /// Whether the grammar is complete and nothing may follow: the request ends here.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_error()
    }
}

#[cfg(test)]
mod tests;
