//! The `rustle` command: its flags parsed (`cli::args`), then one of its jobs: generate text
//! from a prompt (`cli::generate`), measure (`cli::measure`: `bench`, `profile`), score a
//! text (`cli::perplexity`), hold a conversation (`cli::chat`) or serve (`rustle::server`).

mod cli;

use std::process::ExitCode;

use clap::Parser;

use cli::args::{Cli, Command};
use cli::{chat, generate, measure, perplexity};

fn main() -> ExitCode {
    // No backtraces for users: a bug still ends in one line that says so.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("rustle: internal error: {info} (this is a bug; please report it)");
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => usage_error(e),
    };
    // Every environment knob is checked before any command starts: a bad value is one line,
    // GPU or not, rather than a default taken in silence (`rustle::knobs`).
    if let Err(e) = rustle::knobs::Knobs::from_env() {
        eprintln!("rustle: error: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Some(Command::Bench(b)) => measure::bench(&b),
        Some(Command::Profile(p)) => measure::profile(&p),
        Some(Command::Serve(s)) => rustle::server::run(s),
        Some(Command::Perplexity(p)) => perplexity::run(&p),
        Some(Command::Chat(c)) => chat::run(&c),
        None => generate::run(cli.generate),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rustle: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// clap's errors as rustle's: one `rustle: error:` line (clap's message with its lines
/// joined), then clap's usage hint. `--help` and `--version` print as clap prints them.
fn usage_error(e: clap::Error) -> ! {
    if !e.use_stderr() {
        e.exit();
    }
    let text = e.render().to_string();
    let (message, hint) = text.split_once("\n\n").unwrap_or((&text, ""));
    let message: Vec<&str> = message.lines().map(str::trim).collect();
    let message = message.join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    eprintln!("rustle: error: {message}");
    if !hint.trim().is_empty() {
        eprintln!("{}", hint.trim_end());
    }
    std::process::exit(e.exit_code());
}
