//! Speculative decoding measured, two ways.
//!
//! - `rustle bench --verify 2,4,8,16`: what checking n guessed tokens costs. One sequence is
//!   prefilled to `--prompt-len` tokens, then a pass over n new tokens with every row's logits
//!   (as a step that verifies n - 1 guesses and chooses the next token) is timed against a
//!   decode step of one token at the same position (the runner's greedy path, a CUDA graph on
//!   the GPU). Nothing is kept: each pass writes the same KV slots again.
//! - `rustle bench --speculate K`: the input-grounded prompts (tests/data/grounded_prompts.json:
//!   a paragraph to repeat, functions to edit, a text to summarize, names to list) through the
//!   serving engine one at a time, greedy, without speculation and then with prompt lookup
//!   guessing up to K tokens a step: decode tokens per second of each, the share of guesses
//!   kept, tokens per pass, and whether the two runs chose the same tokens.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::setup::synthetic_prompt;
use crate::batch::{Batch, SeqChunk};
use crate::chat::{self, Message};
use crate::error::{Error, Result};
use crate::kv::block_manager::{BlockManager, BlockTable};
use crate::runner::{Forward, Runner};
use crate::serve::draft::DraftModel;
use crate::serve::{Engine, EngineOptions, RequestParams};
use crate::tokenizer::Tokenizer;

fn progress(msg: &str) {
    eprintln!("rustle bench: {msg}");
}

/// The cost of one pass over `tokens` new tokens, beside a decode step's.
#[derive(Serialize)]
pub struct VerifyCost {
    /// Tokens in the pass: the last generated one and `tokens - 1` guesses.
    pub tokens: usize,
    pub ms: f64,
    /// Its time over one decode step's.
    pub of_decode: f64,
}

/// Times a decode step and a pass over each of `sizes` tokens, `reps` times each after two
/// untimed ones, on one sequence prefilled to `ctx` tokens.
pub fn verify_costs(
    runner: &mut Runner,
    ctx: usize,
    sizes: &[usize],
    reps: usize,
) -> Result<Vec<VerifyCost>> {
    let limits = runner.limits();
    let most = sizes.iter().copied().max().unwrap_or(1);
    if sizes.contains(&0) || most > limits.max_batch_tokens {
        return Err(Error::Usage(format!(
            "--verify: each size must be 1 to {} tokens (one forward pass)",
            limits.max_batch_tokens
        )));
    }
    if ctx + most > limits.max_context {
        return Err(Error::Usage(format!(
            "--prompt-len {ctx} and --verify {most} must fit the context ({})",
            limits.max_context
        )));
    }
    let vocab = runner.config.vocab_size;
    let mut blocks = BlockManager::new(limits.n_blocks, false);
    let mut table = BlockTable::default();
    blocks.reserve(&mut table, ctx + most)?;
    let mut batch = Batch::default();
    progress(&format!("prefilling {ctx} tokens"));
    let prompt = synthetic_prompt(ctx, vocab);
    for chunk in prompt.chunks(limits.max_batch_tokens) {
        batch.fill(
            &[SeqChunk {
                table: &table,
                tokens: chunk,
                logits: 1,
            }],
            false,
        );
        runner.forward_greedy(&batch)?;
        table.len += chunk.len();
    }
    let guesses = synthetic_prompt(most, vocab.saturating_sub(7).max(1));
    let mut time = |n: usize| -> Result<f64> {
        batch.fill(
            &[SeqChunk {
                table: &table,
                tokens: &guesses[..n],
                logits: n,
            }],
            false,
        );
        // Every row is a generated token, as the engine marks a decode and its guesses (the
        // CPU's batch-invariant mode routes them by it).
        let generated = vec![true; n];
        let pass = |runner: &mut Runner| {
            runner.set_generated(&generated);
            runner.forward_greedy(&batch).map(|_| ())
        };
        for _ in 0..2 {
            pass(runner)?;
        }
        let start = Instant::now();
        for _ in 0..reps {
            pass(runner)?;
        }
        Ok(start.elapsed().as_secs_f64() * 1e3 / reps as f64)
    };
    let decode_ms = time(1)?;
    let mut costs = vec![VerifyCost {
        tokens: 1,
        ms: decode_ms,
        of_decode: 1.0,
    }];
    for &n in sizes.iter().filter(|&&n| n > 1) {
        progress(&format!("{n} tokens a pass"));
        let ms = time(n)?;
        costs.push(VerifyCost {
            tokens: n,
            ms,
            of_decode: ms / decode_ms,
        });
    }
    blocks.release(&mut table);
    Ok(costs)
}

pub fn print_verify(costs: &[VerifyCost]) {
    println!("{:>7} {:>9} {:>10}", "tokens", "ms/pass", "of decode");
    for c in costs {
        println!("{:>7} {:>9.3} {:>9.2}x", c.tokens, c.ms, c.of_decode);
    }
}

/// One prompt of the checked-in set.
#[derive(Deserialize)]
pub struct GroundedPrompt {
    /// What kind of work: repeat, edit, summarize, extract.
    pub task: String,
    /// The user's message.
    pub user: String,
}

/// Work whose output repeats its input, where prompt lookup guesses well.
pub fn grounded_prompts() -> Vec<GroundedPrompt> {
    let json = include_str!("../../tests/data/grounded_prompts.json");
    serde_json::from_str(json).expect("tests/data/grounded_prompts.json parses")
}

/// Each grounded prompt in the model's chat template, as token ids.
pub fn grounded_prompt_ids(tok: &Tokenizer) -> Result<Vec<Vec<u32>>> {
    prompt_ids(tok, &grounded_prompts())
}

/// `prompts` in the model's chat template, as token ids.
fn prompt_ids(tok: &Tokenizer, prompts: &[GroundedPrompt]) -> Result<Vec<Vec<u32>>> {
    prompts
        .iter()
        .map(|p| {
            let message = Message {
                role: "user".into(),
                content: p.user.clone(),
            };
            tok.encode(&chat::render(tok, &[message])?, true)
        })
        .collect()
}

/// One request generated to its end alone in `engine`: its tokens, the seconds from its first
/// token to its last, and the engine's passes in that time.
pub fn generate_timed(
    engine: &mut Engine<Runner>,
    prompt: &[u32],
    params: &RequestParams,
) -> Result<(Vec<u32>, f64, u64)> {
    let id = engine.add_request(prompt.to_vec(), params.clone())?;
    let mut tokens = vec![];
    let mut first: Option<(Instant, u64)> = None;
    while engine.has_work() {
        for out in engine.step()? {
            debug_assert_eq!(out.id, id);
            tokens.extend(out.token);
        }
        if first.is_none() && !tokens.is_empty() {
            first = Some((Instant::now(), engine.stats().steps));
        }
    }
    let (start, steps) = first.unwrap_or((Instant::now(), engine.stats().steps));
    let secs = start.elapsed().as_secs_f64();
    Ok((tokens, secs, engine.stats().steps - steps))
}

#[derive(Serialize)]
pub struct PromptRun {
    pub task: String,
    pub prompt_tokens: usize,
    /// Tokens generated (the same count both ways when `same_tokens`).
    pub tokens: usize,
    pub plain_tok_per_s: f64,
    pub speculative_tok_per_s: f64,
    pub drafted: u64,
    pub accepted: u64,
    /// Passes after the first token, with speculation.
    pub passes: u64,
    pub same_tokens: bool,
}

#[derive(Serialize)]
pub struct SpeculateReport {
    pub model: String,
    pub device: String,
    /// Where the guesses came from: prompt lookup or a draft model.
    pub guesser: String,
    /// Most tokens guessed a step.
    pub speculate: usize,
    pub runs: Vec<PromptRun>,
    /// Over all prompts: tokens after the first over the seconds they took.
    pub plain_tok_per_s: f64,
    pub speculative_tok_per_s: f64,
    /// Guessed tokens kept over guessed tokens.
    pub acceptance: f64,
    /// Tokens after the first over the passes that made them.
    pub tokens_per_pass: f64,
    pub speedup: f64,
}

/// The grounded prompts through `runner`, greedy, up to `max_tokens` each, without and then
/// with speculation of up to `k` tokens.
pub fn run(
    runner: Runner,
    draft: Option<(Runner, String)>,
    tok: &Tokenizer,
    model: String,
    k: usize,
    max_tokens: usize,
) -> Result<SpeculateReport> {
    let device = runner.device_name();
    let grounded = grounded_prompts();
    let prompts = prompt_ids(tok, &grounded)?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let limits = runner.limits();
    if longest + max_tokens > limits.max_context || longest > limits.max_batch_tokens {
        return Err(Error::Usage(format!(
            "the prompts (up to {longest} tokens) with --output-len {max_tokens} must fit the context ({}) and one pass ({})",
            limits.max_context, limits.max_batch_tokens
        )));
    }
    let mut engine = Engine::new(
        runner,
        EngineOptions {
            token_budget: limits.max_batch_tokens,
            prefix_cache: false,
            eos: tok.eos_tokens.clone(),
            ..Default::default()
        },
    )?;
    let guesser = match draft {
        Some((d, name)) => {
            engine.set_drafter(Box::new(DraftModel::new(d, limits.vocab_size)?));
            format!("the draft model {name}")
        }
        None => "prompt lookup".to_owned(),
    };
    let params = |speculate| RequestParams {
        max_tokens,
        speculate,
        ..Default::default()
    };
    // Untimed: every prompt once each way, so that the CUDA graphs of every number of rows
    // a step takes (a decode, a decode and its guesses) are captured before the clock runs,
    // as they are in a server that has run a while.
    for ids in &prompts {
        generate_timed(&mut engine, ids, &params(0))?;
        generate_timed(&mut engine, ids, &params(k))?;
    }
    let mut runs = vec![];
    for (p, ids) in grounded.iter().zip(&prompts) {
        progress(&format!("{}: {} prompt tokens", p.task, ids.len()));
        let (plain, plain_s, _) = generate_timed(&mut engine, ids, &params(0))?;
        let before = engine.stats();
        let (guessed, spec_s, passes) = generate_timed(&mut engine, ids, &params(k))?;
        let after = engine.stats();
        let per_s = |n: usize, s: f64| n.saturating_sub(1) as f64 / s.max(1e-9);
        runs.push(PromptRun {
            task: p.task.clone(),
            prompt_tokens: ids.len(),
            tokens: guessed.len(),
            plain_tok_per_s: per_s(plain.len(), plain_s),
            speculative_tok_per_s: per_s(guessed.len(), spec_s),
            drafted: after.drafted_tokens - before.drafted_tokens,
            accepted: after.accepted_tokens - before.accepted_tokens,
            passes,
            same_tokens: plain == guessed,
        });
    }
    let after_first: usize = runs.iter().map(|r| r.tokens.saturating_sub(1)).sum();
    let secs = |rate: fn(&PromptRun) -> f64| -> f64 {
        runs.iter()
            .map(|r| r.tokens.saturating_sub(1) as f64 / rate(r).max(1e-9))
            .sum()
    };
    let plain_tok_per_s = after_first as f64 / secs(|r| r.plain_tok_per_s);
    let speculative_tok_per_s = after_first as f64 / secs(|r| r.speculative_tok_per_s);
    let drafted: u64 = runs.iter().map(|r| r.drafted).sum();
    let accepted: u64 = runs.iter().map(|r| r.accepted).sum();
    let passes: u64 = runs.iter().map(|r| r.passes).sum();
    Ok(SpeculateReport {
        model,
        device,
        guesser,
        speculate: k,
        plain_tok_per_s,
        speculative_tok_per_s,
        acceptance: accepted as f64 / drafted.max(1) as f64,
        tokens_per_pass: after_first as f64 / passes.max(1) as f64,
        speedup: speculative_tok_per_s / plain_tok_per_s,
        runs,
    })
}

pub fn print(r: &SpeculateReport) {
    println!(
        "{} on {}, {} guessing up to {} tokens a step, greedy",
        r.model, r.device, r.guesser, r.speculate
    );
    println!(
        "{:<10} {:>7} {:>7} {:>10} {:>10} {:>8} {:>8} {:>6} {:>5}",
        "task", "prompt", "tokens", "plain t/s", "spec t/s", "speedup", "kept", "t/pass", "same"
    );
    for run in &r.runs {
        println!(
            "{:<10} {:>7} {:>7} {:>10.1} {:>10.1} {:>7.2}x {:>7.0}% {:>6.2} {:>5}",
            run.task,
            run.prompt_tokens,
            run.tokens,
            run.plain_tok_per_s,
            run.speculative_tok_per_s,
            run.speculative_tok_per_s / run.plain_tok_per_s,
            100.0 * run.accepted as f64 / run.drafted.max(1) as f64,
            run.tokens.saturating_sub(1) as f64 / run.passes.max(1) as f64,
            if run.same_tokens { "yes" } else { "NO" }
        );
    }
    println!(
        "all: {:.1} tok/s without, {:.1} with: {:.2}x; {:.0}% of guesses kept, {:.2} tokens a pass",
        r.plain_tok_per_s,
        r.speculative_tok_per_s,
        r.speedup,
        100.0 * r.acceptance,
        r.tokens_per_pass
    );
}
