//! The staged ways of `rustle bench --boundaries`: reads streamed into shared memory as a
//! persistent decode kernel would stream its weights (`read_phases_staged_u32`), and a few
//! Llama 3 8B layers' reads in Q4_K_M, Q8_0 and fp8, each read as the decode step's shape
//! today (a kernel a phase, in a graph), as that shape with every kernel that reads
//! nothing fused away, and as the persistent one.
//!
//! On the H200 a grid barrier cost 2.3-3.2 us where each thread loads its own words, no
//! cheaper than a kernel boundary. What a persistent kernel would have that the probe had
//! not is copies in flight through the barrier: the next phases' weights, which depend on
//! nothing, on their way into shared memory while the grid waits for the vector the phase
//! before made. That is what these ways measure.
//!
//! What they found (H200 and H100; docs/lessons.md#launches-graphs-and-pdl): the copies in
//! flight do not make a barrier
//! free, and a Llama 3 8B layer's reads in Q4_K_M, with no arithmetic at all, reach on the
//! H200 0.68 of the copy bandwidth as the forward's ten kernels a layer, 0.76 as five, and
//! less as the persistent kernel: issue 13's 0.80 is beyond a kernel or a barrier a matrix
//! there, even on reads alone.

use serde::Serialize;

use super::timing::{time_graph_ms, time_ms};
use crate::error::Result;
use crate::gpu::Gpu;
use crate::gpu::kernels::{In, Out};

/// The staged ways measured: (tile KiB, stages a block, the thread that asks for them). Each
/// keeps about 192 KiB an SM on its way: one block an SM of six 32-KiB tiles, or four of
/// three 16-KiB tiles. Thread 0 also arrives at the grid barrier for its block, and a
/// fence there may wait for the copies it asked for; thread 255 is in another warp.
const STAGED: [(usize, usize, usize); 3] = [(32, 6, 0), (32, 6, 255), (16, 3, 255)];

/// A Llama 3 8B layer's decode reads at context 512, KiB, phase by phase as the forward
/// launches its kernels, for each weights type issue 13 sets a target for: the norm and
/// the activations' codes (nothing to read but the vector), q, k and v, RoPE and the cache
/// write, the attention over 512 positions' bf16 keys and values, its combine, o, the
/// norm, gate and up, the down's codes, the down. Each matrix's bytes from its blocks'
/// sizes, to the nearest 32 KiB (the largest tile):
/// - Q4_K_M: Q4_K (144 bytes a 256 weights) but v and the down, which are Q6_K (210
///   bytes) in half the layers: q, k and v 14 MiB on average, the down 38.7; 126.7 MiB a
///   layer, and 32 layers and the head make its 4.680 GB a token;
/// - Q8_0: 34 bytes a 32 weights; 223.0 MiB a layer;
/// - fp8: a byte a weight (its row scales, 4 bytes a row, left out); 210.0 MiB a layer.
pub const LAYER_KIB: [(&str, [usize; 10]); 3] = [
    ("Q4_K_M", [0, 14336, 0, 2048, 0, 9216, 0, 64512, 0, 39648]),
    ("Q8_0", [0, 26112, 0, 2048, 0, 17408, 0, 121856, 0, 60928]),
    ("fp8", [0, 24576, 0, 2048, 0, 16384, 0, 114688, 0, 57344]),
];
/// Layers read at once: 507 to 892 MiB, far past the L2.
pub const LAYERS: usize = 4;
const REPS: usize = 10;

#[derive(Serialize)]
pub struct StagedWay {
    pub tile_bytes: usize,
    pub stages: usize,
    /// The thread of a block that asks for its copies.
    pub producer: usize,
    /// Blocks of 256 threads, as many as the GPU holds at once with these stages.
    pub grid: usize,
}

/// The staged ways this GPU runs, each on as many blocks as it holds at once; none without
/// `read_phases_staged_u32` (before Hopper).
pub fn staged_ways(gpu: &Gpu) -> Result<Vec<StagedWay>> {
    if gpu.kernels.read_phases_staged_u32.is_none() {
        return Ok(vec![]);
    }
    STAGED
        .iter()
        .map(|&(kib, stages, producer)| {
            let tile_bytes = kib << 10;
            let grid = gpu.read_phases_staged_grid(stages, tile_bytes)?;
            Ok(StagedWay {
                tile_bytes,
                stages,
                producer,
                grid,
            })
        })
        .collect()
}

/// The device buffers of the staged launches, for the largest grid and the most phases.
pub struct StagedRuns {
    partial: cudarc::driver::CudaSlice<u32>,
    sums: cudarc::driver::CudaSlice<u32>,
    arrived: cudarc::driver::CudaSlice<u32>,
}

impl StagedRuns {
    pub fn new(gpu: &Gpu, ways: &[StagedWay], most_phases: usize) -> Result<StagedRuns> {
        let grid = ways.iter().map(|w| w.grid).max().unwrap_or(1);
        Ok(StagedRuns {
            partial: gpu.zeros::<u32>(grid, "the staged sums")?,
            sums: gpu.zeros::<u32>(most_phases.max(1) * grid, "the staged phase sums")?,
            arrived: gpu.zeros::<u32>(1, "the staged barrier's counter")?,
        })
    }

    /// Median milliseconds of `way` over `data`'s tiles in phases of `phase_kib` each.
    pub fn time_ms(
        &mut self,
        gpu: &Gpu,
        way: &StagedWay,
        data: &In<u32>,
        phase_kib: &[usize],
    ) -> Result<f64> {
        let mut starts = vec![0u32];
        for kib in phase_kib {
            let tiles = (kib << 10).div_ceil(way.tile_bytes);
            starts.push(starts.last().unwrap_or(&0) + tiles as u32);
        }
        let phases = gpu.staged_phases(starts)?;
        let mut partial = self.partial.slice_mut(..way.grid);
        time_ms(gpu, REPS, &mut || {
            gpu.read_phases_staged_u32(
                &mut partial,
                &mut self.sums.as_view_mut(),
                &mut self.arrived.as_view_mut(),
                data,
                &phases,
                way.tile_bytes,
                way.stages,
                way.producer,
            )
        })
    }
}

/// `LAYERS` layers' reads (`LAYER_KIB`, or with its phases of nothing left out),
/// microseconds each way.
#[derive(Serialize)]
pub struct LayerReads {
    /// The weights type, as `LAYER_KIB` names it.
    pub weights: String,
    pub bytes: usize,
    pub phases: usize,
    /// Of them, phases that read nothing.
    pub empty_phases: usize,
    /// The probe over all the bytes in one launch: no boundary.
    pub one_launch_us: f64,
    /// A launch of the probe a phase (of nothing where the phase reads nothing), replayed
    /// as a CUDA graph: the decode step's shape today.
    pub graph_us: f64,
    /// For each staged way: (its floor, all the tiles in one phase; the layers' phases).
    pub staged_us: Vec<(f64, f64)>,
}

/// Reads `LAYERS` layers of `layer_kib` (of `weights`) each way. `probe` is the read
/// probe's grid of sums.
pub fn layer_reads(
    gpu: &Gpu,
    data: &In<u32>,
    probe: &mut Out<u32>,
    ways: &[StagedWay],
    runs: &mut StagedRuns,
    weights: &str,
    layer_kib: &[usize],
) -> Result<LayerReads> {
    let phase_kib: Vec<usize> = (0..LAYERS).flat_map(|_| layer_kib.to_vec()).collect();
    let bytes = phase_kib.iter().sum::<usize>() << 10;
    assert!(bytes <= 4 * data.len(), "the data holds the layers");
    let all = data.slice(..bytes / 4);
    let one = time_ms(gpu, REPS, &mut || gpu.read_probe_u32(probe, &all))?;
    let mut kernels = || -> Result<()> {
        let mut from = 0;
        for kib in &phase_kib {
            let words = kib << 8;
            gpu.read_probe_u32(probe, &data.slice(from..from + words))?;
            from += words;
        }
        Ok(())
    };
    let replayed = time_graph_ms(gpu, REPS, "the layers' graph", &mut kernels)?;
    let mut staged_us = vec![];
    for way in ways {
        let floor = runs.time_ms(gpu, way, data, &[bytes >> 10])?;
        let phased = runs.time_ms(gpu, way, data, &phase_kib)?;
        staged_us.push((floor * 1e3, phased * 1e3));
    }
    Ok(LayerReads {
        weights: weights.to_string(),
        bytes,
        phases: phase_kib.len(),
        empty_phases: phase_kib.iter().filter(|&&k| k == 0).count(),
        one_launch_us: one * 1e3,
        graph_us: replayed * 1e3,
        staged_us,
    })
}

/// The layers' lines of the report: each way's time, rate, and share of the read probe's
/// bandwidth and of the copy's (both measured in the same run).
pub fn print_layer(
    l: &LayerReads,
    ways: &[StagedWay],
    read_bytes_per_s: f64,
    copy_bytes_per_s: f64,
) {
    println!(
        "  {LAYERS} Llama 3 8B layers' decode reads in {} (context 512): {:.1} MiB in {} \
         phases, {} of nothing",
        l.weights,
        l.bytes as f64 / (1 << 20) as f64,
        l.phases,
        l.empty_phases
    );
    let line = |way: &str, us: f64| {
        let rate = l.bytes as f64 / (us * 1e-6);
        println!(
            "    {way:<34} {us:>8.1} us {:>6.2} TB/s {:>6.3} of the read probe's, {:>6.3} of the \
             copy's",
            rate / 1e12,
            rate / read_bytes_per_s,
            rate / copy_bytes_per_s
        );
    };
    line("one launch of the probe", l.one_launch_us);
    line("a kernel a phase, in a graph", l.graph_us);
    for (i, (w, &(floor, phased))) in ways.iter().zip(&l.staged_us).enumerate() {
        let kib = w.tile_bytes >> 10;
        line(
            &format!("S{i} ({kib} KiB x {}), one phase", w.stages),
            floor,
        );
        line(&format!("S{i}, a grid barrier a phase"), phased);
    }
}
