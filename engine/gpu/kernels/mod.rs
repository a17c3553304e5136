//! One checked launch wrapper per kernel, in files named as the kernels' in `gpu-kernels/src`
//! (`gemv.rs` wraps `gemv_bf16` and `gemv_swiglu_bf16`, ...): each asserts the preconditions
//! its kernel's doc header lists, then launches under a `// SAFETY:` note. A wrapper has its
//! kernel's name and argument order; lengths a view carries are checked against each other
//! rather than passed twice. The kernels themselves are looked up once, by name, in `table`.
//! `read_phases` and `read_staged` are measurement experiments, in `--features probes`
//! builds only.

pub mod argmax;
pub mod attention;
pub mod attention_mma;
pub mod attention_split_mma;
pub mod embedding;
pub mod fill;
pub mod gemm;
pub mod gemm_blocks;
pub mod gemm_mma;
pub mod gemm_skinny;
pub mod gemm_wgmma;
pub mod gemv;
pub mod gemv_codes;
pub mod gemv_experts;
pub mod gemv_mma;
pub mod gemv_quant;
pub mod gemv_steps;
pub mod kv_cache;
pub mod quantize_fp8;
#[cfg(feature = "probes")]
pub mod read_phases;
#[cfg(feature = "probes")]
pub mod read_staged;
pub mod residual;
pub mod rmsnorm;
pub mod rope;
pub mod route;
pub mod rows;
pub mod sample;
pub mod sum_steps;
pub mod swiglu;
pub mod table;

use cudarc::driver::{CudaFunction, CudaView, CudaViewMut, LaunchConfig};

use super::context::Gpu;
use super::launch::Launch;

/// An input buffer on the device.
pub type In<'a, T> = CudaView<'a, T>;
/// An output buffer on the device.
pub type Out<'a, T> = CudaViewMut<'a, T>;

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

pub(crate) use crate::kernel_args::u32_of;

impl Gpu {
    /// A launch of `func` on the stream, overlapping the kernel before it where the GPU
    /// supports it.
    fn launcher<'a>(&'a self, func: &'a CudaFunction) -> Launch<'a> {
        Launch::new(&self.stream, func, self.pdl)
    }
}
