//! Causal attention for a prompt on tensor cores: flash attention with `mma.sync`.
//!
//! `attention_f32` gives each (token, head) its own block and walks the keys one at a time,
//! every key read from memory once per query head and token: a memory-bound kernel, half of
//! a 512-token prefill. Here a block takes 64 (token, query head) rows of one KV group and
//! walks the keys 64 at a time: each step has a tile of keys and values (bf16, as the cache
//! holds them) in shared memory once for all 64 rows, the next tile arriving by `cp.async`
//! into a second buffer meanwhile, multiplies the rows' queries by the keys on the
//! tensor cores (`S = Q K^T`, 16 rows per warp), takes the softmax of `S` online (running
//! maximum and sum per row, earlier output rescaled when the maximum grows), and multiplies
//! the weights by the values (`O += P V`), the weights going from the first product's output
//! registers straight into the second's input registers.

use crate::args::PagedShape;
use crate::device::{
    WARP, block_dim_x, block_idx_x, block_idx_y, dynamic_shared, exp2_approx, pack_bf16x2,
    shfl_xor, shfl_xor_u32, sqrt, sync_threads, thread_idx_x,
};
use crate::kv_tiles::{Bf16Cache, Fp8Cache, KvTiles, Team, TileSpan, Tiles, tile_at, tile_stride};
use crate::mma::{
    cp_async_commit, cp_async_wait, ldmatrix_x4, ldmatrix_x4_trans, mma_bf16_16816, shared_addr,
};
use crate::tiles::{ATTN_MMA_KEYS, ATTN_MMA_ROWS, fp8_staging_bytes};
use crate::unroll::unroll;

/// For each (token, query head) row: `out = softmax(q . K^T / sqrt(head_dim)) V` over the keys
/// and values of the token's sequence at positions `0..=positions[t]` (from the window's
/// first where `shape` has a sliding window), read from KV head
/// `h / (n_heads / n_kv_heads)` through the sequence's block table. The same result as
/// `attention_bf16`, with q (scaled) and the softmax weights rounded to bf16 for the tensor
/// cores, sums in f32.
///
/// - `out`, `q`: `[n, n_heads, head_dim]` f32
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * 16, n_kv_heads, head_dim]` bf16
/// - `block_tables`: `[n_seqs, max_blocks]` u32; `token_seq`, `positions`: `[n]` u32
/// - `shape`: the heads and the block tables' stride; `n`: the tokens
///
/// Thread mapping: block `(128)` = 4 warps; grid `(ceil(n * group / 64), n_kv_heads)` with
/// `group = n_heads / n_kv_heads`. Block `(x, y)` takes rows `64 x .. 64 x + 64` of KV head
/// `y`'s `n * group` (token, query head) rows, row `r` being token `r / group`, query head
/// `y * group + r % group`: the heads that share a KV head share its tiles. Warp `w` owns
/// 16 of the rows; in the `mma` layouts each lane holds two of them (`g = lane / 4` and
/// `g + 8`). Each step stages 64 keys, from the first any row of the block attends to (0
/// without a window) up to the block's last position.
///
/// PRECONDITIONS: `head_dim` 64 or 128; the tokens of a block (rows `64 x .. 64 x + 64`) in
/// one sequence; their keys and values written; every block-table entry they read valid;
/// block `(128)`; `attn_mma_shared_bytes(head_dim)` of dynamic shared memory.
///
/// # Safety
/// The host's launch wrapper checks the preconditions it can; the caller, that the batch is
/// one sequence.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn attention_mma_bf16(
    out: *mut f32,
    q: *const f32,
    k_cache: *const u16,
    v_cache: *const u16,
    block_tables: *const u32,
    token_seq: *const u32,
    positions: *const u32,
    shape: PagedShape,
    n: u32,
) {
    crate::device::wait_for_previous_kernel();
    let cache = Bf16Cache {
        k: k_cache,
        v: v_cache,
    };
    let args = Args {
        out,
        q,
        cache,
        block_tables,
        token_seq,
        positions,
        shape,
        n: n as usize,
    };
    // SAFETY: the preconditions, passed on.
    unsafe { by_width(args) }
}

/// `attention_mma_bf16` over the fp8 cache (`--kv-dtype fp8`): the same result, each tile's
/// e4m3 keys and values turned into bf16 in shared memory (exactly: `kv_tiles.rs`) before
/// the same products. The next tile's bytes arrive in a second staging buffer while one is
/// turned and multiplied; the bf16 tiles are one buffer.
///
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * 16, n_kv_heads, head_dim]` e4m3
/// - `k_scales`, `v_scales`: one layer, `[n_blocks, n_kv_heads, 16]` scale bytes
/// - the rest as `attention_mma_bf16`'s
///
/// PRECONDITIONS: `attention_mma_bf16`'s, with the scales 16-byte aligned and
/// `attn_mma_fp8_shared_bytes(head_dim)` of dynamic shared memory.
///
/// # Safety
/// As `attention_mma_bf16`.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn attention_mma_fp8(
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
    n: u32,
) {
    crate::device::wait_for_previous_kernel();
    // The staging follows the one buffer of tiles.
    let tiles_bytes = 2 * ATTN_MMA_KEYS * tile_stride(shape.heads.head_dim as usize) * 2;
    let cache = Fp8Cache {
        k: k_cache,
        v: v_cache,
        k_scales,
        v_scales,
        staging: shared_addr(dynamic_shared::<u8>()) + tiles_bytes as u32,
    };
    let args = Args {
        out,
        q,
        cache,
        block_tables,
        token_seq,
        positions,
        shape,
        n: n as usize,
    };
    // SAFETY: the preconditions, passed on.
    unsafe { by_width(args) }
}

/// The kernel for the head width in `args`, which becomes a constant.
///
/// # Safety
/// As `attention_mma_bf16`.
#[inline(always)]
unsafe fn by_width<C: KvTiles>(args: Args<C>) {
    // SAFETY: the caller's guarantee.
    unsafe {
        if args.shape.heads.head_dim == 64 {
            attend::<4, 8, C>(args)
        } else {
            attend::<8, 16, C>(args)
        }
    }
}

/// A prompt attention's arguments, its cache's keys and values as `C` reads them.
struct Args<C> {
    out: *mut f32,
    q: *const f32,
    cache: C,
    block_tables: *const u32,
    token_seq: *const u32,
    positions: *const u32,
    shape: PagedShape,
    n: usize,
}

/// The kernel for `head_dim = 16 KC = 8 NT`: `KC` 16-wide chunks of a head (the reduction
/// of `Q K^T`), `NT` 8-wide tiles of the output.
///
/// # Safety
/// As `attention_mma_bf16`.
#[inline(always)]
unsafe fn attend<const KC: usize, const NT: usize, C: KvTiles>(a: Args<C>) {
    let head_dim = 16 * KC;
    let (n_heads, n_kv_heads) = (
        a.shape.heads.n_heads as usize,
        a.shape.heads.n_kv_heads as usize,
    );
    let group = n_heads / n_kv_heads;
    let kv_head = block_idx_y();
    let r0 = block_idx_x() * ATTN_MMA_ROWS;
    let tid = thread_idx_x();
    let (lane, warp) = (tid % WARP, tid / WARP);
    let (g, c) = (lane / 4, 2 * (lane % 4));

    // This lane's two rows (h = 0, 1): their tokens, whether they exist, their positions.
    let row = |h: usize| r0 + 16 * warp + g + 8 * h;
    let token = |h: usize| row(h) / group;
    let exists = |h: usize| token(h) < a.n;
    // Each row attends to keys lo[h] ..= pos[h]. A row past the end attends to every key
    // the block stages (its result is not stored), so that every row has a finite maximum.
    // SAFETY: token(h) < n.
    let pos = [0, 1].map(|h| {
        if exists(h) {
            unsafe { *a.positions.add(token(h)) as usize }
        } else {
            usize::MAX
        }
    });
    let lo = pos.map(|p| {
        if p == usize::MAX {
            0
        } else {
            a.shape.first_position(p)
        }
    });
    let row_offset = |h: usize| (token(h) * n_heads + kv_head * group + row(h) % group) * head_dim;

    // The block's keys: from the first any of its rows attends to, to its last position.
    // Every thread reads one token of the block's (at most 64), then a warp's minimum and
    // maximum, then the four warps' through shared memory.
    let first = r0 / group;
    let last = ((r0 + ATTN_MMA_ROWS - 1) / group).min(a.n - 1);
    let (mut min_lo, mut max_pos) = (u32::MAX, 0);
    if first + tid <= last {
        // SAFETY: first + tid <= last < n.
        let p = unsafe { *a.positions.add(first + tid) };
        (min_lo, max_pos) = (a.shape.first_position(p as usize) as u32, p);
    }
    for mask in [16, 8, 4, 2, 1] {
        min_lo = min_lo.min(shfl_xor_u32(min_lo, mask));
        max_pos = max_pos.max(shfl_xor_u32(max_pos, mask));
    }
    // Shared memory: two buffers, each keys [64][head_dim + 8] bf16 and values the same (one
    // being multiplied, the next tile arriving in the other), then 4 u32 maxima and 4 u32
    // minima. Over the fp8 cache: one buffer of tiles, the two staging buffers, the same
    // bounds.
    let tile_bytes = ATTN_MMA_KEYS * tile_stride(head_dim) * 2;
    let bounds_at = match C::STAGED {
        true => 2 * tile_bytes + 2 * fp8_staging_bytes(ATTN_MMA_KEYS, head_dim),
        false => 4 * tile_bytes,
    };
    let smem = dynamic_shared::<u8>();
    // SAFETY: 8 u32 past the tiles and staging (the launch's shared memory).
    let (maxima, minima) = unsafe {
        let maxima = smem.add(bounds_at) as *mut u32;
        (maxima, maxima.add(4))
    };
    if lane == 0 {
        // SAFETY: inside the launch's shared memory.
        unsafe {
            *maxima.add(warp) = max_pos;
            *minima.add(warp) = min_lo;
        }
    }
    // SAFETY: every thread reaches it.
    unsafe { sync_threads() };
    // SAFETY: written above.
    let (min_lo, max_pos) = unsafe {
        let mut bounds = (*minima, *maxima);
        for w in 1..4 {
            bounds = (bounds.0.min(*minima.add(w)), bounds.1.max(*maxima.add(w)));
        }
        (bounds.0 as usize, bounds.1 as usize)
    };
    // A row past the end takes the block's range.
    let pos = pos.map(|p| p.min(max_pos));
    // SAFETY: first < n; the sequence's row of the table.
    let table = unsafe {
        a.block_tables
            .add(*a.token_seq.add(first) as usize * a.shape.max_blocks as usize)
    };

    // Buffer `b`'s keys' and values' tiles (over the fp8 cache, one buffer for both).
    let tiles = |b: usize| {
        let k = shared_addr(smem) + (2 * (if C::STAGED { 0 } else { b }) * tile_bytes) as u32;
        Tiles {
            k,
            v: k + tile_bytes as u32,
        }
    };
    let at = |tile: u32, key: usize, d: usize| tile_at(tile, head_dim, key, d);

    // q as the `a` operand of `mma`, scaled by log2(e) / sqrt(head_dim) (the softmax is taken
    // in powers of two) and rounded to bf16: chunk kc holds (row g, dims 16 kc + c, + 1),
    // (row g + 8, same), (row g, + 8), (row g + 8, + 8).
    let scale = core::f32::consts::LOG2_E / sqrt(head_dim as f32);
    let q_pair = |h: usize, d: usize| -> u32 {
        if !exists(h) {
            return 0;
        }
        // SAFETY: the row is inside q; d + 1 < head_dim.
        let p = unsafe { a.q.add(row_offset(h) + d) };
        unsafe { pack_bf16x2(*p * scale, *p.add(1) * scale) }
    };
    let mut qf = [[0u32; 4]; KC];
    unroll!(kc < KC => {
        let d = 16 * kc + c;
        qf[kc] = [q_pair(0, d), q_pair(1, d), q_pair(0, d + 8), q_pair(1, d + 8)];
    });

    // The online softmax's state per row (h = 0, 1) and the output, `mma` accumulator layout:
    // o[j] holds (row g, dims 8 j + c, + 1), (row g + 8, same).
    let (mut m, mut l) = ([f32::NEG_INFINITY; 2], [0.0f32; 2]);
    let mut o = [[0.0f32; 4]; NT];

    // Keys and values k0 .. k0 + 64, past the last position zeros. Thread `tid` takes
    // pieces `tid`, `tid + 128`, ... (a loop kept rolled by its trip count from blockDim:
    // the copies need no registers, the addresses would).
    let team = Team {
        index: tid,
        size: block_dim_x(),
    };
    let span = |k0: usize| TileSpan {
        k0,
        end: max_pos + 1,
        table,
        kv_head,
        n_kv_heads,
        head_dim,
    };
    // Requests keys and values from k0 into buffer `b`, without waiting for them.
    let request = |k0: usize, b: usize| {
        // SAFETY: every thread calls it; positions up to max_pos are the sequence's; the
        // tiles and staging inside the launch's shared memory.
        unsafe {
            a.cache
                .request::<ATTN_MMA_KEYS>(team, span(k0), tiles(b), b)
        };
        cp_async_commit();
    };

    request(min_lo, 0);
    for (step, k0) in (min_lo..=max_pos).step_by(ATTN_MMA_KEYS).enumerate() {
        let b = step % 2;
        // This thread's copies of the tile have landed; after the barrier, everyone's, and
        // everyone is done with the previous tile, whose buffer the next request refills.
        cp_async_wait::<0>();
        // SAFETY: every thread runs the same steps.
        unsafe { sync_threads() };
        if C::STAGED {
            // The staged bytes into the one buffer of tiles, which everyone is done with.
            // SAFETY: every thread, after the copies landed; the tiles visible after the
            // barrier.
            unsafe {
                a.cache.land::<ATTN_MMA_KEYS>(team, span(k0), tiles(b), b);
                sync_threads();
            }
        }
        if k0 + ATTN_MMA_KEYS <= max_pos {
            request(k0 + ATTN_MMA_KEYS, 1 - b);
        }
        let Tiles {
            k: k_tile,
            v: v_tile,
        } = tiles(b);

        // S = Q K^T: s[j] holds (row g, keys k0 + 8 j + c, + 1), (row g + 8, same). The keys'
        // tile is `[key][dim]`, the `b` operand's column-major layout, as `w` is in the GEMM.
        let mut s = [[0.0f32; 4]; 8];
        unroll!(kc < KC => {
            unroll!(pair < 4 => {
                let key = 16 * pair + lane % 8 + 8 * (lane / 16);
                // SAFETY: inside the keys' tile; the whole warp is here.
                let b = unsafe { ldmatrix_x4(at(k_tile, key, 16 * kc + 8 * (lane / 8 % 2))) };
                mma_bf16_16816(&mut s[2 * pair], qf[kc], [b[0], b[1]]);
                mma_bf16_16816(&mut s[2 * pair + 1], qf[kc], [b[2], b[3]]);
            });
        });

        // Causal mask (and the window's), then the online softmax of each row (its 16 values
        // across a quad of lanes: the maximum and sum take two shuffles).
        let mut step_max = m;
        unroll!(j < 8 => {
            unroll!(e < 4 => {
                let h = e / 2;
                let key = k0 + 8 * j + c + e % 2;
                if key > pos[h] || key < lo[h] {
                    s[j][e] = f32::NEG_INFINITY;
                }
                step_max[h] = step_max[h].max(s[j][e]);
            });
        });
        let (mut rescale, mut base) = ([0.0f32; 2], [0.0f32; 2]);
        unroll!(h < 2 => {
            step_max[h] = step_max[h].max(shfl_xor(step_max[h], 1));
            step_max[h] = step_max[h].max(shfl_xor(step_max[h], 2));
            // The weights are taken against the maximum so far, or against 0 by a row whose
            // window starts past every key staged yet (its maximum still -inf): its weights
            // are then 2^-inf = 0, not NaN. 2^-inf = 0 for the empty history before a row's
            // first key.
            base[h] = if step_max[h] == f32::NEG_INFINITY { 0.0 } else { step_max[h] };
            rescale[h] = exp2_approx(m[h] - base[h]);
        });
        let mut sum = [0.0f32; 2];
        unroll!(j < 8 => {
            unroll!(e < 4 => {
                let h = e / 2;
                s[j][e] = exp2_approx(s[j][e] - base[h]);
                sum[h] += s[j][e];
            });
        });
        unroll!(h < 2 => {
            sum[h] += shfl_xor(sum[h], 1);
            sum[h] += shfl_xor(sum[h], 2);
            l[h] = l[h] * rescale[h] + sum[h];
            m[h] = step_max[h];
        });
        unroll!(j < NT => {
            o[j] = [o[j][0] * rescale[0], o[j][1] * rescale[0], o[j][2] * rescale[1], o[j][3] * rescale[1]];
        });

        // O += P V. The weights of keys 16 kc2 .. + 16 are, in s's layout, exactly the `a`
        // operand's; the values' tile `[key][dim]` is the `b` operand transposed, which
        // `ldmatrix.trans` undoes.
        unroll!(kc2 < 4 => {
            let (lo, hi) = (s[2 * kc2], s[2 * kc2 + 1]);
            let p = [pack_bf16x2(lo[0], lo[1]), pack_bf16x2(lo[2], lo[3]), pack_bf16x2(hi[0], hi[1]), pack_bf16x2(hi[2], hi[3])];
            unroll!(dp < NT / 2 => {
                let key = 16 * kc2 + lane % 8 + 8 * (lane / 8 % 2);
                // SAFETY: inside the values' tile; the whole warp is here.
                let b = unsafe { ldmatrix_x4_trans(at(v_tile, key, 16 * dp + 8 * (lane / 16))) };
                mma_bf16_16816(&mut o[2 * dp], p, [b[0], b[1]]);
                mma_bf16_16816(&mut o[2 * dp + 1], p, [b[2], b[3]]);
            });
        });
    }

    unroll!(h < 2 => {
        if exists(h) {
            let inv = 1.0 / l[h];
            // SAFETY: the row is inside out.
            let out_row = unsafe { a.out.add(row_offset(h)) };
            unroll!(j < NT => {
                // SAFETY: 8 j + c + 1 < head_dim.
                unsafe {
                    *out_row.add(8 * j + c) = o[j][2 * h] * inv;
                    *out_row.add(8 * j + c + 1) = o[j][2 * h + 1] * inv;
                }
            });
        }
    });
}
