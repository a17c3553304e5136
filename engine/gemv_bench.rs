//! The decode matmuls alone: rustle's GEMV kernels against cuBLAS on the same shapes, timed
//! with CUDA events around ten back-to-back launches, rotating among enough weight copies
//! that no launch finds its weights in the L2.

use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};
use cudarc::cublas::{CudaBlas, result as blas};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use serde::Serialize;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::gpu::Gpu;

#[derive(Serialize)]
pub struct GemvResult {
    /// "qkv", "o_proj", "gate+up (SwiGLU)", "down", "head"
    pub name: String,
    pub n_out: usize,
    pub n_in: usize,
    pub rustle_us: f64,
    pub rustle_bytes_per_s: f64,
    /// None when cuBLAS could not be loaded.
    pub cublas_us: Option<f64>,
    /// cuBLAS time over ours: above 1 means rustle is faster.
    pub speedup_vs_cublas: Option<f64>,
}

/// Copies of each matrix to rotate through: together well past the 60 MB L2.
fn copies(bytes: usize) -> usize {
    (256usize << 20).div_ceil(bytes).clamp(2, 16)
}

/// The decode step's matmul shapes for `c`: (name, rows, input width, matrices read).
pub fn decode_shapes(c: &Config) -> Vec<(&'static str, usize, usize, usize)> {
    vec![
        ("qkv", c.q_dim() + 2 * c.kv_dim(), c.dim, 1),
        ("o_proj", c.dim, c.q_dim(), 1),
        ("gate+up (SwiGLU)", c.ffn_dim, c.dim, 2),
        ("down", c.dim, c.ffn_dim, 1),
        ("head", c.vocab_size, c.dim, 1),
    ]
}

pub fn run(gpu: &Gpu, c: &Config) -> Result<Vec<GemvResult>> {
    let time_ms = |f: &mut dyn FnMut() -> Result<()>| crate::bench::time_ms(gpu, 20, f);
    // SAFETY: only asks whether libcublas can be loaded.
    let blas = if unsafe { cudarc::cublas::sys::is_culib_present() } {
        Some(CudaBlas::new(gpu.stream.clone()).map_err(Error::cublas("creating a handle"))?)
    } else {
        None
    };
    let mut results = vec![];
    for (name, n_out, n_in, mats) in decode_shapes(c) {
        let bytes = mats * n_out * n_in * 2;
        let k = copies(bytes);
        let mut weights: Vec<CudaSlice<u16>> = vec![];
        for i in 0..k * mats {
            let mut w = gpu.zeros::<u16>(n_out * n_in, "the GEMV benchmark")?;
            gpu.fill_random_bf16(
                &mut w.as_view_mut(),
                100 + i as u32,
                1.0 / (n_in as f32).sqrt(),
            )?;
            weights.push(w);
        }
        let mut x = gpu.zeros::<u16>(2 * n_in, "the GEMV benchmark")?;
        gpu.fill_random_bf16(&mut x.as_view_mut(), 99, 1.0)?;
        // SAFETY: 2 n_in bf16 reinterpreted as n_in f32 (random bits of bounded exponent: the
        // upper halves are bf16 values, so every float is finite).
        let x_f32 = unsafe { x.transmute::<f32>(n_in) }.expect("length fits");
        let mut out = gpu.zeros::<f32>(n_out, "the GEMV benchmark")?;
        // Launches per timed region: back to back, as in the decode graph, so that the
        // figure is the kernel's and not the cost of timing one launch on its own.
        const BATCH: usize = 10;
        let mut turn = 0;
        let mut one = || -> Result<()> {
            turn = (turn + 1) % k;
            let w = &weights[turn * mats..(turn + 1) * mats];
            if mats == 2 {
                gpu.gemv_swiglu_bf16(
                    &mut out.as_view_mut(),
                    &x_f32,
                    &w[0].as_view(),
                    &w[1].as_view(),
                    n_in,
                    n_out,
                )
            } else {
                gpu.gemv_bf16(
                    &mut out.as_view_mut(),
                    &x_f32,
                    &w[0].as_view(),
                    None,
                    n_in,
                    n_out,
                    false,
                )
            }
        };
        let ours = time_ms(&mut || (0..BATCH).try_for_each(|_| one()))? / BATCH as f64;
        let theirs = match &blas {
            None => None,
            Some(blas) => {
                let mut turn = 0;
                let per_batch = time_ms(&mut || {
                    for _ in 0..BATCH {
                        turn = (turn + 1) % k;
                        for w in &weights[turn * mats..(turn + 1) * mats] {
                            cublas_linear(gpu, blas, &mut out, w, &x, 1, n_in, n_out)?;
                        }
                    }
                    Ok(())
                })?;
                Some(per_batch / BATCH as f64)
            }
        };
        results.push(GemvResult {
            name: name.into(),
            n_out,
            n_in,
            rustle_us: ours * 1e3,
            rustle_bytes_per_s: bytes as f64 / (ours * 1e-3),
            cublas_us: theirs.map(|t| t * 1e3),
            speedup_vs_cublas: theirs.map(|t| t / ours),
        });
    }
    Ok(results)
}

/// `out = x W^T` through cuBLAS, `n` tokens: W `[n_out, n_in]` row-major bf16 is
/// column-major `[n_in, n_out]`, so out^T = op(A) x^T with A transposed; x `[n, n_in]` bf16,
/// out `[n, n_out]` f32, f32 accumulation. With `n == 1`, the decode's GEMV.
#[allow(clippy::too_many_arguments)]
pub(crate) fn cublas_linear(
    gpu: &Gpu,
    blas: &CudaBlas,
    out: &mut CudaSlice<f32>,
    w: &CudaSlice<u16>,
    x: &CudaSlice<u16>,
    n: usize,
    n_in: usize,
    n_out: usize,
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

/// The matrix-throughput ceiling: cuBLAS `GemmEx` on `n x n x n`, bf16 inputs, f32
/// accumulation, bf16 output (the form frameworks run prefill in), in FLOP/s; `None` when
/// cuBLAS cannot be loaded.
pub fn cublas_gemm_flops(gpu: &Gpu, n: usize) -> Result<Option<f64>> {
    // SAFETY: only asks whether libcublas can be loaded.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Ok(None);
    }
    let blas = CudaBlas::new(gpu.stream.clone()).map_err(Error::cublas("creating a handle"))?;
    let mut a = gpu.zeros::<u16>(n * n, "the GEMM benchmark")?;
    let mut b = gpu.zeros::<u16>(n * n, "the GEMM benchmark")?;
    // Random inputs, never zeros (zeros run faster than real data).
    gpu.fill_random_bf16(&mut a.as_view_mut(), 11, 1.0)?;
    gpu.fill_random_bf16(&mut b.as_view_mut(), 12, 1.0)?;
    let mut c = gpu.zeros::<u16>(n * n, "the GEMM benchmark")?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    let ms = crate::bench::time_ms(gpu, 10, &mut || {
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
    })?;
    Ok(Some(2.0 * (n as f64).powi(3) / (ms * 1e-3)))
}

/// rustle's own prefill GEMM (`Gpu::prefill_gemm`: tensor cores, bf16 activations and
/// weights, f32 sums) on `n` tokens of an `n x n` weight, in FLOP/s.
pub fn rustle_gemm_flops(gpu: &Gpu, n: usize) -> Result<f64> {
    let mut w = gpu.zeros::<u16>(n * n, "the GEMM benchmark")?;
    gpu.fill_random_bf16(&mut w.as_view_mut(), 13, 1.0)?;
    let mut x = gpu.zeros::<u16>(n * n, "the GEMM benchmark")?;
    gpu.fill_random_bf16(&mut x.as_view_mut(), 14, 1.0)?;
    let mut out = gpu.zeros::<f32>(n * n, "the GEMM benchmark")?;
    let ms = crate::bench::time_ms(gpu, 3, &mut || {
        gpu.prefill_gemm(
            &mut out.as_view_mut(),
            &x.as_view(),
            &w.as_view(),
            None,
            n,
            n,
            n,
        )
    })?;
    Ok(2.0 * (n as f64).powi(3) / (ms * 1e-3))
}

/// The tensor-core instruction's own ceiling: `mma.sync` (what rustle's GEMM is built on, the
/// tensor instruction sm_80 PTX has) on register operands, no memory, every SM full, in
/// FLOP/s. cuBLAS on Hopper uses the newer `wgmma`, which this does not reach.
pub fn mma_peak_flops(gpu: &Gpu) -> Result<f64> {
    const ITERS: u32 = 4096;
    // 8 blocks of 256 threads per SM: every scheduler has several warps to switch between.
    let threads = gpu.sm_count * 8 * 256;
    let mut out = gpu.zeros::<f32>(threads, "the tensor-core probe")?;
    // a = b = 1/16 (bf16 0x3d80): each accumulator ends at ITERS / 16, exactly.
    let ms = crate::bench::time_ms(gpu, 3, &mut || {
        gpu.mma_probe_bf16(&mut out.as_view_mut(), 0x3d80, 0x3d80, ITERS)
    })?;
    let flops = crate::traffic::mma_probe_bf16(threads, ITERS as usize).flops as f64;
    Ok(flops / (ms * 1e-3))
}
