//! `rustle` with no subcommand: one prompt through the serving engine, the completion
//! streamed to stdout, progress and one summary line on stderr.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use rustle::chat::{self, Message};
use rustle::config::{Config, limits};
use rustle::error::{Error, Result};
use rustle::generate::{StopReason, generate};
use rustle::loader;
use rustle::placement::Placement;
use rustle::runner::{RunnerOptions, cpu_kv_blocks};
use rustle::serve::draft::DraftModel;
use rustle::serve::{Engine, EngineOptions, RequestParams};
use rustle::tokenizer::{MAX_BYTES_PER_TOKEN, Tokenizer};

use super::args::GenerateArgs;
use super::grammar::compile;

pub fn run(args: GenerateArgs) -> Result<()> {
    let sampling = args.sampling.params()?;
    let grammar = args.grammar.spec()?;
    if args.max_tokens == 0 {
        return Err(Error::Usage("--max-tokens must be at least 1".into()));
    }
    if args.token_budget == 0 {
        return Err(Error::Usage("--token-budget must be at least 1".into()));
    }
    let text = prompt_text(&args)?;
    let place = Placement {
        prefix: "rustle",
        device: args.device,
        weights: args.weights,
    };
    let gpu = place.open_gpu()?;
    eprintln!("rustle: loading {}", path_display(&args.model));
    let path = loader::resolve_model_path(args.model.clone())?;
    let model = place.load(gpu, &path)?;
    if let Some(gpu) = model.gpu() {
        eprintln!("rustle: running on {}", gpu.description);
    }
    let config = model.config();
    eprintln!(
        "rustle: loaded {} in {:.1} s: {} layers, dim {}, vocab {}",
        model.description(),
        model.started.elapsed().as_secs_f64(),
        config.n_layers,
        config.dim,
        config.vocab_size
    );
    let prompt = encode(&args, config, model.tokenizer(), text)?;
    // On the CPU the pool holds this run (the prompt and its new tokens), not the model's
    // whole context; the GPU sizes its own from the free memory.
    let kv_blocks = match model.gpu() {
        None => args
            .kv_blocks
            .or(Some(cpu_kv_blocks(config, prompt.len() + args.max_tokens))),
        Some(_) => args.kv_blocks,
    };
    let opts = RunnerOptions {
        kv_blocks,
        max_batch_tokens: args.token_budget,
        weights: args.weights,
        kv_dtype: args.kv_dtype,
        ..Default::default()
    };
    let stored = model.stored_summary();
    // The draft first: the model's pool on the GPU then takes the memory it left.
    let draft = match &args.draft_model {
        Some(path) => {
            let tokens = prompt.len() + args.max_tokens + args.speculate;
            let blocks = rustle::kv::block_manager::blocks_for(tokens);
            Some(place.draft_runner(model.gpu().cloned(), path, blocks)?.0)
        }
        None => None,
    };
    let (mut runner, tokenizer) = model.into_runner(&opts)?;
    if args.speculate > 0 && runner.gpu().is_none() {
        // The guessed rows must choose as single decode steps would: on the CPU that is the
        // batch-invariant mode, where generated rows take the decode's 8-bit dot products.
        runner.set_batch_invariant(true);
    }
    let tokenizer = Arc::new(tokenizer);
    eprintln!("rustle: weights: {stored}; {}", runner.weights_held());
    let mut engine = Engine::new(
        runner,
        EngineOptions {
            token_budget: args.token_budget,
            prefix_cache: !args.no_prefix_cache,
            eos: tokenizer.eos_tokens.clone(),
            ..Default::default()
        },
    )?;
    if let Some(draft) = draft {
        let vocab = engine.limits().vocab_size;
        engine.set_drafter(Box::new(DraftModel::new(draft, vocab)?));
    }
    let constraint = match &grammar {
        Some(spec) => Some(compile(spec, &tokenizer, engine.limits().vocab_size)?),
        None => None,
    };
    let params = RequestParams {
        sampling,
        max_tokens: args.max_tokens,
        constraint,
        speculate: args.speculate,
        ..Default::default()
    };
    let mut stdout = std::io::stdout().lock();
    // A closed stdout (`rustle ... | head`) ends generation quietly.
    let mut sink = |piece: &str| {
        stdout
            .write_all(piece.as_bytes())
            .and_then(|_| stdout.flush())
            .is_ok()
    };
    let (_, stats) = generate(&mut engine, &tokenizer, &prompt, params, &mut sink)?;
    let _ = writeln!(stdout);
    let stop = match stats.stop {
        StopReason::Eos => "end of sequence",
        StopReason::Length => "max tokens",
        StopReason::Context => "context full",
        StopReason::Sink => "output closed",
    };
    eprintln!(
        "rustle: {} prompt tokens, {} generated, time to first token {:.0} ms, decode {:.1} tok/s ({}; stopped: {stop})",
        stats.prompt_tokens,
        stats.generated_tokens,
        stats.time_to_first_token.as_secs_f64() * 1e3,
        stats.decode_tok_per_s(),
        engine.model().device_name()
    );
    let e = engine.stats();
    if e.drafted_tokens > 0 {
        eprintln!(
            "rustle: speculation: {} of {} guessed tokens kept, {:.2} tokens a step",
            e.accepted_tokens,
            e.drafted_tokens,
            stats.generated_tokens as f64 / e.steps.saturating_sub(1).max(1) as f64
        );
    }
    Ok(())
}

/// `--prompt`, or `--prompt-file`'s text.
fn prompt_text(args: &GenerateArgs) -> Result<String> {
    let text = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(path)) => {
            // No context holds a longer text; do not read one into memory to find that out.
            let len = std::fs::metadata(path)
                .map_err(|e| Error::io(path, e))?
                .len();
            let most = (limits::CONTEXT * MAX_BYTES_PER_TOKEN) as u64;
            if len > most {
                return Err(Error::Usage(format!(
                    "{}: {len} bytes, more than any context rustle runs can hold ({most} bytes)",
                    path.display()
                )));
            }
            let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
            String::from_utf8(bytes)
                .map_err(|e| Error::Usage(format!("{}: not UTF-8 text ({e})", path.display())))?
        }
        (None, None) => unreachable!("clap requires one"),
    };
    if text.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    Ok(text)
}

/// The prompt's tokens: `text` as it is, or (`--chat`) as one user message, after
/// `--system`'s, in the model's chat template. Text longer than the context could hold is
/// refused before it is tokenized.
fn encode(
    args: &GenerateArgs,
    config: &Config,
    tokenizer: &Tokenizer,
    text: String,
) -> Result<Vec<u32>> {
    let context = config.max_seq_len;
    if !args.chat {
        return tokenizer.encode_prompt(&text, true, context);
    }
    if tokenizer.chat_template.is_none() {
        eprintln!(
            "rustle: the model has no chat template (looked for chat_template.jinja, tokenizer_config.json, GGUF metadata); using ChatML"
        );
    }
    let mut messages = vec![];
    if let Some(system) = &args.system {
        messages.push(Message {
            role: "system".into(),
            content: system.clone(),
        });
    }
    messages.push(Message {
        role: "user".into(),
        content: text,
    });
    let max_bytes = chat::max_bytes_for_context(context);
    let rendered = chat::render_within(tokenizer, &messages, max_bytes)?;
    tokenizer.encode_prompt(&rendered, false, context)
}

fn path_display(model: &Option<PathBuf>) -> String {
    match model {
        Some(p) => p.display().to_string(),
        None => "the default model".into(),
    }
}
