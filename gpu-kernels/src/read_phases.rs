//! A measurement experiment, built only with the `probes` feature (`rustle bench
//! --boundaries`): the read probe of `fill.rs` in phases, a barrier for the whole grid
//! (`grid_barrier`) between them, as a persistent decode kernel would separate its
//! matrices. Such a barrier measured no cheaper than a kernel boundary in a CUDA graph
//! (docs/lessons.md#launches-graphs-and-pdl).

use crate::device::{block_dim_x, global_idx_x, grid_dim_x};
use crate::fill::{store_block_sum, sum_vectors};

/// The read probe in phases, a barrier for the whole grid between them: a persistent
/// kernel's shape, which `rustle bench --boundaries` prices against the same phases
/// launched as kernels. Phase p reads the `phase_vec4` 16-byte vectors from vector `p *
/// phase_stride` as `read_probe_u32` reads its data; `partial[b]` is the wrapping sum of
/// every word block b read in all of them. Before the barrier after phase p, each thread
/// asks L2 for its first `ahead` vectors of phase p + 1: the weights a persistent decode
/// kernel reads depend on no phase, so their loads need not wait for the barrier.
///
/// - `partial`: `[gridDim.x]` u32
/// - `arrived`: one u32, zero at the launch: the barriers' counter (`grid_barrier`)
/// - `data`: `(n_phases - 1) * phase_stride + phase_vec4` 16-byte vectors, 16-byte aligned
///
/// PRECONDITIONS: `blockDim.x == 256` with 256 words of shared memory; every block of the
/// grid on the GPU at once (a cooperative launch).
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn read_phases_u32(
    partial: *mut u32,
    arrived: *mut u32,
    data: *const u32,
    phase_vec4: u64,
    phase_stride: u64,
    n_phases: u32,
    ahead: u32,
) {
    use crate::device::prefetch_l2;
    use crate::grid_barrier::grid_barrier;
    crate::device::wait_for_previous_kernel();
    let stride = (grid_dim_x() * block_dim_x()) as u64;
    let mut sum = 0u32;
    for p in 0..n_phases as u64 {
        // SAFETY (all): every phase's vectors are inside data; arrived and the grid as the
        // preconditions list; every thread takes the same turns of this loop.
        unsafe {
            sum = sum.wrapping_add(sum_vectors(
                data.add((4 * p * phase_stride) as usize),
                phase_vec4,
            ));
            if p + 1 < n_phases as u64 {
                let next = data.add((4 * (p + 1) * phase_stride) as usize);
                let mut i = global_idx_x() as u64;
                for _ in 0..ahead {
                    if i < phase_vec4 {
                        prefetch_l2(next.add(4 * i as usize));
                    }
                    i += stride;
                }
                grid_barrier(arrived, ((p + 1) as usize * grid_dim_x()) as u32);
            }
        }
    }
    // SAFETY: partial a word per block; 256 threads with 256 words of shared memory.
    unsafe { store_block_sum(partial, sum) }
}
