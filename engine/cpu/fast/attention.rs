//! Causal grouped-query attention over the bf16 paged KV cache, one task per (token, KV
//! head) spread over the pool: the twin of `ops::attention_bf16`, computed in two passes
//! (all scores, then the softmax-weighted values) so that each pass is a plain loop the
//! compiler vectorizes, rather than the reference's one-pass online softmax.

use std::cell::RefCell;
use std::ops::Range;

use rayon::prelude::*;

use crate::cpu::ops::{Paged, PagedRef};
use crate::kv::block_manager::BLOCK_SIZE;

use super::cpu_features::features;
use super::dot::dot_f32;

thread_local! {
    /// `[positions]` one task's scores, grown to the longest context seen.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Writes each token's key and value rows into its cache slot, rounded to bf16.
///
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * BLOCK_SIZE, kv_dim]` bf16 bits
/// - `k`, `v`: `[n, kv_dim]`
/// - `slots`: `[n]`
pub fn kv_write_bf16(
    k_cache: &mut [u16],
    v_cache: &mut [u16],
    k: &[f32],
    v: &[f32],
    slots: &[u32],
    kv_dim: usize,
) {
    for (t, &slot) in slots.iter().enumerate() {
        let dst = slot as usize * kv_dim..(slot as usize + 1) * kv_dim;
        let src = t * kv_dim..(t + 1) * kv_dim;
        for (c, &x) in k_cache[dst.clone()].iter_mut().zip(&k[src.clone()]) {
            *c = half::bf16::from_f32(x).to_bits();
        }
        for (c, &x) in v_cache[dst].iter_mut().zip(&v[src]) {
            *c = half::bf16::from_f32(x).to_bits();
        }
    }
}

/// `out = softmax(q k^T / sqrt(head_dim)) v` per token and head, over the token's own
/// sequence up to its position, from the window's first where the shape has one (see
/// `ops::attention_f32` for the arguments).
///
/// - `out`, `q`: `[n, n_heads, head_dim]`
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * BLOCK_SIZE, n_kv_heads * head_dim]` bf16
/// - `block_tables`: `[n_seqs, max_blocks]`; `token_seq`, `positions`: `[n]`
pub fn attention_bf16(out: &mut [f32], p: &PagedRef<u16>) {
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
    let a = Args {
        k_cache,
        v_cache,
        block_tables,
        max_blocks,
        group: n_heads / n_kv_heads,
        kv_dim: n_kv_heads * head_dim,
        head_dim,
    };
    let wide = features().avx2;
    let group = n_heads / n_kv_heads;
    // One task per (token, KV head): the group's query heads share each key and value row,
    // widened from bf16 once for all of them.
    out.par_chunks_mut(group * head_dim)
        .zip(q.par_chunks(group * head_dim))
        .enumerate()
        .for_each(|(tk, (o, q))| {
            let (t, kv) = (tk / n_kv_heads, tk % n_kv_heads);
            let seq = token_seq[t] as usize;
            let last = positions[t] as usize;
            let run = shape.first_position(last)..last + 1;
            let len = run.len();
            SCORES.with_borrow_mut(|buf| {
                let need = group * len + head_dim;
                if buf.len() < need {
                    buf.resize(need, 0.0);
                }
                let buf = &mut buf[..need];
                #[cfg(target_arch = "x86_64")]
                if wide {
                    // SAFETY: `features` found AVX2 and FMA.
                    return unsafe { group_avx2(&a, o, q, buf, seq, kv, run) };
                }
                let _ = wide;
                group_heads(&a, o, q, buf, seq, kv, run)
            })
        });
}

struct Args<'a> {
    k_cache: &'a [u16],
    v_cache: &'a [u16],
    block_tables: &'a [u32],
    max_blocks: usize,
    group: usize,
    kv_dim: usize,
    head_dim: usize,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn group_avx2(
    a: &Args,
    o: &mut [f32],
    q: &[f32],
    buf: &mut [f32],
    seq: usize,
    kv: usize,
    run: Range<usize>,
) {
    group_heads(a, o, q, buf, seq, kv, run)
}

fn widen(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// One (token, KV head) over the positions of `run` (`len` of them): the scores of each of the group's query heads
/// (`q`, `o`: `[group, head_dim]`), their softmax, then the weighted values. `buf`: `[group,
/// len]` scores, then `[head_dim]` for the widened key or value row.
#[inline(always)]
fn group_heads(
    a: &Args,
    o: &mut [f32],
    q: &[f32],
    buf: &mut [f32],
    seq: usize,
    kv: usize,
    run: Range<usize>,
) {
    let (hd, g, len) = (a.head_dim, a.group, run.len());
    let (scores, row) = buf.split_at_mut(g * len);
    let table = &a.block_tables[seq * a.max_blocks..(seq + 1) * a.max_blocks];
    let col = kv * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    // The i-th position of the run.
    let at = |i: usize| {
        let p = run.start + i;
        (table[p / BLOCK_SIZE] as usize * BLOCK_SIZE + p % BLOCK_SIZE) * a.kv_dim + col
    };
    for p in 0..len {
        for (r, &k) in row.iter_mut().zip(&a.k_cache[at(p)..at(p) + hd]) {
            *r = widen(k);
        }
        for (j, q) in q.chunks_exact(hd).enumerate() {
            scores[j * len + p] = dot_f32(q, row) * scale;
        }
    }
    // Each head's softmax, its weights normalised in place.
    for s in scores.chunks_exact_mut(len) {
        let max = s.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut sum = 0f32;
        for s in s.iter_mut() {
            *s = super::math::exp_f32(*s - max);
            sum += *s;
        }
        let inv = 1.0 / sum;
        s.iter_mut().for_each(|s| *s *= inv);
    }
    o.fill(0.0);
    for p in 0..len {
        for (r, &v) in row.iter_mut().zip(&a.v_cache[at(p)..at(p) + hd]) {
            *r = widen(v);
        }
        for (j, o) in o.chunks_exact_mut(hd).enumerate() {
            let w = scores[j * len + p];
            for (o, &v) in o.iter_mut().zip(row.iter()) {
                *o += w * v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::ops::{self, Heads, PagedShape};
    use rand::{Rng, SeedableRng, rngs::StdRng};

    /// Two sequences through scattered blocks, a prompt's tokens and a decode token, GQA of
    /// 3 query heads per KV head: against `ops::attention_bf16` on the same cache.
    #[test]
    fn attention_matches_the_reference() {
        let mut rng = StdRng::seed_from_u64(9);
        let (n_heads, n_kv, hd) = (6, 2, 64);
        let kv_dim = n_kv * hd;
        let n_blocks = 8;
        let mut bits = |n: usize| -> Vec<u16> {
            (0..n)
                .map(|_| half::bf16::from_f32(rng.random_range(-1.0..1.0)).to_bits())
                .collect()
        };
        let k = bits(n_blocks * BLOCK_SIZE * kv_dim);
        let v = bits(n_blocks * BLOCK_SIZE * kv_dim);
        // Sequence 0 in blocks 5, 2, 7 (40 tokens, its last 20 in this batch); sequence 1 in
        // block 3, one decode token at position 9.
        let tables = [5, 2, 7, 3, 0, 0];
        let mut positions: Vec<u32> = (20..40).collect();
        positions.push(9);
        let mut token_seq = vec![0u32; 20];
        token_seq.push(1);
        let n = positions.len();
        let q: Vec<f32> = (0..n * n_heads * hd)
            .map(|_| rng.random_range(-2.0..2.0))
            .collect();
        // Every position, then sliding windows: of one position (the token's own value
        // row), across a block's edge, and wider than every sequence.
        for window in [None, Some(1), Some(7), Some(16), Some(100)] {
            let mut want = vec![0f32; q.len()];
            let p = Paged {
                q: &q[..],
                k_cache: &k[..],
                v_cache: &v[..],
                block_tables: &tables[..],
                token_seq: &token_seq[..],
                positions: &positions[..],
                shape: PagedShape::new(3, Heads::new(n_heads, n_kv, hd)).windowed(window),
            };
            ops::attention_bf16(&mut want, &p);
            let mut out = vec![f32::NAN; q.len()];
            attention_bf16(&mut out, &p);
            let worst = out
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                worst < 1e-5,
                "window {window:?}: largest difference {worst:e}"
            );
            if window == Some(1) {
                for (t, &pos) in positions.iter().enumerate() {
                    let pos = pos as usize;
                    let table = &tables[token_seq[t] as usize * 3..];
                    let slot = table[pos / BLOCK_SIZE] as usize * BLOCK_SIZE + pos % BLOCK_SIZE;
                    for h in 0..n_heads {
                        let at = slot * kv_dim + h / (n_heads / n_kv) * hd;
                        let own: Vec<f32> = v[at..at + hd].iter().map(|&b| widen(b)).collect();
                        let got = &want[(t * n_heads + h) * hd..][..hd];
                        assert!(own.iter().zip(got).all(|(a, b)| (a - b).abs() < 1e-6));
                    }
                }
            }
            // A window wider than the context is no window.
            if window == Some(100) {
                let mut all = vec![0f32; q.len()];
                let every = Paged {
                    shape: p.shape.windowed(None),
                    ..p
                };
                ops::attention_bf16(&mut all, &every);
                assert_eq!(all, want);
            }
        }
    }
}
