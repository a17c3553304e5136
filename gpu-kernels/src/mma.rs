//! Tensor-core and asynchronous-copy instructions as thin wrappers over inline PTX, for the
//! prefill GEMM and the split attention: what CUDA C reaches through `mma.h`,
//! `cuda_pipeline.h` and `__cvta_*`.
//!
//! All of them exist since sm_80 (PTX 7.0), so the same PTX runs on Ampere, Ada and Hopper.
//! Shared-memory operands are 32-bit addresses in the shared window (`shared_addr`), as
//! the instructions want, not generic pointers.

use core::arch::asm;

/// The shared-window address of a generic pointer into shared memory
/// (`__cvta_generic_to_shared`). Shared memory is at most 228 KiB, so 32 bits hold it.
#[inline(always)]
// `cvta` converts the address; it reads and writes no memory, so `nomem` is right.
#[allow(clippy::pointers_in_nomem_asm_block)]
pub fn shared_addr<T>(p: *const T) -> u32 {
    let a: u64;
    // SAFETY: a register-only conversion; the callers pass pointers into shared memory.
    unsafe {
        asm!("cvta.to.shared.u64 {a}, {p};", a = out(reg64) a, p = in(reg64) p, options(pure, nomem, nostack))
    };
    a as u32
}

/// Starts copying 16 bytes from global `src` to shared `dst` without passing through
/// registers (`cp.async.cg`: cached in L2 only, not in L1: the data is used from shared
/// memory). With
/// `valid == false` nothing is read and the 16 bytes are zero-filled: the tile edges.
///
/// # Safety
/// `dst` is a 16-byte aligned shared address with 16 bytes of room; when `valid`, `src` is
/// 16-byte aligned and readable. The data is usable only after `cp_async_wait_all` and a
/// barrier.
#[inline(always)]
pub unsafe fn cp_async_16<T>(dst: u32, src: *const T, valid: bool) {
    // SAFETY: the caller's guarantee.
    unsafe { cp_async_16_part(dst, src, if valid { 16 } else { 0 }) };
}

/// As `cp_async_16`, reading only the first `bytes` (0 to 16) of the 16 at `src` and
/// zero-filling the rest: a copy at the end of a buffer whose length is not a multiple of 16.
///
/// # Safety
/// As `cp_async_16`, for `bytes` readable bytes at `src`.
#[inline(always)]
pub unsafe fn cp_async_16_part<T>(dst: u32, src: *const T, bytes: u32) {
    // SAFETY: the caller's guarantee.
    unsafe {
        asm!(
            "cp.async.cg.shared.global [{d}], [{s}], 16, {n};",
            d = in(reg32) dst,
            s = in(reg64) src,
            n = in(reg32) bytes,
            options(nostack),
        )
    };
}

/// Closes the group of `cp_async_16` copies issued so far by this thread.
#[inline(always)]
pub fn cp_async_commit() {
    // SAFETY: only marks a point in this thread's copy queue.
    unsafe { asm!("cp.async.commit_group;", options(nostack)) };
}

/// Waits until at most `PENDING` of this thread's most recent copy groups are still in
/// flight: the older ones have landed (other threads' copies need a barrier after it).
#[inline(always)]
pub fn cp_async_wait<const PENDING: u32>() {
    // SAFETY: a wait; memory effects are the copies the caller asked for.
    unsafe { asm!("cp.async.wait_group {n};", n = const PENDING, options(nostack)) };
}

/// `ldmatrix.x4`: the warp loads four 8 x 8 matrices of 16-bit values from shared memory,
/// each lane naming one row (lanes 0-7 the rows of matrix 0, 8-15 of matrix 1, ...). Word
/// `j` of the result holds, in lane `l`, row `l / 4`, columns `2 (l % 4)` and `+ 1` of
/// matrix `j`: exactly the register layout `mma` wants for its operands.
///
/// # Safety
/// All 32 lanes call it; `row` is a 16-byte aligned shared address with 16 bytes to read.
#[inline(always)]
pub unsafe fn ldmatrix_x4(row: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller's guarantee.
    unsafe {
        asm!(
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a,
            b = out(reg32) b,
            c = out(reg32) c,
            d = out(reg32) d,
            p = in(reg32) row,
            options(readonly, nostack),
        )
    };
    [a, b, c, d]
}

/// `ldmatrix.x4.trans`: as `ldmatrix_x4`, each 8 x 8 matrix transposed on the way: word `j`
/// holds, in lane `l`, rows `2 (l % 4)` and `+ 1` of column `l / 4` of matrix `j`. For an
/// operand stored with the reduction along rows (attention's values, `[key][dim]`), this is
/// the layout `mma`'s `b` wants.
///
/// # Safety
/// As `ldmatrix_x4`.
#[inline(always)]
pub unsafe fn ldmatrix_x4_trans(row: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller's guarantee.
    unsafe {
        asm!(
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a,
            b = out(reg32) b,
            c = out(reg32) c,
            d = out(reg32) d,
            p = in(reg32) row,
            options(readonly, nostack),
        )
    };
    [a, b, c, d]
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.<ty>.<ty>.f32`, one function per input type.
macro_rules! mma_16816 {
    ($($name:ident: $ty:literal;)*) => {$(
        #[doc = concat!("`acc += a * b` for a 16 x 16 tile of `a` (", $ty, ", row-major), a")]
        #[doc = concat!("16 x 8 tile of `b` (", $ty, ", column-major) and a 16 x 8 tile of f32")]
        /// accumulators, spread over the warp. In lane `l`, with `g = l / 4` and `t = l % 4`:
        /// `a` holds (row g, cols 2t, 2t+1), (row g+8, same), (row g, cols 2t+8, 2t+9), (row
        /// g+8, same); `b` holds (k 2t, 2t+1; col g) and (k 2t+8, 2t+9; col g); `acc` holds
        /// (row g, cols 2t, 2t+1) and (row g+8, same). Each pair's lower index is its low half.
        #[inline(always)]
        pub fn $name(acc: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
            // SAFETY: a register-only instruction; every lane of the warp executes it
            // (callers run it in warp-uniform control flow).
            unsafe {
                asm!(
                    concat!(
                        "mma.sync.aligned.m16n8k16.row.col.f32.", $ty, ".", $ty, ".f32 ",
                        "{{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, ",
                        "{{{d0}, {d1}, {d2}, {d3}}};"
                    ),
                    d0 = inout(reg32) acc[0],
                    d1 = inout(reg32) acc[1],
                    d2 = inout(reg32) acc[2],
                    d3 = inout(reg32) acc[3],
                    a0 = in(reg32) a[0],
                    a1 = in(reg32) a[1],
                    a2 = in(reg32) a[2],
                    a3 = in(reg32) a[3],
                    b0 = in(reg32) b[0],
                    b1 = in(reg32) b[1],
                    options(pure, nomem, nostack),
                )
            };
        }
    )*};
}

mma_16816! {
    mma_bf16_16816: "bf16";
    mma_f16_16816: "f16";
}

/// `*p += v` in global memory, atomically, with no result returned (`red.global.add.f32`).
///
/// # Safety
/// `p` is a valid, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn red_add_f32(p: *mut f32, v: f32) {
    // SAFETY: the caller's guarantee.
    unsafe {
        asm!("red.global.add.f32 [{p}], {v};", p = in(reg64) p, v = in(reg32) v, options(nostack))
    };
}

/// A 4-byte store into shared memory (`st.shared.u32`).
///
/// # Safety
/// As `st_shared_v4`, for 4 bytes at a 4-byte aligned address.
#[inline(always)]
pub unsafe fn st_shared_u32(addr: u32, v: u32) {
    // SAFETY: the caller's guarantee.
    unsafe {
        asm!("st.shared.u32 [{p}], {v};", p = in(reg32) addr, v = in(reg32) v, options(nostack))
    };
}

/// A 16-byte store of four registers into shared memory (`st.shared.v4.u32`).
///
/// # Safety
/// `addr` is a 16-byte aligned shared address with 16 bytes to write, which no other thread
/// reads or writes before the block's next barrier.
#[inline(always)]
pub unsafe fn st_shared_v4(addr: u32, v: [u32; 4]) {
    // SAFETY: the caller's guarantee.
    unsafe {
        asm!(
            "st.shared.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
            p = in(reg32) addr,
            a = in(reg32) v[0],
            b = in(reg32) v[1],
            c = in(reg32) v[2],
            d = in(reg32) v[3],
            options(nostack),
        )
    };
}

/// A 4-byte load from shared memory (`ld.shared.u32`).
///
/// # Safety
/// `addr` is a 4-byte aligned shared address with 4 bytes to read.
#[inline(always)]
pub unsafe fn ld_shared_u32(addr: u32) -> u32 {
    let v: u32;
    // SAFETY: the caller's guarantee.
    unsafe {
        asm!("ld.shared.u32 {v}, [{p}];", v = out(reg32) v, p = in(reg32) addr, options(readonly, nostack))
    };
    v
}

/// A 16-byte load from shared memory into four registers (`ld.shared.v4.u32`).
///
/// # Safety
/// `addr` is a 16-byte aligned shared address with 16 bytes to read.
#[inline(always)]
pub unsafe fn ld_shared_v4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller's guarantee.
    unsafe {
        asm!(
            "ld.shared.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a,
            b = out(reg32) b,
            c = out(reg32) c,
            d = out(reg32) d,
            p = in(reg32) addr,
            options(readonly, nostack),
        )
    };
    [a, b, c, d]
}

/// `acc += a * b` in integers (`mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32`): a 16 x 16
/// tile of `a` (i8, row-major), a 16 x 8 tile of `b` (i8, column-major) and a 16 x 8 tile of
/// i32 sums, spread over the warp. In lane `l`, with `g = l / 4` and `t = l % 4`: `a[0]`
/// holds row g, k `4t .. 4t + 4` (a byte each, the lowest first), `a[1]` row g + 8, the same
/// k; `b` holds k `4t .. 4t + 4` of column g; `acc` holds (row g, cols 2t, 2t + 1) and (row
/// g + 8, the same). The quantized GEMV of several tokens (`gemv_mma.rs`) is made of it.
#[inline(always)]
pub fn mma_s8_16816(acc: &mut [i32; 4], a: [u32; 2], b: u32) {
    // SAFETY: a register-only instruction; every lane of the warp executes it (callers run
    // it in warp-uniform control flow).
    unsafe {
        asm!(
            "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}}}, {{{b0}}}, {{{d0}, {d1}, {d2}, {d3}}};",
            d0 = inout(reg32) acc[0],
            d1 = inout(reg32) acc[1],
            d2 = inout(reg32) acc[2],
            d3 = inout(reg32) acc[3],
            a0 = in(reg32) a[0],
            a1 = in(reg32) a[1],
            b0 = in(reg32) b,
            options(pure, nomem, nostack),
        )
    };
}
