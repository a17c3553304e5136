//! A barrier for the whole grid: the building block of a persistent kernel, one launch that
//! runs what would be many kernels, its phases separated by this wait where a decode step
//! has a kernel boundary. `read_phases_u32` (`read_phases.rs`) uses it, and `rustle bench
//! --boundaries` prices the two ways against each other (H200:
//! docs/lessons.md#launches-graphs-and-pdl). A
//! measurement experiment: built only with the `probes` feature.
//!
//! Each block's thread 0 adds one to a counter in global memory and reads it until it
//! reaches the barrier's target, `k * gridDim.x` at the launch's k-th barrier. The counter
//! only grows: no block resets it, and no block can pass a later barrier on an earlier one's
//! count. The fences around the count make every write before the barrier, by any thread of
//! any block, visible to every thread after it: the release and acquire that CUDA's
//! `grid.sync()` makes.

use core::arch::asm;

use crate::device::{sync_threads, thread_idx_x};

/// Every block of the grid waits here until all have arrived.
///
/// # Safety
/// Every thread of every block calls it, as many times; all of the grid's blocks are on the
/// GPU at once (a cooperative launch guarantees it; otherwise the grid can hang); `arrived`
/// is global memory that the launch's barriers alone use, zero when the launch starts;
/// `target` is `k * gridDim.x` at the k-th call.
#[inline(always)]
pub unsafe fn grid_barrier(arrived: *mut u32, target: u32) {
    // SAFETY: every thread reaches both block barriers (the caller's guarantee); `arrived`
    // is global memory (the caller's).
    unsafe {
        // The block's writes are thread 0's to publish once all are made.
        sync_threads();
        if thread_idx_x() == 0 {
            asm!(
                "fence.acq_rel.gpu;",
                "red.relaxed.gpu.global.add.u32 [{p}], 1;",
                p = in(reg64) arrived,
                options(nostack),
            );
            loop {
                let seen: u32;
                // Not `pure`: the load must be made again on each turn of the loop.
                asm!(
                    "ld.relaxed.gpu.global.u32 {v}, [{p}];",
                    v = out(reg32) seen,
                    p = in(reg64) arrived,
                    options(nostack),
                );
                if seen >= target {
                    break;
                }
            }
            // Every other block's writes, published before its count, are now visible.
            asm!("fence.acq_rel.gpu;", options(nostack));
        }
        sync_threads();
    }
}
