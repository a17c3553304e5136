//! `rustle serve`'s flags.

use std::path::PathBuf;

use clap::Args;

use crate::error::{Error, Result};
use crate::placement::DeviceArg;
use crate::serve::engine::DEFAULT_TOKEN_BUDGET;

/// Serve a model over HTTP with OpenAI's API: /v1/chat/completions, /v1/completions,
/// /v1/models, plus /health, /metrics (Prometheus) and a chat page at /.
#[derive(Args, Clone, Debug)]
#[command(after_help = EXAMPLES)]
pub struct ServeArgs {
    /// A Hugging Face model folder or a .gguf file. Default: $RUSTLE_MODEL, else
    /// SmolLM2-135M-Instruct.
    #[arg(short, long, value_name = "PATH")]
    pub model: Option<PathBuf>,

    /// How the GPU holds the matrices: stored (GGUF blocks stay blocks, the rest bf16),
    /// bf16, or fp8 (e4m3, a scale per row, made at load).
    #[arg(long, value_enum, default_value_t = crate::gpu::matrix::WeightFormat::Stored)]
    pub weights: crate::gpu::matrix::WeightFormat,

    /// How the GPU's KV cache holds keys and values: bf16, or fp8 (e4m3 with a power-of-two
    /// scale per token and head: about twice the tokens resident, half the attention's
    /// reading, 4 significant bits a value; heads of 64, 128 or 256). The CPU keeps its own.
    #[arg(long, value_enum, default_value_t = crate::kv::dtype::KvDtype::Bf16, value_name = "TYPE")]
    pub kv_dtype: crate::kv::dtype::KvDtype,

    /// Address to listen on; 127.0.0.1 answers this machine only, 0.0.0.0 everyone.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Port to listen on (0: any free one; the address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,

    /// Where to run: auto picks the GPU when there is one, else the CPU.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,

    /// Require `Authorization: Bearer KEY` on /v1 (default: $RUSTLE_API_KEY, else none).
    /// /health, /metrics and the chat page stay open (the page asks for the key).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,

    /// Most requests waiting for their first token; more are refused with 429 and
    /// Retry-After (default: no limit).
    #[arg(long, value_name = "N")]
    pub max_queued: Option<usize>,

    /// End a request that runs longer than this (a 408, or an error event in a stream).
    #[arg(long, value_name = "SECS")]
    pub request_timeout: Option<f64>,

    /// The model name clients ask for (default: the model file's or folder's name).
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,

    /// Most tokens in one forward pass: decode tokens first, prompt chunks fill the rest.
    #[arg(long, default_value_t = DEFAULT_TOKEN_BUDGET, value_name = "N")]
    pub token_budget: usize,

    /// Most sequences in one forward pass.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub max_seqs: usize,

    /// KV-cache size in blocks of 16 tokens (default: on the CPU one full context, at most
    /// 4 GiB; on the GPU most of the free memory).
    #[arg(long, value_name = "N")]
    pub kv_blocks: Option<usize>,

    /// Speculative decoding for every request that does not say otherwise (its `speculate`
    /// field): guess up to K tokens a step by looking the last tokens up in its prompt and
    /// output (prompt lookup), all checked in the step's pass. The output is the same as
    /// without; it comes faster where it repeats the input (summaries, edits, extraction).
    #[arg(long, value_name = "K", default_value_t = 0, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=64))]
    pub speculate: usize,

    /// Guess with this smaller model of the same tokenizer (a folder or a .gguf, on the
    /// model's device) instead of prompt lookup, for the requests that speculate.
    #[arg(long, value_name = "PATH")]
    pub draft_model: Option<PathBuf>,

    /// Guessed tokens fill a step only while it holds fewer tokens than this: a batch that
    /// large keeps the GPU busy with its own decodes, and more rows would cost compute.
    #[arg(long, value_name = "N", default_value_t = crate::serve::DEFAULT_GUESS_ROWS)]
    pub guess_rows: usize,

    /// Do not keep full KV blocks for reuse by prompts that share a prefix (then the `n`
    /// choices of a request each compute the prompt).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Serve random weights of a named shape (llama3-8b, llama3.2-1b, qwen2.5-7b, qwen3-8b,
    /// phi4-mini, gemma3-12b, gemma3-1b, smollm2-135m) made on the GPU, for load tests without a download: the tokenizer and
    /// chat template are --model's (default: the default model's), and so is the
    /// vocabulary's size. The text is noise.
    #[arg(long, value_name = "NAME")]
    pub shape: Option<String>,
}

const EXAMPLES: &str = "Examples:
  rustle serve --port 8000
  rustle serve -m ./Llama-3.2-1B-Instruct --host 0.0.0.0 --api-key secret --max-queued 64
  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{\"model\": \"SmolLM2-135M-Instruct.Q4_1\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}'";

impl ServeArgs {
    /// Checks what clap cannot; resolves the key from the environment.
    pub fn validate(&mut self) -> Result<()> {
        if let Some(t) = self.request_timeout
            && !(t > 0.0 && t.is_finite())
        {
            return Err(Error::Usage(format!(
                "--request-timeout must be above 0 seconds, got {t}"
            )));
        }
        if self.max_queued == Some(0) {
            return Err(Error::Usage(
                "--max-queued must be at least 1 (leave it out for no limit)".into(),
            ));
        }
        if self.token_budget == 0 || self.max_seqs == 0 {
            return Err(Error::Usage(
                "--token-budget and --max-seqs must be at least 1".into(),
            ));
        }
        if self.draft_model.is_some() && self.shape.is_some() {
            return Err(Error::Usage(
                "--draft-model guesses for a real model: --shape's random weights would keep none of its guesses".into(),
            ));
        }
        if let Some(p) = &self.draft_model
            && !p.exists()
        {
            return Err(Error::Usage(format!(
                "--draft-model {}: no such file or folder",
                p.display()
            )));
        }
        if self.api_key.is_none() {
            self.api_key = crate::knobs::Knobs::from_env()?.api_key;
        }
        if self.api_key.as_deref() == Some("") {
            return Err(Error::Usage("--api-key must not be empty".into()));
        }
        Ok(())
    }
}
