//! Running a model with every kernel timed: on the GPU, a CUDA event pair around each launch
//! (decode steps run without graphs, since events cannot be recorded inside a replayed
//! graph), with the bytes and FLOPs from the counting formulas beside the launch wrappers.

use super::report::{CacheCeiling, Ceilings, Phase, Profile, Row};
use crate::error::Result;
use crate::gpu::Gpu;
use crate::kv::block_manager::blocks_for;
use crate::runner::{Runner, RunnerOptions};
use crate::tools::ceilings::{
    cpu_cache_bandwidth, cpu_matmul_flops, cpu_memory_bandwidth, cpu_private_caches,
    cublas_gemm_flops, gpu_bandwidth, mma_peak_flops, rustle_gemm_flops,
};
use crate::tools::setup::{cpu_runner, fast_cpu_runner, gpu_runner, synthetic_prompt};
use crate::tools::timing::by_kernel;

/// The shape the GPU profile runs without `--shape` or `--model`.
pub const DEFAULT_GPU_SHAPE: &str = "llama3-8b";

pub struct ProfileArgs {
    /// A named shape with synthetic weights; `None`: on the GPU `DEFAULT_GPU_SHAPE`, on the
    /// CPU the default model (or `model`).
    pub shape: Option<String>,
    pub model: Option<std::path::PathBuf>,
    pub prompt_len: usize,
    pub steps: usize,
    /// How the GPU holds the matrices (`--weights`).
    pub weights: crate::runner::WeightsChoice,
}

fn progress(msg: &str) {
    eprintln!("rustle profile: {msg}");
}

/// The square GEMM that measures the compute roof.
const GEMM_N: usize = 8192;

pub fn gpu(args: &ProfileArgs) -> Result<Profile> {
    let gpu = Gpu::new()?;
    progress(&format!(
        "on {}: measuring memory bandwidth",
        gpu.description
    ));
    let bw = gpu_bandwidth(&gpu)?;
    progress(&format!(
        "measuring matrix throughput (bf16 GEMM {GEMM_N}^3, cuBLAS and rustle; the mma.sync peak)"
    ));
    let cublas = cublas_gemm_flops(&gpu, GEMM_N)?;
    let ours = rustle_gemm_flops(&gpu, GEMM_N)?;
    let mma_peak = mma_peak_flops(&gpu)?;
    let (flops_per_s, compute_source) = match cublas {
        Some(f) => (f, format!("cuBLAS bf16 GEMM {GEMM_N}^3")),
        None => (ours, format!("rustle's GEMM {GEMM_N}^3 (cuBLAS not found)")),
    };
    let ceilings = Ceilings {
        bytes_per_s: bw.copy_bytes_per_s,
        flops_per_s,
        bandwidth_source: "device copy, read + write".into(),
        compute_source,
        rustle_gemm_flops_per_s: Some(ours),
        mma_peak_flops_per_s: Some(mma_peak),
        caches: vec![],
    };

    let (mut runner, model) = gpu_runner(
        &gpu,
        args.shape.as_deref().unwrap_or(DEFAULT_GPU_SHAPE),
        args.model.as_deref(),
        &opts(args),
    )?;
    runner.set_graphs(false);
    // One untimed pass first, so module load and first touches stay out of the figures.
    let prompt = synthetic_prompt(args.prompt_len, runner.config.vocab_size);
    let mut seq = runner.solo();
    runner.extend_greedy(&mut seq, &prompt)?;
    seq.release();

    progress(&format!(
        "prefill of {} tokens and {} decode steps, every launch timed",
        args.prompt_len, args.steps
    ));
    let rows = profile_phases(&mut runner, args)?;
    Ok(Profile {
        device: gpu.description.clone(),
        model,
        workload: format!(
            "prefill of {} tokens, then {} decode steps (batch 1)",
            args.prompt_len, args.steps
        ),
        ceilings,
        rows,
    })
}

/// The same profile for the CPU reference backend: each operation of the forward pass timed,
/// against the CPU's ceilings measured the same way: memory (a read and a copy far larger
/// than the caches), each private cache (a copy within it), and the reference matmul with
/// its weights in cache. An operation whose bytes per call fit a cache is held to that
/// cache's bandwidth (`Ceilings::bandwidth_for`): on a CPU the residual stream and a norm's
/// output stay in cache from one operation to the next.
///
/// `fast`: the fast backend's steps (`cpu::fast`, a real model: weights as stored) rather than
/// the reference's. Its ceilings are the same measurements, so its bf16 and 8-bit matmuls
/// can pass the f32 reference matmul's roof.
pub fn cpu(args: &ProfileArgs, fast: bool) -> Result<Profile> {
    let threads = rayon::current_num_threads();
    let device = format!(
        "{} ({threads} threads, {})",
        cpu_name().unwrap_or_else(|| "CPU".into()),
        if fast {
            "the fast backend"
        } else {
            "the f32 reference"
        }
    );
    if fast && args.shape.is_some() {
        return Err(crate::error::Error::Usage(
            "--shape makes f32 weights, which only the reference holds: use --device cpu-reference"
                .into(),
        ));
    }
    progress(&format!(
        "on {device}: measuring memory bandwidth (a read and a copy of 512 MiB)"
    ));
    let (bytes_per_s, bandwidth_source) = cpu_memory_bandwidth();
    let private = cpu_private_caches();
    let mut caches = vec![];
    for c in &private {
        progress(&format!(
            "measuring the {} cache's bandwidth ({} KiB per core)",
            c.name,
            c.bytes >> 10
        ));
        caches.push(CacheCeiling {
            name: c.name.clone(),
            size: c.bytes as u64,
            bytes_per_s: cpu_cache_bandwidth(c.bytes),
        });
    }
    // The matmul's weights sized to the largest private cache (1 MiB if none is known).
    let cache = private.last().map_or(1 << 20, |c| c.bytes);
    progress("measuring matrix throughput (the reference matmul, weights in cache)");
    let (flops_per_s, compute_source) = cpu_matmul_flops(cache);
    let ceilings = Ceilings {
        bytes_per_s,
        flops_per_s,
        bandwidth_source,
        compute_source,
        rustle_gemm_flops_per_s: None,
        mma_peak_flops_per_s: None,
        caches,
    };
    let (mut runner, model) = if fast {
        fast_cpu_runner(args.model.as_deref(), &opts(args))?
    } else {
        cpu_runner(args.shape.as_deref(), args.model.as_deref(), &opts(args))?
    };
    progress(&format!(
        "prefill of {} tokens and {} decode steps, every operation timed",
        args.prompt_len, args.steps
    ));
    let rows = profile_phases(&mut runner, args)?;
    Ok(Profile {
        device,
        model,
        workload: format!(
            "prefill of {} tokens, then {} decode steps (batch 1)",
            args.prompt_len, args.steps
        ),
        ceilings,
        rows,
    })
}

/// A KV pool for the prompt and the steps, and a batch as long as the prompt (at most 1024).
fn opts(args: &ProfileArgs) -> RunnerOptions {
    RunnerOptions {
        kv_blocks: Some(blocks_for(args.prompt_len + args.steps + 1) + 1),
        max_batch_tokens: args.prompt_len.clamp(1, 1024),
        weights: args.weights.0,
        synthetic: args.weights.1,
        kv_dtype: Default::default(),
    }
}

/// A prefill of `args.prompt_len` tokens, then `args.steps` greedy decode steps, each phase
/// recorded on its own, summed into rows by kernel and phase.
fn profile_phases(runner: &mut Runner, args: &ProfileArgs) -> Result<Vec<Row>> {
    let prompt = synthetic_prompt(args.prompt_len, runner.config.vocab_size);
    let mut seq = runner.solo();
    runner.profile_start();
    let mut token = runner.extend_greedy(&mut seq, &prompt)?;
    let prefill = runner.profile_stop()?;
    runner.profile_start();
    for _ in 0..args.steps {
        token = runner.extend_greedy(&mut seq, &[token])?;
    }
    let decode = runner.profile_stop()?;
    seq.release();
    let rows = |phase: Phase, launches| {
        by_kernel(launches).into_iter().map(move |k| Row {
            kernel: k.kernel,
            phase,
            calls: k.calls,
            seconds: k.us * 1e-6,
            bytes: k.bytes,
            flops: k.flops,
        })
    };
    Ok(rows(Phase::Prefill, prefill)
        .chain(rows(Phase::Decode, decode))
        .collect())
}

/// The processor's name, from /proc/cpuinfo where there is one.
fn cpu_name() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_owned())
}
