//! `read_phases_staged_u32` (the read probe in phases, its tiles streamed into shared memory
//! across the grid barriers): a measurement experiment of `rustle bench --boundaries`, built
//! only with the `probes` feature.

use cudarc::driver::LaunchConfig;

use super::{In, Out, aligned16, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::tiles::{STAGED_BARRIER_BYTES, STAGED_THREADS, staged_shared_bytes};
use crate::traffic;

impl Gpu {
    /// The most blocks of `read_phases_staged_u32` with `stages` slots of `tile_bytes` that
    /// the GPU holds at once: its grid's size. An error on a GPU without the kernel (it
    /// needs Hopper's bulk copies).
    pub fn read_phases_staged_grid(&self, stages: usize, tile_bytes: usize) -> Result<usize> {
        let func = self.hopper_kernel(
            &self.kernels.read_phases_staged_u32,
            "read_phases_staged_u32",
        )?;
        let per_sm = func
            .occupancy_max_active_blocks_per_multiprocessor(
                STAGED_THREADS as u32,
                staged_shared_bytes(stages, tile_bytes),
                None,
            )
            .map_err(crate::error::Error::driver(
                "read_phases_staged_u32's occupancy",
            ))?;
        Ok(per_sm as usize * self.sm_count)
    }

    /// Phases of tiles for `read_phases_staged_u32`: phase p is tiles `starts[p] ..
    /// starts[p + 1]`, kept on the host (to check launches against) and on the device.
    pub fn staged_phases(&self, starts: Vec<u32>) -> Result<StagedPhases> {
        if starts.len() < 2 || starts.windows(2).any(|w| w[0] > w[1]) {
            return Err(crate::error::Error::Unsupported(format!(
                "a phase at least, and phases' first tiles that do not decrease: {starts:?}"
            )));
        }
        let on_gpu = self.upload(&starts, "the phases' first tiles")?;
        Ok(StagedPhases { starts, on_gpu })
    }

    /// The read probe in `phases`, tiles of `tile_bytes` of `data`, a barrier for the whole
    /// grid between phases, each block's tiles copied into shared memory `stages` at a
    /// time by its thread `producer` (copies of a phase's first tiles leave before the
    /// barrier that precedes it),
    /// in one cooperative launch of `partial.len()` blocks (at most
    /// `read_phases_staged_grid`). `sums` gets each block's phase sums (`[phases - 1][grid]`,
    /// at least a word); `arrived` is the barriers' counter, zeroed first.
    #[allow(clippy::too_many_arguments)]
    pub fn read_phases_staged_u32(
        &self,
        partial: &mut Out<u32>,
        sums: &mut Out<u32>,
        arrived: &mut Out<u32>,
        data: &In<u32>,
        phases: &StagedPhases,
        tile_bytes: usize,
        stages: usize,
        producer: usize,
    ) -> Result<()> {
        let func = self.hopper_kernel(
            &self.kernels.read_phases_staged_u32,
            "read_phases_staged_u32",
        )?;
        let (grid, n_phases) = (partial.len(), phases.len());
        let tiles = *phases.starts.last().unwrap_or(&0) as usize;
        assert!(n_phases >= 1 && (1..=STAGED_BARRIER_BYTES / 8).contains(&stages));
        assert!(producer < STAGED_THREADS);
        assert!(tile_bytes.is_multiple_of(16) && tile_bytes > 0 && tile_bytes < 1 << 20);
        assert!(tiles * tile_bytes <= 4 * data.len());
        assert!(sums.len() >= ((n_phases - 1) * grid).max(1) && arrived.len() == 1);
        assert!(aligned16(data, &self.stream) && grid > 0);
        // As `read_phases_u32`: a grid larger than the GPU holds is the cooperative
        // launch's error, not a hang.
        self.stream
            .memset_zeros(arrived)
            .map_err(crate::error::Error::driver("zeroing the barrier's counter"))?;
        let cfg = LaunchConfig {
            grid_dim: (u32_of(grid, "grid"), 1, 1),
            block_dim: (STAGED_THREADS as u32, 1, 1),
            shared_mem_bytes: staged_shared_bytes(stages, tile_bytes) as u32,
        };
        let traffic = traffic::read_probe_u32(tiles * tile_bytes / 4, grid);
        let (tile_bytes, n_phases) = (u32_of(tile_bytes, "tile bytes"), u32_of(n_phases, "phases"));
        let (stages, producer) = (u32_of(stages, "stages"), producer as u32);
        let mut b = self.launcher(func);
        b.cooperative()
            .arg(partial)
            .arg(sums)
            .arg(arrived)
            .arg(data)
            .arg(&phases.on_gpu)
            .arg(&tile_bytes)
            .arg(&n_phases)
            .arg(&stages)
            .arg(&producer);
        // SAFETY: STAGED_THREADS threads with the stages' shared memory; every tile inside
        // data, which is 16-byte aligned, tiles whole 16-byte pieces below 2^20 bytes; the
        // phases' starts on the device as checked here (`StagedPhases` keeps the two
        // together); stages within the barriers' bytes; sums a word a block a phase but the
        // last; the cooperative launch places every block at once or fails; arrived is zero.
        self.timed("read_phases_staged_u32", traffic, || unsafe {
            b.launch(cfg)
        })
    }
}

/// `read_phases_staged_u32`'s phases: the first tile of each and the end of the last, on the
/// host and the same on the device (`Gpu::staged_phases`).
pub struct StagedPhases {
    starts: Vec<u32>,
    on_gpu: cudarc::driver::CudaSlice<u32>,
}

impl StagedPhases {
    /// How many phases.
    pub fn len(&self) -> usize {
        self.starts.len() - 1
    }

    /// Whether there are none (never: `Gpu::staged_phases` makes one at least).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
