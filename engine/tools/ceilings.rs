//! The machine's limits, measured by the process that reports against them: memory
//! bandwidth (a copy, and on the GPU a pure-read kernel too), and matrix throughput (cuBLAS's
//! GEMM, rustle's own, the tensor instruction's peak; on the CPU the reference matmul).

use serde::Serialize;

use super::cublas;
use super::timing::time_ms;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::gpu::kernels::gemm_mma::Bf16Operands;

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
            .map_err(Error::driver("copy"))
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
    let mut parts = gpu.zeros::<f32>(gpu.wgmma_parts_len(n, n, n).max(1), "the GEMM benchmark")?;
    let ms = time_ms(gpu, 3, &mut || {
        let ops = Bf16Operands {
            x: x.as_view(),
            w: w.as_view(),
            bias: None,
        };
        gpu.prefill_gemm(&mut out.as_view_mut(), ops, n, &mut parts.as_view_mut())
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

// The CPU. Its ceilings are taken as the best of several runs: the machine may be shared,
// and a ceiling measured while another process ran would be too low, so that operations
// timed later could beat it.

/// Runs `f` `reps` times; the shortest time, in seconds.
fn best_seconds(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// The CPU's memory bandwidth, bytes per second, over 512 MiB buffers (far past any cache):
/// the faster of a parallel copy (bytes read + written) and a parallel read. A copy's
/// stores first read each destination line into the cache (write-allocate), so memory moves
/// three bytes for each two counted; an operation that mostly reads (a matmul's weights)
/// can beat the copy's count, never the read.
pub fn cpu_memory_bandwidth() -> (f64, String) {
    use rayon::prelude::*;
    let n = 1usize << 27; // 512 MiB of u32 each way
    let src: Vec<u32> = (0..n)
        .into_par_iter()
        .map(|i| (i as u32).wrapping_mul(2_654_435_761))
        .collect();
    let mut dst = vec![1u32; n];
    let copy = best_seconds(10, || {
        dst.par_chunks_mut(1 << 20)
            .zip(src.par_chunks(1 << 20))
            .for_each(|(d, s)| d.copy_from_slice(s));
        std::hint::black_box(&mut dst);
    });
    drop(dst);
    let read = best_seconds(10, || {
        // Wrapping integer adds vectorise (a float sum would not: its order is fixed).
        let sum = src
            .par_chunks(1 << 20)
            .map(|c| c.iter().fold(0u32, |a, &x| a.wrapping_add(x)))
            .reduce(|| 0, u32::wrapping_add);
        std::hint::black_box(sum);
    });
    let bytes = (n * 4) as f64;
    let (copy, read) = (2.0 * bytes / copy, bytes / read);
    let source = format!(
        "512 MiB: parallel read {:.1} GB/s, copy {:.1} GB/s (read + write)",
        read / 1e9,
        copy / 1e9
    );
    (copy.max(read), source)
}

/// A cache private to each core, as Linux describes it (`/sys/devices/system/cpu/cpu0/
/// cache`): the L1 data cache and the L2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuCache {
    /// "L1d", "L2"
    pub name: String,
    pub bytes: usize,
}

/// The data caches that core 0 has to itself, smallest first; empty where the system does
/// not say. Shared caches (the L3) are left out: the weights stream through them, so that
/// an operation's bytes fitting there says nothing about where they come from.
pub fn cpu_private_caches() -> Vec<CpuCache> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
    let mut caches = vec![];
    for i in 0..8 {
        let d = dir.join(format!("index{i}"));
        let (Some(level), Some(kind), Some(size), Some(shared)) = (
            read(d.join("level")),
            read(d.join("type")),
            read(d.join("size")),
            read(d.join("shared_cpu_list")),
        ) else {
            continue;
        };
        let Some(bytes) = parse_cache_size(size.trim()) else {
            continue;
        };
        let private = shared.trim() == "0";
        if kind.trim() == "Instruction" || !private {
            continue;
        }
        let name = match kind.trim() {
            "Data" => format!("L{}d", level.trim()),
            _ => format!("L{}", level.trim()),
        };
        caches.push(CpuCache { name, bytes });
    }
    caches.sort_by_key(|c| c.bytes);
    caches
}

/// "32K", "1024K", "2M" (sysfs's spelling) in bytes.
fn parse_cache_size(s: &str) -> Option<usize> {
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: usize = digits.parse().ok()?;
    match unit {
        "" => Some(n),
        "K" => Some(n << 10),
        "M" => Some(n << 20),
        "G" => Some(n << 30),
        _ => None,
    }
}

/// The bandwidth of a cache of `bytes` per core: every thread copies back and forth
/// between two buffers of its own that together fill half of it (the rest is left to the
/// stack and whatever else the core touches), bytes read + written per second, all threads
/// together.
pub fn cpu_cache_bandwidth(bytes: usize) -> f64 {
    use std::time::Instant;
    let per_buffer = (bytes / 4 / 4).max(256); // u32s
    // About 64 MiB copied per thread per run: long enough to time, short enough to repeat.
    let rounds = ((64usize << 20) / (per_buffer * 4)).max(2);
    let mut best = f64::INFINITY;
    for _ in 0..7 {
        // Every thread at once, each timing its own rounds; the slowest decides.
        let times: Vec<f64> = rayon::broadcast(|_| {
            let mut a: Vec<u32> = (0..per_buffer as u32).collect();
            let mut b = vec![0u32; per_buffer];
            b.copy_from_slice(&a); // in cache before the clock starts
            let t = Instant::now();
            for _ in 0..rounds / 2 {
                b.copy_from_slice(std::hint::black_box(&a));
                a.copy_from_slice(std::hint::black_box(&b));
            }
            t.elapsed().as_secs_f64()
        });
        best = best.min(times.into_iter().fold(0.0, f64::max));
    }
    let threads = rayon::current_num_threads();
    let moved = 2.0 * (rounds / 2 * 2 * per_buffer * 4 * threads) as f64;
    moved / best
}

/// The CPU's matrix throughput, FLOP/s: the reference matmul (`cpu::ops::matmul_f32`) on
/// 256 tokens of a square weight that fits in half of `cache_bytes` (the L2), so that its
/// arithmetic, not the memory behind it, sets the pace; best of several runs. (A weight far
/// larger than the caches measures their bandwidth instead, and a model whose matrices fit
/// in them then beats that "ceiling".)
pub fn cpu_matmul_flops(cache_bytes: usize) -> (f64, String) {
    use crate::cpu::ops::matmul_f32;
    // The largest multiple of 64 whose square of f32 fits in half the cache, 128 to 1024.
    let k = (((cache_bytes / 8) as f64).sqrt() as usize / 64 * 64).clamp(128, 1024);
    let m = 256;
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i % 97) as f32 - 48.0) / 97.0)
        .collect();
    let w: Vec<f32> = (0..k * k)
        .map(|i| ((i % 89) as f32 - 44.0) / 89.0)
        .collect();
    let mut out = vec![0f32; m * k];
    let best = best_seconds(9, || matmul_f32(&mut out, &x, &w, None, k));
    let source = format!("rustle's reference matmul, {m} x {k} x {k}, weights in cache");
    (2.0 * (m * k * k) as f64 / best, source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_as_sysfs_spells_them() {
        assert_eq!(parse_cache_size("32K"), Some(32 << 10));
        assert_eq!(parse_cache_size("1024K"), Some(1 << 20));
        assert_eq!(parse_cache_size("2M"), Some(2 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("lots"), None);
    }
}
