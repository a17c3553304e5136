//! The fast CPU backend: `--device cpu` runs here, the f32 reference (`cpu::forward`) stays
//! the oracle for tests and `rustle profile`.
//!
//! Weights stay as the file stores them (`weights`): GGUF blocks quantized, bf16 and f16 in 16
//! bits. Every quantized type is read through one form (`unpack`: 8-bit codes with a scale
//! and offset per 16 values), so two kernels serve them all: for a few tokens an integer dot
//! product against activations quantized per 32 to 8 bits (`dot`, AVX-512 VNNI where
//! present), for many tokens bf16 tiles (`gemm`, AVX-512 BF16 where present); plain Rust
//! elsewhere. `matmul` splits every matrix's rows over the pool's threads; `attention` reads
//! a bf16 KV cache (`kv`); `forward` is the pass, in the reference's order.

pub mod attention;
pub mod dot;
pub mod forward;
pub mod fused;
pub mod gemm;
pub mod kv;
pub mod math;
pub mod matmul;
pub mod timed;
pub mod unpack;
pub mod weights;

use std::sync::OnceLock;

use crate::batch::Batch;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::rope::RopeTables;
use forward::Scratch;
use kv::KvCacheBf16;
use weights::FastWeights;

/// Which vector instructions the kernels may use, found once at run time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// AVX2, FMA and F16C: the compiler's vectorized loops (unpacking, attention)
    pub avx2: bool,
    /// AVX-512 F, VL and VNNI (with `avx2`): the integer dot product
    pub vnni: bool,
    /// AVX-512 F, BW, VL and BF16 (with `avx2`): the prefill's bf16 tiles
    pub bf16: bool,
}

impl Features {
    /// What this CPU has, unless `RUSTLE_CPU_PORTABLE` is set (to anything but 0): then
    /// nothing, and every kernel runs its plain-Rust form.
    pub fn detect() -> Features {
        if std::env::var("RUSTLE_CPU_PORTABLE").is_ok_and(|v| v != "0") {
            return Features::default();
        }
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            let avx512 = avx2 && has!("avx512f") && has!("avx512vl") && has!("avx512bw");
            Features {
                avx2,
                vnni: avx512 && has!("avx512vnni"),
                bf16: avx512 && has!("avx512bf16"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Features::default()
    }

    /// "AVX-512 VNNI and BF16", for messages.
    pub fn describe(self) -> &'static str {
        match (self.vnni, self.bf16, self.avx2) {
            (true, true, _) => "AVX-512 VNNI and BF16",
            (true, false, _) => "AVX-512 VNNI",
            (false, true, _) => "AVX-512 BF16",
            (false, false, true) => "AVX2",
            (false, false, false) => "portable Rust",
        }
    }
}

/// The features the kernels use in this process.
pub fn features() -> Features {
    static F: OnceLock<Features> = OnceLock::new();
    *F.get_or_init(Features::detect)
}

/// The fast backend's state: stored weights, the bf16 KV pool, RoPE tables, activations, and
/// the threads that share each step.
pub struct FastBackend {
    pub weights: FastWeights,
    pub kv: KvCacheBf16,
    pub rope: RopeTables,
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
            scratch: Scratch::new(config, max_batch_tokens),
            recorder: timed::Recorder::default(),
            weights,
            pool,
        })
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
            scratch,
            recorder,
            pool,
        } = self;
        let (weights, rope) = (&*weights, &*rope);
        pool.install(move || forward::forward(c, weights, rope, kv, scratch, recorder, batch))
    }
}
