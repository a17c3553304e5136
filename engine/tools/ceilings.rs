//! The machine's limits, measured by the process that reports against them: memory
//! bandwidth (a copy, and on the GPU a pure-read kernel too), and matrix throughput (cuBLAS's
//! GEMM, rustle's own, the tensor instruction's peak; on the CPU the reference matmul).

use serde::Serialize;

use super::cublas;
use super::timing::{gpu_err, time_ms};
use crate::error::Result;
use crate::gpu::Gpu;

#[derive(Serialize)]
pub struct Bandwidth {
    /// Device-to-device copy, bytes read + written per second.
    pub copy_bytes_per_s: f64,
    /// The read probe, bytes read per second.
    pub read_bytes_per_s: f64,
}

/// Copy and read bandwidth over 2 GiB buffers of random bits (never zeros), far past the L2.
pub fn gpu_bandwidth(gpu: &Gpu) -> Result<Bandwidth> {
    let words = 1usize << 29; // 2 GiB of u32
    let mut src = gpu.zeros::<u16>(2 * words, "the bandwidth test")?;
    gpu.fill_random_bf16(&mut src.as_view_mut(), 7, 1.0)?;
    let mut dst = gpu.zeros::<u16>(2 * words, "the bandwidth test")?;
    let bytes = (4 * words) as f64;
    let copy_ms = time_ms(gpu, 10, &mut || {
        gpu.stream
            .memcpy_dtod(&src, &mut dst)
            .map_err(gpu_err("copy"))
    })?;
    // SAFETY: the u16 buffer reinterpreted as half as many u32 words: same bytes, same alignment.
    let src_words = unsafe { src.transmute::<u32>(words) }.expect("2 * words u16 hold words u32");
    // Enough blocks to keep every SM's load slots full: 132 SMs x 32 blocks.
    let mut partial = gpu.zeros::<u32>(132 * 32, "the bandwidth test")?;
    let read_ms = time_ms(gpu, 10, &mut || {
        gpu.read_probe_u32(&mut partial.as_view_mut(), &src_words)
    })?;
    Ok(Bandwidth {
        copy_bytes_per_s: 2.0 * bytes / (copy_ms * 1e-3),
        read_bytes_per_s: bytes / (read_ms * 1e-3),
    })
}

/// The matrix-throughput ceiling: cuBLAS `GemmEx` on `n x n x n`, bf16 inputs, f32
/// accumulation, bf16 output (the form frameworks run prefill in), in FLOP/s; `None` when
/// cuBLAS cannot be loaded.
pub fn cublas_gemm_flops(gpu: &Gpu, n: usize) -> Result<Option<f64>> {
    let Some(blas) = cublas::load(gpu)? else {
        return Ok(None);
    };
    let mut a = gpu.zeros::<u16>(n * n, "the GEMM benchmark")?;
    let mut b = gpu.zeros::<u16>(n * n, "the GEMM benchmark")?;
    // Random inputs, never zeros (zeros run faster than real data).
    gpu.fill_random_bf16(&mut a.as_view_mut(), 11, 1.0)?;
    gpu.fill_random_bf16(&mut b.as_view_mut(), 12, 1.0)?;
    let mut c = gpu.zeros::<u16>(n * n, "the GEMM benchmark")?;
    let ms = time_ms(gpu, 10, &mut || {
        cublas::gemm_square_bf16(gpu, &blas, &mut c, &a, &b, n)
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
    let ms = time_ms(gpu, 3, &mut || {
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

/// The best matrix throughput the GPU showed, FLOP/s: cuBLAS's GEMM on `n^3`, or rustle's
/// where cuBLAS cannot be loaded.
pub fn gpu_matrix_flops(gpu: &Gpu, n: usize) -> Result<f64> {
    match cublas_gemm_flops(gpu, n)? {
        Some(f) => Ok(f),
        None => rustle_gemm_flops(gpu, n),
    }
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
    let ms = time_ms(gpu, 3, &mut || {
        gpu.mma_probe_bf16(&mut out.as_view_mut(), 0x3d80, 0x3d80, ITERS)
    })?;
    let flops = crate::traffic::mma_probe_bf16(threads, ITERS as usize).flops as f64;
    Ok(flops / (ms * 1e-3))
}

/// The CPU's copy bandwidth, bytes read + written per second: a parallel copy of 512 MiB,
/// far larger than the caches, best of three.
pub fn cpu_copy_bandwidth() -> f64 {
    use rayon::prelude::*;
    use std::time::Instant;
    let n = 1usize << 27; // 512 MiB of f32 each way
    let src: Vec<f32> = (0..n)
        .into_par_iter()
        .map(|i| (i % 1000) as f32 + 0.5)
        .collect();
    let mut dst = vec![0f32; n];
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        dst.par_chunks_mut(1 << 20)
            .zip(src.par_chunks(1 << 20))
            .for_each(|(d, s)| d.copy_from_slice(s));
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (n * 4) as f64 / best
}

/// The CPU's matrix throughput, FLOP/s: the reference matmul (`cpu::ops::matmul_f32`) on
/// 256 tokens of a 2048 x 2048 weight, best of three.
pub fn cpu_matmul_flops() -> f64 {
    use crate::cpu::ops::matmul_f32;
    use std::time::Instant;
    let (m, k) = (256, 2048);
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i % 97) as f32 - 48.0) / 97.0)
        .collect();
    let w: Vec<f32> = (0..k * k)
        .map(|i| ((i % 89) as f32 - 44.0) / 89.0)
        .collect();
    let mut out = vec![0f32; m * k];
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        matmul_f32(&mut out, &x, &w, None, k);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (m * k * k) as f64 / best
}
