//! Where a model runs and how it gets there: the one loader behind `rustle`, `rustle serve`
//! and the measuring tools (`tools::setup`).
//!
//! In order: the GPU `--device` asks for is opened before the model is found (or fetched)
//! and read, so that a missing one fails fast, and `auto` without one runs on the CPU and
//! says why (`Placement::open_gpu`); on the CPU, `--weights` is checked before any weight is
//! read. The model is opened and checked against the GPU's kernels, where `auto` falls back
//! to the CPU again, still before its weights are read; then they are read in the form the
//! device wants: f32 and the stored blocks for the GPU to upload as `--weights` says, the
//! blocks as stored for the fast CPU backend (`Placement::load`). The runner over them comes
//! last (`Loaded::into_runner`), so that a caller can size the KV cache from the config and
//! its prompt first. Every message begins with the caller's prefix ("rustle", "rustle serve").

use std::fmt::Display;
use std::path::Path;
use std::time::Instant;

use clap::ValueEnum;

use crate::config::Config;
use crate::error::Result;
use crate::gpu::Gpu;
use crate::gpu::matrix::WeightFormat;
use crate::gpu::{GpuWeights, check_supported};
use crate::kv::dtype::KvDtype;
use crate::loader::{self, FastModel, LoadedModel};
use crate::runner::{Device, Runner, RunnerOptions, check_cpu_weights};
use crate::tokenizer::Tokenizer;

/// `--device`: auto picks the GPU when there is one (and its kernels can run the model),
/// else the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    Auto,
    Cpu,
    Gpu,
}

/// What a command asks of the loader.
#[derive(Clone, Copy, Debug)]
pub struct Placement<'a> {
    /// How the loader's messages begin: "rustle", "rustle serve".
    pub prefix: &'a str,
    pub device: DeviceArg,
    /// How the GPU holds the matrices (`--weights`); the CPU takes `stored` only.
    pub weights: WeightFormat,
}

impl Placement<'_> {
    /// The GPU `device` asks for, opened before the (possibly long) model load; `None`: the
    /// CPU, where `--weights` must then be `stored`.
    pub fn open_gpu(&self) -> Result<Option<Gpu>> {
        let gpu = match self.device {
            DeviceArg::Cpu => None,
            DeviceArg::Gpu => Some(Gpu::new()?),
            DeviceArg::Auto => Gpu::new().inspect_err(|e| self.falls_back(e)).ok(),
        };
        if gpu.is_none() {
            // On the CPU whatever the model: before it is found (or fetched) and read.
            check_cpu_weights(self.weights)?;
        }
        Ok(gpu)
    }

    /// Opens the model at `path` and reads its weights for the device: `gpu` (from
    /// `open_gpu`) when its kernels can run the model, else the CPU (`--device gpu` fails
    /// instead, with the reason).
    pub fn load(&self, gpu: Option<Gpu>, path: &Path) -> Result<Loaded> {
        let started = Instant::now();
        let opened = loader::open(path)?;
        let gpu = match gpu.map(|gpu| (check_supported(&opened.config), gpu)) {
            None => None,
            Some((Ok(()), gpu)) => Some(gpu),
            Some((Err(e), _)) if self.device == DeviceArg::Gpu => return Err(e),
            Some((Err(e), _)) => {
                self.falls_back(&e);
                None
            }
        };
        let held = match gpu {
            // The GPU uploads from the f32 weights (or the stored blocks, `--weights`).
            Some(gpu) => Held::Gpu(Box::new(gpu), opened.into_f32()?),
            None => {
                // A model the GPU cannot run: before its weights are read, not after.
                check_cpu_weights(self.weights)?;
                Held::Cpu(opened.into_fast()?)
            }
        };
        Ok(Loaded { held, started })
    }

    /// A draft model for speculative decoding (`--draft-model`) on the target's device
    /// (`gpu`), with a KV pool of `kv_blocks` blocks: made before the target's runner, whose
    /// pool then takes the memory left. Its matrices are held as stored.
    /// Returns its runner and what was opened.
    pub fn draft_runner(
        &self,
        gpu: Option<Gpu>,
        path: &Path,
        kv_blocks: usize,
    ) -> Result<(Runner, String)> {
        let on_gpu = gpu.is_some();
        let place = Placement {
            weights: WeightFormat::Stored,
            device: if on_gpu {
                DeviceArg::Gpu
            } else {
                DeviceArg::Cpu
            },
            ..*self
        };
        let loaded = place.load(gpu, path)?;
        let name = loaded.description().to_owned();
        eprintln!(
            "{}: draft model {name} ({} layers, dim {})",
            self.prefix,
            loaded.config().n_layers,
            loaded.config().dim
        );
        let opts = RunnerOptions {
            kv_blocks: Some(kv_blocks),
            ..Default::default()
        };
        Ok((loaded.into_runner(&opts)?.0, name))
    }

    fn falls_back(&self, why: &dyn Display) {
        eprintln!("{}: device auto: running on the CPU ({why})", self.prefix);
    }
}

/// A model read for its device, its runner not made yet.
pub struct Loaded {
    held: Held,
    /// When the model's files were opened: the clock of the callers' "loaded in" lines.
    pub started: Instant,
}

enum Held {
    /// f32 weights and the stored blocks, for the GPU to upload as `--weights` says.
    Gpu(Box<Gpu>, LoadedModel),
    /// The blocks as the files store them: the fast CPU backend (`--device cpu`).
    Cpu(FastModel),
    /// f32 weights on the CPU: the reference backend, which only the tools run.
    Reference(LoadedModel),
}

/// The model at `path` in f32 for the CPU's reference backend (the profiler's
/// `cpu-reference`): no device to choose.
pub fn load_reference(path: &Path) -> Result<Loaded> {
    let started = Instant::now();
    Ok(Loaded {
        held: Held::Reference(loader::load(path)?),
        started,
    })
}

impl Loaded {
    pub fn config(&self) -> &Config {
        match &self.held {
            Held::Gpu(_, m) | Held::Reference(m) => &m.config,
            Held::Cpu(m) => &m.config,
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        match &self.held {
            Held::Gpu(_, m) | Held::Reference(m) => &m.tokenizer,
            Held::Cpu(m) => &m.tokenizer,
        }
    }

    /// What was opened: "SmolLM2-135M-Instruct.Q4_1.gguf (GGUF, llama)".
    pub fn description(&self) -> &str {
        match &self.held {
            Held::Gpu(_, m) | Held::Reference(m) => &m.description,
            Held::Cpu(m) => &m.description,
        }
    }

    /// What the files store: "98.4 MB in the files: q4_1 210 (66.4 MB), ...".
    pub fn stored_summary(&self) -> String {
        match &self.held {
            Held::Gpu(_, m) | Held::Reference(m) => m.stored_summary(),
            Held::Cpu(m) => loader::stored_summary(&m.stored),
        }
    }

    /// On the fast CPU backend, what it holds against the files: "98.4 MB, 100.0% of the
    /// files' tensor bytes".
    pub fn held_summary(&self) -> Option<String> {
        match &self.held {
            Held::Cpu(m) => Some(m.held_summary()),
            Held::Gpu(..) | Held::Reference(_) => None,
        }
    }

    /// The GPU the runner will run on; `None`: the CPU.
    pub fn gpu(&self) -> Option<&Gpu> {
        match &self.held {
            Held::Gpu(gpu, _) => Some(gpu),
            Held::Cpu(_) | Held::Reference(_) => None,
        }
    }

    /// A runner for one sequence of up to `tokens` at a time (a chat, a perplexity chunk):
    /// on the CPU a KV pool of that size, within the runner's memory cap; the GPU sizes its
    /// own from the free memory. The matrices and the GPU's cache held as `weights` and
    /// `kv_dtype` say.
    pub fn into_runner_for(
        self,
        tokens: usize,
        (weights, kv_dtype): (WeightFormat, KvDtype),
    ) -> Result<(Runner, Tokenizer)> {
        let kv_blocks = match self.gpu() {
            None => Some(crate::runner::cpu_kv_blocks(self.config(), tokens)),
            Some(_) => None,
        };
        let opts = RunnerOptions {
            kv_blocks,
            weights,
            kv_dtype,
            ..Default::default()
        };
        self.into_runner(&opts)
    }

    /// The runner over these weights (the GPU's upload happens here), and the tokenizer.
    pub fn into_runner(self, opts: &RunnerOptions) -> Result<(Runner, Tokenizer)> {
        Ok(match self.held {
            Held::Gpu(gpu, m) => (
                Runner::new(m.config, m.weights, opts, Device::Gpu(gpu))?,
                m.tokenizer,
            ),
            Held::Cpu(m) => (
                Runner::with_fast_cpu(m.config, m.weights, opts)?,
                m.tokenizer,
            ),
            Held::Reference(m) => (
                Runner::new(m.config, m.weights, opts, Device::Cpu)?,
                m.tokenizer,
            ),
        })
    }
}

/// A runner over random weights of `config`'s shape made for `gpu` (`opts.synthetic`: bf16
/// made on the device, other types on the host), for benchmarks and load tests that need no
/// download.
pub fn synthetic_gpu_runner(gpu: Gpu, config: Config, opts: &RunnerOptions) -> Result<Runner> {
    check_supported(&config)?;
    let weights = GpuWeights::synthetic(&gpu, &config, 1, opts.synthetic)?;
    Runner::with_gpu_weights(config, gpu, weights, None, opts)
}
