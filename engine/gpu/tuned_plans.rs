//! The warpgroup GEMM's plans as measured on this GPU (`gemm_tuning.rs` measures them), and
//! the file that keeps them between runs.
//!
//! `gemm_plan::wgmma` estimates a plan's time by counting waves of blocks. Where a grid is
//! large that is enough; where it is a few dozen tiles split to fill the GPU (a decode batch
//! of 32 to 256 sequences, a short prompt) it missed the fastest of the sixteen plans by
//! 11% of a layer's matmuls (round 85: 213.9 against 189.4 us for 64 tokens through Llama
//! 3 8B's on an H100). A table measured once per GPU, kernel build and matrix shape replaces
//! the estimate at the token counts of `TUNED_ROWS`; past them, and for shapes not measured,
//! the estimate stands.
//!
//! A launch of `n` tokens takes the plan measured at the least of `TUNED_ROWS` at or above
//! `n` (`tuned_rows`): the same number of 128-token tiles (`WGMMA_BM`), so the same grid, a
//! few rows more in the last tile.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::gemm_plan::{self, GemmPlan};
use crate::error::{Error, Result};

/// The token counts at which plans are measured: decode batches of 17 to 64 sequences in two
/// steps (the split plans differ most there), then each count of 128-token tiles up to a
/// 512-token prompt, past which the widest tiles fill the GPU unsplit (`gemm_plan`'s tests).
pub const TUNED_ROWS: [usize; 6] = [32, 64, 128, 256, 384, 512];

/// The estimate's plan is kept unless another ran at most this share of its time: a plan
/// that wins by less than timing's noise would trade one for the other run to run.
pub const KEEP_ESTIMATE_WITHIN: f64 = 0.97;

/// The tuned token count whose plan a launch of `n` tokens takes, or `None` past the last.
pub fn tuned_rows(n: usize) -> Option<usize> {
    TUNED_ROWS.iter().copied().find(|&r| r >= n)
}

/// One measured shape: `rows` tokens through an `n_out x n_in` matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    pub rows: usize,
    pub n_in: usize,
    pub n_out: usize,
}

/// What the measurement found for one shape: the plan taken, and the estimate's beside it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub shape: Shape,
    pub plan: GemmPlan,
    /// Microseconds a launch, median of the timed runs.
    pub us: f64,
    pub estimate: GemmPlan,
    pub estimate_us: f64,
}

/// The plan among `timed` (every candidate with its time) that a shape takes: the fastest,
/// unless the estimate's is within `KEEP_ESTIMATE_WITHIN` of it.
pub fn choose(shape: Shape, estimate: GemmPlan, timed: &[(GemmPlan, f64)]) -> Option<Measured> {
    let &(best, best_us) = timed.iter().min_by(|a, b| a.1.total_cmp(&b.1))?;
    let estimate_us = timed.iter().find(|(p, _)| *p == estimate)?.1;
    let (plan, us) = match best_us < KEEP_ESTIMATE_WITHIN * estimate_us {
        true => (best, best_us),
        false => (estimate, estimate_us),
    };
    Some(Measured {
        shape,
        plan,
        us,
        estimate,
        estimate_us,
    })
}

/// The measured plans of one GPU and kernel build.
#[derive(Clone, Debug, Default)]
pub struct TunedPlans {
    plans: HashMap<Shape, Measured>,
}

impl TunedPlans {
    /// `gemm_wgmma_bf16`'s plan (and `gemm_wgmma_fp8`'s, which takes the same) for `n` tokens
    /// through an `n_out x n_in` matrix, `slots` blocks at once: the measured one where the
    /// table has it, else the estimate.
    pub fn wgmma(&self, n: usize, n_in: usize, n_out: usize, slots: usize) -> GemmPlan {
        tuned_rows(n)
            .and_then(|rows| self.plans.get(&Shape { rows, n_in, n_out }))
            .map_or_else(|| gemm_plan::wgmma(n, n_in, n_out, slots), |m| m.plan)
    }

    pub fn has(&self, shape: &Shape) -> bool {
        self.plans.contains_key(shape)
    }

    pub fn insert(&mut self, m: Measured) {
        self.plans.insert(m.shape, m);
    }

    /// Every measured shape, in a fixed order.
    pub fn measured(&self) -> Vec<Measured> {
        let mut all: Vec<Measured> = self.plans.values().copied().collect();
        all.sort_by_key(|m| (m.shape.n_in, m.shape.n_out, m.shape.rows));
        all
    }

    pub fn len(&self) -> usize {
        self.plans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }
}

/// The file's contents: which GPU and kernel build measured the plans, and the plans.
#[derive(Serialize, Deserialize)]
struct PlanFile {
    gpu: String,
    kernels: String,
    plans: Vec<Measured>,
}

/// Where the plans of `gpu` (its description) and `kernels` (a hash of the PTX loaded) are
/// kept: a file of their own in `dir` (the cache folder), so that a GPU or build of another
/// kind never reads them.
pub fn plan_file(dir: &Path, gpu: &str, kernels: u64) -> PathBuf {
    let name: String = gpu
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    dir.join("gemm-plans")
        .join(format!("{name}-{kernels:016x}.json"))
}

/// The plans kept in `path` for this `gpu` and `kernels`; none where the file is missing,
/// unreadable or another's (it is then measured again and written over).
pub fn load(path: &Path, gpu: &str, kernels: u64) -> TunedPlans {
    let mut t = TunedPlans::default();
    let Ok(text) = std::fs::read_to_string(path) else {
        return t;
    };
    match serde_json::from_str::<PlanFile>(&text) {
        Ok(f) if f.gpu == gpu && f.kernels == format!("{kernels:016x}") => {
            f.plans.into_iter().for_each(|m| t.insert(m));
        }
        _ => {}
    }
    t
}

/// Writes `plans` to `path` whole (a file beside it, then renamed over it, so that a run
/// reading it meanwhile sees the old table or the new, never half).
pub fn save(path: &Path, gpu: &str, kernels: u64, plans: &TunedPlans) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let file = PlanFile {
        gpu: gpu.into(),
        kernels: format!("{kernels:016x}"),
        plans: plans.measured(),
    };
    let text = serde_json::to_string_pretty(&file).expect("plans serialize");
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiles::WGMMA_BM;

    fn plan(tile_n: usize, k_splits: usize) -> GemmPlan {
        GemmPlan { tile_n, k_splits }
    }

    const SHAPE: Shape = Shape {
        rows: 64,
        n_in: 4096,
        n_out: 6144,
    };

    #[test]
    fn a_launch_takes_the_plan_of_its_count_of_tiles() {
        assert_eq!(tuned_rows(17), Some(32));
        assert_eq!(tuned_rows(33), Some(64));
        assert_eq!(tuned_rows(64), Some(64));
        assert_eq!(tuned_rows(100), Some(128));
        assert_eq!(tuned_rows(129), Some(256));
        assert_eq!(tuned_rows(512), Some(512));
        assert_eq!(tuned_rows(513), None);
        // Past 128 each tuned count is a whole number of tiles, so every count it stands
        // for has the same grid.
        for w in TUNED_ROWS.windows(2).filter(|w| w[0] >= WGMMA_BM) {
            assert_eq!(w[1] - w[0], WGMMA_BM);
        }
    }

    #[test]
    fn the_estimate_stands_unless_beaten_clearly() {
        let est = plan(256, 2);
        let timed = [(plan(128, 4), 27.0), (est, 30.0), (plan(256, 1), 40.0)];
        let m = choose(SHAPE, est, &timed).unwrap();
        assert_eq!((m.plan, m.us, m.estimate_us), (plan(128, 4), 27.0, 30.0));
        // 29.5 is within 3% of 30: noise, the estimate kept.
        let timed = [(plan(128, 4), 29.5), (est, 30.0)];
        assert_eq!(choose(SHAPE, est, &timed).unwrap().plan, est);
        // The estimate not timed: nothing to compare with.
        assert!(choose(SHAPE, est, &[(plan(128, 4), 1.0)]).is_none());
    }

    #[test]
    fn lookups_fall_back_to_the_estimate() {
        let mut t = TunedPlans::default();
        let est = gemm_plan::wgmma(64, 4096, 6144, 132);
        let other = if est == plan(128, 4) {
            plan(192, 2)
        } else {
            plan(128, 4)
        };
        t.insert(Measured {
            shape: SHAPE,
            plan: other,
            us: 1.0,
            estimate: est,
            estimate_us: 2.0,
        });
        assert_eq!(t.wgmma(64, 4096, 6144, 132), other);
        assert_eq!(t.wgmma(40, 4096, 6144, 132), other);
        // Another count of rows, another shape, past the table: the estimate.
        assert_eq!(
            t.wgmma(100, 4096, 6144, 132),
            gemm_plan::wgmma(100, 4096, 6144, 132)
        );
        assert_eq!(
            t.wgmma(64, 4096, 4096, 132),
            gemm_plan::wgmma(64, 4096, 4096, 132)
        );
        assert_eq!(
            t.wgmma(2048, 4096, 6144, 132),
            gemm_plan::wgmma(2048, 4096, 6144, 132)
        );
    }

    #[test]
    fn the_file_keeps_the_plans_of_its_gpu_and_build_only() {
        let dir = std::env::temp_dir().join(format!("rustle-plans-{}", std::process::id()));
        let gpu = "NVIDIA H100 80GB HBM3 (sm_90, 79.2 GiB)";
        let path = plan_file(&dir, gpu, 0xabc);
        assert!(load(&path, gpu, 0xabc).is_empty(), "no file yet");
        let mut t = TunedPlans::default();
        let m = Measured {
            shape: SHAPE,
            plan: plan(128, 4),
            us: 26.6,
            estimate: plan(256, 2),
            estimate_us: 30.0,
        };
        t.insert(m);
        save(&path, gpu, 0xabc, &t).unwrap();
        assert_eq!(load(&path, gpu, 0xabc).measured(), vec![m]);
        // Another build or GPU reading the same path finds nothing of its own.
        assert!(load(&path, gpu, 0xabd).is_empty());
        assert!(load(&path, "NVIDIA H200", 0xabc).is_empty());
        // A damaged file is no table, not an error.
        std::fs::write(&path, "{ not json").unwrap();
        assert!(load(&path, gpu, 0xabc).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
