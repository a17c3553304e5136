//! The model's weights, named for their role, and the one loader that takes them by name,
//! shape and dtype from the files. The matrices are of a type the backend picks
//! (`MatrixFormat`): f32 for the reference backend (the default), the stored bytes for the
//! fast one (`cpu::fast::weights::Matrix`); norms and biases are f32 for both.

use std::sync::Arc;

use rayon::prelude::*;

use crate::config::{Config, Moe};
use crate::error::{Error, Result};
use crate::weights::Weights;

/// One transformer block, its matrices of type `M`.
pub struct LayerWeights<M = Vec<f32>> {
    /// `[dim]`
    pub attn_norm: Vec<f32>,
    /// `[q_dim, dim]`
    pub wq: M,
    /// `[kv_dim, dim]`
    pub wk: M,
    /// `[kv_dim, dim]`
    pub wv: M,
    /// `[q_dim]`, `[kv_dim]`, `[kv_dim]`: Qwen2's projection biases.
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    /// `[head_dim]`, `[head_dim]`: Qwen3's norms of each query and key head.
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// `[dim, q_dim]`
    pub wo: M,
    /// `[dim]`: Gemma 3's norm of the attention's output, before the residual add.
    pub post_attn_norm: Option<Vec<f32>>,
    /// `[dim]`
    pub ffn_norm: Vec<f32>,
    pub mlp: Mlp<M>,
    /// `[dim]`: Gemma 3's norm of the MLP's output, before the residual add.
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// A layer's MLP: one SwiGLU MLP, or a mixture of experts (`Config::moe`).
pub enum Mlp<M> {
    Dense {
        /// `[ffn_dim, dim]`
        gate: M,
        /// `[ffn_dim, dim]`
        up: M,
        /// `[dim, ffn_dim]`
        down: M,
    },
    Experts(Experts<M>),
}

/// A mixture of experts: how it routes, the router and each expert's SwiGLU MLP.
pub struct Experts<M> {
    pub moe: Moe,
    /// `[n_experts, dim]`
    pub router: Vec<f32>,
    /// `[n_experts]` of `[expert_ffn_dim, dim]`
    pub gate: Vec<M>,
    /// `[n_experts]` of `[expert_ffn_dim, dim]`
    pub up: Vec<M>,
    /// `[n_experts]` of `[dim, expert_ffn_dim]`
    pub down: Vec<M>,
}

impl<M> Mlp<M> {
    /// The dense MLP's gate, up and down; `None` for experts.
    pub fn dense(&self) -> Option<(&M, &M, &M)> {
        match self {
            Mlp::Dense { gate, up, down } => Some((gate, up, down)),
            Mlp::Experts(_) => None,
        }
    }

    /// Every matrix of the MLP (each expert's).
    pub fn matrices(&self) -> Vec<&M> {
        match self {
            Mlp::Dense { gate, up, down } => vec![gate, up, down],
            Mlp::Experts(e) => e.gate.iter().chain(&e.up).chain(&e.down).collect(),
        }
    }

    fn matrices_mut(&mut self) -> Vec<&mut M> {
        match self {
            Mlp::Dense { gate, up, down } => vec![gate, up, down],
            Mlp::Experts(e) => e
                .gate
                .iter_mut()
                .chain(&mut e.up)
                .chain(&mut e.down)
                .collect(),
        }
    }
}

impl<M> LayerWeights<M> {
    /// The layer's matrices (every expert's included).
    pub fn matrices(&self) -> Vec<&M> {
        let mut m = vec![&self.wq, &self.wk, &self.wv, &self.wo];
        m.extend(self.mlp.matrices());
        m
    }

    /// The layer's vectors: the norms, and the biases and head norms it has.
    pub fn vectors(&self) -> impl Iterator<Item = &Vec<f32>> {
        [
            Some(&self.attn_norm),
            Some(&self.ffn_norm),
            self.bq.as_ref(),
            self.bk.as_ref(),
            self.bv.as_ref(),
            self.q_norm.as_ref(),
            self.k_norm.as_ref(),
            self.post_attn_norm.as_ref(),
            self.post_ffn_norm.as_ref(),
            match &self.mlp {
                Mlp::Experts(e) => Some(&e.router),
                Mlp::Dense { .. } => None,
            },
        ]
        .into_iter()
        .flatten()
    }
}

/// The model's weights, its matrices of type `M`.
pub struct ModelWeights<M = Vec<f32>> {
    /// `[vocab, dim]`
    pub embed: M,
    pub layers: Vec<LayerWeights<M>>,
    /// `[dim]`
    pub final_norm: Vec<f32>,
    /// `[vocab, dim]`; `None` when the head is tied to the embedding.
    pub lm_head: Option<M>,
    /// `[head_dim / 2]`: Llama 3.1's RoPE divisors, when a GGUF file stores them.
    pub rope_freq_factors: Option<Vec<f32>>,
    /// The files as they store the weights (mapped, not copied), for a backend that keeps
    /// quantized blocks as they are (the GPU); `None` for synthetic weights.
    pub stored: Option<Arc<Stored>>,
}

/// How a backend holds a matrix it takes from the files.
pub trait MatrixFormat: Sized + Send {
    /// The tensor `name` as a `[rows, cols]` matrix, or an error naming what was wanted and
    /// what was found.
    fn take(w: &Weights, name: &str, rows: usize, cols: usize) -> Result<Self>;

    /// The matrix of `n_heads` query or key heads with each head's rows in the order the
    /// kernels want (`HeadOrder`).
    fn reorder_heads(self, n_heads: usize, order: &HeadOrder) -> Self;
}

/// The reference backend's matrices: f32, whatever the files store.
impl MatrixFormat for Vec<f32> {
    fn take(w: &Weights, name: &str, rows: usize, cols: usize) -> Result<Self> {
        w.take(name, &[rows, cols])
    }

    fn reorder_heads(self, n_heads: usize, order: &HeadOrder) -> Self {
        reorder_rows(&self, n_heads, order)
    }
}

/// The weights as the files store them.
pub struct Stored {
    pub weights: Weights,
    /// How the rows of each query and key head move from the files' order to the kernels'.
    pub head_order: HeadOrder,
}

impl<M> ModelWeights<M> {
    /// The output projection: the head, or the embedding when they are tied.
    pub fn head(&self) -> &M {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

impl ModelWeights {
    /// Values of every matrix (the embedding and the head included) and of every vector
    /// (norms, biases, RoPE factors): what a backend's copy of the weights holds.
    pub fn params(&self) -> (usize, usize) {
        let mut matrices = self.embed.len() + self.lm_head.as_ref().map_or(0, |h| h.len());
        let mut vectors =
            self.final_norm.len() + self.rope_freq_factors.as_ref().map_or(0, |f| f.len());
        for l in &self.layers {
            matrices += l.matrices().iter().map(|m| m.len()).sum::<usize>();
            vectors += l.vectors().map(|v| v.len()).sum::<usize>();
        }
        (matrices, vectors)
    }

    /// Bytes a forward pass reads from the weights: every matrix and norm (and bias) once,
    /// the head once; the embedding only for the rows it looks up, counted as none.
    pub fn bytes(&self) -> usize {
        let layer = |l: &LayerWeights| {
            l.matrices().iter().map(|m| m.len()).sum::<usize>()
                + l.vectors().map(|v| v.len()).sum::<usize>()
        };
        let n: usize = self.layers.iter().map(layer).sum::<usize>()
            + self.final_norm.len()
            + self.head().len();
        n * size_of::<f32>()
    }

    /// Random weights of `c`'s shape on the host (for profiling without a download): matrices
    /// uniform in ±1/sqrt(fan_in), norms 1, no biases, from the same hash the GPU's generator
    /// uses.
    pub fn synthetic(c: &Config, seed: u32) -> ModelWeights {
        let mut next = seed;
        let mut matrix = |rows: usize, cols: usize| -> Vec<f32> {
            next = next.wrapping_add(1);
            let scale = 1.0 / (cols as f32).sqrt();
            (0..rows * cols)
                .into_par_iter()
                .map(|i| {
                    ((crate::cpu::ops::hash32(next, i as u32) >> 8) as f32 / 8_388_608.0 - 1.0)
                        * scale
                })
                .collect()
        };
        let (dim, q, kv, ffn) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let layers = (0..c.n_layers)
            .map(|_| LayerWeights {
                attn_norm: vec![1.0; dim],
                wq: matrix(q, dim),
                wk: matrix(kv, dim),
                wv: matrix(kv, dim),
                bq: c.qkv_bias.then(|| vec![0.0; q]),
                bk: c.qkv_bias.then(|| vec![0.0; kv]),
                bv: c.qkv_bias.then(|| vec![0.0; kv]),
                q_norm: c.qk_norm.then(|| vec![1.0; c.head_dim]),
                k_norm: c.qk_norm.then(|| vec![1.0; c.head_dim]),
                wo: matrix(dim, q),
                post_attn_norm: c.post_norms.then(|| vec![1.0; dim]),
                ffn_norm: vec![1.0; dim],
                mlp: Mlp::Dense {
                    gate: matrix(ffn, dim),
                    up: matrix(ffn, dim),
                    down: matrix(dim, ffn),
                },
                post_ffn_norm: c.post_norms.then(|| vec![1.0; dim]),
            })
            .collect();
        ModelWeights {
            embed: matrix(c.vocab_size, dim),
            lm_head: (!c.tie_embeddings).then(|| matrix(c.vocab_size, dim)),
            final_norm: vec![1.0; dim],
            rope_freq_factors: None,
            stored: None,
            layers,
        }
    }

    /// Rounds every matrix to bf16 (norms and biases stay f32), as the GPU holds them: so the
    /// CPU reference can run exactly the GPU's weights.
    pub fn round_matrices_to_bf16(&mut self) {
        let round = |w: &mut Vec<f32>| {
            for v in w.iter_mut() {
                *v = half::bf16::from_f32(*v).to_f32();
            }
        };
        round(&mut self.embed);
        if let Some(h) = &mut self.lm_head {
            round(h);
        }
        for l in &mut self.layers {
            for w in [&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo] {
                round(w);
            }
            for w in l.mlp.matrices_mut() {
                round(w);
            }
        }
    }

    /// Checks every weight `load` takes (name, shape, dtype) without reading any: a model
    /// whose files disagree with its configuration is refused before anything is allocated.
    pub fn check(c: &Config, w: &Weights) -> Result<()> {
        let (dim, q_dim, kv_dim) = (c.dim, c.q_dim(), c.kv_dim());
        for l in 0..c.n_layers {
            let name = |s: &str| format!("model.layers.{l}.{s}");
            for (s, shape) in [
                ("input_layernorm.weight", vec![dim]),
                ("self_attn.q_proj.weight", vec![q_dim, dim]),
                ("self_attn.k_proj.weight", vec![kv_dim, dim]),
                ("self_attn.v_proj.weight", vec![kv_dim, dim]),
                ("self_attn.o_proj.weight", vec![dim, q_dim]),
            ] {
                w.check(&name(s), &shape, true)?;
            }
            for s in NormNames::of(c).layer() {
                w.check(&name(s), &[dim], true)?;
            }
            for (s, shape) in mlp_weights(c) {
                w.check(&name(&s), &shape, true)?;
            }
            if c.qkv_bias {
                for (s, n) in [
                    ("self_attn.q_proj.bias", q_dim),
                    ("self_attn.k_proj.bias", kv_dim),
                    ("self_attn.v_proj.bias", kv_dim),
                ] {
                    w.check(&name(s), &[n], true)?;
                }
            }
            if c.qk_norm {
                for s in ["self_attn.q_norm.weight", "self_attn.k_norm.weight"] {
                    w.check(&name(s), &[c.head_dim], true)?;
                }
            }
        }
        w.check("model.embed_tokens.weight", &[c.vocab_size, dim], true)?;
        w.check("model.norm.weight", &[dim], true)?;
        w.check("lm_head.weight", &[c.vocab_size, dim], !c.tie_embeddings)?;
        w.check("rope_freqs.weight", &[c.head_dim / 2], false)
    }
}

/// The names of a layer's RMSNorms (under `model.layers.L.`). Llama's norm before its MLP is
/// `post_attention_layernorm`; Gemma 3 has four, and that name is its norm of the attention's
/// output.
struct NormNames {
    attn: &'static str,
    ffn: &'static str,
    post_attn: Option<&'static str>,
    post_ffn: Option<&'static str>,
}

impl NormNames {
    fn of(c: &Config) -> NormNames {
        match c.post_norms {
            false => NormNames {
                attn: "input_layernorm.weight",
                ffn: "post_attention_layernorm.weight",
                post_attn: None,
                post_ffn: None,
            },
            true => NormNames {
                attn: "input_layernorm.weight",
                ffn: "pre_feedforward_layernorm.weight",
                post_attn: Some("post_attention_layernorm.weight"),
                post_ffn: Some("post_feedforward_layernorm.weight"),
            },
        }
    }

    /// Every one of a layer's norms.
    fn layer(&self) -> impl Iterator<Item = &'static str> {
        [
            Some(self.attn),
            Some(self.ffn),
            self.post_attn,
            self.post_ffn,
        ]
        .into_iter()
        .flatten()
    }
}

/// A layer's MLP weights (names under `model.layers.L.`, shapes): the dense MLP's, or the
/// router and every expert's.
fn mlp_weights(c: &Config) -> Vec<(String, Vec<usize>)> {
    let (dim, ffn) = (c.dim, c.ffn_dim);
    let Some(m) = c.moe else {
        return vec![
            ("mlp.gate_proj.weight".into(), vec![ffn, dim]),
            ("mlp.up_proj.weight".into(), vec![ffn, dim]),
            ("mlp.down_proj.weight".into(), vec![dim, ffn]),
        ];
    };
    let f = m.expert_ffn_dim;
    let mut out = vec![("mlp.gate.weight".to_owned(), vec![m.n_experts, dim])];
    for e in 0..m.n_experts {
        out.push((format!("mlp.experts.{e}.gate_proj.weight"), vec![f, dim]));
        out.push((format!("mlp.experts.{e}.up_proj.weight"), vec![f, dim]));
        out.push((format!("mlp.experts.{e}.down_proj.weight"), vec![dim, f]));
    }
    out
}

impl<M: MatrixFormat> ModelWeights<M> {
    /// Takes every weight by name and shape, the matrices as `M` holds them, the rows of
    /// each query and key head in the kernels' order (`HeadOrder`: `qk_permuted` says the
    /// files' Q and K rows are in the interleaved order GGUF converters write for `llama`
    /// models). The caller has run `ModelWeights::check`.
    pub fn load(c: &Config, w: &Weights, qk_permuted: bool) -> Result<ModelWeights<M>> {
        let (dim, q_dim, kv_dim, ffn) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let order = HeadOrder::new(c, qk_permuted);
        let names = NormNames::of(c);
        // An RMSNorm's factors as the forward multiplies by them.
        let norm = |name: &str, n: usize| -> Result<Vec<f32>> {
            let mut v = w.take(name, &[n])?;
            if c.norm_offset != 0.0 {
                v.iter_mut().for_each(|v| *v += c.norm_offset);
            }
            Ok(v)
        };
        let layers = (0..c.n_layers)
            .into_par_iter()
            .map(|l| {
                let name = |s: &str| format!("model.layers.{l}.{s}");
                let take = |s: &str, rows: usize, cols: usize| M::take(w, &name(s), rows, cols);
                let vector = |s: &str, n: usize| w.take(&name(s), &[n]);
                let vector_2d = |s: &str, rows: usize, cols: usize| w.take(&name(s), &[rows, cols]);
                let bias = |s: &str, n: usize| -> Result<Option<Vec<f32>>> {
                    if c.qkv_bias {
                        vector(s, n).map(Some)
                    } else {
                        Ok(None)
                    }
                };
                let head_norm = |s: &str| -> Result<Option<Vec<f32>>> {
                    match c.qk_norm {
                        true => norm(&name(s), c.head_dim).map(Some),
                        false => Ok(None),
                    }
                };
                let post_norm = |s: Option<&str>| s.map(|s| norm(&name(s), dim)).transpose();
                let mut wq = take("self_attn.q_proj.weight", q_dim, dim)?;
                let mut wk = take("self_attn.k_proj.weight", kv_dim, dim)?;
                let mut bq = bias("self_attn.q_proj.bias", q_dim)?;
                let mut bk = bias("self_attn.k_proj.bias", kv_dim)?;
                if !order.is_identity() {
                    wq = wq.reorder_heads(c.n_heads, &order);
                    wk = wk.reorder_heads(c.n_kv_heads, &order);
                    bq = bq.map(|b| reorder_rows(&b, c.n_heads, &order));
                    bk = bk.map(|b| reorder_rows(&b, c.n_kv_heads, &order));
                }
                Ok(LayerWeights {
                    attn_norm: norm(&name(names.attn), dim)?,
                    wq,
                    wk,
                    wv: take("self_attn.v_proj.weight", kv_dim, dim)?,
                    bq,
                    bk,
                    bv: bias("self_attn.v_proj.bias", kv_dim)?,
                    // The query's norm carries the attention's scale (`Config::query_scale`).
                    q_norm: head_norm("self_attn.q_norm.weight")?.map(|n| {
                        let n: Vec<f32> = n.iter().map(|v| v * c.query_scale).collect();
                        reorder_rows(&n, 1, &order)
                    }),
                    k_norm: head_norm("self_attn.k_norm.weight")?
                        .map(|n| reorder_rows(&n, 1, &order)),
                    wo: take("self_attn.o_proj.weight", dim, q_dim)?,
                    post_attn_norm: post_norm(names.post_attn)?,
                    ffn_norm: norm(&name(names.ffn), dim)?,
                    post_ffn_norm: post_norm(names.post_ffn)?,
                    mlp: match c.moe {
                        None => Mlp::Dense {
                            gate: take("mlp.gate_proj.weight", ffn, dim)?,
                            up: take("mlp.up_proj.weight", ffn, dim)?,
                            down: take("mlp.down_proj.weight", dim, ffn)?,
                        },
                        Some(m) => {
                            let experts = |part: &str, rows, cols| {
                                (0..m.n_experts)
                                    .map(|e| {
                                        take(&format!("mlp.experts.{e}.{part}.weight"), rows, cols)
                                    })
                                    .collect::<Result<Vec<M>>>()
                            };
                            let f = m.expert_ffn_dim;
                            Mlp::Experts(Experts {
                                moe: m,
                                router: vector_2d("mlp.gate.weight", m.n_experts, dim)?,
                                gate: experts("gate_proj", f, dim)?,
                                up: experts("up_proj", f, dim)?,
                                down: experts("down_proj", dim, f)?,
                            })
                        }
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let lm_head = if c.tie_embeddings {
            None
        } else {
            Some(M::take(w, "lm_head.weight", c.vocab_size, dim)?)
        };
        // Divisors of RoPE's frequencies: zero, negative or NaN ones turn every angle to NaN.
        let rope_freq_factors = w.take_optional("rope_freqs.weight", &[c.head_dim / 2])?;
        if let Some(bad) = rope_freq_factors
            .iter()
            .flatten()
            .find(|f| !(**f > 0.0 && f.is_finite()))
        {
            return Err(Error::WeightMismatch {
                name: "rope_freqs.weight".into(),
                want: "positive finite factors".into(),
                found: bad.to_string(),
            });
        }
        Ok(ModelWeights {
            embed: M::take(w, "model.embed_tokens.weight", c.vocab_size, dim)?,
            layers,
            final_norm: norm("model.norm.weight", dim)?,
            lm_head,
            rope_freq_factors,
            stored: None,
        })
    }
}

/// Where each row of a query or key head comes from: the kernels pair dimension `i` of a
/// head with `i + head_dim / 2` for RoPE, and the files may order a head's rows otherwise.
/// - GGUF converters interleave Q and K rows of `llama` models (made for interleaved RoPE):
///   within each head, stored row `2i + j` is Hugging Face row `j * d/2 + i`.
/// - A model that turns only `r < d` dimensions (`partial_rotary_factor`) pairs `i` with
///   `i + r/2`: its turning pair `(i, i + r/2)` moves to `(i, i + d/2)`, and the dimensions
///   that stay fill the rest in order (`rope.rs` turns them by nothing). q and k move alike,
///   so their dot products, and attention, are unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadOrder {
    pub head_dim: usize,
    pub rotary_dim: usize,
    /// The files' rows are in GGUF's interleaved `llama` order.
    pub interleaved: bool,
}

impl HeadOrder {
    pub fn new(c: &Config, interleaved: bool) -> HeadOrder {
        HeadOrder {
            head_dim: c.head_dim,
            rotary_dim: c.rotary_dim,
            interleaved,
        }
    }

    /// The files' rows are already the kernels'.
    pub fn is_identity(&self) -> bool {
        !self.interleaved && self.rotary_dim == self.head_dim
    }

    /// The row of a head in the files that row `r` of the kernels' order takes.
    pub fn source(&self, r: usize) -> usize {
        let (half, turning) = (self.head_dim / 2, self.rotary_dim / 2);
        let (i, upper) = (r % half, r / half);
        // Hugging Face's row for the kernels' row r.
        let hf = if i < turning {
            i + upper * turning
        } else {
            self.rotary_dim + (i - turning) + upper * (half - turning)
        };
        match self.interleaved {
            true => 2 * (hf % half) + hf / half,
            false => hf,
        }
    }
}

/// The rows of `n_heads` heads, each head's in the kernels' order (`HeadOrder`).
/// `w`: `[n_heads * head_dim, n_in]` (any `n_in`, including 1 for a bias or a norm).
/// Generic over the element, so that rows of GGUF block bytes move the same way.
pub fn reorder_rows<T: Copy + Default>(w: &[T], n_heads: usize, order: &HeadOrder) -> Vec<T> {
    let d = order.head_dim;
    let n_in = w.len() / (n_heads * d);
    let mut out = vec![T::default(); w.len()];
    for h in 0..n_heads {
        for r in 0..d {
            let (src, dst) = ((h * d + order.source(r)) * n_in, (h * d + r) * n_in);
            out[dst..dst + n_in].copy_from_slice(&w[src..src + n_in]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reorder_inverts_the_converters_interleave() {
        let gguf = HeadOrder {
            head_dim: 4,
            rotary_dim: 4,
            interleaved: true,
        };
        // One head of dim 4: original rows r0 r1 r2 r3 are stored as r0 r2 r1 r3.
        let stored = [0.0, 2.0, 1.0, 3.0, 10.0, 12.0, 11.0, 13.0];
        assert_eq!(
            reorder_rows(&stored, 2, &gguf),
            vec![0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0]
        );
        // Two columns per row travel with their row.
        let stored = [0.0, 0.5, 2.0, 2.5, 1.0, 1.5, 3.0, 3.5];
        assert_eq!(
            reorder_rows(&stored, 1, &gguf),
            vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
        );
        // Rows of bytes (GGUF blocks) move as rows of floats do.
        let bytes: [u8; 8] = [0, 0, 2, 2, 1, 1, 3, 3];
        assert_eq!(reorder_rows(&bytes, 1, &gguf), vec![0, 0, 1, 1, 2, 2, 3, 3]);
    }

    #[test]
    fn reorder_puts_partial_rotary_pairs_half_a_head_apart() {
        // A head of 8 turning its first 4: HF pairs (0, 2) and (1, 3), and 4..8 stay. The
        // kernels pair (i, i + 4): rows 0 1 | 4 5 turn, 2 3 | 6 7 stay.
        let order = HeadOrder {
            head_dim: 8,
            rotary_dim: 4,
            interleaved: false,
        };
        let hf: Vec<f32> = (0..8).map(|r| r as f32).collect();
        assert_eq!(
            reorder_rows(&hf, 1, &order),
            vec![0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]
        );
        assert!(!order.is_identity());
        let full = HeadOrder {
            rotary_dim: 8,
            ..order
        };
        assert!(full.is_identity() && reorder_rows(&hf, 1, &full) == hf);
    }
}
