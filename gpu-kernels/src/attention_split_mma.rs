//! Flash-decoding's first half on tensor cores: the split kernel for many sequences at once.
//!
//! `attention_split_bf16` scores a key with a warp's shuffles and multiplies its value with
//! each lane's own multiply-adds: at 128 sequences of 512-640 positions it moved 1.5 TB/s on
//! the H200, bound by instructions, not bytes (docs/lessons.md#attention). Here the query
//! heads that share a KV head are the rows of one
//! `mma.sync` (up to 8 of its 16; the rest are zeros), so a split of 32 keys costs a warp 32
//! products for `S = Q K^T` and 32 for `O = P V`, where the shuffles and multiply-adds cost
//! it a few thousand instructions. The layouts are `attention_mma_bf16`'s: the same
//! fragments, one warp, one tile of keys at a time.

use crate::args::PagedShape;
use crate::device::{
    WARP, block_idx_x, block_idx_y, block_idx_z, dynamic_shared, exp2_approx, grid_dim_y,
    pack_bf16x2, shfl_xor, sqrt, sync_warp, thread_idx_x,
};
use crate::kv_tiles::{Bf16Cache, Fp8Cache, KvTiles, Team, TileSpan, Tiles, tile_at, tile_stride};
use crate::mma::{
    cp_async_commit, cp_async_wait, ldmatrix_x4, ldmatrix_x4_trans, mma_bf16_16816, shared_addr,
};
use crate::tiles::{ATTN_SPLIT_MMA_KEYS, attn_split_mma_shared_bytes};
use crate::unroll::unroll;

/// The contract of `attention_split_bf16` (the same arguments, shapes and partial results,
/// which `attention_combine_f32` merges), with q (scaled) and the softmax weights rounded
/// to bf16 for the tensor cores, sums in f32.
///
/// - `partial_o`: `[n, n_heads, n_splits, head_dim]` f32, unnormalised
/// - `partial_ml`: `[n, n_heads, n_splits, 2]` f32: the split's maximum score `m` and the
///   sum `l` of `e^(score - m)`
/// - `q`: `[n, n_heads, head_dim]` f32
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * 16, n_kv_heads, head_dim]` bf16
/// - `block_tables`: `[n_seqs, max_blocks]` u32; `token_seq`, `positions`: `[n]` u32
/// - `shape`: the heads and the block tables' stride; `split_len`: positions a split
///
/// Thread mapping: grid `(n_kv_heads, n_splits, n)`; block `(32)`: one warp per (KV head,
/// split, token). Row `r < group` of its `mma` is query head `kv_head * group + r`; in the
/// `mma` layouts lane `l` holds row `l / 4` (and row `l / 4 + 8`, always padding). The warp
/// stages `ATTN_SPLIT_MMA_KEYS` keys and values at a time in shared memory (`cp.async`, 16
/// bytes a copy, zeros past the split's end), multiplies, takes an online softmax per row
/// (its values across a quad of lanes: two shuffles), and multiplies the weights, straight
/// from the first product's output registers, by the values. A split past the token's
/// position, or before its sliding window's first, writes m = -inf, l = 0 and zeros.
///
/// PRECONDITIONS: `head_dim` 64, 128 or 256 (Gemma 3's: its query in 64 registers a lane and
/// its output in 128, which the compiler may spill in part; still a warp per split, where
/// the one-pass kernel gives a block a whole context); `n_heads / n_kv_heads <= 8`; `split_len` a multiple
/// of `ATTN_SPLIT_MMA_KEYS`; `n_splits * split_len > positions[t]` for every token; the keys
/// and values of every position up to each token's own written, and their block-table
/// entries valid; the caches 16-byte aligned; block `(32)`; dynamic shared memory
/// `attn_split_mma_shared_bytes(head_dim)`.
///
/// # Safety
/// The host's launch wrapper checks the preconditions it can.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn attention_split_mma_bf16(
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
    let cache = Bf16Cache {
        k: k_cache,
        v: v_cache,
    };
    let args = Args {
        partial_o,
        partial_ml,
        q,
        cache,
        block_tables,
        token_seq,
        positions,
        shape,
        split_len,
    };
    // SAFETY: the preconditions, passed on.
    unsafe { by_width(args) }
}

/// `attention_split_mma_bf16` over the fp8 cache (`--kv-dtype fp8`): the same partial
/// results, each tile's e4m3 keys and values turned into bf16 in shared memory (exactly:
/// `kv_tiles.rs`) before the same products.
///
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * 16, n_kv_heads, head_dim]` e4m3
/// - `k_scales`, `v_scales`: one layer, `[n_blocks, n_kv_heads, 16]` scale bytes
/// - the rest as `attention_split_mma_bf16`'s
///
/// PRECONDITIONS: `attention_split_mma_bf16`'s, with the scales 16-byte aligned and
/// dynamic shared memory `attn_split_mma_fp8_shared_bytes(head_dim)`.
///
/// # Safety
/// The host's launch wrapper checks the preconditions it can.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn attention_split_mma_fp8(
    partial_o: *mut f32,
    partial_ml: *mut f32,
    q: *const f32,
    k_cache: *const u8,
    v_cache: *const u8,
    k_scales: *const u8,
    v_scales: *const u8,
    block_tables: *const u32,
    token_seq: *const u32,
    positions: *const u32,
    shape: PagedShape,
    split_len: u32,
) {
    crate::device::wait_for_previous_kernel();
    // The staging follows the tiles.
    let tiles_bytes = attn_split_mma_shared_bytes(shape.heads.head_dim as usize);
    let cache = Fp8Cache {
        k: k_cache,
        v: v_cache,
        k_scales,
        v_scales,
        staging: shared_addr(dynamic_shared::<u8>()) + tiles_bytes as u32,
    };
    let args = Args {
        partial_o,
        partial_ml,
        q,
        cache,
        block_tables,
        token_seq,
        positions,
        shape,
        split_len,
    };
    // SAFETY: the preconditions, passed on.
    unsafe { by_width(args) }
}

/// The kernel for the head width in `args`, which becomes a constant.
///
/// # Safety
/// As `attention_split_mma_bf16`.
#[inline(always)]
unsafe fn by_width<C: KvTiles>(args: Args<C>) {
    // SAFETY: the caller's guarantee.
    unsafe {
        match args.shape.heads.head_dim {
            64 => split::<4, 8, C>(args),
            128 => split::<8, 16, C>(args),
            _ => split::<16, 32, C>(args),
        }
    }
}

/// A split kernel's arguments, its cache's keys and values as `C` reads them.
struct Args<C> {
    partial_o: *mut f32,
    partial_ml: *mut f32,
    q: *const f32,
    cache: C,
    block_tables: *const u32,
    token_seq: *const u32,
    positions: *const u32,
    shape: PagedShape,
    split_len: u32,
}

/// The kernel for `head_dim = 16 KC = 8 NT`: `KC` 16-wide chunks of a head (the reduction
/// of `Q K^T`), `NT` 8-wide tiles of the output.
///
/// # Safety
/// As `attention_split_mma_bf16`.
#[inline(always)]
unsafe fn split<const KC: usize, const NT: usize, C: KvTiles>(a: Args<C>) {
    const KEYS: usize = ATTN_SPLIT_MMA_KEYS;
    let head_dim = 16 * KC;
    let (n_heads, n_kv_heads) = (
        a.shape.heads.n_heads as usize,
        a.shape.heads.n_kv_heads as usize,
    );
    let split_len = a.split_len as usize;
    let group = n_heads / n_kv_heads;
    let (kv_head, split, t) = (block_idx_x(), block_idx_y(), block_idx_z());
    let n_splits = grid_dim_y();
    let lane = thread_idx_x() % WARP;
    let (g, c) = (lane / 4, 2 * (lane % 4));
    // This lane's row g is query head `h` when it is not padding.
    let real = g < group;
    let h = kv_head * group + g;
    let at = (t * n_heads + h) * n_splits + split;

    // SAFETY: t < n; the sequence's row of the block table.
    let (pos, table) = unsafe {
        (
            *a.positions.add(t) as usize,
            a.block_tables
                .add(*a.token_seq.add(t) as usize * a.shape.max_blocks as usize),
        )
    };
    // The split's positions that the token attends to: none past its own, none before its
    // window's first.
    let start = (split * split_len).max(a.shape.first_position(pos));
    let end = ((split + 1) * split_len).min(pos + 1);
    if start >= end {
        // Past the token's position or before its window: an empty split (the combine
        // weighs it 0; written anyway, as the CPU twin does).
        if real {
            unroll!(j < NT => {
                // SAFETY: row `at` of the partials; 8 j + c + 1 < head_dim.
                unsafe {
                    *a.partial_o.add(at * head_dim + 8 * j + c) = 0.0;
                    *a.partial_o.add(at * head_dim + 8 * j + c + 1) = 0.0;
                }
            });
            if lane.is_multiple_of(4) {
                // SAFETY: row `at` of the partials.
                unsafe {
                    *a.partial_ml.add(2 * at) = f32::NEG_INFINITY;
                    *a.partial_ml.add(2 * at + 1) = 0.0;
                }
            }
        }
        return;
    }

    // Shared memory: keys `[KEYS][head_dim + 8]` bf16, then values the same (then, over the
    // fp8 cache, the staging).
    let k_tile = shared_addr(dynamic_shared::<u8>());
    let v_tile = k_tile + (KEYS * tile_stride(head_dim) * 2) as u32;
    let tiles = Tiles {
        k: k_tile,
        v: v_tile,
    };
    let tile_at = |tile: u32, key: usize, d: usize| tile_at(tile, head_dim, key, d);

    // q as the `a` operand, scaled by log2(e) / sqrt(head_dim) (the softmax in powers of
    // two) and rounded to bf16: (row g, dims 16 kc + c, + 1), (row g + 8: zero), (row g,
    // + 8), (row g + 8: zero).
    let scale = core::f32::consts::LOG2_E / sqrt(head_dim as f32);
    let q_row = (t * n_heads + h) * head_dim;
    let q_pair = |d: usize| -> u32 {
        if !real {
            return 0;
        }
        // SAFETY: the row is inside q; d + 1 < head_dim.
        let p = unsafe { a.q.add(q_row + d) };
        unsafe { pack_bf16x2(*p * scale, *p.add(1) * scale) }
    };
    let mut qf = [[0u32; 4]; KC];
    unroll!(kc < KC => {
        let d = 16 * kc + c;
        qf[kc] = [q_pair(d), 0, q_pair(d + 8), 0];
    });

    // The online softmax's state per row (r = 0: row g; r = 1: row g + 8) and the output in
    // the accumulator layout: o[j] holds (row g, dims 8 j + c, + 1), (row g + 8, same).
    let (mut m, mut l) = ([f32::NEG_INFINITY; 2], [0.0f32; 2]);
    let mut o = [[0.0f32; 4]; NT];
    let team = Team {
        index: lane,
        size: WARP,
    };

    let mut k0 = start;
    while k0 < end {
        // Keys k0 .. k0 + KEYS, zeros past the split's end, a 16-byte copy a lane at a time.
        let span = TileSpan {
            k0,
            end,
            table,
            kv_head,
            n_kv_heads,
            head_dim,
        };
        // SAFETY: the whole warp (the block) calls them; positions below `end` are the
        // sequence's, the tiles and staging inside the launch's shared memory.
        unsafe { a.cache.request::<KEYS>(team, span, tiles, 0) };
        cp_async_commit();
        cp_async_wait::<0>();
        // Every lane's copies are visible to the whole warp (the block is this warp).
        // SAFETY: all lanes run the same tiles.
        unsafe { sync_warp() };
        if C::STAGED {
            // SAFETY: as `request`, after the copies landed; the tiles visible after the
            // barrier.
            unsafe {
                a.cache.land::<KEYS>(team, span, tiles, 0);
                sync_warp();
            }
        }

        // S = Q K^T: s[j] holds (row g, keys k0 + 8 j + c, + 1), (row g + 8, same). The keys'
        // tile is `[key][dim]`, the `b` operand's column-major layout.
        let mut s = [[0.0f32; 4]; KEYS / 8];
        unroll!(kc < KC => {
            unroll!(pair < KEYS / 16 => {
                let key = 16 * pair + lane % 8 + 8 * (lane / 16);
                // SAFETY: inside the keys' tile; the whole warp is here.
                let b = unsafe { ldmatrix_x4(tile_at(k_tile, key, 16 * kc + 8 * (lane / 8 % 2))) };
                mma_bf16_16816(&mut s[2 * pair], qf[kc], [b[0], b[1]]);
                mma_bf16_16816(&mut s[2 * pair + 1], qf[kc], [b[2], b[3]]);
            });
        });

        // Keys past the split's end weigh nothing; then the online softmax of each row (its
        // values across a quad of lanes: the maximum and the sum take two shuffles).
        let mut step_max = m;
        unroll!(j < KEYS / 8 => {
            unroll!(e < 4 => {
                let r = e / 2;
                if k0 + 8 * j + c + e % 2 >= end {
                    s[j][e] = f32::NEG_INFINITY;
                }
                step_max[r] = step_max[r].max(s[j][e]);
            });
        });
        let mut rescale = [0.0f32; 2];
        unroll!(r < 2 => {
            step_max[r] = step_max[r].max(shfl_xor(step_max[r], 1));
            step_max[r] = step_max[r].max(shfl_xor(step_max[r], 2));
            // Key k0 is inside the split, so the maximum is finite from the first tile;
            // 2^-inf = 0 for the first tile's empty history.
            rescale[r] = exp2_approx(m[r] - step_max[r]);
        });
        let mut sum = [0.0f32; 2];
        unroll!(j < KEYS / 8 => {
            unroll!(e < 4 => {
                let r = e / 2;
                s[j][e] = exp2_approx(s[j][e] - step_max[r]);
                sum[r] += s[j][e];
            });
        });
        unroll!(r < 2 => {
            sum[r] += shfl_xor(sum[r], 1);
            sum[r] += shfl_xor(sum[r], 2);
            l[r] = l[r] * rescale[r] + sum[r];
            m[r] = step_max[r];
        });
        unroll!(j < NT => {
            o[j] = [o[j][0] * rescale[0], o[j][1] * rescale[0], o[j][2] * rescale[1], o[j][3] * rescale[1]];
        });

        // O += P V. The weights of keys 16 kc2 .. + 16 are, in s's layout, exactly the `a`
        // operand's; the values' tile `[key][dim]` is the `b` operand transposed, which
        // `ldmatrix.trans` undoes.
        unroll!(kc2 < KEYS / 16 => {
            let (lo, hi) = (s[2 * kc2], s[2 * kc2 + 1]);
            let p = [pack_bf16x2(lo[0], lo[1]), pack_bf16x2(lo[2], lo[3]), pack_bf16x2(hi[0], hi[1]), pack_bf16x2(hi[2], hi[3])];
            unroll!(dp < NT / 2 => {
                let key = 16 * kc2 + lane % 8 + 8 * (lane / 8 % 2);
                // SAFETY: inside the values' tile; the whole warp is here.
                let b = unsafe { ldmatrix_x4_trans(tile_at(v_tile, key, 16 * dp + 8 * (lane / 16))) };
                mma_bf16_16816(&mut o[2 * dp], p, [b[0], b[1]]);
                mma_bf16_16816(&mut o[2 * dp + 1], p, [b[2], b[3]]);
            });
        });

        k0 += KEYS;
        if k0 < end {
            // Everyone is done reading the tiles before the next copies overwrite them.
            // SAFETY: all lanes run the same tiles.
            unsafe { sync_warp() };
        }
    }

    // Row g's partial result: the weighted values unnormalised, the maximum back in natural
    // units (the scores were in powers of two), the sum of weights.
    if real {
        unroll!(j < NT => {
            // SAFETY: row `at` of the partials; 8 j + c + 1 < head_dim.
            unsafe {
                *a.partial_o.add(at * head_dim + 8 * j + c) = o[j][0];
                *a.partial_o.add(at * head_dim + 8 * j + c + 1) = o[j][1];
            }
        });
        if lane.is_multiple_of(4) {
            // SAFETY: row `at` of the partials.
            unsafe {
                *a.partial_ml.add(2 * at) = m[0] * core::f32::consts::LN_2;
                *a.partial_ml.add(2 * at + 1) = l[0];
            }
        }
    }
}
