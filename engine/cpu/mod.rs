//! The CPU reference backend: the forward pass in plain f32, top to bottom as the model
//! computes it. Every step is a function in `ops`, the twin of a GPU kernel, called through
//! `timed::Ops`, which times it when `rustle profile` asks. `fast` is the backend
//! `--device cpu` runs: weights as stored, SIMD and threads.

pub mod experts;
pub mod fast;
pub mod gemv_experts;
pub mod kv_fp8;
pub mod ops;
pub mod quant;
pub mod quant_mma;
pub mod tensor_parallel;
pub mod timed;
mod twins;

use timed::Ops;

use crate::batch::Batch;
use crate::config::{Activation, Config};
use crate::kernel_args::{Heads, Paged};
use crate::kv_cache::KvCache;
use crate::model::{Mlp, ModelWeights};
use crate::rope::RopeTables;

/// Activations for up to `max_tokens` tokens in one forward pass, allocated once.
pub struct Scratch {
    /// Tokens one forward pass may hold.
    pub max_tokens: usize,
    /// `[max_tokens, dim]`: the residual stream
    x: Vec<f32>,
    /// `[max_tokens, dim]`: normalised input of a block, then a block's output
    xb: Vec<f32>,
    /// `[max_tokens, q_dim]`
    q: Vec<f32>,
    /// `[max_tokens, kv_dim]`
    k: Vec<f32>,
    /// `[max_tokens, kv_dim]`
    v: Vec<f32>,
    /// `[max_tokens, q_dim]`: attention output, all heads
    att: Vec<f32>,
    /// `[max_tokens, ffn_dim]`
    gate: Vec<f32>,
    /// `[max_tokens, ffn_dim]`
    up: Vec<f32>,
    /// `[max_tokens, ffn_dim]`: silu(gate) * up
    hidden: Vec<f32>,
    /// `[max_tokens, dim]`: final-normed rows whose logits are wanted; a block's output
    /// before its post-norm (Gemma 3)
    head_in: Vec<f32>,
    /// `[rows, vocab]`: grows to the largest request, then is reused
    logits: Vec<f32>,
}

impl Scratch {
    pub fn new(c: &Config, max_tokens: usize) -> Scratch {
        let z = |width: usize| vec![0.0; max_tokens * width];
        Scratch {
            max_tokens,
            x: z(c.dim),
            xb: z(c.dim),
            q: z(c.q_dim()),
            k: z(c.kv_dim()),
            v: z(c.kv_dim()),
            att: z(c.q_dim()),
            gate: z(c.ffn_dim),
            up: z(c.ffn_dim),
            hidden: z(c.ffn_dim),
            head_in: z(c.dim),
            logits: vec![0.0; c.vocab_size],
        }
    }
}

/// The CPU backend's state: f32 weights, the KV pool, RoPE tables and activations.
pub struct CpuBackend {
    pub weights: ModelWeights,
    pub kv: KvCache,
    pub rope: RopeTables,
    /// The local layers' RoPE, where they have their own (`Config::sliding`).
    pub rope_local: Option<RopeTables>,
    pub scratch: Scratch,
    /// The operations, timed while a profile is recorded.
    pub ops: Ops,
}

impl CpuBackend {
    pub fn forward(&mut self, c: &Config, batch: &Batch) -> &[f32] {
        let ropes = Ropes {
            global: &self.rope,
            local: self.rope_local.as_ref(),
        };
        forward(
            c,
            &self.weights,
            &ropes,
            &mut self.kv,
            &mut self.scratch,
            &mut self.ops,
            batch,
        )
    }
}

/// The RoPE tables of the global layers, and of the local ones where they differ.
#[derive(Clone, Copy)]
pub struct Ropes<'a> {
    pub global: &'a RopeTables,
    pub local: Option<&'a RopeTables>,
}

impl<'a> Ropes<'a> {
    /// Layer `layer`'s table.
    pub fn of_layer(&self, c: &Config, layer: usize) -> &'a RopeTables {
        match (c.window(layer), self.local) {
            (Some(_), Some(local)) => local,
            _ => self.global,
        }
    }
}

/// Runs `batch` through the model: writes its keys and values into `kv`, and returns the
/// logits of the rows `batch.logit_rows` names, `[rows, vocab]`.
pub fn forward<'s>(
    c: &Config,
    w: &ModelWeights,
    ropes: &Ropes,
    kv: &mut KvCache,
    s: &'s mut Scratch,
    o: &mut Ops,
    batch: &Batch,
) -> &'s [f32] {
    let n = batch.tokens.len();
    let (dim, q_dim, kv_dim, ffn) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
    let x = &mut s.x[..n * dim];
    let xb = &mut s.xb[..n * dim];
    let q = &mut s.q[..n * q_dim];
    let k = &mut s.k[..n * kv_dim];
    let v = &mut s.v[..n * kv_dim];
    let att = &mut s.att[..n * q_dim];
    let gate = &mut s.gate[..n * ffn];
    let up = &mut s.up[..n * ffn];
    let hidden = &mut s.hidden[..n * ffn];
    let unnormed = &mut s.head_in[..n * dim];

    o.embedding_f32(x, &w.embed, &batch.tokens, dim);
    if let Some(scale) = c.embed_scale {
        o.scale_f32(x, scale);
    }
    for (l, lw) in w.layers.iter().enumerate() {
        let rope = ropes.of_layer(c, l);
        // Attention: x += o_proj(attention(rope(q), rope(k), v)) over the normed stream (q
        // and k each normed by head first where the model says: Qwen3).
        o.rmsnorm_f32(xb, x, &lw.attn_norm, c.rms_eps);
        o.matmul_f32(q, xb, &lw.wq, lw.bq.as_deref(), dim);
        o.matmul_f32(k, xb, &lw.wk, lw.bk.as_deref(), dim);
        o.matmul_f32(v, xb, &lw.wv, lw.bv.as_deref(), dim);
        if let (Some(q_norm), Some(k_norm)) = (&lw.q_norm, &lw.k_norm) {
            o.head_rmsnorm_f32(q, q_norm, c.rms_eps);
            o.head_rmsnorm_f32(k, k_norm, c.rms_eps);
        }
        o.rope_f32(
            q,
            &batch.positions,
            &rope.cos,
            &rope.sin,
            c.n_heads,
            c.head_dim,
        );
        o.rope_f32(
            k,
            &batch.positions,
            &rope.cos,
            &rope.sin,
            c.n_kv_heads,
            c.head_dim,
        );
        let (k_cache, v_cache) = kv.layer_mut(l);
        o.kv_write_f32(k_cache, v_cache, k, v, &batch.slots, kv_dim);
        let mut paged = Paged::of_batch(batch, q, kv.layer(l), Heads::of(c));
        paged.shape = paged.shape.windowed(c.window(l));
        o.attention_f32(att, &paged);
        o.matmul_f32(xb, att, &lw.wo, None, q_dim);
        if let Some(post) = &lw.post_attn_norm {
            unnormed.copy_from_slice(xb);
            o.rmsnorm_f32(xb, unnormed, post, c.rms_eps);
        }
        o.residual_add_f32(x, xb);

        // MLP: x += down(silu(gate(x)) * up(x)) over the normed stream.
        o.rmsnorm_f32(xb, x, &lw.ffn_norm, c.rms_eps);
        match &lw.mlp {
            Mlp::Dense {
                gate: w_gate,
                up: w_up,
                down: w_down,
            } => {
                o.matmul_f32(gate, xb, w_gate, None, dim);
                o.matmul_f32(up, xb, w_up, None, dim);
                match c.activation {
                    Activation::Silu => o.swiglu_f32(hidden, gate, up),
                    Activation::GeluTanh => o.geglu_f32(hidden, gate, up),
                }
                o.matmul_f32(xb, hidden, w_down, None, ffn);
            }
            Mlp::Experts(e) => {
                let normed = xb.to_vec();
                experts::experts_f32(o, xb, &normed, e, dim);
            }
        }
        if let Some(post) = &lw.post_ffn_norm {
            unnormed.copy_from_slice(xb);
            o.rmsnorm_f32(xb, unnormed, post, c.rms_eps);
        }
        o.residual_add_f32(x, xb);
    }

    // Only the rows that need logits go through the final norm and the (large) head.
    let rows = batch.logit_rows.len();
    let head_in = &mut s.head_in[..rows * dim];
    for (dst, &r) in head_in.chunks_exact_mut(dim).zip(&batch.logit_rows) {
        let r = r as usize;
        o.rmsnorm_f32(dst, &x[r * dim..(r + 1) * dim], &w.final_norm, c.rms_eps);
    }
    s.logits.resize(rows * c.vocab_size, 0.0);
    o.matmul_f32(&mut s.logits, head_in, w.head(), None, dim);
    &s.logits
}
