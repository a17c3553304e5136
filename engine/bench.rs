//! `rustle bench`: decode and prefill speed on the GPU, each figure beside the limit the
//! same process measured. Decode reads every weight once per token, so its ceiling is the
//! memory bandwidth over the bytes a token must read (weights, plus the KV cache attention
//! reads); `bench` measures that bandwidth first, two ways: the driver's device-to-device
//! copy (bytes read + bytes written) and a pure-read kernel (16-byte loads, four in flight).

use std::path::PathBuf;
use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::gpu::backend::GpuWeights;
use crate::kv::block_manager::blocks_for;
use crate::loader;
use crate::runner::{Device, Runner, RunnerOptions};

pub use crate::shapes::{SHAPES, shape_config};

pub struct BenchArgs {
    pub shape: String,
    pub model: Option<PathBuf>,
    pub ctx: Vec<usize>,
    pub prompt_len: usize,
    pub steps: usize,
    /// Time every plan of the warpgroup GEMM too.
    pub gemm_plans: bool,
}

#[derive(Serialize)]
pub struct Bandwidth {
    /// Device-to-device copy, bytes read + written per second.
    pub copy_bytes_per_s: f64,
    /// The read probe, bytes read per second.
    pub read_bytes_per_s: f64,
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

/// One kernel's share of a decode step (graphs off, each launch timed with events).
#[derive(Serialize)]
pub struct KernelRow {
    pub kernel: String,
    pub calls: usize,
    pub us: f64,
    /// Bytes the launches must move, by the formulas beside the launch wrappers.
    pub bytes: u64,
    pub flops: u64,
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
    pub gemv: Vec<crate::gemv_bench::GemvResult>,
    /// The prefill matmuls alone, at the prompt length.
    pub gemm: Vec<crate::gemm_bench::GemmResult>,
    pub decode: Vec<DecodeResult>,
    pub step_profiles: Vec<StepProfile>,
    pub prefill: PrefillResult,
}

fn progress(msg: &str) {
    eprintln!("rustle bench: {msg}");
}

/// Median milliseconds of `reps` runs of `f`, timed with CUDA events after one warm-up.
pub(crate) fn time_ms(gpu: &Gpu, reps: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let start = gpu
        .ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(Error::driver("event"))?;
    let end = gpu
        .ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(Error::driver("event"))?;
    let mut times = vec![];
    for _ in 0..reps {
        start.record(&gpu.stream).map_err(Error::driver("event"))?;
        f()?;
        end.record(&gpu.stream).map_err(Error::driver("event"))?;
        times.push(start.elapsed_ms(&end).map_err(Error::driver("event"))? as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Copy and read bandwidth over 2 GiB buffers of random bits (never zeros), far past the L2.
pub fn measure_bandwidth(gpu: &Gpu) -> Result<Bandwidth> {
    let words = 1usize << 29; // 2 GiB of u32
    let mut src = gpu.zeros::<u16>(2 * words, "the bandwidth test")?;
    gpu.fill_random_bf16(&mut src.as_view_mut(), 7, 1.0)?;
    let mut dst = gpu.zeros::<u16>(2 * words, "the bandwidth test")?;
    let bytes = (4 * words) as f64;
    let copy_ms = time_ms(gpu, 10, &mut || {
        gpu.stream
            .memcpy_dtod(&src, &mut dst)
            .map_err(Error::driver("copy"))
    })?;
    // SAFETY: the u16 buffer reinterpreted as half as many u32 words: same bytes, same alignment.
    let src_words = unsafe { src.transmute::<u32>(words) }.expect("2 * words u16 hold words u32");
    // Enough blocks to keep every SM's load slots full: 132 SMs x 32 blocks.
    let mut partial = gpu.zeros::<u32>(132 * 32, "the bandwidth test")?;
    let read_ms = time_ms(gpu, 10, &mut || {
        gpu.read_probe_u32(&mut partial.as_view_mut(), &src_words)
    })?;
    Ok(Bandwidth {
        copy_bytes_per_s: 2.0 * bytes / (copy_ms * 1e-3),
        read_bytes_per_s: bytes / (read_ms * 1e-3),
    })
}

pub fn run(args: &BenchArgs) -> Result<BenchReport> {
    let gpu = Gpu::new()?;
    progress(&format!(
        "on {}: measuring memory bandwidth (copy and read, 2 GiB buffers)",
        gpu.description
    ));
    let bandwidth = measure_bandwidth(&gpu)?;
    let max_ctx = args.ctx.iter().copied().max().unwrap_or(0);
    let kv_blocks = blocks_for(max_ctx + args.steps + 1) + blocks_for(args.prompt_len) + 1;
    let opts = RunnerOptions {
        kv_blocks: Some(kv_blocks),
        max_batch_tokens: args.prompt_len.clamp(1, 1024),
    };
    let (mut runner, model) = gpu_runner(&gpu, &args.shape, args.model.as_deref(), &opts)?;
    let c = runner.config.clone();
    if max_ctx > runner.max_context() {
        return Err(Error::Usage(format!(
            "--ctx {max_ctx} is past the model's context of {}",
            runner.max_context()
        )));
    }
    let weight_bytes = runner
        .gpu_backend()
        .expect("a GPU runner")
        .weights
        .bytes_per_token(&c);
    progress("decode matmuls alone, rustle against cuBLAS");
    let gemv = crate::gemv_bench::run(&gpu, &c)?;
    progress(&format!(
        "prefill matmuls alone on {} tokens, rustle against cuBLAS",
        args.prompt_len
    ));
    let gemm = crate::gemm_bench::run(&gpu, &c, args.prompt_len, args.gemm_plans)?;
    fill_kv_with_noise(&mut runner)?;

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
        runner.gpu_backend().expect("a GPU runner").use_graphs = graph;
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

/// A GPU runner over `model` (a folder or file) or, without one, random weights of `shape`
/// made on the device; and the model's name for reports.
pub fn gpu_runner(
    gpu: &Gpu,
    shape: &str,
    model: Option<&std::path::Path>,
    opts: &RunnerOptions,
) -> Result<(Runner, String)> {
    match model {
        Some(path) => {
            progress(&format!("loading {}", path.display()));
            let m = loader::load(path)?;
            let name = m.description.clone();
            Ok((
                Runner::new(
                    m.config,
                    m.weights,
                    opts,
                    Device::Gpu(Box::new(gpu.clone())),
                )?,
                name,
            ))
        }
        None => {
            let config = shape_config(shape)?;
            progress(&format!(
                "building {shape} weights on the GPU (synthetic, bf16)"
            ));
            let weights = GpuWeights::synthetic(gpu, &config, 1)?;
            Ok((
                Runner::with_gpu_weights(config, gpu.clone(), weights, None, opts)?,
                format!("{shape} (synthetic)"),
            ))
        }
    }
}

/// A prompt of `n` token ids spread over a vocabulary of `vocab`, for timing runs.
pub fn synthetic_prompt(n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7919 + 13) % vocab as u32)
        .collect()
}

/// The KV pool filled with random bf16 values made on the device, so attention reads real
/// data.
pub(crate) fn fill_kv_with_noise(runner: &mut Runner) -> Result<()> {
    let g = runner.gpu_backend().expect("a GPU runner");
    let gpu = g.gpu.clone();
    gpu.fill_random_bf16(&mut g.k_cache.as_view_mut(), 3, 1.0)?;
    gpu.fill_random_bf16(&mut g.v_cache.as_view_mut(), 4, 1.0)?;
    gpu.sync()
}

fn decode_rate(runner: &mut Runner, ctx: usize, steps: usize) -> Result<f64> {
    const WARM_UP: usize = 3;
    let start_len = ctx.saturating_sub(steps + WARM_UP);
    let mut seq = runner.solo();
    seq.reserve(start_len.max(1))?;
    seq.table.len = start_len; // the context's keys and values: the noise already in those blocks
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
    let mut seq = runner.solo();
    let start_len = ctx.saturating_sub(2);
    seq.reserve(start_len.max(1))?;
    seq.table.len = start_len;
    let gpu = runner.gpu_backend().expect("a GPU runner");
    gpu.use_graphs = false;
    let gpu = gpu.gpu.clone();
    let token = runner.extend_greedy(&mut seq, &[1])?; // warm-up
    gpu.profile_start();
    let t = Instant::now();
    let result = runner.extend_greedy(&mut seq, &[token]);
    let step_us = t.elapsed().as_secs_f64() * 1e6;
    let launches = gpu.profile_stop()?;
    result?;
    seq.release();
    runner.gpu_backend().expect("a GPU runner").use_graphs = true;
    let kernels = by_kernel(launches);
    Ok(StepProfile {
        ctx,
        step_us,
        kernels,
    })
}

/// Timed launches summed by kernel, the most time first.
pub fn by_kernel(launches: Vec<crate::traffic::KernelTime>) -> Vec<KernelRow> {
    let mut kernels: Vec<KernelRow> = vec![];
    for l in launches {
        let row = match kernels.iter_mut().find(|r| r.kernel == l.kernel) {
            Some(r) => r,
            None => {
                kernels.push(KernelRow {
                    kernel: l.kernel.into(),
                    calls: 0,
                    us: 0.0,
                    bytes: 0,
                    flops: 0,
                });
                kernels.last_mut().expect("just pushed")
            }
        };
        row.calls += 1;
        row.us += l.ms * 1e3;
        row.bytes += l.traffic.bytes;
        row.flops += l.traffic.flops;
    }
    kernels.sort_by(|a, b| b.us.total_cmp(&a.us));
    kernels
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
    crate::gemm_bench::print(&r.gemm);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_shape_resolves() {
        for (name, _) in SHAPES {
            shape_config(name).unwrap();
        }
        let c = shape_config("llama3-8b").unwrap();
        assert_eq!(
            (c.q_dim(), c.kv_dim(), c.group_size(), c.head_dim),
            (4096, 1024, 4, 128)
        );
        let c = shape_config("llama3.2-1b").unwrap();
        assert!(c.tie_embeddings && c.head_dim == 64);
        assert!(
            shape_config("gpt-2")
                .unwrap_err()
                .to_string()
                .contains("llama3-8b")
        );
    }
}
