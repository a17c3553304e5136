//! `rustle perplexity`: how well the model predicts a text, as llama.cpp's `llama-perplexity`
//! measures it. The text is cut into chunks of `--ctx` tokens; each chunk runs as a fresh
//! sequence (its first token the BOS where the model starts with one), and the tokens of its
//! second half are scored, so that every scored token sees at least half a chunk of context.
//! Perplexity is `exp` of their mean negative log-likelihood; the ± is that mean's standard
//! error carried through the `exp`.
//!
//! `--save-logits FILE` keeps every scored token's log-probabilities (f16, the whole
//! vocabulary); `--kl-divergence FILE` runs against such a file from another run (another
//! format, device or model file of the same tokenizer) and reports the mean KL divergence
//! from it per token and how often the two runs' most likely tokens agree: what a format
//! costs in quality, as llama-perplexity's `--kl-divergence` reports it.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use rustle::error::{Error, Result};
use rustle::loader;
use rustle::placement::{Placement, load_reference};
use rustle::runner::Runner;

use super::args::PerplexityCli;

/// The scored tokens' negative log-likelihoods, summed, and their count; against a reference
/// run, the KL divergences and the agreements of the most likely tokens.
#[derive(Default)]
struct Tally {
    sum: f64,
    sum_sq: f64,
    n: usize,
    kl_sum: f64,
    /// Each scored token's KL divergence, for the percentile.
    kls: Vec<f64>,
    top_agree: usize,
}

impl Tally {
    /// The KL divergence that `p` of the tokens do not exceed (nearest rank); 0 with none.
    fn kl_percentile(&self, p: f64) -> f64 {
        let mut sorted = self.kls.clone();
        sorted.sort_by(f64::total_cmp);
        let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
        sorted.get(rank - 1).copied().unwrap_or(0.0)
    }
}

/// The start of a `--save-logits` file.
const MAGIC: &[u8; 8] = b"RUSTLEKL";

/// What a saved run must share with a run compared against it: the vocabulary, the chunk
/// size and the scored text's tokens (their count and a hash).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    vocab: u32,
    ctx: u32,
    chunks: u32,
    tokens_hash: u64,
}

impl Header {
    fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(MAGIC)?;
        for v in [self.vocab, self.ctx, self.chunks] {
            w.write_all(&v.to_le_bytes())?;
        }
        w.write_all(&self.tokens_hash.to_le_bytes())
    }

    fn read(r: &mut impl Read) -> std::io::Result<Option<Header>> {
        let mut buf = [0u8; 28];
        r.read_exact(&mut buf)?;
        if &buf[..8] != MAGIC {
            return Ok(None);
        }
        let u32_at = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        let mut hash = [0u8; 8];
        hash.copy_from_slice(&buf[20..28]);
        Ok(Some(Header {
            vocab: u32_at(8),
            ctx: u32_at(12),
            chunks: u32_at(16),
            tokens_hash: u64::from_le_bytes(hash),
        }))
    }
}

/// FNV-1a over the token ids: enough to tell two texts or tokenizations apart.
fn tokens_hash(tokens: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for t in tokens {
        for b in t.to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Where the scored rows go or come from.
enum Reference {
    None,
    Save(BufWriter<File>),
    Compare(BufReader<File>),
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
    let path = loader::resolve_model_path(args.model.clone())?;
    let model = match args.reference {
        true => load_reference(&path)?,
        false => place.load(place.open_gpu()?, &path)?,
    };
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
    let config_vocab = config.vocab_size;
    let description = model.description().to_owned();
    let (mut runner, _) = model.into_runner_for(args.ctx, (args.weights, args.kv_dtype))?;
    eprintln!(
        "rustle perplexity: {description} on {}: {} tokens, {chunks} chunks of {}",
        runner.device_name(),
        tokens.len(),
        args.ctx
    );
    let header = Header {
        vocab: config_vocab as u32,
        ctx: args.ctx as u32,
        chunks: chunks as u32,
        tokens_hash: tokens_hash(&tokens[..chunks * args.ctx]),
    };
    let mut reference = open_reference(args, &header)?;
    let mut tally = Tally::default();
    for (i, chunk) in tokens.chunks_exact(args.ctx).take(chunks).enumerate() {
        let mut chunk = chunk.to_vec();
        if let Some(bos) = bos {
            chunk[0] = bos;
        }
        score(&mut runner, &chunk, &mut tally, &mut reference)?;
        let (ppl, err) = tally.perplexity();
        eprintln!(
            "rustle perplexity: chunk {}/{chunks}: {ppl:.4} ± {err:.4}",
            i + 1
        );
    }
    if let (Reference::Save(w), Some(path)) = (&mut reference, &args.save_logits) {
        w.flush().map_err(|e| Error::io(path, e))?;
    }
    let (ppl, err) = tally.perplexity();
    let compared = matches!(reference, Reference::Compare(_));
    let kl = tally.kl_sum / tally.n as f64;
    let kl_p99 = tally.kl_percentile(0.99);
    let agree = tally.top_agree as f64 / tally.n as f64;
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
            "kl_divergence": compared.then_some(kl),
            "kl_divergence_p99": compared.then_some(kl_p99),
            "top_token_agreement": compared.then_some(agree),
        });
        println!("{report:#}");
    } else {
        println!(
            "perplexity {ppl:.4} ± {err:.4} over {} tokens ({chunks} chunks of {}, the second half of each scored)",
            tally.n, args.ctx
        );
        if compared {
            println!(
                "against the reference run: KL divergence {kl:.6} a token (99th percentile {kl_p99:.6}), the most likely token the same for {:.2}% of tokens",
                100.0 * agree
            );
        }
    }
    Ok(())
}

/// The file `--save-logits` writes (its header written) or `--kl-divergence` reads (its
/// header checked against this run's).
fn open_reference(args: &PerplexityCli, header: &Header) -> Result<Reference> {
    if let Some(path) = &args.save_logits {
        let mut w = BufWriter::new(File::create(path).map_err(|e| Error::io(path, e))?);
        header.write(&mut w).map_err(|e| Error::io(path, e))?;
        return Ok(Reference::Save(w));
    }
    let Some(path) = &args.kl_divergence else {
        return Ok(Reference::None);
    };
    let mut r = BufReader::new(File::open(path).map_err(|e| Error::io(path, e))?);
    let Ok(Some(theirs)) = Header::read(&mut r) else {
        return Err(Error::Usage(format!(
            "{}: not a file of `rustle perplexity --save-logits`",
            path.display()
        )));
    };
    if theirs != *header {
        return Err(Error::Usage(format!(
            "{}: saved from another run (vocabulary {}, --ctx {}, {} chunks, tokens {:016x}); this one has vocabulary {}, --ctx {}, {} chunks, tokens {:016x}: the same text, --ctx, --chunks and tokenizer are needed",
            path.display(),
            theirs.vocab,
            theirs.ctx,
            theirs.chunks,
            theirs.tokens_hash,
            header.vocab,
            header.ctx,
            header.chunks,
            header.tokens_hash
        )));
    }
    Ok(Reference::Compare(r))
}

/// One chunk through the model as a fresh sequence; its second half's tokens scored, and
/// saved to or compared with the reference.
fn score(
    runner: &mut Runner,
    chunk: &[u32],
    tally: &mut Tally,
    reference: &mut Reference,
) -> Result<()> {
    let vocab = runner.config.vocab_size;
    let mut seq = runner.solo();
    let logits = runner.extend_all_logits(&mut seq, chunk);
    seq.release();
    let logits = logits?;
    let mut log_probs = vec![0f32; vocab];
    let mut bytes = vec![0u8; 2 * vocab];
    let io = |e: std::io::Error| Error::Usage(format!("the reference file: {e}"));
    // Row p predicts token p + 1.
    for p in chunk.len() / 2..chunk.len() - 1 {
        log_softmax(&logits[p * vocab..(p + 1) * vocab], &mut log_probs);
        tally.add(-log_probs[chunk[p + 1] as usize] as f64);
        match reference {
            Reference::None => {}
            Reference::Save(w) => {
                for (b, &l) in bytes.chunks_exact_mut(2).zip(&log_probs) {
                    b.copy_from_slice(&half::f16::from_f32(l).to_le_bytes());
                }
                w.write_all(&bytes).map_err(io)?;
            }
            Reference::Compare(r) => {
                r.read_exact(&mut bytes).map_err(io)?;
                let theirs = bytes
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32());
                let (kl, same_top) = compare(theirs, &log_probs);
                tally.kl_sum += kl;
                tally.kls.push(kl);
                tally.top_agree += usize::from(same_top);
            }
        }
    }
    Ok(())
}

/// KL(theirs || ours) of two log-probability rows, and whether their most likely tokens are
/// the same (the first of equals).
fn compare(theirs: impl Iterator<Item = f32>, ours: &[f32]) -> (f64, bool) {
    let (mut kl, mut best_theirs, mut best_ours) = (0f64, (0, f32::MIN), (0, f32::MIN));
    for (i, (t, &o)) in theirs.zip(ours).enumerate() {
        kl += (t as f64).exp() * (t as f64 - o as f64);
        if t > best_theirs.1 {
            best_theirs = (i, t);
        }
        if o > best_ours.1 {
            best_ours = (i, o);
        }
    }
    (kl, best_theirs.0 == best_ours.0)
}

/// `out[i] = row[i] - log(sum_j exp(row[j]))`, in f64.
fn log_softmax(row: &[f32], out: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_sum = row
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    for (o, &l) in out.iter_mut().zip(row) {
        *o = (l as f64 - log_sum) as f32;
    }
}

fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    String::from_utf8(bytes)
        .map_err(|_| Error::Usage(format!("{}: not UTF-8 text", path.display())))
}
