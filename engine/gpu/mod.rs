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
//! - `tensor_maps`: the Tensor Memory Accelerator's maps of the weights, made once
//! - `timing`: work on the stream timed with CUDA events
//!
//! The backend, in rooms named for their jobs:
//! - `matrix`, `weights`: a matrix on the device (bf16 or blocks), the model's weights
//!   (uploaded or synthetic) and what they weigh
//! - `plan`: the matmul plan, one decision per matrix and token count (kernel, input form,
//!   tiles, splits); `gemm_plan`: the tile width and split of a tensor-core GEMM launch,
//!   estimated; `tuned_plans`, `gemm_tuning`: the same measured on this GPU, once per
//!   model shape, and kept in the cache folder
//! - `matmul`: a linear layer run as its plan says, and its scratch
//! - `attend`: which attention kernels a pass takes, and one layer's attention
//! - `steps`: the embedding, the norms that make a matmul's input, the MLP's gate and up
//! - `kv_pool`, `batch`: the KV cache, and the batch as the kernels read it
//! - `graphs`: decode steps captured and replayed as CUDA graphs
//! - `sampling`: penalties and the draw on the device
//! - `backend`: the forward pass, top to bottom

pub mod attend;
pub mod backend;
pub mod batch;
pub mod context;
pub mod experts;
pub mod gemm_plan;
pub mod gemm_tuning;
pub mod graphs;
pub mod kernels;
pub mod kv_pool;
pub mod launch;
pub mod matmul;
pub mod matrix;
pub mod plan;
pub mod ptx;
pub mod sampling;
pub mod step_clock;
pub mod steps;
pub mod tensor_maps;
pub mod timing;
pub mod tuned_plans;
pub mod weights;

pub use backend::{GpuBackend, check_supported};
pub use context::Gpu;
pub use weights::GpuWeights;
