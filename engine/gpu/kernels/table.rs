//! The kernel table: every kernel of the PTX module, looked up by name once, when the module
//! loads, so that launch sites name a field, never a string. The measurement experiments'
//! kernels are in the table (and the PTX) of `--features probes` builds only.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule};

use crate::error::{Error, Result};
use crate::gpu::tiles::{
    MMA_SHARED_BYTES, MMA_THREADS, SKINNY_MAX_TILES, STREAM_MAX_SHARED_BYTES, WGMMA_SHARED_BYTES,
    WGMMA_THREADS, attn_mma_shared_bytes, blocks_mma_shared_bytes, skinny_shared_bytes,
    wgmma_blocks_shared_bytes,
};
use crate::weights::blocks::BlockType;

macro_rules! kernel_table {
    ($($(#[$m:meta])* $name:ident),* $(,)?; optional: $($(#[$om:meta])* $opt:ident),* $(,)?) => {
        /// Every kernel of the PTX module, looked up by name once, when the module loads;
        /// the optional ones are in some builds only (see `ptx_for`).
        #[derive(Clone)]
        pub struct Kernels {
            $($(#[$m])* pub $name: CudaFunction,)*
            $($(#[$om])* pub $opt: Option<CudaFunction>,)*
        }

        impl Kernels {
            /// The kernels every build has.
            pub const NAMES: &[&str] = &[$($(#[$m])* stringify!($name)),*];

            pub fn load(module: &Arc<CudaModule>) -> Result<Kernels> {
                let kernels = Kernels {
                    $($(#[$m])* $name: module.load_function(stringify!($name)).map_err(|e| {
                        Error::Driver { what: format!("kernel {} is not in the PTX", stringify!($name)), source: e }
                    })?,)*
                    $($(#[$om])* $opt: module.load_function(stringify!($opt)).ok(),)*
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
    rmsnorm_f32_bf16,
    gemv_bf16,
    gemv_swiglu_bf16,
    gemv_step1_thread_per_row_bf16,
    gemv_step2_warp_per_row_bf16,
    gemm_step1_simt_bf16,
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
    attention_split_mma_bf16,
    attention_combine_f32,
    attention_combine_f32_bf16,
    attention_combine_q8_f32,
    swiglu_f32,
    swiglu_f32_bf16,
    residual_add_f32,
    argmax_f32,
    sample_f32,
    penalize_f32,
    fill_random_bf16,
    read_probe_u32,
    #[cfg(feature = "probes")]
    read_phases_u32,
    quantize_q8_f32,
    rmsnorm_q8_f32,
    gemv_q4_0,
    dequant_q4_0,
    gemv_q4_1,
    dequant_q4_1,
    gemv_q5_0,
    dequant_q5_0,
    gemv_q5_1,
    dequant_q5_1,
    gemv_q8_0,
    dequant_q8_0,
    gemv_q4_k,
    dequant_q4_k,
    gemv_q5_k,
    dequant_q5_k,
    gemv_q6_k,
    gemv_swiglu_q4_0,
    gemv_swiglu_q4_1,
    gemv_swiglu_q5_0,
    gemv_swiglu_q5_1,
    gemv_swiglu_q8_0,
    gemv_swiglu_q4_k,
    gemv_swiglu_q5_k,
    gemv_swiglu_q6_k,
    gemv_q4_k_q6_k,
    gemv_q5_k_q6_k,
    dequant_q6_k,
    gemv_fp8,
    gemv_swiglu_fp8,
    dequant_fp8,
    gemm_q4_0,
    gemm_q4_1,
    gemm_q5_0,
    gemm_q5_1,
    gemm_q8_0,
    gemm_q4_k,
    gemm_q5_k,
    gemm_q6_k,
    sum_step1_warp_f32,
    sum_step2_block_f32;
    optional: gemm_wgmma_bf16, gemm_wgmma_fp8, quantize_fp8_f32, gemm_wgmma_q4_0,
        gemm_wgmma_q4_1, gemm_wgmma_q5_0, gemm_wgmma_q5_1, gemm_wgmma_q8_0, gemm_wgmma_q4_k,
        gemm_wgmma_q5_k, gemm_wgmma_q6_k, gemv_swiglu_stream_q4_0, gemv_swiglu_stream_q4_1, gemv_swiglu_stream_q5_0,
        gemv_swiglu_stream_q5_1, gemv_swiglu_stream_q8_0, gemv_swiglu_stream_q4_k,
        gemv_swiglu_stream_q5_k, gemv_swiglu_stream_q6_k, gemv_stream_q4_k, gemv_stream_q5_k,
        gemv_stream_q6_k,
        #[cfg(feature = "probes")]
        read_phases_staged_u32,
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
                self.gemm_wgmma_fp8.as_ref(),
                "gemm_wgmma_fp8",
                WGMMA_SHARED_BYTES,
            ),
            (
                Some(&self.attention_mma_bf16),
                "attention_mma_bf16",
                attn_mma_shared_bytes(128),
            ),
        ];
        // Each GGUF type's `gemm_<type>` stages its own block sizes.
        let blocks = BlockType::ALL
            .into_iter()
            .filter(|&ty| ty != BlockType::Fp8)
            .map(|ty| {
                let (func, name) = self.gemm_blocks(ty);
                let bytes = [1, 9, 17, 33]
                    .map(|n| blocks_mma_shared_bytes(n, ty.block_len(), ty.block_bytes()))
                    .into_iter()
                    .max()
                    .unwrap_or(0);
                (Some(func), name, bytes)
            });
        // And its `gemm_wgmma_<type>`, where the build has it (sm_90a).
        let wgmma_blocks = BlockType::ALL.into_iter().filter_map(|ty| {
            let (func, name) = self.gemm_wgmma_blocks(ty)?;
            let bytes = wgmma_blocks_shared_bytes(ty.block_len(), ty.block_bytes());
            Some((Some(func), name, bytes))
        });
        // And the streamed GEMVs, which may take up to an SM's shared memory.
        let streams = BlockType::ALL.into_iter().flat_map(|ty| {
            [self.gemv_swiglu_stream(ty), self.gemv_stream(ty)]
                .into_iter()
                .flatten()
                .map(|(func, name)| (Some(func), name, STREAM_MAX_SHARED_BYTES))
        });
        // And the staged read probe (`--features probes`).
        #[cfg(feature = "probes")]
        let probes = [(
            self.read_phases_staged_u32.as_ref(),
            "read_phases_staged_u32",
            STREAM_MAX_SHARED_BYTES,
        )];
        #[cfg(not(feature = "probes"))]
        let probes = [];
        for (func, name, bytes) in big
            .into_iter()
            .chain(probes)
            .chain(blocks)
            .chain(wgmma_blocks)
            .chain(streams)
        {
            use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_SHARED;
            let Some(func) = func else { continue };
            func.set_attribute(MAX_SHARED, bytes as i32)
                .map_err(|e| Error::Driver {
                    what: format!("{name} needs {bytes} bytes of shared memory per block"),
                    source: e,
                })?;
        }
        Ok(())
    }
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
    pub(crate) fn gemm_slots(&self, sm_count: usize) -> Result<GemmSlots> {
        let slots = |func: &CudaFunction, name: &str, threads: usize, shared: usize| {
            let per_sm = func
                .occupancy_max_active_blocks_per_multiprocessor(threads as u32, shared, None)
                .map_err(|e| Error::Driver {
                    what: format!("{name}'s occupancy"),
                    source: e,
                })?;
            Ok::<usize, Error>(per_sm as usize * sm_count)
        };
        Ok(GemmSlots {
            mma: slots(
                &self.gemm_mma_bf16,
                "gemm_mma_bf16",
                MMA_THREADS,
                MMA_SHARED_BYTES,
            )?,
            wgmma: match &self.gemm_wgmma_bf16 {
                Some(func) => slots(func, "gemm_wgmma_bf16", WGMMA_THREADS, WGMMA_SHARED_BYTES)?,
                None => 0,
            },
        })
    }
}
