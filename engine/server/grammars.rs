//! The server's grammar engine (`constrain::Grammars`): built at the first request that
//! needs one (it walks the whole vocabulary, a fraction of a second), then shared; each
//! request's grammar is compiled on a blocking thread, off the threads that answer HTTP.

use std::sync::{Arc, OnceLock};

use super::errors::ApiError;
use crate::constrain::{Constraint, GrammarSpec, Grammars};
use crate::error::Error;
use crate::tokenizer::Tokenizer;

pub struct GrammarEngine {
    tokenizer: Arc<Tokenizer>,
    /// The model's logits' width.
    vocab: usize,
    built: OnceLock<Result<Arc<Grammars>, String>>,
}

impl GrammarEngine {
    pub fn new(tokenizer: Arc<Tokenizer>, vocab: usize) -> GrammarEngine {
        GrammarEngine {
            tokenizer,
            vocab,
            built: OnceLock::new(),
        }
    }

    fn grammars(&self) -> Result<Arc<Grammars>, String> {
        self.built
            .get_or_init(|| {
                Grammars::new(self.tokenizer.clone(), self.vocab)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
    }

    /// `spec` compiled for one request; a grammar that does not compile is a 400 naming
    /// `param` (the field it came from).
    pub async fn compile(
        self: &Arc<Self>,
        spec: GrammarSpec,
        param: &'static str,
    ) -> Result<Constraint, ApiError> {
        let me = self.clone();
        let compiled = tokio::task::spawn_blocking(move || {
            let grammars = me.grammars().map_err(ApiError::internal)?;
            grammars.compile(&spec).map_err(|e| match e {
                Error::InvalidRequest(why) => {
                    ApiError::invalid(format!("Invalid value for '{param}': {why}"), Some(param))
                        .with_code("invalid_value")
                }
                e => ApiError::internal(e.to_string()),
            })
        })
        .await;
        compiled.map_err(|e| ApiError::internal(format!("compiling the grammar: {e}")))?
    }
}
