//! Rotary position embedding, rotate-half layout, in place.

use crate::args::Heads;
use crate::device::{
    block_dim_x, block_idx_x, f32_to_bf16, global_idx_x, sqrt, thread_idx_x,
    wait_for_previous_kernel, warp_max, warp_sum,
};
use crate::kv_fp8::{kv_e4m3_of, kv_quant_factor, kv_scale_of};
use crate::tiles::BLOCK_SIZE;
use crate::unroll::unroll;

/// In each head of each token, the pair `(x[i], x[i + d/2])` turns by the angle whose cos and
/// sin are `cos[pos, i]` and `sin[pos, i]` (tables computed on the host in f64).
///
/// A step of the lesson, kept and tested as the simplest form: the forward pass runs
/// `qkv_rope_write_bf16`, which does this for q and k and writes the cache in the same pass.
///
/// - `x`: `[n, n_heads, head_dim]` f32, rotated in place
/// - `positions`: `[n]` u32
/// - `cos`, `sin`: `[max_pos, head_dim / 2]` f32
///
/// Thread mapping: one thread per pair: `n * n_heads * head_dim / 2` threads.
///
/// PRECONDITIONS: every `positions[t] < max_pos`; `head_dim` even.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn rope_f32(
    x: *mut f32,
    positions: *const u32,
    cos: *const f32,
    sin: *const f32,
    n_heads: u32,
    head_dim: u32,
    n: u32,
) {
    crate::device::wait_for_previous_kernel();
    let (n_heads, head_dim) = (n_heads as usize, head_dim as usize);
    let half = head_dim / 2;
    let idx = global_idx_x();
    if idx >= n as usize * n_heads * half {
        return;
    }
    let (th, i) = (idx / half, idx % half); // th = t * n_heads + h
    let t = th / n_heads;
    // SAFETY: t < n, positions[t] < max_pos, i < half, th * head_dim + i + half < n * n_heads * head_dim.
    unsafe {
        let pos = *positions.add(t) as usize;
        let (c, s) = (*cos.add(pos * half + i), *sin.add(pos * half + i));
        let head = x.add(th * head_dim);
        let (a, b) = (*head.add(i), *head.add(i + half));
        *head.add(i) = a * c - b * s;
        *head.add(i + half) = b * c + a * s;
    }
}

/// The step between the fused q/k/v projection and attention, in one pass: RoPE on q and k,
/// q out to its own buffer, k and v into their cache slots, rounded to bf16 (the cache holds
/// half the bytes of f32: twice the tokens, and half the reading for attention).
///
/// - `q_out`: `[n, n_heads, head_dim]` f32, rotated queries
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * 16, n_kv_heads * head_dim]` bf16
/// - `qkv`: `[n, q_dim + 2 * kv_dim]` f32, each row `[q | k | v]` as the fused matmul wrote it
/// - `positions`, `slots`: `[n]` u32
/// - `cos`, `sin`: `[max_pos, head_dim / 2]` f32
/// - `heads`: the query and KV heads; `n`: the tokens
///
/// Thread mapping: one thread per unit of work in a row: `q_dim / 2` query pairs, then
/// `kv_dim / 2` key pairs, then `kv_dim` values; `n` rows of them. A thread reads its
/// token's position and slot, and its pair's cos and sin, before the wait for the kernel
/// before (the host wrote the first two, the tables never change): after it, only the row
/// the projection wrote.
///
/// PRECONDITIONS: `head_dim` even; `positions[t] < max_pos`; slots valid, and distinct
/// unless the tokens that share one write the same values; `positions`, `slots`, `cos` and
/// `sin` not written by the kernel before this one (they are read before the wait for it).
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn qkv_rope_write_bf16(
    q_out: *mut f32,
    k_cache: *mut u16,
    v_cache: *mut u16,
    qkv: *const f32,
    positions: *const u32,
    slots: *const u32,
    cos: *const f32,
    sin: *const f32,
    heads: Heads,
    n: u32,
) {
    let (head_dim, half) = (heads.head_dim as usize, heads.head_dim as usize / 2);
    let (q_dim, kv_dim) = (
        heads.n_heads as usize * head_dim,
        heads.n_kv_heads as usize * head_dim,
    );
    let units = q_dim / 2 + kv_dim / 2 + kv_dim;
    let idx = global_idx_x();
    if idx >= n as usize * units {
        crate::device::wait_for_previous_kernel();
        return;
    }
    let (t, u) = (idx / units, idx % units);
    // Pair `p` of the queries or keys, `(i, i + half)` of head `p / half`: its offsets in the
    // destination row.
    let pair = |p: usize| {
        (
            p / half * head_dim + p % half,
            p / half * head_dim + p % half + half,
        )
    };
    // SAFETY: t < n; every index below stays inside its row (q_dim + 2 kv_dim wide) or its
    // cache row (slots valid, preconditions).
    unsafe {
        // The host wrote the positions and slots, and the tables never change: all read
        // before the wait for the kernel before (the projection that writes qkv), so that
        // the angle's cos and sin are not a second load after it.
        let pos = *positions.add(t) as usize;
        let slot = *slots.add(t) as usize;
        let rotating = u < q_dim / 2 + kv_dim / 2;
        let p = if u < q_dim / 2 { u } else { u - q_dim / 2 };
        let (c, s) = if rotating {
            let i = p % half;
            (*cos.add(pos * half + i), *sin.add(pos * half + i))
        } else {
            (0.0, 0.0)
        };
        crate::device::wait_for_previous_kernel();
        let row = qkv.add(t * (q_dim + 2 * kv_dim));
        // The pair at (i, j) of `src`, rotated by position `pos`.
        let rotate = |src: *const f32, (i, j): (usize, usize)| {
            let (a, b) = (*src.add(i), *src.add(j));
            (a * c - b * s, b * c + a * s)
        };
        if u < q_dim / 2 {
            let (i, j) = pair(p);
            let (x, y) = rotate(row, (i, j));
            let dst = q_out.add(t * q_dim);
            *dst.add(i) = x;
            *dst.add(j) = y;
        } else if rotating {
            let (i, j) = pair(p);
            let (x, y) = rotate(row.add(q_dim), (i, j));
            let dst = k_cache.add(slot * kv_dim);
            *dst.add(i) = f32_to_bf16(x);
            *dst.add(j) = f32_to_bf16(y);
        } else {
            let i = u - q_dim / 2 - kv_dim / 2;
            *v_cache.add(slot * kv_dim + i) = f32_to_bf16(*row.add(q_dim + kv_dim + i));
        }
    }
}

/// `qkv_rope_write_bf16` for models that RMSNorm each query and key head before RoPE
/// (Qwen3): the norm, the rotation and the cache write in one pass. A norm kernel of its own
/// took 4.7 us a layer of a Qwen3-8B step timed launch by launch, and with graphs its tok/s
/// rose 1-3% when the norm moved here (docs/lessons.md, round 62).
///
/// - `q_out`, `k_cache`, `v_cache`, `qkv`, `positions`, `slots`, `cos`, `sin`, `heads`, `n`:
///   as `qkv_rope_write_bf16`
/// - `q_weight`, `k_weight`: `[head_dim]` f32, the norms of a query head and of a key head
///
/// Thread mapping: one warp per (token, head) of the row, `blockDim.x / 32` a block: the
/// `n_heads` query heads, then the `n_kv_heads` key heads, then the `n_kv_heads` value heads.
/// A lane holds the pairs `(i, i + head_dim / 2)` of its head for `i = lane, lane + 32, ...`
/// (at most four), so the head's sum of squares is one warp shuffle and each pair is normed
/// and turned in registers. A value head is copied, rounded to bf16. The position, slot,
/// angles and norm weights a lane needs are read before the wait for the kernel before (none
/// of them is written by it).
///
/// PRECONDITIONS: as `qkv_rope_write_bf16`, and `head_dim <= 256`; `blockDim.x` a multiple
/// of 32 and at least `n * (n_heads + 2 * n_kv_heads)` warps in the grid; the weights not
/// written by the kernel before this one.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn qkv_norm_rope_write_bf16(
    q_out: *mut f32,
    k_cache: *mut u16,
    v_cache: *mut u16,
    qkv: *const f32,
    q_weight: *const f32,
    k_weight: *const f32,
    positions: *const u32,
    slots: *const u32,
    cos: *const f32,
    sin: *const f32,
    heads: Heads,
    eps: f32,
    n: u32,
) {
    let cache = Bf16Rows { k_cache, v_cache };
    let rows = RowsIn {
        qkv,
        positions,
        slots,
        cos,
        sin,
    };
    let norm = Some((q_weight, k_weight, eps));
    // SAFETY: the preconditions, passed on.
    unsafe { heads_pass(q_out, cache, rows, norm, heads, n) }
}

/// `qkv_rope_write_bf16` into the fp8 cache (`--kv-dtype fp8`): each key head (after RoPE)
/// and each value head stored as e4m3 bytes with one power-of-two scale
/// (`kv_fp8.rs`), the warp's largest magnitude choosing it.
///
/// - `q_out`, `qkv`, `positions`, `slots`, `cos`, `sin`, `heads`, `n`: as
///   `qkv_rope_write_bf16`
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * 16, n_kv_heads * head_dim]` e4m3
/// - `k_scales`, `v_scales`: one layer, `[n_blocks, n_kv_heads, 16]` scale bytes: a
///   block's sixteen tokens of one head side by side, so that attention stages a block's
///   scales with one 16-byte copy
///
/// Thread mapping: `qkv_norm_rope_write_bf16`'s, without the norm.
///
/// PRECONDITIONS: as `qkv_norm_rope_write_bf16`.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn qkv_rope_write_fp8(
    q_out: *mut f32,
    k_cache: *mut u8,
    v_cache: *mut u8,
    k_scales: *mut u8,
    v_scales: *mut u8,
    qkv: *const f32,
    positions: *const u32,
    slots: *const u32,
    cos: *const f32,
    sin: *const f32,
    heads: Heads,
    n: u32,
) {
    let cache = Fp8Rows {
        k_cache,
        v_cache,
        k_scales,
        v_scales,
    };
    let rows = RowsIn {
        qkv,
        positions,
        slots,
        cos,
        sin,
    };
    // SAFETY: the preconditions, passed on.
    unsafe { heads_pass(q_out, cache, rows, None, heads, n) }
}

/// `qkv_norm_rope_write_bf16` into the fp8 cache: the arguments of `qkv_rope_write_fp8`,
/// and the norms' `q_weight`, `k_weight` and `eps` as `qkv_norm_rope_write_bf16` takes them.
///
/// # Safety
/// As `qkv_norm_rope_write_bf16`.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn qkv_norm_rope_write_fp8(
    q_out: *mut f32,
    k_cache: *mut u8,
    v_cache: *mut u8,
    k_scales: *mut u8,
    v_scales: *mut u8,
    qkv: *const f32,
    q_weight: *const f32,
    k_weight: *const f32,
    positions: *const u32,
    slots: *const u32,
    cos: *const f32,
    sin: *const f32,
    heads: Heads,
    eps: f32,
    n: u32,
) {
    let cache = Fp8Rows {
        k_cache,
        v_cache,
        k_scales,
        v_scales,
    };
    let rows = RowsIn {
        qkv,
        positions,
        slots,
        cos,
        sin,
    };
    let norm = Some((q_weight, k_weight, eps));
    // SAFETY: the preconditions, passed on.
    unsafe { heads_pass(q_out, cache, rows, norm, heads, n) }
}

/// Pairs a lane holds: heads up to 256 wide.
const PAIRS: usize = 4;

/// A lane's pairs `(i, i + head_dim / 2)` of one head, `i = lane + 32 k`; those with `i`
/// past the half are zeros.
type LanePairs = [(f32, f32); PAIRS];

/// What the warp-per-head kernels read besides the norms: the projection's rows, each
/// token's position and slot, the RoPE tables (shapes as `qkv_rope_write_bf16` lists them).
#[derive(Clone, Copy)]
struct RowsIn {
    qkv: *const f32,
    positions: *const u32,
    slots: *const u32,
    cos: *const f32,
    sin: *const f32,
}

/// Where one head's key or value row lands in a cache: the token's slot, the head, and the
/// cache's row width.
#[derive(Clone, Copy)]
struct HeadAt {
    slot: usize,
    kv_head: usize,
    n_kv_heads: usize,
    head_dim: usize,
}

/// A cache the warp-per-head kernels write a head into: bf16 or e4m3 with scales.
trait HeadRows: Copy {
    /// Stores the warp's key (`value` false) or value head, which lane `lane` holds as
    /// `pairs`.
    ///
    /// # Safety
    /// The whole warp calls it; `at` is inside the cache.
    unsafe fn store(self, value: bool, at: HeadAt, pairs: LanePairs, lane: usize);
}

/// The bf16 cache: `[n_blocks * 16, n_kv_heads * head_dim]` bf16 keys and values.
#[derive(Clone, Copy)]
struct Bf16Rows {
    k_cache: *mut u16,
    v_cache: *mut u16,
}

impl HeadRows for Bf16Rows {
    #[inline(always)]
    unsafe fn store(self, value: bool, at: HeadAt, pairs: LanePairs, lane: usize) {
        let cache = if value { self.v_cache } else { self.k_cache };
        let half = at.head_dim / 2;
        let row = (at.slot * at.n_kv_heads + at.kv_head) * at.head_dim;
        for k in 0..PAIRS {
            let (i, (a, b)) = (lane + 32 * k, pairs[k]);
            if i < half {
                // SAFETY: inside the head's row (the caller's guarantee).
                unsafe {
                    *cache.add(row + i) = f32_to_bf16(a);
                    *cache.add(row + i + half) = f32_to_bf16(b);
                }
            }
        }
    }
}

/// The fp8 cache: e4m3 keys and values as `Bf16Rows` lays them out, and a scale byte per
/// (token, head) in `[n_blocks, n_kv_heads, 16]`.
#[derive(Clone, Copy)]
struct Fp8Rows {
    k_cache: *mut u8,
    v_cache: *mut u8,
    k_scales: *mut u8,
    v_scales: *mut u8,
}

impl HeadRows for Fp8Rows {
    #[inline(always)]
    unsafe fn store(self, value: bool, at: HeadAt, pairs: LanePairs, lane: usize) {
        let (cache, scales) = match value {
            true => (self.v_cache, self.v_scales),
            false => (self.k_cache, self.k_scales),
        };
        let half = at.head_dim / 2;
        let row = (at.slot * at.n_kv_heads + at.kv_head) * at.head_dim;
        // The head's largest magnitude (zeros past the half change nothing), its scale.
        let mut amax = 0.0f32;
        for k in 0..PAIRS {
            amax = amax.max(pairs[k].0.abs()).max(pairs[k].1.abs());
        }
        let scale = kv_scale_of(warp_max(amax));
        let factor = kv_quant_factor(scale);
        // Unrolled, so that `pairs` stays in registers (the rounding's body is long enough that
        // the compiler would keep the loop and index the array in local memory).
        unroll!(k < PAIRS => {
            let (i, (a, b)) = (lane + 32 * k, pairs[k]);
            if i < half {
                // SAFETY: inside the head's row (the caller's guarantee).
                unsafe {
                    *cache.add(row + i) = kv_e4m3_of(a * factor);
                    *cache.add(row + i + half) = kv_e4m3_of(b * factor);
                }
            }
        });
        if lane == 0 {
            let (block, offset) = (at.slot / BLOCK_SIZE, at.slot % BLOCK_SIZE);
            // SAFETY: the slot's block and head are inside the scales (the caller's).
            unsafe {
                *scales.add((block * at.n_kv_heads + at.kv_head) * BLOCK_SIZE + offset) = scale
            };
        }
    }
}

/// The body of the warp-per-head kernels: `qkv_norm_rope_write_bf16` (`norm` given, the bf16
/// cache), `qkv_rope_write_fp8` and `qkv_norm_rope_write_fp8`.
///
/// # Safety
/// Their preconditions.
#[inline(always)]
unsafe fn heads_pass<C: HeadRows>(
    q_out: *mut f32,
    cache: C,
    rows: RowsIn,
    norm: Option<(*const f32, *const f32, f32)>,
    heads: Heads,
    n: u32,
) {
    let (n_heads, n_kv_heads) = (heads.n_heads as usize, heads.n_kv_heads as usize);
    let (head_dim, half) = (heads.head_dim as usize, heads.head_dim as usize / 2);
    let (q_dim, kv_dim) = (n_heads * head_dim, n_kv_heads * head_dim);
    let units = n_heads + 2 * n_kv_heads;
    let (warp, lane) = (thread_idx_x() / 32, thread_idx_x() % 32);
    let unit = block_idx_x() * (block_dim_x() / 32) + warp;
    if unit >= n as usize * units {
        // A whole warp leaves, before the wait: it reads nothing the kernel before wrote.
        return;
    }
    let (t, h) = (unit / units, unit % units);
    // SAFETY: t < n and h < units, so every offset below is inside token t's row (q_dim +
    // 2 kv_dim wide), its q_out row, or its cache row (slots valid, preconditions); pair
    // indices stay below half <= 32 * PAIRS.
    unsafe {
        let pos = *rows.positions.add(t) as usize;
        let slot = *rows.slots.add(t) as usize;
        let row = rows.qkv.add(t * (q_dim + 2 * kv_dim));
        // This lane's pairs of the head at `src`.
        let load = |src: *const f32| {
            let mut pairs = [(0.0f32, 0.0f32); PAIRS];
            for k in 0..PAIRS {
                let i = lane + 32 * k;
                if i < half {
                    pairs[k] = (*src.add(i), *src.add(i + half));
                }
            }
            pairs
        };
        if h >= n_heads + n_kv_heads {
            // A value head: into the cache as it is.
            let kv_head = h - n_heads - n_kv_heads;
            wait_for_previous_kernel();
            let pairs = load(row.add(q_dim + kv_dim + kv_head * head_dim));
            let at = HeadAt {
                slot,
                kv_head,
                n_kv_heads,
                head_dim,
            };
            cache.store(true, at, pairs, lane);
            return;
        }
        let query = h < n_heads;
        // Each held pair's angle and the two weights of its elements (1 without a norm).
        let mut angle = [(0.0f32, 0.0f32); PAIRS];
        let mut w = [(1.0f32, 1.0f32); PAIRS];
        for k in 0..PAIRS {
            let i = lane + 32 * k;
            if i < half {
                angle[k] = (*rows.cos.add(pos * half + i), *rows.sin.add(pos * half + i));
                if let Some((q_weight, k_weight, _)) = norm {
                    let weight = if query { q_weight } else { k_weight };
                    w[k] = (*weight.add(i), *weight.add(i + half));
                }
            }
        }
        wait_for_previous_kernel();
        // The head's values: query head h, or key head h - n_heads (the keys follow the
        // queries in the row, so the offset is the same expression).
        let mut pairs = load(row.add(h * head_dim));
        if let Some((_, _, eps)) = norm {
            // Every lane of the warp is here (the warp left whole or not at all). The norm
            // as `rmsnorm_f32` computes it: x * scale * weight.
            let mut sum_sq = 0.0f32;
            for k in 0..PAIRS {
                let (a, b) = pairs[k];
                sum_sq += a * a + b * b;
            }
            let scale = 1.0 / sqrt(warp_sum(sum_sq) / head_dim as f32 + eps);
            for k in 0..PAIRS {
                pairs[k] = (pairs[k].0 * scale * w[k].0, pairs[k].1 * scale * w[k].1);
            }
        }
        for k in 0..PAIRS {
            let ((a, b), (c, s)) = (pairs[k], angle[k]);
            pairs[k] = (a * c - b * s, b * c + a * s);
        }
        if query {
            let dst = q_out.add(t * q_dim + h * head_dim);
            for k in 0..PAIRS {
                let (i, (x, y)) = (lane + 32 * k, pairs[k]);
                if i < half {
                    *dst.add(i) = x;
                    *dst.add(i + half) = y;
                }
            }
        } else {
            let at = HeadAt {
                slot,
                kv_head: h - n_heads,
                n_kv_heads,
                head_dim,
            };
            cache.store(false, at, pairs, lane);
        }
    }
}
