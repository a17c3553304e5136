//! The CPU reference backend's operations: plain f32 arithmetic, one function per GPU
//! kernel, with the same name and argument order (minus the lengths a slice already carries).
//! They are the oracle the GPU kernels are tested against, so each reads as the equation it
//! implements; rayon spreads independent rows over cores where that costs no clarity.
//!
//! Shapes use `n` for the number of tokens in the batch.

use rayon::prelude::*;

use crate::block_manager::BLOCK_SIZE;

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

/// A bf16 (the top half of an f32's bits) as f32.
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
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

/// `out[o] = sum_i w[o, i] * x[i] + bias[o]` for one token, weights in bf16: the twin of
/// the GPU's decode matmul.
///
/// - `out`: `[n_out]`
/// - `x`: `[n_in]`
/// - `w`: `[n_out, n_in]` bf16 bits
/// - `bias`: `[n_out]` or none
pub fn gemv_bf16(out: &mut [f32], x: &[f32], w: &[u16], bias: Option<&[f32]>, n_in: usize) {
    out.par_iter_mut().enumerate().for_each(|(o, y)| {
        let row = &w[o * n_in..(o + 1) * n_in];
        let sum: f32 = row.iter().zip(x).map(|(&w, x)| bf16_to_f32(w) * x).sum();
        *y = sum + bias.map_or(0.0, |b| b[o]);
    });
}

/// `out[t, o] = sum_i x[t, i] * w[o, i] + bias[o]` for many tokens, weights in bf16: the
/// twin of the GPU's prefill matmul.
///
/// - `out`: `[n, n_out]`
/// - `x`: `[n, n_in]`
/// - `w`: `[n_out, n_in]` bf16 bits
/// - `bias`: `[n_out]` or none
pub fn gemm_bf16(out: &mut [f32], x: &[f32], w: &[u16], bias: Option<&[f32]>, n_in: usize) {
    let n_out = w.len() / n_in;
    out.par_chunks_mut(n_out)
        .zip(x.par_chunks(n_in))
        .for_each(|(y, xr)| gemv_bf16(y, xr, w, bias, n_in));
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

/// Causal grouped-query attention over the paged KV cache.
///
/// Token `t` (of sequence `token_seq[t]`, at position `positions[t]`) attends, in each query
/// head `h`, to the keys and values of its own sequence at positions `0..=positions[t]`,
/// read through that sequence's block table from KV head `h / (n_heads / n_kv_heads)`:
/// `out = softmax(q k^T / sqrt(head_dim)) v`. Its own key must already be in the cache.
///
/// The softmax is computed online (one pass: a running maximum, and the sum and the weighted
/// values rescaled whenever the maximum grows), the form the GPU kernels use.
///
/// - `out`, `q`: `[n, n_heads, head_dim]`
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * BLOCK_SIZE, n_kv_heads, head_dim]`
/// - `block_tables`: `[n_seqs, max_blocks]`
/// - `token_seq`, `positions`: `[n]`
#[allow(clippy::too_many_arguments)]
pub fn attention_f32(
    out: &mut [f32],
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    block_tables: &[u32],
    token_seq: &[u32],
    positions: &[u32],
    max_blocks: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
) {
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
            for p in 0..=positions[t] as usize {
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

/// SwiGLU: `out[i] = silu(gate[i]) * up[i]`, silu(x) = x / (1 + e^-x).
///
/// - `out`, `gate`, `up`: `[n, ffn_dim]`
pub fn swiglu_f32(out: &mut [f32], gate: &[f32], up: &[f32]) {
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

/// The residual connection: `x[i] += delta[i]`.
///
/// - `x`, `delta`: `[n, dim]`
pub fn residual_add_f32(x: &mut [f32], delta: &[f32]) {
    for (x, d) in x.iter_mut().zip(delta) {
        *x += d;
    }
}

/// Index of the largest logit (the first, on a tie). Greedy decoding.
///
/// - `logits`: `[vocab]`
pub fn argmax_f32(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rmsnorm_of_constant_row_is_weight() {
        let mut out = [0.0; 4];
        rmsnorm_f32(&mut out, &[3.0; 4], &[1.0, 2.0, 3.0, 4.0], 0.0);
        assert_eq!(out, [1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn matmul_one_and_many_tokens() {
        // w = [[1, 2], [3, 4], [5, 6]]: out = x w^T + b
        let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut one = [0.0; 3];
        matmul_f32(&mut one, &[1.0, 1.0], &w, Some(&[0.5, 0.0, -1.0]), 2);
        assert_eq!(one, [3.5, 7.0, 10.0]);
        let mut two = [0.0; 6];
        matmul_f32(&mut two, &[1.0, 0.0, 0.0, 2.0], &w, None, 2);
        assert_eq!(two, [1.0, 3.0, 5.0, 4.0, 8.0, 12.0]);
    }

    #[test]
    fn rope_turns_pairs_by_the_angle() {
        // head_dim 4: pairs (0, 2) and (1, 3); position 1 at angles pi/2 and 0.
        let cos = [1.0, 1.0, 0.0, 1.0];
        let sin = [0.0, 0.0, 1.0, 0.0];
        let mut x = [1.0, 2.0, 3.0, 4.0];
        rope_f32(&mut x, &[1], &cos, &sin, 1, 4);
        assert_eq!(x, [-3.0, 2.0, 1.0, 4.0]);
    }

    #[test]
    fn attention_weights_values_by_softmax_through_the_block_table() {
        // head_dim 1, one head, a sequence of two tokens living in block 1.
        let mut k_cache = vec![0.0; 2 * BLOCK_SIZE];
        let mut v_cache = vec![0.0; 2 * BLOCK_SIZE];
        kv_write_f32(
            &mut k_cache,
            &mut v_cache,
            &[0.0, 2.0f32.ln()],
            &[10.0, 20.0],
            &[16, 17],
            1,
        );
        let mut out = [0.0; 2];
        attention_f32(
            &mut out,
            &[1.0, 1.0],
            &k_cache,
            &v_cache,
            &[1],
            &[0, 0],
            &[0, 1],
            1,
            1,
            1,
            1,
        );
        assert_eq!(out[0], 10.0, "the first token sees only itself");
        // scores 0 and ln 2: weights 1/3 and 2/3.
        assert!(
            (out[1] - (10.0 / 3.0 + 40.0 / 3.0)).abs() < 1e-5,
            "{}",
            out[1]
        );
    }

    #[test]
    fn swiglu_and_argmax() {
        let mut o = [0.0; 2];
        swiglu_f32(&mut o, &[0.0, 1.0], &[5.0, 2.0]);
        assert_eq!(o[0], 0.0);
        assert!((o[1] - 2.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-7);
        assert_eq!(argmax_f32(&[1.0, 3.0, 3.0, -1.0]), 1);
    }
}
