//! What `/metrics` shows, in Prometheus's text format: the engine's state (published by the
//! engine thread after every step), token counters, and latency histograms.

use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use crate::serve::{EngineStats, FinishReason};

/// Counts of observations at or under each bound, Prometheus style (cumulative on render).
#[derive(Clone, Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// `[bounds.len() + 1]` per bucket (the last: above every bound).
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    pub fn observe(&mut self, secs: f64) {
        let i = self.bounds.partition_point(|&b| b < secs);
        self.counts[i] += 1;
        self.sum += secs;
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut acc = 0;
        for (b, n) in self.bounds.iter().zip(&self.counts) {
            acc += n;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {acc}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count());
        let _ = writeln!(
            out,
            "{name}_sum {}\n{name}_count {}",
            self.sum,
            self.count()
        );
    }
}

const TTFT_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];
const ITL_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
    10.0,
];

#[derive(Debug)]
struct Inner {
    stats: EngineStats,
    /// Request arrival to its first token.
    ttft: Histogram,
    /// Between two tokens of one request.
    itl: Histogram,
    /// Requests (choices) ended, by `FinishReason`: stop, length, abort.
    finished: [u64; 3],
    /// Requests refused with 429 (`--max-queued`).
    rejected: u64,
    timeouts: u64,
}

/// Shared by the engine thread (which writes) and the HTTP handlers (which read).
#[derive(Debug)]
pub struct Metrics {
    inner: Mutex<Inner>,
    model: String,
}

impl Metrics {
    pub fn new(model: &str) -> Metrics {
        Metrics {
            inner: Mutex::new(Inner {
                stats: EngineStats::default(),
                ttft: Histogram::new(TTFT_BOUNDS),
                itl: Histogram::new(ITL_BOUNDS),
                finished: [0; 3],
                rejected: 0,
                timeouts: 0,
            }),
            model: model.replace(['"', '\\', '\n'], "_"),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere while holding it leaves numbers, not broken invariants.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn publish(&self, stats: EngineStats) {
        self.lock().stats = stats;
    }

    pub fn stats(&self) -> EngineStats {
        self.lock().stats.clone()
    }

    pub fn first_token(&self, after: Duration) {
        self.lock().ttft.observe(after.as_secs_f64());
    }

    pub fn next_token(&self, after: Duration) {
        self.lock().itl.observe(after.as_secs_f64());
    }

    pub fn finished(&self, why: FinishReason) {
        let i = match why {
            FinishReason::Stop => 0,
            FinishReason::Length => 1,
            FinishReason::Abort => 2,
        };
        self.lock().finished[i] += 1;
    }

    pub fn rejected(&self) {
        self.lock().rejected += 1;
    }

    pub fn timed_out(&self) {
        self.lock().timeouts += 1;
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let m = self.lock();
        let s = &m.stats;
        let label = format!("model_name=\"{}\"", self.model);
        let mut out = String::new();
        let mut one = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{label}}} {value}"
            );
        };
        one(
            "rustle_requests_running",
            "gauge",
            "Requests admitted and holding KV blocks.",
            s.running.to_string(),
        );
        one(
            "rustle_requests_waiting",
            "gauge",
            "Requests queued for admission (new or preempted).",
            s.waiting.to_string(),
        );
        one(
            "rustle_kv_blocks_used",
            "gauge",
            "KV-cache blocks held by requests.",
            s.blocks_used.to_string(),
        );
        one(
            "rustle_kv_blocks_free",
            "gauge",
            "KV-cache blocks not held by any request (cached ones included).",
            (s.blocks_free + s.blocks_cached).to_string(),
        );
        one(
            "rustle_kv_blocks_cached",
            "gauge",
            "Free KV-cache blocks whose content the prefix cache keeps.",
            s.blocks_cached.to_string(),
        );
        one(
            "rustle_prefix_cache_hit_rate",
            "gauge",
            "Share of looked-up prompt tokens found in the prefix cache.",
            s.prefix_hit_rate.to_string(),
        );
        one(
            "rustle_prefix_cache_hit_tokens_total",
            "counter",
            "Prompt tokens taken from the prefix cache.",
            s.prefix_hit_tokens.to_string(),
        );
        one(
            "rustle_preemptions_total",
            "counter",
            "Requests preempted (recomputed later) for lack of KV blocks.",
            s.preemptions.to_string(),
        );
        one(
            "rustle_prompt_tokens_total",
            "counter",
            "Prompt tokens of the requests accepted.",
            s.prompt_tokens.to_string(),
        );
        one(
            "rustle_generation_tokens_total",
            "counter",
            "Tokens generated.",
            s.generated_tokens.to_string(),
        );
        one(
            "rustle_engine_steps_total",
            "counter",
            "Forward passes of the engine.",
            s.steps.to_string(),
        );
        one(
            "rustle_requests_rejected_total",
            "counter",
            "Requests refused because the queue was full (429).",
            m.rejected.to_string(),
        );
        one(
            "rustle_requests_timed_out_total",
            "counter",
            "Requests ended by --request-timeout.",
            m.timeouts.to_string(),
        );
        let name = "rustle_requests_finished_total";
        let _ = writeln!(
            out,
            "# HELP {name} Requests (choices) ended, by finish reason (abort: ended by the server: client gone, stop string matched, time limit).\n# TYPE {name} counter"
        );
        for (why, n) in ["stop", "length", "abort"].iter().zip(m.finished) {
            let _ = writeln!(out, "{name}{{{label},finish_reason=\"{why}\"}} {n}");
        }
        m.ttft.render(
            &mut out,
            "rustle_time_to_first_token_seconds",
            "From a request's arrival to its first token.",
        );
        m.itl.render(
            &mut out,
            "rustle_inter_token_latency_seconds",
            "Between two tokens of one request.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_the_text_parses_line_by_line() {
        let m = Metrics::new("tiny");
        m.first_token(Duration::from_millis(30));
        m.first_token(Duration::from_secs(100));
        m.next_token(Duration::from_millis(3));
        m.finished(FinishReason::Length);
        m.publish(EngineStats {
            running: 2,
            blocks_free: 5,
            blocks_cached: 3,
            ..Default::default()
        });
        let text = m.render();
        for want in [
            "rustle_requests_running{model_name=\"tiny\"} 2",
            "rustle_kv_blocks_free{model_name=\"tiny\"} 8",
            "rustle_time_to_first_token_seconds_bucket{le=\"0.02\"} 0",
            "rustle_time_to_first_token_seconds_bucket{le=\"0.04\"} 1",
            "rustle_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2",
            "rustle_time_to_first_token_seconds_count 2",
            "rustle_inter_token_latency_seconds_count 1",
            "rustle_requests_finished_total{model_name=\"tiny\",finish_reason=\"length\"} 1",
        ] {
            assert!(text.contains(want), "{want} missing from:\n{text}");
        }
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
