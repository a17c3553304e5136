//! `gemm_<type>` (`gpu-kernels/src/gemm_blocks.rs`): 1 to 64 tokens through a matrix of
//! GGUF blocks on the tensor cores, the weights dequantized in registers; and
//! `gemm_wgmma_<type>` (`gemm_wgmma_blocks.rs`), more tokens on Hopper's warpgroup tensor
//! cores the same way.

use cudarc::driver::{CudaFunction, LaunchConfig};

use super::gemv_quant::{BlocksIn, check_matrix};
use super::table::Kernels;
use super::{In, Out, aligned16, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::gpu::gemm_plan::{self, GemmPlan};
use crate::kernel_args::MatmulShape;
use crate::tiles::{
    BLOCKS_MMA_MAX_TOKENS, BLOCKS_MMA_ROWS, BLOCKS_MMA_STAGE_K, BLOCKS_MMA_THREADS,
    REDUCE_MAX_PARTS, WGMMA_BLOCKS_ROWS, WGMMA_BLOCKS_STAGE_K, WGMMA_BLOCKS_WIDTHS, WGMMA_THREADS,
    blocks_mma_shared_bytes, wgmma_blocks_shared_bytes,
};
use crate::traffic::Traffic;
use crate::weights::blocks::BlockType;

/// How many blocks share each 128-row tile's reduction in `gemm_<type>`: enough for about
/// two blocks per SM, at most `REDUCE_MAX_PARTS`, each with at least 2 of the reduction's
/// 256-wide stages (and every split at least one). It depends on the matrix and the GPU,
/// never on the tokens, so a token's sums are added in the same order whatever the batch.
pub fn blocks_mma_splits(n_in: usize, n_out: usize, sm_count: usize) -> usize {
    let tiles = n_out.div_ceil(BLOCKS_MMA_ROWS);
    let chunks = n_in / BLOCKS_MMA_STAGE_K;
    let mut splits = (2 * sm_count)
        .div_ceil(tiles)
        .min(chunks / 2)
        .clamp(1, REDUCE_MAX_PARTS);
    while splits > 1 && (splits - 1) * chunks.div_ceil(splits) >= chunks {
        splits -= 1;
    }
    splits
}

impl Kernels {
    /// `gemm_<type>` and its name, for the GGUF types.
    pub(super) fn gemm_blocks(&self, ty: BlockType) -> (&CudaFunction, &'static str) {
        match ty {
            BlockType::Q4_0 => (&self.gemm_q4_0, "gemm_q4_0"),
            BlockType::Q4_1 => (&self.gemm_q4_1, "gemm_q4_1"),
            BlockType::Q5_0 => (&self.gemm_q5_0, "gemm_q5_0"),
            BlockType::Q5_1 => (&self.gemm_q5_1, "gemm_q5_1"),
            BlockType::Q8_0 => (&self.gemm_q8_0, "gemm_q8_0"),
            BlockType::Q4K => (&self.gemm_q4_k, "gemm_q4_k"),
            BlockType::Q5K => (&self.gemm_q5_k, "gemm_q5_k"),
            BlockType::Q6K => (&self.gemm_q6_k, "gemm_q6_k"),
            BlockType::Fp8 => panic!("fp8 has no gemm_<type>: gemm_wgmma_fp8 or bf16"),
        }
    }
}

impl Kernels {
    /// `gemm_wgmma_<type>` and its name, where this build has it for the type (sm_90a, and
    /// every GGUF type rustle keeps in blocks).
    pub(super) fn gemm_wgmma_blocks(&self, ty: BlockType) -> Option<(&CudaFunction, &'static str)> {
        let (func, name) = match ty {
            BlockType::Q4_0 => (&self.gemm_wgmma_q4_0, "gemm_wgmma_q4_0"),
            BlockType::Q4_1 => (&self.gemm_wgmma_q4_1, "gemm_wgmma_q4_1"),
            BlockType::Q5_0 => (&self.gemm_wgmma_q5_0, "gemm_wgmma_q5_0"),
            BlockType::Q5_1 => (&self.gemm_wgmma_q5_1, "gemm_wgmma_q5_1"),
            BlockType::Q8_0 => (&self.gemm_wgmma_q8_0, "gemm_wgmma_q8_0"),
            BlockType::Q4K => (&self.gemm_wgmma_q4_k, "gemm_wgmma_q4_k"),
            BlockType::Q5K => (&self.gemm_wgmma_q5_k, "gemm_wgmma_q5_k"),
            BlockType::Q6K => (&self.gemm_wgmma_q6_k, "gemm_wgmma_q6_k"),
            BlockType::Fp8 => return None,
        };
        func.as_ref().map(|f| (f, name))
    }
}

/// Whether `gemm_wgmma_<ty>` takes rows of `n_in` weights: whole stages of the reduction,
/// and rows of whole 16-byte pieces (Q6_K: `n_in` a multiple of 2048).
pub fn wgmma_blocks_fit(ty: BlockType, n_in: usize) -> bool {
    n_in.is_multiple_of(WGMMA_BLOCKS_STAGE_K) && ty.row_bytes(n_in).is_multiple_of(16)
}

impl Gpu {
    /// Whether `gemm_wgmma_<ty>` runs here for rows of `n_in` weights (`wgmma_blocks_fit`).
    pub fn has_wgmma_blocks(&self, ty: BlockType, n_in: usize) -> bool {
        self.kernels.gemm_wgmma_blocks(ty).is_some() && wgmma_blocks_fit(ty, n_in)
    }

    /// The block types whose `gemm_wgmma_<type>` this GPU's build has.
    pub fn wgmma_block_types(&self) -> Vec<BlockType> {
        BlockType::ALL
            .into_iter()
            .filter(|&ty| self.kernels.gemm_wgmma_blocks(ty).is_some())
            .collect()
    }

    /// The tokens' tile width and the split `gemm_wgmma_<type>` runs `n` tokens through an
    /// `n_out x n_in` matrix with on this GPU (one block an SM: its stages fill the shared
    /// memory). Like `blocks_mma_splits`, it does not depend on the matrix's type.
    pub fn wgmma_blocks_plan(&self, n: usize, n_in: usize, n_out: usize) -> GemmPlan {
        gemm_plan::wgmma_blocks(n, n_in, n_out, self.sm_count)
    }

    /// `gemm_wgmma_<ty>`: as `gemm_blocks` (the same contract, `out_stride`, bias,
    /// accumulation and split parts), for more than `BLOCKS_MMA_MAX_TOKENS` tokens, on the
    /// warpgroup tensor cores with `plan`'s tile of tokens and split (`wgmma_blocks_plan`).
    pub fn gemm_wgmma_blocks(
        &self,
        out: &mut Out<f32>,
        x: &In<u16>,
        w: &BlocksIn,
        bias: Option<&In<f32>>,
        shape: MatmulShape,
        plan: GemmPlan,
    ) -> Result<()> {
        let [n, n_in, n_out, _] = shape.sizes();
        let ty = w.ty;
        let Some((func, name)) = self.kernels.gemm_wgmma_blocks(ty) else {
            return Err(crate::error::Error::Unsupported(format!(
                "gemm_wgmma_{ty} needs a Hopper GPU (sm_90a) and a GGUF type (fp8 takes \
                 gemm_wgmma_fp8)"
            )));
        };
        check_matrix(self, w, n_out, n_in);
        assert!(
            n_in.is_multiple_of(WGMMA_BLOCKS_STAGE_K),
            "{name} takes the reduction in stages of {WGMMA_BLOCKS_STAGE_K}: n_in {n_in}"
        );
        assert!(
            ty.row_bytes(n_in).is_multiple_of(16),
            "{name} copies rows in 16-byte pieces: n_in {n_in} makes rows of {} bytes",
            ty.row_bytes(n_in)
        );
        let (tile_t, splits) = (plan.tile_n, plan.k_splits);
        assert!(
            WGMMA_BLOCKS_WIDTHS.contains(&tile_t),
            "{name} has no tile of {tile_t} tokens"
        );
        // A split past the reduction's last stage stores zeros, as its part of the sum.
        assert!(
            n_in > 0 && (1..=REDUCE_MAX_PARTS).contains(&splits),
            "{name} splits the reduction 1 to {REDUCE_MAX_PARTS} ways, not {splits}"
        );
        assert!(n >= 1);
        let cfg = LaunchConfig {
            grid_dim: (
                u32_of(n_out.div_ceil(WGMMA_BLOCKS_ROWS), "row tiles"),
                u32_of(n.div_ceil(tile_t), "token tiles"),
                splits as u32,
            ),
            block_dim: (WGMMA_THREADS as u32, 1, 1),
            shared_mem_bytes: wgmma_blocks_shared_bytes(ty.block_len(), ty.block_bytes()) as u32,
        };
        let traffic = self.check_blocks_gemm(out, x, w, bias, shape, splits);
        let tile = tile_t as u32;
        let mut b = self.launcher(func);
        b.arg(out).arg(x).arg(&w.bytes).arg_or_null(bias);
        b.arg(&shape).arg(&tile);
        // SAFETY: the matrix is whole aligned blocks of its type (checked), in rows of whole
        // stages; a split past the last stage stores zeros; x holds the tokens' rows 16-byte
        // aligned, out every split's tokens' n_out columns (checked); x and out are
        // different buffers; the weights are read-only.
        self.timed(name, traffic, || unsafe { b.launch(cfg) })
    }

    /// The checks both GEMMs over GGUF blocks make of the output, input and bias, after
    /// their own checks of the matrix and the split; and the bytes and products the
    /// profiler counts.
    fn check_blocks_gemm(
        &self,
        out: &Out<f32>,
        x: &In<u16>,
        w: &BlocksIn,
        bias: Option<&In<f32>>,
        shape: MatmulShape,
        splits: usize,
    ) -> Traffic {
        let [n, n_in, n_out, out_stride] = shape.sizes();
        let accumulate = shape.accumulates();
        assert!(splits == 1 || (bias.is_none() && !accumulate));
        assert!(x.len() == n * n_in && aligned16(x, &self.stream));
        assert!(n_out <= out_stride);
        assert!(out.len() >= ((splits - 1) * n + n - 1) * out_stride + n_out);
        assert!(bias.is_none_or(|b| b.len() == n_out));
        Traffic {
            bytes: (w.bytes.len()
                + 2 * n * n_in
                + 4 * n * n_out * (splits + accumulate as usize)
                + 4 * bias.map_or(0, |b| b.len())) as u64,
            flops: (2 * n * n_in * n_out) as u64,
        }
    }

    /// `gemm_<ty>`: out (`[n, out_stride]`, this matrix's columns `0..n_out`) (+)= x w^T +
    /// bias `[n_out]`, x `[n, n_in]` bf16 (from `f32_to_bf16`), w `[n_out]` rows of `w.ty`
    /// (`n` is `shape.n_tokens`). With `splits > 1` the reduction is split that many ways
    /// (`blocks_mma_splits`) and `out` takes the parts, `[splits, n, out_stride]` (no bias,
    /// no accumulate): the caller adds them with `gemm_skinny_reduce_f32`, once for all the
    /// matrix's runs of rows.
    pub fn gemm_blocks(
        &self,
        out: &mut Out<f32>,
        x: &In<u16>,
        w: &BlocksIn,
        bias: Option<&In<f32>>,
        shape: MatmulShape,
        splits: usize,
    ) -> Result<()> {
        let [n, n_in, n_out, _] = shape.sizes();
        let ty = w.ty;
        assert!(ty != BlockType::Fp8, "fp8 has no gemm_<type>");
        check_matrix(self, w, n_out, n_in);
        assert!(
            n_in.is_multiple_of(BLOCKS_MMA_STAGE_K),
            "gemm_{ty} takes the reduction in stages of {BLOCKS_MMA_STAGE_K}: n_in {n_in}"
        );
        assert!(
            (1..=BLOCKS_MMA_MAX_TOKENS).contains(&n),
            "gemm_{ty} takes 1 to {BLOCKS_MMA_MAX_TOKENS} tokens, got {n}"
        );
        let chunks = n_in / BLOCKS_MMA_STAGE_K;
        assert!(
            (1..=REDUCE_MAX_PARTS).contains(&splits)
                && (splits - 1) * chunks.div_ceil(splits) < chunks,
            "every one of the {splits} splits needs a stage of the {chunks}"
        );
        let cfg = LaunchConfig {
            grid_dim: (
                u32_of(n_out.div_ceil(BLOCKS_MMA_ROWS), "row tiles"),
                splits as u32,
                1,
            ),
            block_dim: (BLOCKS_MMA_THREADS as u32, 1, 1),
            shared_mem_bytes: blocks_mma_shared_bytes(n, ty.block_len(), ty.block_bytes()) as u32,
        };
        let (func, name) = self.kernels.gemm_blocks(ty);
        let traffic = self.check_blocks_gemm(out, x, w, bias, shape, splits);
        let mut b = self.launcher(func);
        b.arg(out).arg(x).arg(&w.bytes).arg_or_null(bias);
        b.arg(&shape);
        // SAFETY: the matrix is whole aligned blocks of its type (checked), in rows of whole
        // stages; every split has a stage; 1 to 64 tokens; x holds the tokens' rows 16-byte
        // aligned, out every split's tokens' n_out columns (checked); x and out are
        // different buffers; the weights are read-only.
        self.timed(name, traffic, || unsafe { b.launch(cfg) })
    }
}
