//! `gemm_skinny_bf16` and `gemm_skinny_reduce_f32`: linear layers of a few to 128 tokens
//! (batched decode) on tensor cores.

use cudarc::driver::LaunchConfig;

use super::gemm_mma::Bf16Operands;
use super::{In, Out, aligned16, linear, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::tiles::{
    REDUCE_MAX_PARTS, SKINNY_FEATURES, SKINNY_KC, SKINNY_MAX_TILES, SKINNY_THREADS,
    skinny_shared_bytes,
};
use crate::traffic;

/// Most tokens `gemm_skinny_bf16` takes in one launch.
pub const SKINNY_MAX_TOKENS: usize = 8 * SKINNY_MAX_TILES;

/// How many blocks share each output tile's reduction in `gemm_skinny_bf16`: enough for one
/// block per SM (its shared memory allows one), never so many that a block gets fewer than
/// two 64-deep stages, at most 8. It depends on the matrix and the GPU, never on the
/// token count, so that a token's sums are added in the same order whatever the batch.
pub fn skinny_splits(n_in: usize, n_out: usize, sm_count: usize) -> usize {
    let tiles = n_out.div_ceil(SKINNY_FEATURES);
    let chunks = n_in.div_ceil(SKINNY_KC);
    (sm_count / tiles).min(chunks / 2).clamp(1, 8)
}

impl Gpu {
    /// A few tokens through a linear layer on tensor cores (batched decode): out `[n, n_out]`
    /// f32 = x w^T + bias (`ops`: x `[n, n_in]` bf16 from `f32_to_bf16`, w `[n_out, n_in]`
    /// bf16, bias `[n_out]` or none); with `accumulate`, added to what `out` holds. A launch
    /// whose reduction is split (`skinny_splits`) leaves its parts in `parts` (`[splits, n,
    /// n_out]` f32) and adds them with `gemm_skinny_reduce_f32`.
    pub fn gemm_skinny_bf16(
        &self,
        out: &mut Out<f32>,
        ops: Bf16Operands,
        n_in: usize,
        accumulate: bool,
        parts: &mut Out<f32>,
    ) -> Result<()> {
        let (_, n_out) = ops.rows(n_in);
        let splits = skinny_splits(n_in, n_out, self.sm_count);
        self.gemm_skinny_planned(splits, out, ops, n_in, accumulate, parts)
    }

    /// `gemm_skinny_bf16` with the reduction split `splits` ways (1 to 8), chosen by the
    /// caller: for the tests, which hold every split to the twin.
    pub fn gemm_skinny_planned(
        &self,
        splits: usize,
        out: &mut Out<f32>,
        ops: Bf16Operands,
        n_in: usize,
        accumulate: bool,
        parts: &mut Out<f32>,
    ) -> Result<()> {
        let (n, n_out) = ops.rows(n_in);
        let Bf16Operands { x, w, bias } = ops;
        let (x, w, bias) = (&x, &w, bias.as_ref());
        assert!(
            n_in.is_multiple_of(8) && n_in > 0,
            "gemm_skinny_bf16 reads 8 values at a time: n_in {n_in} must be a multiple of 8"
        );
        assert!(
            (1..=SKINNY_MAX_TOKENS).contains(&n),
            "gemm_skinny_bf16 takes 1 to {SKINNY_MAX_TOKENS} tokens, got {n}"
        );
        assert!(x.len() == n * n_in && out.len() == n * n_out && w.len() == n_out * n_in);
        assert!(bias.is_none_or(|b| b.len() == n_out));
        assert!((1..=8).contains(&splits) && (splits == 1 || parts.len() >= splits * n * n_out));
        assert!(
            aligned16(w, &self.stream) && aligned16(x, &self.stream),
            "gemm_skinny_bf16 needs 16-byte aligned w and x"
        );
        let cfg = LaunchConfig {
            grid_dim: (
                u32_of(n_out.div_ceil(SKINNY_FEATURES), "feature tiles"),
                splits as u32,
                1,
            ),
            block_dim: (SKINNY_THREADS as u32, 1, 1),
            shared_mem_bytes: skinny_shared_bytes(n) as u32,
        };
        let traffic = traffic::gemm_skinny_bf16(n, n_in, n_out, bias.is_some(), accumulate, splits);
        let (nn, n_in32, n_out32) = (u32_of(n, "n"), u32_of(n_in, "n_in"), u32_of(n_out, "n_out"));
        let mut b = self.launcher(&self.kernels.gemm_skinny_bf16);
        if splits == 1 {
            b.arg(out).arg(x).arg(w).arg_or_null(bias);
            b.arg(&nn)
                .arg(&n_in32)
                .arg(&n_out32)
                .arg(&(accumulate as u32));
            // SAFETY: shapes and alignment checked; block and shared memory as the kernel
            // documents (its limit raised at load); x and out are different buffers.
            return self.timed("gemm_skinny_bf16", traffic, || unsafe { b.launch(cfg) });
        }
        let parts = parts.slice_mut(..splits * n * n_out);
        b.arg(&parts).arg(x).arg(w).arg_or_null(None::<&In<f32>>);
        b.arg(&nn).arg(&n_in32).arg(&n_out32).arg(&0u32);
        // SAFETY: as above; split, the kernel writes `[splits, n, n_out]` parts, all there.
        self.timed("gemm_skinny_bf16", traffic, || unsafe { b.launch(cfg) })?;
        self.gemm_skinny_reduce_f32(out, &parts.as_view(), bias, n_out, accumulate)
    }

    /// `out[i] = (accumulate ? out[i] : 0) + sum over s of parts[s, i] + bias[i % n_out]`,
    /// the parts added in order: out `[len]`, parts `[splits, len]`, bias `[n_out]` or none.
    pub fn gemm_skinny_reduce_f32(
        &self,
        out: &mut Out<f32>,
        parts: &In<f32>,
        bias: Option<&In<f32>>,
        n_out: usize,
        accumulate: bool,
    ) -> Result<()> {
        let len = out.len();
        assert!(
            len > 0 && n_out > 0 && len.is_multiple_of(n_out) && parts.len().is_multiple_of(len)
        );
        assert!(bias.is_none_or(|b| b.len() == n_out));
        let splits = parts.len() / len;
        assert!(
            (1..=REDUCE_MAX_PARTS).contains(&splits),
            "gemm_skinny_reduce_f32 adds 1 to {REDUCE_MAX_PARTS} parts, not {splits}"
        );
        let cfg = linear(len);
        let traffic =
            traffic::gemm_skinny_reduce_f32(len, n_out, splits, bias.is_some(), accumulate);
        let (len, n_out, splits) = (
            u32_of(len, "len"),
            u32_of(n_out, "n_out"),
            u32_of(splits, "splits"),
        );
        let mut b = self.launcher(&self.kernels.gemm_skinny_reduce_f32);
        b.arg(out).arg(parts).arg_or_null(bias);
        b.arg(&len)
            .arg(&n_out)
            .arg(&splits)
            .arg(&(accumulate as u32));
        // SAFETY: lengths checked; one thread per element of out; parts is another buffer.
        self.timed("gemm_skinny_reduce_f32", traffic, || unsafe {
            b.launch(cfg)
        })
    }
}
