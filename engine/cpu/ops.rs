//! The CPU reference backend's operations: plain f32 arithmetic, one function per GPU
//! kernel, with the same name and argument order (minus the lengths a slice already carries).
//! They are the oracle the GPU kernels are tested against, so each reads as the equation it
//! implements; rayon spreads independent rows over cores where that costs no clarity.
//!
//! Shapes use `n` for the number of tokens in the batch.

use rayon::prelude::*;

pub use crate::kernel_args::{Heads, NormedQkv, Paged, PagedShape, Splits};
use crate::kv::block_manager::BLOCK_SIZE;

/// A paged attention's inputs on the host (`kernel_args::Paged`): the queries, one layer's
/// cache of `K`, and the batch's map into it.
pub type PagedRef<'a, K> = Paged<&'a [f32], &'a [K], &'a [u32]>;

/// `out[t, :] = table[tokens[t], :]`
///
/// - `out`: `[n, dim]`
/// - `table`: `[vocab, dim]`
/// - `tokens`: `[n]`, each `< vocab`
pub fn embedding_f32(out: &mut [f32], table: &[f32], tokens: &[u32], dim: usize) {
    for (row, &tok) in out.chunks_exact_mut(dim).zip(tokens) {
        let t = tok as usize;
        row.copy_from_slice(&table[t * dim..(t + 1) * dim]);
    }
}

/// `out[t, :] = table[tokens[t], :]`, widened from bf16: the GPU keeps the table in bf16.
///
/// - `out`: `[n, dim]` f32
/// - `table`: `[vocab, dim]` bf16 bits
/// - `tokens`: `[n]`, each `< vocab`
pub fn embedding_bf16(out: &mut [f32], table: &[u16], tokens: &[u32], dim: usize) {
    for (row, &tok) in out.chunks_exact_mut(dim).zip(tokens) {
        let src = &table[tok as usize * dim..(tok as usize + 1) * dim];
        for (o, &b) in row.iter_mut().zip(src) {
            *o = bf16_to_f32(b);
        }
    }
}

/// RMSNorm: `out[t, i] = x[t, i] / sqrt(mean_j x[t, j]^2 + eps) * weight[i]`
///
/// - `out`, `x`: `[n, dim]`
/// - `weight`: `[dim]`
pub fn rmsnorm_f32(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    for (o, x) in out.chunks_exact_mut(dim).zip(x.chunks_exact(dim)) {
        let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let scale = 1.0 / (mean_sq + eps).sqrt();
        for ((o, x), w) in o.iter_mut().zip(x).zip(weight) {
            *o = x * scale * w;
        }
    }
}

/// `rmsnorm_f32`, the output also rounded to bf16 bits into `out_bf16` (`[n, dim]`). The twin
/// of `rmsnorm_f32_bf16`.
pub fn rmsnorm_f32_bf16(
    out: &mut [f32],
    out_bf16: &mut [u16],
    x: &[f32],
    weight: &[f32],
    eps: f32,
) {
    rmsnorm_f32(out, x, weight, eps);
    f32_to_bf16(out_bf16, out);
}

/// RMSNorm of each `weight.len()`-wide row of `x`, in place: Qwen3's norm of each query or
/// key head (`x` `[n, heads, head_dim]`, `weight` `[head_dim]`), as `rmsnorm_f32` computes it.
pub fn head_rmsnorm_f32(x: &mut [f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    for x in x.chunks_exact_mut(dim) {
        let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let scale = 1.0 / (mean_sq + eps).sqrt();
        for (x, w) in x.iter_mut().zip(weight) {
            *x = *x * scale * w;
        }
    }
}

/// Dot product with eight independent sums, so the compiler can keep them in one vector
/// register instead of waiting on a single running sum.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `out[t, o] = sum_i x[t, i] * w[o, i] + bias[o]`: a linear layer, weights `[out, in]`
/// as PyTorch stores them.
///
/// - `out`: `[n, n_out]`
/// - `x`: `[n, n_in]`
/// - `w`: `[n_out, n_in]`
/// - `bias`: `[n_out]` or none
pub fn matmul_f32(out: &mut [f32], x: &[f32], w: &[f32], bias: Option<&[f32]>, n_in: usize) {
    let n_out = w.len() / n_in;
    let row =
        |o: usize, xr: &[f32]| dot(&w[o * n_in..(o + 1) * n_in], xr) + bias.map_or(0.0, |b| b[o]);
    if out.len() == n_out {
        // One token (decode): spread the output features over cores.
        out.par_iter_mut()
            .enumerate()
            .for_each(|(o, y)| *y = row(o, x));
    } else {
        // Many tokens (prefill): one token's row per task.
        out.par_chunks_mut(n_out)
            .zip(x.par_chunks(n_in))
            .for_each(|(y, xr)| y.iter_mut().enumerate().for_each(|(o, y)| *y = row(o, xr)));
    }
}

/// `out[o] = (accumulate ? out[o] : 0) + sum_i w[o, i] * x[i] + bias[o]` for one token,
/// weights in bf16: the twin of the GPU's decode matmul (`accumulate` fuses a residual add).
///
/// - `out`: `[n_out]`
/// - `x`: `[n_in]`
/// - `w`: `[n_out, n_in]` bf16 bits
/// - `bias`: `[n_out]` or none
pub fn gemv_bf16(
    out: &mut [f32],
    x: &[f32],
    w: &[u16],
    bias: Option<&[f32]>,
    n_in: usize,
    accumulate: bool,
) {
    out.par_iter_mut().enumerate().for_each(|(o, y)| {
        let row = &w[o * n_in..(o + 1) * n_in];
        let sum: f32 = row.iter().zip(x).map(|(&w, x)| bf16_to_f32(w) * x).sum();
        *y = if accumulate { *y } else { 0.0 } + sum + bias.map_or(0.0, |b| b[o]);
    });
}

/// The lesson's GEMV step 1 (a thread per row): `out = w x`. Its twin is the product itself.
pub fn gemv_step1_thread_per_row_bf16(out: &mut [f32], x: &[f32], w: &[u16], n_in: usize) {
    gemv_bf16(out, x, w, None, n_in, false);
}

/// The lesson's GEMV step 2 (a warp per row): `out = w x`.
pub fn gemv_step2_warp_per_row_bf16(out: &mut [f32], x: &[f32], w: &[u16], n_in: usize) {
    gemv_bf16(out, x, w, None, n_in, false);
}

/// `out[o] = silu(w_gate[o] . x) * (w_up[o] . x)`: the twin of the GPU's fused gate/up
/// matmul with SwiGLU.
///
/// - `out`: `[n_out]`
/// - `x`: `[n_in]`
/// - `w_gate`, `w_up`: `[n_out, n_in]` bf16 bits
pub fn gemv_swiglu_bf16(out: &mut [f32], x: &[f32], w_gate: &[u16], w_up: &[u16], n_in: usize) {
    let dot = |w: &[u16]| -> f32 { w.iter().zip(x).map(|(&w, x)| bf16_to_f32(w) * x).sum() };
    out.par_iter_mut().enumerate().for_each(|(o, y)| {
        let (g, u) = (
            dot(&w_gate[o * n_in..(o + 1) * n_in]),
            dot(&w_up[o * n_in..(o + 1) * n_in]),
        );
        *y = g / (1.0 + (-g).exp()) * u;
    });
}

/// `out[t, o] = sum_i x[t, i] * w[o, i] + bias[o]` for many tokens, weights in bf16: the
/// product every GEMM twin is (the lesson's SIMT `gemm_step1_simt_bf16`; the prefill's
/// `gemm_mma_bf16`, below, with its input rounded to bf16).
///
/// - `out`: `[n, n_out]`
/// - `x`: `[n, n_in]`
/// - `w`: `[n_out, n_in]` bf16 bits
/// - `bias`: `[n_out]` or none
pub fn gemm_bf16(out: &mut [f32], x: &[f32], w: &[u16], bias: Option<&[f32]>, n_in: usize) {
    let n_out = w.len() / n_in;
    out.par_chunks_mut(n_out)
        .zip(x.par_chunks(n_in))
        .for_each(|(y, xr)| gemv_bf16(y, xr, w, bias, n_in, false));
}

/// As `gemm_bf16`, with the activations in bf16 too: the twin of the GPU's tensor-core
/// prefill matmul.
///
/// - `x`: `[n, n_in]` bf16 bits (from `f32_to_bf16`)
pub fn gemm_mma_bf16(out: &mut [f32], x: &[u16], w: &[u16], bias: Option<&[f32]>, n_in: usize) {
    let x: Vec<f32> = x.iter().map(|&b| bf16_to_f32(b)).collect();
    gemm_bf16(out, &x, w, bias, n_in);
}

/// The twin of the GPU's warpgroup (Hopper) GEMM: the same product as `gemm_mma_bf16`.
pub fn gemm_wgmma_bf16(out: &mut [f32], x: &[u16], w: &[u16], bias: Option<&[f32]>, n_in: usize) {
    gemm_mma_bf16(out, x, w, bias, n_in);
}

/// `out[t, o] = (accumulate ? out[t, o] : 0) + sum_i x[t, i] * w[o, i] + bias[o]`, bf16
/// activations and weights: the twin of the GPU's matmul for a few tokens (batched decode),
/// whatever split of the reduction its launch takes.
///
/// - `out`: `[n, n_out]`
/// - `x`: `[n, n_in]` bf16 bits
/// - `w`: `[n_out, n_in]` bf16 bits
/// - `bias`: `[n_out]` or none
pub fn gemm_skinny_bf16(
    out: &mut [f32],
    x: &[u16],
    w: &[u16],
    bias: Option<&[f32]>,
    n_in: usize,
    accumulate: bool,
) {
    let n_out = w.len() / n_in;
    let x: Vec<f32> = x.iter().map(|&b| bf16_to_f32(b)).collect();
    out.par_chunks_mut(n_out)
        .zip(x.par_chunks(n_in))
        .for_each(|(y, xr)| gemv_bf16(y, xr, w, bias, n_in, accumulate));
}

/// `out[i] = (accumulate ? out[i] : 0) + sum over s of parts[s, i] + bias[i % n_out]`: the
/// twin of the second half of a split skinny matmul.
///
/// - `out`: `[len]`
/// - `parts`: `[splits, len]`
/// - `bias`: `[n_out]` or none
pub fn gemm_skinny_reduce_f32(
    out: &mut [f32],
    parts: &[f32],
    bias: Option<&[f32]>,
    n_out: usize,
    accumulate: bool,
) {
    let len = out.len();
    for (i, y) in out.iter_mut().enumerate() {
        let sum: f32 = parts.iter().skip(i).step_by(len).sum();
        *y = if accumulate { *y } else { 0.0 } + sum + bias.map_or(0.0, |b| b[i % n_out]);
    }
}

/// The tensor-core probe's result: every thread's 64 accumulators end at
/// `iters * 16 * a * b`, and it writes their sum. The twin of `mma_probe_bf16`.
pub fn mma_probe_bf16(out: &mut [f32], a_bits: u16, b_bits: u16, iters: u32) {
    let (a, b) = (bf16_to_f32(a_bits), bf16_to_f32(b_bits));
    out.fill(64.0 * iters as f32 * 16.0 * a * b);
}

/// Rotate-half RoPE, in place: in each head, the pair `(x[i], x[i + d/2])` turns by the
/// angle whose cos and sin are `cos[pos, i]`, `sin[pos, i]`.
///
/// - `x`: `[n, n_heads, head_dim]`
/// - `positions`: `[n]`
/// - `cos`, `sin`: `[max_pos, head_dim / 2]`
pub fn rope_f32(
    x: &mut [f32],
    positions: &[u32],
    cos: &[f32],
    sin: &[f32],
    n_heads: usize,
    head_dim: usize,
) {
    let half = head_dim / 2;
    for (t, &pos) in positions.iter().enumerate() {
        let (c, s) = (
            &cos[pos as usize * half..][..half],
            &sin[pos as usize * half..][..half],
        );
        for h in 0..n_heads {
            let head = &mut x[(t * n_heads + h) * head_dim..][..head_dim];
            for i in 0..half {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * c[i] - b * s[i];
                head[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

/// Writes each token's key and value rows into its cache slot.
///
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * BLOCK_SIZE, kv_dim]`
/// - `k`, `v`: `[n, kv_dim]`
/// - `slots`: `[n]`, `block * BLOCK_SIZE + offset` from the sequence's block table
pub fn kv_write_f32(
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    k: &[f32],
    v: &[f32],
    slots: &[u32],
    kv_dim: usize,
) {
    for (t, &slot) in slots.iter().enumerate() {
        let dst = slot as usize * kv_dim..(slot as usize + 1) * kv_dim;
        k_cache[dst.clone()].copy_from_slice(&k[t * kv_dim..(t + 1) * kv_dim]);
        v_cache[dst].copy_from_slice(&v[t * kv_dim..(t + 1) * kv_dim]);
    }
}

/// RoPE on q and k and the cache write, from the fused projection's rows `[q | k | v]`, keys
/// and values rounded to bf16: the twin of the GPU's `qkv_rope_write_bf16`.
///
/// - `q_out`: `[n, n_heads, head_dim]`
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * BLOCK_SIZE, kv_dim]` bf16 bits
/// - `qkv`: `[n, q_dim + 2 * kv_dim]`
/// - `positions`, `slots`: `[n]`; `cos`, `sin`: `[max_pos, head_dim / 2]`
pub fn qkv_rope_write_bf16(
    q_out: &mut [f32],
    (k_cache, v_cache): (&mut [u16], &mut [u16]),
    qkv: &[f32],
    rows: (&[u32], &[u32]),
    tables: (&[f32], &[f32]),
    heads: Heads,
) {
    let kv_dim = heads.kv_dim();
    let bf16 = |x: f32| half::bf16::from_f32(x).to_bits();
    rope_rows(q_out, qkv, rows, tables, heads, |slot, k, v| {
        let at = slot * kv_dim;
        for (i, (&kv, &vv)) in k.iter().zip(v).enumerate() {
            k_cache[at + i] = bf16(kv);
            v_cache[at + i] = bf16(vv);
        }
    });
}

/// The walk the RoPE-and-cache-write twins share: for each token of the fused rows
/// `[q | k | v]` (`qkv`, `[n, q_dim + 2 * kv_dim]`), its q roped into `q_out` (`[n, q_dim]`),
/// then `write(slot, k, v)` with its slot, its k roped and its v as it is (`[kv_dim]` each).
pub fn rope_rows(
    q_out: &mut [f32],
    qkv: &[f32],
    (positions, slots): (&[u32], &[u32]),
    (cos, sin): (&[f32], &[f32]),
    heads: Heads,
    mut write: impl FnMut(usize, &[f32], &[f32]),
) {
    let (q_dim, kv_dim) = (heads.q_dim(), heads.kv_dim());
    let (n_heads, n_kv_heads, head_dim) = heads.sizes();
    let mut k = vec![0.0; kv_dim];
    for (t, row) in qkv.chunks_exact(q_dim + 2 * kv_dim).enumerate() {
        let q = &mut q_out[t * q_dim..(t + 1) * q_dim];
        q.copy_from_slice(&row[..q_dim]);
        rope_f32(q, &positions[t..t + 1], cos, sin, n_heads, head_dim);
        k.copy_from_slice(&row[q_dim..q_dim + kv_dim]);
        rope_f32(&mut k, &positions[t..t + 1], cos, sin, n_kv_heads, head_dim);
        write(slots[t] as usize, &k, &row[q_dim + kv_dim..]);
    }
}

/// `qkv_rope_write_bf16` with each query head of the fused rows RMSNormed by its norm and
/// each key head by its own before RoPE: the twin of the GPU's `qkv_norm_rope_write_bf16`
/// (Qwen3). The other arguments as `qkv_rope_write_bf16`'s.
pub fn qkv_norm_rope_write_bf16(
    q_out: &mut [f32],
    caches: (&mut [u16], &mut [u16]),
    rows_in: NormedQkv<&[f32]>,
    rows: (&[u32], &[u32]),
    tables: (&[f32], &[f32]),
    heads: Heads,
) {
    let normed = normed_heads(rows_in, heads);
    qkv_rope_write_bf16(q_out, caches, &normed, rows, tables, heads);
}

/// The fused rows of `rows_in` with each query head RMSNormed by its norm and each key head
/// by its own (the values as they are): what the `qkv_norm_rope_write_*` kernels rotate.
pub fn normed_heads(rows_in: NormedQkv<&[f32]>, heads: Heads) -> Vec<f32> {
    let (q_dim, kv_dim) = (heads.q_dim(), heads.kv_dim());
    let NormedQkv {
        qkv,
        q_norm,
        k_norm,
        eps,
    } = rows_in;
    let mut normed = qkv.to_vec();
    for row in normed.chunks_exact_mut(q_dim + 2 * kv_dim) {
        let (q, rest) = row.split_at_mut(q_dim);
        head_rmsnorm_f32(q, q_norm, eps);
        head_rmsnorm_f32(&mut rest[..kv_dim], k_norm, eps);
    }
    normed
}

/// Causal grouped-query attention over the paged KV cache.
///
/// Token `t` (of sequence `token_seq[t]`, at position `positions[t]`) attends, in each query
/// head `h`, to the keys and values of its own sequence at positions `0..=positions[t]`
/// (from `positions[t] + 1 - window` where the shape has a sliding window), read through that sequence's block table from KV head `h / (n_heads / n_kv_heads)`:
/// `out = softmax(q k^T / sqrt(head_dim)) v`. Its own key must already be in the cache.
///
/// The softmax is computed online (one pass: a running maximum, and the sum and the weighted
/// values rescaled whenever the maximum grows), the form the GPU kernels use.
///
/// - `out`: `[n, n_heads, head_dim]`
/// - `p`: the queries, the cache and the batch's map into it (`Paged`'s shapes)
pub fn attention_f32(out: &mut [f32], p: &PagedRef<f32>) {
    let Paged {
        q,
        k_cache,
        v_cache,
        block_tables,
        token_seq,
        positions,
        shape,
    } = *p;
    let max_blocks = shape.max_blocks as usize;
    let (n_heads, n_kv_heads, head_dim) = shape.heads.sizes();
    let group = n_heads / n_kv_heads;
    let kv_dim = n_kv_heads * head_dim;
    let scale = 1.0 / (head_dim as f32).sqrt();
    // One task per (token, query head): each writes its own head_dim slice of `out`.
    out.par_chunks_mut(head_dim)
        .enumerate()
        .for_each(|(th, o)| {
            let (t, h) = (th / n_heads, th % n_heads);
            let q = &q[th * head_dim..][..head_dim];
            let table = &block_tables[token_seq[t] as usize * max_blocks..][..max_blocks];
            let kv_head = h / group;
            let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
            o.fill(0.0);
            let last = positions[t] as usize;
            for p in shape.first_position(last)..=last {
                let slot = table[p / BLOCK_SIZE] as usize * BLOCK_SIZE + p % BLOCK_SIZE;
                let at = slot * kv_dim + kv_head * head_dim;
                let score = dot(q, &k_cache[at..at + head_dim]) * scale;
                let new_max = max.max(score);
                let rescale = (max - new_max).exp(); // shrink what was summed under the old max
                let weight = (score - new_max).exp();
                sum = sum * rescale + weight;
                for (o, v) in o.iter_mut().zip(&v_cache[at..at + head_dim]) {
                    *o = *o * rescale + weight * v;
                }
                max = new_max;
            }
            o.iter_mut().for_each(|o| *o /= sum);
        });
}

/// As `attention_f32`, over a bf16 cache: the twin of the GPU's `attention_bf16`.
///
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * 16, n_kv_heads * head_dim]` bf16 bits
pub fn attention_bf16(out: &mut [f32], p: &PagedRef<u16>) {
    let (k, v) = (widen(p.k_cache), widen(p.v_cache));
    attention_f32(out, &with_cache(p, &k, &v, p.q));
}

/// `p` over the cache `k`, `v` (widened to f32) and the queries `q`.
fn with_cache<'a, K>(
    p: &PagedRef<'a, K>,
    k: &'a [f32],
    v: &'a [f32],
    q: &'a [f32],
) -> PagedRef<'a, f32> {
    Paged {
        q,
        k_cache: k,
        v_cache: v,
        block_tables: p.block_tables,
        token_seq: p.token_seq,
        positions: p.positions,
        shape: p.shape,
    }
}

/// bf16 bits to f32, every value (exact).
fn widen(bits: &[u16]) -> Vec<f32> {
    bits.iter().map(|&b| bf16_to_f32(b)).collect()
}

/// The twin of `attention_mma_bf16`: `attention_f32` with the query (scaled by
/// log2(e) / sqrt(head_dim), as the kernel takes its softmax in powers of two), the keys and
/// the values rounded to bf16, as the tensor cores take them. (The kernel also rounds the
/// softmax weights before multiplying them by the values; this twin keeps them in f32, a
/// difference of about 2^-9 per weight that the tests allow for.) `n` is the number of
/// tokens, as the kernel takes it.
pub fn attention_mma_bf16(out: &mut [f32], p: &PagedRef<u16>, n: usize) {
    assert_eq!(n, p.positions.len());
    let head_dim = p.shape.heads.head_dim as f32;
    let round = |x: f32| half::bf16::from_f32(x).to_f32();
    let scale = std::f32::consts::LOG2_E / head_dim.sqrt();
    let q: Vec<f32> = p.q.iter().map(|&x| round(x * scale)).collect();
    let (k, v) = (widen(p.k_cache), widen(p.v_cache));
    // attention_f32 scales by 1 / sqrt(head_dim) and takes powers of e: undo both, so that
    // its weights are 2^(q . k) with q as rounded here.
    let unscale = head_dim.sqrt() * std::f32::consts::LN_2;
    let q: Vec<f32> = q.iter().map(|&x| x * unscale).collect();
    attention_f32(out, &with_cache(p, &k, &v, &q));
}

/// `attention_split_bf16` as the tensor cores compute it: q, scaled by log2(e) /
/// sqrt(head_dim), rounded to bf16 (the weights are powers of two of its products). The twin
/// of `attention_split_mma_bf16`; its maxima come back in natural units, as the kernel's.
pub fn attention_split_mma_bf16(
    partial_o: &mut [f32],
    partial_ml: &mut [f32],
    p: &PagedRef<u16>,
    split_len: usize,
) {
    let head_dim = p.shape.heads.head_dim as f32;
    let round = |x: f32| half::bf16::from_f32(x).to_f32();
    let scale = std::f32::consts::LOG2_E / head_dim.sqrt();
    // attention_split_bf16 scales by 1 / sqrt(head_dim) and takes powers of e: undo both, so
    // that its weights are 2^(q . k) with q as rounded here.
    let unscale = head_dim.sqrt() * std::f32::consts::LN_2;
    let q: Vec<f32> = p.q.iter().map(|&x| round(x * scale) * unscale).collect();
    let p = Paged { q: &q[..], ..*p };
    attention_split_bf16(partial_o, partial_ml, &p, split_len);
}

/// Flash-decoding's first half: for each token, query head and split of `split_len`
/// positions, the unnormalised attention over that split (its positions inside the token's
/// sliding window, where the shape has one): running maximum `m`, sum `l` of
/// `e^(score - m)`, and the weighted sum of values, over a bf16 cache. The twin of
/// `attention_split_bf16`.
///
/// - `partial_o`: `[n, n_heads, n_splits, head_dim]`; `partial_ml`: `[n, n_heads, n_splits, 2]`
/// - `p`: as in `attention_bf16`
pub fn attention_split_bf16(
    partial_o: &mut [f32],
    partial_ml: &mut [f32],
    p: &PagedRef<u16>,
    split_len: usize,
) {
    let Paged {
        q,
        k_cache,
        v_cache,
        block_tables,
        token_seq,
        positions,
        shape,
    } = *p;
    let max_blocks = shape.max_blocks as usize;
    let (n_heads, n_kv_heads, head_dim) = shape.heads.sizes();
    let n_splits = partial_ml.len() / (2 * positions.len() * n_heads);
    let (group, kv_dim) = (n_heads / n_kv_heads, n_kv_heads * head_dim);
    let (k_cache, v_cache) = (widen(k_cache), widen(v_cache));
    let scale = 1.0 / (head_dim as f32).sqrt();
    for (t, &pos) in positions.iter().enumerate() {
        let table = &block_tables[token_seq[t] as usize * max_blocks..][..max_blocks];
        for h in 0..n_heads {
            let q = &q[(t * n_heads + h) * head_dim..][..head_dim];
            for s in 0..n_splits {
                let at = (t * n_heads + h) * n_splits + s;
                let o = &mut partial_o[at * head_dim..(at + 1) * head_dim];
                o.fill(0.0);
                let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
                let first = (s * split_len).max(shape.first_position(pos as usize));
                for p in first..((s + 1) * split_len).min(pos as usize + 1) {
                    let slot = table[p / BLOCK_SIZE] as usize * BLOCK_SIZE + p % BLOCK_SIZE;
                    let base = slot * kv_dim + (h / group) * head_dim;
                    let score = dot(q, &k_cache[base..base + head_dim]) * scale;
                    let m_new = m.max(score);
                    let (rescale, weight) = ((m - m_new).exp(), (score - m_new).exp());
                    l = l * rescale + weight;
                    for (o, v) in o.iter_mut().zip(&v_cache[base..base + head_dim]) {
                        *o = *o * rescale + weight * v;
                    }
                    m = m_new;
                }
                partial_ml[2 * at] = m;
                partial_ml[2 * at + 1] = l;
            }
        }
    }
}

/// Flash-decoding's second half: merges the splits,
/// `out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s`. The twin of `attention_combine_f32`.
///
/// - `out`: `[n, n_heads, head_dim]`
/// - `partial_o`, `partial_ml`: as `attention_split_bf16` wrote them
pub fn attention_combine_f32(
    out: &mut [f32],
    partial_o: &[f32],
    partial_ml: &[f32],
    positions: &[u32],
    splits: Splits,
) {
    let (n_splits, split_len, head_dim) = (
        splits.n_splits as usize,
        splits.split_len as usize,
        splits.head_dim as usize,
    );
    let n_heads = out.len() / head_dim / positions.len().max(1);
    for (th, o) in out.chunks_exact_mut(head_dim).enumerate() {
        // The token's own splits: those that hold positions 0..=pos.
        let own = (positions[th / n_heads] as usize / split_len + 1).min(n_splits);
        let ml = &partial_ml[2 * th * n_splits..][..2 * own];
        let m_all = ml.chunks(2).map(|c| c[0]).fold(f32::NEG_INFINITY, f32::max);
        let denom: f32 = ml.chunks(2).map(|c| c[1] * (c[0] - m_all).exp()).sum();
        o.fill(0.0);
        for s in 0..own {
            let w = (ml[2 * s] - m_all).exp() / denom;
            let src = &partial_o[(th * n_splits + s) * head_dim..][..head_dim];
            for (o, v) in o.iter_mut().zip(src) {
                *o += w * v;
            }
        }
    }
}

/// `attention_combine_f32`, the output also rounded to bf16 bits into `out_bf16`. The twin of
/// `attention_combine_f32_bf16`.
pub fn attention_combine_f32_bf16(
    out: &mut [f32],
    out_bf16: &mut [u16],
    partial_o: &[f32],
    partial_ml: &[f32],
    positions: &[u32],
    splits: Splits,
) {
    attention_combine_f32(out, partial_o, partial_ml, positions, splits);
    f32_to_bf16(out_bf16, out);
}

/// The benchmark weights' generator: `out[i] = bf16(scale * u)`, `u` uniform in [-1, 1)
/// from a hash of `(seed, i)`. The twin of `fill_random_bf16`.
pub fn fill_random_bf16(out: &mut [u16], seed: u32, scale: f32) {
    for (i, o) in out.iter_mut().enumerate() {
        let u = (hash32(seed, i as u32) >> 8) as f32 * (1.0 / 8_388_608.0) - 1.0;
        *o = half::bf16::from_f32(scale * u).to_bits();
    }
}

/// The read-bandwidth probe's result: `partial[b]`, the wrapping sum of the words block `b`
/// of a `grid x 256` launch reads (16-byte vectors `i = b * 256 + t`, stepping by
/// `grid * 256`). The twin of `read_probe_u32`.
pub fn read_probe_u32(partial: &mut [u32], data: &[u32]) {
    let grid = partial.len();
    for (b, p) in partial.iter_mut().enumerate() {
        *p = block_sum_of_vectors(data, b, grid);
    }
}

/// The read probe in phases: `partial[b]`, the wrapping sum of the words block `b` reads in
/// all of them, phase `p` the `phase_vec4` vectors from vector `p * phase_stride`, read as
/// `read_probe_u32` reads its data; `arrived`, the barriers' counter, ends at `(n_phases - 1)
/// * grid`. (`ahead` only asks L2 for lines early: no value depends on it.) The twin of
/// `read_phases_u32` (`--features probes`).
#[cfg(feature = "probes")]
#[allow(clippy::too_many_arguments)]
pub fn read_phases_u32(
    partial: &mut [u32],
    arrived: &mut [u32],
    data: &[u32],
    phase_vec4: usize,
    phase_stride: usize,
    n_phases: usize,
    _ahead: usize,
) {
    let grid = partial.len();
    for (b, p) in partial.iter_mut().enumerate() {
        *p = (0..n_phases).fold(0u32, |sum, phase| {
            let from = 4 * phase * phase_stride;
            let words = &data[from..from + 4 * phase_vec4];
            sum.wrapping_add(block_sum_of_vectors(words, b, grid))
        });
    }
    arrived[0] = ((n_phases - 1) * grid) as u32;
}

/// The probe in phases with its tiles staged: phase p is tiles `phase_starts[p] ..
/// phase_starts[p + 1]` of `tile_bytes`; block b of `partial.len()` takes tiles `b, b +
/// grid, ...` of each, and `sums[p][b]` is the wrapping sum of their words (every phase
/// but the last). `partial[b]` adds those over all phases, and, for each phase p but the
/// last, the sums of phase p of the `min(256, grid)` blocks after b, wrapping round (what
/// block b reads after the barrier that ends phase p). `arrived` ends at `(n_phases - 1) *
/// grid`. (`stages` and `producer` only say how many copies a block keeps on their way and
/// which thread asks for them: no value depends on them.) The twin of
/// `read_phases_staged_u32` (`--features probes`).
#[cfg(feature = "probes")]
#[allow(clippy::too_many_arguments)]
pub fn read_phases_staged_u32(
    partial: &mut [u32],
    sums: &mut [u32],
    arrived: &mut [u32],
    data: &[u32],
    phase_starts: &[u32],
    tile_bytes: usize,
    n_phases: usize,
    _stages: usize,
    _producer: usize,
) {
    let (grid, tile_words) = (partial.len(), tile_bytes / 4);
    let wrapping = |words: &[u32]| words.iter().fold(0u32, |s, &w| s.wrapping_add(w));
    // own[p][b]: block b's words of phase p.
    let own: Vec<Vec<u32>> = (0..n_phases)
        .map(|p| {
            let (from, to) = (phase_starts[p] as usize, phase_starts[p + 1] as usize);
            (0..grid)
                .map(|b| {
                    (from + b..to).step_by(grid).fold(0u32, |s, tile| {
                        let words = &data[tile * tile_words..(tile + 1) * tile_words];
                        s.wrapping_add(wrapping(words))
                    })
                })
                .collect()
        })
        .collect();
    for (b, out) in partial.iter_mut().enumerate() {
        *out = (0..n_phases).fold(0u32, |s, p| {
            let read = if p + 1 < n_phases {
                (0..grid.min(256)).fold(0u32, |s, t| s.wrapping_add(own[p][(b + 1 + t) % grid]))
            } else {
                0
            };
            s.wrapping_add(own[p][b]).wrapping_add(read)
        });
    }
    for p in 0..n_phases.saturating_sub(1) {
        sums[p * grid..(p + 1) * grid].copy_from_slice(&own[p]);
    }
    arrived[0] = ((n_phases - 1) * grid) as u32;
}

/// The wrapping sum of the words of `data`'s 16-byte vectors that block `b` of a `grid x
/// 256` grid-stride loop takes.
fn block_sum_of_vectors(data: &[u32], b: usize, grid: usize) -> u32 {
    let (n_vec4, stride) = (data.len() / 4, grid * 256);
    let mut sum = 0u32;
    for t in 0..256 {
        let mut i = b * 256 + t;
        while i < n_vec4 {
            for w in &data[4 * i..4 * i + 4] {
                sum = sum.wrapping_add(*w);
            }
            i += stride;
        }
    }
    sum
}

/// `x[i] *= s`: Gemma's scale of the embedding's rows. The twin of `scale_f32`.
///
/// - `x`: `[n, dim]`
pub fn scale_f32(x: &mut [f32], s: f32) {
    x.iter_mut().for_each(|v| *v *= s);
}

/// The residual connection: `x[i] += delta[i]`.
///
/// - `x`, `delta`: `[n, dim]`
pub fn residual_add_f32(x: &mut [f32], delta: &[f32]) {
    for (x, d) in x.iter_mut().zip(delta) {
        *x += d;
    }
}

/// The lesson's GEMM step 1 (SIMT tiles in shared memory): `out = x w^T + bias`. Its twin
/// is the product itself, `gemm_bf16`.
pub fn gemm_step1_simt_bf16(
    out: &mut [f32],
    x: &[f32],
    w: &[u16],
    bias: Option<&[f32]>,
    n_in: usize,
) {
    gemm_bf16(out, x, w, bias, n_in);
}

/// The sum of each row, in f64, rounded once: the twin of the lesson's reduction steps,
/// which sum in f32 in another order (a tree), so the tests compare with a tolerance.
///
/// - `out`: `[n_rows]`
/// - `x`: `[n_rows, n_cols]`
fn row_sums_f32(out: &mut [f32], x: &[f32], n_cols: usize) {
    for (o, row) in out.iter_mut().zip(x.chunks_exact(n_cols)) {
        *o = row.iter().map(|&v| v as f64).sum::<f64>() as f32;
    }
}

/// The lesson's reduction step 1 (a warp per row): each row's sum.
pub fn sum_step1_warp_f32(out: &mut [f32], x: &[f32], n_cols: usize) {
    row_sums_f32(out, x, n_cols);
}

/// The lesson's reduction step 2 (a block per row): each row's sum.
pub fn sum_step2_block_f32(out: &mut [f32], x: &[f32], n_cols: usize) {
    row_sums_f32(out, x, n_cols);
}

mod bf16;
mod gated;
mod route;
mod rows;
pub use bf16::{bf16_to_f32, f32_to_bf16};
pub use gated::{geglu_f32, geglu_f32_bf16, swiglu_f32, swiglu_f32_bf16};
pub use route::{combine_experts_f32, route, route_experts_f32};
pub use rows::{gather_rows_f32, scatter_add_rows_f32};
mod sampling;
pub use sampling::{
    SAMPLE_PARAMS, argmax_f32, draw_bits, hash32, mask_logits_f32, penalize_f32, sample_f32,
    sample_params,
};

#[cfg(test)]
mod tests;
