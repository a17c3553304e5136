//! Running a model with every kernel timed: on the GPU, a CUDA event pair around each launch
//! (decode steps run without graphs, since events cannot be recorded inside a replayed
//! graph), with the bytes and FLOPs from the counting formulas beside the launch wrappers.

use crate::bench::{gpu_runner, measure_bandwidth, shape_config, synthetic_prompt};
use crate::error::Result;
use crate::gemv_bench::{cublas_gemm_flops, mma_peak_flops, rustle_gemm_flops};
use crate::gpu::Gpu;
use crate::gpu::context::KernelTime;
use crate::loader;
use crate::runner::{Device, Runner, RunnerOptions};

use super::report::{Ceilings, Phase, Profile, Row, aggregate};

pub struct ProfileArgs {
    pub shape: String,
    pub model: Option<std::path::PathBuf>,
    pub prompt_len: usize,
    pub steps: usize,
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
    let bw = measure_bandwidth(&gpu)?;
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
    };

    let opts = RunnerOptions {
        kv_blocks: Some(crate::kv::block_manager::blocks_for(args.prompt_len + args.steps + 1) + 1),
        max_batch_tokens: args.prompt_len.clamp(1, 1024),
    };
    let (mut runner, model) = gpu_runner(&gpu, &args.shape, args.model.as_deref(), &opts)?;
    runner.gpu_backend().expect("a GPU runner").use_graphs = false;
    // One untimed pass first, so module load and first touches stay out of the figures.
    let prompt = synthetic_prompt(args.prompt_len, runner.config.vocab_size);
    let mut seq = runner.solo();
    runner.extend_greedy(&mut seq, &prompt)?;
    seq.release();

    progress(&format!(
        "prefill of {} tokens and {} decode steps, every launch timed",
        args.prompt_len, args.steps
    ));
    let rows = profile_phases(
        &mut runner,
        args,
        |_| gpu.profile_start(),
        |_| gpu.profile_stop(),
    )?;
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
/// against the CPU's ceilings measured the same way (a copy far larger than the caches; the
/// reference matmul on a prompt-sized problem).
pub fn cpu(args: &ProfileArgs) -> Result<Profile> {
    use crate::config::Config;
    use crate::cpu::ops::matmul_f32;
    use crate::model::ModelWeights;
    use rayon::prelude::*;
    use std::time::Instant;

    let threads = rayon::current_num_threads();
    let device = format!(
        "{} ({threads} threads)",
        cpu_name().unwrap_or_else(|| "CPU".into())
    );
    progress(&format!(
        "on {device}: measuring memory bandwidth (a 1 GiB copy)"
    ));
    let n = 1usize << 27; // 512 MiB of f32 each way
    let src: Vec<f32> = (0..n)
        .into_par_iter()
        .map(|i| (i % 1000) as f32 + 0.5)
        .collect();
    let mut dst = vec![0f32; n];
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        dst.par_chunks_mut(1 << 20)
            .zip(src.par_chunks(1 << 20))
            .for_each(|(d, s)| d.copy_from_slice(s));
        best = best.min(t.elapsed().as_secs_f64());
    }
    let bytes_per_s = 2.0 * (n * 4) as f64 / best;
    drop((src, dst));
    progress("measuring matrix throughput (the reference matmul, 256 x 2048 x 2048)");
    let (m, k) = (256, 2048);
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i % 97) as f32 - 48.0) / 97.0)
        .collect();
    let w: Vec<f32> = (0..k * k)
        .map(|i| ((i % 89) as f32 - 44.0) / 89.0)
        .collect();
    let mut out = vec![0f32; m * k];
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        matmul_f32(&mut out, &x, &w, None, k);
        best = best.min(t.elapsed().as_secs_f64());
    }
    let flops_per_s = 2.0 * (m * k * k) as f64 / best;
    let ceilings = Ceilings {
        bytes_per_s,
        flops_per_s,
        bandwidth_source: "parallel copy of 512 MiB, read + write".into(),
        compute_source: "rustle's reference matmul, 256 x 2048 x 2048".into(),
        rustle_gemm_flops_per_s: None,
        mma_peak_flops_per_s: None,
    };

    let opts = RunnerOptions {
        kv_blocks: Some(crate::kv::block_manager::blocks_for(args.prompt_len + args.steps + 1) + 1),
        max_batch_tokens: args.prompt_len.clamp(1, 1024),
    };
    let (config, weights, model): (Config, ModelWeights, String) = match &args.model {
        Some(path) => {
            progress(&format!("loading {}", path.display()));
            let m = loader::load(path)?;
            let name = m.description.clone();
            (m.config, m.weights, name)
        }
        None => {
            let config = shape_config(&args.shape)?;
            crate::loader::check_params_fit(&config)?;
            progress(&format!(
                "building {} weights in host memory (synthetic, f32)",
                args.shape
            ));
            let w = ModelWeights::synthetic(&config, 1);
            (config, w, format!("{} (synthetic)", args.shape))
        }
    };
    let mut runner = Runner::new(config, weights, &opts, Device::Cpu)?;
    progress(&format!(
        "prefill of {} tokens and {} decode steps, every operation timed",
        args.prompt_len, args.steps
    ));
    let rows = profile_phases(
        &mut runner,
        args,
        |r| cpu_ops(r).profile_start(),
        |r| Ok(cpu_ops(r).profile_stop()),
    )?;
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

/// A prefill of `args.prompt_len` tokens, then `args.steps` greedy decode steps, each phase
/// recorded between `start` and `stop`, summed into rows by kernel and phase.
fn profile_phases(
    runner: &mut Runner,
    args: &ProfileArgs,
    mut start: impl FnMut(&mut Runner),
    mut stop: impl FnMut(&mut Runner) -> Result<Vec<KernelTime>>,
) -> Result<Vec<Row>> {
    let prompt = synthetic_prompt(args.prompt_len, runner.config.vocab_size);
    let mut seq = runner.solo();
    start(runner);
    let mut token = runner.extend_greedy(&mut seq, &prompt)?;
    let prefill = stop(runner)?;
    start(runner);
    for _ in 0..args.steps {
        token = runner.extend_greedy(&mut seq, &[token])?;
    }
    let decode = stop(runner)?;
    seq.release();
    let tag = |phase: Phase| {
        move |k: KernelTime| {
            (
                k.kernel.to_string(),
                phase,
                k.ms * 1e-3,
                k.traffic.bytes,
                k.traffic.flops,
            )
        }
    };
    Ok(aggregate(
        prefill
            .into_iter()
            .map(tag(Phase::Prefill))
            .chain(decode.into_iter().map(tag(Phase::Decode))),
    ))
}

fn cpu_ops(r: &mut Runner) -> &mut crate::cpu::timed::Ops {
    &mut r.cpu_backend().expect("a CPU runner").ops
}

/// The processor's name, from /proc/cpuinfo where there is one.
fn cpu_name() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_owned())
}
