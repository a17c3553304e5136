//! `rustle bench --serve`: offline serving throughput. N requests go through the serving
//! engine (continuous batching, chunked prefill under a token budget, the prefix cache),
//! all at once or arriving at a Poisson rate, with prompt and output lengths fixed or drawn
//! from a fixed seed; the report gives output and total tok/s, time to first token and time
//! per output token (p50, p90, p99), KV-cache use, preemptions, the prefix hit rate, and the
//! steps against the roofline: each step's bytes (the weights once, plus every sequence's KV)
//! and FLOPs over the bandwidth and matrix throughput the same run measured.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::ceilings::{gpu_bandwidth, gpu_matrix_flops};
use super::setup::{fast_cpu_runner, gpu_runner};
use super::timing::{KernelRow, by_kernel};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::gpu::step_clock::Span;
use crate::runner::{Runner, RunnerOptions};
use crate::sampler::SamplingParams;
use crate::serve::engine::{Engine, EngineOptions, RequestParams};

/// How the requests' lengths are chosen.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// Every request `prompt` tokens in, `output` out (llama.cpp's `batched-bench` shape).
    Fixed { prompt: usize, output: usize },
    /// A ShareGPT-like mix: log-normal prompts of 4 to 1,024 tokens (median 128) and outputs
    /// of 4 to 512 (median 96).
    ShareGpt,
    /// Every request shares one `prefix`-token system prompt, then asks its own
    /// `question`-token question, and wants `output` tokens.
    SharedPrefix {
        prefix: usize,
        question: usize,
        output: usize,
    },
}

pub struct ServeBenchArgs {
    pub shape: String,
    /// How the GPU holds the matrices (`--weights`).
    pub weights: crate::runner::WeightsChoice,

    pub model: Option<std::path::PathBuf>,
    pub device_cpu: bool,
    pub requests: usize,
    pub workload: Workload,
    /// Requests per second, Poisson arrivals; `None`: all at the start.
    pub rate: Option<f64>,
    pub seed: u64,
    pub token_budget: usize,
    pub max_seqs: usize,
    pub prefix_cache: bool,
    pub kv_blocks: Option<usize>,
    /// Time every launch (graphs off) and report the kernels (`--kernels`).
    pub kernels: bool,
    /// How the GPU's KV cache holds keys and values (`--kv-dtype`).
    pub kv_dtype: crate::kv::dtype::KvDtype,
}

/// Percentiles of a latency, in milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Percentiles {
    fn of(mut ms: Vec<f64>) -> Percentiles {
        if ms.is_empty() {
            return Percentiles::default();
        }
        ms.sort_by(f64::total_cmp);
        let at = |p: f64| ms[((ms.len() - 1) as f64 * p).round() as usize];
        Percentiles {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
        }
    }
}

/// The same run against the machine's ceilings.
#[derive(Clone, Debug, Serialize)]
pub struct Roofline {
    /// Bytes per second of a device copy (read + write), measured in this run.
    pub bandwidth: f64,
    /// FLOP per second of the fastest matrix product the run measured.
    pub matrix_flops: f64,
    /// What the steps moved and computed: the weights once per step, every sequence's KV
    /// cache once, the matmuls' 2 x parameters x tokens and attention's 4 x dims x keys.
    pub bytes: f64,
    pub flops: f64,
    /// The steps' time at the ceilings: bytes over bandwidth, FLOPs over throughput, and
    /// per step the larger of the two, summed.
    pub memory_seconds: f64,
    pub compute_seconds: f64,
    pub bound_seconds: f64,
    /// Measured step time over `bound_seconds`.
    pub of_bound: f64,
}

/// The decode-only steps of a run with every sequence in them (the steady state of a
/// `Fixed` workload started all at once): what `llama-batched-bench` calls decode speed.
#[derive(Clone, Debug, Serialize)]
pub struct DecodeSteady {
    pub sequences: usize,
    pub steps: usize,
    pub ms_per_step: f64,
    pub tok_per_s: f64,
    /// Weights once plus every sequence's KV per step, over the measured bandwidth (GPU).
    pub ceiling_tok_per_s: Option<f64>,
}

/// Where the run's steps spent their time: on the GPU (each pass's first work to its last,
/// on the GPU's clock, `gpu::step_clock`) or between passes, with the GPU idle while the
/// host scheduled, built the next batch and handled the outputs (the gaps SGLang's overlap
/// scheduler hides). Gaps after a wait for arrivals are left out.
#[derive(Clone, Debug, Serialize)]
pub struct StepGaps {
    pub gpu_seconds: f64,
    pub gap_seconds: f64,
    /// One per pair of consecutive steps.
    pub gap_ms: Percentiles,
    /// `gpu_seconds` over the roofline's `bound_seconds`: the kernels' own distance from the
    /// ceilings, with the host's share taken out.
    pub gpu_of_bound: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ServeReport {
    pub model: String,
    pub device: String,
    pub workload: String,
    pub requests: usize,
    pub seconds: f64,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    pub output_tok_per_s: f64,
    pub total_tok_per_s: f64,
    pub ttft_ms: Percentiles,
    pub tpot_ms: Percentiles,
    pub steps: u64,
    pub peak_kv_blocks: usize,
    pub kv_blocks: usize,
    /// What the GPU's cache holds (`--kv-dtype`): "bf16" or "fp8"; the CPU's, "own".
    pub kv_dtype: String,
    pub preemptions: u64,
    pub prefix_hit_rate: f64,
    pub decode_steady: Option<DecodeSteady>,
    pub roofline: Option<Roofline>,
    /// GPU runs only.
    pub gaps: Option<StepGaps>,
    /// With `--kernels`: every launch of the run summed by kernel, the most time first.
    pub kernels: Vec<KernelRow>,
}

/// One request of the workload: its prompt, how many tokens it wants, when it arrives.
struct Spec {
    prompt: Vec<u32>,
    output: usize,
    arrival: Duration,
}

fn workload_name(w: &Workload) -> String {
    match w {
        Workload::Fixed { prompt, output } => format!("fixed: {prompt} in, {output} out"),
        Workload::ShareGpt => {
            "sharegpt-like: prompts 4-1024 (log-normal), outputs 4-512 (log-normal)".into()
        }
        Workload::SharedPrefix {
            prefix,
            question,
            output,
        } => format!(
            "shared prefix: {prefix}-token system prompt + {question}-token question, {output} out"
        ),
    }
}

/// A draw from a log-normal with this median and log-spread, clamped to `lo..=hi`.
fn log_normal(rng: &mut StdRng, median: f64, sigma: f64, lo: usize, hi: usize) -> usize {
    // Box-Muller.
    let (u1, u2): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random());
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    ((median * (sigma * z).exp()).round() as usize).clamp(lo, hi)
}

/// The workload's requests. Drawn lengths are clamped to the context: a prompt to half of
/// it, its output to the rest.
fn specs(a: &ServeBenchArgs, vocab: usize, context: usize) -> Vec<Spec> {
    let mut rng = StdRng::seed_from_u64(a.seed);
    let tokens = |rng: &mut StdRng, n: usize| -> Vec<u32> {
        (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
    };
    let shared = match a.workload {
        Workload::SharedPrefix { prefix, .. } => tokens(&mut rng, prefix),
        _ => vec![],
    };
    let mut at = Duration::ZERO;
    (0..a.requests)
        .map(|_| {
            let (prompt, output) = match a.workload {
                Workload::Fixed { prompt, output } => (tokens(&mut rng, prompt), output),
                Workload::ShareGpt => {
                    let p = log_normal(&mut rng, 128.0, 1.0, 4, 1024).min(context / 2);
                    let o = log_normal(&mut rng, 96.0, 0.9, 4, 512).min(context - p);
                    (tokens(&mut rng, p.max(1)), o.max(1))
                }
                Workload::SharedPrefix {
                    question, output, ..
                } => {
                    let mut p = shared.clone();
                    p.extend(tokens(&mut rng, question));
                    (p, output)
                }
            };
            if let Some(rate) = a.rate {
                // Exponential gaps: a Poisson process of `rate` requests per second.
                let gap = -(1.0 - rng.random::<f64>()).ln() / rate;
                at += Duration::from_secs_f64(gap);
            }
            Spec {
                prompt,
                output,
                arrival: at,
            }
        })
        .collect()
}

fn progress(msg: &str) {
    eprintln!("rustle bench --serve: {msg}");
}

/// What one step ran, for the roofline: its tokens, and the KV positions its sequences hold.
struct StepShape {
    seconds: f64,
    /// Its pass on the GPU's clock (GPU runs), and whether the loop waited for arrivals
    /// before it.
    span: Option<Span>,
    after_wait: bool,
    tokens: usize,
    /// Sum over the step's sequences of their context (positions in the cache).
    kv_positions: usize,
    /// Sum over the step's tokens of the keys each attends.
    attended: usize,
    decode_only: bool,
    sequences: usize,
}

pub fn run(a: &ServeBenchArgs) -> Result<ServeReport> {
    if a.requests == 0 {
        return Err(Error::Usage("--requests must be at least 1".into()));
    }
    let opts = RunnerOptions {
        kv_blocks: a.kv_blocks,
        max_batch_tokens: a.token_budget,
        weights: a.weights.0,
        synthetic: a.weights.1,
        kv_dtype: a.kv_dtype,
    };
    let (runner, model, ceilings) = if a.device_cpu {
        let (r, name) = fast_cpu_runner(a.model.as_deref(), &opts)?;
        (r, name, None)
    } else {
        let gpu = Gpu::new()?;
        // First, while the memory the KV pool will take is free for the 2 GiB copies.
        let ceilings = Ceilings::measure(&gpu)?;
        let (r, name) = gpu_runner(&gpu, &a.shape, a.model.as_deref(), &opts)?;
        (r, name, Some(ceilings))
    };
    let device = runner.device_name();
    let config = runner.config.clone();
    let weight_bytes = runner.weight_bytes_per_step() as f64;
    let kv_bytes_per_token = runner.kv_bytes_per_token() as f64;
    let mut engine = Engine::new(
        runner,
        EngineOptions {
            token_budget: a.token_budget,
            max_seqs: a.max_seqs,
            prefix_cache: a.prefix_cache,
            eos: vec![],
            ..Default::default()
        },
    )?;
    let specs = specs(a, config.vocab_size, engine.limits().max_context);
    let kv_blocks = engine.limits().n_blocks;
    progress(&format!(
        "{} requests ({}), {}, token budget {}, up to {} sequences a step, {kv_blocks} KV blocks",
        a.requests,
        workload_name(&a.workload),
        match a.rate {
            Some(r) => format!("Poisson arrivals at {r} per second"),
            None => "all at once".into(),
        },
        a.token_budget,
        engine.limits().max_batch_seqs.min(a.max_seqs),
    ));
    // One request through the engine first, so that module loading and graph capture stay
    // out of the figures.
    warm_up(&mut engine, config.vocab_size)?;
    engine.model_mut().clock_steps(true)?;
    if a.kernels {
        // Events cannot be recorded inside a replayed graph.
        engine.model_mut().set_graphs(false);
        engine.model_mut().profile_start();
    }
    let base = engine.stats();

    let n = specs.len();
    let mut first_token: Vec<Option<Duration>> = vec![None; n];
    let mut last_token: Vec<Duration> = vec![Duration::ZERO; n];
    let mut generated = vec![0usize; n];
    let mut ids = std::collections::HashMap::new();
    let mut next = 0;
    let mut peak_blocks = 0;
    let mut steps = vec![];
    let start = Instant::now();
    let mut last_report = Instant::now();
    let mut waited = false;
    while next < n || engine.has_work() {
        let now = start.elapsed();
        while next < n && specs[next].arrival <= now {
            let s = &specs[next];
            let params = RequestParams {
                sampling: SamplingParams::default(),
                max_tokens: s.output,
                stop_token_ids: vec![],
                ignore_eos: true,
                ..Default::default()
            };
            let id = engine.add_request(s.prompt.clone(), params)?;
            ids.insert(id, next);
            next += 1;
        }
        if !engine.has_work() {
            // Nothing to run until the next arrival.
            std::thread::sleep(specs[next].arrival.saturating_sub(now));
            waited = true;
            continue;
        }
        let t = Instant::now();
        let outputs = engine.step()?;
        let seconds = t.elapsed().as_secs_f64();
        let done_at = start.elapsed();
        let mut shape = step_shape(engine.last_batch(), seconds);
        shape.span = engine.model().last_step_span();
        shape.after_wait = std::mem::take(&mut waited);
        steps.push(shape);
        for o in outputs {
            let i = ids[&o.id];
            if o.token.is_some() {
                generated[i] += 1;
                first_token[i].get_or_insert(done_at);
                last_token[i] = done_at;
            }
        }
        peak_blocks = peak_blocks.max(engine.stats().blocks_used);
        if last_report.elapsed() > Duration::from_secs(5) {
            last_report = Instant::now();
            let s = engine.stats();
            progress(&format!(
                "{} of {n} requests in, {} running, {} waiting, {} steps",
                next, s.running, s.waiting, s.steps
            ));
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let stats = engine.stats();
    let kernels = match a.kernels {
        true => by_kernel(engine.model_mut().profile_stop()?),
        false => vec![],
    };

    let ttft: Vec<f64> = (0..n)
        .filter_map(|i| first_token[i].map(|f| (f - specs[i].arrival).as_secs_f64() * 1e3))
        .collect();
    let tpot: Vec<f64> = (0..n)
        .filter(|&i| generated[i] > 1)
        .map(|i| {
            let span = last_token[i] - first_token[i].unwrap_or_default();
            span.as_secs_f64() * 1e3 / (generated[i] - 1) as f64
        })
        .collect();
    let prompt_tokens: u64 = specs.iter().map(|s| s.prompt.len() as u64).sum();
    let output_tokens: u64 = generated.iter().map(|&g| g as u64).sum();

    let roofline =
        ceilings.map(|at| roofline(at, &config, &steps, weight_bytes, kv_bytes_per_token));
    let bandwidth = roofline.as_ref().map(|r| r.bandwidth);
    let decode_steady = decode_steady(&steps, weight_bytes, kv_bytes_per_token, bandwidth);
    let gaps = step_gaps(&steps, roofline.as_ref());
    Ok(ServeReport {
        model,
        device,
        workload: workload_name(&a.workload),
        requests: n,
        seconds,
        prompt_tokens,
        output_tokens,
        output_tok_per_s: output_tokens as f64 / seconds,
        total_tok_per_s: (prompt_tokens + output_tokens) as f64 / seconds,
        ttft_ms: Percentiles::of(ttft),
        tpot_ms: Percentiles::of(tpot),
        steps: stats.steps - base.steps,
        peak_kv_blocks: peak_blocks,
        kv_blocks,
        kv_dtype: match a.device_cpu {
            true => "own".into(),
            false => a.kv_dtype.name().into(),
        },
        preemptions: stats.preemptions - base.preemptions,
        prefix_hit_rate: {
            let looked = stats.prompt_tokens - base.prompt_tokens;
            let hit = stats.prefix_hit_tokens - base.prefix_hit_tokens;
            if looked == 0 {
                0.0
            } else {
                hit as f64 / looked as f64
            }
        },
        decode_steady,
        roofline,
        gaps,
        kernels,
    })
}

/// One short request, run to its end.
fn warm_up(engine: &mut Engine<Runner>, vocab: usize) -> Result<()> {
    let prompt = (0..32u32).map(|i| (i * 7919 + 13) % vocab as u32).collect();
    let params = RequestParams {
        max_tokens: 4,
        ignore_eos: true,
        ..RequestParams::default()
    };
    engine.add_request(prompt, params)?;
    while engine.has_work() {
        engine.step()?;
    }
    Ok(())
}

fn step_shape(b: &crate::batch::Batch, seconds: f64) -> StepShape {
    let n = b.tokens.len();
    let n_seqs = b
        .token_seq
        .iter()
        .map(|&s| s as usize + 1)
        .max()
        .unwrap_or(0);
    // Each sequence's context: its last position in this step, plus one.
    let mut ctx = vec![0usize; n_seqs];
    for (&s, &p) in b.token_seq.iter().zip(&b.positions) {
        ctx[s as usize] = ctx[s as usize].max(p as usize + 1);
    }
    StepShape {
        seconds,
        span: None,
        after_wait: false,
        tokens: n,
        kv_positions: ctx.iter().sum(),
        attended: b.positions.iter().map(|&p| p as usize + 1).sum(),
        decode_only: n == n_seqs && b.logit_rows.len() == n,
        sequences: n_seqs,
    }
}

/// The run's GPU time and the gaps between its passes, where every step has a span.
fn step_gaps(steps: &[StepShape], roofline: Option<&Roofline>) -> Option<StepGaps> {
    let spans: Vec<Span> = steps.iter().map(|s| s.span).collect::<Option<_>>()?;
    let gpu_ms: f64 = spans.iter().map(|s| s.end_ms - s.start_ms).sum();
    let gaps: Vec<f64> = spans
        .windows(2)
        .zip(&steps[1..])
        .filter(|(_, s)| !s.after_wait)
        .map(|(w, _)| w[1].start_ms - w[0].end_ms)
        .collect();
    Some(StepGaps {
        gpu_seconds: gpu_ms / 1e3,
        gap_seconds: gaps.iter().sum::<f64>() / 1e3,
        gap_ms: Percentiles::of(gaps),
        gpu_of_bound: roofline.map(|r| gpu_ms / 1e3 / r.bound_seconds.max(1e-12)),
    })
}

/// The decode-only steps that hold the most sequences of the run, if there are a few, with
/// their ceiling at `bandwidth` (bytes per second) when it was measured.
fn decode_steady(
    steps: &[StepShape],
    weight_bytes: f64,
    kv_bytes_per_token: f64,
    bandwidth: Option<f64>,
) -> Option<DecodeSteady> {
    let most = steps
        .iter()
        .filter(|s| s.decode_only)
        .map(|s| s.sequences)
        .max()?;
    let full: Vec<&StepShape> = steps
        .iter()
        .filter(|s| s.decode_only && s.sequences == most)
        .collect();
    if full.len() < 3 {
        return None;
    }
    let seconds: f64 = full.iter().map(|s| s.seconds).sum();
    let ms_per_step = seconds * 1e3 / full.len() as f64;
    let kv = full.iter().map(|s| s.kv_positions as f64).sum::<f64>() / full.len() as f64;
    let bytes_per_step = weight_bytes + kv * kv_bytes_per_token;
    Some(DecodeSteady {
        sequences: most,
        steps: full.len(),
        ms_per_step,
        tok_per_s: most as f64 / (ms_per_step * 1e-3),
        ceiling_tok_per_s: bandwidth.map(|bw| bw / bytes_per_step * most as f64),
    })
}

/// The GPU's ceilings, measured in the run: a device copy's bytes per second (read + write)
/// and the fastest matrix product's FLOP per second.
#[derive(Clone, Copy, Debug)]
struct Ceilings {
    bandwidth: f64,
    matrix_flops: f64,
}

impl Ceilings {
    fn measure(gpu: &Gpu) -> Result<Ceilings> {
        progress("measuring the ceilings: memory bandwidth (2 GiB copies), matrix throughput");
        Ok(Ceilings {
            bandwidth: gpu_bandwidth(gpu)?.copy_bytes_per_s,
            matrix_flops: gpu_matrix_flops(gpu, 8192)?,
        })
    }
}

fn roofline(
    at: Ceilings,
    c: &crate::config::Config,
    steps: &[StepShape],
    weight_bytes: f64,
    kv_bytes_per_token: f64,
) -> Roofline {
    let Ceilings {
        bandwidth,
        matrix_flops,
    } = at;
    // Parameters a token multiplies: every matrix but the embedding (the head included).
    let params = (c.n_layers * (c.dim * (c.q_dim() + 2 * c.kv_dim()) + c.q_dim() * c.dim)
        + c.n_layers * 3 * c.dim * c.ffn_dim
        + c.vocab_size * c.dim) as f64;
    let attn_flops_per_key = 4.0 * (c.n_heads * c.head_dim) as f64 * c.n_layers as f64;
    let (mut bytes, mut flops, mut mem_s, mut comp_s, mut bound_s, mut measured) =
        (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for s in steps {
        let b = weight_bytes + s.kv_positions as f64 * kv_bytes_per_token;
        let f = 2.0 * params * s.tokens as f64 + attn_flops_per_key * s.attended as f64;
        bytes += b;
        flops += f;
        mem_s += b / bandwidth;
        comp_s += f / matrix_flops;
        bound_s += (b / bandwidth).max(f / matrix_flops);
        measured += s.seconds;
    }
    Roofline {
        bandwidth,
        matrix_flops,
        bytes,
        flops,
        memory_seconds: mem_s,
        compute_seconds: comp_s,
        bound_seconds: bound_s,
        of_bound: measured / bound_s.max(1e-12),
    }
}

pub fn print(r: &ServeReport) {
    println!("model     {} on {}", r.model, r.device);
    println!("workload  {} requests, {}", r.requests, r.workload);
    println!(
        "finished  in {:.2} s, {} steps: {} prompt + {} generated tokens",
        r.seconds, r.steps, r.prompt_tokens, r.output_tokens
    );
    println!(
        "throughput  output {:.1} tok/s, total {:.1} tok/s",
        r.output_tok_per_s, r.total_tok_per_s
    );
    let p = |x: &Percentiles| format!("p50 {:.1}  p90 {:.1}  p99 {:.1} ms", x.p50, x.p90, x.p99);
    println!("time to first token     {}", p(&r.ttft_ms));
    println!("time per output token   {}", p(&r.tpot_ms));
    println!(
        "KV cache  ({}) peak {} of {} blocks ({:.0}%); {} preemptions; prompt tokens found in the prefix cache {:.1}%",
        r.kv_dtype,
        r.peak_kv_blocks,
        r.kv_blocks,
        100.0 * r.peak_kv_blocks as f64 / r.kv_blocks.max(1) as f64,
        r.preemptions,
        100.0 * r.prefix_hit_rate
    );
    if let Some(d) = &r.decode_steady {
        let ceiling = match d.ceiling_tok_per_s {
            Some(c) => format!(
                " ({:.0}% of the {c:.0} tok/s the bandwidth allows: the weights once and every sequence's KV per step)",
                100.0 * d.tok_per_s / c
            ),
            None => String::new(),
        };
        println!(
            "decode, all {} sequences: {} steps of {:.2} ms, {:.1} tok/s{ceiling}",
            d.sequences, d.steps, d.ms_per_step, d.tok_per_s
        );
    }
    if let Some(f) = &r.roofline {
        println!(
            "roofline  {:.2} TB/s copy, {:.0} TFLOP/s matrix (measured); the steps moved {:.1} GB and computed {:.1} TFLOP: {:.2} s at the bandwidth, {:.2} s at the matrix rate, {:.2} s at the larger of each step's; measured {:.2}x that",
            f.bandwidth / 1e12,
            f.matrix_flops / 1e12,
            f.bytes / 1e9,
            f.flops / 1e12,
            f.memory_seconds,
            f.compute_seconds,
            f.bound_seconds,
            f.of_bound
        );
    }
    if let Some(g) = &r.gaps {
        let bound = match g.gpu_of_bound {
            Some(b) => format!(" ({b:.2}x the bound above)"),
            None => String::new(),
        };
        println!(
            "host      the GPU ran passes for {:.2} s{bound}; between passes it waited {:.2} s on the host ({:.0}% of the run), p50 {:.2}  p90 {:.2}  p99 {:.2} ms a gap",
            g.gpu_seconds,
            g.gap_seconds,
            100.0 * g.gap_seconds / r.seconds.max(1e-12),
            g.gap_ms.p50,
            g.gap_ms.p90,
            g.gap_ms.p99
        );
    }
    if !r.kernels.is_empty() {
        let total: f64 = r.kernels.iter().map(|k| k.us).sum();
        println!("kernels   every launch of the run timed (graphs off), the most time first:");
        for k in r.kernels.iter().take(16) {
            println!(
                "  {:<28} {:>7} calls {:>9.1} ms {:>5.1}% {:>6.0} GB/s {:>6.1} TFLOP/s",
                k.kernel,
                k.calls,
                k.us / 1e3,
                100.0 * k.us / total.max(1e-12),
                k.bytes as f64 / (k.us * 1e-6) / 1e9,
                k.flops as f64 / (k.us * 1e-6) / 1e12
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(start_ms: f64, end_ms: f64, after_wait: bool) -> StepShape {
        StepShape {
            seconds: 0.0,
            span: Some(Span { start_ms, end_ms }),
            after_wait,
            tokens: 1,
            kv_positions: 1,
            attended: 1,
            decode_only: true,
            sequences: 1,
        }
    }

    /// GPU time sums every span; a gap is one pass's end to the next one's start, except
    /// after a wait for arrivals; the bound divides the GPU time.
    #[test]
    fn gaps_are_between_spans_and_skip_waits() {
        let steps = [
            step(0.0, 10.0, false),
            step(12.0, 20.0, false),
            step(50.0, 55.0, true),
            step(56.0, 60.0, false),
        ];
        let roof = Roofline {
            bandwidth: 1.0,
            matrix_flops: 1.0,
            bytes: 0.0,
            flops: 0.0,
            memory_seconds: 0.0,
            compute_seconds: 0.0,
            bound_seconds: 0.0135,
            of_bound: 1.0,
        };
        let g = step_gaps(&steps, Some(&roof)).unwrap();
        assert!((g.gpu_seconds - 0.027).abs() < 1e-12, "{g:?}");
        assert!((g.gap_seconds - 0.003).abs() < 1e-12, "{g:?}");
        assert_eq!(g.gap_ms.p50, 2.0);
        assert_eq!(g.gap_ms.p99, 2.0);
        assert!((g.gpu_of_bound.unwrap() - 2.0).abs() < 1e-9);
        // A step without a span (the CPU) gives no gaps at all.
        let mut cpu = step(0.0, 1.0, false);
        cpu.span = None;
        assert!(step_gaps(&[step(0.0, 1.0, false), cpu], None).is_none());
    }
}
