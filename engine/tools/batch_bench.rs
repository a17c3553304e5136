//! `rustle bench --batch 1,8,32,64,128`: batched decode measured the way llama.cpp's
//! `llama-batched-bench` measures it. For each batch size B, B sequences are prefilled with
//! `--prompt-len` tokens each (one sequence per forward pass), then `--steps` decode steps run
//! all B sequences at once (one token each, the runner's greedy path: CUDA graphs per batch
//! bucket). Prefill and decode are timed apart: prompt tokens per second, and generated
//! tokens per second with the step time, beside the ceiling the same run measured (the
//! weights once per step plus every sequence's KV cache, over the copy bandwidth; of a
//! mixture of experts, the experts the step's tokens are likely to choose), and one decode
//! step kernel by kernel.

use std::time::Instant;

use serde::Serialize;

use super::timing::{KernelRow, by_kernel};
use crate::batch::{Batch, SeqChunk};
use crate::error::{Error, Result};
use crate::kv::block_manager::{BlockManager, BlockTable};
use crate::runner::{Forward, Runner};

#[derive(Serialize)]
pub struct BatchResult {
    pub sequences: usize,
    pub prompt_len: usize,
    pub steps: usize,
    pub prefill_tok_per_s: f64,
    pub decode_tok_per_s: f64,
    pub ms_per_step: f64,
    /// Weights once plus every sequence's KV (at the middle step), per step.
    pub bytes_per_step: f64,
    /// Copy bandwidth over bytes per step, times the sequences.
    pub ceiling_tok_per_s: f64,
    /// One decode step with every launch timed (graphs off), by kernel.
    pub kernels: Vec<KernelRow>,
}

fn progress(msg: &str) {
    eprintln!("rustle bench --batch: {msg}");
}

/// Every batch size in turn on one runner; `bandwidth` is the copy bandwidth measured by the
/// caller.
pub fn run(
    runner: &mut Runner,
    sizes: &[usize],
    prompt_len: usize,
    steps: usize,
    bandwidth: f64,
) -> Result<Vec<BatchResult>> {
    let limits = runner.limits();
    if let Some(&b) = sizes.iter().find(|&&b| b == 0 || b > limits.max_batch_seqs) {
        return Err(Error::Usage(format!(
            "--batch {b}: each size must be 1 to {}",
            limits.max_batch_seqs
        )));
    }
    if prompt_len > limits.max_batch_tokens || prompt_len + steps > limits.max_context {
        return Err(Error::Usage(format!(
            "--prompt-len {prompt_len} must fit one forward pass ({} tokens) and, with --steps {steps}, the context ({})",
            limits.max_batch_tokens, limits.max_context
        )));
    }
    sizes
        .iter()
        .map(|&b| one(runner, b, prompt_len, steps, bandwidth))
        .collect()
}

fn one(
    runner: &mut Runner,
    n_seqs: usize,
    prompt_len: usize,
    steps: usize,
    bandwidth: f64,
) -> Result<BatchResult> {
    progress(&format!(
        "{n_seqs} sequences: prefill {prompt_len} tokens each, then {steps} decode steps"
    ));
    let vocab = runner.config.vocab_size as u32;
    let mut blocks = BlockManager::new(runner.limits().n_blocks, false);
    let mut tables = vec![BlockTable::default(); n_seqs];
    for t in tables.iter_mut() {
        blocks.reserve(t, prompt_len + steps + 1)?;
    }
    let mut batch = Batch::default();

    // Prefill, one sequence per pass, as llama.cpp's bench fills its batch with one
    // sequence's prompt after another.
    let mut next = vec![0u32; n_seqs];
    let start = Instant::now();
    for (s, table) in tables.iter_mut().enumerate() {
        let prompt: Vec<u32> = (0..prompt_len as u32)
            .map(|i| (i * 7919 + 13 * s as u32 + 1) % vocab)
            .collect();
        batch.fill(
            &[SeqChunk {
                table,
                tokens: &prompt,
                logits: 1,
            }],
            false,
        );
        next[s] = runner.forward_greedy(&batch)?[0];
        table.len += prompt_len;
    }
    let prefill_s = start.elapsed().as_secs_f64();

    // Decode: the first step (graph capture) is not timed.
    decode(runner, &mut tables, &mut next, &mut batch)?;
    let start = Instant::now();
    for _ in 1..steps {
        decode(runner, &mut tables, &mut next, &mut batch)?;
    }
    let decode_s = start.elapsed().as_secs_f64();
    let timed_steps = steps.saturating_sub(1).max(1);

    // One more step, every launch timed (on the GPU; graphs off, since events cannot be
    // recorded inside a replayed graph).
    let mut kernels = vec![];
    if runner.gpu().is_some() {
        runner.set_graphs(false);
        runner.profile_start();
        let result = decode(runner, &mut tables, &mut next, &mut batch);
        let launches = runner.profile_stop()?;
        runner.set_graphs(true);
        result?;
        kernels = by_kernel(launches);
    }
    for t in tables.iter_mut() {
        blocks.release(t);
    }

    let mid_ctx = prompt_len + steps / 2;
    let bytes_per_step = runner.weight_bytes_per_pass(n_seqs) as f64
        + (n_seqs * mid_ctx * runner.kv_bytes_per_token()) as f64;
    let ms_per_step = decode_s * 1e3 / timed_steps as f64;
    Ok(BatchResult {
        sequences: n_seqs,
        prompt_len,
        steps,
        prefill_tok_per_s: (n_seqs * prompt_len) as f64 / prefill_s,
        decode_tok_per_s: n_seqs as f64 / (ms_per_step * 1e-3),
        ms_per_step,
        bytes_per_step,
        ceiling_tok_per_s: bandwidth / bytes_per_step * n_seqs as f64,
        kernels,
    })
}

/// One decode step: every sequence's next token in one pass, the greedy choices back into
/// `next`.
fn decode(
    runner: &mut Runner,
    tables: &mut [BlockTable],
    next: &mut [u32],
    batch: &mut Batch,
) -> Result<()> {
    let toks: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
    let chunks: Vec<SeqChunk> = tables
        .iter()
        .zip(&toks)
        .map(|(table, t)| SeqChunk {
            table,
            tokens: t,
            logits: 1,
        })
        .collect();
    batch.fill(&chunks, false);
    next.copy_from_slice(runner.forward_greedy(batch)?);
    for t in tables.iter_mut() {
        t.len += 1;
    }
    Ok(())
}

pub fn print(results: &[BatchResult]) {
    println!(
        "{:>5} {:>12} {:>12} {:>9} {:>12} {:>8}",
        "seqs", "prefill t/s", "decode t/s", "ms/step", "ceiling t/s", "of ceil"
    );
    for r in results {
        println!(
            "{:>5} {:>12.0} {:>12.1} {:>9.3} {:>12.0} {:>7.1}%",
            r.sequences,
            r.prefill_tok_per_s,
            r.decode_tok_per_s,
            r.ms_per_step,
            r.ceiling_tok_per_s,
            100.0 * r.decode_tok_per_s / r.ceiling_tok_per_s
        );
    }
    for r in results {
        println!("\none decode step of {} sequences, by kernel:", r.sequences);
        for k in r.kernels.iter().take(10) {
            println!(
                "  {:<28} {:>5} calls {:>9.1} us {:>8.0} GB/s {:>8.1} TFLOP/s",
                k.kernel,
                k.calls,
                k.us,
                k.bytes as f64 / (k.us * 1e-6) / 1e9,
                k.flops as f64 / (k.us * 1e-6) / 1e12
            );
        }
    }
}
