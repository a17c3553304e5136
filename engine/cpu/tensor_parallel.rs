//! Tensor parallelism simulated on the CPU: the sharding of issue 58 checked without GPUs.
//!
//! N ranks each hold a slice of every layer: their query and KV heads (q, k and v's rows,
//! o_proj's columns of those heads, a KV cache of their own) and their part of the MLP's width
//! (gate and up's rows, down's columns), and a slice of the vocabulary (the embedding's and
//! the head's rows). A rank's o_proj and down each give a partial sum of the whole output, so
//! the ranks meet in an all-reduce (here a sum in rank order) after each; the embedding is an
//! all-reduce of rows that are zero on every rank but the one holding the token; the logits
//! an all-gather of each rank's vocabulary. The rest (norms, residual adds, a mixture's
//! router) is replicated; a mixture of experts splits every expert as it would one MLP.
//! Each step is the reference forward's (`cpu::forward`), on the rank's slice.

use std::ops::Range;

use crate::batch::Batch;
use crate::config::{Activation, Config, Moe};
use crate::cpu::Ropes;
use crate::cpu::experts::experts_f32;
use crate::cpu::ops::{
    attention_f32, geglu_f32, head_rmsnorm_f32, kv_write_f32, matmul_f32, residual_add_f32,
    rmsnorm_f32, rope_f32, scale_f32, swiglu_f32,
};
use crate::cpu::timed::Ops;
use crate::error::{Error, Result};
use crate::kernel_args::{Heads, Paged};
use crate::kv_cache::KvCache;
use crate::model::{Experts, LayerWeights, Mlp, ModelWeights};

/// One rank's slice of one layer.
struct RankLayer {
    /// `[q_dim / N, dim]`, `[kv_dim / N, dim]` each: the rows of the rank's heads.
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    /// `[dim, q_dim / N]`: o_proj's columns of the rank's heads.
    wo: Vec<f32>,
    /// The rank's part of the MLP: gate's and up's rows (`[ffn_dim / N, dim]`) and down's
    /// columns (`[dim, ffn_dim / N]`), of the one MLP or of every expert (whose router every
    /// rank holds whole: a token's experts and weights are the same on each).
    mlp: Mlp<Vec<f32>>,
}

/// One rank: its heads and MLP width (`config`), its slices, its KV cache, its vocabulary.
struct Rank {
    config: Config,
    layers: Vec<RankLayer>,
    kv: KvCache,
    vocab: Range<usize>,
}

/// The model split over `n` simulated ranks, beside the whole weights (the norms, which every
/// rank holds the same).
pub struct Ranks<'w> {
    weights: &'w ModelWeights,
    ranks: Vec<Rank>,
}

/// Rows `rows` of a `[_, width]` matrix.
fn rows(m: &[f32], rows: Range<usize>, width: usize) -> Vec<f32> {
    m[rows.start * width..rows.end * width].to_vec()
}

/// Columns `cols` of a `[n_rows, width]` matrix, as a `[n_rows, cols.len()]` one.
fn cols(m: &[f32], width: usize, cols: Range<usize>) -> Vec<f32> {
    m.chunks_exact(width)
        .flat_map(|row| row[cols.clone()].iter().copied())
        .collect()
}

/// Share `i` of `n` of `0..len` (the last ones one shorter where `n` does not divide it).
fn share(len: usize, n: usize, i: usize) -> Range<usize> {
    let size = len.div_ceil(n);
    (i * size).min(len)..((i + 1) * size).min(len)
}

/// The sum of the ranks' partial outputs, in rank order.
fn all_reduce(parts: Vec<Vec<f32>>) -> Vec<f32> {
    let mut parts = parts.into_iter();
    let mut sum = parts.next().expect("at least one rank");
    for p in parts {
        residual_add_f32(&mut sum, &p);
    }
    sum
}

impl<'w> Ranks<'w> {
    /// `w` split over `n` ranks, each with a KV cache of `n_blocks` blocks. Refused where `n`
    /// does not divide the heads, the KV heads or the MLP's (or each expert's) width.
    pub fn new(c: &Config, w: &'w ModelWeights, n: usize, n_blocks: usize) -> Result<Ranks<'w>> {
        let divides = |m: usize| n > 0 && m.is_multiple_of(n);
        let width = c.moe.map_or(c.ffn_dim, |m| m.expert_ffn_dim);
        if !(divides(c.n_heads) && divides(c.n_kv_heads) && divides(width)) {
            return Err(Error::Usage(format!(
                "{n} ranks must divide the {} query heads, {} KV heads and the MLP's {width}",
                c.n_heads, c.n_kv_heads
            )));
        }
        let dim = c.dim;
        let ranks = (0..n)
            .map(|r| {
                let config = Config {
                    n_heads: c.n_heads / n,
                    n_kv_heads: c.n_kv_heads / n,
                    ffn_dim: c.ffn_dim / n,
                    moe: c.moe.map(|m| Moe {
                        expert_ffn_dim: m.expert_ffn_dim / n,
                        ..m
                    }),
                    ..c.clone()
                };
                let q = share(c.q_dim(), n, r);
                let kv = share(c.kv_dim(), n, r);
                let f = share(width, n, r);
                // gate, up and down of one MLP (or expert) of `width`, the rank's part.
                let part = |gate: &[f32], up: &[f32], down: &[f32]| {
                    (
                        rows(gate, f.clone(), dim),
                        rows(up, f.clone(), dim),
                        cols(down, width, f.clone()),
                    )
                };
                let slice = |b: &Option<Vec<f32>>, range: &Range<usize>| {
                    b.as_ref().map(|b| b[range.clone()].to_vec())
                };
                let layer = |lw: &LayerWeights| {
                    let mlp = match &lw.mlp {
                        Mlp::Dense { gate, up, down } => {
                            let (gate, up, down) = part(gate, up, down);
                            Mlp::Dense { gate, up, down }
                        }
                        Mlp::Experts(e) => {
                            let parts: Vec<_> = (0..e.gate.len())
                                .map(|x| part(&e.gate[x], &e.up[x], &e.down[x]))
                                .collect();
                            Mlp::Experts(Experts {
                                moe: config.moe.expect("a rank of a model with experts"),
                                router: e.router.clone(),
                                gate: parts.iter().map(|p| p.0.clone()).collect(),
                                up: parts.iter().map(|p| p.1.clone()).collect(),
                                down: parts.into_iter().map(|p| p.2).collect(),
                            })
                        }
                    };
                    RankLayer {
                        wq: rows(&lw.wq, q.clone(), dim),
                        wk: rows(&lw.wk, kv.clone(), dim),
                        wv: rows(&lw.wv, kv.clone(), dim),
                        bq: slice(&lw.bq, &q),
                        bk: slice(&lw.bk, &kv),
                        bv: slice(&lw.bv, &kv),
                        wo: cols(&lw.wo, c.q_dim(), q.clone()),
                        mlp,
                    }
                };
                Ok(Rank {
                    kv: KvCache::new(&config, n_blocks)?,
                    layers: w.layers.iter().map(layer).collect(),
                    vocab: share(c.vocab_size, n, r),
                    config,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Ranks { weights: w, ranks })
    }

    /// Runs `batch` through the split model, as `cpu::forward` runs it whole: the logits of
    /// the rows `batch.logit_rows` names, `[rows, vocab]`.
    pub fn forward(&mut self, c: &Config, ropes: &Ropes, batch: &Batch) -> Vec<f32> {
        let w = self.weights;
        let (n, dim, eps) = (batch.tokens.len(), c.dim, c.rms_eps);
        // Each token's row from the rank holding it, zero elsewhere: an all-reduce.
        let mut x = all_reduce(
            self.ranks
                .iter()
                .map(|r| {
                    let mut part = vec![0.0; n * dim];
                    for (row, &t) in part.chunks_exact_mut(dim).zip(&batch.tokens) {
                        if r.vocab.contains(&(t as usize)) {
                            row.copy_from_slice(&w.embed[t as usize * dim..][..dim]);
                        }
                    }
                    part
                })
                .collect(),
        );
        if let Some(scale) = c.embed_scale {
            scale_f32(&mut x, scale);
        }
        let mut xb = vec![0.0; n * dim];
        for (l, lw) in w.layers.iter().enumerate() {
            rmsnorm_f32(&mut xb, &x, &lw.attn_norm, eps);
            let step = Step {
                layer: l,
                lw,
                rope: ropes.of_layer(c, l),
                window: c.window(l),
                batch,
            };
            let parts = self.ranks.iter_mut().map(|r| r.attention(&step, &xb));
            let out = all_reduce(parts.collect());
            add_normed(&mut x, out, lw.post_attn_norm.as_deref(), eps);

            rmsnorm_f32(&mut xb, &x, &lw.ffn_norm, eps);
            let parts = self.ranks.iter().map(|r| r.mlp(l, &xb, n));
            let out = all_reduce(parts.collect());
            add_normed(&mut x, out, lw.post_ffn_norm.as_deref(), eps);
        }
        // The head: each rank's vocabulary for every logit row, gathered.
        let rows = batch.logit_rows.len();
        let mut head_in = vec![0.0; rows * dim];
        for (dst, &r) in head_in.chunks_exact_mut(dim).zip(&batch.logit_rows) {
            let r = r as usize;
            rmsnorm_f32(dst, &x[r * dim..(r + 1) * dim], &w.final_norm, eps);
        }
        let mut logits = vec![0.0; rows * c.vocab_size];
        for rank in &self.ranks {
            let v = rank.vocab.clone();
            let mut part = vec![0.0; rows * v.len()];
            let head = &w.head()[v.start * dim..v.end * dim];
            matmul_f32(&mut part, &head_in, head, None, dim);
            for (dst, src) in logits
                .chunks_exact_mut(c.vocab_size)
                .zip(part.chunks_exact(v.len().max(1)))
            {
                dst[v.clone()].copy_from_slice(&src[..v.len()]);
            }
        }
        logits
    }
}

/// What every rank's attention of one layer shares.
struct Step<'a> {
    layer: usize,
    lw: &'a LayerWeights,
    rope: &'a crate::rope::RopeTables,
    window: Option<usize>,
    batch: &'a Batch,
}

/// `x += out`, `out` normed first where the layer has a post-norm (Gemma 3).
fn add_normed(x: &mut [f32], out: Vec<f32>, post: Option<&[f32]>, eps: f32) {
    match post {
        Some(post) => {
            let mut normed = vec![0.0; out.len()];
            rmsnorm_f32(&mut normed, &out, post, eps);
            residual_add_f32(x, &normed);
        }
        None => residual_add_f32(x, &out),
    }
}

impl Rank {
    /// The rank's heads over the normed stream `xb`: its partial o_proj output, `[n, dim]`.
    fn attention(&mut self, s: &Step, xb: &[f32]) -> Vec<f32> {
        let rc = &self.config;
        let rl = &self.layers[s.layer];
        let (n, dim, eps) = (s.batch.tokens.len(), rc.dim, rc.rms_eps);
        let (q_dim, kv_dim) = (rc.q_dim(), rc.kv_dim());
        let (mut q, mut k, mut v) = (
            vec![0.0; n * q_dim],
            vec![0.0; n * kv_dim],
            vec![0.0; n * kv_dim],
        );
        matmul_f32(&mut q, xb, &rl.wq, rl.bq.as_deref(), dim);
        matmul_f32(&mut k, xb, &rl.wk, rl.bk.as_deref(), dim);
        matmul_f32(&mut v, xb, &rl.wv, rl.bv.as_deref(), dim);
        if let (Some(q_norm), Some(k_norm)) = (&s.lw.q_norm, &s.lw.k_norm) {
            head_rmsnorm_f32(&mut q, q_norm, eps);
            head_rmsnorm_f32(&mut k, k_norm, eps);
        }
        let (cos, sin, pos) = (&s.rope.cos, &s.rope.sin, &s.batch.positions);
        rope_f32(&mut q, pos, cos, sin, rc.n_heads, rc.head_dim);
        rope_f32(&mut k, pos, cos, sin, rc.n_kv_heads, rc.head_dim);
        let (k_cache, v_cache) = self.kv.layer_mut(s.layer);
        kv_write_f32(k_cache, v_cache, &k, &v, &s.batch.slots, kv_dim);
        let mut paged = Paged::of_batch(s.batch, &q, self.kv.layer(s.layer), Heads::of(rc));
        paged.shape = paged.shape.windowed(s.window);
        let mut att = vec![0.0; n * q_dim];
        attention_f32(&mut att, &paged);
        let mut out = vec![0.0; n * dim];
        matmul_f32(&mut out, &att, &rl.wo, None, q_dim);
        out
    }

    /// The rank's part of the MLP over the normed stream `xb`: its partial down output.
    fn mlp(&self, layer: usize, xb: &[f32], n: usize) -> Vec<f32> {
        let rc = &self.config;
        let dim = rc.dim;
        let mut out = vec![0.0; n * dim];
        let (gate_w, up_w, down_w) = match &self.layers[layer].mlp {
            Mlp::Dense { gate, up, down } => (gate, up, down),
            Mlp::Experts(e) => {
                experts_f32(&mut Ops::default(), &mut out, xb, e, dim);
                return out;
            }
        };
        let f = rc.ffn_dim;
        let (mut gate, mut up, mut hidden) = (vec![0.0; n * f], vec![0.0; n * f], vec![0.0; n * f]);
        matmul_f32(&mut gate, xb, gate_w, None, dim);
        matmul_f32(&mut up, xb, up_w, None, dim);
        match rc.activation {
            Activation::Silu => swiglu_f32(&mut hidden, &gate, &up),
            Activation::GeluTanh => geglu_f32(&mut hidden, &gate, &up),
        }
        matmul_f32(&mut out, &hidden, down_w, None, f);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::{Scratch, forward, timed::Ops};
    use crate::kv::block_manager::{BLOCK_SIZE, BlockTable};
    use crate::rope::RopeTables;

    /// Every golden model split over 2 ranks (each has 4 query and 2 KV heads; the mixtures
    /// of experts split every expert), the Llama 3 one over 1, and the default model over 3
    /// (9 query and 3 KV heads): a prompt's logits at every row, and a decode step's after it,
    /// equal to the unsplit reference's up to the order of the sums.
    #[test]
    fn split_forward_matches_the_whole_on_the_golden_models() {
        let models = [
            ("tests/golden/tiny-llama3", 1),
            ("tests/golden/tiny-llama3", 2),
            ("tests/golden/tiny-qwen2", 2),
            ("tests/golden/tiny-mistral", 2),
            ("tests/golden/tiny-qwen3", 2),
            ("tests/golden/tiny-phi3", 2),
            ("tests/golden/tiny-gemma3", 2),
            ("tests/golden/tiny-gemma3-1b.gguf", 2),
            ("tests/golden/tiny-mixtral", 2),
            ("tests/golden/tiny-qwen3moe", 2),
            ("tests/golden/tiny-quant.gguf", 2),
            ("", 3),
        ];
        for (path, n_ranks) in models {
            let path = match path {
                "" => crate::default_model::ensure().unwrap(),
                p => std::path::PathBuf::from(p),
            };
            let path = path.as_path();
            let m = crate::loader::load(path).unwrap();
            let (c, w) = (m.config, m.weights);
            let n_blocks = 4;
            let rope =
                RopeTables::new(&c, n_blocks * BLOCK_SIZE, w.rope_freq_factors.as_deref()).unwrap();
            let local = RopeTables::local(&c, n_blocks * BLOCK_SIZE).unwrap();
            let ropes = Ropes {
                global: &rope,
                local: local.as_ref(),
            };
            let mut ranks = Ranks::new(&c, &w, n_ranks, n_blocks).unwrap();
            let mut kv = KvCache::new(&c, n_blocks).unwrap();
            let mut scratch = Scratch::new(&c, 64);
            let table = BlockTable {
                blocks: vec![2, 0, 3, 1],
                dropped: 0,
                len: 0,
                chain: vec![],
            };
            let prompt: Vec<u32> = (0..40).map(|i| (i * 37 % c.vocab_size) as u32).collect();
            let mut batch = Batch::default();
            for (tokens, len) in [(&prompt[..], 0), (&[7u32][..], prompt.len())] {
                let table = BlockTable {
                    len,
                    ..table.clone()
                };
                let chunk = crate::batch::SeqChunk {
                    table: &table,
                    tokens,
                    logits: tokens.len(),
                };
                batch.fill(&[chunk], true);
                let whole = forward(
                    &c,
                    &w,
                    &ropes,
                    &mut kv,
                    &mut scratch,
                    &mut Ops::default(),
                    &batch,
                )
                .to_vec();
                let split = ranks.forward(&c, &ropes, &batch);
                let scale = whole.iter().fold(0f32, |m, v| m.max(v.abs()));
                let worst = whole
                    .iter()
                    .zip(&split)
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(
                    worst <= 1e-4 * scale.max(1.0),
                    "{} over {n_ranks} ranks, {} tokens: largest difference {worst:e} of logits up to {scale}",
                    path.display(),
                    tokens.len()
                );
            }
        }
    }
}
