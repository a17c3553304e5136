//! The GPU backend: the kernels of `gpu-kernels/`, compiled to PTX by `build.rs`, loaded and
//! launched through `cudarc` (the driver API, found at run time, so nothing here needs CUDA
//! to build).
//!
//! - `ptx`: the PTX builds embedded in the binary, and which one a GPU runs
//! - `tiles`: launch shapes shared with the kernels (the same file, compiled into both)
//! - `context`: the device, its stream, the loaded kernels, per-launch timing for profiles
//! - `kernels`: the typed kernel table, and one checked launch wrapper per kernel, in files
//!   named as the kernels' in `gpu-kernels/src`
//! - `launch`: the launch itself, with programmatic dependent launch where the GPU has it
//! - `gemm_plan`: the tile width and reduction split of a tensor-core GEMM launch
//! - `backend`: weights, KV cache and activations on the device, and the forward pass

pub mod backend;
pub mod context;
pub mod gemm_plan;
pub mod kernels;
pub mod launch;
pub mod matrix;
pub mod ptx;
pub mod tiles;

pub use backend::GpuBackend;
pub use context::Gpu;
