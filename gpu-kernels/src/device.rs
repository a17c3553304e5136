//! What `cuda_std` would give a kernel: thread and block indices, as thin wrappers over
//! `core::arch::nvptx`. Later kernels add warp shuffles, fast `exp` and 16-byte loads here.

use core::arch::nvptx;

/// `threadIdx.x`: this thread's index inside its block.
#[inline(always)]
pub fn thread_idx_x() -> usize {
    // SAFETY: reads a special register; always defined inside a kernel.
    unsafe { nvptx::_thread_idx_x() as usize }
}

/// `blockIdx.x`: this block's index inside the grid.
#[inline(always)]
pub fn block_idx_x() -> usize {
    // SAFETY: reads a special register; always defined inside a kernel.
    unsafe { nvptx::_block_idx_x() as usize }
}

/// `blockDim.x`: threads per block.
#[inline(always)]
pub fn block_dim_x() -> usize {
    // SAFETY: reads a special register; always defined inside a kernel.
    unsafe { nvptx::_block_dim_x() as usize }
}

/// `blockIdx.x * blockDim.x + threadIdx.x`: this thread's index in a one-dimensional grid.
#[inline(always)]
pub fn global_idx_x() -> usize {
    block_idx_x() * block_dim_x() + thread_idx_x()
}
