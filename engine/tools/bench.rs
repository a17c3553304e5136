//! `rustle bench`: decode and prefill speed on the GPU, each figure beside the limit the
//! same process measured. Decode reads every weight once per token, so its ceiling is the
//! memory bandwidth over the bytes a token must read (weights, plus the KV cache attention
//! reads); `bench` measures that bandwidth first, two ways: the driver's device-to-device
//! copy (bytes read + bytes written) and a pure-read kernel (16-byte loads, four in flight).

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use super::ceilings::{Bandwidth, gpu_bandwidth};
use super::decode_matmuls::{self, GemvResult};
use super::prefill_matmuls::{self, GemmResult};
use super::setup::{gpu_runner, synthetic_prompt};
use super::timing::{KernelRow, by_kernel};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::kv::block_manager::blocks_for;
use crate::runner::{Runner, RunnerOptions};

pub struct BenchArgs {
    pub shape: String,
    pub model: Option<PathBuf>,
    pub ctx: Vec<usize>,
    pub prompt_len: usize,
    pub steps: usize,
    /// Time every plan of the warpgroup GEMM too.
    pub gemm_plans: bool,
    /// How the GPU holds the matrices (`--weights`).
    pub weights: crate::runner::WeightsChoice,
    /// How the GPU's KV cache holds keys and values (`--kv-dtype`).
    pub kv_dtype: crate::kv::dtype::KvDtype,
}

#[derive(Serialize)]
pub struct DecodeResult {
    /// Positions in the cache at the last timed step.
    pub ctx: usize,
    /// Whether each step replayed a CUDA graph.
    pub graph: bool,
    pub tok_per_s: f64,
    /// Weights plus the KV cache read by attention (at the middle step), per token.
    pub bytes_per_token: f64,
    pub achieved_bytes_per_s: f64,
    pub share_of_copy: f64,
    pub share_of_read: f64,
    /// Copy bandwidth over bytes per token: the ceiling the targets use.
    pub ceiling_tok_per_s: f64,
}

/// Where a decode step's time goes, at one context length.
#[derive(Serialize)]
pub struct StepProfile {
    pub ctx: usize,
    /// The step's wall time, host included.
    pub step_us: f64,
    pub kernels: Vec<KernelRow>,
}

#[derive(Serialize)]
pub struct PrefillResult {
    pub tokens: usize,
    pub seconds: f64,
    pub tok_per_s: f64,
    /// Prompt in, first token's id out.
    pub time_to_first_token_ms: f64,
}

#[derive(Serialize)]
pub struct BenchReport {
    pub gpu: String,
    pub model: String,
    pub weight_bytes_per_token: usize,
    pub bandwidth: Bandwidth,
    pub gemv: Vec<GemvResult>,
    /// The prefill matmuls alone, at the prompt length.
    pub gemm: Vec<GemmResult>,
    pub decode: Vec<DecodeResult>,
    pub step_profiles: Vec<StepProfile>,
    pub prefill: PrefillResult,
}

fn progress(msg: &str) {
    eprintln!("rustle bench: {msg}");
}

pub fn run(args: &BenchArgs) -> Result<BenchReport> {
    let gpu = Gpu::new()?;
    progress(&format!(
        "on {}: measuring memory bandwidth (copy and read, 2 GiB buffers)",
        gpu.description
    ));
    let bandwidth = gpu_bandwidth(&gpu)?;
    let max_ctx = args.ctx.iter().copied().max().unwrap_or(0);
    let kv_blocks = blocks_for(max_ctx + args.steps + 1) + blocks_for(args.prompt_len) + 1;
    let opts = RunnerOptions {
        kv_blocks: Some(kv_blocks),
        max_batch_tokens: args.prompt_len.clamp(1, 1024),
        weights: args.weights.0,
        synthetic: args.weights.1,
        kv_dtype: args.kv_dtype,
    };
    let (mut runner, model) = gpu_runner(&gpu, &args.shape, args.model.as_deref(), &opts)?;
    let c = runner.config.clone();
    if max_ctx > runner.max_context() {
        return Err(Error::Usage(format!(
            "--ctx {max_ctx} is past the model's context of {}",
            runner.max_context()
        )));
    }
    let weight_bytes = runner.weight_bytes_per_step();
    progress("decode matmuls alone, rustle against cuBLAS");
    let gemv = decode_matmuls::run(&gpu, &c)?;
    progress(&format!(
        "prefill matmuls alone on {} tokens, rustle against cuBLAS",
        args.prompt_len
    ));
    let gemm = prefill_matmuls::run(&gpu, &c, args.prompt_len, args.gemm_plans)?;
    runner.fill_kv_with_noise()?;

    let kv_bytes_per_pos = runner.kv_bytes_per_token();
    let mut decode = vec![];
    // Every context with graphs, and the first also without, to show what they save.
    let runs = args
        .ctx
        .iter()
        .map(|&c| (c, true))
        .chain(args.ctx.first().map(|&c| (c, false)));
    for (ctx, graph) in runs {
        progress(&format!(
            "decode up to context {ctx}: {} steps, CUDA graphs {}",
            args.steps,
            if graph { "on" } else { "off" }
        ));
        runner.set_graphs(graph);
        let tok_per_s = decode_rate(&mut runner, ctx, args.steps)?;
        // Attention reads the positions before each step's own: on average ctx - steps / 2.
        let bytes =
            weight_bytes as f64 + (kv_bytes_per_pos * ctx.saturating_sub(args.steps / 2)) as f64;
        let achieved = tok_per_s * bytes;
        decode.push(DecodeResult {
            ctx,
            graph,
            tok_per_s,
            bytes_per_token: bytes,
            achieved_bytes_per_s: achieved,
            share_of_copy: achieved / bandwidth.copy_bytes_per_s,
            share_of_read: achieved / bandwidth.read_bytes_per_s,
            ceiling_tok_per_s: bandwidth.copy_bytes_per_s / bytes,
        });
    }
    let mut step_profiles = vec![];
    for &ctx in &args.ctx {
        progress(&format!(
            "one decode step at context {ctx}, kernel by kernel"
        ));
        step_profiles.push(profile_step(&mut runner, ctx)?);
    }
    progress(&format!("prefill of {} tokens", args.prompt_len));
    let prefill = prefill_rate(&mut runner, args.prompt_len)?;
    Ok(BenchReport {
        gpu: gpu.description.clone(),
        model,
        weight_bytes_per_token: weight_bytes,
        bandwidth,
        gemv,
        gemm,
        decode,
        step_profiles,
        prefill,
    })
}

fn decode_rate(runner: &mut Runner, ctx: usize, steps: usize) -> Result<f64> {
    const WARM_UP: usize = 3;
    let start_len = ctx.saturating_sub(steps + WARM_UP);
    // The context's keys and values: the noise already in those blocks.
    let mut seq = runner.solo_at(start_len)?;
    let mut token = 1u32;
    for _ in 0..WARM_UP {
        token = runner.extend_greedy(&mut seq, &[token])?; // first graph captures, caches
    }
    let start = Instant::now();
    for _ in 0..steps {
        token = runner.extend_greedy(&mut seq, &[token])?;
    }
    let secs = start.elapsed().as_secs_f64();
    seq.release();
    Ok(steps as f64 / secs)
}

/// One decode step with every launch timed (graphs off: events cannot be recorded inside a
/// replayed graph), summed by kernel.
fn profile_step(runner: &mut Runner, ctx: usize) -> Result<StepProfile> {
    let mut seq = runner.solo_at(ctx.saturating_sub(2))?;
    runner.set_graphs(false);
    let token = runner.extend_greedy(&mut seq, &[1])?; // warm-up
    runner.profile_start();
    let t = Instant::now();
    let result = runner.extend_greedy(&mut seq, &[token]);
    let step_us = t.elapsed().as_secs_f64() * 1e6;
    let launches = runner.profile_stop()?;
    result?;
    seq.release();
    runner.set_graphs(true);
    Ok(StepProfile {
        ctx,
        step_us,
        kernels: by_kernel(launches),
    })
}

fn prefill_rate(runner: &mut Runner, n: usize) -> Result<PrefillResult> {
    let prompt = synthetic_prompt(n, runner.config.vocab_size);
    // One untimed run first: module load and first-touch costs stay out of the figure.
    for timed in [false, true] {
        let mut seq = runner.solo();
        let start = Instant::now();
        runner.extend_greedy(&mut seq, &prompt)?;
        let secs = start.elapsed().as_secs_f64();
        seq.release();
        if timed {
            return Ok(PrefillResult {
                tokens: n,
                seconds: secs,
                tok_per_s: n as f64 / secs,
                time_to_first_token_ms: secs * 1e3,
            });
        }
    }
    unreachable!()
}

pub fn print(r: &BenchReport) {
    let gb = |b: f64| b / 1e9;
    println!("rustle bench: {} on {}", r.model, r.gpu);
    println!(
        "  memory: copy {:.0} GB/s (read + write), read {:.0} GB/s; weights read per token {:.3} GB",
        gb(r.bandwidth.copy_bytes_per_s),
        gb(r.bandwidth.read_bytes_per_s),
        gb(r.weight_bytes_per_token as f64)
    );
    println!(
        "  {:<18} {:>7} {:>7} {:>10} {:>8} {:>8} {:>10} {:>12}",
        "decode matmul", "rows", "cols", "rustle us", "GB/s", "of read", "cuBLAS us", "cuBLAS/ours"
    );
    for g in &r.gemv {
        let (cu, ratio) = match (g.cublas_us, g.speedup_vs_cublas) {
            (Some(c), Some(s)) => (format!("{c:.1}"), format!("{s:.2}")),
            _ => ("-".into(), "no cuBLAS".into()),
        };
        println!(
            "  {:<18} {:>7} {:>7} {:>10.1} {:>8.0} {:>7.1}% {:>10} {:>12}",
            g.name,
            g.n_out,
            g.n_in,
            g.rustle_us,
            gb(g.rustle_bytes_per_s),
            100.0 * g.rustle_bytes_per_s / r.bandwidth.read_bytes_per_s,
            cu,
            ratio
        );
    }
    prefill_matmuls::print(&r.gemm);
    println!(
        "  {:>7} {:>5} {:>9} {:>9} {:>8} {:>8} {:>8} {:>13}",
        "context", "graph", "tok/s", "GB/token", "GB/s", "of copy", "of read", "ceiling tok/s"
    );
    for d in &r.decode {
        println!(
            "  {:>7} {:>5} {:>9.1} {:>9.3} {:>8.0} {:>7.1}% {:>7.1}% {:>13.1}",
            d.ctx,
            if d.graph { "yes" } else { "no" },
            d.tok_per_s,
            gb(d.bytes_per_token),
            gb(d.achieved_bytes_per_s),
            100.0 * d.share_of_copy,
            100.0 * d.share_of_read,
            d.ceiling_tok_per_s
        );
    }
    for p in &r.step_profiles {
        let total: f64 = p.kernels.iter().map(|k| k.us).sum();
        println!(
            "  one decode step at context {} (graphs off): {:.0} us wall, {:.0} us in kernels",
            p.ctx, p.step_us, total
        );
        println!(
            "    {:<22} {:>6} {:>9} {:>7} {:>9} {:>8} {:>8}",
            "kernel", "calls", "us", "share", "MB", "GB/s", "of read"
        );
        for k in &p.kernels {
            let gbs = k.bytes as f64 / (k.us * 1e-6) / 1e9;
            println!(
                "    {:<22} {:>6} {:>9.1} {:>6.1}% {:>9.2} {:>8.0} {:>7.1}%",
                k.kernel,
                k.calls,
                k.us,
                100.0 * k.us / total,
                k.bytes as f64 / 1e6,
                gbs,
                100.0 * gbs * 1e9 / r.bandwidth.read_bytes_per_s
            );
        }
    }
    println!(
        "  prefill {} tokens: {:.1} ms, {:.0} tok/s; time to first token {:.1} ms",
        r.prefill.tokens,
        r.prefill.seconds * 1e3,
        r.prefill.tok_per_s,
        r.prefill.time_to_first_token_ms
    );
}
