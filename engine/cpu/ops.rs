//! The CPU reference backend's operations: plain f32 arithmetic, one function per GPU
//! kernel, with the same name and argument order (minus the lengths a slice already carries).
//! They are the oracle the GPU kernels are tested against, so each reads as the equation it
//! implements; rayon spreads independent rows over cores where that costs no clarity.
//!
//! Shapes use `n` for the number of tokens in the batch.

use rayon::prelude::*;

pub use crate::kernel_args::{Heads, NormedQkv, Paged, PagedShape, Splits};

/// `out[t, :] = table[tokens[t], :]`
///
/// - `out`: `[n, dim]`
/// - `table`: `[vocab, dim]`
/// - `tokens`: `[n]`, each `< vocab`
pub fn embedding_f32(out: &mut [f32], table: &[f32], tokens: &[u32], dim: usize) {
    for (row, &tok) in out.chunks_exact_mut(dim).zip(tokens) {
        let t = tok as usize;
        row.copy_from_slice(&table[t * dim..(t + 1) * dim]);
    }
}

/// `out[t, :] = table[tokens[t], :]`, widened from bf16: the GPU keeps the table in bf16.
///
/// - `out`: `[n, dim]` f32
/// - `table`: `[vocab, dim]` bf16 bits
/// - `tokens`: `[n]`, each `< vocab`
pub fn embedding_bf16(out: &mut [f32], table: &[u16], tokens: &[u32], dim: usize) {
    for (row, &tok) in out.chunks_exact_mut(dim).zip(tokens) {
        let src = &table[tok as usize * dim..(tok as usize + 1) * dim];
        for (o, &b) in row.iter_mut().zip(src) {
            *o = bf16_to_f32(b);
        }
    }
}

/// RMSNorm: `out[t, i] = x[t, i] / sqrt(mean_j x[t, j]^2 + eps) * weight[i]`
///
/// - `out`, `x`: `[n, dim]`
/// - `weight`: `[dim]`
pub fn rmsnorm_f32(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    for (o, x) in out.chunks_exact_mut(dim).zip(x.chunks_exact(dim)) {
        let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let scale = 1.0 / (mean_sq + eps).sqrt();
        for ((o, x), w) in o.iter_mut().zip(x).zip(weight) {
            *o = x * scale * w;
        }
    }
}

/// `rmsnorm_f32`, the output also rounded to bf16 bits into `out_bf16` (`[n, dim]`). The twin
/// of `rmsnorm_f32_bf16`.
pub fn rmsnorm_f32_bf16(
    out: &mut [f32],
    out_bf16: &mut [u16],
    x: &[f32],
    weight: &[f32],
    eps: f32,
) {
    rmsnorm_f32(out, x, weight, eps);
    f32_to_bf16(out_bf16, out);
}

/// RMSNorm of each `weight.len()`-wide row of `x`, in place: Qwen3's norm of each query or
/// key head (`x` `[n, heads, head_dim]`, `weight` `[head_dim]`), as `rmsnorm_f32` computes it.
pub fn head_rmsnorm_f32(x: &mut [f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    for x in x.chunks_exact_mut(dim) {
        let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let scale = 1.0 / (mean_sq + eps).sqrt();
        for (x, w) in x.iter_mut().zip(weight) {
            *x = *x * scale * w;
        }
    }
}

/// `out[t, o] = sum_i x[t, i] * w[o, i] + bias[o]`: a linear layer, weights `[out, in]`
/// as PyTorch stores them.
///
/// - `out`: `[n, n_out]`
/// - `x`: `[n, n_in]`
/// - `w`: `[n_out, n_in]`
/// - `bias`: `[n_out]` or none
pub fn matmul_f32(out: &mut [f32], x: &[f32], w: &[f32], bias: Option<&[f32]>, n_in: usize) {
    let n_out = w.len() / n_in;
    let row =
        |o: usize, xr: &[f32]| dot(&w[o * n_in..(o + 1) * n_in], xr) + bias.map_or(0.0, |b| b[o]);
    if out.len() == n_out {
        // One token (decode): spread the output features over cores.
        out.par_iter_mut()
            .enumerate()
            .for_each(|(o, y)| *y = row(o, x));
    } else {
        // Many tokens (prefill): one token's row per task.
        out.par_chunks_mut(n_out)
            .zip(x.par_chunks(n_in))
            .for_each(|(y, xr)| y.iter_mut().enumerate().for_each(|(o, y)| *y = row(o, xr)));
    }
}

/// `out[o] = (accumulate ? out[o] : 0) + sum_i w[o, i] * x[i] + bias[o]` for one token,
/// weights in bf16: the twin of the GPU's decode matmul (`accumulate` fuses a residual add).
///
/// - `out`: `[n_out]`
/// - `x`: `[n_in]`
/// - `w`: `[n_out, n_in]` bf16 bits
/// - `bias`: `[n_out]` or none
pub fn gemv_bf16(
    out: &mut [f32],
    x: &[f32],
    w: &[u16],
    bias: Option<&[f32]>,
    n_in: usize,
    accumulate: bool,
) {
    out.par_iter_mut().enumerate().for_each(|(o, y)| {
        let row = &w[o * n_in..(o + 1) * n_in];
        let sum: f32 = row.iter().zip(x).map(|(&w, x)| bf16_to_f32(w) * x).sum();
        *y = if accumulate { *y } else { 0.0 } + sum + bias.map_or(0.0, |b| b[o]);
    });
}

/// The lesson's GEMV step 1 (a thread per row): `out = w x`. Its twin is the product itself.
pub fn gemv_step1_thread_per_row_bf16(out: &mut [f32], x: &[f32], w: &[u16], n_in: usize) {
    gemv_bf16(out, x, w, None, n_in, false);
}

/// The lesson's GEMV step 2 (a warp per row): `out = w x`.
pub fn gemv_step2_warp_per_row_bf16(out: &mut [f32], x: &[f32], w: &[u16], n_in: usize) {
    gemv_bf16(out, x, w, None, n_in, false);
}

/// `out[o] = silu(w_gate[o] . x) * (w_up[o] . x)`: the twin of the GPU's fused gate/up
/// matmul with SwiGLU.
///
/// - `out`: `[n_out]`
/// - `x`: `[n_in]`
/// - `w_gate`, `w_up`: `[n_out, n_in]` bf16 bits
pub fn gemv_swiglu_bf16(out: &mut [f32], x: &[f32], w_gate: &[u16], w_up: &[u16], n_in: usize) {
    let dot = |w: &[u16]| -> f32 { w.iter().zip(x).map(|(&w, x)| bf16_to_f32(w) * x).sum() };
    out.par_iter_mut().enumerate().for_each(|(o, y)| {
        let (g, u) = (
            dot(&w_gate[o * n_in..(o + 1) * n_in]),
            dot(&w_up[o * n_in..(o + 1) * n_in]),
        );
        *y = g / (1.0 + (-g).exp()) * u;
    });
}

/// `out[t, o] = sum_i x[t, i] * w[o, i] + bias[o]` for many tokens, weights in bf16: the
/// product every GEMM twin is (the lesson's SIMT `gemm_step1_simt_bf16`; the prefill's
/// `gemm_mma_bf16`, below, with its input rounded to bf16).
///
/// - `out`: `[n, n_out]`
/// - `x`: `[n, n_in]`
/// - `w`: `[n_out, n_in]` bf16 bits
/// - `bias`: `[n_out]` or none
pub fn gemm_bf16(out: &mut [f32], x: &[f32], w: &[u16], bias: Option<&[f32]>, n_in: usize) {
    let n_out = w.len() / n_in;
    out.par_chunks_mut(n_out)
        .zip(x.par_chunks(n_in))
        .for_each(|(y, xr)| gemv_bf16(y, xr, w, bias, n_in, false));
}

/// As `gemm_bf16`, with the activations in bf16 too: the twin of the GPU's tensor-core
/// prefill matmul.
///
/// - `x`: `[n, n_in]` bf16 bits (from `f32_to_bf16`)
pub fn gemm_mma_bf16(out: &mut [f32], x: &[u16], w: &[u16], bias: Option<&[f32]>, n_in: usize) {
    let x: Vec<f32> = x.iter().map(|&b| bf16_to_f32(b)).collect();
    gemm_bf16(out, &x, w, bias, n_in);
}

/// The twin of the GPU's warpgroup (Hopper) GEMM: the same product as `gemm_mma_bf16`.
pub fn gemm_wgmma_bf16(out: &mut [f32], x: &[u16], w: &[u16], bias: Option<&[f32]>, n_in: usize) {
    gemm_mma_bf16(out, x, w, bias, n_in);
}

/// `out[t, o] = (accumulate ? out[t, o] : 0) + sum_i x[t, i] * w[o, i] + bias[o]`, bf16
/// activations and weights: the twin of the GPU's matmul for a few tokens (batched decode),
/// whatever split of the reduction its launch takes.
///
/// - `out`: `[n, n_out]`
/// - `x`: `[n, n_in]` bf16 bits
/// - `w`: `[n_out, n_in]` bf16 bits
/// - `bias`: `[n_out]` or none
pub fn gemm_skinny_bf16(
    out: &mut [f32],
    x: &[u16],
    w: &[u16],
    bias: Option<&[f32]>,
    n_in: usize,
    accumulate: bool,
) {
    let n_out = w.len() / n_in;
    let x: Vec<f32> = x.iter().map(|&b| bf16_to_f32(b)).collect();
    out.par_chunks_mut(n_out)
        .zip(x.par_chunks(n_in))
        .for_each(|(y, xr)| gemv_bf16(y, xr, w, bias, n_in, accumulate));
}

/// `out[i] = (accumulate ? out[i] : 0) + sum over s of parts[s, i] + bias[i % n_out]`: the
/// twin of the second half of a split skinny matmul.
///
/// - `out`: `[len]`
/// - `parts`: `[splits, len]`
/// - `bias`: `[n_out]` or none
pub fn gemm_skinny_reduce_f32(
    out: &mut [f32],
    parts: &[f32],
    bias: Option<&[f32]>,
    n_out: usize,
    accumulate: bool,
) {
    let len = out.len();
    for (i, y) in out.iter_mut().enumerate() {
        let sum: f32 = parts.iter().skip(i).step_by(len).sum();
        *y = if accumulate { *y } else { 0.0 } + sum + bias.map_or(0.0, |b| b[i % n_out]);
    }
}

/// The tensor-core probe's result: every thread's 64 accumulators end at
/// `iters * 16 * a * b`, and it writes their sum. The twin of `mma_probe_bf16`.
pub fn mma_probe_bf16(out: &mut [f32], a_bits: u16, b_bits: u16, iters: u32) {
    let (a, b) = (bf16_to_f32(a_bits), bf16_to_f32(b_bits));
    out.fill(64.0 * iters as f32 * 16.0 * a * b);
}

/// Rotate-half RoPE, in place: in each head, the pair `(x[i], x[i + d/2])` turns by the
/// angle whose cos and sin are `cos[pos, i]`, `sin[pos, i]`.
///
/// - `x`: `[n, n_heads, head_dim]`
/// - `positions`: `[n]`
/// - `cos`, `sin`: `[max_pos, head_dim / 2]`
pub fn rope_f32(
    x: &mut [f32],
    positions: &[u32],
    cos: &[f32],
    sin: &[f32],
    n_heads: usize,
    head_dim: usize,
) {
    let half = head_dim / 2;
    for (t, &pos) in positions.iter().enumerate() {
        let (c, s) = (
            &cos[pos as usize * half..][..half],
            &sin[pos as usize * half..][..half],
        );
        for h in 0..n_heads {
            let head = &mut x[(t * n_heads + h) * head_dim..][..head_dim];
            for i in 0..half {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * c[i] - b * s[i];
                head[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

/// Writes each token's key and value rows into its cache slot.
///
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * BLOCK_SIZE, kv_dim]`
/// - `k`, `v`: `[n, kv_dim]`
/// - `slots`: `[n]`, `block * BLOCK_SIZE + offset` from the sequence's block table
pub fn kv_write_f32(
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    k: &[f32],
    v: &[f32],
    slots: &[u32],
    kv_dim: usize,
) {
    for (t, &slot) in slots.iter().enumerate() {
        let dst = slot as usize * kv_dim..(slot as usize + 1) * kv_dim;
        k_cache[dst.clone()].copy_from_slice(&k[t * kv_dim..(t + 1) * kv_dim]);
        v_cache[dst].copy_from_slice(&v[t * kv_dim..(t + 1) * kv_dim]);
    }
}

/// RoPE on q and k and the cache write, from the fused projection's rows `[q | k | v]`, keys
/// and values rounded to bf16: the twin of the GPU's `qkv_rope_write_bf16`.
///
/// - `q_out`: `[n, n_heads, head_dim]`
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * BLOCK_SIZE, kv_dim]` bf16 bits
/// - `qkv`: `[n, q_dim + 2 * kv_dim]`
/// - `positions`, `slots`: `[n]`; `cos`, `sin`: `[max_pos, head_dim / 2]`
pub fn qkv_rope_write_bf16(
    q_out: &mut [f32],
    (k_cache, v_cache): (&mut [u16], &mut [u16]),
    qkv: &[f32],
    rows: (&[u32], &[u32]),
    tables: (&[f32], &[f32]),
    heads: Heads,
) {
    let kv_dim = heads.kv_dim();
    let bf16 = |x: f32| half::bf16::from_f32(x).to_bits();
    rope_rows(q_out, qkv, rows, tables, heads, |slot, k, v| {
        let at = slot * kv_dim;
        for (i, (&kv, &vv)) in k.iter().zip(v).enumerate() {
            k_cache[at + i] = bf16(kv);
            v_cache[at + i] = bf16(vv);
        }
    });
}

/// The walk the RoPE-and-cache-write twins share: for each token of the fused rows
/// `[q | k | v]` (`qkv`, `[n, q_dim + 2 * kv_dim]`), its q roped into `q_out` (`[n, q_dim]`),
/// then `write(slot, k, v)` with its slot, its k roped and its v as it is (`[kv_dim]` each).
pub fn rope_rows(
    q_out: &mut [f32],
    qkv: &[f32],
    (positions, slots): (&[u32], &[u32]),
    (cos, sin): (&[f32], &[f32]),
    heads: Heads,
    mut write: impl FnMut(usize, &[f32], &[f32]),
) {
    let (q_dim, kv_dim) = (heads.q_dim(), heads.kv_dim());
    let (n_heads, n_kv_heads, head_dim) = heads.sizes();
    let mut k = vec![0.0; kv_dim];
    for (t, row) in qkv.chunks_exact(q_dim + 2 * kv_dim).enumerate() {
        let q = &mut q_out[t * q_dim..(t + 1) * q_dim];
        q.copy_from_slice(&row[..q_dim]);
        rope_f32(q, &positions[t..t + 1], cos, sin, n_heads, head_dim);
        k.copy_from_slice(&row[q_dim..q_dim + kv_dim]);
        rope_f32(&mut k, &positions[t..t + 1], cos, sin, n_kv_heads, head_dim);
        write(slots[t] as usize, &k, &row[q_dim + kv_dim..]);
    }
}

/// `qkv_rope_write_bf16` with each query head of the fused rows RMSNormed by its norm and
/// each key head by its own before RoPE: the twin of the GPU's `qkv_norm_rope_write_bf16`
/// (Qwen3). The other arguments as `qkv_rope_write_bf16`'s.
pub fn qkv_norm_rope_write_bf16(
    q_out: &mut [f32],
    caches: (&mut [u16], &mut [u16]),
    rows_in: NormedQkv<&[f32]>,
    rows: (&[u32], &[u32]),
    tables: (&[f32], &[f32]),
    heads: Heads,
) {
    let normed = normed_heads(rows_in, heads);
    qkv_rope_write_bf16(q_out, caches, &normed, rows, tables, heads);
}

/// The fused rows of `rows_in` with each query head RMSNormed by its norm and each key head
/// by its own (the values as they are): what the `qkv_norm_rope_write_*` kernels rotate.
pub fn normed_heads(rows_in: NormedQkv<&[f32]>, heads: Heads) -> Vec<f32> {
    let (q_dim, kv_dim) = (heads.q_dim(), heads.kv_dim());
    let NormedQkv {
        qkv,
        q_norm,
        k_norm,
        eps,
    } = rows_in;
    let mut normed = qkv.to_vec();
    for row in normed.chunks_exact_mut(q_dim + 2 * kv_dim) {
        let (q, rest) = row.split_at_mut(q_dim);
        head_rmsnorm_f32(q, q_norm, eps);
        head_rmsnorm_f32(&mut rest[..kv_dim], k_norm, eps);
    }
    normed
}

/// The benchmark weights' generator: `out[i] = bf16(scale * u)`, `u` uniform in [-1, 1)
/// from a hash of `(seed, i)`. The twin of `fill_random_bf16`.
pub fn fill_random_bf16(out: &mut [u16], seed: u32, scale: f32) {
    for (i, o) in out.iter_mut().enumerate() {
        let u = (hash32(seed, i as u32) >> 8) as f32 * (1.0 / 8_388_608.0) - 1.0;
        *o = half::bf16::from_f32(scale * u).to_bits();
    }
}

/// The read-bandwidth probe's result: `partial[b]`, the wrapping sum of the words block `b`
/// of a `grid x 256` launch reads (16-byte vectors `i = b * 256 + t`, stepping by
/// `grid * 256`). The twin of `read_probe_u32`.
pub fn read_probe_u32(partial: &mut [u32], data: &[u32]) {
    let grid = partial.len();
    for (b, p) in partial.iter_mut().enumerate() {
        *p = block_sum_of_vectors(data, b, grid);
    }
}

/// The read probe in phases: `partial[b]`, the wrapping sum of the words block `b` reads in
/// all of them, phase `p` the `phase_vec4` vectors from vector `p * phase_stride`, read as
/// `read_probe_u32` reads its data; `arrived`, the barriers' counter, ends at `(n_phases - 1)
/// * grid`. (`ahead` only asks L2 for lines early: no value depends on it.) The twin of
/// `read_phases_u32` (`--features probes`).
#[cfg(feature = "probes")]
#[allow(clippy::too_many_arguments)]
pub fn read_phases_u32(
    partial: &mut [u32],
    arrived: &mut [u32],
    data: &[u32],
    phase_vec4: usize,
    phase_stride: usize,
    n_phases: usize,
    _ahead: usize,
) {
    let grid = partial.len();
    for (b, p) in partial.iter_mut().enumerate() {
        *p = (0..n_phases).fold(0u32, |sum, phase| {
            let from = 4 * phase * phase_stride;
            let words = &data[from..from + 4 * phase_vec4];
            sum.wrapping_add(block_sum_of_vectors(words, b, grid))
        });
    }
    arrived[0] = ((n_phases - 1) * grid) as u32;
}

/// The probe in phases with its tiles staged: phase p is tiles `phase_starts[p] ..
/// phase_starts[p + 1]` of `tile_bytes`; block b of `partial.len()` takes tiles `b, b +
/// grid, ...` of each, and `sums[p][b]` is the wrapping sum of their words (every phase
/// but the last). `partial[b]` adds those over all phases, and, for each phase p but the
/// last, the sums of phase p of the `min(256, grid)` blocks after b, wrapping round (what
/// block b reads after the barrier that ends phase p). `arrived` ends at `(n_phases - 1) *
/// grid`. (`stages` and `producer` only say how many copies a block keeps on their way and
/// which thread asks for them: no value depends on them.) The twin of
/// `read_phases_staged_u32` (`--features probes`).
#[cfg(feature = "probes")]
#[allow(clippy::too_many_arguments)]
pub fn read_phases_staged_u32(
    partial: &mut [u32],
    sums: &mut [u32],
    arrived: &mut [u32],
    data: &[u32],
    phase_starts: &[u32],
    tile_bytes: usize,
    n_phases: usize,
    _stages: usize,
    _producer: usize,
) {
    let (grid, tile_words) = (partial.len(), tile_bytes / 4);
    let wrapping = |words: &[u32]| words.iter().fold(0u32, |s, &w| s.wrapping_add(w));
    // own[p][b]: block b's words of phase p.
    let own: Vec<Vec<u32>> = (0..n_phases)
        .map(|p| {
            let (from, to) = (phase_starts[p] as usize, phase_starts[p + 1] as usize);
            (0..grid)
                .map(|b| {
                    (from + b..to).step_by(grid).fold(0u32, |s, tile| {
                        let words = &data[tile * tile_words..(tile + 1) * tile_words];
                        s.wrapping_add(wrapping(words))
                    })
                })
                .collect()
        })
        .collect();
    for (b, out) in partial.iter_mut().enumerate() {
        *out = (0..n_phases).fold(0u32, |s, p| {
            let read = if p + 1 < n_phases {
                (0..grid.min(256)).fold(0u32, |s, t| s.wrapping_add(own[p][(b + 1 + t) % grid]))
            } else {
                0
            };
            s.wrapping_add(own[p][b]).wrapping_add(read)
        });
    }
    for p in 0..n_phases.saturating_sub(1) {
        sums[p * grid..(p + 1) * grid].copy_from_slice(&own[p]);
    }
    arrived[0] = ((n_phases - 1) * grid) as u32;
}

/// The wrapping sum of the words of `data`'s 16-byte vectors that block `b` of a `grid x
/// 256` grid-stride loop takes.
fn block_sum_of_vectors(data: &[u32], b: usize, grid: usize) -> u32 {
    let (n_vec4, stride) = (data.len() / 4, grid * 256);
    let mut sum = 0u32;
    for t in 0..256 {
        let mut i = b * 256 + t;
        while i < n_vec4 {
            for w in &data[4 * i..4 * i + 4] {
                sum = sum.wrapping_add(*w);
            }
            i += stride;
        }
    }
    sum
}

/// `x[i] *= s`: Gemma's scale of the embedding's rows. The twin of `scale_f32`.
///
/// - `x`: `[n, dim]`
pub fn scale_f32(x: &mut [f32], s: f32) {
    x.iter_mut().for_each(|v| *v *= s);
}

/// The residual connection: `x[i] += delta[i]`.
///
/// - `x`, `delta`: `[n, dim]`
pub fn residual_add_f32(x: &mut [f32], delta: &[f32]) {
    for (x, d) in x.iter_mut().zip(delta) {
        *x += d;
    }
}

/// The lesson's GEMM step 1 (SIMT tiles in shared memory): `out = x w^T + bias`. Its twin
/// is the product itself, `gemm_bf16`.
pub fn gemm_step1_simt_bf16(
    out: &mut [f32],
    x: &[f32],
    w: &[u16],
    bias: Option<&[f32]>,
    n_in: usize,
) {
    gemm_bf16(out, x, w, bias, n_in);
}

/// The sum of each row, in f64, rounded once: the twin of the lesson's reduction steps,
/// which sum in f32 in another order (a tree), so the tests compare with a tolerance.
///
/// - `out`: `[n_rows]`
/// - `x`: `[n_rows, n_cols]`
fn row_sums_f32(out: &mut [f32], x: &[f32], n_cols: usize) {
    for (o, row) in out.iter_mut().zip(x.chunks_exact(n_cols)) {
        *o = row.iter().map(|&v| v as f64).sum::<f64>() as f32;
    }
}

/// The lesson's reduction step 1 (a warp per row): each row's sum.
pub fn sum_step1_warp_f32(out: &mut [f32], x: &[f32], n_cols: usize) {
    row_sums_f32(out, x, n_cols);
}

/// The lesson's reduction step 2 (a block per row): each row's sum.
pub fn sum_step2_block_f32(out: &mut [f32], x: &[f32], n_cols: usize) {
    row_sums_f32(out, x, n_cols);
}

mod attention;
mod bf16;
mod dot;
mod gated;
mod route;
mod rows;
pub use attention::{
    PagedRef, attention_bf16, attention_combine_f32, attention_combine_f32_bf16, attention_f32,
    attention_mma_bf16, attention_split_bf16, attention_split_mma_bf16,
};
pub use bf16::{bf16_to_f32, f32_to_bf16};
pub use dot::dot;
pub use gated::{geglu_f32, geglu_f32_bf16, swiglu_f32, swiglu_f32_bf16};
pub use route::{combine_experts_f32, route, route_experts_f32};
pub use rows::{gather_rows_f32, scatter_add_rows_f32};
mod sampling;
pub use sampling::{
    SAMPLE_PARAMS, argmax_f32, draw_bits, hash32, mask_logits_f32, penalize_f32, sample_f32,
    sample_params,
};

#[cfg(test)]
mod tests;
