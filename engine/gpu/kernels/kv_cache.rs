//! `kv_write_f32`: keys and values into their cache slots (a lesson step: the backend
//! writes them in `qkv_rope_write_bf16`).

use super::{In, Out, linear, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::tiles::BLOCK_SIZE;
use crate::traffic;

impl Gpu {
    /// Writes k and v (`[n, kv_dim]`) into rows `slots` (`[n]`) of one layer's caches
    /// (`[n_blocks * 16, kv_dim]`).
    ///
    /// # Safety
    /// Every slot is inside the caches, and no two tokens share one.
    pub unsafe fn kv_write_f32(
        &self,
        k_cache: &mut Out<f32>,
        v_cache: &mut Out<f32>,
        k: &In<f32>,
        v: &In<f32>,
        slots: &In<u32>,
        kv_dim: usize,
    ) -> Result<()> {
        let n = slots.len();
        assert!(k.len() == n * kv_dim && v.len() == k.len() && k_cache.len() == v_cache.len());
        assert!(k_cache.len() % (BLOCK_SIZE * kv_dim) == 0);
        let cfg = linear(n * kv_dim);
        let (kv_dim, n) = (u32_of(kv_dim, "kv_dim"), u32_of(n, "n"));
        let traffic = traffic::kv_write_f32(n as usize, kv_dim as usize);
        let mut b = self.launcher(&self.kernels.kv_write_f32);
        b.arg(k_cache)
            .arg(v_cache)
            .arg(k)
            .arg(v)
            .arg(slots)
            .arg(&kv_dim)
            .arg(&n);
        // SAFETY: shapes checked; slots come from block tables the block manager handed out,
        // so each is inside the pool and distinct.
        self.timed("kv_write_f32", traffic, || unsafe { b.launch(cfg) })
    }
}
