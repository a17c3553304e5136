//! `gemm_mma_bf16`, the prompt GEMM on `mma.sync` tensor cores (any GPU from sm_80), the
//! launch it shares with the warpgroup GEMM, `f32_to_bf16` (its input), and the
//! tensor-core probe.

use cudarc::driver::{CudaFunction, LaunchConfig};

use super::{In, Out, aligned16, linear, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::gpu::gemm_plan::{self, GemmPlan};
use crate::tiles::{MMA_BM, MMA_SHARED_BYTES, MMA_THREADS};
use crate::traffic::{self, Traffic};

/// A bf16 tensor-core GEMM's inputs (`gemm_mma_bf16`'s, `gemm_wgmma_bf16`'s,
/// `gemm_skinny_bf16`'s): `out = x w^T + bias`.
pub struct Bf16Operands<'a> {
    /// `[n, n_in]` bf16, the activations rounded by `f32_to_bf16`
    pub x: In<'a, u16>,
    /// `[n_out, n_in]` bf16
    pub w: In<'a, u16>,
    /// `[n_out]`, or none
    pub bias: Option<In<'a, f32>>,
}

impl Bf16Operands<'_> {
    /// `(n, n_out)`: the tokens of `x` and the rows of `w`, each `n_in` long.
    pub(super) fn rows(&self, n_in: usize) -> (usize, usize) {
        (self.x.len() / n_in.max(1), self.w.len() / n_in.max(1))
    }
}

/// What the two tensor-core GEMMs' launches differ in.
pub(super) struct TensorGemm {
    pub(super) name: &'static str,
    /// Tokens of the output tile a block computes.
    pub(super) tile_m: usize,
    pub(super) threads: usize,
    /// Dynamic shared memory per block.
    pub(super) shared: usize,
    /// Whether the kernel takes the tile width after the sizes, and then the tensor maps of
    /// `w` in boxes of that many rows and of `x` in boxes of `tile_m` (`gemm_wgmma_bf16`,
    /// whose producer copies both by the Tensor Memory Accelerator).
    pub(super) takes_tile_n: bool,
    /// How a split reduction's parts meet: false, both halves `red.add` into the zeroed
    /// output; true, each part is stored apart (`out` is `[k_splits, n, n_out]`) for the
    /// caller to add in order.
    pub(super) split_parts: bool,
    pub(super) traffic: fn(usize, usize, usize, bool) -> Traffic,
}

impl TensorGemm {
    /// The grid of output tiles `plan` says (tokens by `tile_m`, features by its width, the
    /// reduction in its splits), blocks of the kernel's threads and shared memory.
    pub(super) fn launch(&self, plan: GemmPlan, n: usize, n_out: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (
                n_out.div_ceil(plan.tile_n) as u32,
                u32_of(n.div_ceil(self.tile_m), "token tiles"),
                plan.k_splits as u32,
            ),
            block_dim: (self.threads as u32, 1, 1),
            shared_mem_bytes: self.shared as u32,
        }
    }
}

/// `gemm_mma_bf16`.
const MMA_GEMM: TensorGemm = TensorGemm {
    name: "gemm_mma_bf16",
    tile_m: MMA_BM,
    threads: MMA_THREADS,
    shared: MMA_SHARED_BYTES,
    takes_tile_n: false,
    split_parts: false,
    traffic: traffic::gemm_mma_bf16,
};

impl Gpu {
    /// Many tokens through a linear layer on tensor cores (`mma.sync`, any GPU from sm_80):
    /// out `[n, n_out]` f32 = x w^T + bias, the operands' rows `n_in` long.
    pub fn gemm_mma_bf16(&self, out: &mut Out<f32>, ops: Bf16Operands, n_in: usize) -> Result<()> {
        let (n, n_out) = ops.rows(n_in);
        let plan = gemm_plan::mma(n, n_in, n_out, self.gemm_slots.mma);
        self.gemm_mma_planned(plan, out, ops, n_in)
    }

    /// `gemm_mma_bf16` on the plan the caller chose (`gemm_plan::mma`'s, or another to
    /// measure).
    pub fn gemm_mma_planned(
        &self,
        plan: GemmPlan,
        out: &mut Out<f32>,
        ops: Bf16Operands,
        n_in: usize,
    ) -> Result<()> {
        let func = &self.kernels.gemm_mma_bf16;
        self.tensor_gemm(func, &MMA_GEMM, plan, out, ops, n_in)
    }

    /// The launch both tensor-core GEMMs share: same arguments, same checks, a grid of
    /// output tiles as `plan` says (and the tile width as a last argument to the warpgroup
    /// kernel, which takes several).
    pub(super) fn tensor_gemm(
        &self,
        func: &CudaFunction,
        k: &TensorGemm,
        plan: GemmPlan,
        out: &mut Out<f32>,
        ops: Bf16Operands,
        n_in: usize,
    ) -> Result<()> {
        let name = k.name;
        let (n, n_out) = ops.rows(n_in);
        let Bf16Operands { x, w, bias } = ops;
        let (x, w, bias) = (&x, &w, bias.as_ref());
        assert!(
            n_in.is_multiple_of(8),
            "{name} moves 8 values at a time: n_in {n_in} must be a multiple of 8"
        );
        let parts = if k.split_parts { plan.k_splits } else { 1 };
        assert!(x.len() == n * n_in && out.len() == parts * n * n_out && w.len() == n_out * n_in);
        assert!(bias.is_none_or(|b| b.len() == n_out));
        assert!(
            aligned16(w, &self.stream) && aligned16(x, &self.stream),
            "{name} needs 16-byte aligned w and x"
        );
        if plan.k_splits > 1 && !k.split_parts {
            // Timed like a kernel, so that a profile counts what the split costs.
            let traffic = traffic::zero_f32(out.len());
            self.timed("zero_f32 (split GEMM)", traffic, || {
                self.stream.memset_zeros(out)
            })?;
        }
        let cfg = k.launch(plan, n, n_out);
        let traffic = (k.traffic)(n, n_in, n_out, bias.is_some());
        let (n, n_in, n_out) = (u32_of(n, "n"), u32_of(n_in, "n_in"), u32_of(n_out, "n_out"));
        let tile_n = plan.tile_n as u32;
        let mut b = self.launcher(func);
        b.arg(out).arg(x).arg(w).arg_or_null(bias);
        b.arg(&n).arg(&n_in).arg(&n_out);
        let maps;
        if k.takes_tile_n {
            let (rows, n_out, n_in) = (n as usize, n_out as usize, n_in as usize);
            maps = [
                self.matrix_map(w, n_out, n_in, plan.tile_n)?,
                self.matrix_map(x, rows, n_in, k.tile_m)?,
            ];
            b.arg(&tile_n).arg(&maps[0]).arg(&maps[1]);
        }
        // SAFETY: shapes and alignment checked; the block size and shared memory the kernel
        // documents (its limit raised to that when the module loaded), the grid covers the
        // output in tiles of the width the kernel is told (and the map's boxes are that
        // wide), and the output is zeroed when the reduction is split.
        self.timed(name, traffic, || unsafe { b.launch(cfg) })
    }

    /// The tensor-core probe: `out.len()` threads in blocks of 256 (a multiple of 256),
    /// each `iters` rounds of 16 `mma.sync` on register operands `a_bits`, `b_bits` (bf16).
    pub fn mma_probe_bf16(
        &self,
        out: &mut Out<f32>,
        a_bits: u16,
        b_bits: u16,
        iters: u32,
    ) -> Result<()> {
        assert!(!out.is_empty() && out.len().is_multiple_of(256));
        let cfg = LaunchConfig {
            grid_dim: (u32_of(out.len() / 256, "blocks"), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let traffic = traffic::mma_probe_bf16(out.len(), iters as usize);
        let (a, b) = (a_bits as u32, b_bits as u32);
        let mut l = self.launcher(&self.kernels.mma_probe_bf16);
        l.arg(out).arg(&a).arg(&b).arg(&iters);
        // SAFETY: one float of `out` per thread of the launch; 256 threads, whole warps.
        self.timed("mma_probe_bf16", traffic, || unsafe { l.launch(cfg) })
    }

    /// `out = bf16(x)`, rounded to nearest even: out `[len]` bf16, x `[len]` f32.
    pub fn f32_to_bf16(&self, out: &mut Out<u16>, x: &In<f32>) -> Result<()> {
        let len = x.len();
        assert!(
            len.is_multiple_of(2) && out.len() == len,
            "f32_to_bf16 converts pairs"
        );
        let cfg = linear(len / 2);
        let traffic = traffic::f32_to_bf16(len);
        let len = u32_of(len, "len");
        let mut b = self.launcher(&self.kernels.f32_to_bf16);
        b.arg(out).arg(x).arg(&len);
        // SAFETY: lengths checked and even; device allocations are aligned far beyond the
        // 8 bytes a pair needs (views here always start at an even element).
        self.timed("f32_to_bf16", traffic, || unsafe { b.launch(cfg) })
    }
}
