//! `fill_random_bf16` (synthetic benchmark weights) and `read_probe_u32` (the read bandwidth
//! probe).

use cudarc::driver::LaunchConfig;

use super::{In, Out, aligned16, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::traffic;

impl Gpu {
    /// Synthetic bf16 weights: `out[i] = bf16(scale * u)`, u uniform in [-1, 1).
    pub fn fill_random_bf16(&self, out: &mut Out<u16>, seed: u32, scale: f32) -> Result<()> {
        let n = out.len() as u64;
        let cfg = LaunchConfig {
            grid_dim: (u32_of(16 * self.sm_count, "blocks"), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let traffic = traffic::fill_random_bf16(n as usize);
        let mut b = self.launcher(&self.kernels.fill_random_bf16);
        b.arg(out).arg(&n).arg(&seed).arg(&scale);
        // SAFETY: a grid-stride loop over exactly `out`'s elements.
        self.timed("fill_random_bf16", traffic, || unsafe { b.launch(cfg) })
    }

    /// The read-bandwidth probe: reads every word of `data` once; `partial` gets one word
    /// per block (its length is the grid).
    pub fn read_probe_u32(&self, partial: &mut Out<u32>, data: &In<u32>) -> Result<()> {
        assert!(
            data.len().is_multiple_of(4) && !partial.is_empty() && aligned16(data, &self.stream)
        );
        let cfg = LaunchConfig {
            grid_dim: (u32_of(partial.len(), "grid"), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 256 * 4,
        };
        let n_vec4 = (data.len() / 4) as u64;
        let traffic = traffic::read_probe_u32(data.len(), partial.len());
        let mut b = self.launcher(&self.kernels.read_probe_u32);
        b.arg(partial).arg(data).arg(&n_vec4);
        // SAFETY: 256 threads with 256 words of shared memory; data is 16-byte aligned and a
        // whole number of 16-byte vectors.
        self.timed("read_probe_u32", traffic, || unsafe { b.launch(cfg) })
    }
}
