//! `read_phases_u32` (the read probe in phases, a grid barrier between them): a measurement
//! experiment of `rustle bench --boundaries`, built only with the `probes` feature.

use cudarc::driver::LaunchConfig;

use super::{In, Out, aligned16, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::traffic;

impl Gpu {
    /// The most blocks of `read_phases_u32` the GPU holds at once: its grid's size.
    pub fn read_phases_grid(&self) -> Result<usize> {
        let per_sm = self
            .kernels
            .read_phases_u32
            .occupancy_max_active_blocks_per_multiprocessor(256, 256 * 4, None)
            .map_err(crate::error::Error::driver("read_phases_u32's occupancy"))?;
        Ok(per_sm as usize * self.sm_count)
    }

    /// The read probe in `n_phases` phases of `phase_vec4` 16-byte vectors, `phase_stride`
    /// vectors apart, a barrier for the whole grid between them, in one cooperative launch
    /// of `partial.len()` blocks (at most `read_phases_grid`); each thread asks L2 for its
    /// first `ahead` vectors of a phase before the barrier that precedes it. `arrived` is
    /// the barriers' counter; the launch zeroes it first.
    #[allow(clippy::too_many_arguments)]
    pub fn read_phases_u32(
        &self,
        partial: &mut Out<u32>,
        arrived: &mut Out<u32>,
        data: &In<u32>,
        phase_vec4: usize,
        phase_stride: usize,
        n_phases: usize,
        ahead: usize,
    ) -> Result<()> {
        assert!(n_phases >= 1 && phase_vec4 <= phase_stride && arrived.len() == 1);
        assert!(4 * ((n_phases - 1) * phase_stride + phase_vec4) <= data.len());
        assert!(aligned16(data, &self.stream) && !partial.is_empty());
        // More blocks than fit at once would wait at the first barrier for blocks that can
        // never be placed: the cooperative launch refuses such a grid (an error, not a hang),
        // so the occupancy is not asked of the driver again on every launch.
        self.stream
            .memset_zeros(arrived)
            .map_err(crate::error::Error::driver("zeroing the barrier's counter"))?;
        let cfg = LaunchConfig {
            grid_dim: (u32_of(partial.len(), "grid"), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 256 * 4,
        };
        let traffic = traffic::read_probe_u32(4 * n_phases * phase_vec4, partial.len());
        let (phase_vec4, phase_stride) = (phase_vec4 as u64, phase_stride as u64);
        let (n_phases, ahead) = (u32_of(n_phases, "phases"), u32_of(ahead, "ahead"));
        let mut b = self.launcher(&self.kernels.read_phases_u32);
        b.cooperative()
            .arg(partial)
            .arg(arrived)
            .arg(data)
            .arg(&phase_vec4)
            .arg(&phase_stride)
            .arg(&n_phases)
            .arg(&ahead);
        // SAFETY: 256 threads with 256 words of shared memory; every phase inside data,
        // which is 16-byte aligned; the cooperative launch places every block at once or
        // fails; arrived is zero.
        self.timed("read_phases_u32", traffic, || unsafe { b.launch(cfg) })
    }
}
