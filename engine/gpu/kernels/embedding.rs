//! `embedding_bf16`: the token embeddings' lookup.

use cudarc::driver::LaunchConfig;

use super::{In, Out, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::traffic;

impl Gpu {
    /// `out[t, :] = table[tokens[t], :]`: out `[n, dim]` f32, table `[vocab, dim]` bf16,
    /// tokens `[n]`.
    ///
    /// # Safety
    /// Every token id is below the table's row count (`table.len() / dim`): the kernel does
    /// not check (the runner checks ids on the host before they reach the device).
    pub unsafe fn embedding_bf16(
        &self,
        out: &mut Out<f32>,
        table: &In<u16>,
        tokens: &In<u32>,
        dim: usize,
    ) -> Result<()> {
        let n = tokens.len();
        assert!(dim > 0 && out.len() >= n * dim && table.len() % dim == 0);
        let cfg = LaunchConfig {
            grid_dim: (dim.div_ceil(256) as u32, u32_of(n, "n"), 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let dim = u32_of(dim, "dim");
        let traffic = traffic::embedding_bf16(n, dim as usize);
        let mut b = self.launcher(&self.kernels.embedding_bf16);
        b.arg(out).arg(table).arg(tokens).arg(&dim);
        // SAFETY: shapes checked above; every token id is below the vocabulary size (the
        // runner checks ids on the host before they reach the device).
        self.timed("embedding_bf16", traffic, || unsafe { b.launch(cfg) })
    }
}
