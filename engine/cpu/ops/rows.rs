//! A mixture of experts' row moves, the twins of `gather_rows_f32` and
//! `scatter_add_rows_f32`: an expert's tokens gathered into rows of their own, and its
//! outputs added back to them, weighted.

/// `out[i, :] = x[index[i], :]`.
///
/// - `out`: `[m, dim]`; `x`: `[n, dim]`; `index`: `[m]`, each below `n`.
pub fn gather_rows_f32(out: &mut [f32], x: &[f32], index: &[u32], dim: usize) {
    for (o, &t) in out.chunks_exact_mut(dim).zip(index) {
        let t = t as usize;
        o.copy_from_slice(&x[t * dim..(t + 1) * dim]);
    }
}

/// `out[index[i], :] += weight[i] * rows[i, :]`.
///
/// - `out`: `[n, dim]`; `rows`: `[m, dim]`; `index`: `[m]`, distinct, each below `n`;
///   `weight`: `[m]`.
pub fn scatter_add_rows_f32(
    out: &mut [f32],
    rows: &[f32],
    index: &[u32],
    weight: &[f32],
    dim: usize,
) {
    for ((r, &t), &w) in rows.chunks_exact(dim).zip(index).zip(weight) {
        let t = t as usize;
        for (o, &r) in out[t * dim..(t + 1) * dim].iter_mut().zip(r) {
            *o += w * r;
        }
    }
}
