//! `gemv_bf16` and `gemv_swiglu_bf16`: one token through a linear layer.

use cudarc::driver::LaunchConfig;

use super::{In, Out, aligned16, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::traffic;

/// Warps per GEMV block.
pub(super) const GEMV_WARPS: usize = 8;
/// Blocks per SM a GEMV launch should have to keep every SM's loads in flight.
const GEMV_BLOCKS_PER_SM: usize = 8;

/// A GEMV launch over `n_out` rows: a block of 8 warps covers `8 / parts` rows, `parts`
/// warps per row. Small matrices (few rows) get more parts, so that the launch still has
/// enough blocks, and so enough loads in flight, to stream at full bandwidth; at most
/// `max_parts` (at least one), so that no warp's part of a row is too short to keep its
/// loads in flight. `shared_per_warp`: the bytes of shared memory each warp's sums take.
pub(super) fn gemv_launch(
    n_out: usize,
    sm_count: usize,
    max_parts: usize,
    shared_per_warp: usize,
) -> LaunchConfig {
    let parts = [1, 2, 4, 8]
        .into_iter()
        .find(|&p| n_out.div_ceil(GEMV_WARPS / p) >= GEMV_BLOCKS_PER_SM * sm_count)
        .unwrap_or(GEMV_WARPS);
    // No more than `max_parts`, rounded down to a power of two (at least one part).
    let parts = parts.min(1 << max_parts.max(1).ilog2());
    let rows = GEMV_WARPS / parts;
    LaunchConfig {
        grid_dim: (n_out.div_ceil(rows) as u32, 1, 1),
        block_dim: (32 * parts as u32, rows as u32, 1),
        shared_mem_bytes: (GEMV_WARPS * shared_per_warp) as u32,
    }
}

impl Gpu {
    /// One token through a linear layer: out `[n_out]`, x `[n_in]`, w `[n_out, n_in]` bf16,
    /// bias `[n_out]` or none; with `accumulate`, added to what `out` holds (a fused residual).
    pub fn gemv_bf16(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n_in: usize,
        accumulate: bool,
    ) -> Result<()> {
        let n_out = out.len();
        assert!(
            n_in.is_multiple_of(8),
            "gemv_bf16 reads 8 weights at a time: n_in {n_in} must be a multiple of 8"
        );
        assert!(x.len() == n_in && w.len() == n_out * n_in);
        assert!(bias.is_none_or(|b| b.len() == n_out));
        assert!(
            aligned16(w, &self.stream) && aligned16(x, &self.stream),
            "gemv_bf16 needs 16-byte aligned w and x"
        );
        let cfg = gemv_launch(n_out, self.sm_count, GEMV_WARPS, 4);
        let (n_in, n_out, acc) = (
            u32_of(n_in, "n_in"),
            u32_of(n_out, "n_out"),
            accumulate as u32,
        );
        let traffic = traffic::gemv_bf16(n_in as usize, n_out as usize, accumulate, bias.is_some());
        let mut b = self.launcher(&self.kernels.gemv_bf16);
        b.arg(out).arg(x).arg(w).arg_or_null(bias);
        b.arg(&n_in).arg(&n_out).arg(&acc);
        // SAFETY: shapes and alignment checked; the launch gives 8 warps and a float of
        // shared memory per warp; the weights are not written during the launch
        // and x is a different buffer from out.
        self.timed("gemv_bf16", traffic, || unsafe { b.launch(cfg) })
    }

    /// The MLP's gate and up matmuls with SwiGLU, for one token: out `[n_out]`,
    /// x `[n_in]`, w_gate and w_up `[n_out, n_in]` bf16.
    pub fn gemv_swiglu_bf16(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        w_gate: &In<u16>,
        w_up: &In<u16>,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        assert!(n_in.is_multiple_of(8) && x.len() == n_in && out.len() == n_out);
        assert!(w_gate.len() == n_out * n_in && w_up.len() == w_gate.len());
        assert!(
            aligned16(w_gate, &self.stream)
                && aligned16(w_up, &self.stream)
                && aligned16(x, &self.stream)
        );
        let cfg = gemv_launch(n_out, self.sm_count, GEMV_WARPS, 4);
        let (n_in, n_out) = (u32_of(n_in, "n_in"), u32_of(n_out, "n_out"));
        let traffic = traffic::gemv_swiglu_bf16(n_in as usize, n_out as usize);
        let mut b = self.launcher(&self.kernels.gemv_swiglu_bf16);
        b.arg(out)
            .arg(x)
            .arg(w_gate)
            .arg(w_up)
            .arg(&n_in)
            .arg(&n_out);
        // SAFETY: shapes and alignment checked; 8 warps, a float of shared memory each;
        // weights read-only during the launch.
        self.timed("gemv_swiglu_bf16", traffic, || unsafe { b.launch(cfg) })
    }
}

#[cfg(test)]
mod tests {
    use super::gemv_launch;

    /// (threads per row, rows per block, blocks) of a launch.
    fn shape(n_out: usize, max_parts: usize) -> (u32, u32, u32) {
        let cfg = gemv_launch(n_out, 132, max_parts, 4);
        (cfg.block_dim.0, cfg.block_dim.1, cfg.grid_dim.0)
    }

    #[test]
    fn small_matrices_get_more_warps_a_row_up_to_the_cap() {
        // bf16 (a cap of 8): a row per warp for the 8B model's MLP, 4 warps a row for its
        // 4096 rows, 8 for its 1024.
        assert_eq!(shape(14336, 8), (32, 8, 1792));
        assert_eq!(shape(4096, 8), (128, 2, 2048));
        assert_eq!(shape(1024, 8), (256, 1, 1024));
        // fp8 caps the parts at whole steps of a row, rounded down to a power of two.
        assert_eq!(shape(4096, 2), (64, 4, 1024));
        assert_eq!(shape(4096, 7), (128, 2, 2048));
        assert_eq!(shape(1024, 0), (32, 8, 128));
        assert_eq!(gemv_launch(10, 132, 8, 32).shared_mem_bytes, 8 * 32);
    }
}
