//! The GGUF types' weights against activations quantized to 8-bit codes: the integer dot
//! products the quantized GEMV (`gemv_codes.rs`) is made of.
//!
//! The activations come as codes `q` (i8) with one scale `d` per group of 32, so that
//! `x ≈ d q`, and the group's `d * sum(q)` beside it (`quantize_q8_f32`). A weight's codes
//! (a nibble, five or six bits, or a byte) then meet the activations' four at a time in
//! `dp4a`, one instruction where the float path spent an extract, a conversion and two
//! fused multiply-adds on every weight. The scales are applied once per group (per 16 for
//! Q6_K): `sum_i (dw qw_i - m) (d q_i) = dw d sum_i qw_i q_i - m (d sum_i q_i)`, the second
//! sum the one stored beside the codes.
//!
//! A lane takes a *span*: one block of the 32-weight types, two sub-blocks of the k-quants
//! (the two that share a run of bytes: Q4_K's low and high nibbles, Q6_K's). Blocks of 18,
//! 22, 34 or 210 bytes start at even addresses only, so their words come from aligned loads
//! joined by funnel shifts (`window`), never from byte loads.

use crate::block_parts::Shared;
use crate::device::{dp4a, f16_to_f32, funnel_shift, ld_nc_u16, ld_nc_u32, ld_nc_v4};
use crate::mma::ld_shared_v4;
use crate::quant_blocks::{Blocks, Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q5K, Q6K, Q8_0, scale_min};
use crate::unroll::unroll;

/// A type's spans, and the dot product of one with the activations' codes.
pub trait Codes: Blocks {
    /// Groups of 32 weights in a span: 1 for the 32-weight types, 2 for the k-quants.
    const GROUPS: usize;
    /// Whether `gemv_codes` loads a thread's first span of its rows before the wait for
    /// the kernel before. On the H200 (docs/lessons.md#quantized-gemvs), batch 1 on Llama 3
    /// 8B's shape: 3-7% more
    /// tokens a second for the 32-weight types and Q6_K; Q4_K and Q5_K lost up to 2% (Q4_K's
    /// GEMV at 64 registers a thread either way), so those two wait first.
    const LOADS_AHEAD: bool = true;
    /// Whether `span_codes` reads a span's four scales (its two groups' `d` and `d` times
    /// their sums, neighbours in memory) in one 16-byte load rather than four. Q4_K: its
    /// warps' loads of them touched 4 cache lines each, and `gemv_q4_k` went 3-6% faster
    /// (held at 64 registers, `REGISTER_CAPS`). Q5_K's GEMV went from 72 registers to 76
    /// with it and its step 2.5% slower; Q6_K's groups are not neighbours. Measured on the
    /// H200: docs/lessons.md#quantized-gemvs.
    const SCALES_AT_ONCE: bool = false;
    /// A span's bytes, loaded into registers.
    type Span: Copy;

    /// Loads span `s` of the row that starts at `row`.
    ///
    /// # Safety
    /// `row` is a row of whole blocks (in global memory, read-only during the kernel, or in
    /// shared memory the block has finished writing), at an address whose remainder mod 16
    /// the type's blocks allow (any even address; 4-byte aligned for Q4_1 and Q5_1, 16 for
    /// Q4_K and Q5_K); `s` is below the row's spans.
    unsafe fn load_span<M: Bytes>(row: M, s: usize) -> Self::Span;

    /// The group of the row (its 32 activations) that weights `32k .. 32k + 32` of span `s`
    /// multiply.
    #[inline(always)]
    fn group(s: usize, k: usize) -> usize {
        Self::GROUPS * s + k
    }

    /// `sum_i w_i x_i` over the span, where group k's activations are `d[k] * x[k][..]`
    /// (four codes a word, in order) and `ds[k]` is `d[k]` times the sum of its codes.
    fn dot(span: &Self::Span, x: &[[u32; 8]; 2], d: [f32; 2], ds: [f32; 2]) -> f32;
}

/// Where a row's bytes are read from: global memory through the read-only path (a
/// `*const u8`, `gemv_codes`), or a stage of shared memory the copy engine filled (`Shared`,
/// `gemv_stream`), each byte at the same address mod 16 as in global memory. The spans'
/// loads are written once for both.
pub trait Bytes: Copy {
    /// The address `n` bytes on.
    fn add(self, n: usize) -> Self;
    /// The address `n` bytes back.
    fn sub(self, n: usize) -> Self;
    /// The address mod 4.
    fn mod4(self) -> usize;
    /// # Safety
    /// 2-byte aligned, inside the row.
    unsafe fn u16(self) -> u16;
    /// # Safety
    /// 4-byte aligned, inside the row.
    unsafe fn u32(self) -> u32;
    /// # Safety
    /// 16-byte aligned, inside the row.
    unsafe fn v4(self) -> [u32; 4];
}

impl Bytes for *const u8 {
    #[inline(always)]
    fn add(self, n: usize) -> Self {
        self.wrapping_add(n)
    }
    #[inline(always)]
    fn sub(self, n: usize) -> Self {
        self.wrapping_sub(n)
    }
    #[inline(always)]
    fn mod4(self) -> usize {
        self as usize & 3
    }
    #[inline(always)]
    unsafe fn u16(self) -> u16 {
        // SAFETY: the caller's guarantee.
        unsafe { ld_nc_u16(self as *const u16) }
    }
    #[inline(always)]
    unsafe fn u32(self) -> u32 {
        // SAFETY: the caller's guarantee.
        unsafe { ld_nc_u32(self as *const u32) }
    }
    #[inline(always)]
    unsafe fn v4(self) -> [u32; 4] {
        // SAFETY: the caller's guarantee.
        unsafe { ld_nc_v4(self as *const u32) }
    }
}

impl Bytes for Shared {
    #[inline(always)]
    fn add(self, n: usize) -> Self {
        Shared(self.0 + n as u32)
    }
    #[inline(always)]
    fn sub(self, n: usize) -> Self {
        Shared(self.0 - n as u32)
    }
    #[inline(always)]
    fn mod4(self) -> usize {
        self.0 as usize & 3
    }
    #[inline(always)]
    unsafe fn u16(self) -> u16 {
        // SAFETY: the caller's guarantee.
        unsafe { Shared::u16(self, 0) as u16 }
    }
    #[inline(always)]
    unsafe fn u32(self) -> u32 {
        // SAFETY: the caller's guarantee.
        unsafe { Shared::u32(self, 0) }
    }
    #[inline(always)]
    unsafe fn v4(self) -> [u32; 4] {
        // SAFETY: the caller's guarantee.
        unsafe { ld_shared_v4(self.0) }
    }
}

/// `N` aligned words from the word that holds byte `p` (2-byte aligned), and the shift in
/// bits (0 or 16) at which `p`'s bytes start in them: word `i` of the bytes at `p` is
/// `funnel_shift(w[i], w[i + 1], shift)`.
///
/// # Safety
/// The `N` words from `p & !3` are inside the row (`Bytes`). (Where `p`
/// is 2 past a multiple of 4 the last word ends 2 bytes past what the caller asked for.
/// Callers ask for `N` so that the last word still begins inside their block.)
#[inline(always)]
unsafe fn window<const N: usize, M: Bytes>(p: M) -> ([u32; N], u32) {
    let shift = 8 * p.mod4() as u32;
    let base = p.sub(p.mod4());
    let mut w = [0u32; N];
    unroll!(i < N => {
        // SAFETY: the caller's guarantee.
        w[i] = unsafe { base.add(4 * i).u32() };
    });
    (w, shift)
}

/// The low nibbles of a word's four bytes, each in its byte.
#[inline(always)]
fn low(w: u32) -> u32 {
    w & 0x0f0f_0f0f
}

/// The high nibbles of a word's four bytes, each in its byte.
#[inline(always)]
fn high(w: u32) -> u32 {
    (w >> 4) & 0x0f0f_0f0f
}

/// Four bits `4i .. 4i + 4` of `bits` as bit 4 of a word's four bytes (Q5_0's and Q5_1's
/// fifth bits): the multiply places the four bits 7 apart, at the bottoms of the bytes.
#[inline(always)]
fn fifth_bits(bits: u32, i: usize) -> u32 {
    ((((bits >> (4 * i)) & 0xf) * 0x0020_4081) & 0x0101_0101) << 4
}

/// `sum_i code_i q_i` over a group of 32 whose weight codes are the bytes of `w`.
#[inline(always)]
fn dot32(w: &[u32; 8], x: &[u32; 8]) -> i32 {
    let mut s = [0i32; 2];
    unroll!(i < 4 => {
        s[0] = dp4a(w[i], x[i], s[0]);
        s[1] = dp4a(w[4 + i], x[4 + i], s[1]);
    });
    s[0] + s[1]
}

/// Weights of a 32-weight block with 16 bytes of nibbles: weight j < 16 is byte j's low
/// nibble, j + 16 its high nibble; `fifth` puts bit 4 on each (Q5_0, Q5_1), 0 for none.
#[inline(always)]
fn nibble_codes(q: &[u32; 4], fifth: u32) -> [u32; 8] {
    let mut w = [0u32; 8];
    unroll!(i < 4 => {
        w[i] = low(q[i]) | fifth_bits(fifth, i);
        w[4 + i] = high(q[i]) | fifth_bits(fifth, 4 + i);
    });
    w
}

/// Q4_0 (18 bytes: `d`, 16 bytes of nibbles): w = d (nibble - 8).
#[derive(Clone, Copy)]
pub struct Q4_0Span {
    d: f32,
    q: [u32; 4],
}

impl Codes for Q4_0 {
    const GROUPS: usize = 1;
    type Span = Q4_0Span;

    #[inline(always)]
    unsafe fn load_span<M: Bytes>(row: M, s: usize) -> Q4_0Span {
        // SAFETY: 5 words from an even address end at most 2 bytes past the block's 18.
        let (w, shift) = unsafe { window::<5, M>(row.add(18 * s)) };
        let mut q = [0u32; 4];
        unroll!(i < 4 => {
            q[i] = funnel_shift(w[i], w[i + 1], shift + 16);
        });
        let d = f16_to_f32(funnel_shift(w[0], w[1], shift) as u16);
        Q4_0Span { d, q }
    }

    #[inline(always)]
    fn dot(b: &Q4_0Span, x: &[[u32; 8]; 2], d: [f32; 2], ds: [f32; 2]) -> f32 {
        let sum = dot32(&nibble_codes(&b.q, 0), &x[0]) as f32;
        b.d * (d[0] * sum - 8.0 * ds[0])
    }
}

/// Q4_1 (20 bytes: `d`, `m`, 16 bytes of nibbles): w = d nibble + m.
impl Codes for Q4_1 {
    const GROUPS: usize = 1;
    type Span = [u32; 5];

    #[inline(always)]
    unsafe fn load_span<M: Bytes>(row: M, s: usize) -> [u32; 5] {
        let p = row.add(20 * s);
        let mut w = [0u32; 5];
        unroll!(i < 5 => {
            // SAFETY: 20-byte blocks at 4-byte aligned offsets.
            w[i] = unsafe { p.add(4 * i).u32() };
        });
        w
    }

    #[inline(always)]
    fn dot(b: &[u32; 5], x: &[[u32; 8]; 2], d: [f32; 2], ds: [f32; 2]) -> f32 {
        let (dw, m) = (f16_to_f32(b[0] as u16), f16_to_f32((b[0] >> 16) as u16));
        let sum = dot32(&nibble_codes(&[b[1], b[2], b[3], b[4]], 0), &x[0]) as f32;
        dw * d[0] * sum + m * ds[0]
    }
}

/// Q5_0 (22 bytes: `d`, 32 fifth bits, 16 bytes of nibbles): w = d (q - 16).
#[derive(Clone, Copy)]
pub struct Q5_0Span {
    d: f32,
    fifth: u32,
    q: [u32; 4],
}

impl Codes for Q5_0 {
    const GROUPS: usize = 1;
    type Span = Q5_0Span;

    #[inline(always)]
    unsafe fn load_span<M: Bytes>(row: M, s: usize) -> Q5_0Span {
        // SAFETY: 6 words from an even address end at most 2 bytes past the block's 22.
        let (w, shift) = unsafe { window::<6, M>(row.add(22 * s)) };
        let mut q = [0u32; 4];
        unroll!(i < 4 => {
            q[i] = funnel_shift(w[i + 1], w[i + 2], shift + 16);
        });
        Q5_0Span {
            d: f16_to_f32(funnel_shift(w[0], w[1], shift) as u16),
            fifth: funnel_shift(w[0], w[1], shift + 16),
            q,
        }
    }

    #[inline(always)]
    fn dot(b: &Q5_0Span, x: &[[u32; 8]; 2], d: [f32; 2], ds: [f32; 2]) -> f32 {
        let sum = dot32(&nibble_codes(&b.q, b.fifth), &x[0]) as f32;
        b.d * (d[0] * sum - 16.0 * ds[0])
    }
}

/// Q5_1 (24 bytes: `d`, `m`, 32 fifth bits, 16 bytes of nibbles): w = d q + m.
impl Codes for Q5_1 {
    const GROUPS: usize = 1;
    type Span = [u32; 6];

    #[inline(always)]
    unsafe fn load_span<M: Bytes>(row: M, s: usize) -> [u32; 6] {
        let p = row.add(24 * s);
        let mut w = [0u32; 6];
        unroll!(i < 6 => {
            // SAFETY: 24-byte blocks at 4-byte aligned offsets.
            w[i] = unsafe { p.add(4 * i).u32() };
        });
        w
    }

    #[inline(always)]
    fn dot(b: &[u32; 6], x: &[[u32; 8]; 2], d: [f32; 2], ds: [f32; 2]) -> f32 {
        let (dw, m) = (f16_to_f32(b[0] as u16), f16_to_f32((b[0] >> 16) as u16));
        let sum = dot32(&nibble_codes(&[b[2], b[3], b[4], b[5]], b[1]), &x[0]) as f32;
        dw * d[0] * sum + m * ds[0]
    }
}

/// Q8_0 (34 bytes: `d`, 32 signed bytes): w = d q.
#[derive(Clone, Copy)]
pub struct Q8_0Span {
    d: f32,
    q: [u32; 8],
}

impl Codes for Q8_0 {
    const GROUPS: usize = 1;
    type Span = Q8_0Span;

    #[inline(always)]
    unsafe fn load_span<M: Bytes>(row: M, s: usize) -> Q8_0Span {
        // SAFETY: 9 words from an even address end at most 2 bytes past the block's 34.
        let (w, shift) = unsafe { window::<9, M>(row.add(34 * s)) };
        let mut q = [0u32; 8];
        unroll!(i < 8 => {
            q[i] = funnel_shift(w[i], w[i + 1], shift + 16);
        });
        let d = f16_to_f32(funnel_shift(w[0], w[1], shift) as u16);
        Q8_0Span { d, q }
    }

    #[inline(always)]
    fn dot(b: &Q8_0Span, x: &[[u32; 8]; 2], d: [f32; 2], _ds: [f32; 2]) -> f32 {
        b.d * d[0] * dot32(&b.q, &x[0]) as f32
    }
}

/// Q4_K and Q5_K: sub-blocks `2p` and `2p + 1` of a block, which share its `p`-th 32 bytes
/// of nibbles (low and high); Q5_K's 32 bytes of fifth bits in `qh`.
#[derive(Clone, Copy)]
pub struct KSpan<const HIGH: usize> {
    head: [u32; 4],
    q: [u32; 8],
    qh: [u32; HIGH],
    p: usize,
}

/// Loads span `s` (block `s / 4`, pair `s % 4`) of a Q4_K or Q5_K row: `qh_at` is where the
/// fifth bits start (Q5_K), `q_at` the nibbles.
///
/// # Safety
/// As `Codes::load_span`: 16-byte aligned blocks of `block_bytes`.
#[inline(always)]
unsafe fn load_k<const HIGH: usize, M: Bytes>(
    row: M,
    s: usize,
    block_bytes: usize,
    qh_at: usize,
    q_at: usize,
) -> KSpan<HIGH> {
    let (block, p) = (row.add(s / 4 * block_bytes), s % 4);
    let v4 = |at: usize| {
        // SAFETY: `at` is a multiple of 16 inside the block; blocks are 16-byte aligned.
        unsafe { block.add(at).v4() }
    };
    let (q0, q1) = (v4(q_at + 32 * p), v4(q_at + 32 * p + 16));
    let mut qh = [0u32; HIGH];
    if HIGH == 8 {
        let (h0, h1) = (v4(qh_at), v4(qh_at + 16));
        unroll!(i < HIGH => {
            qh[i] = if i < 4 { h0[i % 4] } else { h1[i % 4] };
        });
    }
    KSpan {
        head: v4(0),
        q: [q0[0], q0[1], q0[2], q0[3], q1[0], q1[1], q1[2], q1[3]],
        qh,
        p,
    }
}

/// `d sc q - dmin m` over a k-quant span's two sub-blocks, whose weight codes are `w[k]`.
#[inline(always)]
fn dot_k<const HIGH: usize>(
    k: &KSpan<HIGH>,
    w: &[[u32; 8]; 2],
    x: &[[u32; 8]; 2],
    d: [f32; 2],
    ds: [f32; 2],
) -> f32 {
    let (dw, dmin) = (
        f16_to_f32(k.head[0] as u16),
        f16_to_f32((k.head[0] >> 16) as u16),
    );
    let (sc0, m0) = scale_min(&k.head, 2 * k.p);
    let (sc1, m1) = scale_min(&k.head, 2 * k.p + 1);
    let (s0, s1) = (dot32(&w[0], &x[0]) as f32, dot32(&w[1], &x[1]) as f32);
    dw * (sc0 * d[0] * s0 + sc1 * d[1] * s1) - dmin * (m0 * ds[0] + m1 * ds[1])
}

impl Codes for Q4K {
    const GROUPS: usize = 2;
    const LOADS_AHEAD: bool = false;
    const SCALES_AT_ONCE: bool = true;
    type Span = KSpan<0>;

    #[inline(always)]
    unsafe fn load_span<M: Bytes>(row: M, s: usize) -> KSpan<0> {
        // SAFETY: the caller's guarantee; nibbles at byte 16.
        unsafe { load_k(row, s, 144, 0, 16) }
    }

    #[inline(always)]
    fn dot(k: &KSpan<0>, x: &[[u32; 8]; 2], d: [f32; 2], ds: [f32; 2]) -> f32 {
        let mut w = [[0u32; 8]; 2];
        unroll!(i < 8 => {
            w[0][i] = low(k.q[i]);
            w[1][i] = high(k.q[i]);
        });
        dot_k(k, &w, x, d, ds)
    }
}

impl Codes for Q5K {
    const GROUPS: usize = 2;
    const LOADS_AHEAD: bool = false;
    type Span = KSpan<8>;

    #[inline(always)]
    unsafe fn load_span<M: Bytes>(row: M, s: usize) -> KSpan<8> {
        // SAFETY: the caller's guarantee; fifth bits at byte 16, nibbles at 48.
        unsafe { load_k(row, s, 176, 16, 48) }
    }

    #[inline(always)]
    fn dot(k: &KSpan<8>, x: &[[u32; 8]; 2], d: [f32; 2], ds: [f32; 2]) -> f32 {
        // Bit s of qh's byte l is the fifth bit of weight l of sub-block s.
        let (b0, b1) = (2 * k.p as u32, 2 * k.p as u32 + 1);
        let mut w = [[0u32; 8]; 2];
        unroll!(i < 8 => {
            w[0][i] = low(k.q[i]) | ((k.qh[i] >> b0) & 0x0101_0101) << 4;
            w[1][i] = high(k.q[i]) | ((k.qh[i] >> b1) & 0x0101_0101) << 4;
        });
        dot_k(k, &w, x, d, ds)
    }
}

/// Q6_K: sub-blocks `j` and `j + 2` of a half (block `s / 4`, half `s / 2 % 2`, `j = s %
/// 2`), which share 32 bytes of `ql` (low and high nibbles) and the half's 32 bytes of `qh`
/// (bits `2j` and `2j + 4`); an i8 scale per 16 weights, `d` for the block.
#[derive(Clone, Copy)]
pub struct Q6Span {
    ql: [u32; 8],
    qh: [u32; 8],
    /// Sub-block j's two scales, then sub-block j + 2's.
    scales: [u16; 2],
    d: f32,
    j: usize,
}

/// The bytes of four signed bytes of -32 each: Q6_K's offset, taken off by one more `dp4a`.
const MINUS_32: u32 = 0xe0e0_e0e0;

impl Codes for Q6K {
    const GROUPS: usize = 2;
    type Span = Q6Span;

    #[inline(always)]
    unsafe fn load_span<M: Bytes>(row: M, s: usize) -> Q6Span {
        let block = row.add(s / 4 * 210);
        let (half, j) = (s / 2 % 2, s % 2);
        // SAFETY: every offset is even and inside the 210-byte block; 9 words from
        // `ql` or `qh` end at most 4 bytes past their 32, still inside the block.
        unsafe {
            let (l, shift) = window::<9, M>(block.add(64 * half + 32 * j));
            let (h, _) = window::<9, M>(block.add(128 + 32 * half));
            let mut ql = [0u32; 8];
            let mut qh = [0u32; 8];
            unroll!(i < 8 => {
                ql[i] = funnel_shift(l[i], l[i + 1], shift);
                qh[i] = funnel_shift(h[i], h[i + 1], shift);
            });
            let scales = block.add(192 + 8 * half + 2 * j);
            Q6Span {
                ql,
                qh,
                scales: [scales.u16(), scales.add(4).u16()],
                d: f16_to_f32(block.add(208).u16()),
                j,
            }
        }
    }

    #[inline(always)]
    fn group(s: usize, k: usize) -> usize {
        8 * (s / 4) + 4 * (s / 2 % 2) + s % 2 + 2 * k
    }

    #[inline(always)]
    fn dot(b: &Q6Span, x: &[[u32; 8]; 2], d: [f32; 2], _ds: [f32; 2]) -> f32 {
        let mut sums = [0.0f32; 2];
        unroll!(k < 2 => {
            // Sub-block j + 2k: nibble k of ql, bits 2j + 4k of qh.
            let (nib, bits) = (4 * k as u32, 2 * (b.j + 2 * k) as u32);
            let mut half_sums = [0i32; 2];
            unroll!(i < 8 => {
                let q = (b.ql[i] >> nib) & 0x0f0f_0f0f | ((b.qh[i] >> bits) & 0x0303_0303) << 4;
                let h = &mut half_sums[i / 4];
                *h = dp4a(MINUS_32, x[k][i], dp4a(q, x[k][i], *h));
            });
            let sc = |i: u32| (b.scales[k] >> (8 * i)) as u8 as i8 as i32;
            sums[k] = d[k] * (sc(0) * half_sums[0] + sc(1) * half_sums[1]) as f32;
        });
        b.d * (sums[0] + sums[1])
    }
}
