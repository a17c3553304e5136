//! The model runner: owns the weights, the KV cache and the scratch buffers, and runs
//! sequences through the backend. Long prompts are split into chunks of at most
//! `max_batch_tokens` tokens (chunked prefill), so activations stay a fixed size.

use crate::batch::{Batch, SeqChunk};
use crate::block_manager::{BLOCK_SIZE, BlockManager, BlockTable, blocks_for};
use crate::config::Config;
use crate::cpu;
use crate::cpu::Scratch;
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::model::ModelWeights;
use crate::rope::RopeTables;

pub struct RunnerOptions {
    /// KV-cache blocks of `BLOCK_SIZE` tokens; `None`: enough for one full context, up to
    /// `DEFAULT_KV_BUDGET` bytes.
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

/// The default pool is one full context, but never more than this many bytes.
pub const DEFAULT_KV_BUDGET: usize = 4 << 30;

pub struct Runner {
    pub config: Config,
    pub weights: ModelWeights,
    pub kv: KvCache,
    pub blocks: BlockManager,
    rope: RopeTables,
    scratch: Scratch,
    batch: Batch,
    max_context: usize,
}

impl Runner {
    pub fn new(config: Config, weights: ModelWeights, opts: &RunnerOptions) -> Result<Runner> {
        let n_blocks = match opts.kv_blocks {
            Some(0) => return Err(Error::Usage("--kv-blocks must be at least 1".into())),
            Some(n) => n,
            None => {
                let affordable =
                    DEFAULT_KV_BUDGET / (KvCache::bytes_per_token(&config) * BLOCK_SIZE);
                blocks_for(config.max_seq_len).min(affordable).max(1)
            }
        };
        if opts.max_batch_tokens == 0 {
            return Err(Error::Usage(
                "the batch must hold at least one token".into(),
            ));
        }
        let max_context = config.max_seq_len.min(n_blocks * BLOCK_SIZE);
        let rope = RopeTables::new(&config, max_context, weights.rope_freq_factors.as_deref());
        Ok(Runner {
            kv: KvCache::new(&config, n_blocks),
            blocks: BlockManager::new(n_blocks),
            scratch: Scratch::new(&config, opts.max_batch_tokens),
            batch: Batch::default(),
            rope,
            max_context,
            config,
            weights,
        })
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
        let max = self.scratch.max_tokens;
        let (head, last) = tokens.split_at((tokens.len() - 1) / max * max);
        for chunk in head.chunks(max) {
            self.run(seq, chunk, false)?;
        }
        self.run(seq, last, false)
    }

    /// As `extend`, but returns the logits of every token, `[tokens.len(), vocab]`: for tests
    /// and scoring, not the generation loop.
    pub fn extend_all_logits(&mut self, seq: &mut BlockTable, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_fits(seq, tokens)?;
        let mut all = Vec::with_capacity(tokens.len() * self.config.vocab_size);
        for chunk in tokens.chunks(self.scratch.max_tokens) {
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
        Ok(cpu::forward(
            &self.config,
            &self.weights,
            &self.rope,
            &mut self.kv,
            &mut self.scratch,
            &self.batch,
        ))
    }
}
