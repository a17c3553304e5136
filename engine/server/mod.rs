//! `rustle serve`: the serving engine behind an OpenAI-compatible HTTP server.
//!
//! The engine runs on its own OS thread (`engine_loop`), fed by channels; axum and tokio
//! answer HTTP on theirs (`http`). A request is parsed and checked (`openai`), tokenized,
//! given a place in the queue and submitted; its tokens come back on its own channel and
//! become text (`request`, with stop strings held back by `stop`), sent whole or as
//! server-sent events (`sse`). Structured output (`structured`: `response_format`, tools)
//! becomes a grammar the engine masks each step with (`grammars`). Errors take OpenAI's shape
//! (`errors`); `/metrics` shows the engine's state and latencies (`metrics`). A chat page for
//! people, at `/`, is a client of that same API (`page`).

pub mod args;
pub mod engine_loop;
pub mod errors;
pub mod grammars;
pub mod http;
pub mod metrics;
pub mod openai;
pub mod page;
pub mod request;
pub mod sse;
pub mod stop;
pub mod structured;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use crate::error::{Error, Result};
use crate::gpu::matrix::WeightFormat;
use crate::loader;
use crate::placement::{Placement, synthetic_gpu_runner};
use crate::runner::{Runner, RunnerOptions};
use crate::serve::draft::DraftModel;
use crate::serve::{Engine, EngineOptions};
use crate::tokenizer::Tokenizer;
use args::ServeArgs;

/// Loads the model, starts the engine thread, and serves until Ctrl-C or SIGTERM; then
/// finishes the requests in flight and returns.
pub fn run(mut args: ServeArgs) -> Result<()> {
    args.validate()?;
    // Bind first: a port in use fails before the (possibly long) model load.
    let addr = format!("{}:{}", args.host, args.port);
    let cannot = |e: std::io::Error| Error::Usage(format!("cannot listen on {addr}: {e}"));
    let listener = std::net::TcpListener::bind(&addr).map_err(cannot)?;
    listener.set_nonblocking(true).map_err(cannot)?;
    let local: SocketAddr = listener.local_addr().map_err(cannot)?;
    let path = loader::resolve_model_path(args.model.clone())?;
    let name = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| model_name(&path));
    let metrics = Arc::new(metrics::Metrics::new(&name));
    let opts = args.clone();
    let (handle, (tokenizer, device_name), thread) =
        engine_loop::spawn(move || load(&opts, &path), metrics.clone())?;
    let limits = handle.limits;
    let tokenizer = Arc::new(tokenizer);
    let thread = Arc::new(thread);
    let alive = thread.clone();
    let state = Arc::new(http::AppState {
        engine: handle,
        grammars: Arc::new(grammars::GrammarEngine::new(
            tokenizer.clone(),
            limits.vocab_size,
        )),
        tokenizer,
        metrics,
        model: name.clone(),
        created: http::unix_now(),
        api_key: args.api_key.clone(),
        max_queued: args.max_queued,
        request_timeout: args.request_timeout,
        speculate: args.speculate,
        queued: Arc::new(AtomicUsize::new(0)),
        engine_alive: Box::new(move || !alive.is_finished()),
    });

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("rustle-http")
        .build()
        .map_err(|e| Error::Usage(format!("cannot start the HTTP runtime: {e}")))?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::from_std(listener).map_err(cannot)?;
        eprintln!(
            "rustle serve: {name} on {device_name}, context {} tokens, {} KV blocks{}{}",
            limits.max_context,
            limits.n_blocks,
            match args.kv_dtype {
                crate::kv::dtype::KvDtype::Fp8 => " of fp8",
                crate::kv::dtype::KvDtype::Bf16 => "",
            },
            if args.api_key.is_some() {
                ", API key required"
            } else {
                ""
            }
        );
        eprintln!("rustle serve: listening on http://{local}");
        eprintln!("rustle serve: the chat page is at http://{local}/");
        axum::serve(listener, http::router(state))
            .with_graceful_shutdown(shutdown_signal())
            .await
            .map_err(|e| Error::Usage(format!("the server failed: {e}")))
    })?;
    // Every handle is gone with the router: the engine thread ends once idle.
    if let Some(thread) = Arc::into_inner(thread) {
        let _ = thread.join();
    }
    eprintln!("rustle serve: stopped");
    Ok(())
}

/// KV blocks of 16 tokens for a draft model's cache (`--draft-model`): room for 64 requests
/// of 2,048 tokens. A request the draft has no room for decodes without guesses.
const DRAFT_KV_BLOCKS: usize = 64 * 2048 / 16;

/// The model as a serving engine (on the engine thread), with its tokenizer and the
/// device's name.
fn load(args: &ServeArgs, path: &Path) -> Result<(Engine<Runner>, (Tokenizer, String))> {
    let place = Placement {
        prefix: "rustle serve",
        device: args.device,
        // A shape's weights are made in bf16, whatever --weights says.
        weights: match args.shape {
            Some(_) => WeightFormat::Stored,
            None => args.weights,
        },
    };
    let gpu = place.open_gpu()?;
    let opts = RunnerOptions {
        kv_blocks: args.kv_blocks,
        max_batch_tokens: args.token_budget,
        weights: place.weights,
        kv_dtype: args.kv_dtype,
        ..Default::default()
    };
    let mut draft = None;
    let (runner, tokenizer, device_name) = match &args.shape {
        Some(shape) => {
            let gpu = gpu.ok_or_else(|| {
                Error::Usage("--shape makes its weights on the GPU: there is none here".into())
            })?;
            // The tokenizer is the model's, and so is the vocabulary's size.
            let tokenizer = loader::open(path)?.tokenizer;
            let mut config = crate::shapes::shape_config(shape)?;
            config.vocab_size = tokenizer.vocab_size();
            eprintln!("rustle serve: making {shape} weights on the GPU (random, bf16)");
            let runner = synthetic_gpu_runner(gpu, config, &opts)?;
            let device_name = format!("{} ({shape}, random weights)", runner.device_name());
            (runner, tokenizer, device_name)
        }
        None => {
            let model = place.load(gpu, path)?;
            let (description, started) = (model.description().to_owned(), model.started);
            // The draft first: the model's pool on the GPU then takes the memory it left.
            if let Some(p) = &args.draft_model {
                draft = Some(
                    place
                        .draft_runner(model.gpu().cloned(), p, DRAFT_KV_BLOCKS)?
                        .0,
                );
            }
            let (mut runner, tokenizer) = model.into_runner(&opts)?;
            if runner.gpu().is_none() {
                // A seeded request must repeat whatever else is served, and the prefix cache
                // changes how a prompt is chunked: the server keeps the CPU batch-invariant.
                runner.set_batch_invariant(true);
            }
            eprintln!(
                "rustle serve: loaded {description} in {:.1} s; {}",
                started.elapsed().as_secs_f64(),
                runner.weights_held()
            );
            let device_name = runner.device_name();
            (runner, tokenizer, device_name)
        }
    };
    let mut engine = Engine::new(
        runner,
        EngineOptions {
            token_budget: args.token_budget,
            max_seqs: args.max_seqs,
            prefix_cache: !args.no_prefix_cache,
            eos: tokenizer.eos_tokens.clone(),
            guess_rows: args.guess_rows,
        },
    )?;
    if let Some(draft) = draft {
        let vocab = engine.limits().vocab_size;
        engine.set_drafter(Box::new(DraftModel::new(draft, vocab)?));
    }
    Ok((engine, (tokenizer, device_name)))
}

/// The name clients ask for by default: the model file's name without its extension, or
/// the folder's name.
fn model_name(path: &Path) -> String {
    let name = if path.is_dir() {
        path.file_name()
    } else {
        path.file_stem()
    };
    name.map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "rustle".into())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
    eprintln!("rustle serve: shutting down: finishing the requests in flight");
}
