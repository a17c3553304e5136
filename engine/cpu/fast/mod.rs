//! The fast CPU backend: `--device cpu` runs here (and `rustle profile --device cpu` times
//! it); the f32 reference (`cpu::forward`) stays the oracle for tests and
//! `profile --device cpu-reference`.
//!
//! Weights stay as the file stores them (`weights`): GGUF blocks quantized, bf16 and f16 in 16
//! bits. Every quantized type is read through one form (`unpack`: 8-bit codes with a scale
//! and offset per 16 values), so two kernels serve them all: for a few tokens an integer dot
//! product against activations quantized per 32 to 8 bits (`dot`; `fused` with the unpacking
//! in registers for the common types, AVX-512 VNNI where present, else AVX2 (`fused_avx2`,
//! `vpmaddubsw`); on Arm NEON's `usdot` or
//! `sdot`, `neon` wrapping the two instructions), for many tokens bf16 tiles (`gemm`, AVX-512
//! BF16 where present); plain Rust elsewhere (`cpu_features` says which).
//! `matmul` splits every matrix's rows over the pool's threads; `attention` reads a bf16 KV
//! cache (`kv`); `forward` is the pass, in the reference's order; `timed` times its steps for
//! the profiler. The two kernels round differently, so a batch-invariant mode picks a token's
//! kernel by what the token is, never by its batch (`FastBackend::set_batch_invariant`).

pub mod attention;
pub mod cpu_features;
pub mod dot;
pub mod experts;
pub mod forward;
pub mod fused;
pub mod fused_avx2;
pub mod gemm;
pub mod kv;
pub mod math;
pub mod matmul;
#[cfg(target_arch = "aarch64")]
pub mod neon;
pub mod timed;
pub mod unpack;
pub mod weights;

use crate::batch::Batch;
use crate::config::Config;
use crate::cpu::Ropes;
use crate::error::{Error, Result};
use crate::rope::RopeTables;
use forward::Scratch;
use kv::KvCacheBf16;
use weights::FastWeights;

pub use cpu_features::{Features, features};

/// The fast backend's state: stored weights, the bf16 KV pool, RoPE tables, activations, and
/// the threads that share each step.
pub struct FastBackend {
    pub weights: FastWeights,
    pub kv: KvCacheBf16,
    pub rope: RopeTables,
    /// The local layers' RoPE, where they have their own (`Config::sliding`).
    pub rope_local: Option<RopeTables>,
    pub scratch: Scratch,
    /// Each step timed while a profile is recorded.
    pub recorder: timed::Recorder,
    pool: rayon::ThreadPool,
}

impl FastBackend {
    /// A backend for sequences of up to `max_context` tokens in `n_blocks` KV blocks, on as
    /// many threads as rayon's global pool has (`RAYON_NUM_THREADS`, else every core).
    pub fn new(
        config: &Config,
        weights: FastWeights,
        n_blocks: usize,
        max_context: usize,
        max_batch_tokens: usize,
    ) -> Result<FastBackend> {
        // The forward runs inside this pool, so the thread that starts a step works in it
        // too, rather than waking a pool and waiting.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(rayon::current_num_threads())
            .thread_name(|i| format!("rustle-cpu-{i}"))
            .build()
            .map_err(|e| Error::Usage(format!("cannot start the CPU threads: {e}")))?;
        Ok(FastBackend {
            kv: KvCacheBf16::new(config, n_blocks)?,
            rope: RopeTables::new(config, max_context, weights.rope_freq_factors.as_deref())?,
            rope_local: RopeTables::local(config, max_context)?,
            scratch: Scratch::new(config, max_batch_tokens),
            recorder: timed::Recorder::default(),
            weights,
            pool,
        })
    }

    /// Batch-invariant mode (`matmul::Input::invariant`): a token's logits bit for bit the
    /// same whatever shares its pass (prompt chunking, the prefix cache, other requests). With
    /// the rows marked (`set_generated`, as the serving engine does) a prompt's tokens take
    /// the bf16 tiles and generated ones the 8-bit dot products; unmarked, every token takes
    /// the tiles (decode steps about five times slower on this project's 2-core CPU:
    /// docs/lessons.md#the-cpu-fast-path).
    pub fn set_batch_invariant(&mut self, on: bool) {
        self.scratch.input.invariant = on;
    }

    /// Which rows of the next pass are generated tokens (`Forward::set_generated`): in the
    /// batch-invariant mode they take the 8-bit dot products and the prompt's rows the bf16
    /// tiles, whatever shares the pass. Forgotten after it.
    pub fn set_generated(&mut self, rows: &[bool]) {
        self.scratch.generated.clear();
        self.scratch.generated.extend_from_slice(rows);
    }

    /// Threads a step is shared by.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Runs `batch` (see `forward::forward`) on the backend's threads.
    pub fn forward(&mut self, c: &Config, batch: &Batch) -> &[f32] {
        let FastBackend {
            weights,
            kv,
            rope,
            rope_local,
            scratch,
            recorder,
            pool,
        } = self;
        let weights = &*weights;
        let ropes = Ropes {
            global: rope,
            local: rope_local.as_ref(),
        };
        pool.install(move || forward::forward(c, weights, &ropes, kv, scratch, recorder, batch))
    }
}
