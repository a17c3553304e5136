//! Quantized weights as the GPU reads them: GGUF's blocks, byte for byte as the file has
//! them, and rustle's fp8 rows. Every type is loaded 32 weights at a time, a *group*: a
//! whole block of the 32-weight types, one sub-block of the 256-weight k-quants. A lane
//! loads one group's bytes (`Blocks::load`, all loads issued before any is used) and turns
//! them into floats in registers, eight at a time (`Blocks::decode8`); the dequantizer and
//! fp8's GEMV in `gemv_quant.rs` are written once over this trait. (The GGUF types' decode
//! GEMV reads the same blocks as integer codes instead: `codes.rs`.)
//!
//! All of it must stay in registers: an array indexed by a number the compiler cannot fold
//! (a loop it kept rolled, a sub-block known only at run time) goes to local memory, and
//! the first version of these kernels, written with `array::from_fn`, ran at a tenth of the
//! bandwidth for it. So every loop over a group is `unroll!`ed, and bytes that a run-time
//! number picks are chosen by shifts (`scale_min`), never by indexing.
//!
//! The layouts (little-endian; `d`, `m`, `dmin` are f16; the host's
//! `engine/weights/dequant.rs` and `dequant_k.rs` decode the same bytes):
//! - Q4_0 (32 in 18 bytes): `d, q[16]`: w = d (nibble - 8); byte j holds weight j low and
//!   j + 16 high
//! - Q4_1 (32 in 20): `d, m, q[16]`: w = d nibble + m
//! - Q5_0 (32 in 22): `d, qh: u32, q[16]`: w = d (q - 16), bit j of qh the fifth bit of j
//! - Q5_1 (32 in 24): `d, m, qh, q[16]`: w = d q + m
//! - Q8_0 (32 in 34): `d, q: [i8; 32]`: w = d q
//! - Q4_K (256 in 144): `d, dmin, scales[12], q[128]`: sub-block s has a 6-bit scale and min
//!   (`scale_min`), its nibbles are nibble s % 2 of the 32 bytes at 32 (s / 2)
//! - Q5_K (256 in 176): Q4_K's fields, then `qh[32]` before `q`: bit s of qh[l] is the fifth
//!   bit of weight l of sub-block s
//! - Q6_K (256 in 210): `ql[128], qh[64], scales: [i8; 16], d`: see `Q6K`
//! - Fp8 (a row of `n_in` bytes, e4m3) with one f32 scale per row, kept beside the matrix
//!
//! Small integers become floats through the exponent: `0x4B00_0000 | q` is the float
//! 2^23 + q, so one subtraction gives q exactly. That is an integer instruction and a float
//! add where `q as f32` would be a conversion, which the SMs issue at a quarter of the rate:
//! at 4.5 bits a weight, the conversions alone would fall behind the memory.

use crate::device::{f16_to_f32, fma, ld_nc_u16, ld_nc_u32, ld_nc_v4};
use crate::unroll::unroll;

/// Weights per group: one lane's share of a load.
pub const GROUP: usize = 32;

/// One quantized type, decoded a group at a time.
pub trait Blocks {
    /// Weights per block (32, or 256 for the k-quants).
    const BLOCK_LEN: usize;
    /// Bytes per block.
    const BLOCK_BYTES: usize;
    /// A group's bytes, loaded into registers.
    type Raw: Copy;
    /// What every decoded value is multiplied by, with the row's scale where the type has
    /// one (fp8); 1 where `decode8` gives the weights themselves.
    const UNSCALE: f32 = 1.0;

    /// Loads group `g` of the row that starts at `row`.
    ///
    /// # Safety
    /// `row` is a row of whole blocks in global memory, aligned as the type's blocks are
    /// (2 bytes; 4 for Q4_1 and Q5_1; 16 for Q4_K, Q5_K and fp8), read-only during the
    /// kernel; `g` is below the row's `n_in / 32`.
    unsafe fn load(row: *const u8, g: usize) -> Self::Raw;

    /// Weights `8k .. 8k + 8` of the group (`k` < 4, a constant where it is called).
    fn decode8(raw: &Self::Raw, k: usize) -> [f32; 8];
}

/// `f(0), .., f(7)`, unrolled.
#[inline(always)]
pub(crate) fn eight(f: impl Fn(usize) -> f32) -> [f32; 8] {
    let mut out = [0.0f32; 8];
    unroll!(i < 8 => {
        out[i] = f(i);
    });
    out
}

/// `q` (below 2^23) as a float, less `offset`: exact, and no conversion instruction.
#[inline(always)]
pub(crate) fn small(q: u32, offset: f32) -> f32 {
    f32::from_bits(0x4B00_0000 | q) - (8_388_608.0 + offset)
}

/// `N` u16 loads from `p` (2-byte aligned), unrolled and issued back to back.
///
/// # Safety
/// As `ld_nc_u16`, for `N` consecutive values.
#[inline(always)]
unsafe fn load_u16s<const N: usize>(p: *const u8) -> [u16; N] {
    let p = p as *const u16;
    let mut out = [0u16; N];
    unroll!(i < N => {
        // SAFETY: the caller's guarantee, for each of the N values.
        out[i] = unsafe { ld_nc_u16(p.add(i)) };
    });
    out
}

/// As `load_u16s`, 4-byte words (4-byte aligned).
///
/// # Safety
/// As `ld_nc_u32`, for `N` consecutive values.
#[inline(always)]
unsafe fn load_u32s<const N: usize>(p: *const u8) -> [u32; N] {
    let p = p as *const u32;
    let mut out = [0u32; N];
    unroll!(i < N => {
        // SAFETY: the caller's guarantee, for each of the N values.
        out[i] = unsafe { ld_nc_u32(p.add(i)) };
    });
    out
}

/// Bytes `4i .. 4i + 4` from u16s (`i` a constant): one word.
#[inline(always)]
fn word(h: &[u16], i: usize) -> u32 {
    h[2 * i] as u32 | (h[2 * i + 1] as u32) << 16
}

/// Nibble `j` (0..32, a constant) of a 32-weight block's 16 bytes: weight j < 16 is byte
/// j's low nibble, j + 16 its high nibble.
#[inline(always)]
fn nibble_32(q: &[u32; 4], j: usize) -> u32 {
    let b = j % 16;
    (q[b / 4] >> (8 * (b % 4) + 4 * (j / 16)) as u32) & 0xf
}

/// Five-bit value `j` of Q5_0 and Q5_1: the nibble as in Q4_0, bit j of `qh` on top.
#[inline(always)]
fn five_32(qh: u32, q: &[u32; 4], j: usize) -> u32 {
    nibble_32(q, j) | ((qh >> j) & 1) << 4
}

pub struct Q4_0;

impl Blocks for Q4_0 {
    const BLOCK_LEN: usize = 32;
    const BLOCK_BYTES: usize = 18;
    type Raw = [u16; 9];

    #[inline(always)]
    unsafe fn load(row: *const u8, g: usize) -> [u16; 9] {
        // SAFETY: the block is 18 bytes at an even offset (the caller's guarantee).
        unsafe { load_u16s(row.add(g * 18)) }
    }

    #[inline(always)]
    fn decode8(h: &[u16; 9], k: usize) -> [f32; 8] {
        let d = f16_to_f32(h[0]);
        let q = [1, 2, 3, 4].map(|i| word(&h[1..], i - 1));
        eight(|i| d * small(nibble_32(&q, 8 * k + i), 8.0))
    }
}

pub struct Q4_1;

impl Blocks for Q4_1 {
    const BLOCK_LEN: usize = 32;
    const BLOCK_BYTES: usize = 20;
    type Raw = [u32; 5];

    #[inline(always)]
    unsafe fn load(row: *const u8, g: usize) -> [u32; 5] {
        // SAFETY: 20-byte blocks at 4-byte aligned offsets.
        unsafe { load_u32s(row.add(g * 20)) }
    }

    #[inline(always)]
    fn decode8(r: &[u32; 5], k: usize) -> [f32; 8] {
        let (d, m) = (f16_to_f32(r[0] as u16), f16_to_f32((r[0] >> 16) as u16));
        let q = [r[1], r[2], r[3], r[4]];
        eight(|i| fma(d, small(nibble_32(&q, 8 * k + i), 0.0), m))
    }
}

pub struct Q5_0;

impl Blocks for Q5_0 {
    const BLOCK_LEN: usize = 32;
    const BLOCK_BYTES: usize = 22;
    type Raw = [u16; 11];

    #[inline(always)]
    unsafe fn load(row: *const u8, g: usize) -> [u16; 11] {
        // SAFETY: 22-byte blocks at even offsets.
        unsafe { load_u16s(row.add(g * 22)) }
    }

    #[inline(always)]
    fn decode8(h: &[u16; 11], k: usize) -> [f32; 8] {
        let d = f16_to_f32(h[0]);
        let qh = word(&h[1..], 0);
        let q = [1, 2, 3, 4].map(|i| word(&h[3..], i - 1));
        eight(|i| d * small(five_32(qh, &q, 8 * k + i), 16.0))
    }
}

pub struct Q5_1;

impl Blocks for Q5_1 {
    const BLOCK_LEN: usize = 32;
    const BLOCK_BYTES: usize = 24;
    type Raw = [u32; 6];

    #[inline(always)]
    unsafe fn load(row: *const u8, g: usize) -> [u32; 6] {
        // SAFETY: 24-byte blocks at 4-byte aligned offsets.
        unsafe { load_u32s(row.add(g * 24)) }
    }

    #[inline(always)]
    fn decode8(r: &[u32; 6], k: usize) -> [f32; 8] {
        let (d, m) = (f16_to_f32(r[0] as u16), f16_to_f32((r[0] >> 16) as u16));
        let q = [r[2], r[3], r[4], r[5]];
        eight(|i| fma(d, small(five_32(r[1], &q, 8 * k + i), 0.0), m))
    }
}

pub struct Q8_0;

impl Blocks for Q8_0 {
    const BLOCK_LEN: usize = 32;
    const BLOCK_BYTES: usize = 34;
    type Raw = [u16; 17];

    #[inline(always)]
    unsafe fn load(row: *const u8, g: usize) -> [u16; 17] {
        // SAFETY: 34-byte blocks at even offsets.
        unsafe { load_u16s(row.add(g * 34)) }
    }

    #[inline(always)]
    fn decode8(h: &[u16; 17], k: usize) -> [f32; 8] {
        let d = f16_to_f32(h[0]);
        // A signed byte b is (b ^ 0x80) - 128.
        eight(|i| {
            let j = 8 * k + i;
            let b = (h[1 + j / 2] >> (8 * (j % 2) as u32)) as u32 & 0xff;
            d * small(b ^ 0x80, 128.0)
        })
    }
}

/// Sub-block `s`'s 6-bit scale and min from the 12 packed bytes of Q4_K and Q5_K (bytes
/// 4..16 of the block's head, words 1..4): sub-blocks 0..4 take the low 6 bits of bytes s
/// (scale) and s + 4 (min); 4..8 the low and high nibbles of byte s + 4 with the top two
/// bits of bytes s - 4 and s on top. Every byte it needs is byte `s % 4` of one of the three
/// words, so one shift of each word by the same run-time amount finds them all, where
/// picking each byte's word took compares and selects.
#[inline(always)]
pub(crate) fn scale_min(head: &[u32; 4], s: usize) -> (f32, f32) {
    let shift = 8 * (s % 4) as u32;
    let (a, b, c) = (head[1] >> shift, head[2] >> shift, head[3] >> shift);
    let (sc, m) = if s < 4 {
        (a & 63, b & 63)
    } else {
        (
            (c & 0xf) | (a >> 2) & 0x30,
            (c >> 4) & 0xf | (b >> 2) & 0x30,
        )
    };
    (small(sc, 0.0), small(m, 0.0))
}

/// A k-quant group: the block's first 16 bytes (`d`, `dmin`, scales), its 32 bytes of
/// nibbles, and which sub-block it is.
#[derive(Clone, Copy)]
pub struct KGroup<const HIGH: usize> {
    head: [u32; 4],
    q: [u32; 8],
    /// Q5_K's 32 bytes of fifth bits (none for Q4_K).
    qh: [u32; HIGH],
    s: usize,
}

/// Loads a Q4_K or Q5_K group: `qh_at` is where the fifth bits start (Q5_K), `q_at` the
/// nibbles.
///
/// # Safety
/// As `Blocks::load`: 16-byte aligned blocks of `block_bytes`.
#[inline(always)]
unsafe fn load_k<const HIGH: usize>(
    row: *const u8,
    g: usize,
    block_bytes: usize,
    qh_at: usize,
    q_at: usize,
) -> KGroup<HIGH> {
    let (block, s) = (row.wrapping_add(g / 8 * block_bytes), g % 8);
    let v4 = |at: usize| {
        // SAFETY: `at` is a multiple of 16 inside the block; blocks are 16-byte aligned.
        unsafe { ld_nc_v4(block.add(at) as *const u32) }
    };
    let (q0, q1) = (v4(q_at + 32 * (s / 2)), v4(q_at + 32 * (s / 2) + 16));
    let mut qh = [0u32; HIGH];
    if HIGH == 8 {
        let (h0, h1) = (v4(qh_at), v4(qh_at + 16));
        unroll!(i < HIGH => {
            qh[i] = if i < 4 { h0[i % 4] } else { h1[i % 4] };
        });
    }
    KGroup {
        head: v4(0),
        q: [q0[0], q0[1], q0[2], q0[3], q1[0], q1[1], q1[2], q1[3]],
        qh,
        s,
    }
}

/// `d * scale * q - dmin * min` over weights `8c .. 8c + 8` of a k-quant group, `q` from
/// `value(l)`.
#[inline(always)]
fn decode_k<const HIGH: usize>(
    k: &KGroup<HIGH>,
    c: usize,
    value: impl Fn(usize) -> u32,
) -> [f32; 8] {
    let (d, dmin) = (
        f16_to_f32(k.head[0] as u16),
        f16_to_f32((k.head[0] >> 16) as u16),
    );
    let (sc, m) = scale_min(&k.head, k.s);
    let (scale, min) = (d * sc, dmin * m);
    eight(|i| fma(scale, small(value(8 * c + i), 0.0), -min))
}

pub struct Q4K;

impl Blocks for Q4K {
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = 144;
    type Raw = KGroup<0>;

    #[inline(always)]
    unsafe fn load(row: *const u8, g: usize) -> KGroup<0> {
        // SAFETY: the caller's guarantee; nibbles at byte 16.
        unsafe { load_k(row, g, 144, 0, 16) }
    }

    #[inline(always)]
    fn decode8(k: &KGroup<0>, c: usize) -> [f32; 8] {
        let shift = 4 * (k.s % 2) as u32;
        decode_k(k, c, |l| (k.q[l / 4] >> (8 * (l % 4) as u32 + shift)) & 0xf)
    }
}

pub struct Q5K;

impl Blocks for Q5K {
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = 176;
    type Raw = KGroup<8>;

    #[inline(always)]
    unsafe fn load(row: *const u8, g: usize) -> KGroup<8> {
        // SAFETY: the caller's guarantee; fifth bits at byte 16, nibbles at 48.
        unsafe { load_k(row, g, 176, 16, 48) }
    }

    #[inline(always)]
    fn decode8(k: &KGroup<8>, c: usize) -> [f32; 8] {
        let shift = 4 * (k.s % 2) as u32;
        decode_k(k, c, |l| {
            let low = (k.q[l / 4] >> (8 * (l % 4) as u32 + shift)) & 0xf;
            let high = (k.qh[l / 4] >> (8 * (l % 4) as u32 + k.s as u32)) & 1;
            low | high << 4
        })
    }
}

/// Q6_K: a block of 256 is two halves of 128 (ql 64 bytes, qh 32, scales 8 each). Within a
/// half, sub-block m (0..4) of 32 takes nibble m / 2 of the 32 ql bytes at 32 (m % 2), bits
/// 2m..2m+2 of the 32 qh bytes, and an i8 scale per 16 weights (scales 2m and 2m + 1):
/// w = d * scale * (q - 32).
#[derive(Clone, Copy)]
pub struct Q6Group {
    ql: [u16; 16],
    qh: [u16; 16],
    /// The sub-block's two i8 scales.
    scales: u16,
    d: u16,
    /// Sub-block within its half, 0..4.
    m: usize,
}

pub struct Q6K;

impl Blocks for Q6K {
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = 210;
    type Raw = Q6Group;

    #[inline(always)]
    unsafe fn load(row: *const u8, g: usize) -> Q6Group {
        let block = row.wrapping_add(g / 8 * 210);
        let (half, m) = ((g % 8) / 4, g % 4);
        // SAFETY: every offset is even and inside the 210-byte block.
        unsafe {
            Q6Group {
                ql: load_u16s(block.add(64 * half + 32 * (m % 2))),
                qh: load_u16s(block.add(128 + 32 * half)),
                scales: ld_nc_u16(block.add(192 + 8 * half + 2 * m) as *const u16),
                d: ld_nc_u16(block.add(208) as *const u16),
                m,
            }
        }
    }

    #[inline(always)]
    fn decode8(k: &Q6Group, c: usize) -> [f32; 8] {
        let d = f16_to_f32(k.d);
        // Weights 8c.. share one of the two scales: the first for c < 2.
        let scale = ((k.scales >> (8 * (c / 2) as u32)) as u8 as i8) as f32 * d;
        let (shift_l, shift_h) = (4 * (k.m / 2) as u32, 2 * k.m as u32);
        eight(|i| {
            let l = 8 * c + i;
            let byte = |h: &[u16; 16]| (h[l / 2] >> (8 * (l % 2) as u32)) as u32;
            let q = (byte(&k.ql) >> shift_l) & 0xf | ((byte(&k.qh) >> shift_h) & 3) << 4;
            scale * small(q, 32.0)
        })
    }
}

/// fp8 e4m3 (1 sign, 4 exponent bits biased by 7, 3 mantissa bits; no infinities), 32 to a
/// group, times the row's scale.
pub struct Fp8;

/// 2^120: `Fp8::decode8` leaves each value this much too small (see there).
pub const FP8_UNSCALE: f32 = 1.329_228e36;

impl Blocks for Fp8 {
    const BLOCK_LEN: usize = 32;
    const BLOCK_BYTES: usize = 32;
    type Raw = [u32; 8];
    const UNSCALE: f32 = FP8_UNSCALE;

    #[inline(always)]
    unsafe fn load(row: *const u8, g: usize) -> [u32; 8] {
        let p = row.wrapping_add(g * 32) as *const u32;
        // SAFETY: 32-byte groups of a 16-byte aligned row.
        let (a, b) = unsafe { (ld_nc_v4(p), ld_nc_v4(p.add(4))) };
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    }

    /// See `fp8x4`.
    #[inline(always)]
    fn decode8(r: &[u32; 8], k: usize) -> [f32; 8] {
        let (a, b) = (fp8x4(r[2 * k]), fp8x4(r[2 * k + 1]));
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    }
}

/// The four e4m3 values of a word (byte j is value j), each 2^-120 times itself: the bits
/// moved into an f32's sign, exponent and mantissa, the exponent field keeping e4m3's bias
/// of 7 where f32's is 127 (an e4m3 subnormal lands on an f32 subnormal, still exact).
/// Callers multiply by `FP8_UNSCALE` once, with the row's scale.
///
/// Three instructions a value: the byte shifted to the top of the word, where its sign is
/// the f32's, then an arithmetic shift right by 4 brings exponent and mantissa to bits
/// 20..27 (copies of the sign above them) and a mask keeps the sign and those.
#[inline(always)]
pub fn fp8x4(w: u32) -> [f32; 4] {
    let mut out = [0.0f32; 4];
    unroll!(j < 4 => {
        let top = (w << (24 - 8 * j)) as i32;
        out[j] = f32::from_bits((top >> 4) as u32 & 0x87f0_0000);
    });
    out
}
