//! Causal grouped-query attention over the paged KV cache.

use crate::args::{Heads, PagedShape, Splits};
use crate::device::{
    WARP, bf16_to_f32, block_dim_x, block_idx_x, block_idx_y, dynamic_shared, exp, sqrt,
    sync_threads, thread_idx_x, warp_sum,
};
use crate::kv_fp8::{kv_dequant_factor, kv_e4m3_bits_f32};
use crate::tiles::{BLOCK_SIZE, COMBINE_IN_FLIGHT, MAX_HEAD_DIM, SPLIT_MAX_HEAD_DIM};

/// Most dimensions of a head one lane holds in the per-head kernels: `head_dim <= 32 *
/// MAX_PER_LANE` = `MAX_HEAD_DIM`.
const MAX_PER_LANE: usize = MAX_HEAD_DIM / 32;

/// The same in the per-lane split kernel: only what a 128-wide head (the Llama family's
/// widest) needs, which keeps its four keys and values in ~60 registers, so eight of its
/// blocks fit on an SM.
const SPLIT_PER_LANE: usize = SPLIT_MAX_HEAD_DIM / 32;

/// For token `t` (row `blockIdx.y`) and query head `h` (`blockIdx.x`):
/// `out[t, h] = softmax(q[t, h] . K^T / sqrt(head_dim)) V` over the keys and values of the
/// token's own sequence at positions `0..=positions[t]` (from `positions[t] + 1 - window`
/// where `shape` has a sliding window), read from KV head `h / (n_heads / n_kv_heads)`
/// through the sequence's block table.
///
/// The first step of the lesson's attention, over an f32 cache (the CPU reference's): the
/// backend runs the same body over its bf16 cache (`attention_bf16`), flash-decoding
/// (`attention_split_bf16`) or tensor cores (`attention_mma_bf16`).
///
/// - `out`, `q`: `[n, n_heads, head_dim]` f32
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * 16, n_kv_heads, head_dim]` f32
/// - `block_tables`: `[n_seqs, max_blocks]` u32; `token_seq`, `positions`: `[n]` u32
/// - `shape`: the heads and the block tables' stride
///
/// Thread mapping: one block per (head, token). Its warps take keys in turn (warp `w` takes
/// the first position plus `w`, `w + n_warps`, ...); within a warp, lane `l` holds dimensions
/// `l, l + 32, ...` (those below `head_dim`) of q, of each key and of its running output, so every load is coalesced
/// and a dot product is one shuffle reduction. Each warp keeps an online softmax (running
/// maximum `m`, running sum `l`, output rescaled when `m` grows); at the end the warps' partial
/// results meet in shared memory and are merged with the same rescaling.
///
/// PRECONDITIONS: `head_dim <= MAX_HEAD_DIM` (256); `blockDim.x` a multiple of 32;
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
    shape: PagedShape,
) {
    let input = PagedIn {
        q,
        k_cache,
        v_cache,
        scales: (core::ptr::null(), core::ptr::null()),
        block_tables,
        token_seq,
        positions,
    };
    // SAFETY: the preconditions, passed on.
    unsafe { per_head(out, input, shape) }
}

/// As `attention_f32`, over a bf16 cache (`k_cache`, `v_cache`: `[n_blocks * 16, n_kv_heads,
/// head_dim]` bf16): the backend's attention for prompts that mix sequences.
///
/// # Safety
/// As `attention_f32`.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn attention_bf16(
    out: *mut f32,
    q: *const f32,
    k_cache: *const u16,
    v_cache: *const u16,
    block_tables: *const u32,
    token_seq: *const u32,
    positions: *const u32,
    shape: PagedShape,
) {
    let input = PagedIn {
        q,
        k_cache,
        v_cache,
        scales: (core::ptr::null(), core::ptr::null()),
        block_tables,
        token_seq,
        positions,
    };
    // SAFETY: the preconditions, passed on.
    unsafe { per_head(out, input, shape) }
}

/// As `attention_bf16`, over the fp8 cache (`--kv-dtype fp8`): `k_cache`, `v_cache` one
/// layer's e4m3 bytes `[n_blocks * 16, n_kv_heads, head_dim]`, `k_scales`, `v_scales` its
/// scale bytes `[n_blocks, n_kv_heads, 16]` (`qkv_rope_write_fp8`). Each value is read as
/// the bf16 cache would hold it: e4m3 times its row's power of two, exactly
/// (`kv_fp8.rs`).
///
/// # Safety
/// As `attention_f32`.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn attention_fp8(
    out: *mut f32,
    q: *const f32,
    k_cache: *const u8,
    v_cache: *const u8,
    k_scales: *const u8,
    v_scales: *const u8,
    block_tables: *const u32,
    token_seq: *const u32,
    positions: *const u32,
    shape: PagedShape,
) {
    let input = PagedIn {
        q,
        k_cache,
        v_cache,
        scales: (k_scales, v_scales),
        block_tables,
        token_seq,
        positions,
    };
    // SAFETY: the preconditions, passed on.
    unsafe { per_head(out, input, shape) }
}

/// A cache element: f32, bf16 bits, or an e4m3 byte of a row with a scale.
trait KvElem: Copy {
    /// What the elements of the row at `(slot, kv_head)` are multiplied by, from the
    /// cache's `scales` (`[n_blocks, n_kv_heads, 16]`; unread but by e4m3).
    ///
    /// # Safety
    /// The slot's block and the head are inside `scales` where it is read.
    unsafe fn factor(scales: *const u8, slot: usize, kv_head: usize, n_kv_heads: usize) -> f32;

    /// Element `i` of `p`, as f32, its row's `factor` applied.
    ///
    /// # Safety
    /// `p.add(i)` is readable.
    unsafe fn load(p: *const Self, i: usize, factor: f32) -> f32;
}

impl KvElem for f32 {
    #[inline(always)]
    unsafe fn factor(_: *const u8, _: usize, _: usize, _: usize) -> f32 {
        1.0
    }

    #[inline(always)]
    unsafe fn load(p: *const f32, i: usize, _: f32) -> f32 {
        // SAFETY: the caller's guarantee.
        unsafe { *p.add(i) }
    }
}

impl KvElem for u16 {
    #[inline(always)]
    unsafe fn factor(_: *const u8, _: usize, _: usize, _: usize) -> f32 {
        1.0
    }

    #[inline(always)]
    unsafe fn load(p: *const u16, i: usize, _: f32) -> f32 {
        // SAFETY: the caller's guarantee.
        bf16_to_f32(unsafe { *p.add(i) })
    }
}

impl KvElem for u8 {
    #[inline(always)]
    unsafe fn factor(scales: *const u8, slot: usize, kv_head: usize, n_kv_heads: usize) -> f32 {
        let at = (slot / BLOCK_SIZE * n_kv_heads + kv_head) * BLOCK_SIZE + slot % BLOCK_SIZE;
        // SAFETY: the caller's guarantee.
        kv_dequant_factor(unsafe { *scales.add(at) })
    }

    #[inline(always)]
    unsafe fn load(p: *const u8, i: usize, factor: f32) -> f32 {
        // SAFETY: the caller's guarantee.
        kv_e4m3_bits_f32(unsafe { *p.add(i) } as u32) * factor
    }
}

/// A paged attention's input pointers, as its entry point was given them: the queries, one
/// layer's cache, and the batch's map into it (shapes as `attention_f32` lists them).
#[derive(Clone, Copy)]
struct PagedIn<T> {
    q: *const f32,
    k_cache: *const T,
    v_cache: *const T,
    /// The keys' and values' scales (null but over the fp8 cache).
    scales: (*const u8, *const u8),
    block_tables: *const u32,
    token_seq: *const u32,
    positions: *const u32,
}

/// The body of `attention_f32`, `attention_bf16` and `attention_fp8`.
///
/// # Safety
/// Their preconditions.
#[inline(always)]
unsafe fn per_head<T: KvElem>(out: *mut f32, input: PagedIn<T>, shape: PagedShape) {
    crate::device::wait_for_previous_kernel();
    let PagedIn {
        q,
        k_cache,
        v_cache,
        scales: (k_scales, v_scales),
        block_tables,
        token_seq,
        positions,
    } = input;
    let max_blocks = shape.max_blocks;
    let Heads {
        n_heads,
        n_kv_heads,
        head_dim,
    } = shape.heads;
    let (n_heads, n_kv_heads, head_dim) =
        (n_heads as usize, n_kv_heads as usize, head_dim as usize);
    let (h, t) = (block_idx_x(), block_idx_y());
    let (lane, warp, n_warps) = (
        thread_idx_x() % WARP,
        thread_idx_x() / WARP,
        block_dim_x() / WARP,
    );
    let kv_dim = n_kv_heads * head_dim;
    let kv_head = h / (n_heads / n_kv_heads);
    let kv_off = kv_head * head_dim;
    let scale = 1.0 / sqrt(head_dim as f32);

    // SAFETY (all reads below): t < n; the table row and slots are valid (preconditions);
    // every d = lane + 32 e read is checked against head_dim.
    let (pos, table) = unsafe {
        (
            *positions.add(t) as usize,
            block_tables.add(*token_seq.add(t) as usize * max_blocks as usize),
        )
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
    // From the window's first position (0 without one), a warp every n_warps positions.
    let first = shape.first_position(pos);
    let mut p = first + warp;
    while p <= pos {
        let slot = unsafe { *table.add(p / BLOCK_SIZE) } as usize * BLOCK_SIZE + p % BLOCK_SIZE;
        let base = slot * kv_dim + kv_off;
        let (k_factor, v_factor) = unsafe {
            (
                T::factor(k_scales, slot, kv_head, n_kv_heads),
                T::factor(v_scales, slot, kv_head, n_kv_heads),
            )
        };
        let mut partial = 0.0f32;
        for e in 0..MAX_PER_LANE {
            if lane + WARP * e < head_dim {
                partial += q_reg[e] * unsafe { T::load(k_cache, base + lane + WARP * e, k_factor) };
            }
        }
        let score = warp_sum(partial);
        let m_new = m.max(score);
        let rescale = exp(m - m_new); // e^-inf = 0 on the first key
        let weight = exp(score - m_new);
        l = l * rescale + weight;
        for e in 0..MAX_PER_LANE {
            if lane + WARP * e < head_dim {
                acc[e] = acc[e] * rescale
                    + weight * unsafe { T::load(v_cache, base + lane + WARP * e, v_factor) };
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
        // Warp 0 processed the first position, so the maximum is finite and no weight is
        // NaN.
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
/// - `q`: `[n, n_heads, head_dim]` f32; caches bf16, tables, `token_seq`, `positions` and
///   `shape` as in `attention_bf16`; `split_len`: positions a split
///
/// Thread mapping: grid `(n_kv_heads, n_splits, n)`; block `32 * group` threads. First the
/// whole block copies the split's keys and values into shared memory with asynchronous
/// copies, every one in flight at once (up to 16 KiB): a single memory latency per block,
/// where walking the keys from global memory waited one per step. Then warp `g`, for query
/// head `kv_head * group + g`, walks the split's positions in shared memory, four at a time,
/// lane `l` holding dimensions `l, l + 32, ...` of the head; it starts on the first half of
/// the split as soon as that half has arrived. A split past the token's
/// position, or before its sliding window's first, writes m = -inf, l = 0.
///
/// PRECONDITIONS: `head_dim <= 128` and `head_dim % 8 == 0`; the caches 16-byte aligned;
/// `blockDim.x == 32 * (n_heads / n_kv_heads)`; `n_splits * split_len > positions[t]` for
/// every token; dynamic shared memory `2 * split_len * head_dim * 2` bytes.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn attention_split_bf16(
    partial_o: *mut f32,
    partial_ml: *mut f32,
    q: *const f32,
    k_cache: *const u16,
    v_cache: *const u16,
    block_tables: *const u32,
    token_seq: *const u32,
    positions: *const u32,
    shape: PagedShape,
    split_len: u32,
) {
    crate::device::wait_for_previous_kernel();
    use crate::device::{block_idx_z, grid_dim_y};
    use crate::mma::{cp_async_16, cp_async_commit, cp_async_wait, shared_addr};
    let max_blocks = shape.max_blocks;
    let Heads {
        n_heads,
        n_kv_heads,
        head_dim,
    } = shape.heads;
    let (n_heads, n_kv_heads, head_dim) =
        (n_heads as usize, n_kv_heads as usize, head_dim as usize);
    let split_len = split_len as usize;
    let (kv_head, split, t) = (block_idx_x(), block_idx_y(), block_idx_z());
    let n_splits = grid_dim_y();
    let (lane, warp) = (thread_idx_x() % WARP, thread_idx_x() / WARP);
    let h = kv_head * (n_heads / n_kv_heads) + warp;
    let kv_dim = n_kv_heads * head_dim;
    let kv_off = kv_head * head_dim;
    let scale = 1.0 / sqrt(head_dim as f32);
    // Shared: k_s then v_s, [split_len][head_dim] bf16 each.
    let k_s = dynamic_shared::<u16>();
    // SAFETY (all accesses): t < n, h < n_heads, split < n_splits; dimensions checked against
    // head_dim; positions and block tables valid; shared memory as the launch gives it
    // (preconditions).
    unsafe {
        let v_s = k_s.add(split_len * head_dim);
        let pos = *positions.add(t) as usize;
        let table = block_tables.add(*token_seq.add(t) as usize * max_blocks as usize);
        // The split's positions that the token attends to: none past its own, none before
        // its window's first.
        let start = (split * split_len).max(shape.first_position(pos));
        let end = ((split + 1) * split_len).min(pos + 1);
        let len = end.saturating_sub(start);

        // Stage the split in two halves, each its own group of copies, so that the warps
        // work on the first while the second is still arriving. Chunk c of 16 bytes is key
        // c / chunks_per_key, eight dimensions.
        let half = (len.div_ceil(8) * 4).min(len);
        let chunks_per_key = head_dim / 8;
        for part in 0..2 {
            let first = part == 0;
            let (lo, hi) = if first { (0, half) } else { (half, len) };
            let mut c = lo * chunks_per_key + thread_idx_x();
            while c < hi * chunks_per_key {
                let (j, d) = (c / chunks_per_key, 8 * (c % chunks_per_key));
                let k = start + j;
                let row = (*table.add(k / BLOCK_SIZE) as usize * BLOCK_SIZE + k % BLOCK_SIZE)
                    * kv_dim
                    + kv_off
                    + d;
                let at = j * head_dim + d;
                cp_async_16(shared_addr(k_s.add(at)), k_cache.add(row), true);
                cp_async_16(shared_addr(v_s.add(at)), v_cache.add(row), true);
                c += block_dim_x();
            }
            cp_async_commit();
        }

        // The query, pre-scaled, while the copies fly.
        let q_row = q.add((t * n_heads + h) * head_dim);
        let mut q_reg = [0.0f32; SPLIT_PER_LANE];
        for e in 0..SPLIT_PER_LANE {
            if lane + WARP * e < head_dim {
                q_reg[e] = *q_row.add(lane + WARP * e) * scale;
            }
        }

        let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
        let mut acc = [0.0f32; SPLIT_PER_LANE];
        for part in 0..2 {
            let first = part == 0;
            let (lo, hi) = if first { (0, half) } else { (half, len) };
            // The first half has landed when at most one group is pending; the second
            // when none is. The barrier makes every thread's copies visible to all.
            if first {
                cp_async_wait::<1>();
            } else {
                cp_async_wait::<0>();
            }
            sync_threads();
            // Keys four at a time, one softmax update for all four. Keys past the half's
            // end repeat its last one with weight zero: every lane runs the same
            // straight-line code. The four keys are spelled out (not indexed arrays) so that
            // they stay in registers.
            let mut j = lo;
            while j < hi {
                let row = |i: usize| (j + i).min(hi - 1) * head_dim;
                let (r0, r1, r2, r3) = (row(0), row(1), row(2), row(3));
                let (mut k0, mut k1, mut k2, mut k3) = (
                    [0.0f32; SPLIT_PER_LANE],
                    [0.0f32; SPLIT_PER_LANE],
                    [0.0f32; SPLIT_PER_LANE],
                    [0.0f32; SPLIT_PER_LANE],
                );
                let (mut v0, mut v1, mut v2, mut v3) = (
                    [0.0f32; SPLIT_PER_LANE],
                    [0.0f32; SPLIT_PER_LANE],
                    [0.0f32; SPLIT_PER_LANE],
                    [0.0f32; SPLIT_PER_LANE],
                );
                for e in 0..SPLIT_PER_LANE {
                    let d = lane + WARP * e;
                    if d < head_dim {
                        let (k, v) = (
                            |r: usize| bf16_to_f32(*k_s.add(r + d)),
                            |r: usize| bf16_to_f32(*v_s.add(r + d)),
                        );
                        (k0[e], k1[e], k2[e], k3[e]) = (k(r0), k(r1), k(r2), k(r3));
                        (v0[e], v1[e], v2[e], v3[e]) = (v(r0), v(r1), v(r2), v(r3));
                    }
                }
                let score = |k: &[f32; SPLIT_PER_LANE], i: usize| {
                    let mut partial = 0.0f32;
                    for e in 0..SPLIT_PER_LANE {
                        partial += q_reg[e] * k[e]; // q_reg is zero past head_dim
                    }
                    let s = warp_sum(partial);
                    if j + i < hi { s } else { f32::NEG_INFINITY }
                };
                let (s0, s1, s2, s3) = (score(&k0, 0), score(&k1, 1), score(&k2, 2), score(&k3, 3));
                let m_new = m.max(s0).max(s1).max(s2).max(s3);
                let rescale = exp(m - m_new);
                let (w0, w1, w2, w3) = (
                    exp(s0 - m_new),
                    exp(s1 - m_new),
                    exp(s2 - m_new),
                    exp(s3 - m_new),
                );
                l = l * rescale + w0 + w1 + w2 + w3;
                for e in 0..SPLIT_PER_LANE {
                    acc[e] = acc[e] * rescale + w0 * v0[e] + w1 * v1[e] + w2 * v2[e] + w3 * v3[e];
                }
                m = m_new;
                j += 4;
            }
        }
        let at = (t * n_heads + h) * n_splits + split;
        for e in 0..SPLIT_PER_LANE {
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
/// over the token's own splits `s` (those holding positions `0..=positions[t]`), with `M`
/// the largest `m_s`.
///
/// - `out`: `[n, n_heads, head_dim]` f32
/// - `partial_o`, `partial_ml`: as `attention_split_f32` wrote them, `n_splits` per row
/// - `positions`: `[n]` u32
/// - `splits`: each row's split count, the positions a split, `head_dim`
///
/// Thread mapping: one block per (head, token) (`blockIdx.x`, `blockIdx.y`); `groups`
/// groups of `head_dim` threads, `own.div_ceil(COMBINE_IN_FLIGHT)` for the token's `own`
/// splits (at most 1024 threads). Thread `d` of group `g` takes dimension `d` of the splits
/// `g, g + groups, ...`: right after the wait for the split kernel it loads the first
/// `COMBINE_IN_FLIGHT` of them, with their `m` and `l`, all at once, beside the maxima the
/// block reduces to `M`; then it adds their weighted values and weighted sums, and the
/// groups' sums meet in shared memory. Up to 8 * 1024 / head_dim splits (2048 positions of
/// a 128-wide head) cost one wait for memory; the kernel this replaced found `M`, then the
/// weights, then walked the values four loads at a time, and waited for memory about five
/// times at 18 splits; this one ran 9-12% faster a launch on the H200
/// (docs/lessons.md#attention).
///
/// The order of every sum depends on the token's own split count alone, never on
/// `n_splits` or the block size (which follow the longest sequence in the batch): a token's
/// result is the same whatever shares its batch.
///
/// PRECONDITIONS: `n_splits * split_len > positions[t]`; `blockDim.x` a multiple of 32 and
/// at least `head_dim * clamp(n_splits.div_ceil(COMBINE_IN_FLIGHT), 1, 1024 / head_dim)`;
/// dynamic shared memory `(32 + n_splits + blockDim.x) * 4` bytes.
///
/// # Safety
/// Buffers as above, `n_splits` splits each.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn attention_combine_f32(
    out: *mut f32,
    partial_o: *const f32,
    partial_ml: *const f32,
    positions: *const u32,
    splits: Splits,
) {
    let out = CombineOut::f32(out);
    // SAFETY: the same preconditions; no second output.
    unsafe { combine(out, partial_o, partial_ml, positions, splits) }
}

/// `attention_combine_f32`, each output also rounded to bf16 into `out_bf16` (`[n, n_heads,
/// head_dim]`, as `u16` bits, rounded as `f32_to_bf16` rounds): o_proj's input, without a
/// rounding launch of its own.
///
/// PRECONDITIONS and thread mapping: as `attention_combine_f32`.
///
/// # Safety
/// As `attention_combine_f32`; `out_bf16` holds as many values as `out`.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn attention_combine_f32_bf16(
    out: *mut f32,
    out_bf16: *mut u16,
    partial_o: *const f32,
    partial_ml: *const f32,
    positions: *const u32,
    splits: Splits,
) {
    let out = CombineOut {
        out_bf16,
        ..CombineOut::f32(out)
    };
    // SAFETY: the preconditions, passed on.
    unsafe { combine(out, partial_o, partial_ml, positions, splits) }
}

/// `attention_combine_f32`, the output also made 8-bit codes as `quantize_q8_f32` makes
/// them (`codes` `[n, n_heads * head_dim]` i8, `scales` `[n, n_heads * head_dim / 32][2]`
/// f32): o_proj's input when its GEMV reads GGUF blocks, without a launch of its own. A
/// group of 32 never crosses a head, so a block's warps make whole groups.
///
/// PRECONDITIONS and thread mapping: as `attention_combine_f32`; `head_dim % 32 == 0`.
///
/// # Safety
/// As `attention_combine_f32`; `codes` and `scales` hold what is listed above.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn attention_combine_q8_f32(
    out: *mut f32,
    codes: *mut u8,
    scales: *mut f32,
    partial_o: *const f32,
    partial_ml: *const f32,
    positions: *const u32,
    splits: Splits,
) {
    let out = CombineOut {
        codes,
        scales,
        ..CombineOut::f32(out)
    };
    // SAFETY: the preconditions, passed on.
    unsafe { combine(out, partial_o, partial_ml, positions, splits) }
}

/// Where the combine kernels write: `out`, and a copy in bf16 (`out_bf16`) or as 8-bit
/// codes (`codes`, `scales`) where not null.
#[derive(Clone, Copy)]
struct CombineOut {
    out: *mut f32,
    out_bf16: *mut u16,
    codes: *mut u8,
    scales: *mut f32,
}

impl CombineOut {
    /// `out` alone.
    fn f32(out: *mut f32) -> CombineOut {
        CombineOut {
            out,
            out_bf16: core::ptr::null_mut(),
            codes: core::ptr::null_mut(),
            scales: core::ptr::null_mut(),
        }
    }
}

/// The body of the three combine kernels.
///
/// # Safety
/// As `attention_combine_f32`.
#[inline(always)]
unsafe fn combine(
    dst: CombineOut,
    partial_o: *const f32,
    partial_ml: *const f32,
    positions: *const u32,
    splits: Splits,
) {
    use crate::device::warp_max;
    let CombineOut {
        out,
        out_bf16,
        codes,
        scales,
    } = dst;
    let Splits {
        n_splits,
        split_len,
        head_dim,
    } = splits;
    let (n_splits, head_dim) = (n_splits as usize, head_dim as usize);
    let (h, t) = (block_idx_x(), block_idx_y());
    let n_heads = crate::device::grid_dim_x();
    let th = t * n_heads + h;
    let (tid, lane, warp) = (thread_idx_x(), thread_idx_x() % WARP, thread_idx_x() / WARP);
    // Shared: [32] reduction scratch, [groups] the groups' denominators, then
    // [groups][head_dim] their sums.
    let scratch = dynamic_shared::<f32>();
    // SAFETY: th < n * n_heads; s < own <= n_splits; d < head_dim; shared memory holds 32 +
    // n_splits + blockDim.x floats (launch), and groups <= n_splits; every thread reaches
    // every barrier.
    unsafe {
        // The host wrote the positions: read before the wait for the kernel before.
        let own = (*positions.add(t) as usize / split_len as usize + 1).min(n_splits);
        crate::device::wait_for_previous_kernel();
        let groups = own
            .div_ceil(COMBINE_IN_FLIGHT)
            .clamp(1, 1024 / head_dim)
            .min(block_dim_x() / head_dim);
        let (group, d) = (tid / head_dim, tid % head_dim);
        let (dens, sums) = (scratch.add(WARP), scratch.add(WARP + groups));
        let ml = partial_ml.add(2 * th * n_splits);
        let o = partial_o.add(th * n_splits * head_dim + d);
        // Thread d of group g takes splits g, g + groups, ...: the first COMBINE_IN_FLIGHT
        // of them, their values and (m, l), loaded together, and with them the splits'
        // maxima the thread reads for M (one wait for all of them where a context has
        // up to blockDim.x splits).
        let mine = group < groups;
        let split = |j: usize| group + j * groups;
        // The thread's splits first .. first + COMBINE_IN_FLIGHT (those below `own`): their
        // values, m and l, every load issued before any is used.
        let load = |first: usize| {
            let mut v = [0.0f32; COMBINE_IN_FLIGHT];
            let mut m = [f32::NEG_INFINITY; COMBINE_IN_FLIGHT];
            let mut l = [0.0f32; COMBINE_IN_FLIGHT];
            for j in 0..COMBINE_IN_FLIGHT {
                let s = split(first + j);
                if mine && s < own {
                    v[j] = *o.add(s * head_dim);
                    m[j] = *ml.add(2 * s);
                    l[j] = *ml.add(2 * s + 1);
                }
            }
            (v, m, l)
        };
        let (mut v, mut m, mut l) = load(0);
        // The largest maximum (a maximum is the same in any order).
        let mut m_own = f32::NEG_INFINITY;
        let mut s = tid;
        while s < own {
            m_own = m_own.max(*ml.add(2 * s));
            s += block_dim_x();
        }
        m_own = warp_max(m_own);
        if lane == 0 {
            *scratch.add(warp) = m_own;
        }
        sync_threads();
        let mut m_all = f32::NEG_INFINITY;
        for w in 0..block_dim_x() / WARP {
            m_all = m_all.max(*scratch.add(w));
        }
        // Each split's weight e^(m_s - M), times its values and its sum of weights, added
        // in split order: those loaded above, then (a long context) the rest, a round of
        // COMBINE_IN_FLIGHT loads at a time.
        let (mut num, mut den) = (0.0f32, 0.0f32);
        let mut first = 0;
        loop {
            for j in 0..COMBINE_IN_FLIGHT {
                if mine && split(first + j) < own {
                    let w = exp(m[j] - m_all);
                    num += v[j] * w;
                    den += l[j] * w;
                }
            }
            first += COMBINE_IN_FLIGHT;
            if !mine || split(first) >= own {
                break;
            }
            (v, m, l) = load(first);
        }
        if mine {
            *sums.add(tid) = num;
            if d == 0 {
                *dens.add(group) = den;
            }
        }
        sync_threads();
        if tid < head_dim {
            let (mut num, mut den) = (0.0f32, 0.0f32);
            for g in 0..groups {
                num += *sums.add(g * head_dim + tid);
                den += *dens.add(g);
            }
            let v = num / den;
            *out.add(th * head_dim + tid) = v;
            if !out_bf16.is_null() {
                *out_bf16.add(th * head_dim + tid) = crate::device::f32_to_bf16(v);
            }
            if !codes.is_null() {
                // head_dim is whole warps: each warp here writes one whole group.
                crate::gemv_codes::write_code(codes, scales, th * head_dim + tid, v);
            }
        }
    }
}
