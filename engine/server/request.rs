//! One admitted request as the HTTP side follows it: the engine's token ids turned into
//! text per choice (held back at a possible stop string), its place in the queue, and the
//! guard that aborts whatever is still running when the request is dropped (the client
//! left, the time ran out, a stop string matched).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

use super::engine_loop::{EngineHandle, Event};
use super::errors::ApiError;
use super::metrics::Metrics;
use super::openai::TokenLogprob;
use super::stop::StopMatcher;
use crate::generate::TextStream;
use crate::serve::{FinishReason, RequestId, TokenLogprobs};
use crate::tokenizer::Tokenizer;

/// A place among the requests waiting for their first token (`--max-queued`): given back
/// at the first token or when dropped.
pub struct QueueSlot(Arc<AtomicUsize>);

impl QueueSlot {
    /// Takes a place if fewer than `max` are taken; else says how many are.
    pub fn take(queued: &Arc<AtomicUsize>, max: Option<usize>) -> Result<QueueSlot, usize> {
        let before = queued.fetch_add(1, Ordering::SeqCst);
        if max.is_some_and(|max| before >= max) {
            queued.fetch_sub(1, Ordering::SeqCst);
            return Err(before);
        }
        Ok(QueueSlot(queued.clone()))
    }
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// News for one choice: text to send (possibly empty), log-probabilities of the tokens
/// that came, and the finish reason once it has ended.
#[derive(Debug, Default)]
pub struct Delta {
    pub choice: usize,
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<&'static str>,
}

/// What a request keeps of the server: the engine (to abort its sequences), the tokenizer
/// (to turn its tokens into text) and the metrics (to count it when its time runs out).
pub struct ServerHandles {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub metrics: Arc<Metrics>,
}

struct ChoiceState {
    id: RequestId,
    text: TextStream,
    stop: StopMatcher,
    /// Tokens generated (the completion's usage).
    tokens: usize,
    finished: bool,
}

pub struct Running {
    engine: EngineHandle,
    events: UnboundedReceiver<Event>,
    tokenizer: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
    choices: Vec<ChoiceState>,
    slot: Option<QueueSlot>,
    deadline: Option<(Instant, f64)>,
    pub prompt_tokens: usize,
}

impl Running {
    pub fn new(
        server: ServerHandles,
        ids: Vec<RequestId>,
        events: UnboundedReceiver<Event>,
        stop: Vec<String>,
        slot: QueueSlot,
        deadline: Option<(Instant, f64)>,
        prompt_tokens: usize,
    ) -> Running {
        let ServerHandles {
            engine,
            tokenizer,
            metrics,
        } = server;
        let choices = ids
            .into_iter()
            .map(|id| ChoiceState {
                id,
                text: TextStream::default(),
                stop: StopMatcher::new(stop.clone()),
                tokens: 0,
                finished: false,
            })
            .collect();
        Running {
            engine,
            events,
            tokenizer,
            metrics,
            choices,
            slot: Some(slot),
            deadline,
            prompt_tokens,
        }
    }

    pub fn n_choices(&self) -> usize {
        self.choices.len()
    }

    /// Tokens generated over all choices.
    pub fn completion_tokens(&self) -> usize {
        self.choices.iter().map(|c| c.tokens).sum()
    }

    /// The next piece of news; `None` once every choice has finished. An error ends the
    /// request (its choices are aborted when it is dropped).
    pub async fn next(&mut self) -> Option<Result<Delta, ApiError>> {
        loop {
            if self.choices.iter().all(|c| c.finished) {
                return None;
            }
            let event = match self.deadline {
                None => self.events.recv().await,
                Some((at, secs)) => match tokio::time::timeout_at(at, self.events.recv()).await {
                    Ok(e) => e,
                    Err(_) => {
                        self.metrics.timed_out();
                        return Some(Err(ApiError::timeout(secs)));
                    }
                },
            };
            let (choice, out) = match event {
                Some(Event::Output { choice, out }) => (choice, out),
                Some(Event::Failed(why)) => return Some(Err(ApiError::internal(why))),
                None => return Some(Err(ApiError::internal("the engine stopped"))),
            };
            self.slot = None;
            match self.take(choice, out.token, out.logprobs, out.finish) {
                Ok(Some(d)) => return Some(Ok(d)),
                Ok(None) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }

    fn take(
        &mut self,
        i: usize,
        token: Option<u32>,
        logprobs: Option<TokenLogprobs>,
        finish: Option<FinishReason>,
    ) -> Result<Option<Delta>, ApiError> {
        let tok = &self.tokenizer;
        let c = &mut self.choices[i];
        if c.finished {
            // Outputs of a step that ran before its abort arrived.
            return Ok(None);
        }
        let text_err = |e: crate::Error| ApiError::internal(e.to_string());
        let mut piece = String::new();
        if let Some(t) = token {
            c.tokens += 1;
            piece = c.text.push(tok, t).map_err(text_err)?;
        }
        if finish.is_some() {
            piece += &c.text.finish(tok).map_err(text_err)?;
        }
        let (mut text, stopped) = c.stop.push(&piece);
        let finish = if stopped {
            if finish.is_none() {
                self.engine.abort(vec![c.id]);
            }
            Some("stop")
        } else {
            match finish {
                None => None,
                Some(why) => {
                    text += &c.stop.finish();
                    Some(match why {
                        FinishReason::Stop => "stop",
                        FinishReason::Length => "length",
                        FinishReason::Abort => "abort",
                    })
                }
            }
        };
        c.finished = finish.is_some();
        let logprobs: Vec<TokenLogprob> = logprobs
            .into_iter()
            .map(|lp| token_logprob(tok, &lp))
            .collect::<Result<_, _>>()
            .map_err(text_err)?;
        if text.is_empty() && logprobs.is_empty() && finish.is_none() {
            return Ok(None);
        }
        Ok(Some(Delta {
            choice: i,
            text,
            logprobs,
            finish,
        }))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let live = self.choices.iter().filter(|c| !c.finished);
        self.engine.abort(live.map(|c| c.id).collect());
    }
}

/// A token's log-probabilities with each token as its text.
fn token_logprob(tok: &Tokenizer, lp: &TokenLogprobs) -> crate::Result<TokenLogprob> {
    Ok(TokenLogprob {
        token: tok.decode(&[lp.token])?,
        logprob: lp.logprob,
        top: lp
            .top
            .iter()
            .map(|&(t, l)| Ok((tok.decode(&[t])?, l)))
            .collect::<crate::Result<_>>()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_slots_count_up_to_the_limit_and_come_back() {
        let q = Arc::new(AtomicUsize::new(0));
        let a = QueueSlot::take(&q, Some(2)).unwrap();
        let _b = QueueSlot::take(&q, Some(2)).unwrap();
        assert_eq!(QueueSlot::take(&q, Some(2)).err(), Some(2));
        drop(a);
        let _c = QueueSlot::take(&q, Some(2)).unwrap();
        assert_eq!(q.load(Ordering::SeqCst), 2);
        assert!(QueueSlot::take(&q, None).is_ok());
        assert_eq!(q.load(Ordering::SeqCst), 2);
    }
}
