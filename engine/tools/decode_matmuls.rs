//! The decode matmuls alone: rustle's GEMV kernels against cuBLAS on the same shapes, timed
//! with CUDA events around ten back-to-back launches, rotating among enough weight copies
//! that no launch finds its weights in the L2.

use serde::Serialize;

use super::cublas;
use super::timing::time_ms;
use crate::config::Config;
use crate::error::Result;
use crate::gpu::Gpu;
use crate::gpu::timing::{copies, random_matrices};

#[derive(Serialize)]
pub struct GemvResult {
    /// "qkv", "o_proj", "gate+up (SwiGLU)", "down", "head"
    pub name: String,
    pub n_out: usize,
    pub n_in: usize,
    pub rustle_us: f64,
    pub rustle_bytes_per_s: f64,
    /// None when cuBLAS could not be loaded.
    pub cublas_us: Option<f64>,
    /// cuBLAS time over ours: above 1 means rustle is faster.
    pub speedup_vs_cublas: Option<f64>,
}

/// The decode step's matmul shapes for `c`: (name, rows, input width, matrices read).
pub fn decode_shapes(c: &Config) -> Vec<(&'static str, usize, usize, usize)> {
    vec![
        ("qkv", c.q_dim() + 2 * c.kv_dim(), c.dim, 1),
        ("o_proj", c.dim, c.q_dim(), 1),
        ("gate+up (SwiGLU)", c.ffn_dim, c.dim, 2),
        ("down", c.dim, c.ffn_dim, 1),
        ("head", c.vocab_size, c.dim, 1),
    ]
}

pub fn run(gpu: &Gpu, c: &Config) -> Result<Vec<GemvResult>> {
    let median_ms = |f: &mut dyn FnMut() -> Result<()>| time_ms(gpu, 20, f);
    let blas = cublas::load(gpu)?;
    let mut results = vec![];
    for (name, n_out, n_in, mats) in decode_shapes(c) {
        let bytes = mats * n_out * n_in * 2;
        let k = copies(bytes);
        let weights = random_matrices(gpu, k * mats, (n_out, n_in), 100, "the GEMV benchmark")?;
        let mut x = gpu.zeros::<u16>(2 * n_in, "the GEMV benchmark")?;
        gpu.fill_random_bf16(&mut x.as_view_mut(), 99, 1.0)?;
        // SAFETY: 2 n_in bf16 reinterpreted as n_in f32 (random bits of bounded exponent: the
        // upper halves are bf16 values, so every float is finite).
        let x_f32 = unsafe { x.transmute::<f32>(n_in) }.expect("length fits");
        let mut out = gpu.zeros::<f32>(n_out, "the GEMV benchmark")?;
        // Launches per timed region: back to back, as in the decode graph, so that the
        // figure is the kernel's and not the cost of timing one launch on its own.
        const BATCH: usize = 10;
        let mut turn = 0;
        let mut one = || -> Result<()> {
            turn = (turn + 1) % k;
            let w = &weights[turn * mats..(turn + 1) * mats];
            if mats == 2 {
                gpu.gemv_swiglu_bf16(
                    &mut out.as_view_mut(),
                    &x_f32,
                    &w[0].as_view(),
                    &w[1].as_view(),
                    n_in,
                    n_out,
                )
            } else {
                gpu.gemv_bf16(
                    &mut out.as_view_mut(),
                    &x_f32,
                    &w[0].as_view(),
                    None,
                    n_in,
                    false,
                )
            }
        };
        let ours = median_ms(&mut || (0..BATCH).try_for_each(|_| one()))? / BATCH as f64;
        let theirs = match &blas {
            None => None,
            Some(blas) => {
                let mut turn = 0;
                let per_batch = median_ms(&mut || {
                    for _ in 0..BATCH {
                        turn = (turn + 1) % k;
                        for w in &weights[turn * mats..(turn + 1) * mats] {
                            cublas::linear(gpu, blas, &mut out, w, &x, (1, n_in, n_out))?;
                        }
                    }
                    Ok(())
                })?;
                Some(per_batch / BATCH as f64)
            }
        };
        results.push(GemvResult {
            name: name.into(),
            n_out,
            n_in,
            rustle_us: ours * 1e3,
            rustle_bytes_per_s: bytes as f64 / (ours * 1e-3),
            cublas_us: theirs.map(|t| t * 1e3),
            speedup_vs_cublas: theirs.map(|t| t / ours),
        });
    }
    Ok(results)
}
