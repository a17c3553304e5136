//! The measuring tools: `rustle bench` and `rustle profile`. They observe the engine from
//! outside, through the runner's public API (`Runner::set_graphs`, `solo_at`,
//! `profile_start` / `profile_stop`, ...), and nothing in the engine imports them: only
//! the binary (`main.rs`, its `cli::measure`) and the tests do (`tests/imports.rs` checks it).
//!
//! - `bench`: decode and prefill speed at batch 1, beside the bandwidth ceiling
//! - `batch_bench`: batched decode, as llama.cpp's `llama-batched-bench` measures it
//! - `serve_bench`: serving throughput through the engine loop, beside the roofline
//! - `speculate_bench`: what checking guessed tokens costs, and prompt lookup's speed-up
//! - `profile/`: every kernel of a prefill and decode steps against the roofline
//! - `decode_matmuls`, `prefill_matmuls`: the matmuls alone, rustle against cuBLAS
//! - `boundaries`: a kernel boundary's cost against a grid barrier's, on reads alone
//! - `staged`: reads streamed through shared memory across grid barriers, and a few
//!   layers' reads, as a persistent decode kernel would make them
//!
//!   (these two are measurement experiments, in `--features probes` builds only)
//! - `ceilings`: bandwidth, matrix throughput and the tensor instruction's peak, measured
//! - `cublas`: the reference matmuls; `timing`: event timing, launches summed by kernel
//! - `setup`: a runner over a real model (through `placement`, the engine's one loader) or a
//!   named shape's synthetic weights

pub mod batch_bench;
pub mod bench;
#[cfg(feature = "probes")]
pub mod boundaries;
pub mod ceilings;
pub mod cublas;
pub mod decode_matmuls;
pub mod lesson;
pub mod prefill_matmuls;
pub mod profile;
pub mod serve_bench;
pub mod setup;
pub mod speculate_bench;
#[cfg(feature = "probes")]
pub mod staged;
pub mod timing;
