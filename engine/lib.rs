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
//! - `generate`: one prompt through the engine, streamed as text (the CLI)
//! - `gpu`: the PTX the kernels compiled to (the GPU backend comes next)

pub mod batch;
pub mod chat;
pub mod config;
pub mod cpu;
pub mod default_model;
pub mod error;
pub mod generate;
pub mod gpu;
pub mod kv;
pub mod kv_cache;
pub mod loader;
pub mod model;
pub mod rope;
pub mod runner;
pub mod sampler;
pub mod serve;
pub mod shapes;
pub mod tokenizer;
pub mod tools;
pub mod traffic;
pub mod weights;

pub use error::{Error, Result};

/// The block manager's old path, for code written before it moved into `kv` (branches not
/// merged yet: `gpu/`, `kv_cache.rs`). Remove once nothing imports it.
pub use kv::block_manager;
