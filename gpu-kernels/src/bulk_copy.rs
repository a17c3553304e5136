//! Hopper's bulk copies (the Tensor Memory Accelerator without a tensor map) and the
//! transaction barriers that say when one has landed: what CUDA C reaches through
//! `cuda::memcpy_async` with a `cuda::barrier`, or CUTLASS through `SM90_BULK_COPY_G2S` and
//! `ClusterTransactionBarrier`.
//!
//! One thread asks the copy engine for a whole run of bytes (`bulk_copy_to_shared`): no
//! registers hold them on the way and no thread issues a load per 16 bytes. The copy counts
//! its bytes off an `mbarrier` in shared memory, which a thread armed with the bytes to
//! expect (`expect_bytes`); the barrier's phase flips when they have all arrived, and
//! `wait_phase` waits for that flip. A barrier is used again and again: its phases alternate
//! 0, 1, 0, ..., so a consumer of its n-th fill waits for parity `n % 2`.
//!
//! sm_90 and PTX 8.0: built for sm_90a only (see `build.rs`).

use core::arch::asm;

/// Makes `bar` (an 8-byte aligned shared address) a barrier that completes a phase when
/// `count` threads have arrived and its expected bytes have landed.
///
/// # Safety
/// One thread initializes each barrier, before any use; the block syncs (and
/// `fence_barrier_init` runs) before another thread or the copy engine touches it.
#[inline(always)]
pub unsafe fn barrier_init(bar: u32, count: u32) {
    // SAFETY: the caller's guarantee.
    unsafe {
        asm!("mbarrier.init.shared::cta.b64 [{b}], {c};", b = in(reg32) bar, c = in(reg32) count,
            options(nostack))
    };
}

/// Makes the barriers this thread initialized visible to the copy engine (the async proxy).
#[inline(always)]
pub fn fence_barrier_init() {
    // SAFETY: a fence; it orders this thread's earlier barrier initializations.
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) };
}

/// Arrives at `bar` and adds `bytes` to what its current phase waits for: the arming of one
/// fill, before (or with) the copies that will count those bytes off.
///
/// # Safety
/// `bar` is an initialized barrier; `bytes` is below 2^20.
#[inline(always)]
pub unsafe fn expect_bytes(bar: u32, bytes: u32) {
    // SAFETY: the caller's guarantee.
    unsafe {
        asm!(
            "mbarrier.arrive.expect_tx.shared::cta.b64 _, [{b}], {n};",
            b = in(reg32) bar,
            n = in(reg32) bytes,
            options(nostack),
        )
    };
}

/// Copies `bytes` from global `src` to shared `dst` on the copy engine, counting them off
/// `bar`'s current phase as they land.
///
/// # Safety
/// `src` and `dst` 16-byte aligned, `bytes` a multiple of 16; `src` readable and not written
/// during the copy; nothing reads or writes `dst` until the phase completes; `bar` armed
/// with these bytes (`expect_bytes`).
#[inline(always)]
pub unsafe fn bulk_copy_to_shared(dst: u32, src: *const u8, bytes: u32, bar: u32) {
    // SAFETY: the caller's guarantee.
    unsafe {
        asm!(
            concat!(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
                " [{d}], [{s}], {n}, [{b}];"
            ),
            d = in(reg32) dst,
            s = in(reg64) src,
            n = in(reg32) bytes,
            b = in(reg32) bar,
            options(nostack),
        )
    };
}

/// Waits until the phase of `bar` with parity `parity` has completed: its expected bytes
/// have landed, and are visible to this thread.
///
/// # Safety
/// `bar` is an initialized barrier.
#[inline(always)]
pub unsafe fn wait_phase(bar: u32, parity: u32) {
    loop {
        let done: u32;
        // SAFETY: the caller's guarantee. Not `pure` or `nomem`: the loads of the landed
        // bytes must stay after it.
        unsafe {
            asm!(
                concat!(
                    "{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {ph};",
                    " selp.u32 {d}, 1, 0, p; }}"
                ),
                b = in(reg32) bar,
                ph = in(reg32) parity,
                d = out(reg32) done,
                options(nostack),
            )
        };
        if done != 0 {
            return;
        }
    }
}

/// Copies the box at element `(c0, c1)` (column, row) of the 2-D tensor `map` describes
/// from global memory to shared `dst`, laid out as the map says (its swizzle), counting its
/// bytes off `bar`'s current phase as they land: the Tensor Memory Accelerator with a tensor
/// map (CUTLASS's `SM90_TMA_LOAD_2D`). Parts of the box outside the tensor land as zeros and
/// still count.
///
/// # Safety
/// `map` points to a 64-byte aligned `CUtensorMap` in global memory that no one writes
/// while kernels read it; `dst` is aligned as the map's swizzle needs (1024 bytes for
/// 128-byte swizzling) with room for the box; nothing reads or writes `dst` until the phase
/// completes; `bar` armed with the box's bytes (`expect_bytes`).
#[inline(always)]
pub unsafe fn tensor_copy_2d(dst: u32, map: *const u8, c0: u32, c1: u32, bar: u32) {
    // SAFETY: the caller's guarantee.
    unsafe {
        asm!(
            concat!(
                "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
                " [{d}], [{m}, {{{c0}, {c1}}}], [{b}];"
            ),
            d = in(reg32) dst,
            m = in(reg64) map,
            c0 = in(reg32) c0,
            c1 = in(reg32) c1,
            b = in(reg32) bar,
            options(nostack),
        )
    };
}

/// Arrives at `bar` (one of its `count` arrivals a phase), releasing what this thread did
/// before to whoever waits for the phase.
///
/// # Safety
/// `bar` is an initialized barrier.
#[inline(always)]
pub unsafe fn arrive(bar: u32) {
    // SAFETY: the caller's guarantee.
    unsafe {
        asm!("mbarrier.arrive.shared::cta.b64 _, [{b}];", b = in(reg32) bar, options(nostack))
    };
}
