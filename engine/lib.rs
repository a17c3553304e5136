//! rustle: an LLM inference engine in Rust whose GPU kernels are Rust too.
//!
//! Data flows one way: config -> weights -> model -> backend -> kernels.
//! - `config`: `config.json` (or GGUF metadata) to a validated `Config`
//! - `weights`: safetensors and GGUF files, tensors taken by name, dtype and shape
//! - `tokenizer`, `chat`: text to tokens and back; chat templates
//! - `model`: the weights by role; `loader` opens a model folder or file
//! - `kv` (block manager, prefix cache), `kv_cache`: the paged KV cache (blocks of 16 tokens)
//! - `batch`, `cpu`, `runner`: one forward pass over a batch of tokens, on the CPU
//!   reference backend or the GPU
//! - `sampler`: choosing tokens, per request
//! - `serve`: sequences, the scheduler and the engine loop that serve many requests at once
//! - `server`: `rustle serve`, the engine behind an OpenAI-compatible HTTP server
//! - `generate`: one prompt through the engine, streamed as text (the CLI)
//! - `gpu`: the PTX the kernels compiled to (the GPU backend comes next)

pub mod batch;
pub mod batch_bench;
pub mod bench;
pub mod chat;
pub mod config;
pub mod cpu;
pub mod default_model;
pub mod error;
pub mod gemm_bench;
pub mod gemv_bench;
pub mod generate;
pub mod gpu;
pub mod kv;
pub mod kv_cache;
pub mod loader;
pub mod model;
pub mod profile;
pub mod rope;
pub mod runner;
pub mod sampler;
pub mod serve;
pub mod serve_bench;
pub mod server;
pub mod shapes;
pub mod tokenizer;
pub mod traffic;
pub mod weights;

pub use error::{Error, Result};
