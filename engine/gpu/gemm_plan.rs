//! How a tensor-core GEMM covers its output: the width of a block's tile and whether the
//! reduction is split, chosen so that the blocks fill the GPU's SMs evenly.
//!
//! A GEMM's blocks run in *waves* of as many as fit on the GPU at once (`slots`). A last
//! wave that is half full costs as much as a full one: 224 tiles on 132 SMs take two waves,
//! the second 70% idle. Narrower tiles or a split reduction change the count; wider tiles
//! do more arithmetic per byte they copy, so each step of theirs is cheaper per column.
//! The plan is the cheapest by that count.

use crate::tiles::{MMA_BM, MMA_BN, WGMMA_BLOCKS_ROWS, WGMMA_BLOCKS_WIDTHS, WGMMA_BM};

/// Tile and split of one tensor-core GEMM launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct GemmPlan {
    /// Output features per block tile.
    pub tile_n: usize,
    /// 1, or 2, 4 or 8 (`WGMMA_SPLITS`): each part of the reduction in its own block, all
    /// added into a zeroed output.
    pub k_splits: usize,
}

/// The widths `gemm_wgmma_bf16` runs, with the time of one 64-deep step of a block relative
/// to a 256-wide one's, measured on the H200 (`rustle bench --gemm-plans`;
/// docs/lessons.md#prefill-on-tensor-cores): narrower tiles copy more bytes per product, so a
/// column costs more.
const WGMMA_STEP_COST: [(usize, f64); 4] = [(128, 0.75), (192, 0.85), (224, 0.94), (256, 1.0)];

/// The splits of the reduction `gemm_wgmma_bf16` runs. Few tokens make few tiles (4096
/// outputs are 16 to 32 of them, on 132 SMs): only splitting the reduction fills the GPU.
pub const WGMMA_SPLITS: [usize; 4] = [1, 2, 4, 8];

/// What a split reduction adds to a block of 128 tokens, in steps of its width: storing its
/// part apart and adding the parts in order after the GEMM. Measured on the H200 when the
/// parts met by zeroing and `red.add` (20 to 27 us on 8B's o_proj and down at 512 tokens,
/// about 30 steps); the in-order sum that replaced it was not timed apart. A block with fewer
/// tokens stores fewer rows: the cost is taken to scale with them.
const SPLIT_STEPS: f64 = 32.0;

/// No part of a split reduction is shallower than this: it would be a few steps.
const MIN_PART_DEPTH: usize = 512;

/// The splits a reduction `n_in` deep may take: none leaves parts shallower than
/// `MIN_PART_DEPTH`.
fn splits_for(n_in: usize) -> impl Iterator<Item = usize> {
    WGMMA_SPLITS
        .into_iter()
        .filter(move |&k| k == 1 || n_in >= k * MIN_PART_DEPTH)
}

/// Every plan `gemm_wgmma_bf16` may take for a reduction `n_in` deep: each width it runs,
/// each split `splits_for` allows (what `gemm_tuning` times).
pub fn wgmma_candidates(n_in: usize) -> impl Iterator<Item = GemmPlan> {
    WGMMA_STEP_COST.iter().flat_map(move |&(tile_n, _)| {
        splits_for(n_in).map(move |k_splits| GemmPlan { tile_n, k_splits })
    })
}

/// `gemm_mma_bf16`'s plan: its one tile width, split when even the halves fit in one wave
/// of `slots` blocks (a second wave costs more than the idle SMs, on the H200:
/// docs/lessons.md#prefill-on-tensor-cores).
pub fn mma(n: usize, n_in: usize, n_out: usize, slots: usize) -> GemmPlan {
    let tiles = n_out.div_ceil(MMA_BN) * n.div_ceil(MMA_BM);
    let split = 2 * tiles <= slots && n_in >= 2 * MIN_PART_DEPTH;
    GemmPlan {
        tile_n: MMA_BN,
        k_splits: if split { 2 } else { 1 },
    }
}

/// `gemm_wgmma_bf16`'s plan: the width and split of least estimated time for `n` tokens
/// through an `n_out x n_in` matrix, `slots` blocks at once. Ties go to the wider tile, then
/// to no split.
pub fn wgmma(n: usize, n_in: usize, n_out: usize, slots: usize) -> GemmPlan {
    let rows = n.min(WGMMA_BM) as f64 / WGMMA_BM as f64;
    cheapest(n_in, slots, rows, |tile_n| {
        n_out.div_ceil(tile_n) * n.div_ceil(WGMMA_BM)
    })
}

/// `gemm_wgmma_<type>`'s plan (the GGUF blocks' warpgroup GEMM): its tiles are 128 features
/// by `tile_n` tokens (128 or 256), costed as `gemm_wgmma_bf16`'s of the same width (a step
/// copies the same bytes of activations and multiplies as many products).
pub fn wgmma_blocks(n: usize, n_in: usize, n_out: usize, slots: usize) -> GemmPlan {
    let rows = n.min(WGMMA_BM) as f64 / WGMMA_BM as f64;
    let plan = cheapest(n_in, slots, rows, |tile_n| match tile_n {
        128 | 256 => n_out.div_ceil(WGMMA_BLOCKS_ROWS) * n.div_ceil(tile_n),
        _ => usize::MAX,
    });
    debug_assert!(WGMMA_BLOCKS_WIDTHS.contains(&plan.tile_n));
    plan
}

/// The width (of `WGMMA_STEP_COST`'s) and split of least estimated time for a warpgroup
/// GEMM whose width `tile_n` makes `blocks(tile_n)` tiles (`usize::MAX`: a width it does
/// not run), `rows` the share of a block's rows a split's parts store.
fn cheapest(n_in: usize, slots: usize, rows: f64, blocks: impl Fn(usize) -> usize) -> GemmPlan {
    let steps = n_in.div_ceil(64) as f64;
    let mut best = (
        f64::INFINITY,
        GemmPlan {
            tile_n: 256,
            k_splits: 1,
        },
    );
    for &(tile_n, step_cost) in WGMMA_STEP_COST.iter().rev() {
        let tiles = blocks(tile_n);
        if tiles == usize::MAX {
            continue;
        }
        for k_splits in splits_for(n_in) {
            let waves = (tiles * k_splits).div_ceil(slots) as f64;
            let split_steps = if k_splits > 1 {
                SPLIT_STEPS * rows
            } else {
                0.0
            };
            let time = waves * (steps / k_splits as f64 + split_steps) * step_cost;
            if time < best.0 * 0.999 {
                best = (time, GemmPlan { tile_n, k_splits });
            }
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiles::WGMMA_WIDTHS;

    fn plan(tile_n: usize, k_splits: usize) -> GemmPlan {
        GemmPlan { tile_n, k_splits }
    }

    #[test]
    fn every_width_the_kernel_runs_has_a_cost() {
        let costed: Vec<usize> = WGMMA_STEP_COST.iter().map(|&(w, _)| w).collect();
        assert_eq!(costed, WGMMA_WIDTHS);
    }

    #[test]
    fn big_grids_take_the_widest_tile_unsplit() {
        // 2048 tokens of Llama 3 8B's gate: 16 x 56 = 896 tiles of 256, 6.8 waves.
        assert_eq!(wgmma(2048, 4096, 14336, 132), plan(256, 1));
        assert_eq!(wgmma(8192, 8192, 8192, 132), plan(256, 1));
    }

    #[test]
    fn the_mma_kernel_splits_only_what_fits_one_wave() {
        // 4 x 32 = 128 tiles: halves would need two waves of 132.
        assert_eq!(mma(512, 4096, 4096, 264), plan(128, 2));
        assert_eq!(mma(512, 4096, 4096, 132), plan(128, 1));
        assert_eq!(mma(512, 512, 4096, 264), plan(128, 1));
    }

    /// Llama 3 8B's prefill matmuls on 512 tokens, 132 SMs: the plans `rustle bench
    /// --gemm-plans` measured fastest of the eight on the H200
    /// (docs/lessons.md#prefill-on-tensor-cores).
    #[test]
    fn the_measured_fastest_plans_for_a_short_prompt() {
        // qkv (6144 wide): 96 tiles of 256 leave 36 SMs idle; 128 of 192 fill all but 4.
        assert_eq!(wgmma(512, 4096, 6144, 132), plan(192, 1));
        // o_proj: 128 tiles of 128 in one wave beat 64 of 256, split or not.
        assert_eq!(wgmma(512, 4096, 4096, 132), plan(128, 1));
        // gate (14336): 224 tiles of 256 are two waves, the second 70% full; 256 of 224
        // fill both.
        assert_eq!(wgmma(512, 4096, 14336, 132), plan(224, 1));
        // down: a 14336-deep reduction; 64 tiles of 256 split in two fill one wave.
        assert_eq!(wgmma(512, 14336, 4096, 132), plan(256, 2));
    }

    /// The GGUF blocks' GEMM on the same prompt: its tiles are 128 features by 128 or 256
    /// tokens, one block an SM.
    #[test]
    fn the_blocks_gemm_plans_for_a_short_prompt() {
        // qkv: 48 x 2 = 96 tiles of 256 tokens in one wave; splits would make two.
        assert_eq!(wgmma_blocks(512, 4096, 6144, 132), plan(256, 1));
        // o_proj: 32 x 4 = 128 tiles of 128 tokens fill one wave.
        assert_eq!(wgmma_blocks(512, 4096, 4096, 132), plan(128, 1));
        // down: 64 tiles of 256 split in two fill one wave.
        assert_eq!(wgmma_blocks(512, 14336, 4096, 132), plan(256, 2));
        // A width it runs, whatever the shape.
        for n in [65, 100, 128, 129, 300, 2048] {
            let p = wgmma_blocks(n, 4096, 1000, 132);
            assert!(WGMMA_BLOCKS_WIDTHS.contains(&p.tile_n), "{n}: {p:?}");
        }
    }

    /// `gemm_tuning` keeps the estimate unless a candidate beats it, so the estimate must be
    /// one of them.
    #[test]
    fn the_estimate_is_always_a_candidate() {
        for (n, n_in, n_out) in [
            (32, 4096, 6144),
            (64, 14336, 4096),
            (512, 4096, 14336),
            (64, 576, 1536),
            (200, 1024, 256),
        ] {
            let est = wgmma(n, n_in, n_out, 132);
            assert!(
                wgmma_candidates(n_in).any(|p| p == est),
                "{n} x {n_in} -> {n_out}: {est:?}"
            );
        }
        assert_eq!(wgmma_candidates(4096).count(), 16);
        assert_eq!(wgmma_candidates(1024).count(), 8);
    }

    #[test]
    fn shallow_reductions_are_never_split() {
        for n_out in [64, 1000, 4096] {
            assert_eq!(wgmma(64, 512, n_out, 132).k_splits, 1);
        }
    }
}
