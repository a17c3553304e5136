//! Measuring the warpgroup GEMM's plans on this GPU, once per model shape: every tile width
//! and split of `gemm_wgmma_bf16` timed on each of the model's layer matrices at each of
//! `TUNED_ROWS` (up to what a pass may bring), the fastest kept (`tuned_plans.rs` says why,
//! and how a launch finds its plan). The table is kept in the cache folder, so that the
//! model's next load measures nothing and runs the plans, and so the sums, of the first.
//!
//! Each launch reads its matrix from memory, as a model step does: the launches rotate among
//! copies of it, together past the L2 (a 32 MB matrix timed again and again would be read
//! from the L2's 50 MB, and the plans that read more would look cheaper than they are).
//! RUSTLE_GEMM_TUNE=0 keeps the estimates, to measure what the table brings.

use std::path::Path;
use std::time::Instant;

use super::context::Gpu;
use super::gemm_plan::{self, GemmPlan};
use super::kernels::gemm_mma::Bf16Operands;
use super::timing::{copies, random_matrices, time_ms};
use super::tuned_plans::{self, Shape, TUNED_ROWS, TunedPlans, choose, tuned_rows};
use crate::error::Result;

/// Launches a timed run makes, each through the next copy.
const LAUNCHES: usize = 4;
/// Timed runs a plan has; the median is its time.
const RUNS: usize = 5;

/// Measures the plans of the shapes `(n_in, n_out)` that the table lacks, at every count of
/// `TUNED_ROWS` a pass of up to `max_tokens` tokens takes, into `gpu`'s table and the file
/// in the cache folder. Nothing where the GPU has no warpgroup GEMM or RUSTLE_GEMM_TUNE=0. A
/// failure to measure (no memory left for the copies) leaves the estimates, with a line
/// that says so.
pub fn tune(gpu: &Gpu, shapes: &[(usize, usize)], max_tokens: usize) {
    if !gpu.has_wgmma() || !gpu.gemm_tune {
        return;
    }
    let path = crate::default_model::cache_dir()
        .ok()
        .map(|dir| tuned_plans::plan_file(&dir, &gpu.description, gpu.kernels_hash));
    tune_with(gpu, shapes, max_tokens, path.as_deref());
}

/// `tune` with the table kept in `path` (none: kept in memory only). The plans measured join
/// the table `gpu` holds, so that models loaded one after the other on one GPU keep each
/// other's.
pub fn tune_with(gpu: &Gpu, shapes: &[(usize, usize)], max_tokens: usize, path: Option<&Path>) {
    let mut table = gpu
        .tuned_plans
        .read()
        .expect("the plan table's lock")
        .clone();
    if let Some(p) = path {
        let kept = tuned_plans::load(p, &gpu.description, gpu.kernels_hash);
        for m in kept.measured() {
            if !table.has(&m.shape) {
                table.insert(m);
            }
        }
    }
    let last = tuned_rows(max_tokens).unwrap_or(TUNED_ROWS[TUNED_ROWS.len() - 1]);
    let wanted: Vec<Shape> = shapes
        .iter()
        .flat_map(|&(n_in, n_out)| {
            TUNED_ROWS
                .iter()
                .filter(move |&&rows| rows <= last)
                .map(move |&rows| Shape { rows, n_in, n_out })
        })
        .filter(|s| !table.has(s) && s.n_in.is_multiple_of(64))
        .collect();
    if !wanted.is_empty() {
        let kept = path.map_or("kept in memory: no cache folder".into(), |p| {
            format!("kept in {}", p.display())
        });
        eprintln!(
            "rustle: timing the tensor-core GEMM's plans on this GPU for {} shapes of this \
             model (once; {kept})",
            wanted.len()
        );
        let start = Instant::now();
        match measure(gpu, &wanted, &mut table) {
            Ok(changed) => {
                eprintln!(
                    "rustle: {changed} of {} shapes take a plan other than the estimate's ({:.1} s)",
                    wanted.len(),
                    start.elapsed().as_secs_f64()
                );
                if let Some(p) = path
                    && let Err(e) = tuned_plans::save(p, &gpu.description, gpu.kernels_hash, &table)
                {
                    eprintln!(
                        "rustle: the GEMM plans were not kept ({e}); the next run times them again"
                    );
                }
            }
            Err(e) => {
                eprintln!("rustle: the GEMM plans could not be timed ({e}); the estimates stand")
            }
        }
    }
    let mut shared = gpu.tuned_plans.write().expect("the plan table's lock");
    table.measured().into_iter().for_each(|m| shared.insert(m));
}

/// Times every candidate plan of each of `wanted` and records the chosen one in `table`;
/// how many took a plan other than the estimate's.
fn measure(gpu: &Gpu, wanted: &[Shape], table: &mut TunedPlans) -> Result<usize> {
    let mut changed = 0;
    let mut shapes: Vec<(usize, usize)> = wanted.iter().map(|s| (s.n_in, s.n_out)).collect();
    shapes.dedup();
    for (n_in, n_out) in shapes {
        let rows: Vec<usize> = wanted
            .iter()
            .filter(|s| (s.n_in, s.n_out) == (n_in, n_out))
            .map(|s| s.rows)
            .collect();
        let most = rows.iter().copied().max().unwrap_or(0);
        let copies = copies(2 * n_in * n_out);
        let ws = random_matrices(gpu, copies, (n_out, n_in), 300, "timing the GEMM plans")?;
        // `[most, n_in]` bf16 inputs, `[most, n_out]` outputs, the widest split's parts.
        let mut x = gpu.zeros::<u16>(most * n_in, "timing the GEMM plans")?;
        gpu.fill_random_bf16(&mut x.as_view_mut(), 299, 1.0)?;
        let mut out = gpu.zeros::<f32>(most * n_out, "timing the GEMM plans")?;
        let splits = gemm_plan::WGMMA_SPLITS[gemm_plan::WGMMA_SPLITS.len() - 1];
        let mut parts = gpu.zeros::<f32>(splits * most * n_out, "timing the GEMM plans")?;
        for n in rows {
            let mut turn = 0;
            let mut timed: Vec<(GemmPlan, f64)> = vec![];
            for plan in gemm_plan::wgmma_candidates(n_in) {
                let ms = time_ms(gpu, RUNS, &mut || {
                    for _ in 0..LAUNCHES {
                        turn += 1;
                        let ops = Bf16Operands {
                            x: x.slice(..n * n_in),
                            w: ws[turn % copies].as_view(),
                            bias: None,
                        };
                        let o = &mut out.slice_mut(..n * n_out);
                        gpu.gemm_wgmma_planned(
                            plan,
                            o,
                            ops,
                            n_in,
                            &mut parts.as_view_mut(),
                            false,
                        )?;
                    }
                    Ok(())
                })?;
                timed.push((plan, ms * 1e3 / LAUNCHES as f64));
            }
            let shape = Shape {
                rows: n,
                n_in,
                n_out,
            };
            let estimate = gemm_plan::wgmma(n, n_in, n_out, gpu.gemm_slots.wgmma);
            if let Some(m) = choose(shape, estimate, &timed) {
                changed += usize::from(m.plan != m.estimate);
                table.insert(m);
            }
        }
    }
    Ok(changed)
}
