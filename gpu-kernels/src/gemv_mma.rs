//! The integer GEMV of several tokens on the tensor cores: `gemv_mma_<type>` and
//! `gemv_swiglu_mma_<type>`, for Q4_K and Q6_K (the types of a Q4_K_M file) and Q4_1 and
//! Q8_0 (the default model's).
//!
//! `gemv_codes.rs` multiplies a row by each token in turn with `dp4a`: its weights come from
//! memory once, but are decoded and multiplied again for every token, so that eight tokens
//! cost about as much arithmetic as eight decode steps (Q4_K_M's 8B shape: 8 tokens a pass
//! took 3.66 times one token, docs/lessons.md#speculative-decoding). Here a warp multiplies
//! 16 rows by 8 tokens at once with `mma.m16n8k16` over 8-bit integers: the weights' codes
//! (a nibble, or six bits) are the first operand, the activations' 8-bit codes
//! (`quantize_q8_f32`) the second, and one instruction makes the 16 x 8 sums of 16 weights
//! each. The block's scales are applied to those integer sums once per group of 16 or 32,
//! as `codes.rs` does for one token, so that the arithmetic a weight barely depends on the
//! number of tokens.
//!
//! Measured on the H100 (Llama 3 8B's shape in Q4_K_M, bench/history/rounds.md round 67): a
//! pass of 8 tokens 1.79 decode steps where it was 2.12, 8 sequences 1.20x as fast; but its
//! cost hardly moves from 1 token to 8 and one token takes 1.39 decode steps, the weights
//! read at a little over half the rate of `gemv_<type>`'s one token. So it takes 3 tokens
//! and more (`MMA_GEMV_MIN_TOKENS` on the host). Two blocks' loads in flight a warp gained
//! nothing (round 67); copying a tile's rows whole into shared memory, as `gemv_stream.rs`
//! does, is the step not yet taken.
//!
//! An `mma` sums over its 16 values of k whatever their order, so a lane may hold any 4
//! of a group's weights as long as it holds the same 4 activations: the weights are read
//! as the file lays them out (Q4_K's 8 consecutive bytes a lane, one 8-byte load for two
//! products; Q6_K's 4), and the activations' codes at the same places.

use core::mem::MaybeUninit;

use crate::args::MatmulShape;
use crate::device::{
    WARP, block_idx_x, dynamic_shared, exp, f16_to_f32, ld_nc_u16, ld_nc_u32, ld_nc_v2, ld_nc_v4,
    store_output, sync_threads, thread_idx_x, wait_for_previous_kernel,
};
use crate::gemv_codes::CodesIn;
use crate::mma::mma_s8_16816;
use crate::quant_blocks::{Blocks, Q4_1, Q4K, Q6K, Q8_0, scale_min};
use crate::tiles::{MMA_GEMV_ROWS, MMA_GEMV_WARPS, QUANT_MAX_TOKENS};
use crate::unroll::unroll;

/// What a lane multiplies its weights by: in lane `l` (`g = l / 4`, `t = l % 4`), the codes
/// of token g (the second operand's column g) and the scales of tokens 2t and 2t + 1 (the
/// columns of its sums). A token past the launch's reads the last one; its sums are not
/// written.
#[derive(Clone, Copy)]
pub struct Lane {
    /// `[n_in]` i8: token g's codes.
    codes: *const u8,
    /// `[n_in / 32][2]` f32: the scales of tokens 2t and 2t + 1, (d, d times the sum of the
    /// group's codes).
    scales: [*const f32; 2],
    /// `l % 4`: which of each row's 4-byte pieces the lane holds.
    t: usize,
}

impl Lane {
    /// Token g's 8-bit codes at byte `at` of its row, 4 of them (`N` = 1) or 8 (`N` = 2).
    ///
    /// # Safety
    /// `at` is inside the row, a multiple of `4 N`.
    #[inline(always)]
    unsafe fn codes<const N: usize>(&self, at: usize) -> [u32; N] {
        let p = self.codes.wrapping_add(at) as *const u32;
        let mut w = [0u32; N];
        // SAFETY (both): the caller's; the codes are 16-byte aligned rows.
        if N == 2 {
            let v = unsafe { ld_nc_v2(p) };
            w[0] = v[0];
            w[N - 1] = v[1];
        } else {
            w[0] = unsafe { ld_nc_u32(p) };
        }
        w
    }

    /// Group `group`'s (d, d times the sum of its codes) for tokens 2t and 2t + 1.
    ///
    /// # Safety
    /// `group` is below the row's `n_in / 32`.
    #[inline(always)]
    unsafe fn scales(&self, group: usize) -> [[f32; 2]; 2] {
        // SAFETY: the caller's; pairs of floats are 8-byte aligned.
        self.scales.map(|p| {
            let v = unsafe { ld_nc_v2(p.wrapping_add(2 * group) as *const u32) };
            [f32::from_bits(v[0]), f32::from_bits(v[1])]
        })
    }
}

impl Lane {
    /// Group `group`'s codes at bytes `4t` of each of its halves of 16 (the second operand
    /// of a 32-value block's two `mma`s), and its scales.
    ///
    /// # Safety
    /// As `scales`.
    #[inline(always)]
    unsafe fn group32(&self, group: usize) -> ([u32; 2], [[f32; 2]; 2]) {
        // SAFETY (both): the caller's.
        let half = |h: usize| unsafe { self.codes::<1>(32 * group + 16 * h + 4 * self.t) }[0];
        ([half(0), half(1)], unsafe { self.scales(group) })
    }
}

/// A type whose blocks `gemv_mma` multiplies: what a lane loads of a block of one row, and
/// the sums of a block of its rows.
pub trait MmaCodes: Blocks {
    /// A lane's bytes of one block of one row.
    type Part: Copy;

    /// Lane `t`'s part (`t = lane % 4`) of block `blk` of the row at `row`.
    ///
    /// # Safety
    /// `row` is a row of whole blocks in global memory, aligned as the type's blocks are;
    /// `blk` is below its blocks.
    unsafe fn load_part(row: *const u8, blk: usize, t: usize) -> Self::Part;

    /// `acc[m] +=` block `blk` of tile m's rows g and g + 8 (`parts[m][0]` and `[1]`) times
    /// the lane's tokens: `acc[m]` holds (row g, tokens 2t, 2t + 1) then (row g + 8, the
    /// same), as `mma_s8_16816` lays out its sums.
    ///
    /// # Safety
    /// `blk` is below the rows' blocks, and the lane's tokens have its groups.
    unsafe fn add_block<const M: usize>(
        acc: &mut [[f32; 4]; M],
        parts: &[[Self::Part; 2]; M],
        lane: &Lane,
        blk: usize,
    );
}

/// A lane's part of a Q4_K block: the block's head (`d`, `dmin`, the 12 bytes of 6-bit
/// scales and minima) and, of each of the four 32-byte runs of nibbles, bytes `8t .. 8t + 8`
/// (the low nibbles are sub-block 2j's weights, the high ones sub-block 2j + 1's).
#[derive(Clone, Copy)]
pub struct Q4Part {
    head: [u32; 4],
    q: [[u32; 2]; 4],
}

impl MmaCodes for Q4K {
    type Part = Q4Part;

    #[inline(always)]
    unsafe fn load_part(row: *const u8, blk: usize, t: usize) -> Q4Part {
        let block = row.wrapping_add(144 * blk);
        let at = |offset: usize| block.wrapping_add(offset) as *const u32;
        // SAFETY: blocks are 16-byte aligned; the head is bytes 0..16, the nibbles 16..144.
        unsafe {
            Q4Part {
                head: ld_nc_v4(at(0)),
                q: [0, 1, 2, 3].map(|j| ld_nc_v2(at(16 + 32 * j + 8 * t))),
            }
        }
    }

    #[inline(always)]
    unsafe fn add_block<const M: usize>(
        acc: &mut [[f32; 4]; M],
        parts: &[[Q4Part; 2]; M],
        lane: &Lane,
        blk: usize,
    ) {
        unroll!(sb < 8 => {
            // Sub-block sb: nibble sb % 2 of run sb / 2; its weights meet group 8 blk + sb.
            let (run, shift) = (sb / 2, 4 * (sb % 2) as u32);
            let group = 8 * blk + sb;
            // SAFETY: the caller's; the lane's 8 codes of the group match its 8 bytes.
            let (x, s) = unsafe { (lane.codes::<2>(32 * group + 8 * lane.t), lane.scales(group)) };
            unroll!(m < M => {
                let mut c = [0i32; 4];
                unroll!(h < 2 => {
                    let nibbles = |r: usize| (parts[m][r].q[run][h] >> shift) & 0x0f0f_0f0f;
                    mma_s8_16816(&mut c, [nibbles(0), nibbles(1)], x[h]);
                });
                unroll!(r < 2 => {
                    let head = &parts[m][r].head;
                    let (dw, dmin) = (f16_to_f32(head[0] as u16), f16_to_f32((head[0] >> 16) as u16));
                    let (sc, min) = scale_min(head, sb);
                    let (scale, min) = (dw * sc, dmin * min);
                    unroll!(k < 2 => {
                        // sum_i (scale q_i - min) (d x_i) = scale d sum_i q_i x_i - min (d sum_i x_i)
                        acc[m][2 * r + k] += scale * s[k][0] * c[2 * r + k] as f32 - min * s[k][1];
                    });
                });
            });
        });
    }
}

/// A lane's part of a Q6_K block (`ql[128], qh[64], scales: [i8; 16], d`; weight l of
/// sub-block b of half h is `ql` nibble b / 2 of byte 64h + 32 (b % 2) + l, with bits 2b of
/// `qh` byte 32h + l above it, less 32, times scale 8h + 2b + l / 16): of every run of 16
/// bytes of `ql` and `qh`, bytes `4t .. 4t + 4`; the 16 scales; `d`.
#[derive(Clone, Copy)]
pub struct Q6Part {
    /// `ql` bytes 16i + 4t.. for i < 8.
    ql: [u32; 8],
    /// `qh` bytes 16i + 4t.. for i < 4.
    qh: [u32; 4],
    scales: [u32; 4],
    d: f32,
}

/// The 4 bytes at `p`, which a 210-byte Q6_K block or a 34-byte Q8_0 block leaves 4-byte
/// aligned or 2 past it: one load, or two of 2 bytes. (Every row of a matrix whose width is a
/// multiple of 512, or of 64 for Q8_0, starts where the first did, so a warp's lanes take
/// the same branch.)
///
/// # Safety
/// `p` is 2-byte aligned, its 4 bytes in global memory that nothing writes in the kernel.
#[inline(always)]
unsafe fn word(p: *const u8) -> u32 {
    // SAFETY (both): the caller's.
    if (p as usize).is_multiple_of(4) {
        unsafe { ld_nc_u32(p as *const u32) }
    } else {
        let half = |at: usize| unsafe { ld_nc_u16(p.wrapping_add(at) as *const u16) } as u32;
        half(0) | half(2) << 16
    }
}

impl MmaCodes for Q6K {
    type Part = Q6Part;

    #[inline(always)]
    unsafe fn load_part(row: *const u8, blk: usize, t: usize) -> Q6Part {
        let block = row.wrapping_add(210 * blk);
        let at = |offset: usize| block.wrapping_add(offset);
        let (mut ql, mut qh, mut scales) = ([0u32; 8], [0u32; 4], [0u32; 4]);
        // SAFETY (all): every offset is even, its 4 bytes inside the block.
        unroll!(i < 8 => {
            ql[i] = unsafe { word(at(16 * i + 4 * t)) };
        });
        unroll!(i < 4 => {
            qh[i] = unsafe { word(at(128 + 16 * i + 4 * t)) };
            scales[i] = unsafe { word(at(192 + 4 * i)) };
        });
        let d = f16_to_f32(unsafe { ld_nc_u16(at(208) as *const u16) });
        Q6Part { ql, qh, scales, d }
    }

    #[inline(always)]
    unsafe fn add_block<const M: usize>(
        acc: &mut [[f32; 4]; M],
        parts: &[[Q6Part; 2]; M],
        lane: &Lane,
        blk: usize,
    ) {
        const ONES: [u32; 2] = [0x0101_0101; 2];
        unroll!(hb < 8 => {
            // Sub-block b of half h, weights 128h + 32b.. (group 8 blk + hb), in two pieces of
            // 16 (scales 2hb and 2hb + 1): ql run 4h + 2 (b % 2) + piece, qh run 2h + piece.
            let (h, b) = (hb / 4, hb % 4);
            let group = 8 * blk + hb;
            // SAFETY: the caller's.
            let s = unsafe { lane.scales(group) };
            let mut sums = [[0i32; 4]; M];
            unroll!(piece < 2 => {
                // SAFETY: the caller's; the lane's 4 codes match its 4 bytes of each run.
                let x = unsafe { lane.codes::<1>(32 * group + 16 * piece + 4 * lane.t) }[0];
                // The tokens' sums of these 16 codes, to take off 32 times them.
                let mut ones = [0i32; 4];
                mma_s8_16816(&mut ones, ONES, x);
                let scale = 2 * hb + piece;
                unroll!(m < M => {
                    let code = |r: usize| {
                        let p = &parts[m][r];
                        let low = (p.ql[4 * h + 2 * (b % 2) + piece] >> (4 * (b / 2))) & 0x0f0f_0f0f;
                        let high = (p.qh[2 * h + piece] >> (2 * b)) & 0x0303_0303;
                        low | high << 4
                    };
                    let mut c = [0i32; 4];
                    mma_s8_16816(&mut c, [code(0), code(1)], x);
                    unroll!(i < 4 => {
                        let sc = (parts[m][i / 2].scales[scale / 4] >> (8 * (scale % 4))) as u8 as i8;
                        sums[m][i] += sc as i32 * (c[i] - 32 * ones[i]);
                    });
                });
            });
            unroll!(m < M => {
                unroll!(i < 4 => {
                    acc[m][i] += parts[m][i / 2].d * s[i % 2][0] * sums[m][i] as f32;
                });
            });
        });
    }
}

/// A lane's part of a Q4_1 block (`d`, `m`, then 16 bytes whose low nibbles are weights
/// 0..16 and high nibbles 16..32; weight = d q + m): the head and the word at byte 4 + 4t,
/// whose low nibbles are weights 4t.. of the first 16 and high ones the same of the second.
#[derive(Clone, Copy)]
pub struct Q41Part {
    head: u32,
    q: u32,
}

impl MmaCodes for Q4_1 {
    type Part = Q41Part;

    #[inline(always)]
    unsafe fn load_part(row: *const u8, blk: usize, t: usize) -> Q41Part {
        let block = row.wrapping_add(20 * blk) as *const u32;
        // SAFETY: 20-byte blocks are 4-byte aligned; words 0 and 1 + t are inside the block.
        unsafe {
            Q41Part {
                head: ld_nc_u32(block),
                q: ld_nc_u32(block.wrapping_add(1 + t)),
            }
        }
    }

    #[inline(always)]
    unsafe fn add_block<const M: usize>(
        acc: &mut [[f32; 4]; M],
        parts: &[[Q41Part; 2]; M],
        lane: &Lane,
        blk: usize,
    ) {
        // SAFETY: the caller's; the lane's codes match its nibbles in each half.
        let (x, s) = unsafe { lane.group32(blk) };
        unroll!(m < M => {
            let mut c = [0i32; 4];
            unroll!(h < 2 => {
                let nibbles = |r: usize| (parts[m][r].q >> (4 * h as u32)) & 0x0f0f_0f0f;
                mma_s8_16816(&mut c, [nibbles(0), nibbles(1)], x[h]);
            });
            unroll!(r < 2 => {
                let head = parts[m][r].head;
                let (d, min) = (f16_to_f32(head as u16), f16_to_f32((head >> 16) as u16));
                unroll!(k < 2 => {
                    // sum_i (d q_i + min) (dx x_i) = d dx sum_i q_i x_i + min (dx sum_i x_i)
                    acc[m][2 * r + k] += d * s[k][0] * c[2 * r + k] as f32 + min * s[k][1];
                });
            });
        });
    }
}

/// A lane's part of a Q8_0 block (`d`, then 32 signed bytes; weight = d q): `d` and the words
/// at bytes 2 + 4t and 18 + 4t, weights 4t.. of each half. A 34-byte block starts 4-byte
/// aligned or 2 past it.
#[derive(Clone, Copy)]
pub struct Q80Part {
    q: [u32; 2],
    d: f32,
}

impl MmaCodes for Q8_0 {
    type Part = Q80Part;

    #[inline(always)]
    unsafe fn load_part(row: *const u8, blk: usize, t: usize) -> Q80Part {
        let block = row.wrapping_add(34 * blk);
        // SAFETY (all): even offsets, their bytes inside the block.
        let q = [0, 1].map(|h| unsafe { word(block.wrapping_add(2 + 16 * h + 4 * t)) });
        let d = f16_to_f32(unsafe { ld_nc_u16(block as *const u16) });
        Q80Part { q, d }
    }

    #[inline(always)]
    unsafe fn add_block<const M: usize>(
        acc: &mut [[f32; 4]; M],
        parts: &[[Q80Part; 2]; M],
        lane: &Lane,
        blk: usize,
    ) {
        // SAFETY: the caller's; the lane's codes match its weights in each half.
        let (x, s) = unsafe { lane.group32(blk) };
        unroll!(m < M => {
            let mut c = [0i32; 4];
            unroll!(h < 2 => {
                mma_s8_16816(&mut c, [parts[m][0].q[h], parts[m][1].q[h]], x[h]);
            });
            unroll!(i < 4 => {
                acc[m][i] += parts[m][i / 2].d * s[i % 2][0] * c[i] as f32;
            });
        });
    }
}

/// Lane `t`'s parts of block `blk` of every tile's rows g and g + 8 (`rows[m]`).
///
/// # Safety
/// As `MmaCodes::load_part`, for every row.
#[inline(always)]
unsafe fn load_parts<B: MmaCodes, const M: usize>(
    rows: &[[*const u8; 2]; M],
    blk: usize,
    t: usize,
) -> [[B::Part; 2]; M] {
    let mut parts = [[MaybeUninit::<B::Part>::uninit(); 2]; M];
    unroll!(m < M => {
        unroll!(r < 2 => {
            // SAFETY: the caller's.
            parts[m][r].write(unsafe { B::load_part(rows[m][r], blk, t) });
        });
    });
    // SAFETY: every part was written just above.
    parts.map(|pair| pair.map(|part| unsafe { part.assume_init() }))
}

/// `out[t, o] = (accumulate ? out[t, o] : 0) + sum_i w[o, i] x[t, i] + bias[o]` for tokens
/// `t < n_tokens`, x as `quantize_q8_f32` left it; with `M` = 2, the MLP's first half
/// instead: `out[t, o] = silu(g) * u`, `g` and `u` row o of `w` (the gate) and of `w_up`
/// times the token (no bias; `accumulate` unread).
///
/// - `out`: `[n_tokens, out_stride]` f32, this matrix's rows at columns `0..n_out`
/// - `codes`: `[n_tokens, n_in]` i8; `scales`: `[n_tokens, n_in / 32][2]` f32
/// - `w` (and `w_up`): `[n_out, n_in / 256]` blocks, as the file has them
/// - `bias`: null or `[n_out]`
///
/// Thread mapping: a block of `MMA_GEMV_WARPS` warps for every `MMA_GEMV_ROWS` (16) rows;
/// warp w takes the rows' blocks w, w + warps, ... and multiplies each by the 8 tokens in
/// `mma`s (`MmaCodes::add_block`); the warps' sums meet in shared memory, added in warp
/// order (the same sums every run), and the first threads each finish one (row, token).
///
/// # Safety
/// `n_in` is whole blocks; the rows start where the type's blocks may; `codes` and `scales`
/// 16-byte aligned; `1 <= n_tokens <= QUANT_MAX_TOKENS`; `blockDim.x == 32 *
/// MMA_GEMV_WARPS`; the launch gives `mma_gemv_shared_bytes(M)` bytes of dynamic shared
/// memory and `n_out.div_ceil(MMA_GEMV_ROWS)` blocks; `out` overlaps no input.
#[inline(always)]
pub(crate) unsafe fn gemv_mma<B: MmaCodes, const M: usize>(
    out: *mut f32,
    input: CodesIn,
    shape: MatmulShape,
) {
    let CodesIn {
        codes,
        scales,
        w,
        w_up,
        bias,
    } = input;
    let [n_tokens, n_in, n_out, out_stride] = shape.sizes();
    let accumulate = shape.accumulates();
    const R: usize = MMA_GEMV_ROWS;
    const T: usize = QUANT_MAX_TOKENS;
    let (warp, lane) = (thread_idx_x() / WARP, thread_idx_x() % WARP);
    let (g, t) = (lane / 4, lane % 4);
    let first = block_idx_x() * R;
    let row_bytes = n_in / B::BLOCK_LEN * B::BLOCK_BYTES;
    // Rows g and g + 8 of each tile; rows past the matrix read its last row and write nothing.
    let mut rows = [[w; 2]; M];
    unroll!(m < M => {
        let matrix = if m == 1 { w_up } else { w };
        unroll!(r < 2 => {
            rows[m][r] = matrix.wrapping_add((first + g + 8 * r).min(n_out - 1) * row_bytes);
        });
    });
    let token = |i: usize| i.min(n_tokens - 1);
    let groups = n_in / 32;
    let lane = Lane {
        codes: codes.wrapping_add(token(g) * n_in),
        scales: [0, 1].map(|k| scales.wrapping_add(2 * groups * token(2 * t + k))),
        t,
    };
    wait_for_previous_kernel();
    let mut acc = [[0.0f32; 4]; M];
    let (blocks, mut blk) = (n_in / B::BLOCK_LEN, warp);
    while blk < blocks {
        // SAFETY: blk is a block of rows inside the matrices; the tokens hold its groups.
        unsafe {
            let parts = load_parts::<B, M>(&rows, blk, t);
            B::add_block(&mut acc, &parts, &lane, blk);
        }
        blk += MMA_GEMV_WARPS;
    }
    // [warps][M][R][T] f32: each warp's sums.
    let partial = dynamic_shared::<f32>();
    let at = |warp: usize, m: usize, row: usize, t: usize| ((warp * M + m) * R + row) * T + t;
    unroll!(m < M => {
        unroll!(i < 4 => {
            // SAFETY: inside the launch's shared memory (the preconditions).
            unsafe { *partial.add(at(warp, m, g + 8 * (i / 2), 2 * t + i % 2)) = acc[m][i] };
        });
    });
    // SAFETY: every thread of the block reaches this barrier.
    unsafe { sync_threads() };
    let i = thread_idx_x();
    let (row, t) = (i / T, i % T);
    let o = first + row;
    if i >= R * T || t >= n_tokens || o >= n_out {
        return;
    }
    // The sum of the warps' sums of tile m's row for token t, in warp order.
    let total = |m: usize| {
        let mut sum = 0.0;
        for warp in 0..MMA_GEMV_WARPS {
            // SAFETY: written above, before the barrier.
            sum += unsafe { *partial.add(at(warp, m, row, t)) };
        }
        sum
    };
    // SAFETY: o < n_out and t < n_tokens: inside out (and bias).
    unsafe {
        if M == 2 {
            let (g, u) = (total(0), total(M - 1));
            *out.add(t * out_stride + o) = g / (1.0 + exp(-g)) * u;
        } else {
            store_output(out.add(t * out_stride + o), total(0), bias, o, accumulate);
        }
    }
}

/// `gemv_mma_<type>` and `gemv_swiglu_mma_<type>`: `gemv_mma` over the type, one tile of rows
/// and two (the gate's and up's).
macro_rules! mma_kernels {
    ($($ty:ident => $gemv:ident, $swiglu:ident;)*) => {$(
        #[doc = concat!("`gemv_mma` over `", stringify!($ty), "` weights.")]
        ///
        /// # Safety
        /// The host's launch wrapper checks `gemv_mma`'s preconditions.
        #[unsafe(no_mangle)]
        pub unsafe extern "gpu-kernel" fn $gemv(
            out: *mut f32,
            codes: *const u8,
            scales: *const f32,
            w: *const u8,
            bias: *const f32,
            shape: MatmulShape,
        ) {
            let w_up = core::ptr::null();
            let input = CodesIn { codes, scales, w, w_up, bias };
            // SAFETY: the wrapper's checks.
            unsafe { gemv_mma::<$ty, 1>(out, input, shape) }
        }

        #[doc = concat!("`gemv_mma` with the SwiGLU over `", stringify!($ty), "` weights.")]
        ///
        /// # Safety
        /// The host's launch wrapper checks `gemv_mma`'s preconditions.
        #[unsafe(no_mangle)]
        pub unsafe extern "gpu-kernel" fn $swiglu(
            out: *mut f32,
            codes: *const u8,
            scales: *const f32,
            w_gate: *const u8,
            w_up: *const u8,
            shape: MatmulShape,
        ) {
            let (w, bias) = (w_gate, core::ptr::null());
            let input = CodesIn { codes, scales, w, w_up, bias };
            // SAFETY: the wrapper's checks.
            unsafe { gemv_mma::<$ty, 2>(out, input, shape) }
        }
    )*};
}

mma_kernels! {
    Q4_1 => gemv_mma_q4_1, gemv_swiglu_mma_q4_1;
    Q8_0 => gemv_mma_q8_0, gemv_swiglu_mma_q8_0;
    Q4K => gemv_mma_q4_k, gemv_swiglu_mma_q4_k;
    Q6K => gemv_mma_q6_k, gemv_swiglu_mma_q6_k;
}
