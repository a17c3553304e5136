//! A lane's part of a group of 32 weights: weights `8c .. 8c + 8` of one row's group, what
//! one lane of an `mma` holds of a row in a 32-wide step (`gemm_blocks.rs` renumbers the
//! reduction so that a lane's eight are consecutive). `quant_blocks.rs`'s `Blocks::load`
//! brings a whole group into one lane from global memory; here four lanes share a group,
//! each reading only the bytes of its own eight weights, from the stage of shared memory
//! the block copied the blocks into.
//!
//! The part is picked at run time (`c` is the lane's number), so it picks bytes by address
//! and nibbles by shift amount, never by an index into a register array (which would send
//! the array to local memory: see `quant_blocks.rs`).
//!
//! The 32-weight types but Q8_0 decode as their `Blocks::decode8` does (the dequantizer's
//! floats, bit for bit), then round to bf16. The k-quants, the types of the files people run
//! most, and Q8_0 make the bf16 pairs directly: each value placed under the exponent of 128 becomes the bf16
//! `128 + q` with two integer instructions a pair, and two `fma.rn.bf16x2` take it to `(q -
//! 128 + 128) * scale - min`, rounded once, where the float path spent about five
//! instructions a weight and the GEMM was bound by them (on the H200:
//! docs/lessons.md#batched-decode-and-the-gemm). The
//! scale and min are rounded to bf16 first: a weight can differ from the dequantizer's by
//! one bf16 step; the CPU twin computes the same rounding.

use core::arch::asm;

use crate::device::{and_or, f16_to_f32, fma, fma_bf16x2, pack_bf16x2, prmt};
use crate::mma::ld_shared_v4;
use crate::quant_blocks::{
    Blocks, Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q5K, Q6K, Q8_0, eight, scale_min, small,
};
use crate::unroll::unroll;

/// Where a row's bytes are read from: a stage of shared memory (`gemm_blocks.rs` copies the
/// blocks there, each byte at the same address mod 16 as in global memory, so every load
/// keeps its alignment).
#[derive(Clone, Copy)]
pub struct Shared(pub u32);

impl Shared {
    /// The u16 at byte `at`.
    ///
    /// # Safety
    /// `self.0 + at` is a 2-byte aligned shared address inside what the block wrote.
    #[inline(always)]
    pub(crate) unsafe fn u16(self, at: usize) -> u32 {
        let v: u32;
        // SAFETY: the caller's guarantee.
        unsafe {
            asm!("ld.shared.u16 {v}, [{a}];", v = out(reg32) v, a = in(reg32) self.0 + at as u32,
                options(readonly, nostack, pure))
        };
        v
    }

    /// The u32 at byte `at` (4-byte aligned).
    ///
    /// # Safety
    /// As `u16`, 4-byte aligned.
    #[inline(always)]
    pub(crate) unsafe fn u32(self, at: usize) -> u32 {
        let v: u32;
        // SAFETY: the caller's guarantee.
        unsafe {
            asm!("ld.shared.u32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) self.0 + at as u32,
                options(readonly, nostack, pure))
        };
        v
    }

    /// Two words from four u16s at byte `at` (2-byte aligned).
    ///
    /// # Safety
    /// As `u16`, for 8 bytes.
    #[inline(always)]
    unsafe fn words_16(self, at: usize) -> [u32; 2] {
        // SAFETY: the caller's guarantee.
        unsafe {
            [
                self.u16(at) | self.u16(at + 2) << 16,
                self.u16(at + 4) | self.u16(at + 6) << 16,
            ]
        }
    }

    /// Bytes `at`, `at + 1`, `at + 8`, `at + 9`, then the same 16 on, as two words: a lane's
    /// four pairs of 32 consecutive bytes in the tensor cores' order (`K16Parts`).
    ///
    /// # Safety
    /// As `u16`, for the 26 bytes from `at` (2-byte aligned).
    #[inline(always)]
    unsafe fn k16_words(self, at: usize) -> [u32; 2] {
        // SAFETY: the caller's guarantee.
        unsafe { [self.k16_word(at), self.k16_word(at + 16)] }
    }

    /// Bytes `at`, `at + 1`, `at + 8`, `at + 9` as a word: `k16_words`'s first.
    ///
    /// # Safety
    /// As `u16`, for the 10 bytes from `at` (2-byte aligned).
    #[inline(always)]
    unsafe fn k16_word(self, at: usize) -> u32 {
        // SAFETY: the caller's guarantee.
        unsafe { self.u16(at) | self.u16(at + 8) << 16 }
    }

    /// Two words at byte `at` (4-byte aligned).
    ///
    /// # Safety
    /// As `u32`, for 8 bytes.
    #[inline(always)]
    unsafe fn words_32(self, at: usize) -> [u32; 2] {
        // SAFETY: the caller's guarantee.
        unsafe { [self.u32(at), self.u32(at + 4)] }
    }
}

/// A type whose groups split into four parts of eight weights.
pub trait Parts: Blocks {
    /// A part's bytes, loaded into registers.
    type Part: Copy;

    /// Loads part `c` (0..4) of group `g` of the row (or run of a row's blocks) that starts
    /// at `row`.
    ///
    /// # Safety
    /// `row` starts a run of whole blocks in shared memory, at an address the type's blocks
    /// allow (as `Blocks::load`), that holds group `g`; `c < 4`.
    unsafe fn load_part(row: Shared, g: usize, c: usize) -> Self::Part;

    /// The part's eight weights rounded to bf16 for the `mma`, four pairs in order.
    fn decode_bf16(p: &Self::Part) -> [u32; 4];
}

/// Eight floats rounded to bf16, four pairs in order: the 32-weight types decode in f32 (as
/// their `Blocks::decode8`), then round.
#[inline(always)]
fn pack8(v: [f32; 8]) -> [u32; 4] {
    [
        pack_bf16x2(v[0], v[1]),
        pack_bf16x2(v[2], v[3]),
        pack_bf16x2(v[4], v[5]),
        pack_bf16x2(v[6], v[7]),
    ]
}

/// bf16 pairs: (1, 1), (-128, -128), (-160, -160) and (-0, -0).
const ONE2: u32 = 0x3f80_3f80;
const MINUS_128_2: u32 = 0xc300_c300;
const MINUS_160_2: u32 = 0xc320_c320;
const MINUS_ZERO2: u32 = 0x8000_8000;

/// Bytes `2k` and `2k + 1` (`k` a constant) of the eight in `w`, each in the low byte of a
/// 16-bit half.
#[inline(always)]
fn byte_pair(w: &[u32; 2], k: usize) -> u32 {
    // Selector 0x4140: bytes 0 and 1 of the word, each over a zero byte (byte 4, of 0).
    prmt(w[k / 2], 0, 0x4140 + 0x0202 * (k % 2) as u32)
}

/// bf16 `128 + q` of both halves' `q` (below 128): `q` placed under the exponent of 128,
/// whose last mantissa bit is worth 1.
#[inline(always)]
fn plus_128(q: u32) -> u32 {
    q | 0x4300_4300
}

/// Four bf16 pairs `q * scale + offset` (each rounded once), the eight `q` below 128 given
/// as `q_pair(k)` = bf16 pairs of `128 + q` for values 2k, 2k + 1, made exact small
/// integers less `minus` first (`minus` -128, or -160 for Q6_K's `q - 32`). Pairs 0 and 1
/// take `scale[0]`, pairs 2 and 3 `scale[1]` (the same but where Q6_K's weights in the
/// tensor cores' order span two of its 16-weight scales).
#[inline(always)]
fn scale_pairs(
    q_pair: impl Fn(usize) -> u32,
    minus: u32,
    scale: [u32; 2],
    offset: u32,
) -> [u32; 4] {
    let mut out = [0u32; 4];
    unroll!(k < 4 => {
        out[k] = fma_bf16x2(fma_bf16x2(q_pair(k), ONE2, minus), scale[k / 2], offset);
    });
    out
}

/// Byte `i` (a constant) of eight bytes held as two words.
#[inline(always)]
fn byte(q: &[u32; 2], i: usize) -> u32 {
    (q[i / 4] >> (8 * (i % 4)) as u32) & 0xff
}

/// Eight nibbles of a 32-weight block (Q4_0 .. Q5_1): weights `8c ..` are the low nibbles of
/// bytes `8c ..` for `c < 2`, the high nibbles of bytes `8 (c - 2) ..` after.
#[derive(Clone, Copy)]
pub struct NibblePart {
    /// The block's first word: `d` (and `m` above it for Q4_1, Q5_1).
    head: u32,
    q: [u32; 2],
    /// 0 or 4: which nibble.
    shift: u32,
    /// The fifth bits of the eight weights, bit i for weight i (Q5_0, Q5_1).
    fifth: u32,
}

impl NibblePart {
    /// Nibble `i` (a constant) with its fifth bit.
    #[inline(always)]
    fn value(&self, i: usize) -> u32 {
        (byte(&self.q, i) >> self.shift) & 0xf | ((self.fifth >> i as u32) & 1) << 4
    }

    fn d(&self) -> f32 {
        f16_to_f32(self.head as u16)
    }

    fn m(&self) -> f32 {
        f16_to_f32((self.head >> 16) as u16)
    }
}

impl Parts for Q4_0 {
    type Part = NibblePart;

    #[inline(always)]
    unsafe fn load_part(row: Shared, g: usize, c: usize) -> NibblePart {
        let block = 18 * g;
        // SAFETY: the 18-byte block at an even offset: d, then 16 bytes of nibbles.
        unsafe {
            NibblePart {
                head: row.u16(block),
                q: row.words_16(block + 2 + 8 * (c % 2)),
                shift: 4 * (c / 2) as u32,
                fifth: 0,
            }
        }
    }

    #[inline(always)]
    fn decode_bf16(p: &NibblePart) -> [u32; 4] {
        let d = p.d();
        pack8(eight(|i| d * small(p.value(i), 8.0)))
    }
}

impl Parts for Q4_1 {
    type Part = NibblePart;

    #[inline(always)]
    unsafe fn load_part(row: Shared, g: usize, c: usize) -> NibblePart {
        let block = 20 * g;
        // SAFETY: the 20-byte block at a 4-byte aligned offset: d and m, 16 bytes of nibbles.
        unsafe {
            NibblePart {
                head: row.u32(block),
                q: row.words_32(block + 4 + 8 * (c % 2)),
                shift: 4 * (c / 2) as u32,
                fifth: 0,
            }
        }
    }

    #[inline(always)]
    fn decode_bf16(p: &NibblePart) -> [u32; 4] {
        let (d, m) = (p.d(), p.m());
        pack8(eight(|i| fma(d, small(p.value(i), 0.0), m)))
    }
}

impl Parts for Q5_0 {
    type Part = NibblePart;

    #[inline(always)]
    unsafe fn load_part(row: Shared, g: usize, c: usize) -> NibblePart {
        let block = 22 * g;
        // SAFETY: the 22-byte block at an even offset: d, 4 bytes of fifth bits, nibbles.
        unsafe {
            NibblePart {
                head: row.u16(block),
                q: row.words_16(block + 6 + 8 * (c % 2)),
                shift: 4 * (c / 2) as u32,
                fifth: (row.u16(block + 2) | row.u16(block + 4) << 16) >> (8 * c) as u32,
            }
        }
    }

    #[inline(always)]
    fn decode_bf16(p: &NibblePart) -> [u32; 4] {
        let d = p.d();
        pack8(eight(|i| d * small(p.value(i), 16.0)))
    }
}

impl Parts for Q5_1 {
    type Part = NibblePart;

    #[inline(always)]
    unsafe fn load_part(row: Shared, g: usize, c: usize) -> NibblePart {
        let block = 24 * g;
        // SAFETY: the 24-byte block at a 4-byte aligned offset: d and m, fifth bits, nibbles.
        unsafe {
            NibblePart {
                head: row.u32(block),
                q: row.words_32(block + 8 + 8 * (c % 2)),
                shift: 4 * (c / 2) as u32,
                fifth: row.u32(block + 4) >> (8 * c) as u32,
            }
        }
    }

    #[inline(always)]
    fn decode_bf16(p: &NibblePart) -> [u32; 4] {
        let (d, m) = (p.d(), p.m());
        pack8(eight(|i| fma(d, small(p.value(i), 0.0), m)))
    }
}

/// A 32-weight block's nibbles in the tensor cores' order (`K16Parts`): bytes `2c, 2c + 1,
/// 2c + 8, 2c + 9` (`word`) hold the lane's first four weights in their low nibbles and its
/// last four (16 on) in their high ones, so the part's eight bytes are the word and the word
/// shifted by a nibble, and its shift 0.
#[inline(always)]
fn k16_nibbles(word: u32) -> [u32; 2] {
    [word, word >> 4]
}

/// The fifth bits of a lane's eight weights in the tensor cores' order, bit i for weight i:
/// bits `2c, 2c + 1, 2c + 8, 2c + 9` of the block's `qh`, then the same 16 on.
#[inline(always)]
fn k16_fifth(qh: u32, c: usize) -> u32 {
    let h = qh >> (2 * c) as u32;
    h & 0x3 | (h >> 6) & 0xc | (h >> 12) & 0x30 | (h >> 18) & 0xc0
}

/// Eight signed bytes of a Q8_0 block and its `d`.
#[derive(Clone, Copy)]
pub struct BytePart {
    d: u32,
    q: [u32; 2],
}

impl Parts for Q8_0 {
    type Part = BytePart;

    #[inline(always)]
    unsafe fn load_part(row: Shared, g: usize, c: usize) -> BytePart {
        let block = 34 * g;
        // SAFETY: the 34-byte block at an even offset: d, then 32 bytes.
        unsafe {
            BytePart {
                d: row.u16(block),
                q: row.words_16(block + 2 + 8 * c),
            }
        }
    }

    #[inline(always)]
    fn decode_bf16(p: &BytePart) -> [u32; 4] {
        // A signed byte q's low seven bits v placed under the exponent of 128 make the bf16
        // 128 + v, exactly; its sign bit, placed in the lowest exponent bit of the bf16 -128,
        // makes -256 where q is negative. Their sum is q (v, or v - 128), and one rounding
        // of q times the scale rounded to bf16 (the k-quants' way) is the weight: five
        // instructions a pair, where the float path took about eight.
        let d = f16_to_f32(p.d as u16);
        let scale = pack_bf16x2(d, d);
        let mut out = [0u32; 4];
        unroll!(k < 4 => {
            let pair = byte_pair(&p.q, k);
            let low = and_or(pair, 0x007f_007f, 0x4300_4300);
            let minus = and_or(pair, 0x0080_0080, MINUS_128_2);
            out[k] = fma_bf16x2(fma_bf16x2(low, ONE2, minus), scale, MINUS_ZERO2);
        });
        out
    }
}

/// A type whose lanes can take their `mma` elements in the reduction's own order: lane `c`
/// holds weights `2c, 2c + 1, 2c + 8, 2c + 9` of each 16 (the tensor cores' layout), not
/// eight consecutive ones. `gemm_wgmma_<type>` needs it: its activations reach the tensor
/// cores from shared memory in their order, with no renumbering.
pub trait K16Parts: Parts {
    /// Part `c` (0..4) of group `g` in the reduction's order: weights `2c, 2c + 1, 2c + 8,
    /// 2c + 9` of the group's first 16, then the same of its second; `decode_bf16` of it
    /// gives their bf16 pairs in that order.
    ///
    /// # Safety
    /// As `Parts::load_part`.
    unsafe fn load_k16(row: Shared, g: usize, c: usize) -> Self::Part;
}

impl K16Parts for Q8_0 {
    #[inline(always)]
    unsafe fn load_k16(row: Shared, g: usize, c: usize) -> BytePart {
        // SAFETY: the 34-byte block at an even offset: d, then 32 bytes, of which these
        // are four pairs.
        unsafe {
            BytePart {
                d: row.u16(34 * g),
                q: row.k16_words(34 * g + 2 + 2 * c),
            }
        }
    }
}

/// Eight weights of a Q4_K or Q5_K sub-block: the block's 16-byte head (`d`, `dmin`,
/// scales), eight bytes of nibbles and (Q5_K) of fifth bits, and the sub-block's number.
#[derive(Clone, Copy)]
pub struct KPart {
    head: [u32; 4],
    q: [u32; 2],
    qh: [u32; 2],
    s: usize,
}

impl KPart {
    /// The sub-block's `d * scale` and `dmin * min`.
    #[inline(always)]
    fn scale_min(&self) -> (f32, f32) {
        let (d, dmin) = (
            f16_to_f32(self.head[0] as u16),
            f16_to_f32((self.head[0] >> 16) as u16),
        );
        let (sc, m) = scale_min(&self.head, self.s);
        (d * sc, dmin * m)
    }

    /// `d * scale * q - dmin * min` of the eight in bf16 pairs: the scale and min rounded to bf16, then each `q * scale -
    /// min` rounded once (`fma.rn.bf16x2`): two instructions a pair where the floats took
    /// about five a weight. `q_pair(k)` gives values 2k, 2k + 1 as bf16 `128 + q`.
    #[inline(always)]
    fn decode_bf16(&self, q_pair: impl Fn(usize) -> u32) -> [u32; 4] {
        let (scale, min) = self.scale_min();
        let scale = pack_bf16x2(scale, scale);
        scale_pairs(q_pair, MINUS_128_2, [scale; 2], pack_bf16x2(-min, -min))
    }
}

/// Loads part `c` of sub-block `g % 8` of a Q4_K or Q5_K block of `block_bytes`: nibbles at
/// `q_at`, fifth bits at `qh_at` when `HIGH`; weights `8c ..` of the sub-block, or with `K16`
/// its weights in the tensor cores' order (`K16Parts::load_k16`).
///
/// # Safety
/// As `Blocks::load` (16-byte aligned blocks).
#[inline(always)]
unsafe fn load_k<const HIGH: bool, const K16: bool>(
    row: Shared,
    g: usize,
    c: usize,
    block_bytes: usize,
    qh_at: usize,
    q_at: usize,
) -> KPart {
    let (block, s) = (g / 8 * block_bytes, g % 8);
    // Eight bytes of a 32-byte run from its start `at`.
    // SAFETY (both): inside the block; 8-byte runs at multiples of 8, or pairs at even bytes.
    let bytes = |at: usize| unsafe {
        match K16 {
            true => row.k16_words(at + 2 * c),
            false => row.words_32(at + 8 * c),
        }
    };
    KPart {
        // SAFETY: the head at the block's aligned start.
        head: unsafe { ld_shared_v4(row.0 + block as u32) },
        q: bytes(block + q_at + 32 * (s / 2)),
        qh: if HIGH { bytes(block + qh_at) } else { [0; 2] },
        s,
    }
}

impl Parts for Q4K {
    type Part = KPart;

    #[inline(always)]
    unsafe fn load_part(row: Shared, g: usize, c: usize) -> KPart {
        // SAFETY: the caller's guarantee; nibbles at byte 16.
        unsafe { load_k::<false, false>(row, g, c, 144, 0, 16) }
    }

    #[inline(always)]
    fn decode_bf16(p: &KPart) -> [u32; 4] {
        let shift = 4 * (p.s % 2) as u32;
        let q = [p.q[0] >> shift, p.q[1] >> shift];
        p.decode_bf16(|k| plus_128(byte_pair(&q, k) & 0x000f_000f))
    }
}

impl Parts for Q5K {
    type Part = KPart;

    #[inline(always)]
    unsafe fn load_part(row: Shared, g: usize, c: usize) -> KPart {
        // SAFETY: the caller's guarantee; fifth bits at byte 16, nibbles at 48.
        unsafe { load_k::<true, false>(row, g, c, 176, 16, 48) }
    }

    #[inline(always)]
    fn decode_bf16(p: &KPart) -> [u32; 4] {
        let shift = 4 * (p.s % 2) as u32;
        let (q, qh) = (
            [p.q[0] >> shift, p.q[1] >> shift],
            [p.qh[0] >> p.s as u32, p.qh[1] >> p.s as u32],
        );
        p.decode_bf16(|k| {
            plus_128(byte_pair(&q, k) & 0x000f_000f | (byte_pair(&qh, k) & 0x0001_0001) << 4)
        })
    }
}

/// Eight weights of a Q6_K sub-block (see `quant_blocks::Q6Group`): their ql and qh bytes,
/// the i8 scales of their pairs 0-1 and 2-3 (one scale for eight consecutive weights; in
/// the tensor cores' order, the first four are of the sub-block's first 16 and the last
/// four of its second), `d`, and the sub-block's number within its half.
#[derive(Clone, Copy)]
pub struct Q6Part {
    ql: [u32; 2],
    qh: [u32; 2],
    scales: [i8; 2],
    d: u32,
    m: usize,
}

/// Loads part `c` of sub-block `g % 8` of a Q6_K block: weights `8c ..` of the sub-block
/// (one of its two scales), or with `K16` its weights in the tensor cores' order (the first
/// four of its first 16 and the first scale, the last four of its second).
///
/// # Safety
/// As `Parts::load_part` (2-byte aligned blocks).
#[inline(always)]
unsafe fn load_q6<const K16: bool>(row: Shared, g: usize, c: usize) -> Q6Part {
    let block = g / 8 * 210;
    let (half, m) = ((g % 8) / 4, g % 4);
    // Eight bytes of a 32-byte run from its start `at`.
    // SAFETY (both): every offset is even and inside the 210-byte block.
    let bytes = |at: usize| unsafe {
        match K16 {
            true => row.k16_words(at + 2 * c),
            false => row.words_16(at + 8 * c),
        }
    };
    // SAFETY: as above.
    let (scales, d) = unsafe {
        (
            row.u16(block + 192 + 8 * half + 2 * m),
            row.u16(block + 208),
        )
    };
    let scale = |k: usize| (scales >> (8 * k) as u32) as u8 as i8;
    Q6Part {
        ql: bytes(block + 64 * half + 32 * (m % 2)),
        qh: bytes(block + 128 + 32 * half),
        scales: match K16 {
            true => [scale(0), scale(1)],
            false => [scale(c / 2); 2],
        },
        d,
        m,
    }
}

impl Parts for Q6K {
    type Part = Q6Part;

    #[inline(always)]
    unsafe fn load_part(row: Shared, g: usize, c: usize) -> Q6Part {
        // SAFETY: the caller's guarantee.
        unsafe { load_q6::<false>(row, g, c) }
    }

    /// `(q - 32) * scale` in bf16 pairs, the scale rounded to bf16 first.
    #[inline(always)]
    fn decode_bf16(p: &Q6Part) -> [u32; 4] {
        let d = f16_to_f32(p.d as u16);
        let scale = p.scales.map(|s| {
            let scale = s as f32 * d;
            pack_bf16x2(scale, scale)
        });
        let (shift_l, shift_h) = (4 * (p.m / 2) as u32, 2 * p.m as u32);
        let (ql, qh) = (
            [p.ql[0] >> shift_l, p.ql[1] >> shift_l],
            [p.qh[0] >> shift_h, p.qh[1] >> shift_h],
        );
        scale_pairs(
            |k| plus_128(byte_pair(&ql, k) & 0x000f_000f | (byte_pair(&qh, k) & 0x0003_0003) << 4),
            MINUS_160_2,
            scale,
            MINUS_ZERO2,
        )
    }
}

impl K16Parts for Q4K {
    #[inline(always)]
    unsafe fn load_k16(row: Shared, g: usize, c: usize) -> KPart {
        // SAFETY: as `load_part`.
        unsafe { load_k::<false, true>(row, g, c, 144, 0, 16) }
    }
}

impl K16Parts for Q5K {
    #[inline(always)]
    unsafe fn load_k16(row: Shared, g: usize, c: usize) -> KPart {
        // SAFETY: as `load_part`.
        unsafe { load_k::<true, true>(row, g, c, 176, 16, 48) }
    }
}

impl K16Parts for Q6K {
    #[inline(always)]
    unsafe fn load_k16(row: Shared, g: usize, c: usize) -> Q6Part {
        // SAFETY: as `load_part`.
        unsafe { load_q6::<true>(row, g, c) }
    }
}

/// Part `c` of a 32-weight block in the tensor cores' order (`K16Parts`): its `head` (d, or
/// d and m), its nibbles from byte `nibbles` of the stage, its fifth bits `qh` (0 for the
/// four-bit types).
///
/// # Safety
/// As `Shared::u16`, for the 16 bytes from `nibbles` (2-byte aligned).
#[inline(always)]
unsafe fn nibble_k16(row: Shared, head: u32, nibbles: usize, qh: u32, c: usize) -> NibblePart {
    NibblePart {
        head,
        // SAFETY: the caller's guarantee.
        q: k16_nibbles(unsafe { row.k16_word(nibbles + 2 * c) }),
        shift: 0,
        fifth: k16_fifth(qh, c),
    }
}

impl K16Parts for Q4_0 {
    #[inline(always)]
    unsafe fn load_k16(row: Shared, g: usize, c: usize) -> NibblePart {
        let block = 18 * g;
        // SAFETY: as `load_part`.
        unsafe { nibble_k16(row, row.u16(block), block + 2, 0, c) }
    }
}

impl K16Parts for Q4_1 {
    #[inline(always)]
    unsafe fn load_k16(row: Shared, g: usize, c: usize) -> NibblePart {
        let block = 20 * g;
        // SAFETY: as `load_part`.
        unsafe { nibble_k16(row, row.u32(block), block + 4, 0, c) }
    }
}

impl K16Parts for Q5_0 {
    #[inline(always)]
    unsafe fn load_k16(row: Shared, g: usize, c: usize) -> NibblePart {
        let block = 22 * g;
        // SAFETY: as `load_part`.
        unsafe {
            let (head, qh) = (
                row.u16(block),
                row.u16(block + 2) | row.u16(block + 4) << 16,
            );
            nibble_k16(row, head, block + 6, qh, c)
        }
    }
}

impl K16Parts for Q5_1 {
    #[inline(always)]
    unsafe fn load_k16(row: Shared, g: usize, c: usize) -> NibblePart {
        let block = 24 * g;
        // SAFETY: as `load_part`.
        unsafe { nibble_k16(row, row.u32(block), block + 8, row.u32(block + 4), c) }
    }
}
