//! Causal grouped-query attention over the paged KV cache.

use crate::device::{WARP, block_dim_x, block_idx_x, block_idx_y, dynamic_shared, exp, sqrt, sync_threads, thread_idx_x, warp_sum};

/// Most dimensions of a head one lane holds: `head_dim <= 32 * MAX_PER_LANE` = 128, the
/// widest head of the Llama family. Holding only what a 128-wide head needs keeps the split
/// kernel's four keys and values in ~60 registers, so eight of its blocks fit on an SM.
const MAX_PER_LANE: usize = 4;

/// For token `t` (row `blockIdx.y`) and query head `h` (`blockIdx.x`):
/// `out[t, h] = softmax(q[t, h] . K^T / sqrt(head_dim)) V` over the keys and values of the
/// token's own sequence at positions `0..=positions[t]`, read from KV head
/// `h / (n_heads / n_kv_heads)` through the sequence's block table.
///
/// - `out`, `q`: `[n, n_heads, head_dim]` f32
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * 16, n_kv_heads, head_dim]` f32
/// - `block_tables`: `[n_seqs, max_blocks]` u32; `token_seq`, `positions`: `[n]` u32
///
/// Thread mapping: one block per (head, token). Its warps take keys in turn (warp `w` takes
/// positions `w, w + n_warps, ...`); within a warp, lane `l` holds dimensions
/// `l, l + 32, ...` (those below `head_dim`) of q, of each key and of its running output, so every load is coalesced
/// and a dot product is one shuffle reduction. Each warp keeps an online softmax (running
/// maximum `m`, running sum `l`, output rescaled when `m` grows); at the end the warps' partial
/// results meet in shared memory and are merged with the same rescaling.
///
/// PRECONDITIONS: `head_dim <= 128`; `blockDim.x` a multiple of 32;
/// dynamic shared memory `n_warps * (head_dim + 2) * 4` bytes; the token's own key and value
/// already written; every block-table entry it reads valid.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn attention_f32(
    out: *mut f32,
    q: *const f32,
    k_cache: *const f32,
    v_cache: *const f32,
    block_tables: *const u32,
    token_seq: *const u32,
    positions: *const u32,
    max_blocks: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
) {
    let (n_heads, n_kv_heads, head_dim) = (n_heads as usize, n_kv_heads as usize, head_dim as usize);
    let (h, t) = (block_idx_x(), block_idx_y());
    let (lane, warp, n_warps) = (thread_idx_x() % WARP, thread_idx_x() / WARP, block_dim_x() / WARP);
    let kv_dim = n_kv_heads * head_dim;
    let kv_off = (h / (n_heads / n_kv_heads)) * head_dim;
    let scale = 1.0 / sqrt(head_dim as f32);

    // SAFETY (all reads below): t < n; the table row and slots are valid (preconditions);
    // every d = lane + 32 e read is checked against head_dim.
    let (pos, table) = unsafe {
        (*positions.add(t) as usize, block_tables.add(*token_seq.add(t) as usize * max_blocks as usize))
    };
    let q_row = unsafe { q.add((t * n_heads + h) * head_dim) };
    let mut q_reg = [0.0f32; MAX_PER_LANE];
    for e in 0..MAX_PER_LANE {
        if lane + WARP * e < head_dim {
            q_reg[e] = unsafe { *q_row.add(lane + WARP * e) } * scale;
        }
    }

    let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
    let mut acc = [0.0f32; MAX_PER_LANE];
    let mut p = warp;
    while p <= pos {
        let slot = unsafe { *table.add(p / 16) } as usize * 16 + p % 16;
        let base = slot * kv_dim + kv_off;
        let mut partial = 0.0f32;
        for e in 0..MAX_PER_LANE {
            if lane + WARP * e < head_dim {
                partial += q_reg[e] * unsafe { *k_cache.add(base + lane + WARP * e) };
            }
        }
        let score = warp_sum(partial);
        let m_new = m.max(score);
        let rescale = exp(m - m_new); // e^-inf = 0 on the first key
        let weight = exp(score - m_new);
        l = l * rescale + weight;
        for e in 0..MAX_PER_LANE {
            if lane + WARP * e < head_dim {
                acc[e] = acc[e] * rescale + weight * unsafe { *v_cache.add(base + lane + WARP * e) };
            }
        }
        m = m_new;
        p += n_warps;
    }

    // Merge the warps: shared holds m and l per warp, then each warp's output row.
    // [n_warps] m, [n_warps] l, [n_warps, head_dim] acc
    let sm = dynamic_shared::<f32>();
    unsafe {
        let (sl, sacc) = (sm.add(n_warps), sm.add(2 * n_warps));
        if lane == 0 {
            *sm.add(warp) = m;
            *sl.add(warp) = l;
        }
        for e in 0..MAX_PER_LANE {
            if lane + WARP * e < head_dim {
                *sacc.add(warp * head_dim + lane + WARP * e) = acc[e];
            }
        }
        sync_threads();
        // Warp 0 processed position 0, so the maximum is finite and no weight is NaN.
        let mut m_all = f32::NEG_INFINITY;
        for w in 0..n_warps {
            m_all = m_all.max(*sm.add(w));
        }
        let mut denom = 0.0f32;
        for w in 0..n_warps {
            denom += *sl.add(w) * exp(*sm.add(w) - m_all);
        }
        let out_row = out.add((t * n_heads + h) * head_dim);
        let mut d = thread_idx_x();
        while d < head_dim {
            let mut num = 0.0f32;
            for w in 0..n_warps {
                num += *sacc.add(w * head_dim + d) * exp(*sm.add(w) - m_all);
            }
            *out_row.add(d) = num / denom;
            d += block_dim_x();
        }
    }
}

/// Flash-decoding, first half: the context is cut into splits of `split_len` positions, and
/// each block handles one split for one KV head and every query head that shares it, writing
/// an unnormalised partial result: the running maximum `m`, the sum `l` of `e^(score - m)`,
/// and the weighted sum of values. `attention_combine_f32` merges the splits. Long contexts
/// then spread over many blocks instead of serialising in one per head, and the query heads
/// of a group read each key and value once, together.
///
/// - `partial_o`: `[n, n_heads, n_splits, head_dim]` f32
/// - `partial_ml`: `[n, n_heads, n_splits, 2]` f32 (m, l)
/// - `q`: `[n, n_heads, head_dim]` f32; caches, tables, `token_seq`, `positions` as in
///   `attention_f32`
///
/// Thread mapping: grid `(n_kv_heads, n_splits, n)`; block `32 * group` threads, warp `g`
/// for query head `kv_head * group + g`; each warp walks its split's positions in order,
/// lane `l` holding dimensions `l, l + 32, ...` of the head. A split past the token's
/// position writes m = -inf, l = 0.
///
/// PRECONDITIONS: `head_dim <= 128`; `blockDim.x == 32 * (n_heads / n_kv_heads)`;
/// `n_splits * split_len > positions[t]` for every token.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn attention_split_f32(
    partial_o: *mut f32,
    partial_ml: *mut f32,
    q: *const f32,
    k_cache: *const f32,
    v_cache: *const f32,
    block_tables: *const u32,
    token_seq: *const u32,
    positions: *const u32,
    max_blocks: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    split_len: u32,
) {
    use crate::device::{block_idx_z, grid_dim_y};
    let (n_heads, n_kv_heads, head_dim) = (n_heads as usize, n_kv_heads as usize, head_dim as usize);
    let (kv_head, split, t) = (block_idx_x(), block_idx_y(), block_idx_z());
    let n_splits = grid_dim_y();
    let (lane, warp) = (thread_idx_x() % WARP, thread_idx_x() / WARP);
    let h = kv_head * (n_heads / n_kv_heads) + warp;
    let kv_dim = n_kv_heads * head_dim;
    let kv_off = kv_head * head_dim;
    let scale = 1.0 / sqrt(head_dim as f32);
    // SAFETY (all accesses): t < n, h < n_heads, split < n_splits; dimensions checked against
    // head_dim; positions and block tables valid (preconditions).
    unsafe {
        let pos = *positions.add(t) as usize;
        let table = block_tables.add(*token_seq.add(t) as usize * max_blocks as usize);
        let q_row = q.add((t * n_heads + h) * head_dim);
        let mut q_reg = [0.0f32; MAX_PER_LANE];
        for e in 0..MAX_PER_LANE {
            if lane + WARP * e < head_dim {
                q_reg[e] = *q_row.add(lane + WARP * e) * scale;
            }
        }
        let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
        let mut acc = [0.0f32; MAX_PER_LANE];
        let start = split * split_len as usize;
        let end = (start + split_len as usize).min(pos + 1);
        // Keys four at a time: four independent loads and dot products in flight, one
        // softmax update for all four. One key at a time, every step would wait a full memory
        // latency for its key before it could ask for the next.
        let mut p = start;
        while p < end {
            // Keys past `end` repeat the last one with weight zero: every lane runs the same
            // straight-line code. The four keys are spelled out (not indexed arrays) so that
            // they stay in registers.
            let base = |j: usize| {
                let k = (p + j).min(end - 1);
                (*table.add(k / 16) as usize * 16 + k % 16) * kv_dim + kv_off
            };
            let (b0, b1, b2, b3) = (base(0), base(1), base(2), base(3));
            // Every key and value of the four first, then the arithmetic: one memory
            // latency per round instead of two.
            let (mut k0, mut k1, mut k2, mut k3) = ([0.0f32; MAX_PER_LANE], [0.0f32; MAX_PER_LANE], [0.0f32; MAX_PER_LANE], [0.0f32; MAX_PER_LANE]);
            let (mut v0, mut v1, mut v2, mut v3) = ([0.0f32; MAX_PER_LANE], [0.0f32; MAX_PER_LANE], [0.0f32; MAX_PER_LANE], [0.0f32; MAX_PER_LANE]);
            for e in 0..MAX_PER_LANE {
                let d = lane + WARP * e;
                if d < head_dim {
                    (k0[e], k1[e], k2[e], k3[e]) = (*k_cache.add(b0 + d), *k_cache.add(b1 + d), *k_cache.add(b2 + d), *k_cache.add(b3 + d));
                    (v0[e], v1[e], v2[e], v3[e]) = (*v_cache.add(b0 + d), *v_cache.add(b1 + d), *v_cache.add(b2 + d), *v_cache.add(b3 + d));
                }
            }
            let score = |k: &[f32; MAX_PER_LANE], j: usize| {
                let mut partial = 0.0f32;
                for e in 0..MAX_PER_LANE {
                    partial += q_reg[e] * k[e]; // q_reg is zero past head_dim
                }
                let s = warp_sum(partial);
                if p + j < end { s } else { f32::NEG_INFINITY }
            };
            let (s0, s1, s2, s3) = (score(&k0, 0), score(&k1, 1), score(&k2, 2), score(&k3, 3));
            let m_new = m.max(s0).max(s1).max(s2).max(s3);
            let rescale = exp(m - m_new);
            let (w0, w1, w2, w3) = (exp(s0 - m_new), exp(s1 - m_new), exp(s2 - m_new), exp(s3 - m_new));
            l = l * rescale + w0 + w1 + w2 + w3;
            for e in 0..MAX_PER_LANE {
                acc[e] = acc[e] * rescale + w0 * v0[e] + w1 * v1[e] + w2 * v2[e] + w3 * v3[e];
            }
            m = m_new;
            p += 4;
        }
        let at = (t * n_heads + h) * n_splits + split;
        for e in 0..MAX_PER_LANE {
            if lane + WARP * e < head_dim {
                *partial_o.add(at * head_dim + lane + WARP * e) = acc[e];
            }
        }
        if lane == 0 {
            *partial_ml.add(2 * at) = m;
            *partial_ml.add(2 * at + 1) = l;
        }
    }
}

/// Flash-decoding, second half: `out[t, h] = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s`
/// over the splits `s`, with `M` the largest `m_s`.
///
/// - `out`: `[n, n_heads, head_dim]` f32
/// - `partial_o`, `partial_ml`: as `attention_split_f32` wrote them
///
/// Thread mapping: one block per (head, token) (`blockIdx.x`, `blockIdx.y`). The threads
/// first find `M` and each split's weight together (a block reduction; the weights go to
/// shared memory), then stride over the head's dimensions, each summing over the splits with
/// eight independent loads in flight.
///
/// PRECONDITIONS: split 0 of every (token, head) is non-empty (position 0 is always there),
/// so `M` is finite; `blockDim.x` a multiple of 32; dynamic shared memory
/// `(32 + n_splits) * 4` bytes.
///
/// # Safety
/// Buffers as above, `n_splits` splits each.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn attention_combine_f32(
    out: *mut f32,
    partial_o: *const f32,
    partial_ml: *const f32,
    n_splits: u32,
    head_dim: u32,
) {
    use crate::device::{block_sum, warp_max};
    let (n_splits, head_dim) = (n_splits as usize, head_dim as usize);
    let (h, t) = (block_idx_x(), block_idx_y());
    let n_heads = crate::device::grid_dim_x();
    let th = t * n_heads + h;
    let (tid, lane, warp) = (thread_idx_x(), thread_idx_x() % WARP, thread_idx_x() / WARP);
    // Shared: [32] reduction scratch, then [n_splits] split weights e^(m_s - M) / denominator.
    let scratch = dynamic_shared::<f32>();
    // SAFETY: th < n * n_heads; s < n_splits; d < head_dim; shared memory holds 32 +
    // n_splits floats (launch); every thread reaches every barrier.
    unsafe {
        let weights = scratch.add(WARP);
        let ml = partial_ml.add(2 * th * n_splits);
        // The largest maximum, over the splits spread across the block.
        let mut m = f32::NEG_INFINITY;
        let mut s = tid;
        while s < n_splits {
            m = m.max(*ml.add(2 * s));
            s += block_dim_x();
        }
        m = warp_max(m);
        if lane == 0 {
            *scratch.add(warp) = m;
        }
        sync_threads();
        let mut m_all = f32::NEG_INFINITY;
        for w in 0..block_dim_x() / WARP {
            m_all = m_all.max(*scratch.add(w));
        }
        sync_threads();
        // Each split's weight, and their sum (the softmax denominator).
        let mut part = 0.0f32;
        let mut s = tid;
        while s < n_splits {
            let w = exp(*ml.add(2 * s) - m_all);
            *weights.add(s) = w;
            part += *ml.add(2 * s + 1) * w;
            s += block_dim_x();
        }
        let denom = block_sum(part, scratch);
        // Each output dimension: a weighted sum over the splits, eight loads in flight.
        let o = partial_o.add(th * n_splits * head_dim);
        let mut d = tid;
        while d < head_dim {
            let mut acc = [0.0f32; 8];
            let mut s = 0;
            while s + 8 <= n_splits {
                for j in 0..8 {
                    acc[j] += *o.add((s + j) * head_dim + d) * *weights.add(s + j);
                }
                s += 8;
            }
            let mut num = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
            while s < n_splits {
                num += *o.add(s * head_dim + d) * *weights.add(s);
                s += 1;
            }
            *out.add(th * head_dim + d) = num / denom;
            d += block_dim_x();
        }
    }
}
