//! The attention twins: causal grouped-query attention over the paged KV cache, in f32 and
//! over a bf16 cache, the tensor-core forms' rounding, and flash-decoding's two halves
//! (the splits and their combine), each the twin of the GPU kernel of its name.

use rayon::prelude::*;

use super::bf16::{bf16_to_f32, f32_to_bf16};
use super::dot::dot;
use crate::kernel_args::{Paged, Splits};
use crate::kv::block_manager::BLOCK_SIZE;

/// A paged attention's inputs on the host (`kernel_args::Paged`): the queries, one layer's
/// cache of `K`, and the batch's map into it.
pub type PagedRef<'a, K> = Paged<&'a [f32], &'a [K], &'a [u32]>;

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
