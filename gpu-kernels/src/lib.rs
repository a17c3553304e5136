//! rustle's GPU kernels: plain Rust, compiled by rustc's `nvptx64-nvidia-cuda` target to PTX.
//!
//! The host's `build.rs` builds this crate with the nightly pinned in `rust-toolchain.toml`
//! and embeds the PTX in the `rustle` binary; `cudarc` loads it at run time. One file per
//! kernel family; `device` holds the thin wrappers over `core::arch::nvptx` that a CUDA C
//! programmer would find in the CUDA headers.
//!
//! Every kernel has a CPU twin of the same name and argument order in the host's reference
//! backend (`engine/cpu/ops.rs`); the tests hold one against the other.
//!
//! The `probes` feature (the host's, passed on by `build.rs`) adds the measurement
//! experiments `rustle bench --boundaries` runs: `grid_barrier`, `read_phases` and
//! `read_staged`. No default build compiles them, so the engine's PTX holds none.

#![no_std]
#![feature(
    abi_gpu_kernel,
    stdarch_nvptx,
    asm_experimental_arch,
    gpu_launch_sized_workgroup_mem,
    gpu_intrinsics,
    core_intrinsics
)]
#![allow(internal_features)]
// Kernels take the `#[repr(C)]` structs of `args.rs` by value, as CUDA C kernels take structs:
// rustc's "gpu-kernel" ABI passes an aggregate directly on nvptx, as a `.param .align 4 .b8
// [size]` the driver fills from the struct's bytes. The lint warns that this is not promised
// across targets and toolchains; the host's `kernels_take_argument_structs_as_their_bytes`
// checks the PTX of the pinned toolchain.
#![allow(improper_gpu_kernel_arg)]
// Per-lane register arrays (`q_reg[e]`, `acc[i][j]`) are indexed by the same counter that
// computes each element's address and bounds check: an index loop says that best, and
// fixed-size loops over them unroll into registers.
#![allow(clippy::needless_range_loop)]

pub mod argmax;
pub mod args;
pub mod attention;
pub mod attention_mma;
pub mod attention_split_mma;
pub mod block_parts;
#[cfg(target_feature = "sm_90a")]
pub mod bulk_copy;
pub mod codes;
pub mod device;
pub mod embedding;
pub mod fill;
pub mod gemm;
pub mod gemm_blocks;
pub mod gemm_mma;
pub mod gemm_skinny;
#[cfg(target_feature = "sm_90a")]
pub mod gemm_wgmma;
#[cfg(target_feature = "sm_90a")]
pub mod gemm_wgmma_blocks;
pub mod gemv;
pub mod gemv_codes;
pub mod gemv_experts;
pub mod gemv_mma;
pub mod gemv_mma_bf16;
pub mod gemv_quant;
pub mod gemv_steps;
#[cfg(target_feature = "sm_90a")]
pub mod gemv_stream;
#[cfg(feature = "probes")]
pub mod grid_barrier;
pub mod kv_cache;
pub mod kv_fp8;
pub mod kv_tiles;
pub mod mma;
pub mod quant_blocks;
#[cfg(target_feature = "sm_90a")]
pub mod quantize_fp8;
#[cfg(feature = "probes")]
pub mod read_phases;
#[cfg(all(feature = "probes", target_feature = "sm_90a"))]
pub mod read_staged;
pub mod residual;
pub mod rmsnorm;
pub mod rope;
pub mod route;
pub mod rows;
pub mod sample;
pub mod sum_steps;
pub mod swiglu;
/// Launch shapes shared with the host, which compiles the same file (`include!`).
pub mod tiles;
mod unroll;
#[cfg(target_feature = "sm_90a")]
pub mod wgmma;

/// A kernel cannot unwind and has nowhere to print: a panic (an out-of-bounds index, say)
/// traps, which the host sees as a launch failure.
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` ends the kernel; nothing after it runs.
    unsafe { core::arch::nvptx::trap() }
}
