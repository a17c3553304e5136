//! The router and its handlers: each completion request is parsed and checked, its prompt
//! tokenized and checked against the context, given a place in the queue, submitted to the
//! engine thread, and then answered whole or streamed. The chat page's files come from
//! `page`.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use super::engine_loop::{EngineHandle, Submission};
use super::errors::ApiError;
use super::grammars::GrammarEngine;
use super::metrics::Metrics;
use super::openai::{self, Choice, Endpoint, Input, Plan};
use super::page;
use super::request::{QueueSlot, Running, ServerHandles};
use super::sse;
use super::structured::{self, ToolFormat};
use crate::chat;
use crate::error::Error;
use crate::serve::RequestParams;
use crate::tokenizer::Tokenizer;

/// What every handler shares.
pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    /// Structured output's grammars, compiled against the tokenizer.
    pub grammars: Arc<GrammarEngine>,
    pub metrics: Arc<Metrics>,
    /// The name clients ask for.
    pub model: String,
    /// Unix seconds when the server started (the model's `created`).
    pub created: u64,
    pub api_key: Option<String>,
    pub max_queued: Option<usize>,
    pub request_timeout: Option<f64>,
    /// Tokens each request guesses a step unless it says (`rustle serve --speculate`).
    pub speculate: usize,
    /// Requests waiting for their first token.
    pub queued: Arc<AtomicUsize>,
    /// Whether the engine thread still runs (`/health`).
    pub engine_alive: Box<dyn Fn() -> bool + Send + Sync>,
}

pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    Router::new()
        .merge(v1)
        .merge(page::routes())
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// With `--api-key`: `Authorization: Bearer KEY` or a 401.
async fn authorize(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !given.is_some_and(|g| same(g.as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Compares in time independent of where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(uri.path())
}

async fn method_not_allowed(uri: Uri) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        ..ApiError::invalid(format!("Method not allowed on {}", uri.path()), None)
    }
}

async fn models(State(s): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(openai::models(&s.model, s.created))
}

/// 200 while the engine thread runs (the model is loaded before the port opens), 503
/// after it has died: for liveness and readiness probes alike.
async fn health(State(s): State<Arc<AppState>>) -> Response {
    if (s.engine_alive)() {
        Json(json!({"status": "ok"})).into_response()
    } else {
        let body = json!({"status": "engine stopped"});
        (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
    }
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    let content_type = "text/plain; version=0.0.4; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], s.metrics.render()).into_response()
}

async fn chat_completions(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(s, Endpoint::Chat, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn completions(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(s, Endpoint::Completions, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn generate(
    s: Arc<AppState>,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let body = body.map_err(|e| ApiError {
        status: e.status(),
        ..ApiError::invalid(e.body_text(), None)
    })?;
    let plan = openai::parse(endpoint, &body, &s.model)?;
    let tool_format = tool_format(&s.tokenizer, &plan)?;
    let prompt = tokenize(&s.tokenizer, &plan)?;
    let max_tokens = check_context(&s.engine, &plan, prompt.len())?;
    let grammar = match (&plan.grammar, &plan.tools, tool_format) {
        (Some(g), _, _) => Some((g.clone(), "response_format")),
        (None, Some(t), Some(f)) => t.grammar(f).map(|g| (g, "tools")),
        _ => None,
    };
    let constraint = match grammar {
        Some((spec, param)) => Some(s.grammars.compile(spec, param).await?),
        None => None,
    };
    let slot = QueueSlot::take(&s.queued, s.max_queued).map_err(|queued| {
        s.metrics.rejected();
        ApiError::queue_full(queued, 1)
    })?;

    let params = (0..plan.n)
        .map(|i| {
            let mut sampling = plan.sampling.clone();
            sampling.seed = match plan.seeded {
                true => sampling.seed.wrapping_add(i as u64),
                false => rand::random(),
            };
            RequestParams {
                sampling,
                max_tokens,
                stop_token_ids: vec![],
                ignore_eos: plan.ignore_eos,
                logprobs: plan.logprobs,
                constraint: constraint.clone(),
                speculate: plan.speculate.unwrap_or(s.speculate),
            }
        })
        .collect();
    let (events, events_rx) = mpsc::unbounded_channel();
    let (reply, answer) = oneshot::channel();
    let prompt_tokens = prompt.len();
    s.engine
        .submit(Submission {
            prompt,
            params,
            arrived,
            events,
            reply,
        })
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let ids = answer
        .await
        .map_err(|_| ApiError::internal("the engine stopped"))?
        .map_err(engine_error)?;
    let deadline = s.request_timeout.map(|secs| {
        let at = tokio::time::Instant::from_std(arrived) + std::time::Duration::from_secs_f64(secs);
        (at, secs)
    });
    let server = ServerHandles {
        engine: s.engine.clone(),
        tokenizer: s.tokenizer.clone(),
        metrics: s.metrics.clone(),
    };
    let running = Running::new(
        server,
        ids,
        events_rx,
        plan.stop.clone(),
        slot,
        deadline,
        prompt_tokens,
    );
    let id = format!(
        "{}{:016x}{:08x}",
        openai::id_prefix(endpoint),
        rand::random::<u64>(),
        rand::random::<u32>()
    );
    let created = unix_now();
    if plan.stream {
        return Ok(sse::stream(plan, tool_format, id, created, running).into_response());
    }
    collect(plan, tool_format, id, created, running).await
}

/// How the model writes tool calls, when the request offers tools: a 400 when its chat
/// template does not render them (the model would never hear of them).
fn tool_format(tok: &Tokenizer, plan: &Plan) -> Result<Option<ToolFormat>, ApiError> {
    if plan.tools.is_none() {
        return Ok(None);
    }
    let format = tok
        .chat_template
        .as_deref()
        .and_then(ToolFormat::of_template);
    match format {
        Some(f) => Ok(Some(f)),
        None => Err(ApiError::invalid(
            "'tools' is not supported by this model: its chat template does not render tools.",
            Some("tools"),
        )
        .with_code("unsupported_parameter")),
    }
}

/// Runs a request to its end and answers with the whole reply.
async fn collect(
    plan: Plan,
    tool_format: Option<ToolFormat>,
    id: String,
    created: u64,
    mut running: Running,
) -> Result<Response, ApiError> {
    let empty = Choice {
        logprobs: plan.logprobs.map(|_| vec![]),
        ..Default::default()
    };
    let mut choices = vec![empty; running.n_choices()];
    while let Some(delta) = running.next().await {
        let d = delta?;
        let c = &mut choices[d.choice];
        c.text += &d.text;
        if let Some(lp) = &mut c.logprobs {
            lp.extend(d.logprobs);
        }
        if let Some(f) = d.finish {
            c.finish_reason = f;
        }
    }
    if let Some(format) = tool_format {
        for c in &mut choices {
            if let Some((content, calls)) = structured::parse_calls(&c.text, format) {
                c.text = content;
                c.tool_calls = calls;
                c.finish_reason = "tool_calls";
            }
        }
    }
    let usage = openai::usage(running.prompt_tokens, running.completion_tokens());
    Ok(Json(openai::reply(&plan, &id, created, &choices, usage)).into_response())
}

/// The prompt's token ids: messages through the chat template, text through the tokenizer.
fn tokenize(tok: &Tokenizer, plan: &Plan) -> Result<Vec<u32>, ApiError> {
    let (ids, param) = match &plan.input {
        Input::Messages(m) => {
            let tools = plan.tools.as_ref().map_or(&[][..], |t| &t.list[..]);
            let text =
                chat::render_template(tok, m, tools, chat::DEFAULT_MAX_BYTES).map_err(|e| {
                    ApiError::invalid(
                        format!("The messages do not fit the model's {e}"),
                        Some("messages"),
                    )
                })?;
            (tok.encode(&text, false), "messages")
        }
        Input::Text(t) => (tok.encode(t, true), "prompt"),
        Input::Tokens(t) => (Ok(t.clone()), "prompt"),
    };
    let ids = ids.map_err(|e| ApiError::internal(e.to_string()))?;
    if ids.is_empty() {
        return Err(ApiError::invalid("The prompt is empty.", Some(param)));
    }
    let vocab = tok.vocab_size();
    if let Some(t) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            format!("Token id {t} is outside the model's vocabulary of {vocab}."),
            Some(param),
        ));
    }
    Ok(ids)
}

/// The tokens to generate: as asked, or (no `max_tokens`) to the end of the context. A
/// prompt that leaves no room, or a `max_tokens` past the end, is a 400.
fn check_context(engine: &EngineHandle, plan: &Plan, prompt: usize) -> Result<usize, ApiError> {
    let context = engine.limits.max_context;
    let param = match plan.endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completions => "prompt",
    };
    // The last token generated needs no room in the KV cache.
    let room = (context + 1).saturating_sub(prompt);
    if prompt > context || room == 0 {
        return Err(ApiError::invalid(
            format!("This model's context holds {context} tokens, but the prompt has {prompt}."),
            Some(param),
        )
        .with_code("context_length_exceeded"));
    }
    match plan.max_tokens {
        None => Ok(room),
        Some(m) if m <= room => Ok(m),
        Some(m) => Err(ApiError::invalid(
            format!(
                "This model's context holds {context} tokens: a prompt of {prompt} tokens leaves room for {room} more, but {m} were asked for."
            ),
            Some(plan.max_tokens_param),
        )
        .with_code("context_length_exceeded")),
    }
}

/// The engine's refusal of a request it was given.
fn engine_error(e: Error) -> ApiError {
    match e {
        Error::InvalidRequest(why) => ApiError::invalid(why, None),
        Error::PromptTooLong { .. } => {
            ApiError::invalid(e.to_string(), None).with_code("context_length_exceeded")
        }
        e => ApiError::internal(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_whole() {
        assert!(same(b"secret", b"secret"));
        assert!(!same(b"secret", b"secreT"));
        assert!(!same(b"secret", b"secret2"));
        assert!(!same(b"", b"x"));
    }
}
