//! Hopper's warpgroup tensor-core instructions (`wgmma`, sm_90a only) as thin wrappers over
//! inline PTX: what CUDA C reaches through CUTLASS's `GMMA` atoms.
//!
//! `mma.sync` (see `mma.rs`) is one warp multiplying register fragments and waiting for the
//! result. `wgmma.mma_async` is four warps (a *warpgroup*, 128 threads) multiplying a
//! 64 x N x 16 product whose operands the tensor cores read straight from shared memory,
//! described by a 64-bit *matrix descriptor*; the accumulators stay in registers, and the
//! instruction returns at once. The threads go on (requesting the next tiles, say) and wait
//! for the product only when they need it: `commit_group` closes a batch of products,
//! `wait_group(n)` waits until at most `n` batches are still running.
//!
//! This module exists only in the sm_90a build (`.target sm_90a`): the "a" targets carry
//! instructions that later GPUs do not promise to keep, so that PTX runs on Hopper alone.

use core::arch::asm;

/// The descriptor of a K-major operand tile in shared memory laid out as the hardware's
/// 128-byte swizzle wants it: rows of 128 bytes (64 bf16 or 128 e4m3), eight rows (1024
/// bytes) to a swizzle atom, the 16-byte chunk `c` of row `r` stored at chunk `c ^ (r % 8)`.
/// The tile starts at shared address `start`, and its atom boundaries are 1024-byte aligned
/// (`start` itself may sit 32, 64 or 96 bytes into a row: that is how a product walks along
/// k).
///
/// Fields: bits 0-13 the start address / 16; 16-29 the leading byte offset / 16 (unused
/// for swizzled K-major tiles: 1 by convention); 32-45 the stride byte offset / 16, from
/// one group of 8 rows to the next (1024 bytes); 62-63 the swizzle mode (1 = 128 bytes).
#[inline(always)]
pub fn descriptor_sw128(start: u32) -> u64 {
    const LEADING: u64 = 1;
    const STRIDE: u64 = 1024 >> 4;
    const SWIZZLE_128B: u64 = 1;
    ((start as u64 & 0x3ffff) >> 4) | (LEADING << 16) | (STRIDE << 32) | (SWIZZLE_128B << 62)
}

/// Where a 16-byte chunk goes in a 128-byte-swizzled tile: row `row`, chunk `chunk` (0..8) of
/// the row's 128 bytes, as a byte offset from the tile's start. Spreading each row's chunks
/// over the 8 positions this way means eight rows' same chunk never share a bank group.
#[inline(always)]
pub const fn swizzle_128b(row: usize, chunk: usize) -> usize {
    row * 128 + ((chunk ^ (row % 8)) * 16)
}

/// Orders this thread's earlier shared-memory writes (its `cp.async` copies, which the
/// generic proxy made) before later reads by the tensor cores' async proxy: each thread
/// runs it after its copies land and before the barrier that publishes them.
#[inline(always)]
pub fn fence_proxy_async_shared() {
    // SAFETY: a fence.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) };
}

/// `wgmma.fence`: the accumulator registers the next products use are ready (written by
/// ordinary instructions, zeroed say, before this point). Needed before the first product
/// and after any register access to the accumulators between products.
#[inline(always)]
pub fn fence() {
    // SAFETY: an ordering instruction; every thread of the warpgroup runs it.
    unsafe { asm!("wgmma.fence.sync.aligned;", options(nostack)) };
}

/// Closes the batch of products this warpgroup has issued since the last commit.
#[inline(always)]
pub fn commit_group() {
    // SAFETY: marks a point in the warpgroup's queue of products.
    unsafe { asm!("wgmma.commit_group.sync.aligned;", options(nostack)) };
}

/// Waits until at most `PENDING` committed batches of products are still running.
/// Accumulators of the finished ones may be read after it (see `pin`).
#[inline(always)]
pub fn wait_group<const PENDING: u32>() {
    // SAFETY: a wait.
    unsafe { asm!("wgmma.wait_group.sync.aligned {n};", n = const PENDING, options(nostack)) };
}

/// The f32 accumulators of one warpgroup's `m64nN` product, N / 2 per thread, and the
/// product itself for that N: `[f32; 64]` is N = 128, `[f32; 96]` 192, `[f32; 112]` 224,
/// `[f32; 128]` 256 (the widths `gemm_wgmma_bf16` can run).
///
/// In thread `t` of the warpgroup, with warp `w = t / 32`, `g = t % 32 / 4` and
/// `c = 2 (t % 4)`, word `4 j + 2 h + e` is row `16 w + g + 8 h`, column `8 j + c + e`: the
/// `mma.sync` accumulator layout, once per 8 columns.
pub trait Accumulators: Sized {
    /// N: the product's width, in columns.
    const N: usize;

    /// All zeros. (An array literal `[0.0; 128]` becomes a store loop the compiler keeps
    /// rolled, which puts the accumulators in local memory; this is a memset it resolves.)
    fn zeros() -> Self {
        // SAFETY: all-zero bits are 0.0, and Self is an array of f32.
        unsafe { core::mem::zeroed() }
    }

    /// `acc += a * b` for a 64 x 16 tile `a` and a 16 x N tile `b` (bf16, both K-major in
    /// shared memory, as described by `a` and `b`), asynchronously: the accumulators must not
    /// be read or written until a `wait_group` covers this product.
    ///
    /// # Safety
    /// All 128 threads of the warpgroup call it with the same descriptors, which describe
    /// 1024-byte-aligned swizzled tiles inside shared memory; a `fence` came before the
    /// first product on these accumulators.
    unsafe fn mma_bf16(&mut self, a: u64, b: u64);

    /// `acc += a * b` for a 64 x 32 tile `a` and a 32 x N tile `b` of e4m3 bytes: the same
    /// 32 bytes of k a row as `mma_bf16`, twice the values. Same contract as `mma_bf16`.
    ///
    /// # Safety
    /// As `mma_bf16`.
    unsafe fn mma_e4m3(&mut self, a: u64, b: u64);

    /// `acc += a * b` for a 64 x 16 bf16 tile `a` held in registers and a 16 x N tile `b`
    /// K-major in shared memory: thread `t` of the warpgroup holds rows `16 (t / 32) + g`
    /// and `+ 8` (`g = t % 32 / 4`), elements `2 (t % 4)`, `+ 1` (words 0 and 1: row g, row
    /// g + 8) and `+ 8`, `+ 9` (words 2 and 3), the `mma.sync` A layout once per warp.
    ///
    /// # Safety
    /// As `mma_bf16` for `b`; and `a`'s registers must not be written until a `wait_group`
    /// covers this product (a `fence` orders their writes before it).
    unsafe fn mma_bf16_rs(&mut self, a: [u32; 4], b: u64);

    /// Tells the compiler that the accumulators may have changed here (a PTX comment that
    /// "writes" every register): placed after `wait_group`, it keeps reads of them from
    /// being scheduled before the wait, while the tensor cores may still be writing them.
    fn pin(&mut self);

    /// `f(j, [row g col c, row g col c + 1, row g + 8 col c, row g + 8 col c + 1])` for
    /// each 8-column block `j`, with constant indices: a loop the compiler kept rolled
    /// would index the accumulators, through local memory.
    fn for_each_block(&self, f: impl FnMut(usize, [f32; 4]));
}

/// `accumulators!(N, N / 2, [registers but the last], last, [8-column blocks])`: the product
/// spelled out for one N, every register named (inline assembly has no arrays).
macro_rules! accumulators {
    ($n:literal, $len:literal, [$($i:literal)*], $last:literal, [$($j:literal)*]) => {
        impl Accumulators for [f32; $len] {
            const N: usize = $n;

            #[inline(always)]
            unsafe fn mma_bf16(&mut self, a: u64, b: u64) {
                // SAFETY: the caller's guarantee.
                unsafe {
                    asm!(
                        "{{",
                        ".reg .pred p;",
                        "setp.ne.b32 p, {scale_d}, 0;",
                        concat!(
                            "wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.bf16.bf16 {{",
                            $("{", $i, "}, ",)*
                            "{", $last, "}}}, {a}, {b}, p, 1, 1, 0, 0;"
                        ),
                        "}}",
                        $(inout(reg32) self[$i],)*
                        inout(reg32) self[$last],
                        a = in(reg64) a,
                        b = in(reg64) b,
                        // 1: add to the accumulators (0 would overwrite them).
                        scale_d = in(reg32) 1u32,
                        options(nostack),
                    )
                }
            }

            #[inline(always)]
            unsafe fn mma_bf16_rs(&mut self, a: [u32; 4], b: u64) {
                // SAFETY: the caller's guarantee.
                unsafe {
                    asm!(
                        "{{",
                        ".reg .pred p;",
                        "setp.ne.b32 p, {scale_d}, 0;",
                        concat!(
                            "wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.bf16.bf16 {{",
                            $("{", $i, "}, ",)*
                            "{", $last, "}}}, {{{a0}, {a1}, {a2}, {a3}}}, {b}, p, 1, 1, 0;"
                        ),
                        "}}",
                        $(inout(reg32) self[$i],)*
                        inout(reg32) self[$last],
                        a0 = in(reg32) a[0],
                        a1 = in(reg32) a[1],
                        a2 = in(reg32) a[2],
                        a3 = in(reg32) a[3],
                        b = in(reg64) b,
                        scale_d = in(reg32) 1u32,
                        options(nostack),
                    )
                }
            }

            #[inline(always)]
            unsafe fn mma_e4m3(&mut self, a: u64, b: u64) {
                // SAFETY: the caller's guarantee.
                unsafe {
                    asm!(
                        "{{",
                        ".reg .pred p;",
                        "setp.ne.b32 p, {scale_d}, 0;",
                        // fp8 operands are K-major only: no transpose arguments.
                        concat!(
                            "wgmma.mma_async.sync.aligned.m64n", $n, "k32.f32.e4m3.e4m3 {{",
                            $("{", $i, "}, ",)*
                            "{", $last, "}}}, {a}, {b}, p, 1, 1;"
                        ),
                        "}}",
                        $(inout(reg32) self[$i],)*
                        inout(reg32) self[$last],
                        a = in(reg64) a,
                        b = in(reg64) b,
                        scale_d = in(reg32) 1u32,
                        options(nostack),
                    )
                }
            }

            #[inline(always)]
            fn pin(&mut self) {
                // SAFETY: a PTX comment naming the registers: no instruction at all.
                unsafe {
                    asm!(
                        concat!("// pinned:", $(" {", $i, "}",)* " {", $last, "}"),
                        $(inout(reg32) self[$i],)*
                        inout(reg32) self[$last],
                        options(nostack, preserves_flags),
                    )
                }
            }

            #[inline(always)]
            fn for_each_block(&self, mut f: impl FnMut(usize, [f32; 4])) {
                $(f($j, [self[4 * $j], self[4 * $j + 1], self[4 * $j + 2], self[4 * $j + 3]]);)*
            }
        }
    };
}

accumulators!(
    128, 64,
    [ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20 21 22 23
     24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47
     48 49 50 51 52 53 54 55 56 57 58 59 60 61 62],
    63,
    [ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15]
);

accumulators!(
    192, 96,
    [ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20 21 22 23
     24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47
     48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71
     72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94],
    95,
    [ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20 21 22 23]
);

accumulators!(
    224, 112,
    [  0   1   2   3   4   5   6   7   8   9  10  11  12  13  14  15  16  17  18  19  20  21  22  23
      24  25  26  27  28  29  30  31  32  33  34  35  36  37  38  39  40  41  42  43  44  45  46  47
      48  49  50  51  52  53  54  55  56  57  58  59  60  61  62  63  64  65  66  67  68  69  70  71
      72  73  74  75  76  77  78  79  80  81  82  83  84  85  86  87  88  89  90  91  92  93  94  95
      96  97  98  99 100 101 102 103 104 105 106 107 108 109 110],
    111,
    [ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27]
);

accumulators!(
    256, 128,
    [  0   1   2   3   4   5   6   7   8   9  10  11  12  13  14  15  16  17  18  19  20  21  22  23
      24  25  26  27  28  29  30  31  32  33  34  35  36  37  38  39  40  41  42  43  44  45  46  47
      48  49  50  51  52  53  54  55  56  57  58  59  60  61  62  63  64  65  66  67  68  69  70  71
      72  73  74  75  76  77  78  79  80  81  82  83  84  85  86  87  88  89  90  91  92  93  94  95
      96  97  98  99 100 101 102 103 104 105 106 107 108 109 110 111 112 113 114 115 116 117 118 119
     120 121 122 123 124 125 126],
    127,
    [ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31]
);
