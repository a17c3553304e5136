//! The OpenAI API as rustle speaks it: requests parsed and checked into a `Plan` (every
//! error a 400 naming its field), and the JSON shapes of the replies.
//!
//! Accepted, besides the prompt: `model`, `stream`, `stream_options.include_usage`,
//! `max_tokens`, `max_completion_tokens` (chat), `temperature`, `top_p`, `n`, `seed`, `stop`,
//! `logprobs` (+ `top_logprobs` for chat), `presence_penalty`, `frequency_penalty`; as
//! extensions `top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `speculate` (tokens to
//! guess a step by prompt lookup, 0 to 64: the server's `--speculate` otherwise). For chat,
//! `response_format` (`text`, `json_object`, `json_schema`), `tools` and `tool_choice`, and
//! messages with `tool_calls` and the `tool` role (`structured`). Accepted and ignored, as
//! they change nothing a single server could do: `user`, `metadata`, `service_tier`,
//! `parallel_tool_calls`. Accepted only at their neutral value: `logit_bias` (empty),
//! `modalities` (`["text"]`), `store` (false), `echo` (false), `suffix` (empty), `best_of`
//! (at most `n`). Refused by name: the older `functions`, audio, predictions, reasoning
//! effort, web search; any other field is refused as unrecognised. A `null` value counts as
//! absent.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::errors::{ApiError, missing, out_of_range, unsupported};
use super::structured::{self, ToolCall, Tools};
use crate::constrain::GrammarSpec;
use crate::sampler::SamplingParams;
use crate::serve::MAX_TOP_LOGPROBS;
use messages::messages;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/completions`
    Completions,
}

/// Most choices (`n`) one request may ask for.
pub const MAX_N: usize = 16;
/// Most stop strings, as OpenAI allows.
pub const MAX_STOPS: usize = 4;

/// Fields both endpoints take.
const COMMON: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "seed",
    "stop",
    "logprobs",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "speculate",
];
const CHAT_ONLY: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "modalities",
    "store",
    "metadata",
    "service_tier",
];
const COMPLETIONS_ONLY: &[&str] = &["prompt", "echo", "suffix", "best_of"];

/// Fields refused by name, with the reason.
const REFUSED: &[(&str, &str)] = &[
    ("functions", "use 'tools', which replaced it"),
    ("function_call", "use 'tool_choice', which replaced it"),
    ("audio", "rustle generates text only"),
    ("prediction", "rustle has no predicted outputs"),
    (
        "reasoning_effort",
        "rustle's models have no reasoning effort",
    ),
    ("web_search_options", "rustle has no web search"),
];

/// The fields as sent, each checked for its JSON type only; `null` is absent.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Raw {
    model: Option<String>,
    messages: Option<Vec<Value>>,
    prompt: Option<Value>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    n: Option<i64>,
    seed: Option<i64>,
    stop: Option<Stop>,
    logprobs: Option<LogprobsArg>,
    top_logprobs: Option<i64>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    logit_bias: Option<Map<String, Value>>,
    user: Option<String>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    repetition_penalty: Option<f64>,
    ignore_eos: Option<bool>,
    speculate: Option<i64>,
    response_format: Option<Map<String, Value>>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    modalities: Option<Vec<String>>,
    store: Option<bool>,
    metadata: Option<Map<String, Value>>,
    service_tier: Option<String>,
    echo: Option<bool>,
    suffix: Option<String>,
    best_of: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// Chat's `logprobs` is a boolean, the completions' a count.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum LogprobsArg {
    Bool(bool),
    Count(i64),
}

/// What to run the model on.
#[derive(Clone, Debug)]
pub enum Input {
    /// Through the model's chat template: each `{"role", "content"}`, with `tool_calls`
    /// (their arguments as JSON values, as templates read them) or `tool_call_id` where given.
    Messages(Vec<Value>),
    /// Encoded with the tokenizer (a beginning-of-sequence token first, if the model has one).
    Text(String),
    Tokens(Vec<u32>),
}

/// A checked request.
#[derive(Clone, Debug)]
pub struct Plan {
    pub endpoint: Endpoint,
    pub model: String,
    pub input: Input,
    pub stream: bool,
    /// Stream a last chunk with the usage.
    pub include_usage: bool,
    /// `None`: up to the context's end.
    pub max_tokens: Option<usize>,
    /// The field it came from: `max_tokens` or `max_completion_tokens`.
    pub max_tokens_param: &'static str,
    /// The seed is the first choice's; choice `i` draws with `seed + i`.
    pub sampling: SamplingParams,
    /// Whether the request gave a seed (else each choice gets a random one).
    pub seeded: bool,
    pub n: usize,
    pub stop: Vec<String>,
    /// Log-probabilities with this many alternatives per token; `None`: none.
    pub logprobs: Option<usize>,
    pub ignore_eos: bool,
    /// Tokens to guess a step (speculative decoding); `None`: the server's default.
    pub speculate: Option<usize>,
    /// What the output must match (`response_format`), if anything.
    pub grammar: Option<GrammarSpec>,
    /// The tools the model may call (`None`: none, or `tool_choice` `none`).
    pub tools: Option<Tools>,
}

/// Most tokens a request may ask to guess a step (`speculate`), as `rustle --speculate`.
pub const MAX_SPECULATE: i64 = 64;

/// Parses and checks a request body for `endpoint`. `model` is the name this server
/// answers to.
pub fn parse(endpoint: Endpoint, body: &[u8], model: &str) -> Result<Plan, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("The request body is not valid JSON: {e}"), None))?;
    let Value::Object(mut fields) = value else {
        return Err(ApiError::invalid(
            "The request body must be a JSON object.",
            None,
        ));
    };
    fields.retain(|_, v| !v.is_null());
    let only = match endpoint {
        Endpoint::Chat => CHAT_ONLY,
        Endpoint::Completions => COMPLETIONS_ONLY,
    };
    for key in fields.keys() {
        if let Some((_, why)) = REFUSED.iter().find(|(k, _)| k == key) {
            return Err(
                ApiError::invalid(format!("'{key}' is not supported: {why}."), Some(key))
                    .with_code("unsupported_parameter"),
            );
        }
        if !COMMON.contains(&key.as_str()) && !only.contains(&key.as_str()) {
            return Err(ApiError::invalid(
                format!("Unrecognized request argument supplied: {key}"),
                Some(key),
            )
            .with_code("unsupported_parameter"));
        }
    }
    let raw: Raw = serde_json::from_value(Value::Object(fields.clone()))
        .map_err(|e| type_error(&fields, e))?;
    check(endpoint, raw, model)
}

/// Which field a deserialisation error is about: each is tried alone.
fn type_error(fields: &Map<String, Value>, e: serde_json::Error) -> ApiError {
    for (key, value) in fields {
        let alone = Value::Object(Map::from_iter([(key.clone(), value.clone())]));
        if let Err(e) = serde_json::from_value::<Raw>(alone) {
            let want = match key.as_str() {
                "stop" => "a string or an array of strings".to_string(),
                "logprobs" => "a boolean (chat) or an integer (completions)".to_string(),
                _ => e.to_string(),
            };
            return ApiError::invalid(format!("Invalid type for '{key}': {want}"), Some(key))
                .with_code("invalid_type");
        }
    }
    ApiError::invalid(format!("Invalid request: {e}"), None)
}

fn check(endpoint: Endpoint, raw: Raw, served: &str) -> Result<Plan, ApiError> {
    let model = raw.model.ok_or_else(|| missing("model"))?;
    if model != served {
        return Err(ApiError::invalid(
            format!("The model '{model}' does not exist: this server serves '{served}'."),
            Some("model"),
        )
        .with_code("model_not_found"));
    }
    let input = match endpoint {
        Endpoint::Chat => {
            Input::Messages(messages(raw.messages.ok_or_else(|| missing("messages"))?)?)
        }
        Endpoint::Completions => prompt(raw.prompt.ok_or_else(|| missing("prompt"))?)?,
    };

    // Neutral values of fields rustle does not act on.
    if raw.logit_bias.is_some_and(|b| !b.is_empty()) {
        return Err(unsupported(
            "logit_bias",
            "is not supported (only an empty map)",
        ));
    }
    let grammar = structured::response_format(raw.response_format)?;
    let tools = structured::tools(raw.tools, raw.tool_choice)?;
    if grammar.is_some() && tools.as_ref().is_some_and(|t| t.grammar_needed()) {
        return Err(unsupported(
            "response_format",
            "cannot be combined with a 'tool_choice' that requires a call",
        ));
    }
    if raw
        .modalities
        .is_some_and(|m| m.iter().any(|m| m != "text"))
    {
        return Err(unsupported(
            "modalities",
            "is not supported: rustle generates text only",
        ));
    }
    if raw.store == Some(true) {
        return Err(unsupported(
            "store",
            "is not supported: rustle keeps no completions",
        ));
    }
    if raw.echo == Some(true) {
        return Err(unsupported("echo", "is not supported"));
    }
    if raw.suffix.is_some_and(|s| !s.is_empty()) {
        return Err(unsupported("suffix", "is not supported (no insertion)"));
    }

    let stream = raw.stream.unwrap_or(false);
    if raw.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            Some("stream_options"),
        ));
    }
    let include_usage = raw
        .stream_options
        .and_then(|o| o.include_usage)
        .unwrap_or(false);

    let n = raw.n.unwrap_or(1);
    if !(1..=MAX_N as i64).contains(&n) {
        return Err(out_of_range(
            "n",
            format!("must be between 1 and {MAX_N}, got {n}"),
        ));
    }
    let n = n as usize;
    if let Some(b) = raw.best_of
        && !(b >= 1 && b as usize <= n)
    {
        return Err(unsupported(
            "best_of",
            "above n is not supported: rustle returns every choice it generates",
        ));
    }

    let (max_param, max) = match (raw.max_completion_tokens, raw.max_tokens) {
        (Some(m), _) => ("max_completion_tokens", Some(m)),
        (None, m) => ("max_tokens", m),
    };
    let max_tokens = match max {
        Some(m) if m < 1 => {
            return Err(out_of_range(
                max_param,
                format!("must be at least 1, got {m}"),
            ));
        }
        Some(m) => Some(m as usize),
        // OpenAI's legacy completions default to 16 tokens; chat to what the context allows.
        None if endpoint == Endpoint::Completions => Some(16),
        None => None,
    };

    let stop = match raw.stop {
        None => vec![],
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stop.len() > MAX_STOPS {
        return Err(out_of_range(
            "stop",
            format!("at most {MAX_STOPS} stop strings, got {}", stop.len()),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(out_of_range("stop", "a stop string must not be empty"));
    }

    let logprobs = match (endpoint, raw.logprobs) {
        (_, None) => None,
        (Endpoint::Chat, Some(LogprobsArg::Bool(false))) => None,
        (Endpoint::Chat, Some(LogprobsArg::Bool(true))) => Some(0),
        (Endpoint::Completions, Some(LogprobsArg::Count(k))) => {
            if !(0..=MAX_TOP_LOGPROBS as i64).contains(&k) {
                return Err(out_of_range(
                    "logprobs",
                    format!("must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"),
                ));
            }
            Some(k as usize)
        }
        (Endpoint::Chat, Some(LogprobsArg::Count(_))) => {
            return Err(ApiError::invalid(
                "Invalid type for 'logprobs': a boolean",
                Some("logprobs"),
            )
            .with_code("invalid_type"));
        }
        (Endpoint::Completions, Some(LogprobsArg::Bool(_))) => {
            return Err(ApiError::invalid(
                "Invalid type for 'logprobs': an integer",
                Some("logprobs"),
            )
            .with_code("invalid_type"));
        }
    };
    let logprobs = match raw.top_logprobs {
        None => logprobs,
        Some(k) if !(0..=MAX_TOP_LOGPROBS as i64).contains(&k) => {
            return Err(out_of_range(
                "top_logprobs",
                format!("must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"),
            ));
        }
        Some(_) if logprobs.is_none() => {
            return Err(ApiError::invalid(
                "'top_logprobs' needs 'logprobs' set to true.",
                Some("top_logprobs"),
            ));
        }
        Some(k) => Some(k as usize),
    };

    let temperature = raw.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(out_of_range(
            "temperature",
            format!("must be between 0 and 2, got {temperature}"),
        ));
    }
    let top_k = match raw.top_k.unwrap_or(0) {
        -1 | 0 => 0,
        k if k > 0 => k as usize,
        k => {
            return Err(out_of_range(
                "top_k",
                format!("must be -1, 0 (off) or above, got {k}"),
            ));
        }
    };
    let speculate = match raw.speculate {
        None => None,
        Some(k @ 0..=MAX_SPECULATE) => Some(k as usize),
        Some(k) => {
            return Err(out_of_range(
                "speculate",
                format!("must be 0 (off) to {MAX_SPECULATE} tokens, got {k}"),
            ));
        }
    };
    let sampling = SamplingParams {
        temperature: temperature as f32,
        top_k,
        top_p: raw.top_p.unwrap_or(1.0) as f32,
        min_p: raw.min_p.unwrap_or(0.0) as f32,
        repeat_penalty: raw.repetition_penalty.unwrap_or(1.0) as f32,
        presence_penalty: raw.presence_penalty.unwrap_or(0.0) as f32,
        frequency_penalty: raw.frequency_penalty.unwrap_or(0.0) as f32,
        seed: raw.seed.unwrap_or(0) as u64,
    };
    sampling.validate().map_err(|e| {
        let name = match e.name {
            "repeat_penalty" => "repetition_penalty",
            name => name,
        };
        out_of_range(name, format!("{name} {}", e.reason))
    })?;
    Ok(Plan {
        endpoint,
        model,
        input,
        stream,
        include_usage,
        max_tokens,
        max_tokens_param: max_param,
        sampling,
        seeded: raw.seed.is_some(),
        n,
        stop,
        logprobs,
        ignore_eos: raw.ignore_eos.unwrap_or(false),
        speculate,
        grammar,
        tools,
    })
}

/// One prompt: a string, or an array of token ids (or either, alone in an array).
fn prompt(p: Value) -> Result<Input, ApiError> {
    let one_of = |n: usize| {
        out_of_range(
            "prompt",
            format!("rustle takes one prompt per request, got {n}: send them as separate requests"),
        )
    };
    let wrong = || {
        ApiError::invalid(
            "Invalid type for 'prompt': a string or an array of token ids",
            Some("prompt"),
        )
        .with_code("invalid_type")
    };
    let tokens = |v: &[Value]| -> Result<Input, ApiError> {
        v.iter()
            .map(|t| {
                t.as_u64()
                    .filter(|&t| t <= u32::MAX as u64)
                    .map(|t| t as u32)
            })
            .collect::<Option<Vec<u32>>>()
            .map(Input::Tokens)
            .ok_or_else(wrong)
    };
    match p {
        Value::String(s) => Ok(Input::Text(s)),
        Value::Array(v) if v.iter().all(Value::is_number) => tokens(&v),
        Value::Array(v) if v.len() != 1 => Err(one_of(v.len())),
        Value::Array(v) => match &v[0] {
            Value::String(s) => Ok(Input::Text(s.clone())),
            Value::Array(t) => tokens(t),
            _ => Err(wrong()),
        },
        _ => Err(wrong()),
    }
}

// ---- Replies ----

/// One token's log-probability as text, with its alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub top: Vec<(String, f32)>,
}

/// JSON has no -inf: OpenAI reports -9999 for "impossible".
fn lp(x: f32) -> f32 {
    if x.is_finite() { x } else { -9999.0 }
}

/// Chat's `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
pub fn chat_logprobs(tokens: &[TokenLogprob]) -> Value {
    let entry = |t: &str, l: f32| json!({"token": t, "logprob": lp(l), "bytes": t.as_bytes()});
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(&t.token, t.logprob);
            e["top_logprobs"] = t.top.iter().map(|(s, l)| entry(s, *l)).collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// The completions' `logprobs`: parallel arrays, offsets counted in bytes of the text from
/// `offset` on.
pub fn completion_logprobs(tokens: &[TokenLogprob], mut offset: usize) -> Value {
    let mut text_offset = Vec::with_capacity(tokens.len());
    for t in tokens {
        text_offset.push(offset);
        offset += t.token.len();
    }
    let top: Vec<Value> = tokens
        .iter()
        .map(|t| {
            Value::Object(
                t.top
                    .iter()
                    .map(|(s, l)| (s.clone(), json!(lp(*l))))
                    .collect(),
            )
        })
        .collect();
    json!({
        "tokens": tokens.iter().map(|t| &t.token).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| lp(t.logprob)).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}

pub fn usage(prompt: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// One finished choice of a non-streaming reply.
#[derive(Clone, Debug, Default)]
pub struct Choice {
    pub text: String,
    pub finish_reason: &'static str,
    /// `Some` when the request asked for log-probabilities.
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// The tool calls the text held (then `text` is what came before them).
    pub tool_calls: Vec<ToolCall>,
}

/// The whole reply of a request that did not stream.
pub fn reply(plan: &Plan, id: &str, created: u64, choices: &[Choice], usage: Value) -> Value {
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| match plan.endpoint {
            Endpoint::Chat => json!({
                "index": i,
                "message": message(c),
                "logprobs": c.logprobs.as_deref().map(chat_logprobs),
                "finish_reason": c.finish_reason,
            }),
            Endpoint::Completions => json!({
                "index": i,
                "text": c.text,
                "logprobs": c.logprobs.as_deref().map(|t| completion_logprobs(t, 0)),
                "finish_reason": c.finish_reason,
            }),
        })
        .collect();
    json!({
        "id": id,
        "object": object(plan.endpoint, false),
        "created": created,
        "model": plan.model,
        "choices": choices,
        "usage": usage,
    })
}

/// A chat choice's message: its text, or its tool calls (with any text before them).
fn message(c: &Choice) -> Value {
    if c.tool_calls.is_empty() {
        return json!({"role": "assistant", "content": c.text, "refusal": null});
    }
    let calls: Vec<Value> = c
        .tool_calls
        .iter()
        .map(|t| structured::call_json(t, None))
        .collect();
    let content = (!c.text.is_empty()).then_some(&c.text);
    json!({"role": "assistant", "content": content, "refusal": null, "tool_calls": calls})
}

pub fn object(endpoint: Endpoint, chunk: bool) -> &'static str {
    match (endpoint, chunk) {
        (Endpoint::Chat, false) => "chat.completion",
        (Endpoint::Chat, true) => "chat.completion.chunk",
        (Endpoint::Completions, _) => "text_completion",
    }
}

/// The start of a reply's id: `chatcmpl-` or `cmpl-`.
pub fn id_prefix(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Chat => "chatcmpl-",
        Endpoint::Completions => "cmpl-",
    }
}

/// `GET /v1/models`
pub fn models(name: &str, created: u64) -> Value {
    json!({
        "object": "list",
        "data": [{"id": name, "object": "model", "created": created, "owned_by": "rustle"}],
    })
}

mod messages;

#[cfg(test)]
mod tests;
