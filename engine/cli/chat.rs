//! `rustle chat`: a conversation in the terminal. Each line typed is a user message; the
//! whole conversation goes through the model's chat template every turn (the engine's prefix
//! cache keeps the turns before it, so only the new text is computed), and the reply streams
//! back. Commands: /reset, /system TEXT, /help, /exit. Ctrl-C stops a reply; at the prompt
//! it clears the line, and Ctrl-D (or /exit) leaves.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustle::chat::{self, Message};
use rustle::error::{Error, Result};
use rustle::generate::{StopReason, generate};
use rustle::loader;
use rustle::placement::Placement;
use rustle::sampler::SamplingParams;
use rustle::serve::{Engine, EngineOptions, RequestParams};

use super::args::ChatCli;

const HELP: &str = "/reset starts the conversation again, /system TEXT sets the system prompt (and starts again), /exit leaves; Ctrl-C stops a reply";

/// Where the user's lines come from: a line editor with history on a terminal, plain lines
/// from a pipe.
enum Lines {
    Editor(rustyline::DefaultEditor),
    Piped(std::io::StdinLock<'static>),
}

impl Lines {
    fn open() -> Result<Lines> {
        if !std::io::stdin().is_terminal() {
            return Ok(Lines::Piped(std::io::stdin().lock()));
        }
        let editor = rustyline::DefaultEditor::new()
            .map_err(|e| Error::Usage(format!("the terminal's line editor: {e}")))?;
        Ok(Lines::Editor(editor))
    }

    /// The next line, `None` at the end (Ctrl-D, or the pipe's end); Ctrl-C at the prompt
    /// gives an empty line.
    fn next(&mut self) -> Result<Option<String>> {
        match self {
            Lines::Editor(editor) => match editor.readline("> ") {
                Ok(line) => {
                    if !line.trim().is_empty() {
                        let _ = editor.add_history_entry(line.as_str());
                    }
                    Ok(Some(line))
                }
                Err(rustyline::error::ReadlineError::Interrupted) => Ok(Some(String::new())),
                Err(rustyline::error::ReadlineError::Eof) => Ok(None),
                Err(e) => Err(Error::Usage(format!("reading the terminal: {e}"))),
            },
            Lines::Piped(stdin) => {
                let mut line = String::new();
                match stdin.read_line(&mut line) {
                    Ok(0) => Ok(None),
                    Ok(_) => Ok(Some(line.trim_end_matches(['\n', '\r']).to_owned())),
                    Err(e) => Err(Error::Usage(format!("reading stdin: {e}"))),
                }
            }
        }
    }
}

/// A flag Ctrl-C raises while a reply streams (a thread waits for the signal; the program
/// itself goes on).
///
/// The handler is installed here, before the first prompt, not by the thread: the line
/// editor puts in its own handler for each line it reads and then restores the one it
/// found, so a handler that a thread still starting up installed meanwhile was undone, and
/// Ctrl-C during the next reply ended the program. A signal stream (unlike `ctrl_c()`, which
/// installs at its first poll) installs when made, and misses no Ctrl-C between two.
fn interrupts() -> Result<Arc<AtomicBool>> {
    let failed = |e: std::io::Error| Error::Usage(format!("Ctrl-C's handler: {e}"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(failed)?;
    let mut ctrl_c = {
        let _in_runtime = rt.enter();
        #[cfg(unix)]
        let stream = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
        #[cfg(windows)]
        let stream = tokio::signal::windows::ctrl_c();
        stream.map_err(failed)?
    };
    let flag = Arc::new(AtomicBool::new(false));
    let raised = flag.clone();
    std::thread::spawn(move || {
        rt.block_on(async move {
            while ctrl_c.recv().await.is_some() {
                raised.store(true, Ordering::SeqCst);
            }
        });
    });
    Ok(flag)
}

pub fn run(args: &ChatCli) -> Result<()> {
    let sampling = args.sampling.params()?;
    let place = Placement {
        prefix: "rustle chat",
        device: args.device,
        weights: args.weights,
    };
    let gpu = place.open_gpu()?;
    let path = loader::resolve_model_path(args.model.clone())?;
    let model = place.load(gpu, &path)?;
    let config = model.config();
    let context = config.max_seq_len;
    if model.tokenizer().chat_template.is_none() {
        eprintln!("rustle chat: the model has no chat template; using ChatML");
    }
    let description = model.description().to_owned();
    // One conversation at the model's context.
    let (runner, tokenizer) = model.into_runner_for(context, (args.weights, args.kv_dtype))?;
    let mut engine = Engine::new(
        runner,
        EngineOptions {
            eos: tokenizer.eos_tokens.clone(),
            ..Default::default()
        },
    )?;
    let context = engine.max_context();
    eprintln!(
        "rustle chat: {description} on {}, a context of {context} tokens. {HELP}.",
        engine.model().device_name()
    );
    let stop = interrupts()?;
    let mut lines = Lines::open()?;
    let mut system = args.system.clone();
    let mut history: Vec<Message> = vec![];
    let mut stdout = std::io::stdout();
    while let Some(line) = lines.next()? {
        let line = line.trim();
        match line
            .split_once(' ')
            .map_or((line, ""), |(c, rest)| (c, rest.trim()))
        {
            ("", _) => continue,
            ("/exit" | "/quit", _) => break,
            ("/help", _) => {
                eprintln!("{HELP}");
                continue;
            }
            ("/reset", _) => {
                history.clear();
                eprintln!("rustle chat: the conversation starts again");
                continue;
            }
            ("/system", text) => {
                system = (!text.is_empty()).then(|| text.to_owned());
                history.clear();
                eprintln!("rustle chat: a new system prompt; the conversation starts again");
                continue;
            }
            (command, _) if command.starts_with('/') => {
                eprintln!("rustle chat: {command} is no command. {HELP}");
                continue;
            }
            _ => {}
        }
        history.push(Message {
            role: "user".into(),
            content: line.to_owned(),
        });
        let mut messages: Vec<Message> = system
            .iter()
            .map(|s| Message {
                role: "system".into(),
                content: s.clone(),
            })
            .collect();
        messages.extend(history.iter().cloned());
        let rendered =
            chat::render_within(&tokenizer, &messages, chat::max_bytes_for_context(context))
                .and_then(|text| tokenizer.encode(&text, false));
        let prompt = match rendered {
            Ok(p) if p.len() < context => p,
            Ok(p) => {
                history.pop();
                eprintln!(
                    "rustle chat: the conversation is now {} tokens, more than the context of {context}; /reset to start again",
                    p.len()
                );
                continue;
            }
            Err(e) => {
                history.pop();
                eprintln!("rustle chat: {e}");
                continue;
            }
        };
        // Each reply its own seed (a fixed --seed still repeats the whole conversation):
        // one seed for every turn would start each reply's draws alike.
        let params = RequestParams {
            sampling: SamplingParams {
                seed: sampling.seed.wrapping_add(history.len() as u64),
                ..sampling.clone()
            },
            max_tokens: args.max_tokens,
            ..Default::default()
        };
        stop.store(false, Ordering::SeqCst);
        let mut sink = |piece: &str| {
            !stop.load(Ordering::SeqCst)
                && stdout
                    .write_all(piece.as_bytes())
                    .and_then(|_| stdout.flush())
                    .is_ok()
        };
        let (reply, stats) = generate(&mut engine, &tokenizer, &prompt, params, &mut sink)?;
        let _ = writeln!(stdout);
        let text = tokenizer.decode(&reply)?;
        history.push(Message {
            role: "assistant".into(),
            content: text,
        });
        let used = prompt.len() + reply.len();
        let why = match stats.stop {
            StopReason::Eos => "",
            StopReason::Length => ", cut at --max-tokens",
            StopReason::Context => ", the context is full: /reset to go on",
            StopReason::Sink => ", stopped",
        };
        eprintln!(
            "[{used} of {context} tokens, {:.1} tok/s{why}]",
            stats.decode_tok_per_s()
        );
    }
    Ok(())
}
