//! The model runner: owns a backend (the CPU reference or the GPU) with its weights, KV
//! cache and activations, and runs one forward pass over a `Batch`. It owns no blocks: which
//! blocks a sequence's tokens go to is decided before the batch reaches it (the serving
//! scheduler's block manager, or a `Solo` sequence's own).

use crate::batch::{Batch, SeqChunk};
use crate::config::Config;
use crate::cpu::fast::FastBackend;
use crate::cpu::fast::kv::KvCacheBf16;
use crate::cpu::fast::weights::FastWeights;
use crate::cpu::ops::argmax_f32;
use crate::cpu::{CpuBackend, Scratch};
use crate::error::{Error, Result};
use crate::gpu::GpuWeights;
use crate::gpu::batch::MAX_SEQS;
use crate::gpu::matrix::{Synthetic, WeightFormat};
use crate::gpu::{Gpu, GpuBackend};
use crate::kv::block_manager::{BLOCK_SIZE, BlockManager, BlockTable, blocks_for};
use crate::kv::dtype::KvDtype;
use crate::kv_cache::KvCache;
use crate::model::ModelWeights;
use crate::rope::RopeTables;
use crate::sampler::Choices;
use crate::traffic::KernelTime;

/// Where the forward pass runs.
pub enum Device {
    Cpu,
    Gpu(Box<Gpu>),
}

/// `--weights` as parsed (`gpu::matrix::parse_weights`): a model's format and a synthetic
/// shape's types.
pub type WeightsChoice = (WeightFormat, Synthetic);

#[derive(Clone, Debug)]
pub struct RunnerOptions {
    /// KV-cache blocks of `BLOCK_SIZE` tokens; `None`: on the CPU enough for one full
    /// context, up to `DEFAULT_KV_BUDGET` bytes; on the GPU most of the free memory.
    pub kv_blocks: Option<usize>,
    /// Most tokens in one forward pass: the activations are sized for it (the serving
    /// engine's token budget must not exceed it).
    pub max_batch_tokens: usize,
    /// How the GPU holds a model's matrices (`--weights`).
    pub weights: WeightFormat,
    /// The matrix types of a synthetic shape's weights (`--weights`).
    pub synthetic: Synthetic,
    /// How the GPU's KV cache holds keys and values (`--kv-dtype`).
    pub kv_dtype: KvDtype,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        RunnerOptions {
            kv_blocks: None,
            max_batch_tokens: 256,
            weights: WeightFormat::Stored,
            synthetic: Synthetic::Bf16,
            kv_dtype: KvDtype::Bf16,
        }
    }
}

/// The default CPU pool is one full context, but never more than this many bytes.
pub const DEFAULT_KV_BUDGET: usize = 4 << 30;

/// A CPU pool for sequences of up to `tokens` tokens (a prompt and its new tokens), capped
/// by the model's context and `DEFAULT_KV_BUDGET`: the pool, and the RoPE tables sized from
/// it, then cost what the run needs, whatever context the model claims.
pub fn cpu_kv_blocks(config: &Config, tokens: usize) -> usize {
    let block_bytes = KvCache::bytes_per_token(config) * BLOCK_SIZE;
    blocks_for(tokens.min(config.max_seq_len))
        .min(DEFAULT_KV_BUDGET / block_bytes)
        .max(1)
}

enum Backend {
    /// The f32 reference.
    Cpu(Box<CpuBackend>),
    /// The fast CPU backend (weights as stored, SIMD, threads): `--device cpu`.
    Fast(Box<FastBackend>),
    Gpu(Box<GpuBackend>),
}

pub struct Runner {
    pub config: Config,
    backend: Backend,
    /// A `Solo` sequence's batch, refilled each pass.
    batch: Batch,
    /// `[rows]` greedy choices on the CPU.
    ids: Vec<u32>,
    /// `[rows, vocab]` the CPU's logits, copied to be penalised and drawn from.
    logits: Vec<f32>,
    /// A batch that wants no logits, given one row for the GPU (`with_a_logits_row`).
    gpu_batch: Batch,
    max_batch_tokens: usize,
    max_context: usize,
}

/// What a runner can take, for the scheduler and the engine's request checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub vocab_size: usize,
    /// The model's context (`max_position_embeddings`).
    pub model_context: usize,
    /// The longest sequence the runner can hold: the model's context, or the KV pool's size
    /// if that is smaller.
    pub max_context: usize,
    /// KV-cache blocks of `BLOCK_SIZE` tokens.
    pub n_blocks: usize,
    /// Most tokens in one forward pass.
    pub max_batch_tokens: usize,
    /// Most sequences in one forward pass.
    pub max_batch_seqs: usize,
    /// The sliding window every layer attends over, where every layer has one (Mistral's):
    /// a sequence's blocks that fall out of it can be given back (`Scheduler::advance`).
    pub window: Option<usize>,
}

/// One forward pass over a batch: what the serving engine needs from a runner (the `Runner`,
/// or a fake model in tests).
pub trait Forward {
    fn limits(&self) -> Limits;

    /// Runs `batch`, writing its keys and values into the cache, and returns the logits of
    /// its `logit_rows`, `[rows, vocab]`. A batch that asks for none may get one row anyway
    /// (the GPU's), which callers ignore.
    fn forward(&mut self, batch: &Batch) -> Result<&[f32]>;

    /// As `forward`, but returns only the most likely token of each logits row, `[rows]`: on
    /// the GPU the argmax runs on the device and the logits never leave it.
    fn forward_greedy(&mut self, batch: &Batch) -> Result<&[u32]>;

    /// As `forward`, but returns each logits row's token drawn as `choices` says (penalties,
    /// filters and a seeded draw, `cpu::ops::sample_f32`), `[rows]`: on the GPU the draw runs
    /// on the device and the logits never leave it.
    fn forward_sample(&mut self, batch: &Batch, choices: &Choices) -> Result<&[u32]>;

    /// Says which rows of the next pass are generated tokens fed back rather than a prompt's
    /// (`[n]`; the serving engine says, before each pass): a backend whose kernels round
    /// differently by batch size may route each row by it. Forgotten after that pass.
    fn set_generated(&mut self, _rows: &[bool]) {}
}

/// `--weights` on the CPU: `stored` (the default) only; the others say how the GPU holds the
/// matrices. The commands call it once they know the run is on the CPU, before the model's
/// weights are read.
pub fn check_cpu_weights(weights: WeightFormat) -> Result<()> {
    if weights == WeightFormat::Stored {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "--weights {} is for the GPU; the CPU holds the weights as the files store them",
        format!("{weights:?}").to_lowercase()
    )))
}

/// Refuses `--kv-dtype fp8` on the CPU, whose caches hold f32 (the reference) or bf16 (the
/// fast path).
fn check_cpu_kv(dtype: KvDtype) -> Result<()> {
    match dtype {
        KvDtype::Bf16 => Ok(()),
        KvDtype::Fp8 => Err(Error::Usage(
            "--kv-dtype fp8 is the GPU's cache; the CPU keeps its own (f32 or bf16)".into(),
        )),
    }
}

impl Runner {
    pub fn new(
        config: Config,
        weights: ModelWeights,
        opts: &RunnerOptions,
        device: Device,
    ) -> Result<Runner> {
        if opts.kv_blocks == Some(0) {
            return Err(Error::Usage("--kv-blocks must be at least 1".into()));
        }
        let block_bytes = KvCache::bytes_per_token(&config) * BLOCK_SIZE;
        if let Some(n) = opts.kv_blocks
            && n.checked_mul(block_bytes).is_none()
        {
            return Err(Error::Usage(format!(
                "--kv-blocks {n} is more than any machine can hold"
            )));
        }
        if opts.max_batch_tokens == 0 {
            return Err(Error::Usage(
                "the batch must hold at least one token".into(),
            ));
        }
        if let Device::Gpu(gpu) = device {
            let gpu_weights = GpuWeights::upload(&gpu, &config, &weights, opts.weights)?;
            let freq_factors = weights.rope_freq_factors.clone();
            drop(weights); // the f32 copy on the host is no longer needed
            return Runner::with_gpu_weights(
                config,
                *gpu,
                gpu_weights,
                freq_factors.as_deref(),
                opts,
            );
        }
        if opts.weights == WeightFormat::Fp8 {
            return Err(Error::Usage(
                "--weights fp8 is for the GPU; the CPU holds the weights in f32".into(),
            ));
        }
        check_cpu_kv(opts.kv_dtype)?;
        let n_blocks = opts
            .kv_blocks
            .unwrap_or_else(|| cpu_kv_blocks(&config, config.max_seq_len));
        let max_context = config.max_seq_len.min(n_blocks.saturating_mul(BLOCK_SIZE));
        // No pass holds more tokens than a sequence can.
        let max_batch_tokens = opts.max_batch_tokens.min(max_context);
        let cpu = CpuBackend {
            kv: KvCache::new(&config, n_blocks)?,
            scratch: Scratch::new(&config, max_batch_tokens),
            rope: RopeTables::new(&config, max_context, weights.rope_freq_factors.as_deref())?,
            rope_local: RopeTables::local(&config, max_context)?,
            weights,
            ops: Default::default(),
        };
        Ok(Runner {
            max_context,
            backend: Backend::Cpu(Box::new(cpu)),
            batch: Batch::default(),
            ids: vec![],
            logits: vec![],
            gpu_batch: Batch::default(),
            max_batch_tokens,
            config,
        })
    }

    /// A runner on the fast CPU backend, over weights as the files store them
    /// (`FastWeights::load`). The KV pool is as `new` sizes the reference's.
    pub fn with_fast_cpu(
        config: Config,
        weights: FastWeights,
        opts: &RunnerOptions,
    ) -> Result<Runner> {
        if opts.kv_blocks == Some(0) {
            return Err(Error::Usage("--kv-blocks must be at least 1".into()));
        }
        check_cpu_weights(opts.weights)?;
        check_cpu_kv(opts.kv_dtype)?;
        if opts.max_batch_tokens == 0 {
            return Err(Error::Usage(
                "the batch must hold at least one token".into(),
            ));
        }
        let n_blocks = opts
            .kv_blocks
            .unwrap_or_else(|| cpu_kv_blocks(&config, config.max_seq_len));
        let max_context = config.max_seq_len.min(n_blocks.saturating_mul(BLOCK_SIZE));
        let max_batch_tokens = opts.max_batch_tokens.min(max_context);
        let fast = FastBackend::new(&config, weights, n_blocks, max_context, max_batch_tokens)?;
        Ok(Runner {
            max_context,
            backend: Backend::Fast(Box::new(fast)),
            batch: Batch::default(),
            ids: vec![],
            logits: vec![],
            gpu_batch: Batch::default(),
            max_batch_tokens,
            config,
        })
    }

    /// A runner over weights already on the GPU (`GpuWeights::synthetic` for benchmarks).
    pub fn with_gpu_weights(
        config: Config,
        gpu: Gpu,
        weights: GpuWeights,
        rope_freq_factors: Option<&[f32]>,
        opts: &RunnerOptions,
    ) -> Result<Runner> {
        let kv = (opts.kv_blocks, opts.kv_dtype);
        let mut g = GpuBackend::new(gpu, &config, weights, kv, opts.max_batch_tokens)?;
        let max_context = config
            .max_seq_len
            .min(g.kv.n_blocks.saturating_mul(BLOCK_SIZE));
        let local = RopeTables::local(&config, max_context)?;
        g.set_rope(
            &RopeTables::new(&config, max_context, rope_freq_factors)?,
            local.as_ref(),
        )?;
        Ok(Runner {
            max_context,
            backend: Backend::Gpu(Box::new(g)),
            batch: Batch::default(),
            ids: vec![],
            logits: vec![],
            gpu_batch: Batch::default(),
            max_batch_tokens: opts.max_batch_tokens,
            config,
        })
    }

    /// Bytes of weights one forward pass reads: every matrix and norm once, as the backend
    /// holds them (bf16 on the GPU, f32 on the CPU).
    pub fn weight_bytes_per_step(&self) -> usize {
        match &self.backend {
            Backend::Cpu(c) => c.weights.bytes(),
            Backend::Fast(f) => f.weights.bytes_per_step(),
            Backend::Gpu(g) => g.weights.bytes_per_token(&self.config),
        }
    }

    /// Bytes of weights a pass of `n_tokens` tokens reads: `weight_bytes_per_step`, but on the
    /// GPU a mixture of experts' tokens choose more of its experts together than one does
    /// (`GpuWeights::bytes_per_step`).
    pub fn weight_bytes_per_pass(&self, n_tokens: usize) -> usize {
        match &self.backend {
            Backend::Gpu(g) => g.weights.bytes_per_step(&self.config, n_tokens),
            _ => self.weight_bytes_per_step(),
        }
    }

    /// Bytes of KV cache one token holds, all layers, keys and values, as the backend stores
    /// them.
    pub fn kv_bytes_per_token(&self) -> usize {
        match &self.backend {
            Backend::Cpu(_) => KvCache::bytes_per_token(&self.config),
            Backend::Fast(_) => KvCacheBf16::bytes_per_token(&self.config),
            Backend::Gpu(g) => g.kv.dtype().bytes_per_token(&self.config),
        }
    }

    /// The batch-invariant mode (`GpuBackend::set_batch_invariant`,
    /// `FastBackend::set_batch_invariant`): a request's tokens bit for bit the same whatever
    /// shares its batch. The f32 reference always is.
    pub fn set_batch_invariant(&mut self, on: bool) {
        match &mut self.backend {
            Backend::Gpu(g) => g.set_batch_invariant(on),
            Backend::Fast(f) => f.set_batch_invariant(on),
            Backend::Cpu(_) => {}
        }
    }

    /// The CPU backend, when this runner has one.
    pub fn cpu_backend(&mut self) -> Option<&mut CpuBackend> {
        match &mut self.backend {
            Backend::Cpu(c) => Some(c),
            Backend::Fast(_) | Backend::Gpu(_) => None,
        }
    }

    /// The GPU backend, when this runner has one.
    pub fn gpu_backend(&mut self) -> Option<&mut GpuBackend> {
        match &mut self.backend {
            Backend::Gpu(g) => Some(g),
            Backend::Cpu(_) | Backend::Fast(_) => None,
        }
    }

    /// What the backend holds of the weights, for the load line: "the GPU holds them as
    /// q4_k 3.37 GB, q6_k 1.32 GB, ... (4.92 GB)", naming quantized tensors it had to hold
    /// in bf16; "the CPU holds them in f32 (538.1 MB)".
    pub fn weights_held(&self) -> String {
        use crate::loader::bytes_text;
        match &self.backend {
            Backend::Cpu(c) => {
                let (matrices, vectors) = c.weights.params();
                let bytes = bytes_text(4 * (matrices + vectors));
                format!("the CPU holds them in f32 ({bytes})")
            }
            Backend::Fast(f) => {
                let bytes = bytes_text(f.weights.held_bytes());
                format!("the CPU holds them as stored ({bytes})")
            }
            Backend::Gpu(g) => {
                let w = &g.weights;
                let mut s = format!(
                    "the GPU holds them as {} ({} in all)",
                    w.summary(),
                    bytes_text(w.bytes())
                );
                if let Some(first) = w.fallbacks.first() {
                    s += &format!(
                        "; in bf16, as no kernel reads their blocks: {first}{}",
                        match w.fallbacks.len() {
                            1 => String::new(),
                            n => format!(" and {} more", n - 1),
                        }
                    );
                }
                s
            }
        }
    }

    /// "cpu" or the GPU's description.
    pub fn device_name(&self) -> String {
        match &self.backend {
            Backend::Cpu(_) => "cpu (f32 reference)".into(),
            Backend::Fast(f) => format!(
                "cpu ({} threads, {})",
                f.threads(),
                crate::cpu::fast::features().describe()
            ),
            Backend::Gpu(g) => g.gpu.description.clone(),
        }
    }

    /// The longest sequence this runner can hold: the model's context, or the KV pool's size
    /// if that is smaller.
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// KV-cache blocks in the pool.
    pub fn n_blocks(&self) -> usize {
        match &self.backend {
            Backend::Cpu(c) => c.kv.n_blocks,
            Backend::Fast(f) => f.kv.n_blocks,
            Backend::Gpu(g) => g.kv.n_blocks,
        }
    }

    /// A sequence to run straight through this runner (`extend`), outside the engine.
    pub fn solo(&self) -> Solo {
        Solo {
            table: BlockTable::default(),
            blocks: BlockManager::new(self.n_blocks(), false),
        }
    }

    // What the measuring tools (`tools/`: bench, profile) observe and set. They use these
    // and the public methods above, never the backends' fields.

    /// A `Solo` sequence that starts `len` tokens in: it holds the blocks of `len` positions
    /// whose keys and values are whatever the cache holds there (noise, after
    /// `fill_kv_with_noise`), so that a benchmark can decode at a long context without
    /// computing the prompt first.
    pub fn solo_at(&self, len: usize) -> Result<Solo> {
        let mut seq = self.solo();
        seq.reserve(len.max(1))?;
        seq.table.len = len;
        Ok(seq)
    }

    /// Whether the GPU replays decode-only steps from CUDA graphs (on by default). Timing
    /// every launch needs them off: events cannot be recorded inside a replayed graph. The
    /// CPU has no graphs: there this does nothing.
    pub fn set_graphs(&mut self, on: bool) {
        if let Backend::Gpu(g) = &mut self.backend {
            g.graphs.on = on;
        }
    }

    /// From now on (or no longer), each GPU pass's span on the GPU's own clock, for the time
    /// between passes (`gpu::step_clock`); the CPU has no such clock: there this does nothing.
    pub fn clock_steps(&mut self, on: bool) -> Result<()> {
        match &mut self.backend {
            Backend::Gpu(g) => g.clock_steps(on),
            Backend::Cpu(_) | Backend::Fast(_) => Ok(()),
        }
    }

    /// The last pass's span, in milliseconds since `clock_steps(true)` (GPU only).
    pub fn last_step_span(&self) -> Option<crate::gpu::step_clock::Span> {
        match &self.backend {
            Backend::Gpu(g) => g.last_step_span(),
            Backend::Cpu(_) | Backend::Fast(_) => None,
        }
    }

    /// Fills the whole KV pool with random values (the GPU: bf16 of unit scale, made on the
    /// device, or fp8 bytes of a repeated pattern; the CPU: a fixed pseudo-random pattern), so that attention over positions
    /// taken by `solo_at` reads real-looking data.
    pub fn fill_kv_with_noise(&mut self) -> Result<()> {
        match &mut self.backend {
            Backend::Gpu(g) => {
                let gpu = g.gpu.clone();
                g.kv.fill_noise(&gpu)?;
                gpu.sync()
            }
            Backend::Cpu(c) => {
                // An LCG's top bits as floats in [-1, 1): cheap, and never all zeros.
                let mut state = 0x2545_f491_4f6c_dd1du64;
                for x in c.kv.k.iter_mut().chain(c.kv.v.iter_mut()) {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    *x = (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                }
                Ok(())
            }
            Backend::Fast(f) => {
                // The same pattern, rounded to bf16.
                let mut state = 0x2545_f491_4f6c_dd1du64;
                for x in f.kv.k.iter_mut().chain(f.kv.v.iter_mut()) {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let v = (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                    *x = half::bf16::from_f32(v).to_bits();
                }
                Ok(())
            }
        }
    }

    /// From now on every kernel launch (GPU, timed by CUDA events) or reference operation
    /// (CPU, timed by the clock) is recorded with its traffic, until `profile_stop`.
    pub fn profile_start(&mut self) {
        match &mut self.backend {
            Backend::Gpu(g) => g.gpu.profile_start(),
            Backend::Cpu(c) => c.ops.profile_start(),
            Backend::Fast(f) => f.recorder.start(),
        }
    }

    /// Every launch or operation since `profile_start`, in order.
    pub fn profile_stop(&mut self) -> Result<Vec<KernelTime>> {
        match &mut self.backend {
            Backend::Gpu(g) => g.gpu.profile_stop(),
            Backend::Cpu(c) => Ok(c.ops.profile_stop()),
            Backend::Fast(f) => Ok(f.recorder.stop()),
        }
    }

    /// The GPU this runner runs on, if it runs on one.
    pub fn gpu(&self) -> Option<&Gpu> {
        match &self.backend {
            Backend::Gpu(g) => Some(&g.gpu),
            Backend::Cpu(_) | Backend::Fast(_) => None,
        }
    }

    /// Appends `tokens` to `seq`, runs them through the model in chunks of at most
    /// `max_batch_tokens`, and returns the logits of the last one, `[vocab]`.
    pub fn extend(&mut self, seq: &mut Solo, tokens: &[u32]) -> Result<&[f32]> {
        let last = self.extend_head(seq, tokens)?;
        self.run(seq, last, false)
    }

    /// As `extend`, but returns only the most likely next token: on the GPU the argmax runs
    /// on the device and the logits never leave it.
    pub fn extend_greedy(&mut self, seq: &mut Solo, tokens: &[u32]) -> Result<u32> {
        let last = self.extend_head(seq, tokens)?;
        seq.reserve(seq.table.len + last.len())?;
        self.batch.fill(
            &[SeqChunk {
                table: &seq.table,
                tokens: last,
                logits: 1,
            }],
            false,
        );
        seq.table.len += last.len();
        let batch = std::mem::take(&mut self.batch);
        let id = self.forward_greedy(&batch).map(|ids| ids[0]);
        self.batch = batch;
        id
    }

    /// As `extend`, but returns the logits of every token, `[tokens.len(), vocab]`: for tests
    /// and scoring, not the generation loop.
    pub fn extend_all_logits(&mut self, seq: &mut Solo, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_fits(seq, tokens)?;
        let mut all = Vec::with_capacity(tokens.len() * self.config.vocab_size);
        for chunk in tokens.chunks(self.max_batch_tokens) {
            all.extend_from_slice(self.run(seq, chunk, true)?);
        }
        Ok(all)
    }

    /// Runs all but the last chunk of `tokens` (whose logits nobody wants) and returns that
    /// last chunk.
    fn extend_head<'t>(&mut self, seq: &mut Solo, tokens: &'t [u32]) -> Result<&'t [u32]> {
        self.check_fits(seq, tokens)?;
        let max = self.max_batch_tokens;
        let (head, last) = tokens.split_at((tokens.len() - 1) / max * max);
        for chunk in head.chunks(max) {
            self.run(seq, chunk, false)?;
        }
        Ok(last)
    }

    fn check_fits(&self, seq: &Solo, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let total = seq.table.len + tokens.len();
        if total > self.max_context {
            return Err(Error::PromptTooLong {
                tokens: total,
                limit: self.max_context,
                what: if self.max_context < self.config.max_seq_len {
                    "the KV cache (--kv-blocks)"
                } else {
                    "the model's context"
                },
            });
        }
        if let Some(&bad) = tokens
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(Error::Tokenizer(format!(
                "token id {bad} is outside the model's vocabulary of {}",
                self.config.vocab_size
            )));
        }
        Ok(())
    }

    /// One forward pass over at most `max_batch_tokens` tokens of one sequence.
    fn run(&mut self, seq: &mut Solo, tokens: &[u32], all_logits: bool) -> Result<&[f32]> {
        seq.reserve(seq.table.len + tokens.len())?;
        self.batch.fill(
            &[SeqChunk {
                table: &seq.table,
                tokens,
                logits: 1,
            }],
            all_logits,
        );
        seq.table.len += tokens.len();
        match &mut self.backend {
            Backend::Cpu(cpu) => Ok(cpu.forward(&self.config, &self.batch)),
            Backend::Fast(f) => Ok(f.forward(&self.config, &self.batch)),
            Backend::Gpu(gpu) => gpu.forward(&self.config, &self.batch),
        }
    }
}

impl Forward for Runner {
    fn set_generated(&mut self, rows: &[bool]) {
        if let Backend::Fast(f) = &mut self.backend {
            f.set_generated(rows);
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            vocab_size: self.config.vocab_size,
            model_context: self.config.max_seq_len,
            max_context: self.max_context,
            n_blocks: self.n_blocks(),
            max_batch_tokens: self.max_batch_tokens,
            max_batch_seqs: match &self.backend {
                // Every sequence in a batch brings at least one token.
                Backend::Cpu(_) | Backend::Fast(_) => self.max_batch_tokens,
                Backend::Gpu(_) => MAX_SEQS.min(self.max_batch_tokens),
            },
            window: self.config.window_everywhere(),
        }
    }

    fn forward(&mut self, batch: &Batch) -> Result<&[f32]> {
        match &mut self.backend {
            Backend::Cpu(cpu) => Ok(cpu.forward(&self.config, batch)),
            Backend::Fast(f) => Ok(f.forward(&self.config, batch)),
            Backend::Gpu(gpu) => {
                let batch = for_the_gpu(&mut self.gpu_batch, batch);
                gpu.forward(&self.config, batch)
            }
        }
    }

    fn forward_sample(&mut self, batch: &Batch, choices: &Choices) -> Result<&[u32]> {
        match &mut self.backend {
            backend @ (Backend::Cpu(_) | Backend::Fast(_)) => {
                let vocab = self.config.vocab_size;
                let logits = cpu_forward(backend, &self.config, batch);
                self.logits.clear();
                self.logits.extend_from_slice(logits);
                choices.sample_on_host(&mut self.logits, vocab, &mut self.ids);
                Ok(&self.ids)
            }
            Backend::Gpu(gpu) => {
                let batch = for_the_gpu(&mut self.gpu_batch, batch);
                gpu.forward_sample(&self.config, batch, choices)
            }
        }
    }

    fn forward_greedy(&mut self, batch: &Batch) -> Result<&[u32]> {
        match &mut self.backend {
            backend @ (Backend::Cpu(_) | Backend::Fast(_)) => {
                let vocab = self.config.vocab_size;
                let logits = cpu_forward(backend, &self.config, batch);
                self.ids.clear();
                self.ids.extend(logits.chunks_exact(vocab).map(argmax_f32));
                Ok(&self.ids)
            }
            Backend::Gpu(gpu) => {
                let batch = for_the_gpu(&mut self.gpu_batch, batch);
                gpu.forward_greedy(&self.config, batch)
            }
        }
    }
}

/// The logits of one pass on a CPU backend (the reference or the fast one), `[rows, vocab]`.
fn cpu_forward<'b>(backend: &'b mut Backend, c: &Config, batch: &Batch) -> &'b [f32] {
    match backend {
        Backend::Cpu(cpu) => cpu.forward(c, batch),
        Backend::Fast(f) => f.forward(c, batch),
        Backend::Gpu(_) => unreachable!("the GPU's logits stay on the device"),
    }
}

/// `batch` as the GPU takes it: decodes with guessed tokens after them as a decode step of
/// one sequence a row (`Batch::rows_as_sequences`), so that they run the decode's kernels,
/// from its CUDA graphs, rather than a prompt's launches; and a batch that wants no logits
/// given one row (`with_a_logits_row`).
fn for_the_gpu<'b>(spare: &'b mut Batch, batch: &'b Batch) -> &'b Batch {
    if batch.guesses && batch.tokens.len() <= MAX_SEQS {
        batch.rows_as_sequences(spare);
        return spare;
    }
    with_a_logits_row(spare, batch)
}

/// `batch`, or, when it wants no logits at all (every chunk a prompt chunk short of its
/// prompt's end), a copy in `spare` that asks for its last row's: the GPU's head launches
/// assume at least one row. The caller ignores the extra row.
fn with_a_logits_row<'b>(spare: &'b mut Batch, batch: &'b Batch) -> &'b Batch {
    if !batch.logit_rows.is_empty() || batch.tokens.is_empty() {
        return batch;
    }
    spare.clone_from(batch);
    spare.logit_rows.push(batch.tokens.len() as u32 - 1);
    spare
}

/// One sequence driven straight through a runner, outside the serving engine: golden tests,
/// benchmarks and profiles. It carries its own block manager over the runner's whole pool,
/// so use one at a time per runner.
pub struct Solo {
    pub table: BlockTable,
    blocks: BlockManager,
}

impl Solo {
    /// Tokens in the cache.
    pub fn len(&self) -> usize {
        self.table.len
    }

    pub fn is_empty(&self) -> bool {
        self.table.len == 0
    }

    /// Takes blocks for `new_len` tokens without computing them (benchmarks that decode
    /// over a context of noise).
    pub fn reserve(&mut self, new_len: usize) -> Result<()> {
        self.blocks.reserve(&mut self.table, new_len)
    }

    /// Returns the blocks: the sequence starts again empty.
    pub fn release(&mut self) {
        self.blocks.release(&mut self.table);
    }

    /// Blocks not held by this sequence.
    pub fn n_free(&self) -> usize {
        self.blocks.n_free()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_without_logits_gets_its_last_row_for_the_gpu() {
        let mut spare = Batch::default();
        let mut b = Batch {
            tokens: vec![5, 6, 7],
            ..Default::default()
        };
        assert_eq!(with_a_logits_row(&mut spare, &b).logit_rows, vec![2]);
        b.logit_rows = vec![0];
        assert_eq!(with_a_logits_row(&mut spare, &b).logit_rows, vec![0]);
    }
}
