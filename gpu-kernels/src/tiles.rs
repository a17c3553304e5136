// Launch shapes the host and the kernels must agree on. Plain constants, no imports: the
// host compiles this same file into its launch wrappers (`include!`), so a change here
// changes both sides.

/// Tensor-core GEMM: tokens per block tile.
pub const MMA_BM: usize = 128;
/// Tensor-core GEMM: output features per block tile.
pub const MMA_BN: usize = 128;
/// Tensor-core GEMM: depth of one step along the reduction.
pub const MMA_BK: usize = 32;
/// Tensor-core GEMM: steps in shared memory at once (one being computed on, the rest
/// arriving).
pub const MMA_STAGES: usize = 4;
/// Tensor-core GEMM: threads per block, 8 warps.
pub const MMA_THREADS: usize = 256;
/// Tensor-core GEMM: row length of a shared tile in bf16, the step and 8 of padding (see
/// `gemm_mma.rs`).
pub const MMA_STRIDE: usize = MMA_BK + 8;
/// Tensor-core GEMM: dynamic shared memory of a launch, `MMA_STAGES` steps of two
/// `[128][MMA_STRIDE]` bf16 tiles (80 KiB: over the default 48 KiB, so the host raises the
/// kernel's limit when the module loads).
pub const MMA_SHARED_BYTES: usize = MMA_STAGES * 2 * MMA_BM * MMA_STRIDE * 2;
