//! Serving many requests at once, after nano-vllm: a `Sequence` per request, the `Scheduler`
//! that picks each step's tokens under a budget (and owns the block manager), and the
//! `Engine` loop a server drives (`add_request`, `step`, `abort`). All CPU-only; the runner
//! does the forward pass. `ngram` (prompt lookup) and `draft` (a draft model) guess tokens
//! for speculative decoding, `guess_budget` says how many. `fake` is a
//! stand-in model for tests.

pub mod draft;
pub mod engine;
pub mod fake;
pub mod guess_budget;
pub mod ngram;
pub mod scheduler;
pub mod sequence;

pub use engine::{
    DEFAULT_GUESS_ROWS, Engine, EngineOptions, EngineStats, MAX_TOP_LOGPROBS, RequestParams,
    StepOutput, TokenLogprobs,
};
pub use sequence::{FinishReason, RequestId};
