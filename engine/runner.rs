//! The model runner: owns a backend (the CPU reference or the GPU) with its weights, KV
//! cache and activations, and the block manager that hands out KV blocks. Long prompts are
//! split into chunks of at most `max_batch_tokens` tokens (chunked prefill), so activations
//! stay a fixed size.

use crate::batch::{Batch, SeqChunk};
use crate::block_manager::{BLOCK_SIZE, BlockManager, BlockTable, blocks_for};
use crate::config::Config;
use crate::cpu::ops::argmax_f32;
use crate::cpu::{CpuBackend, Scratch};
use crate::error::{Error, Result};
use crate::gpu::backend::GpuWeights;
use crate::gpu::{Gpu, GpuBackend};
use crate::kv_cache::KvCache;
use crate::model::ModelWeights;
use crate::rope::RopeTables;

/// Where the forward pass runs.
pub enum Device {
    Cpu,
    Gpu(Box<Gpu>),
}

pub struct RunnerOptions {
    /// KV-cache blocks of `BLOCK_SIZE` tokens; `None`: on the CPU enough for one full
    /// context, up to `DEFAULT_KV_BUDGET` bytes; on the GPU most of the free memory.
    pub kv_blocks: Option<usize>,
    /// Tokens in one forward pass (the prefill chunk size).
    pub max_batch_tokens: usize,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        RunnerOptions {
            kv_blocks: None,
            max_batch_tokens: 256,
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
    Cpu(Box<CpuBackend>),
    Gpu(Box<GpuBackend>),
}

pub struct Runner {
    pub config: Config,
    pub blocks: BlockManager,
    backend: Backend,
    batch: Batch,
    max_batch_tokens: usize,
    max_context: usize,
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
            let gpu_weights = GpuWeights::upload(&gpu, &weights)?;
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
            weights,
            ops: Default::default(),
        };
        Ok(Runner {
            max_context,
            blocks: BlockManager::new(n_blocks),
            backend: Backend::Cpu(Box::new(cpu)),
            batch: Batch::default(),
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
        let mut g = GpuBackend::new(gpu, &config, weights, opts.kv_blocks, opts.max_batch_tokens)?;
        let max_context = config
            .max_seq_len
            .min(g.n_blocks.saturating_mul(BLOCK_SIZE));
        g.set_rope(&RopeTables::new(&config, max_context, rope_freq_factors)?)?;
        Ok(Runner {
            max_context,
            blocks: BlockManager::new(g.n_blocks),
            backend: Backend::Gpu(Box::new(g)),
            batch: Batch::default(),
            max_batch_tokens: opts.max_batch_tokens,
            config,
        })
    }

    /// The CPU backend, when this runner has one.
    pub fn cpu_backend(&mut self) -> Option<&mut CpuBackend> {
        match &mut self.backend {
            Backend::Cpu(c) => Some(c),
            Backend::Gpu(_) => None,
        }
    }

    /// The GPU backend, when this runner has one.
    pub fn gpu_backend(&mut self) -> Option<&mut GpuBackend> {
        match &mut self.backend {
            Backend::Gpu(g) => Some(g),
            Backend::Cpu(_) => None,
        }
    }

    /// "cpu" or the GPU's description.
    pub fn device_name(&self) -> String {
        match &self.backend {
            Backend::Cpu(_) => "cpu".into(),
            Backend::Gpu(g) => g.gpu.description.clone(),
        }
    }

    /// The longest sequence this runner can hold: the model's context, or the KV pool's
    /// size if that is smaller.
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Ends a sequence, returning its KV blocks to the pool.
    pub fn release(&mut self, seq: &mut BlockTable) {
        self.blocks.release(seq);
    }

    /// Appends `tokens` to `seq`, runs them through the model, and returns the logits of
    /// the last one, `[vocab]`.
    pub fn extend(&mut self, seq: &mut BlockTable, tokens: &[u32]) -> Result<&[f32]> {
        self.check_fits(seq, tokens)?;
        let max = self.max_batch_tokens;
        let (head, last) = tokens.split_at((tokens.len() - 1) / max * max);
        for chunk in head.chunks(max) {
            self.run(seq, chunk, false)?;
        }
        self.run(seq, last, false)
    }

    /// As `extend`, but returns only the most likely next token: on the GPU the argmax runs
    /// on the device and the logits never leave it.
    pub fn extend_greedy(&mut self, seq: &mut BlockTable, tokens: &[u32]) -> Result<u32> {
        self.check_fits(seq, tokens)?;
        let max = self.max_batch_tokens;
        let (head, last) = tokens.split_at((tokens.len() - 1) / max * max);
        for chunk in head.chunks(max) {
            self.run(seq, chunk, false)?;
        }
        self.blocks.reserve(seq, seq.len + last.len())?;
        self.batch.fill(
            &[SeqChunk {
                table: seq,
                tokens: last,
            }],
            false,
        );
        seq.len += last.len();
        match &mut self.backend {
            Backend::Cpu(cpu) => Ok(argmax_f32(cpu.forward(&self.config, &self.batch))),
            Backend::Gpu(gpu) => Ok(gpu.forward_greedy(&self.config, &self.batch)?[0]),
        }
    }

    /// As `extend`, but returns the logits of every token, `[tokens.len(), vocab]`: for tests
    /// and scoring, not the generation loop.
    pub fn extend_all_logits(&mut self, seq: &mut BlockTable, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_fits(seq, tokens)?;
        let mut all = Vec::with_capacity(tokens.len() * self.config.vocab_size);
        for chunk in tokens.chunks(self.max_batch_tokens) {
            all.extend_from_slice(self.run(seq, chunk, true)?);
        }
        Ok(all)
    }

    fn check_fits(&self, seq: &BlockTable, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let total = seq.len + tokens.len();
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
    fn run(&mut self, seq: &mut BlockTable, tokens: &[u32], all_logits: bool) -> Result<&[f32]> {
        self.blocks.reserve(seq, seq.len + tokens.len())?;
        self.batch
            .fill(&[SeqChunk { table: seq, tokens }], all_logits);
        seq.len += tokens.len();
        match &mut self.backend {
            Backend::Cpu(cpu) => Ok(cpu.forward(&self.config, &self.batch)),
            Backend::Gpu(gpu) => gpu.forward(&self.config, &self.batch),
        }
    }
}
