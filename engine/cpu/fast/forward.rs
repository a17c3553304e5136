//! The fast backend's forward pass, top to bottom as the model computes it; the same steps
//! as the reference's (`cpu::forward`), on weights as stored and a bf16 KV cache, every
//! step spread over the pool's threads where it has work enough to share.

use rayon::prelude::*;

use super::attention::{attention_bf16, kv_write_bf16};
use super::experts::experts;
use super::kv::KvCacheBf16;
use super::math::swiglu_f32;
use super::matmul::{Input, Job, timed_matmul};
use super::timed::{self, Recorder};
use super::unpack::row_f32;
use super::weights::FastWeights;
use crate::batch::Batch;
use crate::config::{Activation, Config};
use crate::cpu::Ropes;
use crate::cpu::ops::{
    Heads, Paged, geglu_f32, head_rmsnorm_f32, residual_add_f32, rmsnorm_f32, rope_f32, scale_f32,
};
use crate::model::Mlp;
use crate::traffic;

/// Rows per task for the row-wise steps (norms, SwiGLU, residuals): below this many tokens
/// a step runs on one thread, where sharing it would cost more than it saves.
const ROWS_PER_TASK: usize = 16;

/// Activations for up to `max_tokens` tokens in one forward pass, allocated once.
pub struct Scratch {
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
    /// `[max_tokens, dim]`: final-normed rows whose logits are wanted
    head_in: Vec<f32>,
    /// `[rows, vocab]`: grows to the largest request, then is reused
    logits: Vec<f32>,
    /// A matmul's input, quantized or in bf16 (`matmul::Input`)
    pub input: Input,
    /// `[n]` which rows of the next pass are generated tokens, where the caller said
    /// (`FastBackend::set_generated`); emptied by the pass
    pub generated: Vec<bool>,
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
            input: Input::default(),
            generated: vec![],
        }
    }
}

/// Runs `batch` through the model: writes its keys and values into `kv`, and returns the
/// logits of the rows `batch.logit_rows` names, `[rows, vocab]`. Call it inside the pool
/// whose threads should share the work. `rec` times each step while a profile is recorded.
pub fn forward<'s>(
    c: &Config,
    w: &FastWeights,
    ropes: &Ropes,
    kv: &mut KvCacheBf16,
    s: &'s mut Scratch,
    rec: &mut Recorder,
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
    let input = &mut s.input;
    // The caller's flags hold for this pass only (and only when they cover it).
    input.generated.clear();
    if s.generated.len() == n {
        input.generated.extend_from_slice(&s.generated);
    }
    s.generated.clear();
    let pos = &batch.positions;

    rec.time(
        "embedding",
        || timed::embedding(&w.embed, n),
        || embedding(x, w, &batch.tokens, dim),
    );
    if let Some(scale) = c.embed_scale {
        scale_f32(x, scale);
    }
    for (l, lw) in w.layers.iter().enumerate() {
        let rope = ropes.of_layer(c, l);
        // Attention: x += o_proj(attention(rope(q), rope(k), v)) over the normed stream (q
        // and k each normed by head first where the model says: Qwen3).
        let norm = || traffic::rmsnorm_f32(n, dim);
        rec.time("rmsnorm_f32", norm, || {
            rmsnorm(xb, x, &lw.attn_norm, c.rms_eps)
        });
        let mut qkv = [
            Job {
                w: &lw.wq,
                bias: lw.bq.as_deref(),
                out: q,
            },
            Job {
                w: &lw.wk,
                bias: lw.bk.as_deref(),
                out: k,
            },
            Job {
                w: &lw.wv,
                bias: lw.bv.as_deref(),
                out: v,
            },
        ];
        timed_matmul(rec, &mut qkv, xb, dim, input);
        let (hq, hk, hd) = (c.n_heads, c.n_kv_heads, c.head_dim);
        if let (Some(q_norm), Some(k_norm)) = (&lw.q_norm, &lw.k_norm) {
            rec.time(
                "head_rmsnorm_f32",
                || traffic::rmsnorm_f32(n * (hq + hk), hd),
                || {
                    head_rmsnorm_f32(q, q_norm, c.rms_eps);
                    head_rmsnorm_f32(k, k_norm, c.rms_eps);
                },
            );
        }
        rec.time(
            "rope_f32",
            || traffic::rope_f32(n, hq + hk, hd),
            || {
                rope_f32(q, pos, &rope.cos, &rope.sin, hq, hd);
                rope_f32(k, pos, &rope.cos, &rope.sin, hk, hd);
            },
        );
        let (k_cache, v_cache) = kv.layer_mut(l);
        rec.time(
            "kv_write_bf16",
            || timed::kv_write_bf16(n, kv_dim),
            || kv_write_bf16(k_cache, v_cache, k, v, &batch.slots, kv_dim),
        );
        let mut paged = Paged::of_batch(batch, q, kv.layer(l), Heads::new(hq, hk, hd));
        paged.shape = paged.shape.windowed(c.window(l));
        let shape = paged.shape;
        let attended = || {
            pos.iter()
                .map(|&p| p as usize + 1 - shape.first_position(p as usize))
                .sum()
        };
        rec.time(
            "attention_bf16",
            || traffic::attention_per_head(attended(), n, hq, hk, hd, 2),
            || attention_bf16(att, &paged),
        );
        timed_matmul(
            rec,
            &mut [Job {
                w: &lw.wo,
                bias: None,
                out: xb,
            }],
            att,
            q_dim,
            input,
        );
        if let Some(post) = &lw.post_attn_norm {
            unnormed.copy_from_slice(xb);
            rec.time("rmsnorm_f32", norm, || {
                rmsnorm(xb, unnormed, post, c.rms_eps)
            });
        }
        let residual = || traffic::residual_add_f32(n * dim);
        rec.time("residual_add_f32", residual, || {
            rows(x, xb, dim, residual_add_f32)
        });

        // MLP: x += down(silu(gate(x)) * up(x)) over the normed stream.
        rec.time("rmsnorm_f32", norm, || {
            rmsnorm(xb, x, &lw.ffn_norm, c.rms_eps)
        });
        match &lw.mlp {
            Mlp::Dense {
                gate: w_gate,
                up: w_up,
                down: w_down,
            } => {
                let mut gate_up = [
                    Job {
                        w: w_gate,
                        bias: None,
                        out: gate,
                    },
                    Job {
                        w: w_up,
                        bias: None,
                        out: up,
                    },
                ];
                timed_matmul(rec, &mut gate_up, xb, dim, input);
                match c.activation {
                    Activation::Silu => rec.time(
                        "swiglu_f32",
                        || traffic::swiglu_f32(n * ffn),
                        || swiglu(hidden, gate, up, ffn),
                    ),
                    Activation::GeluTanh => rec.time(
                        "geglu_f32",
                        || traffic::swiglu_f32(n * ffn),
                        || geglu(hidden, gate, up, ffn),
                    ),
                }
                let mut down = [Job {
                    w: w_down,
                    bias: None,
                    out: xb,
                }];
                timed_matmul(rec, &mut down, hidden, ffn, input);
            }
            Mlp::Experts(e) => {
                let normed = xb.to_vec();
                experts(rec, xb, &normed, e, input);
            }
        }
        if let Some(post) = &lw.post_ffn_norm {
            unnormed.copy_from_slice(xb);
            rec.time("rmsnorm_f32", norm, || {
                rmsnorm(xb, unnormed, post, c.rms_eps)
            });
        }
        rec.time("residual_add_f32", residual, || {
            rows(x, xb, dim, residual_add_f32)
        });
    }

    // Only the rows that need logits go through the final norm and the (large) head.
    let n_rows = batch.logit_rows.len();
    let head_in = &mut s.head_in[..n_rows * dim];
    rec.time(
        "rmsnorm_f32",
        || traffic::rmsnorm_f32(n_rows, dim),
        || {
            for (dst, &r) in head_in.chunks_exact_mut(dim).zip(&batch.logit_rows) {
                let r = r as usize;
                rmsnorm_f32(dst, &x[r * dim..(r + 1) * dim], &w.final_norm, c.rms_eps);
            }
        },
    );
    s.logits.resize(n_rows * c.vocab_size, 0.0);
    // The head's rows are the logit rows: their own flags.
    let input = &mut s.input;
    if input.generated.len() == n {
        let flags: Vec<bool> = batch
            .logit_rows
            .iter()
            .map(|&r| input.generated[r as usize])
            .collect();
        input.generated = flags;
    }
    timed_matmul(
        rec,
        &mut [Job {
            w: w.head(),
            bias: None,
            out: &mut s.logits,
        }],
        head_in,
        dim,
        input,
    );
    &s.logits
}

/// `out[t, :]` = the embedding's row `tokens[t]`, dequantized.
fn embedding(out: &mut [f32], w: &FastWeights, tokens: &[u32], dim: usize) {
    let runs = dim.div_ceil(super::unpack::RUN);
    let (mut u, mut scale, mut offset) = (vec![0u8; dim], vec![0f32; runs], vec![0f32; runs]);
    for (row, &t) in out.chunks_exact_mut(dim).zip(tokens) {
        row_f32(&w.embed, t as usize, row, &mut u, &mut scale, &mut offset);
    }
}

/// `f` over matching rows of `a` and `b` (`[n, width]` each), in tasks of `ROWS_PER_TASK`.
fn rows(a: &mut [f32], b: &[f32], width: usize, f: impl Fn(&mut [f32], &[f32]) + Sync) {
    let chunk = ROWS_PER_TASK * width;
    if a.len() <= chunk {
        return f(a, b);
    }
    a.par_chunks_mut(chunk)
        .zip(b.par_chunks(chunk))
        .for_each(|(a, b)| f(a, b));
}

/// `rmsnorm_f32` over each token's row.
fn rmsnorm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    rows(out, x, weight.len(), |o, x| rmsnorm_f32(o, x, weight, eps));
}

/// `swiglu_f32` over each token's row.
fn swiglu(out: &mut [f32], gate: &[f32], up: &[f32], ffn: usize) {
    gated(out, gate, up, ffn, swiglu_f32)
}

/// `geglu_f32` over each token's row.
fn geglu(out: &mut [f32], gate: &[f32], up: &[f32], ffn: usize) {
    gated(out, gate, up, ffn, geglu_f32)
}

/// `f(out, gate, up)` over the tokens' rows, in tasks of `ROWS_PER_TASK`.
fn gated(
    out: &mut [f32],
    gate: &[f32],
    up: &[f32],
    ffn: usize,
    f: impl Fn(&mut [f32], &[f32], &[f32]) + Sync,
) {
    let chunk = ROWS_PER_TASK * ffn;
    if out.len() <= chunk {
        return f(out, gate, up);
    }
    out.par_chunks_mut(chunk)
        .zip(gate.par_chunks(chunk).zip(up.par_chunks(chunk)))
        .for_each(|(o, (g, u))| f(o, g, u));
}
