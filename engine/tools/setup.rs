//! What every tool starts from: a runner over a real model (through `placement`, the loader
//! `rustle` and `rustle serve` use) or over synthetic weights of a named shape (`shapes.rs`),
//! and a synthetic prompt.

use std::path::Path;

use crate::error::Result;
use crate::gpu::Gpu;
use crate::loader;
use crate::model::ModelWeights;
use crate::placement::{DeviceArg, Placement, load_reference, synthetic_gpu_runner};
use crate::runner::{Device, Runner, RunnerOptions};
use crate::shapes::shape_config;

fn progress(msg: &str) {
    eprintln!("rustle: {msg}");
}

/// The loader as the tools ask for it: on `device`, the weights as `opts` says.
fn placement(device: DeviceArg, opts: &RunnerOptions) -> Placement<'static> {
    Placement {
        prefix: "rustle",
        device,
        weights: opts.weights,
    }
}

/// A GPU runner over `model` (a folder or file) or, without one, random weights of `shape`
/// made on the device; and the model's name for reports.
pub fn gpu_runner(
    gpu: &Gpu,
    shape: &str,
    model: Option<&Path>,
    opts: &RunnerOptions,
) -> Result<(Runner, String)> {
    match model {
        Some(path) => {
            progress(&format!("loading {}", path.display()));
            let m = placement(DeviceArg::Gpu, opts).load(Some(gpu.clone()), path)?;
            let name = m.description().to_owned();
            Ok((m.into_runner(opts)?.0, name))
        }
        None => {
            let config = shape_config(shape)?;
            let kind = match opts.synthetic {
                crate::gpu::matrix::Synthetic::Bf16 => "bf16, made on the GPU".to_owned(),
                k => format!("{}, made on the host", k.name()),
            };
            progress(&format!("building {shape} weights (synthetic, {kind})"));
            Ok((
                synthetic_gpu_runner(gpu.clone(), config, opts)?,
                format!("{shape} (synthetic)"),
            ))
        }
    }
}

/// A CPU reference runner over `model` (a folder or file) or, with `shape`, random f32
/// weights of that shape made in host memory (refused if they would not fit); with neither,
/// the default model. The model's name for reports comes with it.
pub fn cpu_runner(
    shape: Option<&str>,
    model: Option<&Path>,
    opts: &RunnerOptions,
) -> Result<(Runner, String)> {
    match (model, shape) {
        (None, Some(shape)) => {
            let config = shape_config(shape)?;
            loader::check_params_fit(&config)?;
            progress(&format!(
                "building {shape} weights in host memory (synthetic, f32)"
            ));
            let w = ModelWeights::synthetic(&config, 1);
            let runner = Runner::new(config, w, opts, Device::Cpu)?;
            Ok((runner, format!("{shape} (synthetic)")))
        }
        (model, _) => {
            let path = loader::resolve_model_path(model.map(Path::to_owned))?;
            progress(&format!("loading {}", path.display()));
            let m = load_reference(&path)?;
            let name = m.description().to_owned();
            Ok((m.into_runner(opts)?.0, name))
        }
    }
}

/// A runner on the fast CPU backend over `model` (a folder or file; the default model without
/// one), and the model's name for reports.
pub fn fast_cpu_runner(model: Option<&Path>, opts: &RunnerOptions) -> Result<(Runner, String)> {
    let path = loader::resolve_model_path(model.map(Path::to_owned))?;
    progress(&format!("loading {}", path.display()));
    let m = placement(DeviceArg::Cpu, opts).load(None, &path)?;
    if let Some(held) = m.held_summary() {
        progress(&format!("the CPU holds the weights as stored ({held})"));
    }
    let name = m.description().to_owned();
    Ok((m.into_runner(opts)?.0, name))
}

/// A prompt of `n` token ids spread over a vocabulary of `vocab`, for timing runs.
pub fn synthetic_prompt(n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7919 + 13) % vocab as u32)
        .collect()
}
