//! One prompt through the serving engine (the CLI's path): a single request, stepped until
//! it ends, its text streamed as it becomes printable.

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::runner::Forward;
use crate::serve::{Engine, FinishReason, RequestParams};
use crate::tokenizer::Tokenizer;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-sequence (or stop) token.
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

/// Generates up to `params.max_tokens` after `prompt`, as one request of `engine` (which
/// should have no other work). `on_text` receives each printable piece of text and returns
/// false to stop early. A request that would run past the context is cut short to fit, and
/// then stops with `StopReason::Context`. Returns the new token ids and the timings.
pub fn generate<M: Forward>(
    engine: &mut Engine<M>,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    mut params: RequestParams,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<(Vec<u32>, Stats)> {
    let start = Instant::now();
    // The last token generated needs no room in the cache: the context holds the prompt and
    // all but one of them.
    let room = (engine.max_context() + 1).saturating_sub(prompt.len());
    let cut_short = params.max_tokens > room && room > 0;
    if cut_short {
        params.max_tokens = room;
    }
    let id = engine.add_request(prompt.to_vec(), params)?;
    let mut first_token_at = None;
    let mut generated = vec![];
    let mut stream = TextStream::default();
    let mut stop = None;
    while stop.is_none() && engine.has_work() {
        for out in engine.step()? {
            debug_assert_eq!(out.id, id, "the engine runs this request alone");
            first_token_at.get_or_insert_with(Instant::now);
            if let Some(token) = out.token {
                generated.push(token);
                let text = stream.push(tokenizer, token)?;
                if !text.is_empty() && !on_text(&text) {
                    engine.abort(id);
                    stop = Some(StopReason::Sink);
                    break;
                }
            }
            stop = match out.finish {
                None | Some(FinishReason::Abort) => stop,
                Some(FinishReason::Stop) => Some(StopReason::Eos),
                Some(FinishReason::Length) if cut_short => Some(StopReason::Context),
                Some(FinishReason::Length) => Some(StopReason::Length),
            };
        }
    }
    let rest = stream.finish(tokenizer)?;
    if !rest.is_empty() {
        on_text(&rest);
    }
    let first = first_token_at.unwrap_or_else(Instant::now);
    let stats = Stats {
        prompt_tokens: prompt.len(),
        generated_tokens: generated.len(),
        time_to_first_token: first - start,
        decode_time: first.elapsed(),
        stop: stop.unwrap_or(StopReason::Length),
    };
    Ok((generated, stats))
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
