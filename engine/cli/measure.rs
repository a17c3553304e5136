//! `rustle bench` and `rustle profile`: their flags checked and handed to the measuring tools
//! (`rustle::tools`), the reports printed as text or JSON.

use rustle::error::{Error, Result};
use rustle::gpu::Gpu;
use rustle::runner::RunnerOptions;

use super::args::{BenchCli, ProfileCli, ProfileDevice, WorkloadArg};

/// `rustle bench`. Every bench but `--serve --cpu` is the GPU's: without one, the error says
/// what runs on the CPU.
pub fn bench(b: &BenchCli) -> Result<()> {
    run_bench(b).map_err(|e| {
        let hint = "`rustle bench --serve --cpu` measures the serving engine on the CPU";
        if b.cpu { e } else { no_gpu_hint(e, hint) }
    })
}

fn run_bench(b: &BenchCli) -> Result<()> {
    if b.serve {
        return bench_serve(b);
    }
    if let Some(sizes) = &b.verify {
        return bench_verify(b, sizes);
    }
    if let Some(k) = b.speculate {
        return bench_speculate(b, k);
    }
    if let Some(sizes) = &b.batch {
        return bench_batch(b, sizes);
    }
    if b.lesson {
        return bench_lesson(b);
    }
    if b.boundaries {
        return bench_boundaries(b);
    }
    if b.ctx.is_empty() || b.steps == 0 || b.prompt_len == 0 {
        return Err(Error::Usage(
            "bench needs at least one --ctx, --steps and --prompt-len above 0".into(),
        ));
    }
    let report = rustle::tools::bench::run(&rustle::tools::bench::BenchArgs {
        shape: b.shape.clone(),
        model: b.model.clone(),
        ctx: b.ctx.clone(),
        prompt_len: b.prompt_len,
        steps: b.steps,
        gemm_plans: b.gemm_plans,
        weights: weights_choice(&b.weights, b.model.is_some())?,
        kv_dtype: b.kv_dtype,
    })?;
    print_report(b.json, &report, rustle::tools::bench::print);
    Ok(())
}

fn bench_lesson(b: &BenchCli) -> Result<()> {
    let gpu = Gpu::new()?;
    let c = rustle::shapes::shape_config(&b.shape)?;
    eprintln!(
        "rustle bench --lesson: {} on {}, prompts of {} tokens",
        b.shape, gpu.description, b.prompt_len
    );
    let lesson = rustle::tools::lesson::run(&gpu, &c, b.prompt_len)?;
    print_report(b.json, &lesson, |lesson| {
        println!(
            "rustle bench --lesson: {} on {}, prompts of {} tokens",
            b.shape, gpu.description, b.prompt_len
        );
        rustle::tools::lesson::print(lesson);
    });
    Ok(())
}

#[cfg(feature = "probes")]
fn bench_boundaries(b: &BenchCli) -> Result<()> {
    let gpu = Gpu::new()?;
    let report = rustle::tools::boundaries::run(&gpu)?;
    print_report(b.json, &report, rustle::tools::boundaries::print);
    Ok(())
}

#[cfg(not(feature = "probes"))]
fn bench_boundaries(_: &BenchCli) -> Result<()> {
    Err(Error::Usage(
        "bench --boundaries is a measurement experiment, built only with `cargo build \
         --release --features probes`"
            .into(),
    ))
}

fn bench_batch(b: &BenchCli, sizes: &[usize]) -> Result<()> {
    if b.prompt_len == 0 || b.steps < 2 {
        return Err(Error::Usage(
            "bench --batch needs --prompt-len above 0 and --steps of at least 2".into(),
        ));
    }
    let gpu = Gpu::new()?;
    let bandwidth = rustle::tools::ceilings::gpu_bandwidth(&gpu)?.copy_bytes_per_s;
    let most = sizes.iter().copied().max().unwrap_or(1);
    let weights = weights_choice(&b.weights, b.model.is_some())?;
    let opts = RunnerOptions {
        kv_blocks: None,
        max_batch_tokens: b.prompt_len.max(most),
        weights: weights.0,
        synthetic: weights.1,
        kv_dtype: b.kv_dtype,
    };
    let (mut runner, name) =
        rustle::tools::setup::gpu_runner(&gpu, &b.shape, b.model.as_deref(), &opts)?;
    let results =
        rustle::tools::batch_bench::run(&mut runner, sizes, b.prompt_len, b.steps, bandwidth)?;
    print_report(b.json, &results, |results| {
        println!(
            "{name} on {}, copy bandwidth {:.2} TB/s",
            gpu.description,
            bandwidth / 1e12
        );
        rustle::tools::batch_bench::print(results);
    });
    Ok(())
}

fn bench_verify(b: &BenchCli, sizes: &[usize]) -> Result<()> {
    use rustle::tools::{setup, speculate_bench};
    let weights = weights_choice(&b.weights, b.model.is_some())?;
    let most = sizes.iter().copied().max().unwrap_or(1);
    let opts = RunnerOptions {
        kv_blocks: None,
        max_batch_tokens: most.max(256),
        weights: weights.0,
        synthetic: weights.1,
        kv_dtype: b.kv_dtype,
    };
    let (mut runner, name) = match b.cpu {
        true => {
            let mut opts = opts;
            opts.kv_blocks = Some(rustle::kv::block_manager::blocks_for(b.prompt_len + most));
            setup::fast_cpu_runner(b.model.as_deref(), &opts)?
        }
        false => setup::gpu_runner(&Gpu::new()?, &b.shape, b.model.as_deref(), &opts)?,
    };
    if b.cpu {
        runner.set_batch_invariant(true);
    }
    let costs = speculate_bench::verify_costs(&mut runner, b.prompt_len, sizes, b.steps)?;
    print_report(b.json, &costs, |costs| {
        println!(
            "{name} on {}, one sequence at {} tokens of context, {} passes each",
            runner.device_name(),
            b.prompt_len,
            b.steps
        );
        speculate_bench::print_verify(costs);
    });
    Ok(())
}

fn bench_speculate(b: &BenchCli, k: usize) -> Result<()> {
    use rustle::placement::{DeviceArg, Placement};
    use rustle::tools::speculate_bench;
    let place = Placement {
        prefix: "rustle bench",
        device: if b.cpu {
            DeviceArg::Cpu
        } else {
            DeviceArg::Gpu
        },
        weights: weights_choice(&b.weights, true)?.0,
    };
    let path = rustle::loader::resolve_model_path(b.model.clone())?;
    let m = place.load(place.open_gpu()?, &path)?;
    let name = m.description().to_owned();
    let output = b.output_len as usize;
    let opts = RunnerOptions {
        // The CPU's pool holds one request; the GPU sizes its own.
        kv_blocks: b
            .cpu
            .then(|| rustle::runner::cpu_kv_blocks(m.config(), 1024 + output)),
        max_batch_tokens: 1024,
        weights: place.weights,
        ..Default::default()
    };
    // The draft first: the model's pool on the GPU then takes the memory it left.
    let draft = match &b.draft_model {
        Some(p) => {
            let blocks = rustle::kv::block_manager::blocks_for(1024 + output + k);
            Some(place.draft_runner(m.gpu().cloned(), p, blocks)?)
        }
        None => None,
    };
    let (mut runner, tok) = m.into_runner(&opts)?;
    if b.cpu {
        // As `rustle --speculate` runs: guessed rows choose as decode steps would.
        runner.set_batch_invariant(true);
    }
    let report = speculate_bench::run(runner, draft, &tok, name, k, output)?;
    print_report(b.json, &report, speculate_bench::print);
    Ok(())
}

fn bench_serve(b: &BenchCli) -> Result<()> {
    use rustle::tools::serve_bench::{ServeBenchArgs, Workload};
    if let Some(r) = b.rate
        && !(r > 0.0 && r.is_finite())
    {
        return Err(Error::Usage(format!("--rate must be above 0, got {r}")));
    }
    if b.prompt_len == 0 {
        return Err(Error::Usage("--prompt-len must be at least 1".into()));
    }
    let output = b.output_len as usize;
    let workload = match b.workload {
        WorkloadArg::Fixed => Workload::Fixed {
            prompt: b.prompt_len,
            output,
        },
        WorkloadArg::Sharegpt => Workload::ShareGpt,
        WorkloadArg::SharedPrefix => Workload::SharedPrefix {
            prefix: 2000,
            question: 50,
            output,
        },
    };
    let report = rustle::tools::serve_bench::run(&ServeBenchArgs {
        shape: b.shape.clone(),
        model: b.model.clone(),
        device_cpu: b.cpu,
        requests: b.requests as usize,
        workload,
        rate: b.rate,
        seed: b.seed,
        token_budget: b.token_budget as usize,
        max_seqs: b.max_seqs as usize,
        prefix_cache: !b.no_prefix_cache,
        kv_blocks: b.kv_blocks.map(|n| n as usize),
        weights: weights_choice(&b.weights, b.model.is_some())?,
        kernels: b.kernels,
        kv_dtype: b.kv_dtype,
    })?;
    print_report(b.json, &report, rustle::tools::serve_bench::print);
    Ok(())
}

/// `rustle profile`.
pub fn profile(p: &ProfileCli) -> Result<()> {
    use rustle::tools::profile::{Profile, chart, collect, table};
    let profile = match &p.from {
        Some(path) => Profile::load(path)?,
        None => {
            if p.prompt_len == 0 || p.steps == 0 {
                return Err(Error::Usage(
                    "profile needs --prompt-len and --steps above 0".into(),
                ));
            }
            let args = collect::ProfileArgs {
                shape: p.shape.clone(),
                model: p.model.clone(),
                prompt_len: p.prompt_len,
                steps: p.steps,
                weights: weights_choice(&p.weights, p.model.is_some())?,
            };
            let profile = match p.device {
                // The GPU is the default.
                ProfileDevice::Gpu => collect::gpu(&args).map_err(|e| {
                    let hint = "`--device cpu` profiles the CPU backend, `--from FILE` redraws a saved profile";
                    no_gpu_hint(e, hint)
                })?,
                ProfileDevice::Cpu => collect::cpu(&args, true)?,
                ProfileDevice::CpuReference => collect::cpu(&args, false)?,
            };
            std::fs::create_dir_all(&p.out).map_err(|e| Error::io(&p.out, e))?;
            profile.save(&p.out.join("profile.json"))?;
            profile
        }
    };
    print!("{}", table::render(&profile));
    let (svg, png) = chart::write(&profile, &p.out)?;
    eprintln!(
        "rustle profile: roofline written to {} and {}",
        svg.display(),
        png.display()
    );
    if p.from.is_none() {
        eprintln!(
            "rustle profile: profile saved to {}",
            p.out.join("profile.json").display()
        );
    }
    Ok(())
}

/// `e`, where it says there is no GPU (`Error::NoGpu`), with `hint` after it: what the
/// command runs without one.
fn no_gpu_hint(e: Error, hint: &str) -> Error {
    match e {
        Error::NoGpu(why) => Error::NoGpu(format!("{why}; {hint}")),
        e => e,
    }
}

/// `--weights` for a model (`model`) or a synthetic shape; `None`: the default.
fn weights_choice(arg: &Option<String>, model: bool) -> Result<rustle::runner::WeightsChoice> {
    match arg {
        None => Ok(Default::default()),
        Some(s) => rustle::gpu::matrix::parse_weights(s, model).map_err(Error::Usage),
    }
}

/// A report as JSON (`--json`), or as `text` prints it.
fn print_report<T: serde::Serialize>(json: bool, report: &T, text: impl FnOnce(&T)) {
    if json {
        let json = serde_json::to_string_pretty(report).expect("a report serialises");
        println!("{json}");
    } else {
        text(report);
    }
}
