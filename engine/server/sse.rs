//! Streaming replies as server-sent events: one `data: {chunk}` per piece of news, an
//! optional usage chunk, then `data: [DONE]`. A failure (the time limit, the engine) is sent
//! as one `data: {"error": ...}` event before `[DONE]`. When the client goes away the stream
//! is dropped, and with it the request (its choices are aborted at the next step).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde_json::{Value, json};

use super::openai::{self, Endpoint, Plan};
use super::request::{Delta, Running};
use super::structured::{self, ToolFormat, ToolStream};

/// Comment lines that keep idle connections (and proxies) from timing out.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

struct State {
    plan: Plan,
    id: String,
    created: u64,
    running: Running,
    /// `data:` payloads ready to go.
    ready: VecDeque<String>,
    started: bool,
    done: bool,
    /// Per choice: bytes of text sent so far (the completions' `text_offset`).
    offsets: Vec<usize>,
    /// Per choice, when the request offers tools: the text that may be a call, held back.
    tools: Vec<ToolStream>,
}

pub fn stream(
    plan: Plan,
    tool_format: Option<ToolFormat>,
    id: String,
    created: u64,
    running: Running,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let n = running.n_choices();
    let tools = match (tool_format, &plan.tools) {
        (Some(f), Some(t)) => vec![ToolStream::new(f, &t.choice); n],
        _ => vec![],
    };
    let state = State {
        plan,
        id,
        created,
        running,
        ready: VecDeque::new(),
        started: false,
        done: false,
        offsets: vec![0; n],
        tools,
    };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(data) = s.ready.pop_front() {
                return Some((Ok(Event::default().data(data)), s));
            }
            if s.done {
                return None;
            }
            s.fill().await;
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

impl State {
    /// Waits for the next news and queues its events.
    async fn fill(&mut self) {
        if !self.started {
            self.started = true;
            if self.plan.endpoint == Endpoint::Chat {
                // Each choice opens with the assistant's role, as OpenAI's streams do.
                for i in 0..self.offsets.len() {
                    let chunk = self.chunk(json!({
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": null,
                        "finish_reason": null,
                    }));
                    self.push(chunk);
                }
                return;
            }
        }
        match self.running.next().await {
            Some(Ok(delta)) => {
                let choice = self.choice(delta);
                let chunk = self.chunk(choice);
                self.push(chunk);
            }
            Some(Err(e)) => {
                self.push(e.body());
                self.ready.push_back("[DONE]".into());
                self.done = true;
            }
            None => {
                if self.plan.include_usage {
                    let usage =
                        openai::usage(self.running.prompt_tokens, self.running.completion_tokens());
                    let mut chunk = self.chunk(Value::Null);
                    chunk["choices"] = json!([]);
                    chunk["usage"] = usage;
                    self.push(chunk);
                }
                self.ready.push_back("[DONE]".into());
                self.done = true;
            }
        }
    }

    fn push(&mut self, v: Value) {
        self.ready.push_back(v.to_string());
    }

    /// A chunk holding one choice (`Null`: none, filled in by the caller).
    fn chunk(&self, choice: Value) -> Value {
        let mut c = json!({
            "id": self.id,
            "object": openai::object(self.plan.endpoint, true),
            "created": self.created,
            "model": self.plan.model,
            "choices": [choice],
        });
        if self.plan.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    fn choice(&mut self, d: Delta) -> Value {
        let wants_logprobs = self.plan.logprobs.is_some();
        match self.plan.endpoint {
            Endpoint::Chat => {
                let (mut text, mut calls) = (d.text, vec![]);
                if let Some(stream) = self.tools.get_mut(d.choice) {
                    text = stream.push(&text);
                    if d.finish.is_some() {
                        let (rest, found) = stream.finish();
                        text += &rest;
                        calls = found;
                    }
                }
                let mut delta = if text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                let mut finish = d.finish;
                if !calls.is_empty() {
                    let calls: Vec<Value> = (calls.iter().enumerate())
                        .map(|(i, c)| structured::call_json(c, Some(i)))
                        .collect();
                    delta["tool_calls"] = json!(calls);
                    finish = Some("tool_calls");
                }
                json!({
                    "index": d.choice,
                    "delta": delta,
                    "logprobs": wants_logprobs.then(|| openai::chat_logprobs(&d.logprobs)),
                    "finish_reason": finish,
                })
            }
            Endpoint::Completions => {
                let offset = &mut self.offsets[d.choice];
                let logprobs =
                    wants_logprobs.then(|| openai::completion_logprobs(&d.logprobs, *offset));
                *offset += d.text.len();
                json!({
                    "index": d.choice,
                    "text": d.text,
                    "logprobs": logprobs,
                    "finish_reason": d.finish,
                })
            }
        }
    }
}
