//! Synthetic weights made on the device: benchmarks need a model of a named shape without a
//! download or a trip through host memory.

use crate::device::{block_dim_x, global_idx_x, grid_dim_x};

/// A stateless 32-bit hash of `(seed, i)` (the "lowbias32" mixer): every element gets its own
/// pseudo-random value, whatever the thread layout, so the CPU twin reproduces it exactly.
#[inline(always)]
pub fn hash(seed: u32, i: u32) -> u32 {
    let mut x = i ^ seed.wrapping_mul(0x9e37_79b9);
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// `out[i] = bf16(scale * u)` with `u` uniform in [-1, 1) from `hash(seed, i)`.
///
/// - `out`: `[n]` bf16 (as `u16` bits), rounded to nearest even
///
/// Thread mapping: a grid-stride loop, so any grid covers any `n`.
///
/// # Safety
/// `out` holds `n` elements.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn fill_random_bf16(out: *mut u16, n: u64, seed: u32, scale: f32) {
    crate::device::wait_for_previous_kernel();
    let mut i = global_idx_x() as u64;
    let stride = (grid_dim_x() * block_dim_x()) as u64;
    while i < n {
        let u = (hash(seed, i as u32) >> 8) as f32 * (1.0 / 8_388_608.0) - 1.0; // 24 bits -> [-1, 1)
        let bits = (scale * u).to_bits();
        // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
        let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
        // SAFETY: i < n.
        unsafe { *out.add(i as usize) = rounded as u16 };
        i += stride;
    }
}

/// The memory-read probe: `partial[b] = wrapping sum of the words block b read`, every word
/// of `data` read once with 16-byte non-coherent loads, four in flight per thread.
///
/// - `data`: `[n_vec4 * 4]` u32, 16-byte aligned
/// - `partial`: `[gridDim.x]` u32
///
/// Thread mapping: a grid-stride loop over 16-byte vectors, unrolled by four; the sum exists
/// only so the loads cannot be optimised away.
///
/// PRECONDITIONS: `blockDim.x == 256`.
///
/// # Safety
/// `data` holds `n_vec4` 16-byte vectors; `partial` holds `gridDim.x` words.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn read_probe_u32(partial: *mut u32, data: *const u32, n_vec4: u64) {
    crate::device::wait_for_previous_kernel();
    // SAFETY: data holds n_vec4 vectors; partial a word per block; 256 threads with 256 words
    // of shared memory (the preconditions).
    unsafe { store_block_sum(partial, sum_vectors(data, n_vec4)) }
}

/// The wrapping sum of the words of the 16-byte vectors this thread takes of `data`'s
/// `n_vec4`: a grid-stride loop, unrolled by four so that four loads are in flight.
///
/// # Safety
/// `data` holds `n_vec4` 16-byte vectors, 16-byte aligned.
#[inline(always)]
pub(crate) unsafe fn sum_vectors(data: *const u32, n_vec4: u64) -> u32 {
    use crate::device::ld_nc_v4;
    let stride = (grid_dim_x() * block_dim_x()) as u64;
    let mut i = global_idx_x() as u64;
    let mut sum = 0u32;
    let fold = |v: [u32; 4]| {
        v[0].wrapping_add(v[1])
            .wrapping_add(v[2])
            .wrapping_add(v[3])
    };
    while i + 3 * stride < n_vec4 {
        // SAFETY: all four indices are below n_vec4.
        let (a, b, c, d) = unsafe {
            (
                ld_nc_v4(data.add(4 * i as usize)),
                ld_nc_v4(data.add(4 * (i + stride) as usize)),
                ld_nc_v4(data.add(4 * (i + 2 * stride) as usize)),
                ld_nc_v4(data.add(4 * (i + 3 * stride) as usize)),
            )
        };
        sum = sum
            .wrapping_add(fold(a))
            .wrapping_add(fold(b))
            .wrapping_add(fold(c))
            .wrapping_add(fold(d));
        i += 4 * stride;
    }
    while i < n_vec4 {
        // SAFETY: i < n_vec4.
        sum = sum.wrapping_add(fold(unsafe { ld_nc_v4(data.add(4 * i as usize)) }));
        i += stride;
    }
    sum
}

/// `partial[block] = ` the block's threads' `sum`s added (in shared memory, 256 words).
///
/// # Safety
/// Every thread of a block of 256 calls it, with 256 words of shared memory; `partial`
/// holds a word per block.
#[inline(always)]
pub(crate) unsafe fn store_block_sum(partial: *mut u32, sum: u32) {
    use crate::device::{block_idx_x, dynamic_shared, sync_threads, thread_idx_x};
    let s = dynamic_shared::<u32>();
    // SAFETY: the caller's; every thread reaches the barrier.
    unsafe {
        *s.add(thread_idx_x()) = sum;
        sync_threads();
        if thread_idx_x() == 0 {
            let mut total = 0u32;
            for t in 0..256 {
                total = total.wrapping_add(*s.add(t));
            }
            *partial.add(block_idx_x()) = total;
        }
    }
}
