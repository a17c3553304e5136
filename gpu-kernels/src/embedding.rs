//! Embedding gather: each token's row of the embedding table, widened from bf16 to f32.

use crate::device::{bf16_to_f32, block_dim_x, block_idx_x, block_idx_y, thread_idx_x};

/// `out[t, i] = table[tokens[t], i]`.
///
/// - `out`: `[n, dim]` f32
/// - `table`: `[vocab, dim]` bf16 (as `u16` bits)
/// - `tokens`: `[n]` u32
///
/// Thread mapping: grid `(ceil(dim / blockDim.x), n)`; `blockIdx.y` is the token, each
/// thread one element of its row (consecutive threads, consecutive addresses).
///
/// PRECONDITIONS: every `tokens[t] < vocab`; `out` holds `n * dim` floats.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn embedding_bf16(
    out: *mut f32,
    table: *const u16,
    tokens: *const u32,
    dim: u32,
) {
    crate::device::wait_for_previous_kernel();
    let (t, dim) = (block_idx_y(), dim as usize);
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i < dim {
        // SAFETY: t < n (grid), i < dim, tokens[t] < vocab (preconditions).
        unsafe {
            let row = *tokens.add(t) as usize;
            *out.add(t * dim + i) = bf16_to_f32(*table.add(row * dim + i));
        }
    }
}
