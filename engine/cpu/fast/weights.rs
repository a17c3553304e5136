//! The fast backend's weights: every matrix as the file stores it (GGUF blocks stay
//! quantized, bf16 and f16 stay 16-bit), norms and biases in f32. Memory is the file's
//! tensor bytes, give or take the f32 copies of the small vectors.

use rayon::prelude::*;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::weights::{DType, Weights};

/// One matrix `[rows, cols]` in its stored type: each row is `cols / block_len` blocks back
/// to back, `row_bytes` bytes (GGUF's blocks run along a row, so a row stands alone).
pub struct Matrix {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    /// `[rows, row_bytes]`
    pub bytes: Vec<u8>,
}

impl Matrix {
    /// Row `r`'s stored bytes.
    pub fn row(&self, r: usize) -> &[u8] {
        &self.bytes[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// A matrix over `bytes`, checked: the type must be one rustle reads, and the bytes must
    /// be exactly `rows` rows of whole blocks.
    pub fn new(name: &str, dtype: DType, rows: usize, cols: usize, bytes: Vec<u8>) -> Result<Self> {
        let bad = |found: String| Error::WeightMismatch {
            name: name.to_owned(),
            want: format!("[{rows}, {cols}] in whole blocks"),
            found,
        };
        if !dtype.is_loadable() {
            return Err(bad(format!("{dtype}, which rustle does not read")));
        }
        if !cols.is_multiple_of(dtype.block_len()) {
            return Err(bad(format!(
                "{dtype} rows of {cols}, not a multiple of its block of {}",
                dtype.block_len()
            )));
        }
        let row_bytes = cols / dtype.block_len() * dtype.block_bytes();
        if bytes.len() != rows * row_bytes {
            return Err(bad(format!("{} bytes of {dtype}", bytes.len())));
        }
        Ok(Matrix {
            dtype,
            rows,
            cols,
            row_bytes,
            bytes,
        })
    }
}

/// One transformer block.
pub struct LayerWeights {
    /// `[dim]`
    pub attn_norm: Vec<f32>,
    /// `[q_dim, dim]`, `[kv_dim, dim]`, `[kv_dim, dim]`
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    /// `[q_dim]`, `[kv_dim]`, `[kv_dim]`: Qwen2's projection biases.
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    /// `[dim, q_dim]`
    pub wo: Matrix,
    /// `[dim]`
    pub ffn_norm: Vec<f32>,
    /// `[ffn_dim, dim]`
    pub w_gate: Matrix,
    /// `[ffn_dim, dim]`
    pub w_up: Matrix,
    /// `[dim, ffn_dim]`
    pub w_down: Matrix,
}

pub struct FastWeights {
    /// `[vocab, dim]`
    pub embed: Matrix,
    pub layers: Vec<LayerWeights>,
    /// `[dim]`
    pub final_norm: Vec<f32>,
    /// `[vocab, dim]`; `None` when the head is tied to the embedding.
    pub lm_head: Option<Matrix>,
    /// `[head_dim / 2]`: Llama 3.1's RoPE divisors, when a GGUF file stores them.
    pub rope_freq_factors: Option<Vec<f32>>,
}

impl FastWeights {
    /// The output projection: the head, or the embedding when they are tied.
    pub fn head(&self) -> &Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    fn matrices(&self) -> impl Iterator<Item = &Matrix> {
        let layers = self
            .layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
        std::iter::once(&self.embed)
            .chain(self.lm_head.as_ref())
            .chain(layers)
    }

    fn vectors(&self) -> impl Iterator<Item = &Vec<f32>> {
        let layers = self.layers.iter().flat_map(|l| {
            [
                Some(&l.attn_norm),
                Some(&l.ffn_norm),
                l.bq.as_ref(),
                l.bk.as_ref(),
                l.bv.as_ref(),
            ]
            .into_iter()
            .flatten()
        });
        std::iter::once(&self.final_norm)
            .chain(self.rope_freq_factors.as_ref())
            .chain(layers)
    }

    /// Bytes this backend holds for the weights: every matrix as stored, every vector in f32.
    pub fn held_bytes(&self) -> usize {
        self.matrices().map(|m| m.bytes.len()).sum::<usize>()
            + self.vectors().map(|v| 4 * v.len()).sum::<usize>()
    }

    /// Bytes a forward pass reads from the weights: every matrix and vector once, the head
    /// once; the embedding only for the rows it looks up, counted as none (unless tied).
    pub fn bytes_per_step(&self) -> usize {
        let embed = if self.lm_head.is_none() {
            0 // read as the head, counted there
        } else {
            self.embed.bytes.len()
        };
        self.held_bytes() - embed - 4 * self.rope_freq_factors.as_ref().map_or(0, |f| f.len())
    }

    /// Takes every weight by name and shape, matrices in their stored type. `qk_permuted`:
    /// the file's Q and K rows are in the interleaved order GGUF converters write for `llama`
    /// models; put them back (rows move whole, so blocks are untouched). The caller has run
    /// `ModelWeights::check`.
    pub fn load(c: &Config, w: &Weights, qk_permuted: bool) -> Result<FastWeights> {
        let (dim, q_dim, kv_dim, ffn) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let layers = (0..c.n_layers)
            .into_par_iter()
            .map(|l| {
                let name = |s: &str| format!("model.layers.{l}.{s}");
                let take = |s: &str, rows: usize, cols: usize| matrix(w, &name(s), rows, cols);
                let vector = |s: &str, n: usize| w.take(&name(s), &[n]);
                let bias = |s: &str, n: usize| -> Result<Option<Vec<f32>>> {
                    if c.qkv_bias {
                        vector(s, n).map(Some)
                    } else {
                        Ok(None)
                    }
                };
                let mut wq = take("self_attn.q_proj.weight", q_dim, dim)?;
                let mut wk = take("self_attn.k_proj.weight", kv_dim, dim)?;
                let mut bq = bias("self_attn.q_proj.bias", q_dim)?;
                let mut bk = bias("self_attn.k_proj.bias", kv_dim)?;
                if qk_permuted {
                    use crate::model::unpermute_rows;
                    unpermute_matrix(&mut wq, c.n_heads, c.head_dim);
                    unpermute_matrix(&mut wk, c.n_kv_heads, c.head_dim);
                    bq = bq.map(|b| unpermute_rows(&b, c.n_heads, c.head_dim));
                    bk = bk.map(|b| unpermute_rows(&b, c.n_kv_heads, c.head_dim));
                }
                Ok(LayerWeights {
                    attn_norm: vector("input_layernorm.weight", dim)?,
                    wq,
                    wk,
                    wv: take("self_attn.v_proj.weight", kv_dim, dim)?,
                    bq,
                    bk,
                    bv: bias("self_attn.v_proj.bias", kv_dim)?,
                    wo: take("self_attn.o_proj.weight", dim, q_dim)?,
                    ffn_norm: vector("post_attention_layernorm.weight", dim)?,
                    w_gate: take("mlp.gate_proj.weight", ffn, dim)?,
                    w_up: take("mlp.up_proj.weight", ffn, dim)?,
                    w_down: take("mlp.down_proj.weight", dim, ffn)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let lm_head = if c.tie_embeddings {
            None
        } else {
            Some(matrix(w, "lm_head.weight", c.vocab_size, dim)?)
        };
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
        Ok(FastWeights {
            embed: matrix(w, "model.embed_tokens.weight", c.vocab_size, dim)?,
            layers,
            final_norm: w.take("model.norm.weight", &[dim])?,
            lm_head,
            rope_freq_factors,
        })
    }
}

/// The tensor `name`, `[rows, cols]`, its bytes copied as stored.
fn matrix(w: &Weights, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
    let t = w.tensors.get(name).ok_or_else(|| Error::MissingWeight {
        name: name.to_owned(),
    })?;
    if t.shape != [rows, cols] {
        return Err(Error::WeightMismatch {
            name: name.to_owned(),
            want: format!("[{rows}, {cols}]"),
            found: format!("{:?} {}", t.shape, t.dtype),
        });
    }
    let bytes = w
        .files
        .get(t.file)
        .and_then(|f| f.get(t.offset..t.offset.checked_add(t.n_bytes)?))
        .ok_or_else(|| Error::WeightMismatch {
            name: name.to_owned(),
            want: format!("[{rows}, {cols}]"),
            found: format!("bytes {}.. outside its file", t.offset),
        })?;
    Matrix::new(name, t.dtype, rows, cols, bytes.to_vec())
}

/// `model::unpermute_rows` on stored rows: within each head, stored row `2i + j` is
/// original row `j * d/2 + i`.
fn unpermute_matrix(m: &mut Matrix, n_heads: usize, head_dim: usize) {
    let rb = m.row_bytes;
    let half = head_dim / 2;
    let mut out = vec![0u8; m.bytes.len()];
    for h in 0..n_heads {
        for i in 0..half {
            for j in 0..2 {
                let src = (h * head_dim + 2 * i + j) * rb;
                let dst = (h * head_dim + j * half + i) * rb;
                out[dst..dst + rb].copy_from_slice(&m.bytes[src..src + rb]);
            }
        }
    }
    m.bytes = out;
}
