//! The prefill matmuls alone: rustle's tensor-core GEMMs against cuBLAS on a model's shapes
//! for a prompt of `n` tokens, timed with CUDA events over back-to-back launches that rotate
//! among copies of the weights (so that `n` of a decode batch is timed from memory too).

use serde::Serialize;

use super::cublas;
use super::timing::time_ms;
use crate::config::Config;
use crate::error::Result;
use crate::gpu::Gpu;
use crate::gpu::gemm_plan::{GemmPlan, WGMMA_SPLITS};
use crate::gpu::kernels::gemm_mma::Bf16Operands;
use crate::gpu::kernels::gemm_skinny::{SKINNY_MAX_TOKENS, skinny_splits};
use crate::gpu::timing::{copies, random_matrices};
use crate::tiles::WGMMA_WIDTHS;

#[derive(Serialize)]
pub struct GemmResult {
    /// "qkv", "o_proj", "gate (and up)", "down"
    pub name: String,
    pub n: usize,
    pub n_in: usize,
    pub n_out: usize,
    /// `gemm_wgmma_bf16`, on GPUs that have it.
    pub wgmma_us: Option<f64>,
    /// `gemm_mma_bf16`.
    pub mma_us: f64,
    /// `gemm_skinny_bf16` (batched decode's), for up to `SKINNY_MAX_TOKENS` tokens: where it
    /// and the prompt GEMM cross over.
    pub skinny_us: Option<f64>,
    /// None when cuBLAS could not be loaded.
    pub cublas_us: Option<f64>,
    /// The plan `gemm_wgmma_bf16` chose, on GPUs that have it.
    pub wgmma_plan: Option<GemmPlan>,
    /// Every plan of `gemm_wgmma_bf16` and its time, when asked for.
    pub plans: Vec<(GemmPlan, f64)>,
}

impl GemmResult {
    /// FLOP of one launch.
    pub fn flops(&self) -> f64 {
        2.0 * (self.n * self.n_in * self.n_out) as f64
    }

    /// The prefill's kernel (`Gpu::prefill_gemm`): the warpgroup one where there is one.
    pub fn rustle_us(&self) -> f64 {
        self.wgmma_us.unwrap_or(self.mma_us)
    }
}

/// A prompt's matmul shapes for `c`: (name, input width, output width).
pub fn prefill_shapes(c: &Config) -> Vec<(&'static str, usize, usize)> {
    vec![
        ("qkv", c.dim, c.q_dim() + 2 * c.kv_dim()),
        ("o_proj", c.q_dim(), c.dim),
        ("gate (and up)", c.dim, c.ffn_dim),
        ("down", c.ffn_dim, c.dim),
    ]
}

/// Each of `c`'s prefill matmuls on `n` tokens, through each GEMM; with `all_plans`, through
/// every tile width and split of the warpgroup one too.
pub fn run(gpu: &Gpu, c: &Config, n: usize, all_plans: bool) -> Result<Vec<GemmResult>> {
    const BATCH: usize = 10;
    let time_us = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let ms = time_ms(gpu, 5, &mut || (0..BATCH).try_for_each(|_| f()))?;
        Ok(ms * 1e3 / BATCH as f64)
    };
    let blas = cublas::load(gpu)?;
    let mut results = vec![];
    for (name, n_in, n_out) in prefill_shapes(c) {
        // Copies of the weights to rotate through, as the decode matmuls do: a few tokens'
        // GEMM reads its matrix once, and a matrix read again from the L2 would be timed
        // faster than any model step reads it.
        let ws = random_matrices(
            gpu,
            copies(n_out * n_in * 2),
            (n_out, n_in),
            200,
            "the GEMM benchmark",
        )?;
        let turn = std::cell::Cell::new(0usize);
        let w = || {
            turn.set(turn.get() + 1);
            &ws[turn.get() % ws.len()]
        };
        let mut x = gpu.zeros::<u16>(n * n_in, "the GEMM benchmark")?;
        gpu.fill_random_bf16(&mut x.as_view_mut(), 201, 1.0)?;
        let mut out = gpu.zeros::<f32>(n * n_out, "the GEMM benchmark")?;
        // Room for the widest split any plan makes.
        let most_splits = WGMMA_SPLITS[WGMMA_SPLITS.len() - 1];
        let mut parts = gpu.zeros::<f32>(most_splits * n * n_out, "the GEMM benchmark")?;
        let ops = || Bf16Operands {
            x: x.as_view(),
            w: w().as_view(),
            bias: None,
        };
        let wgmma_us = match gpu.has_wgmma() {
            false => None,
            true => Some(time_us(&mut || {
                let (o, p) = (&mut out.as_view_mut(), &mut parts.as_view_mut());
                gpu.gemm_wgmma_bf16(o, ops(), n_in, p)
            })?),
        };
        let mma_us = time_us(&mut || {
            let o = &mut out.as_view_mut();
            gpu.gemm_mma_bf16(o, ops(), n_in)
        })?;
        let skinny_us = match n <= SKINNY_MAX_TOKENS {
            false => None,
            true => {
                let splits = skinny_splits(n_in, n_out, gpu.sm_count);
                let mut parts = gpu.zeros::<f32>(splits * n * n_out, "the GEMM benchmark")?;
                Some(time_us(&mut || {
                    let (o, p) = (&mut out.as_view_mut(), &mut parts.as_view_mut());
                    gpu.gemm_skinny_bf16(o, ops(), n_in, false, p)
                })?)
            }
        };
        let mut plans = vec![];
        if all_plans && gpu.has_wgmma() {
            for tile_n in WGMMA_WIDTHS {
                for k_splits in WGMMA_SPLITS {
                    let plan = GemmPlan { tile_n, k_splits };
                    let us = time_us(&mut || {
                        let (o, p) = (&mut out.as_view_mut(), &mut parts.as_view_mut());
                        gpu.gemm_wgmma_planned(plan, o, ops(), n_in, p, false)
                    })?;
                    plans.push((plan, us));
                }
            }
        }
        let cublas_us = match &blas {
            None => None,
            Some(blas) => Some(time_us(&mut || {
                cublas::linear(gpu, blas, &mut out, w(), &x, (n, n_in, n_out))
            })?),
        };
        let wgmma_plan = match gpu.has_wgmma() {
            true => Some(gpu.wgmma_plan(n, n_in, n_out)?),
            false => None,
        };
        results.push(GemmResult {
            name: name.into(),
            n,
            n_in,
            n_out,
            wgmma_us,
            mma_us,
            skinny_us,
            cublas_us,
            wgmma_plan,
            plans,
        });
    }
    Ok(results)
}

/// The table `rustle bench` prints: each shape's time and TFLOP/s per kernel, and cuBLAS's
/// time over rustle's (above 1: rustle is faster).
pub fn print(results: &[GemmResult]) {
    println!(
        "  {:<14} {:>6} {:>6} {:>6} {:>9} {:>18} {:>18} {:>18} {:>18} {:>12}",
        "prefill matmul",
        "tokens",
        "in",
        "out",
        "plan",
        "wgmma us (TF/s)",
        "mma.sync us (TF/s)",
        "skinny us (TF/s)",
        "cuBLAS us (TF/s)",
        "cuBLAS/ours"
    );
    for g in results {
        let cell = |us: Option<f64>| match us {
            None => "-".to_string(),
            Some(us) => format!("{us:.1} ({:.0})", g.flops() / (us * 1e-6) / 1e12),
        };
        let ratio = g
            .cublas_us
            .map_or("no cuBLAS".into(), |c| format!("{:.2}", c / g.rustle_us()));
        let plan = g.wgmma_plan.map_or("-".into(), plan_name);
        println!(
            "  {:<14} {:>6} {:>6} {:>6} {:>9} {:>18} {:>18} {:>18} {:>18} {:>12}",
            g.name,
            g.n,
            g.n_in,
            g.n_out,
            plan,
            cell(g.wgmma_us),
            cell(Some(g.mma_us)),
            cell(g.skinny_us),
            cell(g.cublas_us),
            ratio
        );
    }
    for g in results.iter().filter(|g| !g.plans.is_empty()) {
        let times: Vec<String> = g
            .plans
            .iter()
            .map(|&(p, us)| format!("{} {us:.1}", plan_name(p)))
            .collect();
        println!("    {} every plan (us): {}", g.name, times.join(", "));
    }
}

/// "224" for a tile 224 wide, "256 x2" for 256 wide with the reduction split in two.
fn plan_name(p: GemmPlan) -> String {
    match p.k_splits {
        1 => format!("{}", p.tile_n),
        k => format!("{} x{k}", p.tile_n),
    }
}
