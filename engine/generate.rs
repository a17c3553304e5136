//! The generation loop: prefill the prompt, then sample and decode one token at a time,
//! streaming text as it becomes printable.

use std::time::{Duration, Instant};

use crate::block_manager::BlockTable;
use crate::error::Result;
use crate::runner::Runner;
use crate::sampler::Sampler;
use crate::tokenizer::Tokenizer;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-sequence token.
    Eos,
    /// `max_tokens` were generated.
    Length,
    /// The sequence filled the context.
    Context,
    /// The caller's text sink asked to stop (say, stdout was closed).
    Sink,
}

#[derive(Clone, Debug)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Prompt in, first new token chosen.
    pub time_to_first_token: Duration,
    /// From the first new token to the last.
    pub decode_time: Duration,
    pub stop: StopReason,
}

impl Stats {
    /// Tokens per second after the first (each needs one decode step).
    pub fn decode_tok_per_s(&self) -> f64 {
        let steps = self.generated_tokens.saturating_sub(1);
        if steps == 0 || self.decode_time.is_zero() {
            return 0.0;
        }
        steps as f64 / self.decode_time.as_secs_f64()
    }
}

/// Generates up to `max_tokens` after `prompt`. `on_text` receives each printable piece of
/// text and returns false to stop early. Returns the new token ids and the timings.
pub fn generate(
    runner: &mut Runner,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    max_tokens: usize,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<(Vec<u32>, Stats)> {
    let mut seq = BlockTable::default();
    let result = generate_in(
        runner, &mut seq, tokenizer, sampler, prompt, max_tokens, on_text,
    );
    runner.release(&mut seq);
    result
}

fn generate_in(
    runner: &mut Runner,
    seq: &mut BlockTable,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    max_tokens: usize,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<(Vec<u32>, Stats)> {
    let start = Instant::now();
    let greedy = sampler.is_greedy();
    // `[vocab]`: the sampler edits logits in place, so it works on a copy.
    let mut logits = vec![];
    // The next token: picked by the backend when decoding is greedy, else sampled here.
    let mut step = |runner: &mut Runner,
                    seq: &mut BlockTable,
                    input: &[u32],
                    history: &[u32]|
     -> Result<u32> {
        if greedy {
            return runner.extend_greedy(seq, input);
        }
        logits.clear();
        logits.extend_from_slice(runner.extend(seq, input)?);
        Ok(sampler.sample(&mut logits, history))
    };
    let mut history = prompt.to_vec();
    let mut token = step(runner, seq, prompt, &history)?;
    let first_token_at = Instant::now();
    let mut generated = vec![];
    let mut stream = TextStream::default();
    let mut stop = StopReason::Length;
    while generated.len() < max_tokens {
        if tokenizer.eos_tokens.contains(&token) {
            stop = StopReason::Eos;
            break;
        }
        generated.push(token);
        history.push(token);
        let text = stream.push(tokenizer, token)?;
        if !text.is_empty() && !on_text(&text) {
            stop = StopReason::Sink;
            break;
        }
        if generated.len() == max_tokens {
            break;
        }
        if seq.len >= runner.max_context() {
            stop = StopReason::Context;
            break;
        }
        token = step(runner, seq, &[token], &history)?;
    }
    let rest = stream.finish(tokenizer)?;
    if !rest.is_empty() {
        on_text(&rest);
    }
    let first = first_token_at;
    Ok((
        generated.clone(),
        Stats {
            prompt_tokens: prompt.len(),
            generated_tokens: generated.len(),
            time_to_first_token: first - start,
            decode_time: first.elapsed(),
            stop,
        },
    ))
}

/// Turns tokens into text as they arrive. A token can end in the middle of a UTF-8
/// character, and some tokenizers decode a token differently at the start of a text (a
/// leading space dropped), so each step decodes a short window that starts one step back
/// and emits only what it adds, once it is complete.
#[derive(Default)]
pub struct TextStream {
    ids: Vec<u32>,
    /// Start of the window: tokens before it have been emitted and are not decoded again.
    prefix: usize,
    /// End of what has been emitted.
    read: usize,
}

impl TextStream {
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let before = tok.decode(&self.ids[self.prefix..self.read])?;
        let now = tok.decode(&self.ids[self.prefix..])?;
        if now.len() > before.len()
            && !now.ends_with('\u{FFFD}')
            && let Some(new) = now.get(before.len()..)
        {
            let new = new.to_owned();
            self.prefix = self.read;
            self.read = self.ids.len();
            return Ok(new);
        }
        Ok(String::new())
    }

    /// Whatever is still held back (an incomplete character at the very end).
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String> {
        let before = tok.decode(&self.ids[self.prefix..self.read])?;
        let now = tok.decode(&self.ids[self.prefix..])?;
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        Ok(now.get(before.len()..).unwrap_or("").to_owned())
    }
}
