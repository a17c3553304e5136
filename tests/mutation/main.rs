//! The loaders against mutated inputs. For each format (GGUF; safetensors shards with their
//! index; config.json; tokenizer.json; chat templates) a small valid input built in
//! `common::tiny` is mutated, seeded and structure-aware (a count, length, type, dimension
//! or offset set to a value it could plausibly hold or one that overflows; metadata and JSON
//! fields given other values and types; entries removed or duplicated; truncation; flipped
//! bytes), and loaded in-process. Every case must end in `Ok` or an error: never a panic,
//! never an allocation over `MAX_ALLOCATION` (a counting allocator watches the largest
//! request and the peak), never longer than `MAX_CASE_TIME`. A model that loads is also run
//! (a prompt and one decode step), and a tokenizer that loads encodes and decodes, so shapes
//! that only go wrong at run time are caught too.
//!
//! A failure names its format, seed and mutation. `cargo test --release --test mutation gguf`
//! runs one format.

mod chat;
#[path = "../common/mod.rs"]
mod common;
mod counting;
mod folder;
mod gguf;
mod tally;
mod tokenizer;
mod values;

use std::time::Instant;

use common::tiny;
use libtest_mimic::{Arguments, Failed, Trial};
use rustle::{chat as rustle_chat, loader};

use tally::{LAST_PANIC, TOTALS, exercise};

// ---------------------------------------------------------------------------------------

/// One format's cases: runs that many.
type Format = fn(usize) -> Result<(), Failed>;

/// Cases per format: 22,000 in all.
const CASES: [(&str, usize, Format); 5] = [
    ("gguf", 7000, gguf::cases),
    ("safetensors", 4000, folder::safetensors_cases),
    ("config", 4000, folder::config_cases),
    ("tokenizer", 4000, tokenizer::cases),
    ("chat", 3000, chat::cases),
];

fn main() {
    let mut args = Arguments::from_args();
    // One case at a time: the allocation counters are process-wide.
    args.test_threads = Some(1);
    std::panic::set_hook(Box::new(|info| {
        if let Ok(mut last) = LAST_PANIC.lock() {
            *last = info.to_string();
        }
    }));
    let mut trials: Vec<Trial> = CASES
        .iter()
        .map(|&(name, n, run)| Trial::test(format!("mutation_{name}"), move || run(n)))
        .collect();
    trials.push(Trial::test(
        "base_models_load_and_run",
        base_models_load_and_run,
    ));
    let started = Instant::now();
    let conclusion = libtest_mimic::run(&args, trials);
    let totals = TOTALS.lock().unwrap();
    if totals.len() > 1 {
        let (cases, refused, loaded) = totals
            .iter()
            .fold((0, 0, 0), |a, t| (a.0 + t.0, a.1 + t.1, a.2 + t.2));
        eprintln!(
            "mutation: {cases} cases in all, {refused} refused, {loaded} loaded, in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    drop(totals);
    conclusion.exit();
}

/// The unmutated inputs load and run: otherwise every case would only test refusals.
fn base_models_load_and_run() -> Result<(), Failed> {
    let dir = tiny::scratch_dir("mutation-base");
    for (name, g) in [("bpe", tiny::gguf_bpe()), ("spm", tiny::gguf_spm())] {
        let path = dir.join(format!("{name}.gguf"));
        std::fs::write(&path, g.bytes()).unwrap();
        let m = loader::load(&path).map_err(|e| format!("{name}.gguf: {e}"))?;
        exercise(m).map_err(|e| format!("{name}.gguf: {e}"))?;
    }
    let folder = dir.join("hf");
    std::fs::create_dir_all(&folder).unwrap();
    tiny::write_hf_folder(&folder);
    let m = loader::load(&folder).map_err(|e| format!("folder: {e}"))?;
    assert!(m.config.qkv_bias && !m.config.tie_embeddings);
    let text = rustle_chat::render(&m.tokenizer, &[]).map_err(|e| e.to_string())?;
    assert_eq!(text, "<|assistant|>");
    exercise(m).map_err(|e| format!("folder: {e}"))?;
    Ok(())
}
