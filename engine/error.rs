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

    /// A request the serving engine refuses up front (the OpenAI server's 400).
    #[error("invalid request: {0}")]
    InvalidRequest(String),

    #[error(
        "KV cache full: {wanted} more blocks of {block_size} tokens wanted, {free} free of {total} (raise --kv-blocks)"
    )]
    KvCacheFull {
        wanted: usize,
        free: usize,
        total: usize,
        block_size: usize,
    },

    /// No GPU to run on: no driver, or none the driver reports.
    #[error("GPU: {0}")]
    NoGpu(String),

    /// A CUDA driver call failed; `what` says which and why it was made.
    #[error("GPU: {what}: {source}")]
    Driver {
        what: String,
        #[source]
        source: cudarc::driver::DriverError,
    },

    /// A cuBLAS call failed (cuBLAS is the reference the measuring tools compare with).
    #[error("cuBLAS: {what}: {source}")]
    Cublas {
        what: String,
        #[source]
        source: cudarc::cublas::result::CublasError,
    },

    /// The model does not fit the GPU's kernels (a head too wide, a width they cannot
    /// split), or the GPU lacks an instruction a kernel needs.
    #[error("GPU: {0}")]
    Unsupported(String),

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

    /// An environment variable set to a value it does not take (`knobs`).
    #[error("{name}={value}: want {want}")]
    Knob {
        name: &'static str,
        value: String,
        want: String,
    },

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

    /// `map_err` for a driver call: `.map_err(Error::driver("copying the batch"))`.
    pub fn driver(what: &str) -> impl Fn(cudarc::driver::DriverError) -> Error + Copy + '_ {
        move |source| Error::Driver {
            what: what.to_owned(),
            source,
        }
    }

    /// `map_err` for a cuBLAS call.
    pub fn cublas(what: &str) -> impl Fn(cudarc::cublas::result::CublasError) -> Error + Copy + '_ {
        move |source| Error::Cublas {
            what: what.to_owned(),
            source,
        }
    }
}
