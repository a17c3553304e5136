//! One error type for the whole engine. Each variant reads as one line to the user:
//! what went wrong and where, never a backtrace.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path}: not a valid {format} file: {reason}")]
    Format {
        path: PathBuf,
        format: &'static str,
        reason: String,
    },

    #[error("config: {0}")]
    Config(String),

    #[error(
        "unsupported architecture {found:?} (field `{field}`); rustle runs the Llama family: {supported}"
    )]
    UnsupportedArchitecture {
        field: &'static str,
        found: String,
        supported: &'static str,
    },

    #[error("weight {name}: missing from the model files")]
    MissingWeight { name: String },

    #[error("weight {name}: want {want}, found {found}")]
    WeightMismatch {
        name: String,
        want: String,
        found: String,
    },

    #[error("tokenizer: {0}")]
    Tokenizer(String),

    #[error("chat template: {0}")]
    ChatTemplate(String),

    #[error("prompt is {tokens} tokens, but {what} holds only {limit}")]
    PromptTooLong {
        tokens: usize,
        limit: usize,
        what: &'static str,
    },

    #[error("the prompt is empty: give some text with -p or -f")]
    EmptyPrompt,

    #[error(
        "KV cache full: {wanted} more blocks of {block_size} tokens wanted, {free} free of {total} (raise --kv-blocks)"
    )]
    KvCacheFull {
        wanted: usize,
        free: usize,
        total: usize,
        block_size: usize,
    },

    #[error("GPU: {0}")]
    Gpu(String),

    #[error(
        "GPU out of memory allocating {what} ({bytes} bytes; {free} of {total} bytes free): use a smaller model or --kv-blocks"
    )]
    GpuOutOfMemory {
        what: String,
        bytes: usize,
        free: usize,
        total: usize,
    },

    #[error("default model: {0}")]
    DefaultModel(String),

    #[error("{0}")]
    Usage(String),

    #[error(
        "prompt is {bytes} bytes, more than the model's context of {context} tokens can hold (at most {per_token} bytes a token)"
    )]
    PromptTooLongText {
        bytes: usize,
        context: usize,
        per_token: usize,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
