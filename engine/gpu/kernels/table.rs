//! The kernel table: every kernel of the PTX module, looked up by name once, when the module
//! loads, so that launch sites name a field, never a string. build.rs lists the kernels
//! from the PTX it built, so a new kernel needs no line here; the measurement experiments'
//! kernels are in the table (and the PTX) of `--features probes` builds only.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule};

use crate::error::{Error, Result};
use crate::tiles::{
    MMA_SHARED_BYTES, MMA_THREADS, SKINNY_MAX_TILES, STREAM_MAX_SHARED_BYTES, WGMMA_GEMM_THREADS,
    WGMMA_SHARED_BYTES, attn_mma_fp8_shared_bytes, attn_mma_shared_bytes,
    attn_split_mma_fp8_shared_bytes, blocks_mma_shared_bytes, skinny_shared_bytes,
    wgmma_blocks_shared_bytes,
};
use crate::weights::blocks::BlockType;

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
                        Error::Driver { what: format!("kernel {} is not in the PTX", stringify!($name)), source: e }
                    })?,)*
                    $($opt: module.load_function(stringify!($opt)).ok(),)*
                };
                kernels.raise_limits()?;
                Ok(kernels)
            }
        }
    };
}

// Every kernel of the PTX, as build.rs lists them from the build (`write_kernel_table`):
// a kernel added to `gpu-kernels/` is a field here once it compiles.
include!(concat!(env!("OUT_DIR"), "/kernel_table.rs"));

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
            (
                Some(&self.attention_mma_fp8),
                "attention_mma_fp8",
                attn_mma_fp8_shared_bytes(128),
            ),
            (
                Some(&self.attention_split_mma_fp8),
                "attention_split_mma_fp8",
                attn_split_mma_fp8_shared_bytes(256),
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
            if per_sm < 1 {
                // Its registers or shared memory fit no SM: every launch would fail.
                return Err(Error::Unsupported(format!(
                    "{name}: a block of {threads} threads and {shared} bytes of shared memory \
                     fits no SM of this GPU (the build's register caps, gpu-kernels/src/tiles.rs)"
                )));
            }
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
                Some(func) => slots(
                    func,
                    "gemm_wgmma_bf16",
                    WGMMA_GEMM_THREADS,
                    WGMMA_SHARED_BYTES,
                )?,
                None => 0,
            },
        })
    }
}
