//! The kernel table and one checked launch wrapper per kernel: assert the preconditions the
//! kernel's doc header lists, then launch under a `// SAFETY:` note.
//!
//! Each wrapper has the kernel's name and argument order; lengths that a view carries are
//! checked against each other rather than passed twice.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, CudaView, CudaViewMut, DeviceRepr, LaunchConfig};

use super::context::Gpu;
use super::gemm_plan::{self, GemmPlan};
use super::launch::Launch;
use crate::block_manager::BLOCK_SIZE;
use crate::error::{Error, Result};
use crate::traffic::{self, Traffic};

/// An input buffer on the device.
pub type In<'a, T> = CudaView<'a, T>;
/// An output buffer on the device.
pub type Out<'a, T> = CudaViewMut<'a, T>;

macro_rules! kernel_table {
    ($($name:ident),* $(,)?; optional: $($opt:ident),* $(,)?) => {
        /// Every kernel of the PTX module, looked up by name once, when the module loads;
        /// the optional ones are in some builds only (see `ptx_for`).
        #[derive(Clone)]
        pub struct Kernels {
            $(pub $name: CudaFunction,)*
            $(pub $opt: Option<CudaFunction>,)*
        }

        impl Kernels {
            /// The kernels every build has.
            pub const NAMES: &[&str] = &[$(stringify!($name)),*];

            pub fn load(module: &Arc<CudaModule>) -> Result<Kernels> {
                let kernels = Kernels {
                    $($name: module.load_function(stringify!($name)).map_err(|e| {
                        Error::Gpu(format!("kernel {} is not in the PTX: {e}", stringify!($name)))
                    })?,)*
                    $($opt: module.load_function(stringify!($opt)).ok(),)*
                };
                kernels.raise_limits()?;
                Ok(kernels)
            }
        }
    };
}

kernel_table!(
    embedding_bf16,
    rmsnorm_f32,
    gemv_bf16,
    gemv_swiglu_bf16,
    gemm_bf16,
    gemm_mma_bf16,
    gemm_skinny_bf16,
    gemm_skinny_reduce_f32,
    f32_to_bf16,
    mma_probe_bf16,
    rope_f32,
    qkv_rope_write_bf16,
    kv_write_f32,
    attention_f32,
    attention_bf16,
    attention_mma_bf16,
    attention_split_bf16,
    attention_combine_f32,
    swiglu_f32,
    residual_add_f32,
    argmax_f32,
    fill_random_bf16,
    read_probe_u32;
    optional: gemm_wgmma_bf16,
);

impl Kernels {
    /// Kernels that need more than the default 48 KiB of dynamic shared memory ask for it
    /// once, here.
    fn raise_limits(&self) -> Result<()> {
        let big = [
            (Some(&self.gemm_mma_bf16), "gemm_mma_bf16", MMA_SHARED_BYTES),
            (
                Some(&self.gemm_skinny_bf16),
                "gemm_skinny_bf16",
                [1, 2, 4, 8, SKINNY_MAX_TILES]
                    .map(|tiles| skinny_shared_bytes(8 * tiles))
                    .into_iter()
                    .max()
                    .unwrap_or(0),
            ),
            (
                self.gemm_wgmma_bf16.as_ref(),
                "gemm_wgmma_bf16",
                WGMMA_SHARED_BYTES,
            ),
            (
                Some(&self.attention_mma_bf16),
                "attention_mma_bf16",
                attn_mma_shared_bytes(128),
            ),
        ];
        for (func, name, bytes) in big {
            use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_SHARED;
            let Some(func) = func else { continue };
            func.set_attribute(MAX_SHARED, bytes as i32).map_err(|e| {
                Error::Gpu(format!(
                    "{name} needs {bytes} bytes of shared memory per block: {e}"
                ))
            })?;
        }
        Ok(())
    }
}

/// Whether a device buffer starts on a 16-byte boundary (the 16-byte loads need it).
fn aligned16<T>(v: &In<T>, stream: &cudarc::driver::CudaStream) -> bool {
    use cudarc::driver::DevicePtr;
    let (ptr, _sync) = v.device_ptr(stream);
    ptr % 16 == 0
}

/// One-dimensional launch of `n` threads in blocks of 256.
fn linear(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).max(1) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Warps per GEMV block.
const GEMV_WARPS: usize = 8;
/// Blocks a GEMV launch should have to keep every SM busy: 132 SMs (H200) x 8.
const GEMV_TARGET_BLOCKS: usize = 132 * 8;

/// A GEMV launch over `n_out` rows: a block of 8 warps covers `8 / parts` rows, `parts`
/// warps per row. Small matrices (few rows) get more parts, so that the launch still has
/// enough blocks, and so enough loads in flight, to stream at full bandwidth.
fn gemv_launch(n_out: usize) -> LaunchConfig {
    let parts = [1, 2, 4, 8]
        .into_iter()
        .find(|&p| n_out.div_ceil(GEMV_WARPS / p) >= GEMV_TARGET_BLOCKS)
        .unwrap_or(GEMV_WARPS);
    let rows = GEMV_WARPS / parts;
    LaunchConfig {
        grid_dim: (n_out.div_ceil(rows) as u32, 1, 1),
        block_dim: (32 * parts as u32, rows as u32, 1),
        shared_mem_bytes: (GEMV_WARPS * 4) as u32,
    }
}

use super::tiles::{
    ATTN_MMA_ROWS, ATTN_MMA_THREADS, MMA_BM, MMA_SHARED_BYTES, MMA_THREADS, SKINNY_FEATURES,
    SKINNY_KC, SKINNY_MAX_TILES, SKINNY_THREADS, WGMMA_BM, WGMMA_SHARED_BYTES, WGMMA_THREADS,
    WGMMA_WIDTHS, attn_mma_shared_bytes, skinny_shared_bytes,
};

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

/// Whether `attention_mma_bf16` takes heads of this width.
pub fn attention_mma_supports(head_dim: usize) -> bool {
    head_dim == 64 || head_dim == 128
}

/// What the two tensor-core GEMMs' launches differ in.
struct TensorGemm {
    name: &'static str,
    /// Tokens of the output tile a block computes.
    tile_m: usize,
    threads: usize,
    /// Dynamic shared memory per block.
    shared: usize,
    /// Whether the kernel takes the tile width as its last argument.
    takes_tile_n: bool,
    traffic: fn(usize, usize, usize, bool) -> Traffic,
}

/// Blocks of each tensor-core GEMM that run at once on this GPU (per SM, as shared memory
/// and registers allow, times SMs): what `gemm_plan` counts waves in. Measured once, when the
/// module loads.
#[derive(Clone, Copy, Debug)]
pub struct GemmSlots {
    pub mma: usize,
    /// 0 without `gemm_wgmma_bf16`.
    pub wgmma: usize,
}

impl Kernels {
    pub(super) fn gemm_slots(&self, sm_count: usize) -> Result<GemmSlots> {
        let slots = |func: &CudaFunction, k: &TensorGemm| -> Result<usize> {
            let per_sm = func
                .occupancy_max_active_blocks_per_multiprocessor(k.threads as u32, k.shared, None)
                .map_err(|e| Error::Gpu(format!("{}'s occupancy: {e}", k.name)))?;
            Ok(per_sm as usize * sm_count)
        };
        Ok(GemmSlots {
            mma: slots(&self.gemm_mma_bf16, &MMA_GEMM)?,
            wgmma: match &self.gemm_wgmma_bf16 {
                Some(func) => slots(func, &WGMMA_GEMM)?,
                None => 0,
            },
        })
    }
}

/// `gemm_mma_bf16`.
const MMA_GEMM: TensorGemm = TensorGemm {
    name: "gemm_mma_bf16",
    tile_m: MMA_BM,
    threads: MMA_THREADS,
    shared: MMA_SHARED_BYTES,
    takes_tile_n: false,
    traffic: traffic::gemm_mma_bf16,
};

/// `gemm_wgmma_bf16`.
const WGMMA_GEMM: TensorGemm = TensorGemm {
    name: "gemm_wgmma_bf16",
    tile_m: WGMMA_BM,
    threads: WGMMA_THREADS,
    shared: WGMMA_SHARED_BYTES,
    takes_tile_n: true,
    traffic: traffic::gemm_wgmma_bf16,
};

/// Threads per block of RMSNorm: a whole row of up to 8192 in one round of loads.
const ROW_THREADS: u32 = 1024;
const ATTENTION_THREADS: u32 = 128;
const ARGMAX_THREADS: u32 = 1024;

fn u32_of(n: usize, what: &str) -> u32 {
    u32::try_from(n).unwrap_or_else(|_| panic!("{what} = {n} does not fit a kernel's u32 argument"))
}

impl Gpu {
    /// A launch of `func` on the stream, overlapping the kernel before it where the GPU
    /// supports it.
    fn launcher<'a>(&'a self, func: &'a CudaFunction) -> Launch<'a> {
        Launch::new(&self.stream, func, self.pdl)
    }

    /// `out[t, :] = table[tokens[t], :]`: out `[n, dim]` f32, table `[vocab, dim]` bf16,
    /// tokens `[n]`.
    pub fn embedding_bf16(
        &self,
        out: &mut Out<f32>,
        table: &In<u16>,
        tokens: &In<u32>,
        dim: usize,
    ) -> Result<()> {
        let n = tokens.len();
        assert!(dim > 0 && out.len() >= n * dim && table.len() % dim == 0);
        let cfg = LaunchConfig {
            grid_dim: (dim.div_ceil(256) as u32, u32_of(n, "n"), 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let dim = u32_of(dim, "dim");
        let traffic = traffic::embedding_bf16(n, dim as usize);
        let mut b = self.launcher(&self.kernels.embedding_bf16);
        b.arg(out).arg(table).arg(tokens).arg(&dim);
        // SAFETY: shapes checked above; every token id is below the vocabulary size (the
        // runner checks ids on the host before they reach the device).
        self.timed("embedding_bf16", traffic, || unsafe { b.launch(cfg) })
    }

    /// RMSNorm of `n_rows = x.len() / dim` rows: out, x `[n_rows, dim]`, weight `[dim]`.
    pub fn rmsnorm_f32(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        weight: &In<f32>,
        eps: f32,
        dim: usize,
    ) -> Result<()> {
        let rows = x.len() / dim;
        assert!(dim > 0 && x.len() == rows * dim && out.len() == x.len() && weight.len() == dim);
        let cfg = LaunchConfig {
            grid_dim: (u32_of(rows, "rows"), 1, 1),
            block_dim: (ROW_THREADS, 1, 1),
            shared_mem_bytes: 32 * 4,
        };
        let dim = u32_of(dim, "dim");
        let traffic = traffic::rmsnorm_f32(rows, dim as usize);
        let mut b = self.launcher(&self.kernels.rmsnorm_f32);
        b.arg(out).arg(x).arg(weight).arg(&eps).arg(&dim);
        // SAFETY: shapes checked; 1024 threads (a multiple of 32) and 32 floats of shared memory.
        self.timed("rmsnorm_f32", traffic, || unsafe { b.launch(cfg) })
    }

    /// One token through a linear layer: out `[n_out]`, x `[n_in]`, w `[n_out, n_in]` bf16,
    /// bias `[n_out]` or none; with `accumulate`, added to what `out` holds (a fused residual).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_bf16(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n_in: usize,
        n_out: usize,
        accumulate: bool,
    ) -> Result<()> {
        assert!(
            n_in.is_multiple_of(8),
            "gemv_bf16 reads 8 weights at a time: n_in {n_in} must be a multiple of 8"
        );
        assert!(x.len() == n_in && out.len() == n_out && w.len() == n_out * n_in);
        assert!(bias.is_none_or(|b| b.len() == n_out));
        assert!(
            aligned16(w, &self.stream) && aligned16(x, &self.stream),
            "gemv_bf16 needs 16-byte aligned w and x"
        );
        let cfg = gemv_launch(n_out);
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
        let cfg = gemv_launch(n_out);
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

    /// Many tokens through a linear layer: out `[n, n_out]`, x `[n, n_in]`,
    /// w `[n_out, n_in]` bf16, bias `[n_out]` or none.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bf16(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        assert!(x.len() == n * n_in && out.len() == n * n_out && w.len() == n_out * n_in);
        assert!(bias.is_none_or(|b| b.len() == n_out));
        let cfg = LaunchConfig {
            grid_dim: (n_out.div_ceil(64) as u32, n.div_ceil(64) as u32, 1),
            block_dim: (16, 16, 1),
            shared_mem_bytes: 2 * 16 * 65 * 4,
        };
        let (n, n_in, n_out) = (u32_of(n, "n"), u32_of(n_in, "n_in"), u32_of(n_out, "n_out"));
        let traffic = traffic::gemm_bf16(n as usize, n_in as usize, n_out as usize, bias.is_some());
        let mut b = self.launcher(&self.kernels.gemm_bf16);
        b.arg(out).arg(x).arg(w).arg_or_null(bias);
        b.arg(&n).arg(&n_in).arg(&n_out);
        // SAFETY: shapes checked; block (16, 16), the grid covers the output in 64 x 64
        // tiles, and the two shared tiles get their 8320 bytes.
        self.timed("gemm_bf16", traffic, || unsafe { b.launch(cfg) })
    }

    /// Many tokens through a linear layer on tensor cores (`mma.sync`, any GPU from sm_80):
    /// out `[n, n_out]` f32, x `[n, n_in]` bf16 (from `f32_to_bf16`), w `[n_out, n_in]`
    /// bf16, bias `[n_out]` or none.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_mma_bf16(
        &self,
        out: &mut Out<f32>,
        x: &In<u16>,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        let func = &self.kernels.gemm_mma_bf16;
        let plan = gemm_plan::mma(n, n_in, n_out, self.gemm_slots.mma);
        self.tensor_gemm(func, &MMA_GEMM, plan, out, x, w, bias, n, n_in, n_out)
    }

    /// As `gemm_mma_bf16`, on Hopper's warpgroup tensor cores (`wgmma`): an error on a GPU
    /// without them (the kernel is in the sm_90a build only).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_wgmma_bf16(
        &self,
        out: &mut Out<f32>,
        x: &In<u16>,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        let plan = self.wgmma_plan(n, n_in, n_out)?;
        self.gemm_wgmma_planned(plan, out, x, w, bias, n, n_in, n_out)
    }

    /// The tile width and split `gemm_wgmma_bf16` runs `n` tokens through an
    /// `n_out x n_in` matrix with on this GPU.
    pub fn wgmma_plan(&self, n: usize, n_in: usize, n_out: usize) -> Result<GemmPlan> {
        self.wgmma_kernel()?;
        Ok(gemm_plan::wgmma(n, n_in, n_out, self.gemm_slots.wgmma))
    }

    /// `gemm_wgmma_bf16` with the tile width and split chosen by the caller (one of
    /// `WGMMA_WIDTHS`, 1 or 2), not by `gemm_plan::wgmma`: for measuring the plans.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_wgmma_planned(
        &self,
        plan: GemmPlan,
        out: &mut Out<f32>,
        x: &In<u16>,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        assert!(WGMMA_WIDTHS.contains(&plan.tile_n) && (1..=2).contains(&plan.k_splits));
        let func = self.wgmma_kernel()?;
        self.tensor_gemm(func, &WGMMA_GEMM, plan, out, x, w, bias, n, n_in, n_out)
    }

    fn wgmma_kernel(&self) -> Result<&CudaFunction> {
        self.kernels.gemm_wgmma_bf16.as_ref().ok_or_else(|| {
            Error::Gpu(format!(
                "gemm_wgmma_bf16 needs a GPU of compute capability 9.0 (Hopper); this is {}",
                self.description
            ))
        })
    }

    /// Whether this GPU runs `gemm_wgmma_bf16`.
    pub fn has_wgmma(&self) -> bool {
        self.kernels.gemm_wgmma_bf16.is_some()
    }

    /// The prefill's matmul: `gemm_wgmma_bf16` where the GPU has it, else `gemm_mma_bf16`.
    #[allow(clippy::too_many_arguments)]
    pub fn prefill_gemm(
        &self,
        out: &mut Out<f32>,
        x: &In<u16>,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        if self.has_wgmma() {
            self.gemm_wgmma_bf16(out, x, w, bias, n, n_in, n_out)
        } else {
            self.gemm_mma_bf16(out, x, w, bias, n, n_in, n_out)
        }
    }

    /// The launch both tensor-core GEMMs share: same arguments, same checks, a grid of
    /// output tiles as `plan` says (and the tile width as a last argument to the warpgroup
    /// kernel, which takes several).
    #[allow(clippy::too_many_arguments)]
    fn tensor_gemm(
        &self,
        func: &CudaFunction,
        k: &TensorGemm,
        plan: GemmPlan,
        out: &mut Out<f32>,
        x: &In<u16>,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        let name = k.name;
        assert!(
            n_in.is_multiple_of(8),
            "{name} moves 8 values at a time: n_in {n_in} must be a multiple of 8"
        );
        assert!(x.len() == n * n_in && out.len() == n * n_out && w.len() == n_out * n_in);
        assert!(bias.is_none_or(|b| b.len() == n_out));
        assert!(
            aligned16(w, &self.stream) && aligned16(x, &self.stream),
            "{name} needs 16-byte aligned w and x"
        );
        if plan.k_splits > 1 {
            // Timed like a kernel, so that a profile counts what the split costs.
            let traffic = traffic::zero_f32(out.len());
            self.timed("zero_f32 (split GEMM)", traffic, || {
                self.stream.memset_zeros(out)
            })?;
        }
        let cfg = LaunchConfig {
            grid_dim: (
                n_out.div_ceil(plan.tile_n) as u32,
                u32_of(n.div_ceil(k.tile_m), "token tiles"),
                plan.k_splits as u32,
            ),
            block_dim: (k.threads as u32, 1, 1),
            shared_mem_bytes: k.shared as u32,
        };
        let traffic = (k.traffic)(n, n_in, n_out, bias.is_some());
        let (n, n_in, n_out) = (u32_of(n, "n"), u32_of(n_in, "n_in"), u32_of(n_out, "n_out"));
        let tile_n = plan.tile_n as u32;
        let mut b = self.launcher(func);
        b.arg(out).arg(x).arg(w).arg_or_null(bias);
        b.arg(&n).arg(&n_in).arg(&n_out);
        if k.takes_tile_n {
            b.arg(&tile_n);
        }
        // SAFETY: shapes and alignment checked; the block size and shared memory the kernel
        // documents (its limit raised to that when the module loaded), the grid covers the
        // output in tiles of the width the kernel is told, and the output is zeroed when the
        // reduction is split.
        self.timed(name, traffic, || unsafe { b.launch(cfg) })
    }

    /// A few tokens through a linear layer on tensor cores (batched decode): out `[n, n_out]`
    /// f32, x `[n, n_in]` bf16 (from `f32_to_bf16`), w `[n_out, n_in]` bf16, bias `[n_out]`
    /// or none; with `accumulate`, added to what `out` holds. A launch whose reduction is
    /// split (`skinny_splits`) leaves its parts in `parts` (`[splits, n, n_out]` f32) and adds
    /// them with `gemm_skinny_reduce_f32`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_skinny_bf16(
        &self,
        out: &mut Out<f32>,
        x: &In<u16>,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n_in: usize,
        n_out: usize,
        accumulate: bool,
        parts: &mut Out<f32>,
    ) -> Result<()> {
        let splits = skinny_splits(n_in, n_out, self.sm_count);
        self.gemm_skinny_planned(splits, out, x, w, bias, n_in, n_out, accumulate, parts)
    }

    /// `gemm_skinny_bf16` with the reduction split `splits` ways (1 to 8), chosen by the
    /// caller: for the tests, which hold every split to the twin.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_skinny_planned(
        &self,
        splits: usize,
        out: &mut Out<f32>,
        x: &In<u16>,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n_in: usize,
        n_out: usize,
        accumulate: bool,
        parts: &mut Out<f32>,
    ) -> Result<()> {
        let n = x.len() / n_in.max(1);
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

    /// Rotate-half RoPE in place: x `[n, n_heads, head_dim]`, positions `[n]`, cos and sin
    /// `[max_pos, head_dim / 2]`.
    pub fn rope_f32(
        &self,
        x: &mut Out<f32>,
        positions: &In<u32>,
        cos: &In<f32>,
        sin: &In<f32>,
        n_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let n = positions.len();
        assert!(
            head_dim.is_multiple_of(2)
                && x.len() == n * n_heads * head_dim
                && cos.len() == sin.len()
        );
        assert!(cos.len() % (head_dim / 2) == 0);
        let cfg = linear(n * n_heads * head_dim / 2);
        let (n_heads, head_dim, n) = (
            u32_of(n_heads, "n_heads"),
            u32_of(head_dim, "head_dim"),
            u32_of(n, "n"),
        );
        let traffic = traffic::rope_f32(n as usize, n_heads as usize, head_dim as usize);
        let mut b = self.launcher(&self.kernels.rope_f32);
        b.arg(x)
            .arg(positions)
            .arg(cos)
            .arg(sin)
            .arg(&n_heads)
            .arg(&head_dim)
            .arg(&n);
        // SAFETY: shapes checked; positions are below the table length (the runner never
        // lets a sequence grow past the context the tables were built for).
        self.timed("rope_f32", traffic, || unsafe { b.launch(cfg) })
    }

    /// Writes k and v (`[n, kv_dim]`) into rows `slots` (`[n]`) of one layer's caches
    /// (`[n_blocks * 16, kv_dim]`).
    pub fn kv_write_f32(
        &self,
        k_cache: &mut Out<f32>,
        v_cache: &mut Out<f32>,
        k: &In<f32>,
        v: &In<f32>,
        slots: &In<u32>,
        kv_dim: usize,
    ) -> Result<()> {
        let n = slots.len();
        assert!(k.len() == n * kv_dim && v.len() == k.len() && k_cache.len() == v_cache.len());
        assert!(k_cache.len() % (BLOCK_SIZE * kv_dim) == 0);
        let cfg = linear(n * kv_dim);
        let (kv_dim, n) = (u32_of(kv_dim, "kv_dim"), u32_of(n, "n"));
        let traffic = traffic::kv_write_f32(n as usize, kv_dim as usize);
        let mut b = self.launcher(&self.kernels.kv_write_f32);
        b.arg(k_cache)
            .arg(v_cache)
            .arg(k)
            .arg(v)
            .arg(slots)
            .arg(&kv_dim)
            .arg(&n);
        // SAFETY: shapes checked; slots come from block tables the block manager handed out,
        // so each is inside the pool and distinct.
        self.timed("kv_write_f32", traffic, || unsafe { b.launch(cfg) })
    }

    /// Causal GQA attention over the paged cache; see the kernel's header for the shapes.
    /// `attended`: the keys the batch attends to, sum over tokens of position + 1 (only for
    /// the profiler's byte count: the kernel reads the positions itself).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_f32(
        &self,
        out: &mut Out<f32>,
        q: &In<f32>,
        k_cache: &In<f32>,
        v_cache: &In<f32>,
        block_tables: &In<u32>,
        token_seq: &In<u32>,
        positions: &In<u32>,
        max_blocks: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        attended: usize,
    ) -> Result<()> {
        let f = (&self.kernels.attention_f32, "attention_f32", 4);
        let dims = (max_blocks, n_heads, n_kv_heads, head_dim, attended);
        self.per_head(
            f,
            out,
            q,
            k_cache,
            v_cache,
            block_tables,
            token_seq,
            positions,
            dims,
        )
    }

    /// As `attention_f32`, over a bf16 cache.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_bf16(
        &self,
        out: &mut Out<f32>,
        q: &In<f32>,
        k_cache: &In<u16>,
        v_cache: &In<u16>,
        block_tables: &In<u32>,
        token_seq: &In<u32>,
        positions: &In<u32>,
        max_blocks: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        attended: usize,
    ) -> Result<()> {
        let f = (&self.kernels.attention_bf16, "attention_bf16", 2);
        let dims = (max_blocks, n_heads, n_kv_heads, head_dim, attended);
        self.per_head(
            f,
            out,
            q,
            k_cache,
            v_cache,
            block_tables,
            token_seq,
            positions,
            dims,
        )
    }

    /// The launch `attention_f32` and `attention_bf16` share: the kernel, its name and the
    /// bytes of a cache element `T`, then the kernel's arguments.
    #[allow(clippy::too_many_arguments)]
    fn per_head<T: DeviceRepr>(
        &self,
        (func, name, cache_bytes): (&CudaFunction, &'static str, usize),
        out: &mut Out<f32>,
        q: &In<f32>,
        k_cache: &In<T>,
        v_cache: &In<T>,
        block_tables: &In<u32>,
        token_seq: &In<u32>,
        positions: &In<u32>,
        (max_blocks, n_heads, n_kv_heads, head_dim, attended): (usize, usize, usize, usize, usize),
    ) -> Result<()> {
        let n = positions.len();
        assert!(
            head_dim <= super::backend::MAX_HEAD_DIM,
            "{} holds at most 128 dimensions per head (got {head_dim})",
            name
        );
        assert!(
            n_heads.is_multiple_of(n_kv_heads)
                && q.len() == n * n_heads * head_dim
                && out.len() == q.len()
        );
        assert!(
            token_seq.len() == n
                && k_cache.len() == v_cache.len()
                && k_cache.len() % (BLOCK_SIZE * n_kv_heads * head_dim) == 0
        );
        assert!(max_blocks > 0 && block_tables.len() % max_blocks == 0);
        let n_warps = ATTENTION_THREADS / 32;
        let cfg = LaunchConfig {
            grid_dim: (u32_of(n_heads, "n_heads"), u32_of(n, "n"), 1),
            block_dim: (ATTENTION_THREADS, 1, 1),
            shared_mem_bytes: n_warps * (head_dim as u32 + 2) * 4,
        };
        let (mb, nh, nkv, hd) = (
            u32_of(max_blocks, "max_blocks"),
            n_heads as u32,
            n_kv_heads as u32,
            head_dim as u32,
        );
        let traffic =
            traffic::attention_per_head(attended, n, n_heads, n_kv_heads, head_dim, cache_bytes);
        let mut b = self.launcher(func);
        b.arg(out)
            .arg(q)
            .arg(k_cache)
            .arg(v_cache)
            .arg(block_tables)
            .arg(token_seq)
            .arg(positions);
        b.arg(&mb).arg(&nh).arg(&nkv).arg(&hd);
        // SAFETY: shapes checked; the batch was built from block tables that cover every
        // position up to each token's own, whose key and value were written before.
        // SAFETY: shapes checked; the batch was built from block tables that cover every
        // position up to each token's own, whose key and value were written before.
        self.timed(name, traffic, || unsafe { b.launch(cfg) })
    }

    /// Causal GQA attention for a prompt on tensor cores: the same arguments as
    /// `attention_bf16`, with the host's copy of the positions (`positions_host`, for the
    /// profile's count of the key tiles each block reads) in place of `attended`. The
    /// batch must be one sequence, and `head_dim` 64 or 128 (`attention_mma_supports`).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_mma_bf16(
        &self,
        out: &mut Out<f32>,
        q: &In<f32>,
        k_cache: &In<u16>,
        v_cache: &In<u16>,
        block_tables: &In<u32>,
        token_seq: &In<u32>,
        positions: &In<u32>,
        max_blocks: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        positions_host: &[u32],
    ) -> Result<()> {
        let n = positions.len();
        assert!(
            attention_mma_supports(head_dim),
            "attention_mma_bf16 takes heads of 64 or 128 (got {head_dim})"
        );
        assert!(
            n > 0
                && n_heads.is_multiple_of(n_kv_heads)
                && q.len() == n * n_heads * head_dim
                && out.len() == q.len()
                && positions_host.len() == n
        );
        assert!(
            token_seq.len() == n
                && k_cache.len() == v_cache.len()
                && k_cache.len() % (BLOCK_SIZE * n_kv_heads * head_dim) == 0
        );
        assert!(max_blocks > 0 && block_tables.len() % max_blocks == 0);
        let rows = n * (n_heads / n_kv_heads);
        let cfg = LaunchConfig {
            grid_dim: (
                u32_of(rows.div_ceil(ATTN_MMA_ROWS), "row blocks"),
                u32_of(n_kv_heads, "n_kv_heads"),
                1,
            ),
            block_dim: (ATTN_MMA_THREADS as u32, 1, 1),
            shared_mem_bytes: attn_mma_shared_bytes(head_dim) as u32,
        };
        let traffic = traffic::attention_mma_bf16(positions_host, n_heads, n_kv_heads, head_dim);
        let (mb, nh, nkv, hd, nn) = (
            u32_of(max_blocks, "max_blocks"),
            n_heads as u32,
            n_kv_heads as u32,
            head_dim as u32,
            u32_of(n, "n"),
        );
        let mut b = self.launcher(&self.kernels.attention_mma_bf16);
        b.arg(out)
            .arg(q)
            .arg(k_cache)
            .arg(v_cache)
            .arg(block_tables)
            .arg(token_seq)
            .arg(positions);
        b.arg(&mb).arg(&nh).arg(&nkv).arg(&hd).arg(&nn);
        // SAFETY: shapes checked; 128 threads and the shared memory the kernel documents (its
        // limit raised to the most it takes when the module loaded); the caller's batch is one sequence whose block tables cover every position
        // up to each token's own, whose key and value were written before.
        self.timed("attention_mma_bf16", traffic, || unsafe { b.launch(cfg) })
    }

    /// `out = silu(gate) * up`, all `[n]`.
    pub fn swiglu_f32(&self, out: &mut Out<f32>, gate: &In<f32>, up: &In<f32>) -> Result<()> {
        let n = gate.len();
        assert!(up.len() == n && out.len() == n);
        let nn = u32_of(n, "n");
        let traffic = traffic::swiglu_f32(n);
        let mut b = self.launcher(&self.kernels.swiglu_f32);
        b.arg(out).arg(gate).arg(up).arg(&nn);
        // SAFETY: all three hold n floats.
        self.timed("swiglu_f32", traffic, || unsafe { b.launch(linear(n)) })
    }

    /// `x += delta`, both `[n]`.
    pub fn residual_add_f32(&self, x: &mut Out<f32>, delta: &In<f32>) -> Result<()> {
        let n = delta.len();
        assert!(x.len() == n);
        let nn = u32_of(n, "n");
        let traffic = traffic::residual_add_f32(n);
        let mut b = self.launcher(&self.kernels.residual_add_f32);
        b.arg(x).arg(delta).arg(&nn);
        // SAFETY: both hold n floats and are different buffers.
        self.timed("residual_add_f32", traffic, || unsafe {
            b.launch(linear(n))
        })
    }

    /// `out[r] = argmax(logits[r])` for every row: out `[rows]` u32, logits `[rows, n]`.
    pub fn argmax_f32(&self, out: &mut Out<u32>, logits: &In<f32>) -> Result<()> {
        let rows = out.len();
        assert!(rows >= 1 && logits.len() >= rows && logits.len().is_multiple_of(rows));
        let n = logits.len() / rows;
        let cfg = LaunchConfig {
            grid_dim: (u32_of(rows, "rows"), 1, 1),
            block_dim: (ARGMAX_THREADS, 1, 1),
            shared_mem_bytes: 2 * (ARGMAX_THREADS / 32) * 4,
        };
        let nn = u32_of(n, "n");
        let traffic = traffic::argmax_f32(rows * n);
        let mut b = self.launcher(&self.kernels.argmax_f32);
        b.arg(out).arg(logits).arg(&nn);
        // SAFETY: a block of 1024 threads per row, 2 words per warp of shared memory; each
        // row holds n >= 1 logits.
        self.timed("argmax_f32", traffic, || unsafe { b.launch(cfg) })
    }

    /// RoPE on q and k and the cache write, from the fused projection's rows: q_out
    /// `[n, n_heads, head_dim]`, caches one layer, qkv `[n, q_dim + 2 kv_dim]`, positions and
    /// slots `[n]`, cos and sin `[max_pos, head_dim / 2]`.
    #[allow(clippy::too_many_arguments)]
    pub fn qkv_rope_write_bf16(
        &self,
        q_out: &mut Out<f32>,
        k_cache: &mut Out<u16>,
        v_cache: &mut Out<u16>,
        qkv: &In<f32>,
        positions: &In<u32>,
        slots: &In<u32>,
        cos: &In<f32>,
        sin: &In<f32>,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let n = positions.len();
        let (q_dim, kv_dim) = (n_heads * head_dim, n_kv_heads * head_dim);
        assert!(head_dim.is_multiple_of(2) && slots.len() == n && q_out.len() == n * q_dim);
        assert!(qkv.len() == n * (q_dim + 2 * kv_dim) && k_cache.len() == v_cache.len());
        assert!(k_cache.len().is_multiple_of(BLOCK_SIZE * kv_dim) && cos.len() == sin.len());
        let cfg = linear(n * (q_dim / 2 + kv_dim / 2 + kv_dim));
        let (nh, nkv, hd, nn) = (
            u32_of(n_heads, "n_heads"),
            u32_of(n_kv_heads, "n_kv_heads"),
            u32_of(head_dim, "head_dim"),
            u32_of(n, "n"),
        );
        let traffic = traffic::qkv_rope_write_bf16(n, n_heads, n_kv_heads, head_dim);
        let mut b = self.launcher(&self.kernels.qkv_rope_write_bf16);
        b.arg(q_out)
            .arg(k_cache)
            .arg(v_cache)
            .arg(qkv)
            .arg(positions)
            .arg(slots)
            .arg(cos)
            .arg(sin);
        b.arg(&nh).arg(&nkv).arg(&hd).arg(&nn);
        // SAFETY: shapes checked; positions are inside the tables and slots come from the
        // block manager (inside the pool, distinct; a decode graph's padding rows share the
        // spare block's first slot and write the same values there).
        self.timed("qkv_rope_write_bf16", traffic, || unsafe { b.launch(cfg) })
    }

    /// Flash-decoding over splits of `split_len` positions; `n_splits` is
    /// `partial_ml.len() / (2 * n * n_heads)`. See the kernel's header for the shapes;
    /// `attended` as for `attention_f32`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_split_bf16(
        &self,
        partial_o: &mut Out<f32>,
        partial_ml: &mut Out<f32>,
        q: &In<f32>,
        k_cache: &In<u16>,
        v_cache: &In<u16>,
        block_tables: &In<u32>,
        token_seq: &In<u32>,
        positions: &In<u32>,
        max_blocks: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        split_len: usize,
        attended: usize,
    ) -> Result<()> {
        let n = positions.len();
        let n_splits = partial_ml.len() / (2 * n * n_heads);
        let group = n_heads / n_kv_heads;
        assert!(
            head_dim <= super::backend::MAX_HEAD_DIM
                && head_dim.is_multiple_of(8)
                && n_heads.is_multiple_of(n_kv_heads)
                && group <= 32
        );
        assert!(
            aligned16(k_cache, &self.stream) && aligned16(v_cache, &self.stream),
            "attention_split_bf16 copies the cache 16 bytes at a time"
        );
        // The split's keys and values in shared memory, within the default 48 KiB.
        let shared = 2 * split_len * head_dim * 2;
        assert!(
            shared <= 48 * 1024,
            "attention_split_bf16: split of {split_len} too long"
        );
        assert!(
            n_splits > 0
                && partial_ml.len() == 2 * n * n_heads * n_splits
                && partial_o.len() == n * n_heads * n_splits * head_dim
        );
        assert!(q.len() == n * n_heads * head_dim && token_seq.len() == n && split_len > 0);
        assert!(
            k_cache.len() == v_cache.len()
                && max_blocks > 0
                && block_tables.len().is_multiple_of(max_blocks)
        );
        let cfg = LaunchConfig {
            grid_dim: (
                u32_of(n_kv_heads, "n_kv_heads"),
                u32_of(n_splits, "n_splits"),
                u32_of(n, "n"),
            ),
            block_dim: (32 * group as u32, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        let (mb, nh, nkv, hd, sl) = (
            max_blocks as u32,
            n_heads as u32,
            n_kv_heads as u32,
            head_dim as u32,
            u32_of(split_len, "split_len"),
        );
        let traffic =
            traffic::attention_split_bf16(attended, n, n_heads, n_kv_heads, head_dim, n_splits);
        let mut b = self.launcher(&self.kernels.attention_split_bf16);
        b.arg(partial_o)
            .arg(partial_ml)
            .arg(q)
            .arg(k_cache)
            .arg(v_cache)
            .arg(block_tables)
            .arg(token_seq)
            .arg(positions);
        b.arg(&mb).arg(&nh).arg(&nkv).arg(&hd).arg(&sl);
        // SAFETY: shapes checked; the caller sizes n_splits * split_len past every position
        // (the runner computes it from the batch), and the block tables cover each context.
        self.timed("attention_split_bf16", traffic, || unsafe { b.launch(cfg) })
    }

    /// Merges flash-decoding's splits: out `[n, n_heads, head_dim]`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_combine_f32(
        &self,
        out: &mut Out<f32>,
        partial_o: &In<f32>,
        partial_ml: &In<f32>,
        positions: &In<u32>,
        split_len: usize,
        n_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let n = out.len() / (n_heads * head_dim);
        assert!(n > 0 && out.len() == n * n_heads * head_dim && positions.len() == n);
        let n_splits = partial_ml.len() / (2 * n * n_heads);
        assert!(n_splits > 0 && partial_o.len() == n * n_heads * n_splits * head_dim);
        assert!(
            n_splits <= 8192,
            "attention_combine_f32 keeps at most 8192 split weights in shared memory"
        );
        // Groups of head_dim threads share the splits, each taking at least 8 (two rounds
        // of four loads): many groups for a long context, up to the 1024 threads a block
        // may have; one for a short one, where a wide block would only add barrier time.
        let groups = (n_splits / 8).clamp(1, 1024 / head_dim);
        let threads = (groups * head_dim).div_ceil(32) * 32;
        assert!(
            threads <= 1024,
            "attention_combine_f32: head_dim {head_dim} over 1024"
        );
        let cfg = LaunchConfig {
            grid_dim: (u32_of(n_heads, "n_heads"), u32_of(n, "n"), 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: (32 + u32_of(n_splits, "n_splits") + threads as u32) * 4,
        };
        let (ns, hd) = (u32_of(n_splits, "n_splits"), u32_of(head_dim, "head_dim"));
        let sl = u32_of(split_len, "split_len");
        let traffic = traffic::attention_combine_f32(n, n_heads, head_dim, n_splits);
        let mut b = self.launcher(&self.kernels.attention_combine_f32);
        b.arg(out).arg(partial_o).arg(partial_ml).arg(positions);
        b.arg(&ns).arg(&sl).arg(&hd);
        // SAFETY: shapes checked; a multiple of 32 threads, at least head_dim times the
        // groups a token of n_splits splits uses, and 32 + n_splits + threads floats of
        // shared memory; the caller's positions are those the split kernel ran with (split
        // 0 holds position 0, so every maximum is finite).
        self.timed("attention_combine_f32", traffic, || unsafe {
            b.launch(cfg)
        })
    }

    /// Synthetic bf16 weights: `out[i] = bf16(scale * u)`, u uniform in [-1, 1).
    pub fn fill_random_bf16(&self, out: &mut Out<u16>, seed: u32, scale: f32) -> Result<()> {
        let n = out.len() as u64;
        let cfg = LaunchConfig {
            grid_dim: (132 * 16, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let traffic = traffic::fill_random_bf16(n as usize);
        let mut b = self.launcher(&self.kernels.fill_random_bf16);
        b.arg(out).arg(&n).arg(&seed).arg(&scale);
        // SAFETY: a grid-stride loop over exactly `out`'s elements.
        self.timed("fill_random_bf16", traffic, || unsafe { b.launch(cfg) })
    }

    /// The read-bandwidth probe: reads every word of `data` once; `partial` gets one word
    /// per block (its length is the grid).
    pub fn read_probe_u32(&self, partial: &mut Out<u32>, data: &In<u32>) -> Result<()> {
        assert!(
            data.len().is_multiple_of(4) && !partial.is_empty() && aligned16(data, &self.stream)
        );
        let cfg = LaunchConfig {
            grid_dim: (u32_of(partial.len(), "grid"), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 256 * 4,
        };
        let n_vec4 = (data.len() / 4) as u64;
        let traffic = traffic::read_probe_u32(data.len(), partial.len());
        let mut b = self.launcher(&self.kernels.read_probe_u32);
        b.arg(partial).arg(data).arg(&n_vec4);
        // SAFETY: 256 threads with 256 words of shared memory; data is 16-byte aligned and a
        // whole number of 16-byte vectors.
        self.timed("read_probe_u32", traffic, || unsafe { b.launch(cfg) })
    }
}
