//! `rustle`'s structured-output flags: the output held to a JSON schema, any JSON object, a
//! Lark grammar or a regular expression (`constrain`).

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use rustle::constrain::{Constraint, GrammarSpec, Grammars};
use rustle::error::{Error, Result};
use rustle::tokenizer::Tokenizer;

#[derive(Args, Debug, Default)]
#[group(multiple = false)]
pub struct GrammarArgs {
    /// Hold the output to a JSON object (any).
    #[arg(long)]
    pub json: bool,

    /// Hold the output to a JSON Schema: a file, or the schema itself when it starts with
    /// `{`.
    #[arg(long, value_name = "PATH|JSON")]
    pub json_schema: Option<String>,

    /// Hold the output to a grammar in llguidance's Lark syntax (a file; `start: ...`, with
    /// `%json {...}` for embedded schemas).
    #[arg(long, value_name = "PATH")]
    pub grammar: Option<PathBuf>,

    /// Hold the output to a regular expression (Rust `regex` syntax), matched whole.
    #[arg(long, value_name = "REGEX")]
    pub regex: Option<String>,
}

impl GrammarArgs {
    /// The grammar asked for, read and parsed (a file that cannot be read, or a schema that
    /// is not JSON, is a usage error now, before the model loads).
    pub fn spec(&self) -> Result<Option<GrammarSpec>> {
        let read = |path: &std::path::Path, flag: &str| {
            std::fs::read_to_string(path)
                .map_err(|e| Error::Usage(format!("{flag} {}: {e}", path.display())))
        };
        if self.json {
            return Ok(Some(GrammarSpec::JsonObject));
        }
        if let Some(s) = &self.json_schema {
            let text = match s.trim_start().starts_with('{') {
                true => s.clone(),
                false => read(s.as_ref(), "--json-schema")?,
            };
            let schema = serde_json::from_str(&text)
                .map_err(|e| Error::Usage(format!("--json-schema: not JSON: {e}")))?;
            return Ok(Some(GrammarSpec::JsonSchema(schema)));
        }
        if let Some(path) = &self.grammar {
            return Ok(Some(GrammarSpec::Lark(read(path, "--grammar")?)));
        }
        Ok(self.regex.clone().map(GrammarSpec::Regex))
    }
}

/// `spec` compiled against the model's vocabulary (`vocab` logits wide).
pub fn compile(spec: &GrammarSpec, tokenizer: &Arc<Tokenizer>, vocab: usize) -> Result<Constraint> {
    let grammars = Grammars::new(tokenizer.clone(), vocab)?;
    grammars.compile(spec).map_err(|e| match e {
        Error::InvalidRequest(why) => Error::Usage(why),
        e => e,
    })
}
