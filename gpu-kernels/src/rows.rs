//! A mixture of experts' row moves: the tokens that chose an expert gathered into rows of
//! their own (so that the expert's matmuls read them as one batch), and the expert's outputs
//! added back to those tokens, each times the router's weight.

use crate::device::{block_dim_x, block_idx_x, block_idx_y, thread_idx_x};

/// `out[i, :] = x[index[i], :]` for each of the `m` rows of the grid.
///
/// - `out`: `[m, dim]` f32, the gathered rows.
/// - `x`: `[n, dim]` f32, every token's row.
/// - `index`: `[m]` u32, the token of each gathered row, each below `n`.
///
/// Thread mapping: grid `(ceil(dim / block), m)`: block `(c, i)` copies columns
/// `c * block ..` of row `i`, a thread a column.
///
/// # Safety
/// `out` holds `m * dim` floats, `x` `n * dim`, `index` `m` values below `n`, with `m` the
/// grid's y extent; `out` and `x` do not overlap.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn gather_rows_f32(
    out: *mut f32,
    x: *const f32,
    index: *const u32,
    dim: u32,
) {
    crate::device::wait_for_previous_kernel();
    let (i, dim) = (block_idx_y(), dim as usize);
    let col = block_idx_x() * block_dim_x() + thread_idx_x();
    if col < dim {
        // SAFETY: i < m and index[i] < n (preconditions); col < dim.
        unsafe {
            let token = *index.add(i) as usize;
            *out.add(i * dim + col) = *x.add(token * dim + col);
        }
    }
}

/// `out[index[i], :] += weight[i] * rows[i, :]` for each of the `m` rows of the grid.
///
/// - `out`: `[n, dim]` f32, every token's sum of its experts, updated in place.
/// - `rows`: `[m, dim]` f32, one expert's output for the tokens that chose it.
/// - `index`: `[m]` u32, the token of each row, distinct (a token chooses an expert once),
///   so no two threads add to one element.
/// - `weight`: `[m]` f32, the router's weight of this expert for each row's token.
///
/// Thread mapping: as `gather_rows_f32`.
///
/// # Safety
/// `out` holds `n * dim` floats, `rows` `m * dim`, `index` `m` distinct values below `n`,
/// `weight` `m`, with `m` the grid's y extent; `out` overlaps neither input.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn scatter_add_rows_f32(
    out: *mut f32,
    rows: *const f32,
    index: *const u32,
    weight: *const f32,
    dim: u32,
) {
    crate::device::wait_for_previous_kernel();
    let (i, dim) = (block_idx_y(), dim as usize);
    let col = block_idx_x() * block_dim_x() + thread_idx_x();
    if col < dim {
        // SAFETY: i < m, index[i] < n and distinct (preconditions); col < dim.
        unsafe {
            let token = *index.add(i) as usize;
            *out.add(token * dim + col) += *weight.add(i) * *rows.add(i * dim + col);
        }
    }
}
