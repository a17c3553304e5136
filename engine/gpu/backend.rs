//! The model on the GPU: bf16 weights (f32 norms), an f32 paged KV cache, activations for
//! `max_tokens` tokens allocated once, and the forward pass, step for step the CPU's.

use cudarc::driver::CudaSlice;

use super::context::Gpu;
use super::kernels::{In, Out};
use crate::batch::Batch;
use crate::block_manager::{BLOCK_SIZE, blocks_for};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::model::{LayerWeights, ModelWeights};
use crate::rope::RopeTables;

/// Most sequences one forward pass may mix (the block-table buffer is sized for them).
pub const MAX_SEQS: usize = 64;
/// The attention kernel holds a head in registers: at most 8 floats per lane of a warp.
pub const MAX_HEAD_DIM: usize = 256;

/// Whether the GPU kernels can run this model: the GEMV reads 8 weights at a time, so every
/// matrix's input width must be a multiple of 8, and a head must fit the attention kernel.
pub fn check_supported(c: &Config) -> Result<()> {
    let unsupported = |what: String| {
        Err(Error::Gpu(format!(
            "{what}; run this model with --device cpu"
        )))
    };
    if c.head_dim > MAX_HEAD_DIM {
        return unsupported(format!(
            "head_dim {} is over the attention kernel's {MAX_HEAD_DIM}",
            c.head_dim
        ));
    }
    for (name, width) in [
        ("hidden_size", c.dim),
        ("heads * head_dim", c.q_dim()),
        ("intermediate_size", c.ffn_dim),
    ] {
        if !width.is_multiple_of(8) {
            return unsupported(format!(
                "{name} {width} is not a multiple of 8, as the GEMV kernel needs"
            ));
        }
    }
    Ok(())
}

/// Share of the free device memory the KV pool may take by default.
const KV_SHARE_OF_FREE: f64 = 0.9;

struct GpuLayer {
    attn_norm: CudaSlice<f32>,  // [dim]
    wq: CudaSlice<u16>,         // [q_dim, dim] bf16
    wk: CudaSlice<u16>,         // [kv_dim, dim] bf16
    wv: CudaSlice<u16>,         // [kv_dim, dim] bf16
    bq: Option<CudaSlice<f32>>, // [q_dim]
    bk: Option<CudaSlice<f32>>, // [kv_dim]
    bv: Option<CudaSlice<f32>>, // [kv_dim]
    wo: CudaSlice<u16>,         // [dim, q_dim] bf16
    ffn_norm: CudaSlice<f32>,   // [dim]
    w_gate: CudaSlice<u16>,     // [ffn_dim, dim] bf16
    w_up: CudaSlice<u16>,       // [ffn_dim, dim] bf16
    w_down: CudaSlice<u16>,     // [dim, ffn_dim] bf16
}

pub struct GpuBackend {
    pub gpu: Gpu,
    embed: CudaSlice<u16>, // [vocab, dim] bf16
    layers: Vec<GpuLayer>,
    final_norm: CudaSlice<f32>,      // [dim]
    lm_head: Option<CudaSlice<u16>>, // [vocab, dim] bf16; None: tied to `embed`
    /// `[n_layers, n_blocks, BLOCK_SIZE, n_kv_heads, head_dim]`, the CPU cache's layout
    k_cache: CudaSlice<f32>,
    v_cache: CudaSlice<f32>,
    pub n_blocks: usize,
    rope_cos: CudaSlice<f32>, // [max_pos, head_dim / 2]
    rope_sin: CudaSlice<f32>, // [max_pos, head_dim / 2]
    // Activations, [max_tokens, width] each.
    x: CudaSlice<f32>,
    xb: CudaSlice<f32>,
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    att: CudaSlice<f32>,
    gate: CudaSlice<f32>,
    up: CudaSlice<f32>,
    hidden: CudaSlice<f32>,
    head_in: CudaSlice<f32>, // [max_tokens, dim]
    logits: CudaSlice<f32>,  // [max_tokens, vocab]
    // The batch, as the kernels read it: [max_tokens] each, and [MAX_SEQS, max_blocks].
    tokens: CudaSlice<u32>,
    positions: CudaSlice<u32>,
    token_seq: CudaSlice<u32>,
    slots: CudaSlice<u32>,
    block_tables: CudaSlice<u32>,
    logits_host: Vec<f32>,
    max_tokens: usize,
}

/// bf16 bits of each value, rounded to nearest even.
pub fn to_bf16(x: &[f32]) -> Vec<u16> {
    x.iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect()
}

impl GpuBackend {
    /// Uploads the weights, allocates activations for `max_tokens` tokens and a KV pool of
    /// `kv_blocks` blocks, or by default of most of the free memory (up to what `MAX_SEQS`
    /// full contexts need). RoPE tables come later (`set_rope`): their length depends on
    /// the pool's size.
    pub fn new(
        gpu: Gpu,
        c: &Config,
        w: &ModelWeights,
        kv_blocks: Option<usize>,
        max_tokens: usize,
    ) -> Result<GpuBackend> {
        let bf16 = |x: &[f32], what: &str| gpu.upload(&to_bf16(x), what);
        let f32s = |x: &[f32], what: &str| gpu.upload(x, what);
        let layer = |l: usize, lw: &LayerWeights| -> Result<GpuLayer> {
            let what = |s: &str| format!("layer {l} {s}");
            let opt =
                |b: &Option<Vec<f32>>, s: &str| b.as_deref().map(|b| f32s(b, &what(s))).transpose();
            Ok(GpuLayer {
                attn_norm: f32s(&lw.attn_norm, &what("attn_norm"))?,
                wq: bf16(&lw.wq, &what("q_proj"))?,
                wk: bf16(&lw.wk, &what("k_proj"))?,
                wv: bf16(&lw.wv, &what("v_proj"))?,
                bq: opt(&lw.bq, "q bias")?,
                bk: opt(&lw.bk, "k bias")?,
                bv: opt(&lw.bv, "v bias")?,
                wo: bf16(&lw.wo, &what("o_proj"))?,
                ffn_norm: f32s(&lw.ffn_norm, &what("ffn_norm"))?,
                w_gate: bf16(&lw.w_gate, &what("gate_proj"))?,
                w_up: bf16(&lw.w_up, &what("up_proj"))?,
                w_down: bf16(&lw.w_down, &what("down_proj"))?,
            })
        };
        let layers = w
            .layers
            .iter()
            .enumerate()
            .map(|(l, lw)| layer(l, lw))
            .collect::<Result<Vec<_>>>()?;
        let embed = bf16(&w.embed, "the embedding")?;
        let lm_head = w
            .lm_head
            .as_deref()
            .map(|h| bf16(h, "the output head"))
            .transpose()?;
        let final_norm = f32s(&w.final_norm, "the final norm")?;

        let act = |width: usize, what: &str| gpu.zeros::<f32>(max_tokens * width, what);
        let (x, xb, head_in) = (
            act(c.dim, "activations")?,
            act(c.dim, "activations")?,
            act(c.dim, "activations")?,
        );
        let (q, att) = (
            act(c.q_dim(), "activations")?,
            act(c.q_dim(), "activations")?,
        );
        let (k, v) = (
            act(c.kv_dim(), "activations")?,
            act(c.kv_dim(), "activations")?,
        );
        let (gate, up, hidden) = (
            act(c.ffn_dim, "activations")?,
            act(c.ffn_dim, "activations")?,
            act(c.ffn_dim, "activations")?,
        );
        let logits = act(c.vocab_size, "logits")?;
        let ids = |what: &str| gpu.zeros::<u32>(max_tokens, what);

        // The KV pool: what the caller asked, or most of what is left.
        let block_bytes = 2 * c.n_layers * BLOCK_SIZE * c.kv_dim() * size_of::<f32>();
        let n_blocks = match kv_blocks {
            Some(n) => n,
            None => {
                let (free, _) = gpu.memory();
                let affordable = (free as f64 * KV_SHARE_OF_FREE) as usize / block_bytes;
                affordable.min(blocks_for(c.max_seq_len) * MAX_SEQS)
            }
        };
        if n_blocks == 0 {
            let (free, total) = gpu.memory();
            return Err(Error::GpuOutOfMemory {
                what: "one KV-cache block".into(),
                bytes: block_bytes,
                free,
                total,
            });
        }
        let pool = n_blocks * BLOCK_SIZE * c.kv_dim() * c.n_layers;
        let max_blocks = blocks_for(c.max_seq_len).min(n_blocks);
        Ok(GpuBackend {
            k_cache: gpu.zeros(pool, "the KV cache (keys)")?,
            v_cache: gpu.zeros(pool, "the KV cache (values)")?,
            n_blocks,
            rope_cos: gpu.zeros(1, "RoPE tables")?,
            rope_sin: gpu.zeros(1, "RoPE tables")?,
            tokens: ids("the batch")?,
            positions: ids("the batch")?,
            token_seq: ids("the batch")?,
            slots: ids("the batch")?,
            block_tables: gpu.zeros(MAX_SEQS * max_blocks, "block tables")?,
            logits_host: vec![],
            max_tokens,
            embed,
            layers,
            final_norm,
            lm_head,
            x,
            xb,
            q,
            k,
            v,
            att,
            gate,
            up,
            hidden,
            head_in,
            logits,
            gpu,
        })
    }

    pub fn set_rope(&mut self, rope: &RopeTables) -> Result<()> {
        self.rope_cos = self.gpu.upload(&rope.cos, "RoPE tables")?;
        self.rope_sin = self.gpu.upload(&rope.sin, "RoPE tables")?;
        Ok(())
    }

    /// One linear layer for `n` tokens: the GEMV kernel for one, the tiled GEMM for more.
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        gpu: &Gpu,
        out: &mut Out<f32>,
        x: &In<f32>,
        w: &CudaSlice<u16>,
        bias: Option<&CudaSlice<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        let bias = bias.map(|b| b.as_view());
        if n == 1 {
            gpu.gemv_bf16(out, x, &w.as_view(), bias.as_ref(), n_in, n_out)
        } else {
            gpu.gemm_bf16(out, x, &w.as_view(), bias.as_ref(), n, n_in, n_out)
        }
    }

    /// Runs `batch` (at most `max_tokens` tokens) and returns the logits of its
    /// `logit_rows`, `[rows, vocab]`, copied to the host.
    pub fn forward(&mut self, c: &Config, batch: &Batch) -> Result<&[f32]> {
        let n = batch.tokens.len();
        let n_seqs = batch.block_tables.len() / batch.max_blocks.max(1);
        assert!(
            n <= self.max_tokens
                && n_seqs <= MAX_SEQS
                && batch.block_tables.len() <= self.block_tables.len()
        );
        let (dim, q_dim, kv_dim, ffn, vocab) =
            (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim, c.vocab_size);
        let g = &self.gpu;
        let up_err = |e| Error::Gpu(format!("copying the batch to the device: {e}"));
        g.stream
            .memcpy_htod(&batch.tokens, &mut self.tokens.slice_mut(..n))
            .map_err(up_err)?;
        g.stream
            .memcpy_htod(&batch.positions, &mut self.positions.slice_mut(..n))
            .map_err(up_err)?;
        g.stream
            .memcpy_htod(&batch.token_seq, &mut self.token_seq.slice_mut(..n))
            .map_err(up_err)?;
        g.stream
            .memcpy_htod(&batch.slots, &mut self.slots.slice_mut(..n))
            .map_err(up_err)?;
        let bt_len = batch.block_tables.len();
        g.stream
            .memcpy_htod(
                &batch.block_tables,
                &mut self.block_tables.slice_mut(..bt_len),
            )
            .map_err(up_err)?;
        let (tokens, positions) = (self.tokens.slice(..n), self.positions.slice(..n));
        let (token_seq, slots, tables) = (
            self.token_seq.slice(..n),
            self.slots.slice(..n),
            self.block_tables.slice(..bt_len),
        );
        let (cos, sin) = (self.rope_cos.as_view(), self.rope_sin.as_view());
        let layer_len = self.k_cache.len() / c.n_layers;

        g.embedding_bf16(
            &mut self.x.slice_mut(..n * dim),
            &self.embed.as_view(),
            &tokens,
            dim,
        )?;
        for (l, lw) in self.layers.iter().enumerate() {
            // Attention: x += o_proj(attention(rope(q), rope(k), v)) over the normed stream.
            g.rmsnorm_f32(
                &mut self.xb.slice_mut(..n * dim),
                &self.x.slice(..n * dim),
                &lw.attn_norm.as_view(),
                c.rms_eps,
                dim,
            )?;
            let xb = self.xb.slice(..n * dim);
            Self::matmul(
                g,
                &mut self.q.slice_mut(..n * q_dim),
                &xb,
                &lw.wq,
                lw.bq.as_ref(),
                n,
                dim,
                q_dim,
            )?;
            Self::matmul(
                g,
                &mut self.k.slice_mut(..n * kv_dim),
                &xb,
                &lw.wk,
                lw.bk.as_ref(),
                n,
                dim,
                kv_dim,
            )?;
            Self::matmul(
                g,
                &mut self.v.slice_mut(..n * kv_dim),
                &xb,
                &lw.wv,
                lw.bv.as_ref(),
                n,
                dim,
                kv_dim,
            )?;
            g.rope_f32(
                &mut self.q.slice_mut(..n * q_dim),
                &positions,
                &cos,
                &sin,
                c.n_heads,
                c.head_dim,
            )?;
            g.rope_f32(
                &mut self.k.slice_mut(..n * kv_dim),
                &positions,
                &cos,
                &sin,
                c.n_kv_heads,
                c.head_dim,
            )?;
            let layer = l * layer_len..(l + 1) * layer_len;
            g.kv_write_f32(
                &mut self.k_cache.slice_mut(layer.clone()),
                &mut self.v_cache.slice_mut(layer.clone()),
                &self.k.slice(..n * kv_dim),
                &self.v.slice(..n * kv_dim),
                &slots,
                kv_dim,
            )?;
            g.attention_f32(
                &mut self.att.slice_mut(..n * q_dim),
                &self.q.slice(..n * q_dim),
                &self.k_cache.slice(layer.clone()),
                &self.v_cache.slice(layer),
                &tables,
                &token_seq,
                &positions,
                batch.max_blocks,
                c.n_heads,
                c.n_kv_heads,
                c.head_dim,
            )?;
            Self::matmul(
                g,
                &mut self.xb.slice_mut(..n * dim),
                &self.att.slice(..n * q_dim),
                &lw.wo,
                None,
                n,
                q_dim,
                dim,
            )?;
            g.residual_add_f32(&mut self.x.slice_mut(..n * dim), &self.xb.slice(..n * dim))?;

            // MLP: x += down(silu(gate(x)) * up(x)) over the normed stream.
            g.rmsnorm_f32(
                &mut self.xb.slice_mut(..n * dim),
                &self.x.slice(..n * dim),
                &lw.ffn_norm.as_view(),
                c.rms_eps,
                dim,
            )?;
            let xb = self.xb.slice(..n * dim);
            Self::matmul(
                g,
                &mut self.gate.slice_mut(..n * ffn),
                &xb,
                &lw.w_gate,
                None,
                n,
                dim,
                ffn,
            )?;
            Self::matmul(
                g,
                &mut self.up.slice_mut(..n * ffn),
                &xb,
                &lw.w_up,
                None,
                n,
                dim,
                ffn,
            )?;
            g.swiglu_f32(
                &mut self.hidden.slice_mut(..n * ffn),
                &self.gate.slice(..n * ffn),
                &self.up.slice(..n * ffn),
            )?;
            Self::matmul(
                g,
                &mut self.xb.slice_mut(..n * dim),
                &self.hidden.slice(..n * ffn),
                &lw.w_down,
                None,
                n,
                ffn,
                dim,
            )?;
            g.residual_add_f32(&mut self.x.slice_mut(..n * dim), &self.xb.slice(..n * dim))?;
        }

        // Only the rows that need logits go through the final norm and the head.
        let rows = batch.logit_rows.len();
        for (i, &r) in batch.logit_rows.iter().enumerate() {
            let r = r as usize;
            g.rmsnorm_f32(
                &mut self.head_in.slice_mut(i * dim..(i + 1) * dim),
                &self.x.slice(r * dim..(r + 1) * dim),
                &self.final_norm.as_view(),
                c.rms_eps,
                dim,
            )?;
        }
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        Self::matmul(
            g,
            &mut self.logits.slice_mut(..rows * vocab),
            &self.head_in.slice(..rows * dim),
            head,
            None,
            rows,
            dim,
            vocab,
        )?;
        self.logits_host.resize(rows * vocab, 0.0);
        g.stream
            .memcpy_dtoh(&self.logits.slice(..rows * vocab), &mut self.logits_host)
            .map_err(|e| Error::Gpu(format!("the forward pass failed: {e}")))?;
        g.sync()?;
        Ok(&self.logits_host)
    }
}
