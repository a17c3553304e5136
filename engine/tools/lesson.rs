//! `rustle bench --lesson`: the lesson's steps timed on a model's shapes, each beside the
//! read bandwidth the same process measured. The GEMV: a thread per row (step 1), a warp per
//! row (step 2), 16-byte loads with four in flight (`gemv_bf16`, step 3), and cuBLAS; the
//! same weights, rotated through enough copies that none is found in the L2.

use cudarc::driver::CudaSlice;
use serde::Serialize;

use super::cublas;
use super::decode_matmuls::copies;
use super::timing::time_ms;
use crate::config::Config;
use crate::error::Result;
use crate::gpu::Gpu;

#[derive(Serialize)]
pub struct LessonRow {
    /// "qkv", "o_proj", "gate", "down"
    pub name: String,
    pub n_out: usize,
    pub n_in: usize,
    /// Microseconds per launch of steps 1, 2 and 3.
    pub steps_us: [f64; 3],
    /// None when cuBLAS could not be loaded.
    pub cublas_us: Option<f64>,
    /// Bytes of weights one launch reads.
    pub bytes: usize,
}

/// Each of `c`'s decode matrices through every GEMV step.
pub fn run(gpu: &Gpu, c: &Config) -> Result<Vec<LessonRow>> {
    // Launches per timed region; few, as step 1 takes milliseconds on the large matrices.
    const BATCH: usize = 3;
    let blas = cublas::load(gpu)?;
    let shapes = [
        ("qkv", c.q_dim() + 2 * c.kv_dim(), c.dim),
        ("o_proj", c.dim, c.q_dim()),
        ("gate", c.ffn_dim, c.dim),
        ("down", c.dim, c.ffn_dim),
    ];
    let mut rows = vec![];
    for (name, n_out, n_in) in shapes {
        let bytes = n_out * n_in * 2;
        let k = copies(bytes);
        let mut weights: Vec<CudaSlice<u16>> = vec![];
        for i in 0..k {
            let mut w = gpu.zeros::<u16>(n_out * n_in, "the lesson benchmark")?;
            let scale = 1.0 / (n_in as f32).sqrt();
            gpu.fill_random_bf16(&mut w.as_view_mut(), 300 + i as u32, scale)?;
            weights.push(w);
        }
        let mut x = gpu.zeros::<u16>(2 * n_in, "the lesson benchmark")?;
        gpu.fill_random_bf16(&mut x.as_view_mut(), 299, 1.0)?;
        // SAFETY: 2 n_in bf16 reinterpreted as n_in f32 (random bits of bounded exponent:
        // every float is finite).
        let x_f32 = unsafe { x.transmute::<f32>(n_in) }.expect("length fits");
        let mut out = gpu.zeros::<f32>(n_out, "the lesson benchmark")?;
        let mut time = |step: usize| -> Result<f64> {
            let mut turn = 0;
            let ms = time_ms(gpu, 5, &mut || {
                for _ in 0..BATCH {
                    turn = (turn + 1) % k;
                    let (o, w) = (&mut out.as_view_mut(), &weights[turn].as_view());
                    match step {
                        1 => gpu.gemv_step1_thread_per_row_bf16(o, &x_f32, w, n_in, n_out)?,
                        2 => gpu.gemv_step2_warp_per_row_bf16(o, &x_f32, w, n_in, n_out)?,
                        _ => gpu.gemv_bf16(o, &x_f32, w, None, n_in, n_out, false)?,
                    }
                }
                Ok(())
            })?;
            Ok(ms * 1e3 / BATCH as f64)
        };
        let steps_us = [time(1)?, time(2)?, time(3)?];
        let cublas_us = match &blas {
            None => None,
            Some(blas) => {
                let mut turn = 0;
                let ms = time_ms(gpu, 5, &mut || {
                    for _ in 0..BATCH {
                        turn = (turn + 1) % k;
                        cublas::linear(gpu, blas, &mut out, &weights[turn], &x, 1, n_in, n_out)?;
                    }
                    Ok(())
                })?;
                Some(ms * 1e3 / BATCH as f64)
            }
        };
        rows.push(LessonRow {
            name: name.into(),
            n_out,
            n_in,
            steps_us,
            cublas_us,
            bytes,
        });
    }
    Ok(rows)
}

/// The table: each step's time and its share of the read bandwidth.
pub fn print(rows: &[LessonRow], read_bytes_per_s: f64) {
    println!(
        "  {:<8} {:>6} {:>6} {:>22} {:>22} {:>22} {:>22}",
        "GEMV",
        "rows",
        "cols",
        "1 thread/row us (%)",
        "2 warp/row us (%)",
        "3 gemv_bf16 us (%)",
        "cuBLAS us (%)"
    );
    for r in rows {
        let cell = |us: f64| {
            let share = r.bytes as f64 / (us * 1e-6) / read_bytes_per_s;
            format!("{us:.1} ({:.1}%)", 100.0 * share)
        };
        println!(
            "  {:<8} {:>6} {:>6} {:>22} {:>22} {:>22} {:>22}",
            r.name,
            r.n_out,
            r.n_in,
            cell(r.steps_us[0]),
            cell(r.steps_us[1]),
            cell(r.steps_us[2]),
            r.cublas_us.map_or("no cuBLAS".into(), cell)
        );
    }
}
