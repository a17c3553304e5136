//! The read probe in phases as a persistent decode kernel would stream its weights: each
//! block's tiles copied into shared memory by the copy engine (`bulk_copy.rs`), `stages` of
//! them on their way at once, and on their way across the grid barriers between phases.
//! `rustle bench --boundaries` prices a barrier this way against `read_phases_u32`'s
//! (docs/lessons.md#launches-graphs-and-pdl). A measurement experiment: built only with the `probes` feature.
//!
//! On the H200 a grid barrier was found no cheaper than a kernel boundary where each thread loads
//! its own words: the memory idles while the grid drains into the barrier and until the
//! first loads after it come back, and asking L2 for those first loads early did not help.
//! Here the copies of a phase's first tiles leave before the barrier that precedes it (the
//! data depends on no phase, as a decode step's weights depend on none), so the memory
//! keeps working through the wait. What the barrier still orders is a phase's result, which
//! the next phase reads, as a decode step's next matrix reads the vector the last one made:
//! each block stores its phase's sum, and after the barrier reads its neighbours'.
//!
//! Measured on the H200 and the H100 (docs/lessons.md#launches-graphs-and-pdl), the wait was
//! not free. With 192 KiB an SM on its
//! way through every barrier, a barrier still cost 2.3-2.9 us over the same tiles read in
//! one phase, about what it costs with nothing to read, and more than a kernel boundary in
//! a CUDA graph; whichever thread asked for the copies.

use crate::block_parts::Shared;
use crate::bulk_copy::{
    barrier_init, bulk_copy_to_shared, expect_bytes, fence_barrier_init, wait_phase,
};
use crate::device::{
    WARP, block_idx_x, dynamic_shared, grid_dim_x, shfl_xor_u32, sync_threads, thread_idx_x,
    wait_for_previous_kernel,
};
use crate::grid_barrier::grid_barrier;
use crate::mma::{ld_shared_v4, shared_addr, st_shared_u32};
use crate::tiles::{STAGED_BARRIER_BYTES, STAGED_THREADS};

/// `n_phases` phases of tiles of `tile_bytes`: phase p is tiles `phase_starts[p] ..
/// phase_starts[p + 1]` of `data`. Block b takes tiles `b, b + grid, ...` of each phase,
/// summing their words. Phase p's result is `sums[p][b]`, block b's wrapping sum of its
/// words of phase p (for every phase but the last); after the barrier that ends phase p,
/// thread t of block b (`t < min(256, grid)`) adds `sums[p][(b + 1 + t) % grid]` to what it
/// read. `partial[b]` is the wrapping sum of both over all phases.
///
/// - `partial`: `[gridDim.x]` u32
/// - `sums`: `[n_phases - 1][gridDim.x]` u32
/// - `arrived`: one u32, zero at the launch: the barriers' counter (`grid_barrier`)
/// - `data`: `[phase_starts[n_phases] * tile_bytes]` bytes, 16-byte aligned
/// - `phase_starts`: `[n_phases + 1]` u32, not decreasing
///
/// Shared memory: `[stages]` barriers in the first `STAGED_BARRIER_BYTES`, then `[stages]`
/// slots of `tile_bytes`, then a word a warp (`staged_shared_bytes`).
///
/// Thread mapping: thread `producer` keeps the block's next `stages` tiles on their way
/// (fill i is the block's i-th tile, counted through the phases, `Tiles`); every thread
/// sums the 16-byte vectors `t, t + 256, ...` of each landed tile, and the block frees its
/// slot together. Thread 0 also makes the block's arrivals at the grid barrier, whose
/// fences might wait for the copies it has in flight: on an H100, a producer of 0 and one in
/// another warp cost the same (within 0.14 us).
///
/// PRECONDITIONS: `blockDim.x == STAGED_THREADS`; `producer < STAGED_THREADS`; `tile_bytes`
/// a multiple of 16 below 2^20; `1 <= stages <= STAGED_BARRIER_BYTES / 8`; the launch's
/// shared memory `staged_shared_bytes(stages, tile_bytes)`; every block of the grid on the
/// GPU at once (a cooperative launch).
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "gpu-kernel" fn read_phases_staged_u32(
    partial: *mut u32,
    sums: *mut u32,
    arrived: *mut u32,
    data: *const u8,
    phase_starts: *const u32,
    tile_bytes: u32,
    n_phases: u32,
    stages: u32,
    producer: u32,
) {
    let producer = producer as usize;
    let (block, grid, t) = (block_idx_x(), grid_dim_x(), thread_idx_x());
    let (tile_bytes, n_phases, stages) = (tile_bytes as usize, n_phases as usize, stages as usize);
    let base = shared_addr(dynamic_shared::<u8>());
    let bar = |i: usize| base + (8 * (i % stages)) as u32;
    let slot = |i: usize| base + (STAGED_BARRIER_BYTES + i % stages * tile_bytes) as u32;
    let warp_words = base + (STAGED_BARRIER_BYTES + stages * tile_bytes) as u32;
    // SAFETY: the starts hold n_phases + 1 words (the preconditions).
    let tiles = unsafe { Tiles::new(phase_starts, n_phases) };
    // The producer thread asks for fill i, `tile` of data.
    let request = |i: usize, tile: usize| {
        // SAFETY: the tile is inside data, 16-byte aligned, whole 16-byte pieces; the slot
        // is free (its last readers passed the block barrier before this request); the
        // barrier is armed with the tile's bytes first.
        unsafe {
            expect_bytes(bar(i), tile_bytes as u32);
            bulk_copy_to_shared(
                slot(i),
                data.add(tile * tile_bytes),
                tile_bytes as u32,
                bar(i),
            );
        }
    };
    let mut asked = tiles;
    if t == 0 {
        for i in 0..stages {
            // SAFETY: barrier i is inside the barriers' bytes (stages is at most their
            // number); no thread uses it before the block barrier below.
            unsafe { barrier_init(base + 8 * i as u32, 1) };
        }
        fence_barrier_init();
    }
    // SAFETY: every thread of the block reaches this barrier.
    unsafe { sync_threads() };
    if t == producer {
        for i in 0..stages {
            match asked.next(block, grid) {
                Some(tile) => request(i, tile),
                None => break,
            }
        }
    }
    wait_for_previous_kernel();
    let mut total = 0u32;
    let mut i = 0;
    for p in 0..n_phases {
        if p > 0 {
            // SAFETY (both): every thread of every block reaches the barrier, as many
            // times (the preconditions); the neighbour's sum is inside sums, stored before
            // its block arrived, and not cached on the way (a volatile load, not `.nc`).
            unsafe {
                grid_barrier(arrived, (p * grid) as u32);
                if t < grid.min(STAGED_THREADS) {
                    let from = sums.add((p - 1) * grid + (block + 1 + t) % grid);
                    total = total.wrapping_add(core::ptr::read_volatile(from));
                }
            }
        }
        let mut own = 0u32;
        for _ in 0..tiles.count(p, block, grid) {
            // SAFETY: barrier i % stages was initialized; its (i / stages)-th fill was
            // asked for.
            unsafe { wait_phase(bar(i), (i / stages % 2) as u32) };
            let mut v = t;
            while v < tile_bytes / 16 {
                // SAFETY: vector v is inside the slot, whose bytes have landed.
                let w = unsafe { ld_shared_v4(slot(i) + 16 * v as u32) };
                own = own
                    .wrapping_add(w[0])
                    .wrapping_add(w[1])
                    .wrapping_add(w[2])
                    .wrapping_add(w[3]);
                v += STAGED_THREADS;
            }
            // Every thread is done with the slot: it takes the fill `stages` on, which may
            // be a later phase's (its copy then runs through the barriers between).
            // SAFETY: every thread of the block reaches this barrier, as many times.
            unsafe { sync_threads() };
            if t == producer
                && let Some(tile) = asked.next(block, grid)
            {
                request(i + stages, tile);
            }
            i += 1;
        }
        total = total.wrapping_add(own);
        if p + 1 < n_phases {
            // SAFETY: every thread calls it; the warps' words are the launch's last bytes,
            // which nothing else uses, and the last call's reader (thread 0) passed a block
            // barrier (inside the grid barrier) since.
            let own = unsafe { block_sum_u32(own, warp_words) };
            if t == 0 {
                // SAFETY: p < n_phases - 1 and block < grid: inside sums.
                unsafe { core::ptr::write_volatile(sums.add(p * grid + block), own) };
            }
        }
    }
    // SAFETY: as above; the last grid barrier, or none, passed since the last call.
    let total = unsafe { block_sum_u32(total, warp_words) };
    if t == 0 {
        // SAFETY: block < grid: inside partial.
        unsafe { *partial.add(block) = total };
    }
}

/// A block's tiles through the phases, in the order it reads them: of phase p, tiles
/// `block, block + grid, ...` below the phase's count, from `phase_starts[p]` on. As a
/// cursor (`next`), where the block's next copy starts.
#[derive(Clone, Copy)]
struct Tiles {
    starts: *const u32,
    n_phases: usize,
    /// The cursor: the phase of the next tile, and how many of the block's tiles of that
    /// phase come before it.
    phase: usize,
    taken: usize,
}

impl Tiles {
    /// # Safety
    /// `starts` holds `n_phases + 1` words.
    #[inline(always)]
    unsafe fn new(starts: *const u32, n_phases: usize) -> Tiles {
        Tiles {
            starts,
            n_phases,
            phase: 0,
            taken: 0,
        }
    }

    /// The first tile of phase `p` and the phase's tiles.
    #[inline(always)]
    fn phase(&self, p: usize) -> (usize, usize) {
        // SAFETY: p < n_phases, so p + 1 is inside the starts (`new`'s guarantee).
        let (from, to) = unsafe { (*self.starts.add(p), *self.starts.add(p + 1)) };
        (from as usize, to.saturating_sub(from) as usize)
    }

    /// How many of phase p's tiles the block takes.
    #[inline(always)]
    fn count(&self, p: usize, block: usize, grid: usize) -> usize {
        let (_, n) = self.phase(p);
        if block < n {
            (n - block).div_ceil(grid)
        } else {
            0
        }
    }

    /// The block's next tile (an index into data), or none after its last.
    #[inline(always)]
    fn next(&mut self, block: usize, grid: usize) -> Option<usize> {
        while self.phase < self.n_phases {
            let (from, n) = self.phase(self.phase);
            let tile = block + self.taken * grid;
            if tile < n {
                self.taken += 1;
                return Some(from + tile);
            }
            (self.phase, self.taken) = (self.phase + 1, 0);
        }
        None
    }
}

/// The wrapping sum of `v` over the block of `STAGED_THREADS`, to thread 0 (the other
/// threads get their warp's). Each warp's lane 0 leaves its warp's sum at `warp_words`.
///
/// # Safety
/// Every thread of the block calls it; `warp_words` is a shared address of a word a warp
/// that nothing else uses, and thread 0 has passed a block barrier since its last read.
#[inline(always)]
unsafe fn block_sum_u32(mut v: u32, warp_words: u32) -> u32 {
    let (lane, warp) = (thread_idx_x() % WARP, thread_idx_x() / WARP);
    let mut mask = 16;
    while mask > 0 {
        v = v.wrapping_add(shfl_xor_u32(v, mask));
        mask >>= 1;
    }
    // SAFETY: the caller's; every thread reaches the block barrier.
    unsafe {
        if lane == 0 {
            st_shared_u32(warp_words + 4 * warp as u32, v);
        }
        sync_threads();
        if thread_idx_x() == 0 {
            v = 0;
            for w in 0..STAGED_THREADS / WARP {
                v = v.wrapping_add(Shared(warp_words).u32(4 * w));
            }
        }
    }
    v
}
