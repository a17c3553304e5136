//! Choosing each row's next token on the device, so that a batch of sampled requests sends
//! back one id per row instead of a row of logits: the penalties, then temperature, top-k,
//! top-p and min-p, then a seeded draw.
//!
//! Everything after the probabilities is integer arithmetic, so that the result does not
//! depend on the order of any sum: each kept token's weight `e^((l - max) / T)` becomes a
//! 24-bit fixed-point integer, and the thresholds, the total and the draw are exact sums of
//! those. The CPU twin does the same and chooses the same token, unless a weight's last bit
//! (the GPU's `ex2.approx` against the CPU's `exp`) moves a boundary: about once in millions
//! of draws. The draw's random number comes from a hash of the request's seed and the index
//! of the token being drawn, so a seeded request draws the same whatever shares its batch.

use crate::device::{
    WARP, block_dim_x, block_idx_x, dynamic_shared, exp2_approx, shfl_up_u32, shfl_xor,
    shfl_xor_u32, sync_threads, thread_idx_x,
};
use crate::fill::hash;

/// Words of a row's parameters in `params`.
pub const SAMPLE_PARAMS: usize = 6;

/// A logit as a key that orders like the float: larger logit, larger key.
#[inline(always)]
fn key(x: f32) -> u32 {
    let b = x.to_bits();
    if b >> 31 == 1 { !b } else { b | 0x8000_0000 }
}

/// `w` as the fixed-point weight the sums use: `floor(w * 2^24)`.
#[inline(always)]
fn fixed(w: f32) -> u64 {
    (w * 16_777_216.0) as u64
}

/// The random 32 bits of draw `step` of a request seeded `(seed_lo, seed_hi)`.
#[inline(always)]
pub fn draw_bits(seed_lo: u32, seed_hi: u32, step: u32) -> u32 {
    hash(seed_lo ^ hash(seed_hi, 0x5eed_5eed), step)
}

/// For each row `r`, a token drawn from `logits[r]` as the row's parameters say:
/// `temperature == 0` is the argmax (the first index of the largest logit); otherwise the
/// weights `w_i = e^((l_i - max) / T)`, kept where `l_i` is among the `top_k` largest (ties at
/// the k-th all kept; 0 = all), then where the kept weights, largest first, first reach
/// `top_p` of their total (every token tied with the last one needed kept), then where
/// `w_i >= min_p` (the largest has weight 1); then token `i` with probability `w_i` over the
/// kept total, by the draw `draw_bits(seed_lo, seed_hi, step)`.
///
/// - `out`: `[rows]` u32
/// - `logits`: `[rows, vocab]` f32 (penalties already applied: `penalize_f32`)
/// - `params`: `[rows, SAMPLE_PARAMS]` u32: temperature (f32 bits), top_p (f32 bits), min_p
///   (f32 bits), top_k, seed_lo, seed_hi; `steps`: `[rows]` u32, the draw index
///
/// Thread mapping: one block per row (`blockIdx.x`); thread `t` owns the `chunk =
/// ceil(vocab / blockDim.x)` consecutive tokens from `t * chunk`, so that a scan of the
/// threads' sums in thread order is a scan in token order. The top-k and top-p thresholds are
/// found a bit at a time, from the top bit of a logit's order-preserving key down (32 rounds,
/// each a block-wide count or sum).
///
/// PRECONDITIONS: grid `(rows)`; `blockDim.x` a multiple of 32, at most 1024; dynamic shared
/// memory `(blockDim.x / 32) * 16` bytes; `vocab >= 1`; logits finite or -inf with at least
/// one finite per row.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn sample_f32(
    out: *mut u32,
    logits: *const f32,
    params: *const u32,
    steps: *const u32,
    vocab: u32,
) {
    crate::device::wait_for_previous_kernel();
    let vocab = vocab as usize;
    let r = block_idx_x();
    let tid = thread_idx_x();
    let chunk = vocab.div_ceil(block_dim_x());
    let (lo, hi) = ((tid * chunk).min(vocab), ((tid + 1) * chunk).min(vocab));
    // SAFETY (all accesses): r < rows (the grid); the row's vocab logits, its parameters and
    // step; i in lo..hi < vocab; shared memory as the launch gives it.
    unsafe {
        let row = logits.add(r * vocab);
        let p = params.add(r * SAMPLE_PARAMS);
        let temperature = f32::from_bits(*p);
        let top_p = f32::from_bits(*p.add(1));
        let min_p = f32::from_bits(*p.add(2));
        let top_k = *p.add(3) as usize;
        let scratch = dynamic_shared::<u64>();

        // The largest logit and its first index: the answer when greedy, the shift otherwise.
        let (mut best, mut best_i) = (f32::NEG_INFINITY, u32::MAX);
        for i in lo..hi {
            let l = *row.add(i);
            if l > best {
                (best, best_i) = (l, i as u32);
            }
        }
        let (best, best_i) = block_argmax(best, best_i, scratch);
        if temperature == 0.0 {
            if tid == 0 {
                *out.add(r) = best_i;
            }
            return;
        }
        // w = e^((l - best) / T) = 2^((l - best) * log2(e) / T).
        let scale = core::f32::consts::LOG2_E / temperature;
        let weight = |l: f32| exp2_approx((l - best) * scale);

        // Top-k: the largest key with at least k logits at or above it.
        let mut k_key = 0u32;
        if top_k > 0 && top_k < vocab {
            for bit in (0..32).rev() {
                let cand = k_key | (1 << bit);
                let mut count = 0u64;
                for i in lo..hi {
                    count += (key(*row.add(i)) >= cand) as u64;
                }
                if block_sum_u64(count, scratch) >= top_k as u64 {
                    k_key = cand;
                }
            }
        }
        // Top-p: the largest key whose tokens at or above it (and above top-k's) carry at
        // least top_p of the top-k total.
        let kept_sum = |from: u32| {
            let mut s = 0u64;
            for i in lo..hi {
                let l = *row.add(i);
                if key(l) >= from {
                    s += fixed(weight(l));
                }
            }
            s
        };
        // (S(key) falls as the key rises, and S(k_key) is the whole top-k total: the largest
        // key with S(key) >= need is never below k_key.)
        let mut p_key = k_key;
        if top_p < 1.0 {
            let total = block_sum_u64(kept_sum(k_key), scratch);
            // need = ceil(total * top_p), top_p as a 24-bit fraction: integers throughout.
            let need = ((total as u128 * fixed(top_p) as u128).div_ceil(1 << 24)) as u64;
            let mut found = 0u32;
            for bit in (0..32).rev() {
                let cand = found | (1 << bit);
                if block_sum_u64(kept_sum(cand), scratch) >= need {
                    found = cand;
                }
            }
            p_key = found;
        }
        // The draw: kept tokens in index order, each its fixed-point weight wide.
        let keep = |l: f32| key(l) >= p_key && weight(l) >= min_p;
        let mut mine = 0u64;
        for i in lo..hi {
            let l = *row.add(i);
            if keep(l) {
                mine += fixed(weight(l));
            }
        }
        let (before, total) = block_scan_u64(mine, scratch);
        let bits = draw_bits(*p.add(4), *p.add(5), *steps.add(r));
        let target = ((total as u128 * bits as u128) >> 32) as u64;
        if before <= target && target < before + mine {
            let mut at = before;
            for i in lo..hi {
                let l = *row.add(i);
                if keep(l) {
                    at += fixed(weight(l));
                    if target < at {
                        *out.add(r) = i as u32;
                        break;
                    }
                }
            }
        }
    }
}

/// The largest `(v, i)` of the block (on a tie, the smaller index), returned to every thread.
///
/// # Safety
/// Every thread calls it; `scratch` holds `blockDim.x / 32` u64 of shared memory.
#[inline(always)]
unsafe fn block_argmax(mut v: f32, mut i: u32, scratch: *mut u64) -> (f32, u32) {
    let better = |v: f32, i: u32, ov: f32, oi: u32| {
        if ov > v || (ov == v && oi < i) {
            (ov, oi)
        } else {
            (v, i)
        }
    };
    for mask in [16, 8, 4, 2, 1] {
        (v, i) = better(v, i, shfl_xor(v, mask), shfl_xor_u32(i, mask));
    }
    let (lane, warp, n_warps) = (
        thread_idx_x() % WARP,
        thread_idx_x() / WARP,
        block_dim_x() / WARP,
    );
    // SAFETY: warp < n_warps; every thread reaches both barriers.
    unsafe {
        if lane == 0 {
            *scratch.add(warp) = ((v.to_bits() as u64) << 32) | i as u64;
        }
        sync_threads();
        let (mut bv, mut bi) = (f32::NEG_INFINITY, u32::MAX);
        for w in 0..n_warps {
            let s = *scratch.add(w);
            (bv, bi) = better(bv, bi, f32::from_bits((s >> 32) as u32), s as u32);
        }
        sync_threads();
        (bv, bi)
    }
}

/// The block's sum of `v`, returned to every thread (exact: integers).
///
/// # Safety
/// As `block_argmax`.
#[inline(always)]
unsafe fn block_sum_u64(v: u64, scratch: *mut u64) -> u64 {
    let (_, total) = unsafe { block_scan_u64(v, scratch) };
    total
}

/// The sum of `v` over the threads before this one (in thread order), and over the block.
///
/// # Safety
/// As `block_argmax`.
#[inline(always)]
unsafe fn block_scan_u64(v: u64, scratch: *mut u64) -> (u64, u64) {
    let (lane, warp, n_warps) = (
        thread_idx_x() % WARP,
        thread_idx_x() / WARP,
        block_dim_x() / WARP,
    );
    // Inclusive scan within the warp (shuffles of the two halves).
    let mut incl = v;
    let mut d = 1u32;
    while d < WARP as u32 {
        let lo = shfl_up_u32(incl as u32, d);
        let hi = shfl_up_u32((incl >> 32) as u32, d);
        if lane as u32 >= d {
            incl += ((hi as u64) << 32) | lo as u64;
        }
        d *= 2;
    }
    // SAFETY: warp < n_warps; every thread reaches both barriers.
    unsafe {
        if lane == WARP - 1 {
            *scratch.add(warp) = incl;
        }
        sync_threads();
        let (mut before_warp, mut total) = (0u64, 0u64);
        for w in 0..n_warps {
            let s = *scratch.add(w);
            if w < warp {
                before_warp += s;
            }
            total += s;
        }
        sync_threads();
        (before_warp + incl - v, total)
    }
}

/// The penalties, in place: for each entry `(row, token, counts)` of a request's seen tokens,
/// `l = l > 0 ? l / repeat : l * repeat` if the token was seen (prompt or generated), then
/// `l -= presence` if it was generated at all and `l -= frequency * times generated`.
///
/// - `logits`: `[rows, vocab]` f32
/// - `entries`: `[n, 3]` u32: row, token, times generated (bit 31: seen in the prompt)
/// - `penalties`: `[rows, 3]` f32: repeat, presence, frequency
///
/// Thread mapping: one thread per entry, in blocks of 256.
///
/// PRECONDITIONS: rows and tokens inside `logits`; no `(row, token)` twice.
///
/// # Safety
/// The host's launch wrapper checks what it can; the caller, that entries are distinct.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn penalize_f32(
    logits: *mut f32,
    entries: *const u32,
    penalties: *const f32,
    n: u32,
    vocab: u32,
) {
    crate::device::wait_for_previous_kernel();
    let e = crate::device::global_idx_x();
    if e >= n as usize {
        return;
    }
    // SAFETY: e < n; the entry's row and token are inside logits (preconditions).
    unsafe {
        let (r, token, counts) = (
            *entries.add(3 * e) as usize,
            *entries.add(3 * e + 1) as usize,
            *entries.add(3 * e + 2),
        );
        let generated = counts & 0x7fff_ffff;
        let in_prompt = counts >> 31 == 1;
        let pen = penalties.add(3 * r);
        let (repeat, presence, frequency) = (*pen, *pen.add(1), *pen.add(2));
        let l = logits.add(r * vocab as usize + token);
        let mut v = *l;
        if in_prompt || generated > 0 {
            v = if v > 0.0 { v / repeat } else { v * repeat };
        }
        if generated > 0 {
            v -= presence + frequency * generated as f32;
        }
        *l = v;
    }
}

/// Grammar masks, in place: in each masked row every token whose bit is clear becomes -inf,
/// so that neither the argmax nor a draw can choose it (`sample_f32` takes -inf logits as
/// weight 0).
///
/// - `logits`: `[rows, vocab]` f32
/// - `masks`: `[n, words]` u32, `words = ceil(vocab / 32)`: bit `t % 32` of word `t / 32`
///   set when token `t` is allowed
/// - `mask_rows`: `[n]` u32, the row of `logits` each mask applies to
///
/// Thread mapping: one block per mask (`blockIdx.x`); thread `t` takes tokens `t`, `t +
/// blockDim.x`, ..., so a warp reads one mask word (a broadcast) and writes 32 consecutive
/// logits.
///
/// PRECONDITIONS: grid `(n)`; each `mask_rows` entry below `rows`, none twice.
///
/// # Safety
/// The host's launch wrapper checks the shapes; the caller, the rows.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn mask_logits_f32(
    logits: *mut f32,
    masks: *const u32,
    mask_rows: *const u32,
    vocab: u32,
) {
    crate::device::wait_for_previous_kernel();
    let vocab = vocab as usize;
    let words = vocab.div_ceil(32);
    let m = block_idx_x();
    // SAFETY: m < n (the grid); the row is inside logits and the mask holds `words` words
    // (preconditions); every token index stays below vocab.
    unsafe {
        let row = logits.add(*mask_rows.add(m) as usize * vocab);
        let mask = masks.add(m * words);
        let mut t = thread_idx_x();
        while t < vocab {
            if (*mask.add(t / 32) >> (t % 32)) & 1 == 0 {
                *row.add(t) = f32::NEG_INFINITY;
            }
            t += block_dim_x();
        }
    }
}
