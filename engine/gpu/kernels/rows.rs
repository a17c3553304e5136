//! `gather_rows_f32` and `scatter_add_rows_f32`: a mixture of experts' row moves.

use cudarc::driver::LaunchConfig;

use super::{In, Out, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::traffic;

/// A thread a column, a block row of 256 columns, the grid's y a row.
fn per_row(m: usize, dim: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (dim.div_ceil(256) as u32, m as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Gpu {
    /// `out[i] = x[index[i]]`: `out` `[m, dim]`, `x` `[n, dim]`, `index` `[m]`.
    ///
    /// # Safety
    /// Every index is below `n` (the caller's routing makes them).
    pub unsafe fn gather_rows_f32(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        index: &In<u32>,
        dim: usize,
    ) -> Result<()> {
        let m = index.len();
        assert!(m > 0 && out.len() == m * dim && x.len().is_multiple_of(dim));
        let d = u32_of(dim, "dim");
        let mut b = self.launcher(&self.kernels.gather_rows_f32);
        b.arg(out).arg(x).arg(index).arg(&d);
        // SAFETY: out holds m rows, x whole rows, the indices are below x's rows (the
        // caller's); the grid's y is m.
        self.timed(
            "gather_rows_f32",
            traffic::gather_rows_f32(m, dim),
            || unsafe { b.launch(per_row(m, dim)) },
        )
    }

    /// `out[index[i]] += weight[i] * rows[i]`: `out` `[n, dim]`, `rows` `[m, dim]`, `index`
    /// and `weight` `[m]`.
    ///
    /// # Safety
    /// Every index is below `n` and none comes twice (the caller's routing: a token
    /// chooses an expert once).
    pub unsafe fn scatter_add_rows_f32(
        &self,
        out: &mut Out<f32>,
        rows: &In<f32>,
        index: &In<u32>,
        weight: &In<f32>,
        dim: usize,
    ) -> Result<()> {
        let m = index.len();
        assert!(m > 0 && rows.len() == m * dim && weight.len() == m);
        assert!(out.len().is_multiple_of(dim));
        let d = u32_of(dim, "dim");
        let mut b = self.launcher(&self.kernels.scatter_add_rows_f32);
        b.arg(out).arg(rows).arg(index).arg(weight).arg(&d);
        // SAFETY: rows, index and weight hold m, out whole rows, the indices distinct and
        // below out's rows (the caller's); the grid's y is m.
        let traffic = traffic::scatter_add_rows_f32(m, dim);
        self.timed("scatter_add_rows_f32", traffic, || unsafe {
            b.launch(per_row(m, dim))
        })
    }
}
