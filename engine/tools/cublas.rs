//! cuBLAS, the reference the tools hold rustle's matmuls and the compute roof against; never
//! in the engine's own path.

use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};
use cudarc::cublas::{CudaBlas, result as blas};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// cuBLAS on `gpu`'s stream, or `None` when libcublas cannot be loaded.
pub fn load(gpu: &Gpu) -> Result<Option<CudaBlas>> {
    // SAFETY: only asks whether libcublas can be loaded.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Ok(None);
    }
    CudaBlas::new(gpu.stream.clone())
        .map(Some)
        .map_err(Error::cublas("creating a handle"))
}

/// `out = x W^T` through cuBLAS, `n` tokens: W `[n_out, n_in]` row-major bf16 is
/// column-major `[n_in, n_out]`, so out^T = op(A) x^T with A transposed; x `[n, n_in]` bf16,
/// out `[n, n_out]` f32, f32 accumulation. With `n == 1`, the decode's GEMV.
pub fn linear(
    gpu: &Gpu,
    blas: &CudaBlas,
    out: &mut CudaSlice<f32>,
    w: &CudaSlice<u16>,
    x: &CudaSlice<u16>,
    (n, n_in, n_out): (usize, usize, usize),
) -> Result<()> {
    let (alpha, beta) = (1.0f32, 0.0f32);
    let (a, _ra) = w.device_ptr(&gpu.stream);
    let (b, _rb) = x.device_ptr(&gpu.stream);
    let (y, _ry) = out.device_ptr_mut(&gpu.stream);
    // SAFETY: the shapes above match the buffers' lengths; all three live on this stream.
    unsafe {
        blas::gemm_ex(
            *blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            n_out as i32,
            n as i32,
            n_in as i32,
            (&alpha) as *const f32 as *const _,
            a as *const _,
            cudaDataType_t::CUDA_R_16BF,
            n_in as i32,
            b as *const _,
            cudaDataType_t::CUDA_R_16BF,
            n_in as i32,
            (&beta) as *const f32 as *const _,
            y as *mut _,
            cudaDataType_t::CUDA_R_32F,
            n_out as i32,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(Error::cublas("GemmEx"))
}

/// `c = a b` on `n x n` matrices, bf16 inputs, f32 accumulation, bf16 output (the form
/// frameworks run prefill in).
pub fn gemm_square_bf16(
    gpu: &Gpu,
    blas: &CudaBlas,
    c: &mut CudaSlice<u16>,
    a: &CudaSlice<u16>,
    b: &CudaSlice<u16>,
    n: usize,
) -> Result<()> {
    let (alpha, beta) = (1.0f32, 0.0f32);
    let (pa, _ra) = a.device_ptr(&gpu.stream);
    let (pb, _rb) = b.device_ptr(&gpu.stream);
    let (pc, _rc) = c.device_ptr_mut(&gpu.stream);
    let ni = n as i32;
    // SAFETY: three n x n matrices on this stream.
    unsafe {
        blas::gemm_ex(
            *blas.handle(),
            cublasOperation_t::CUBLAS_OP_N,
            cublasOperation_t::CUBLAS_OP_N,
            ni,
            ni,
            ni,
            (&alpha) as *const f32 as *const _,
            pa as *const _,
            cudaDataType_t::CUDA_R_16BF,
            ni,
            pb as *const _,
            cudaDataType_t::CUDA_R_16BF,
            ni,
            (&beta) as *const f32 as *const _,
            pc as *mut _,
            cudaDataType_t::CUDA_R_16BF,
            ni,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(Error::cublas("GemmEx"))
}
