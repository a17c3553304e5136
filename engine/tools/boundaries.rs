//! `rustle bench --boundaries`: what a kernel boundary costs a stream of reads, against a
//! barrier for the whole grid inside one persistent kernel.
//!
//! A decode step at batch 1 reads each matrix once, a few megabytes to a few tens, one
//! kernel after another: some 320 kernels a step on Llama 3 8B. Between two of them the
//! memory goes idle while the last blocks of one drain and the first loads of the next
//! start, and measurements on the H200 found those boundaries, not the GEMVs' own pace,
//! holding a Q4_K_M step near half the copy bandwidth. A persistent kernel (one launch that
//! runs what were many, its phases separated by `grid_barrier`) could have the next phase's
//! loads on their way before the barrier, since weights depend on no phase. This measures
//! the premise on nothing but reads: the same bytes in phases of one size, read
//!
//! - in one launch of `read_probe_u32` (no boundary: the floor),
//! - as a launch of `read_probe_u32` a phase, back to back on the stream (programmatic
//!   dependent launch where the GPU has it, as the forward pass launches),
//! - the same launches replayed as a CUDA graph (as decode runs),
//! - in one cooperative launch of `read_phases_u32`, a grid barrier between phases,
//!   with each thread's first `ahead` vectors of the next phase asked of L2 before the
//!   barrier, for a few values of `ahead` (0: none),
//! - on Hopper, in one cooperative launch of `read_phases_staged_u32`, each block's tiles
//!   streamed into shared memory by bulk copies a few at a time, the copies of a phase's
//!   first tiles leaving before the barrier that precedes it, and each block reading its
//!   neighbours' sums of the phase before after it (a persistent decode kernel's shape:
//!   weights on their way through every wait, a vector made by the whole grid read after
//!   it); its floor is the same kernel over the same tiles in one phase.
//!
//! Each way's time over its floor, divided by the boundaries (phases - 1), is what one
//! boundary cost.

use serde::Serialize;

use super::ceilings::gpu_bandwidth;
use super::staged::{LAYER_KIB, LAYERS, LayerReads, StagedRuns, StagedWay, layer_reads};
use super::timing::{time_graph_ms, time_ms};
use crate::error::Result;
use crate::gpu::Gpu;

/// Phase sizes, MiB: none (the boundary or the barrier alone), then from a small
/// projection's bytes (Llama 3 8B's o_proj is 9.4 MB in Q4_K) to a large one's (its down
/// projection, 33 MB in Q4_K).
const PHASE_MIB: [usize; 7] = [0, 1, 2, 4, 8, 16, 32];
/// Bytes each way reads, at least: far past the L2 (50 MiB on the H100 and H200), so that
/// no repetition finds the last one's lines there.
const LEAST_MIB: usize = 256;
/// Phases of each size, at least.
const LEAST_PHASES: usize = 32;
/// The values of `ahead` measured with the barrier.
const AHEAD: [usize; 3] = [0, 1, 4];
const REPS: usize = 10;

#[derive(Serialize)]
pub struct Boundaries {
    pub gpu: String,
    /// The read probe over 2 GiB, bytes per second.
    pub read_bytes_per_s: f64,
    /// A device-to-device copy over 2 GiB, bytes read and written per second: the
    /// bandwidth issue 13's decode targets count against.
    pub copy_bytes_per_s: f64,
    /// Every launch's grid: as many blocks as the GPU holds at once (`read_phases_u32`'s
    /// limit).
    pub barrier_grid: usize,
    /// The staged ways (none where the GPU lacks bulk copies), in `STAGED`'s order.
    pub staged: Vec<StagedWay>,
    pub rows: Vec<BoundaryRow>,
    /// A few Llama 3 8B layers' reads, each way (the staged ways where the GPU has them):
    /// as the forward's kernels make them, then with the kernels that read nothing fused
    /// away.
    pub layers: Vec<LayerReads>,
}

#[derive(Serialize)]
pub struct BoundaryRow {
    pub phase_bytes: usize,
    pub phases: usize,
    /// All phases' bytes in one launch, microseconds.
    pub one_launch_us: f64,
    /// A launch a phase, microseconds over the one launch, per boundary.
    pub kernels_us: f64,
    /// The same launches as a CUDA graph, likewise.
    pub graph_us: f64,
    /// `(ahead, microseconds over the one launch per boundary)` for the persistent kernel.
    pub barrier_us: Vec<(usize, f64)>,
    /// For each staged way: `(microseconds of its floor, microseconds over it per
    /// boundary)`.
    pub staged_us: Vec<(f64, f64)>,
}

pub fn run(gpu: &Gpu) -> Result<Boundaries> {
    let bandwidth = gpu_bandwidth(gpu)?;
    let (read_bytes_per_s, copy_bytes_per_s) =
        (bandwidth.read_bytes_per_s, bandwidth.copy_bytes_per_s);
    let layers_words = LAYER_KIB
        .iter()
        .map(|(_, kib)| (LAYERS * kib.iter().sum::<usize>()) << 8)
        .max()
        .unwrap_or(0);
    let most_words = PHASE_MIB
        .iter()
        .map(|&m| (phases_of(m) * m) << 18)
        .chain([layers_words])
        .max()
        .unwrap_or(0);
    let mut data = gpu.zeros::<u16>(2 * most_words, "the boundaries' data")?;
    gpu.fill_random_bf16(&mut data.as_view_mut(), 5, 1.0)?;
    // SAFETY: the u16 buffer as half as many u32 words: the same bytes and alignment.
    let data = unsafe { data.transmute::<u32>(most_words) }.expect("2n u16 hold n u32");
    // One grid for every way, the most blocks the GPU holds at once (the barrier's limit):
    // a launch's cost grows with its blocks, and the bandwidth test's grid of 32 blocks an
    // SM made an empty launch cost twice an empty barrier.
    let barrier_grid = gpu.read_phases_grid()?;
    let mut probe = gpu.zeros::<u32>(barrier_grid, "the boundaries' sums")?;
    let mut partial = gpu.zeros::<u32>(barrier_grid, "the boundaries' sums")?;
    let mut arrived = gpu.zeros::<u32>(1, "the barrier's counter")?;
    let staged = super::staged::staged_ways(gpu)?;
    let most_phases = PHASE_MIB.iter().map(|&m| phases_of(m)).max().unwrap_or(1);
    let mut runs = StagedRuns::new(
        gpu,
        &staged,
        most_phases.max(LAYERS * LAYER_KIB.iter().map(|(_, k)| k.len()).max().unwrap_or(0)),
    )?;
    let mut rows = vec![];
    for mib in PHASE_MIB {
        let (phases, phase_vec4) = (phases_of(mib), mib << 16);
        eprintln!("rustle bench --boundaries: {phases} phases of {mib} MiB");
        let phase = |p: usize| data.slice(4 * p * phase_vec4..4 * (p + 1) * phase_vec4);
        let all = data.slice(..4 * phases * phase_vec4);
        let one = time_ms(gpu, REPS, &mut || {
            gpu.read_probe_u32(&mut probe.as_view_mut(), &all)
        })?;
        let mut kernels = || -> Result<()> {
            for p in 0..phases {
                gpu.read_probe_u32(&mut probe.as_view_mut(), &phase(p))?;
            }
            Ok(())
        };
        let launches = time_ms(gpu, REPS, &mut kernels)?;
        let replayed = time_graph_ms(gpu, REPS, "the phases' graph", &mut kernels)?;
        let per_boundary = |ms: f64| (ms - one) * 1e3 / (phases - 1) as f64;
        let mut barrier_us = vec![];
        for ahead in AHEAD {
            let ms = time_ms(gpu, REPS, &mut || {
                gpu.read_phases_u32(
                    &mut partial.as_view_mut(),
                    &mut arrived.as_view_mut(),
                    &all,
                    phase_vec4,
                    phase_vec4,
                    phases,
                    ahead,
                )
            })?;
            barrier_us.push((ahead, per_boundary(ms)));
        }
        let mut staged_us = vec![];
        for way in &staged {
            let floor = runs.time_ms(gpu, way, &all, &[(phases * mib) << 10])?;
            let ms = runs.time_ms(gpu, way, &all, &vec![mib << 10; phases])?;
            staged_us.push((floor * 1e3, (ms - floor) * 1e3 / (phases - 1) as f64));
        }
        rows.push(BoundaryRow {
            phase_bytes: mib << 20,
            phases,
            one_launch_us: one * 1e3,
            kernels_us: per_boundary(launches),
            graph_us: per_boundary(replayed),
            barrier_us,
            staged_us,
        });
    }
    let mut layers = vec![];
    for (weights, layer_kib) in LAYER_KIB {
        // As the forward launches, then with every kernel that reads nothing fused away.
        let fused: Vec<usize> = layer_kib.into_iter().filter(|&k| k > 0).collect();
        for kib in [&layer_kib[..], &fused[..]] {
            eprintln!(
                "rustle bench --boundaries: {LAYERS} layers' reads in {weights}, {} kernels a \
                 layer",
                kib.len()
            );
            layers.push(layer_reads(
                gpu,
                &data,
                &mut probe.as_view_mut(),
                &staged,
                &mut runs,
                weights,
                kib,
            )?);
        }
    }
    Ok(Boundaries {
        gpu: gpu.description.clone(),
        read_bytes_per_s,
        copy_bytes_per_s,
        barrier_grid,
        staged,
        rows,
        layers,
    })
}

/// Phases of `mib` MiB: enough to read `LEAST_MIB`, and at least `LEAST_PHASES`; of
/// nothing, as many as of 1 MiB.
fn phases_of(mib: usize) -> usize {
    (LEAST_MIB / mib.max(1)).max(LEAST_PHASES)
}

pub fn print(b: &Boundaries) {
    println!(
        "rustle bench --boundaries: {}; read probe {:.2} TB/s, copy {:.2} TB/s; every launch {} \
         blocks of 256",
        b.gpu,
        b.read_bytes_per_s / 1e12,
        b.copy_bytes_per_s / 1e12,
        b.barrier_grid
    );
    println!("  what one boundary between phases costs, us over reading the phases in one launch:");
    let ahead: String = AHEAD
        .iter()
        .map(|a| format!("{:>10}", format!("barrier {a}")))
        .collect();
    let staged: String = b
        .staged
        .iter()
        .enumerate()
        .map(|(i, _)| format!("{:>9}{:>9}", format!("S{i} TB/s"), format!("S{i}")))
        .collect();
    println!(
        "  {:>9} {:>6} {:>11} {:>8} {:>9} {:>7}{ahead}{staged}",
        "phase MiB", "phases", "one launch", "TB/s", "kernels", "graph"
    );
    for r in &b.rows {
        let bytes = r.phases * r.phase_bytes;
        let tbs = |us: f64| match r.phase_bytes {
            0 => "-".to_string(),
            _ => format!("{:.2}", bytes as f64 / (us * 1e-6) / 1e12),
        };
        let barriers: String = r
            .barrier_us
            .iter()
            .map(|(_, v)| format!("{v:>10.2}"))
            .collect();
        let staged: String = r
            .staged_us
            .iter()
            .map(|&(floor, v)| format!("{:>9}{v:>9.2}", tbs(floor)))
            .collect();
        println!(
            "  {:>9} {:>6} {:>8.1} us {:>8} {:>9.2} {:>7.2}{barriers}{staged}",
            r.phase_bytes >> 20,
            r.phases,
            r.one_launch_us,
            tbs(r.one_launch_us),
            r.kernels_us,
            r.graph_us
        );
    }
    println!(
        "  (barrier N: one persistent launch, each thread's first N vectors of the next phase \
         asked of L2 before each barrier)"
    );
    for (i, w) in b.staged.iter().enumerate() {
        println!(
            "  (S{i}: one persistent launch of {} blocks, each keeping {} tiles of {} KiB on \
             their way into shared memory across the barriers, asked for by its thread {}; \
             S{i} TB/s its floor, the phases in one)",
            w.grid,
            w.stages,
            w.tile_bytes >> 10,
            w.producer
        );
    }
    if b.staged.is_empty() {
        println!("  (the staged ways need Hopper's bulk copies: not on this GPU)");
    }
    for layer in &b.layers {
        super::staged::print_layer(layer, &b.staged, b.read_bytes_per_s, b.copy_bytes_per_s);
    }
}
