//! `argmax_f32`: greedy decoding on the device.

use cudarc::driver::LaunchConfig;

use super::{In, Out, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::traffic;

const ARGMAX_THREADS: u32 = 1024;

impl Gpu {
    /// `out[r] = argmax(logits[r])` for every row: out `[rows]` u32, logits `[rows, n]`.
    pub fn argmax_f32(&self, out: &mut Out<u32>, logits: &In<f32>) -> Result<()> {
        let rows = out.len();
        assert!(rows >= 1 && logits.len() >= rows && logits.len().is_multiple_of(rows));
        let n = logits.len() / rows;
        let cfg = LaunchConfig {
            grid_dim: (u32_of(rows, "rows"), 1, 1),
            block_dim: (ARGMAX_THREADS, 1, 1),
            shared_mem_bytes: 2 * (ARGMAX_THREADS / 32) * 4,
        };
        let nn = u32_of(n, "n");
        let traffic = traffic::argmax_f32(rows * n);
        let mut b = self.launcher(&self.kernels.argmax_f32);
        b.arg(out).arg(logits).arg(&nn);
        // SAFETY: a block of 1024 threads per row, 2 words per warp of shared memory; each
        // row holds n >= 1 logits.
        self.timed("argmax_f32", traffic, || unsafe { b.launch(cfg) })
    }
}
