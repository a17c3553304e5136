//! Running cases: each under `catch_unwind`, the allocation counters and the clock, counted
//! as refused or loaded; and what a loaded model is put through.

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use libtest_mimic::Failed;
use rustle::loader::{self, LoadedModel};
use rustle::runner::{Device, Runner, RunnerOptions};

use crate::counting::{CASE, LARGEST, LIVE, MAX_ALLOCATION, PEAK};

pub const MAX_CASE_TIME: Duration = Duration::from_secs(1);

/// The last panic's message (the hook runs before the unwind reaches `catch_unwind`).
pub(crate) static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

#[derive(Default)]
pub(crate) struct Tally {
    cases: usize,
    refused: usize,
    loaded: usize,
    /// Loaded, then ran (forward pass, or encode and decode) without an error.
    ran: usize,
    slowest: (Duration, String),
    largest: usize,
    failures: Vec<String>,
    /// One refusal message per distinct start, to show what the errors look like.
    sample_errors: Vec<String>,
}

pub(crate) enum Outcome {
    Refused(String),
    /// Loaded; `true` when the run after it went through as well.
    Loaded(bool),
}

impl Tally {
    /// Runs one case under `catch_unwind`, the allocation counters and the clock.
    pub(crate) fn run(&mut self, name: String, case: impl FnOnce() -> Outcome) {
        *CASE.lock().unwrap() = name.clone();
        let base = LIVE.load(Relaxed);
        PEAK.store(base, Relaxed);
        LARGEST.store(0, Relaxed);
        let start = Instant::now();
        let result = std::panic::catch_unwind(AssertUnwindSafe(case));
        let took = start.elapsed();
        self.cases += 1;
        match result {
            Err(_) => {
                let msg = LAST_PANIC.lock().unwrap().clone();
                self.failures.push(format!("{name}: panicked: {msg}"));
            }
            Ok(Outcome::Refused(e)) => {
                self.refused += 1;
                let head: String = e.chars().take(60).collect();
                if self.sample_errors.len() < 400
                    && !self.sample_errors.iter().any(|s| s.starts_with(&head))
                {
                    self.sample_errors.push(e);
                }
            }
            Ok(Outcome::Loaded(ran)) => {
                self.loaded += 1;
                self.ran += ran as usize;
            }
        }
        let largest = LARGEST.load(Relaxed);
        let peak = PEAK.load(Relaxed).saturating_sub(base);
        self.largest = self.largest.max(largest);
        if largest > MAX_ALLOCATION {
            self.failures
                .push(format!("{name}: asked for {largest} bytes at once"));
        }
        if peak > MAX_ALLOCATION {
            self.failures
                .push(format!("{name}: held {peak} bytes at its peak"));
        }
        if took > MAX_CASE_TIME {
            self.failures.push(format!("{name}: took {took:?}"));
        }
        if took > self.slowest.0 {
            self.slowest = (took, name);
        }
    }

    pub(crate) fn finish(self, format: &str, started: Instant) -> Result<(), Failed> {
        let line = format!(
            "mutation {format}: {} cases, {} refused, {} loaded ({} also ran), in {:.1} s; slowest {:.0} ms ({}), largest allocation {:.1} MiB",
            self.cases,
            self.refused,
            self.loaded,
            self.ran,
            started.elapsed().as_secs_f64(),
            self.slowest.0.as_secs_f64() * 1e3,
            self.slowest.1,
            self.largest as f64 / (1 << 20) as f64
        );
        eprintln!("{line}");
        if std::env::var_os("RUSTLE_MUTATION_ERRORS").is_some() {
            for e in &self.sample_errors {
                eprintln!("  refused: {e}");
            }
        }
        TOTALS
            .lock()
            .unwrap()
            .push((self.cases, self.refused, self.loaded));
        if self.failures.is_empty() {
            return Ok(());
        }
        let shown: Vec<&str> = self.failures.iter().take(20).map(String::as_str).collect();
        Err(format!(
            "{} of {} cases failed:\n{}",
            self.failures.len(),
            self.cases,
            shown.join("\n")
        )
        .into())
    }
}

pub(crate) static TOTALS: Mutex<Vec<(usize, usize, usize)>> = Mutex::new(Vec::new());

/// A loaded model, run: a short prompt through the forward pass and one decode step, with
/// a KV pool of two blocks whatever the model's context says.
pub(crate) fn exercise(m: LoadedModel) -> rustle::Result<()> {
    let context = m.config.max_seq_len;
    let mut prompt = m
        .tokenizer
        .encode_prompt("the hello 12<|end|>", false, context)?;
    m.tokenizer.decode(&prompt)?;
    prompt.push(m.config.vocab_size as u32 - 1);
    prompt.truncate(context.saturating_sub(1).clamp(1, 8));
    let opts = RunnerOptions {
        kv_blocks: Some(2),
        max_batch_tokens: 4,
        ..Default::default()
    };
    let mut runner = Runner::new(m.config, m.weights, &opts, Device::Cpu)?;
    let mut seq = runner.solo();
    let result = (|| {
        let next = runner.extend_greedy(&mut seq, &prompt)?;
        if seq.len() < runner.max_context() {
            runner.extend(&mut seq, &[next])?;
        }
        Ok(())
    })();
    seq.release();
    result
}

pub(crate) fn load_and_run(path: &Path) -> Outcome {
    match loader::load(path) {
        Err(e) => Outcome::Refused(e.to_string()),
        Ok(m) => Outcome::Loaded(exercise(m).is_ok()),
    }
}
