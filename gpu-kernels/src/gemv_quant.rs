//! Linear layers over quantized weights (`quant_blocks.rs`), the weights dequantized in
//! registers on their way from memory:
//! - `gemv_fp8`: up to `QUANT_MAX_TOKENS` tokens times an fp8 matrix, the decode step's
//!   matmul, on the tensor cores; `gemv_swiglu_fp8` the MLP's gate and up matrices and
//!   their SwiGLU in one launch. Decode reads every weight once per token, so the fewer
//!   bytes a weight takes, the faster the step. (The GGUF types have their own, in
//!   integers: `gemv_codes.rs`.)
//! - `dequant_<type>`: rows of the matrix to bf16 (for the tensor-core GEMM of a prompt,
//!   which does enough arithmetic per weight that the extra pass costs little) or to f32
//!   (the embedding's rows for a batch's tokens), written once, generic over the type
//!   (`dequant_blocks`), and stamped out per type at the end of the file; a whole Q8_0
//!   matrix takes a path of its own (`dequant_q8_0_pieces`).

use crate::device::{
    WARP, block_dim_x, block_idx_x, dynamic_shared, exp, f16_to_f32, funnel_shift, global_idx_x,
    ld_nc_once_v4, ld_nc_u16, ld_nc_u32, ld_nc_v4, pack_bf16x2, pack_f16x2, st_v4, store_output,
    sync_threads, thread_idx_x, wait_for_previous_kernel,
};
use crate::mma::mma_f16_16816;
use crate::quant_blocks::{Blocks, Fp8, GROUP, Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q5K, Q6K, Q8_0, small};
use crate::tiles::{
    DEQUANT_STAGE_WORDS, FP8_PARTS, FP8_TILE_ROWS, FP8_UNROLL, QUANT_MAX_TOKENS, dequant_in_pieces,
};
use crate::unroll::unroll;

/// What a row's sums are multiplied by: `Blocks::UNSCALE` and the row's scale (fp8), 1
/// for the GGUF types, whose scales are inside their blocks.
///
/// # Safety
/// `row_scales` is null or holds the row.
#[inline(always)]
unsafe fn row_scale<B: Blocks>(row_scales: *const f32, row: usize) -> f32 {
    if row_scales.is_null() {
        return B::UNSCALE;
    }
    // SAFETY: the caller's guarantee.
    B::UNSCALE * unsafe { *row_scales.add(row) }
}

/// Columns of one chunk of the fp8 GEMV: a row's 4 lanes x 16 bytes, the reduction of four
/// `mma`s.
const FP8_CHUNK: usize = 64;

/// What a sum of the tensor cores' products is multiplied by, with the row's scale: the
/// activations reach them as 2^-8 times their values (`FP8_X_SCALE`), the weights as
/// theirs on Hopper and as 2^-8 times theirs on sm_80 (`e4m3_pair_f16`). Powers of two, so
/// both give the same sums.
const FP8_MMA_UNSCALE: f32 = if cfg!(target_feature = "sm_90") {
    256.0
} else {
    65536.0
};

/// What each activation is multiplied by before it is rounded to f16: values up to 2^24
/// keep f16's 11 bits, where f16 alone would overflow past 65504; the smallest lose some,
/// far below what e4m3's 4 bits of weight lose. The twin rounds the same.
const FP8_X_SCALE: f32 = 1.0 / 256.0;

/// Accumulators of the fp8 GEMV's `mma`s a lane keeps (`fp8_tile_sums`): two measured
/// faster than one, and than four (H200: docs/lessons.md#quantized-gemvs).
const FP8_SUMS: usize = 2;

/// e4m3 bytes `2 h` and `2 h + 1` of `word` as an f16 pair (byte `2 h` the low half):
/// Hopper's conversion, one instruction a pair.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
fn e4m3_pair_f16(word: u32, h: usize) -> u32 {
    crate::device::e4m3x2_to_f16x2((word >> (16 * h)) as u16)
}

/// e4m3 bytes `2 h` and `2 h + 1` of `word` as an f16 pair (byte `2 h` the low half), each
/// 2^-8 times its value, for sm_80, which has no e4m3 conversion. `prmt` sign-extends each
/// byte to 16 bits; shifted up by 7, a byte's sign, 4 exponent bits and 3 mantissa bits land
/// on f16's sign, low 4 exponent bits and top 3 mantissa bits, and the mask clears the copy
/// of the sign left in f16's top exponent bit. An e4m3 exponent (bias 7) read with f16's
/// bias of 15 is 2^-8 times the value, for the subnormals (exponent 0) too. Three
/// instructions a pair.
#[cfg(not(target_feature = "sm_90"))]
#[inline(always)]
fn e4m3_pair_f16(word: u32, h: usize) -> u32 {
    // Bytes 0, sign of 0, 1, sign of 1 (or 2 and 3): `prmt`'s selector 8 + i copies byte
    // i's sign bit.
    let extended = crate::device::prmt(word, 0, if h == 0 { 0x9180 } else { 0xb3a2 });
    (extended << 7) & 0xbf80_bf80
}

/// The sums of a tile of 16 fp8 rows with the tokens' activations, left in shared memory:
/// the loop of `gemv_fp8` and `gemv_swiglu_fp8`. `rows[0]` is the lane's row g and
/// `rows[1]` its row g + 8 (`g = lane / 4`), null past the matrix.
///
/// Thread mapping: the block's `FP8_PARTS` warps each take a part of the reduction (whole
/// chunks of 64 columns). The rows are an `mma`'s 16-row operand and the tokens its 8
/// columns (`mma_f16_16816`): lane (g, t) (`t = lane % 4`) loads 16 bytes of each of its
/// rows at column `16 t` of the chunk, and token g's 16 activations there. The reduction's
/// order is free, so the four `mma`s of a chunk each take 4 of the lane's columns, `k` 2t,
/// 2t+1, 2t+8, 2t+9 being its columns `4 j + 0..4`: the lane's bytes are its operand as they
/// come. A token past `n_tokens` multiplies zeros. `FP8_UNROLL` chunks' loads are in flight
/// before any is used; the first of them are issued before the wait for the kernel before,
/// which is here, not in the callers.
///
/// Returns `[FP8_PARTS][FP8_TILE_ROWS][QUANT_MAX_TOKENS]` f32 in shared memory, each warp's
/// sums (`1 / FP8_MMA_UNSCALE` times the true ones), after a barrier: `fp8_sum` adds a
/// row's parts.
///
/// # Safety
/// Every thread of the block calls it; `gemv_fp8`'s preconditions; each row pointer null or
/// a row of `n_in` bytes, 16-byte aligned.
#[inline(always)]
unsafe fn fp8_tile_sums(
    x: *const f32,
    rows: [*const u8; 2],
    n_tokens: usize,
    n_in: usize,
) -> *const f32 {
    let (warp, lane) = (thread_idx_x() / WARP, thread_idx_x() % WARP);
    let (g, t) = (lane / 4, lane % 4);
    // This warp's chunks, [c, end).
    let chunks = n_in.div_ceil(FP8_CHUNK);
    let (mut c, end) = (warp * chunks / FP8_PARTS, (warp + 1) * chunks / FP8_PARTS);
    // The weights never change, so the first chunks' loads go ahead of the wait for the
    // kernel before (whose output is `x`): the blocks placed while it drains have their
    // first weights on the way (with Hopper's e4m3 conversion, 1.3-2.1% on the H200:
    // docs/lessons.md#quantized-gemvs).
    // SAFETY: the rows as the preconditions list.
    let mut words = unsafe { fp8_chunk_words(rows, c, end, t, n_in) };
    wait_for_previous_kernel();
    // Chunk u's `mma`s go into accumulator u % FP8_SUMS: each `mma` waits for the one
    // before it into the same accumulator.
    let mut accs = [[0.0f32; 4]; FP8_SUMS];
    while c < end {
        unroll!(u < FP8_UNROLL => {
            // Warp-uniform: every lane runs the chunk's `mma`s, or none does.
            if c + u < end {
                let col = (c + u) * FP8_CHUNK + 16 * t;
                // Token g's 16 activations at the lane's columns, as 8 f16 pairs.
                let mut xs = [0u32; 8];
                if g < n_tokens && col < n_in {
                    unroll!(q < 4 => {
                        // SAFETY: 4 of token g's activations, 16-byte aligned (n_in % 16 == 0).
                        let v = unsafe { ld_nc_v4(x.add(g * n_in + col + 4 * q) as *const u32) };
                        let v = v.map(|b| f32::from_bits(b) * FP8_X_SCALE);
                        xs[2 * q] = pack_f16x2(v[0], v[1]);
                        xs[2 * q + 1] = pack_f16x2(v[2], v[3]);
                    });
                }
                let [row_g, row_g8] = words[u];
                unroll!(j < 4 => {
                    let a = [
                        e4m3_pair_f16(row_g[j], 0),
                        e4m3_pair_f16(row_g8[j], 0),
                        e4m3_pair_f16(row_g[j], 1),
                        e4m3_pair_f16(row_g8[j], 1),
                    ];
                    mma_f16_16816(&mut accs[u % FP8_SUMS], a, [xs[2 * j], xs[2 * j + 1]]);
                });
            }
        });
        c += FP8_UNROLL;
        if c < end {
            // SAFETY: as above.
            words = unsafe { fp8_chunk_words(rows, c, end, t, n_in) };
        }
    }
    let acc = accs[1..]
        .iter()
        .fold(accs[0], |sum, a| [0, 1, 2, 3].map(|i| sum[i] + a[i]));
    // The lane holds (row g, tokens 2t and 2t + 1) and (row g + 8, the same).
    let shared = dynamic_shared::<f32>();
    unroll!(i < 4 => {
        let (r, token) = (g + 8 * (i / 2), 2 * t + i % 2);
        // SAFETY: inside the launch's FP8_SHARED_BYTES.
        unsafe { *shared.add((warp * FP8_TILE_ROWS + r) * QUANT_MAX_TOKENS + token) = acc[i] };
    });
    // SAFETY: every thread of the block reaches the barrier.
    unsafe { sync_threads() };
    shared
}

/// The lane's 16 bytes of each of its two rows (`fp8_tile_sums`) in chunks `c..c + FP8_UNROLL`
/// below `end`, zeros past them and past the rows: `[chunk][row g, row g + 8][4 words]`.
/// All the loads are issued before any is used.
///
/// # Safety
/// Each row pointer null or a row of `n_in` bytes, 16-byte aligned; `t < 4`.
#[inline(always)]
unsafe fn fp8_chunk_words(
    rows: [*const u8; 2],
    c: usize,
    end: usize,
    t: usize,
    n_in: usize,
) -> [[[u32; 4]; 2]; FP8_UNROLL] {
    let mut words = [[[0u32; 4]; 2]; FP8_UNROLL];
    unroll!(u < FP8_UNROLL => {
        let col = (c + u) * FP8_CHUNK + 16 * t;
        if c + u < end && col < n_in {
            unroll!(r < 2 => {
                if !rows[r].is_null() {
                    // Read once: no L1 line for them (`ld_nc_once_v4`).
                    // SAFETY: 16 bytes of the row, 16-byte aligned.
                    words[u][r] = unsafe { ld_nc_once_v4(rows[r].add(col) as *const u32) };
                }
            });
        }
    });
    words
}

/// Row `r`'s sum of the tile for `token`, its warps' parts added in order,
/// `1 / FP8_MMA_UNSCALE` times the true sum.
///
/// # Safety
/// `sums` as `fp8_tile_sums` returned it; `r < FP8_TILE_ROWS`, `token < QUANT_MAX_TOKENS`.
#[inline(always)]
unsafe fn fp8_sum(sums: *const f32, r: usize, token: usize) -> f32 {
    let mut sum = 0.0;
    for p in 0..FP8_PARTS {
        // SAFETY: the caller's guarantee.
        sum += unsafe { *sums.add((p * FP8_TILE_ROWS + r) * QUANT_MAX_TOKENS + token) };
    }
    sum
}

/// Row `row` of an fp8 matrix if it has one.
#[inline(always)]
fn fp8_row(w: *const u8, row: usize, n_in: usize, n_rows: usize) -> *const u8 {
    if row < n_rows {
        w.wrapping_add(row * n_in)
    } else {
        core::ptr::null()
    }
}

/// `out[t, o] = (accumulate ? out[t, o] : 0) + scale[o] * sum_i w[o, i] x[t, i] + bias[o]`
/// for tokens `t < n_tokens`, over fp8 rows: the decode step's matmul for `--weights fp8`,
/// on the tensor cores.
///
/// - `out`: `[n_tokens, out_stride]` f32, this matrix's rows at columns `0..n_out`
/// - `x`: `[n_tokens, n_in]` f32
/// - `w`: `[n_out, n_in]` e4m3; `row_scales`: `[n_out]` f32
/// - `bias`: null or `[n_out]` f32
///
/// Thread mapping: a block of `FP8_PARTS` warps for every 16 rows (`fp8_tile_sums`); the
/// first threads each finish one (row, token).
///
/// Measured on the H200: the GEMV before this, one warp a row, decoded each
/// weight to f32 by three integer instructions and multiplied it by an f32 activation read
/// through L1 (four bytes of activations for each byte of weight), and held the fp8 decode
/// to 0.36 of the copy bandwidth (203 tok/s on the 8B shape). Here a chunk of 1024 weights
/// takes a warp about 80 instructions (48 of them the weights' decoding; 16 on Hopper,
/// which converts a pair in one) and brings 256 bytes of activations a token: 0.52 of the
/// copy bandwidth (293 tok/s), with `gemv_swiglu_fp8`; 0.54-0.55 (305-308 tok/s)
/// with Hopper's conversion, the first loads ahead of the wait, two accumulators and two
/// chunks in flight (docs/lessons.md#quantized-gemvs).
///
/// # Safety
/// `n_in % 16 == 0`; `w` and `x` 16-byte aligned; `1 <= n_tokens <= QUANT_MAX_TOKENS`;
/// `row_scales` holds `n_out` scales; `blockDim.x == 32 * FP8_PARTS`; the launch gives
/// `FP8_SHARED_BYTES` of dynamic shared memory; `x` does not overlap `out`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "gpu-kernel" fn gemv_fp8(
    out: *mut f32,
    x: *const f32,
    w: *const u8,
    row_scales: *const f32,
    bias: *const f32,
    n_tokens: u32,
    n_in: u32,
    n_out: u32,
    out_stride: u32,
    accumulate: u32,
) {
    let (n_tokens, n_in, n_out) = (n_tokens as usize, n_in as usize, n_out as usize);
    let first_row = block_idx_x() * FP8_TILE_ROWS;
    let g = thread_idx_x() % WARP / 4;
    let rows = [g, g + 8].map(|r| fp8_row(w, first_row + r, n_in, n_out));
    // SAFETY: the preconditions, passed on; every thread calls it.
    let sums = unsafe { fp8_tile_sums(x, rows, n_tokens, n_in) };
    let (r, token) = (
        thread_idx_x() / QUANT_MAX_TOKENS,
        thread_idx_x() % QUANT_MAX_TOKENS,
    );
    let row = first_row + r;
    if r < FP8_TILE_ROWS && row < n_out && token < n_tokens {
        // SAFETY: row < n_out, token < n_tokens: inside the sums, out, the scales and bias.
        unsafe {
            let sum = fp8_sum(sums, r, token) * FP8_MMA_UNSCALE * *row_scales.add(row);
            let o = out.add(token * out_stride as usize + row);
            store_output(o, sum, bias, row, accumulate != 0);
        }
    }
}

/// `out[t, o] = silu(gate[t, o]) * up[t, o]` where `gate = x w_gate^T` and `up = x w_up^T`
/// (each row times its scale), for tokens `t < n_tokens`: the MLP's gate, up and SwiGLU in
/// one launch for `--weights fp8`.
///
/// - `out`: `[n_tokens, out_stride]` f32, columns `0..n_out`
/// - `x`: `[n_tokens, n_in]` f32
/// - `w_gate`, `w_up`: `[n_out, n_in]` e4m3; `gate_scales`, `up_scales`: `[n_out]` f32
///
/// Thread mapping: `gemv_fp8`'s, a block for every 8 outputs: its tile's rows 0..8 are
/// gate's rows and 8..16 up's, so that one thread finds both sums of an output beside each
/// other. `e^x` is `swiglu_f32`'s.
///
/// # Safety
/// `gemv_fp8`'s, for both matrices.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "gpu-kernel" fn gemv_swiglu_fp8(
    out: *mut f32,
    x: *const f32,
    w_gate: *const u8,
    w_up: *const u8,
    gate_scales: *const f32,
    up_scales: *const f32,
    n_tokens: u32,
    n_in: u32,
    n_out: u32,
    out_stride: u32,
) {
    let (n_tokens, n_in, n_out) = (n_tokens as usize, n_in as usize, n_out as usize);
    let first = block_idx_x() * (FP8_TILE_ROWS / 2);
    let row = first + thread_idx_x() % WARP / 4;
    let rows = [
        fp8_row(w_gate, row, n_in, n_out),
        fp8_row(w_up, row, n_in, n_out),
    ];
    // SAFETY: the preconditions, passed on; every thread calls it.
    let sums = unsafe { fp8_tile_sums(x, rows, n_tokens, n_in) };
    let (r, token) = (
        thread_idx_x() / QUANT_MAX_TOKENS,
        thread_idx_x() % QUANT_MAX_TOKENS,
    );
    let o = first + r;
    if r < FP8_TILE_ROWS / 2 && o < n_out && token < n_tokens {
        // SAFETY: o < n_out, token < n_tokens: inside the sums, out and both scales.
        unsafe {
            let gate = fp8_sum(sums, r, token) * FP8_MMA_UNSCALE * *gate_scales.add(o);
            let up = fp8_sum(sums, r + 8, token) * FP8_MMA_UNSCALE * *up_scales.add(o);
            *out.add(token * out_stride as usize + o) = gate / (1.0 + exp(-gate)) * up;
        }
    }
}

/// Rows `rows[r]` (or row r itself where `rows` is null) of the matrix, dequantized, to row
/// r of `out_f32` if that is set, else of `out_bf16`: `[n_rows, n_in]` either way.
///
/// Thread mapping: one thread per (row, group), consecutive threads along a row, so a
/// block's groups are one run of the output. To f32 (the embedding's few rows) each thread
/// writes its group. To bf16 (whole matrices for the prompt's GEMM) the block's threads
/// first leave their groups in shared memory, then copy the block's run out 16 bytes a
/// thread, in order: written straight from the registers, a warp's 16-byte stores lay 64
/// bytes apart, and each filled half of 32 sectors where it could fill 16 whole.
///
/// # Safety
/// `w` is whole blocks of the type, aligned as `Blocks::load` asks; every `rows[r]` a row of the matrix; exactly one output set, with
/// `[n_rows, n_in]` elements, 16-byte aligned; `row_scales` null or one per row of `w`; a
/// bf16 output takes `dequant_shared_bytes(blockDim.x)` bytes of dynamic shared memory.
#[inline(always)]
unsafe fn dequant_blocks<B: Blocks>(
    out_bf16: *mut u16,
    out_f32: *mut f32,
    w: *const u8,
    row_scales: *const f32,
    rows: *const u32,
    n_rows: usize,
    n_in: usize,
) {
    wait_for_previous_kernel();
    let groups = n_in / GROUP;
    let total = n_rows * groups;
    let i = global_idx_x();
    // Group i's scale and bytes.
    // SAFETY (both): i < total; rows, the scales and the outputs as the preconditions say.
    let group = |i: usize| unsafe {
        let (r, g) = (i / groups, i % groups);
        let src = if rows.is_null() {
            r
        } else {
            *rows.add(r) as usize
        };
        let row = w.add(src * (n_in / B::BLOCK_LEN * B::BLOCK_BYTES));
        (row_scale::<B>(row_scales, src), B::load(row, g))
    };
    if !out_f32.is_null() {
        if i >= total {
            return;
        }
        let (scale, raw) = group(i);
        unroll!(k < 4 => {
            let v = B::decode8(&raw, k).map(|v| v * scale);
            // SAFETY: group i of the output, 16-byte aligned.
            unsafe {
                let p = out_f32.add(32 * i + 8 * k) as *mut u32;
                st_v4(p, [v[0], v[1], v[2], v[3]].map(f32::to_bits));
                st_v4(p.add(4), [v[4], v[5], v[6], v[7]].map(f32::to_bits));
            }
        });
        return;
    }
    // [blockDim.x][DEQUANT_STAGE_WORDS] u32: each thread's group as 16 bf16 pairs, padded
    // by a word so that the lanes' stores fall in different banks.
    let stage = dynamic_shared::<u32>();
    let t = thread_idx_x();
    if i < total {
        let (scale, raw) = group(i);
        unroll!(k < 4 => {
            let v = B::decode8(&raw, k).map(|v| v * scale);
            unroll!(j < 4 => {
                // SAFETY: thread t's words, inside the launch's shared memory.
                unsafe {
                    *stage.add(DEQUANT_STAGE_WORDS * t + 4 * k + j) =
                        pack_bf16x2(v[2 * j], v[2 * j + 1]);
                }
            });
        });
    }
    // SAFETY: every thread of the block reaches the barrier.
    unsafe { sync_threads() };
    let first = block_idx_x() * block_dim_x();
    let chunks = 4 * (total - first).min(block_dim_x());
    let mut c = t;
    while c < chunks {
        let (g, q) = (c / 4, c % 4);
        // SAFETY: group first + g < total was staged above; its 16 bytes q of the output
        // are inside it, 16-byte aligned.
        unsafe {
            let words = [0, 1, 2, 3].map(|j| *stage.add(DEQUANT_STAGE_WORDS * g + 4 * q + j));
            st_v4(out_bf16.add(32 * (first + g) + 8 * q) as *mut u32, words);
        }
        c += block_dim_x();
    }
}

/// A whole Q8_0 matrix to bf16 (`dequant_q8_0` without row ids): the matrix is one run of
/// `groups` 34-byte blocks, and thread t of a block makes pieces t, t + blockDim, .. of the
/// `4 * blockDim` pieces of 8 weights (16 bytes of output) of the block's groups, so
/// that consecutive threads store consecutive 16 bytes straight from their registers: no
/// shared memory, no barrier. A piece's 8 bytes start 2-byte aligned; two aligned words,
/// two bytes after them and a funnel shift find them. Every load is issued before the first
/// store, so a
/// thread keeps four pieces on their way, and before the wait for the kernel before, so
/// that they start while it drains (on the H200, docs/lessons.md#prefill-on-tensor-cores:
/// 3556-3585 GB/s read plus written, against 3301 for `dequant_blocks`'s groups staged
/// through shared memory).
///
/// # Safety
/// `w` is `groups` whole Q8_0 blocks, 2-byte aligned; `out_bf16` holds `32 * groups`
/// elements, 16-byte aligned.
#[inline(always)]
unsafe fn dequant_q8_0_pieces(out_bf16: *mut u16, w: *const u8, groups: usize) {
    // Pieces of 8 weights a group; the loops below unroll over the 4.
    const PIECES: usize = GROUP / 8;
    let first = block_idx_x() * block_dim_x();
    if first >= groups {
        return;
    }
    let pieces = PIECES * (groups - first).min(block_dim_x());
    let t = thread_idx_x();
    // Piece k's block scale, the two words from the one its bytes start in, the two bytes
    // after those words, and where in the words the piece starts (0 or 16 bits in).
    let mut d = [0u16; PIECES];
    let mut words = [[0u32; 2]; PIECES];
    let mut tail = [0u16; PIECES];
    let mut shift = [0u32; PIECES];
    unroll!(k < 4 => {
        let c = t + k * block_dim_x();
        if c < pieces {
            let block = first + c / PIECES;
            let at = 34 * block + 2 + 8 * (c % PIECES);
            let word = at & !3;
            shift[k] = 8 * (at & 3) as u32;
            // A piece that starts half a word in ends two bytes into the word after the
            // two; one that starts on a word is whole in them, and reads its last two
            // bytes again rather than anything past the piece (past the matrix, for the
            // last block's last piece).
            let tail_at = if shift[k] == 0 { word + 6 } else { word + 8 };
            // SAFETY: block < groups; the scale, the words and the tail lie inside its
            // 34 bytes, 2- and 4-byte aligned as they are read.
            unsafe {
                d[k] = ld_nc_u16(w.add(34 * block) as *const u16);
                words[k] = [word, word + 4].map(|at| ld_nc_u32(w.add(at) as *const u32));
                tail[k] = ld_nc_u16(w.add(tail_at) as *const u16);
            }
        }
    });
    // The weights never change, so their loads go ahead of the kernel before, whose reads of
    // the output must end before the first store.
    wait_for_previous_kernel();
    unroll!(k < 4 => {
        let c = t + k * block_dim_x();
        if c < pieces {
            let [a, b] = words[k];
            let bytes = [
                funnel_shift(a, b, shift[k]),
                funnel_shift(b, tail[k] as u32, shift[k]),
            ];
            let scale = f16_to_f32(d[k]);
            // As `Q8_0::decode8`: a signed byte q is (q ^ 0x80) - 128, times the scale.
            let weight = |j: usize| {
                let q = (bytes[j / 4] >> (8 * (j % 4) as u32)) & 0xff;
                scale * small(q ^ 0x80, 128.0)
            };
            let out = [0, 1, 2, 3].map(|j| pack_bf16x2(weight(2 * j), weight(2 * j + 1)));
            // SAFETY: piece c of this block's groups: inside the output, 16-byte aligned.
            unsafe { st_v4(out_bf16.add(8 * (PIECES * first + c)) as *mut u32, out) };
        }
    });
}

/// `dequant_<type>`: `dequant_blocks` over each type, its sizes as `u32`s; a type with a
/// `whole matrix` kernel (Q8_0's `dequant_q8_0_pieces`) hands it the launches that make a
/// whole matrix to bf16 (`dequant_in_pieces`).
macro_rules! dequant_kernels {
    ($($ty:ident => $dequant:ident $(, whole matrix: $whole:ident)?;)*) => {$(
        #[doc = concat!("`dequant_blocks` over `", stringify!($ty), "` weights.")]
        ///
        /// # Safety
        /// The host's launch wrapper checks `dequant_blocks`'s preconditions.
        #[unsafe(no_mangle)]
        pub unsafe extern "gpu-kernel" fn $dequant(
            out_bf16: *mut u16,
            out_f32: *mut f32,
            w: *const u8,
            row_scales: *const f32,
            rows: *const u32,
            n_rows: u32,
            n_in: u32,
        ) {
            let (n_rows, n_in) = (n_rows as usize, n_in as usize);
            $(
                if dequant_in_pieces(true, !rows.is_null(), !out_f32.is_null()) {
                    // SAFETY: the wrapper's checks; the whole matrix is one run of blocks.
                    return unsafe { $whole(out_bf16, w, n_rows * (n_in / GROUP)) };
                }
            )?
            // SAFETY: the wrapper's checks.
            unsafe {
                dequant_blocks::<$ty>(out_bf16, out_f32, w, row_scales, rows, n_rows, n_in)
            }
        }
    )*};
}

dequant_kernels! {
    Q4_0 => dequant_q4_0;
    Q4_1 => dequant_q4_1;
    Q5_0 => dequant_q5_0;
    Q5_1 => dequant_q5_1;
    Q8_0 => dequant_q8_0, whole matrix: dequant_q8_0_pieces;
    Q4K => dequant_q4_k;
    Q5K => dequant_q5_k;
    Q6K => dequant_q6_k;
    Fp8 => dequant_fp8;
}
