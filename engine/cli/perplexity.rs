//! `rustle perplexity`: how well the model predicts a text, as llama.cpp's `llama-perplexity`
//! measures it. The text is cut into chunks of `--ctx` tokens; each chunk runs as a fresh
//! sequence (its first token the BOS where the model starts with one), and the tokens of its
//! second half are scored, so that every scored token sees at least half a chunk of context.
//! Perplexity is `exp` of their mean negative log-likelihood; the ± is that mean's standard
//! error carried through the `exp`.

use std::path::Path;

use rustle::error::{Error, Result};
use rustle::loader;
use rustle::placement::Placement;
use rustle::runner::{Runner, RunnerOptions, cpu_kv_blocks};

use super::args::PerplexityCli;

/// The scored tokens' negative log-likelihoods, summed, and their count.
#[derive(Default)]
struct Tally {
    sum: f64,
    sum_sq: f64,
    n: usize,
}

impl Tally {
    fn add(&mut self, nll: f64) {
        self.sum += nll;
        self.sum_sq += nll * nll;
        self.n += 1;
    }

    fn mean(&self) -> f64 {
        self.sum / self.n as f64
    }

    /// Perplexity, and its standard error (that of the mean log-likelihood, through `exp`).
    fn perplexity(&self) -> (f64, f64) {
        let mean = self.mean();
        let var = (self.sum_sq / self.n as f64 - mean * mean).max(0.0);
        let err = (var / (self.n.max(2) - 1) as f64).sqrt();
        (mean.exp(), mean.exp() * err)
    }
}

pub fn run(args: &PerplexityCli) -> Result<()> {
    let text = read_text(&args.file)?;
    let place = Placement {
        prefix: "rustle perplexity",
        device: args.device,
        weights: args.weights,
    };
    let gpu = place.open_gpu()?;
    let path = loader::resolve_model_path(args.model.clone())?;
    let model = place.load(gpu, &path)?;
    let config = model.config();
    if args.ctx > config.max_seq_len {
        return Err(Error::Usage(format!(
            "--ctx {} is longer than the model's context of {}",
            args.ctx, config.max_seq_len
        )));
    }
    let tokens = model.tokenizer().encode(&text, false)?;
    let chunks = tokens.len() / args.ctx;
    if chunks == 0 {
        return Err(Error::Usage(format!(
            "{} is {} tokens, shorter than one chunk of --ctx {}; lower --ctx or give a longer text",
            args.file.display(),
            tokens.len(),
            args.ctx
        )));
    }
    let chunks = args.chunks.map_or(chunks, |c| c.min(chunks));
    let bos = model.tokenizer().encode("", true)?.first().copied();
    let kv_blocks = match model.gpu() {
        None => Some(cpu_kv_blocks(config, args.ctx)),
        Some(_) => None,
    };
    let opts = RunnerOptions {
        kv_blocks,
        weights: args.weights,
        ..Default::default()
    };
    let description = model.description().to_owned();
    let (mut runner, _) = model.into_runner(&opts)?;
    eprintln!(
        "rustle perplexity: {description} on {}: {} tokens, {chunks} chunks of {}",
        runner.device_name(),
        tokens.len(),
        args.ctx
    );
    let mut tally = Tally::default();
    for (i, chunk) in tokens.chunks_exact(args.ctx).take(chunks).enumerate() {
        let mut chunk = chunk.to_vec();
        if let Some(bos) = bos {
            chunk[0] = bos;
        }
        score(&mut runner, &chunk, &mut tally)?;
        let (ppl, err) = tally.perplexity();
        eprintln!(
            "rustle perplexity: chunk {}/{chunks}: {ppl:.4} ± {err:.4}",
            i + 1
        );
    }
    let (ppl, err) = tally.perplexity();
    if args.json {
        let report = serde_json::json!({
            "model": description,
            "file": args.file.display().to_string(),
            "ctx": args.ctx,
            "chunks": chunks,
            "scored_tokens": tally.n,
            "mean_nll": tally.mean(),
            "perplexity": ppl,
            "perplexity_error": err,
        });
        println!("{report:#}");
    } else {
        println!(
            "perplexity {ppl:.4} ± {err:.4} over {} tokens ({chunks} chunks of {}, the second half of each scored)",
            tally.n, args.ctx
        );
    }
    Ok(())
}

/// One chunk through the model as a fresh sequence; its second half's tokens scored.
fn score(runner: &mut Runner, chunk: &[u32], tally: &mut Tally) -> Result<()> {
    let vocab = runner.config.vocab_size;
    let mut seq = runner.solo();
    let logits = runner.extend_all_logits(&mut seq, chunk);
    seq.release();
    let logits = logits?;
    // Row p predicts token p + 1.
    for p in chunk.len() / 2..chunk.len() - 1 {
        let row = &logits[p * vocab..(p + 1) * vocab];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let log_sum = row
            .iter()
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln()
            + max;
        tally.add(log_sum - row[chunk[p + 1] as usize] as f64);
    }
    Ok(())
}

fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    String::from_utf8(bytes)
        .map_err(|_| Error::Usage(format!("{}: not UTF-8 text", path.display())))
}
