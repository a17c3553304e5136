//! `rope_f32` (a lesson step: the backend runs the fused one), `qkv_rope_write_bf16` and
//! `qkv_norm_rope_write_bf16` (the same with Qwen3's norm of each query and key head), and
//! both into the fp8 cache (`qkv_rope_write_fp8`, `qkv_norm_rope_write_fp8`).

use cudarc::driver::{CudaFunction, LaunchConfig};

use super::{In, Out, linear, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::gpu::launch::Launch;
use crate::kernel_args::{Heads, NormedQkv};
use crate::tiles::BLOCK_SIZE;
use crate::traffic;

/// The batch's rows as the RoPE kernels read them: positions and slots `[n]`, the tables cos
/// and sin `[max_pos, head_dim / 2]`.
type RowsIn<'a, 'b> = (
    &'a In<'b, u32>,
    &'a In<'b, u32>,
    &'a In<'b, f32>,
    &'a In<'b, f32>,
);

/// One layer of the fp8 cache, to write: the keys' and values' bytes, then their scales.
pub type Fp8KvOut<'a, 'b> = (
    (&'a mut Out<'b, u8>, &'a mut Out<'b, u8>),
    (&'a mut Out<'b, u8>, &'a mut Out<'b, u8>),
);

/// What the warp-per-head kernels' launches differ in.
struct WarpHeads<'a> {
    func: &'a CudaFunction,
    name: &'static str,
    /// Elements of each cache (keys and values alike).
    cache_len: usize,
    /// Elements of the scales, keys' and values' (the fp8 cache's).
    scales: Option<(usize, usize)>,
    /// The launch's traffic for (n, n_heads, n_kv_heads, head_dim).
    traffic: fn(usize, usize, usize, usize) -> traffic::Traffic,
}

/// Heads a block of `qkv_norm_rope_write_bf16` takes, a warp each.
const NORM_ROPE_WARPS: usize = 4;
/// The widest head `qkv_norm_rope_write_bf16` takes: four pairs a lane.
const NORM_ROPE_MAX_HEAD_DIM: usize = 256;

impl Gpu {
    /// Rotate-half RoPE in place: x `[n, n_heads, head_dim]`, positions `[n]`, cos and sin
    /// `[max_pos, head_dim / 2]`.
    ///
    /// # Safety
    /// Every position is below the tables' row count (`cos.len() / (head_dim / 2)`).
    pub unsafe fn rope_f32(
        &self,
        x: &mut Out<f32>,
        positions: &In<u32>,
        cos: &In<f32>,
        sin: &In<f32>,
        n_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let n = positions.len();
        assert!(
            head_dim.is_multiple_of(2)
                && x.len() == n * n_heads * head_dim
                && cos.len() == sin.len()
        );
        assert!(cos.len() % (head_dim / 2) == 0);
        let cfg = linear(n * n_heads * head_dim / 2);
        let (n_heads, head_dim, n) = (
            u32_of(n_heads, "n_heads"),
            u32_of(head_dim, "head_dim"),
            u32_of(n, "n"),
        );
        let traffic = traffic::rope_f32(n as usize, n_heads as usize, head_dim as usize);
        let mut b = self.launcher(&self.kernels.rope_f32);
        b.arg(x)
            .arg(positions)
            .arg(cos)
            .arg(sin)
            .arg(&n_heads)
            .arg(&head_dim)
            .arg(&n);
        // SAFETY: shapes checked; positions are below the table length (the runner never
        // lets a sequence grow past the context the tables were built for).
        self.timed("rope_f32", traffic, || unsafe { b.launch(cfg) })
    }

    /// RoPE on q and k and the cache write, from the fused projection's rows: q_out
    /// `[n, n_heads, head_dim]`, the caches one layer's, qkv `[n, q_dim + 2 kv_dim]`,
    /// positions and slots `[n]`, the tables cos and sin `[max_pos, head_dim / 2]`.
    ///
    /// # Safety
    /// Every position is below the tables' row count, and every slot inside the caches and
    /// distinct (tokens that share one write the same values): the block manager's.
    pub unsafe fn qkv_rope_write_bf16(
        &self,
        q_out: &mut Out<f32>,
        (k_cache, v_cache): (&mut Out<u16>, &mut Out<u16>),
        qkv: &In<f32>,
        (positions, slots): (&In<u32>, &In<u32>),
        (cos, sin): (&In<f32>, &In<f32>),
        heads: Heads,
    ) -> Result<()> {
        let n = positions.len();
        let (q_dim, kv_dim) = (heads.q_dim(), heads.kv_dim());
        let (n_heads, n_kv_heads, head_dim) = heads.sizes();
        assert!(head_dim.is_multiple_of(2) && slots.len() == n && q_out.len() == n * q_dim);
        assert!(qkv.len() == n * (q_dim + 2 * kv_dim) && k_cache.len() == v_cache.len());
        assert!(k_cache.len().is_multiple_of(BLOCK_SIZE * kv_dim) && cos.len() == sin.len());
        let cfg = linear(n * (q_dim / 2 + kv_dim / 2 + kv_dim));
        let nn = u32_of(n, "n");
        let traffic = traffic::qkv_rope_write_bf16(n, n_heads, n_kv_heads, head_dim);
        let mut b = self.launcher(&self.kernels.qkv_rope_write_bf16);
        b.arg(q_out)
            .arg(k_cache)
            .arg(v_cache)
            .arg(qkv)
            .arg(positions)
            .arg(slots)
            .arg(cos)
            .arg(sin)
            .arg(&heads)
            .arg(&nn);
        // SAFETY: shapes checked; positions are inside the tables and slots come from the
        // block manager (inside the pool, distinct; a decode graph's padding rows share the
        // spare block's first slot and write the same values there).
        self.timed("qkv_rope_write_bf16", traffic, || unsafe { b.launch(cfg) })
    }
    /// `qkv_rope_write_bf16` with each query head of the fused rows RMSNormed over its
    /// `head_dim` values by its norm, and each key head by its own, before RoPE: the other
    /// arguments as `qkv_rope_write_bf16`'s.
    ///
    /// # Safety
    /// As `qkv_rope_write_bf16`.
    pub unsafe fn qkv_norm_rope_write_bf16(
        &self,
        q_out: &mut Out<f32>,
        (k_cache, v_cache): (&mut Out<u16>, &mut Out<u16>),
        rows_in: NormedQkv<&In<f32>>,
        (positions, slots): (&In<u32>, &In<u32>),
        (cos, sin): (&In<f32>, &In<f32>),
        heads: Heads,
    ) -> Result<()> {
        assert!(k_cache.len() == v_cache.len());
        let kernel = WarpHeads {
            func: &self.kernels.qkv_norm_rope_write_bf16,
            name: "qkv_norm_rope_write_bf16",
            cache_len: k_cache.len(),
            scales: None,
            traffic: traffic::qkv_norm_rope_write_bf16,
        };
        let caches = |b: &mut Launch| {
            b.arg(k_cache).arg(v_cache);
        };
        let rows = (positions, slots, cos, sin);
        // SAFETY: the caller's guarantee.
        unsafe { self.warp_heads(kernel, q_out, caches, rows_in, rows, heads) }
    }

    /// `qkv_rope_write_bf16` into the fp8 cache: keys and values `[n_blocks * 16, kv_dim]`
    /// e4m3, their scales `[n_blocks, n_kv_heads, 16]`; the other arguments as
    /// `qkv_rope_write_bf16`'s.
    ///
    /// # Safety
    /// As `qkv_rope_write_bf16`.
    pub unsafe fn qkv_rope_write_fp8(
        &self,
        q_out: &mut Out<f32>,
        ((k_cache, v_cache), (k_scales, v_scales)): Fp8KvOut,
        qkv: &In<f32>,
        (positions, slots): (&In<u32>, &In<u32>),
        (cos, sin): (&In<f32>, &In<f32>),
        heads: Heads,
    ) -> Result<()> {
        let kernel = WarpHeads {
            func: &self.kernels.qkv_rope_write_fp8,
            name: "qkv_rope_write_fp8",
            cache_len: k_cache.len(),
            scales: Some((k_scales.len(), v_scales.len())),
            traffic: |n, nh, nkv, hd| traffic::qkv_rope_write_fp8(n, nh, nkv, hd, false),
        };
        assert!(k_cache.len() == v_cache.len());
        let caches = |b: &mut Launch| {
            b.arg(k_cache)
                .arg(v_cache)
                .arg(k_scales)
                .arg(v_scales)
                .arg(qkv);
        };
        let rows = (positions, slots, cos, sin);
        let width = (qkv.len(), None);
        // SAFETY: the caller's guarantee.
        unsafe { self.warp_heads_rows(kernel, q_out, caches, width, rows, heads) }
    }

    /// `qkv_norm_rope_write_bf16` into the fp8 cache: the caches and scales as
    /// `qkv_rope_write_fp8`'s, the rest as `qkv_norm_rope_write_bf16`'s.
    ///
    /// # Safety
    /// As `qkv_rope_write_bf16`.
    pub unsafe fn qkv_norm_rope_write_fp8(
        &self,
        q_out: &mut Out<f32>,
        ((k_cache, v_cache), (k_scales, v_scales)): Fp8KvOut,
        rows_in: NormedQkv<&In<f32>>,
        (positions, slots): (&In<u32>, &In<u32>),
        (cos, sin): (&In<f32>, &In<f32>),
        heads: Heads,
    ) -> Result<()> {
        assert!(k_cache.len() == v_cache.len());
        let kernel = WarpHeads {
            func: &self.kernels.qkv_norm_rope_write_fp8,
            name: "qkv_norm_rope_write_fp8",
            cache_len: k_cache.len(),
            scales: Some((k_scales.len(), v_scales.len())),
            traffic: |n, nh, nkv, hd| traffic::qkv_rope_write_fp8(n, nh, nkv, hd, true),
        };
        let caches = |b: &mut Launch| {
            b.arg(k_cache).arg(v_cache).arg(k_scales).arg(v_scales);
        };
        let rows = (positions, slots, cos, sin);
        // SAFETY: the caller's guarantee.
        unsafe { self.warp_heads(kernel, q_out, caches, rows_in, rows, heads) }
    }

    /// The launch of the warp-per-head kernels with norms: the caches' arguments
    /// (`caches` pushes them), then the fused rows, the norms, the batch's rows and tables.
    ///
    /// # Safety
    /// As `qkv_rope_write_bf16`.
    unsafe fn warp_heads(
        &self,
        kernel: WarpHeads,
        q_out: &mut Out<f32>,
        caches: impl FnOnce(&mut Launch),
        rows_in: NormedQkv<&In<f32>>,
        rows: RowsIn,
        heads: Heads,
    ) -> Result<()> {
        let NormedQkv {
            qkv,
            q_norm,
            k_norm,
            eps,
        } = rows_in;
        let head_dim = heads.head_dim as usize;
        assert!(q_norm.len() == head_dim && k_norm.len() == head_dim);
        let args = |b: &mut Launch| {
            caches(b);
            b.arg(qkv).arg(q_norm).arg(k_norm);
        };
        let width = (qkv.len(), Some(eps));
        // SAFETY: the caller's guarantee.
        unsafe { self.warp_heads_rows(kernel, q_out, args, width, rows, heads) }
    }

    /// What every warp-per-head kernel's launch shares: `first` pushes the arguments before
    /// the batch's rows (the caches, the fused rows, the norms); `(qkv_len, eps)` the fused
    /// rows' length and the norms' epsilon, pushed after the heads where the kernel takes it.
    ///
    /// # Safety
    /// As `qkv_rope_write_bf16`.
    unsafe fn warp_heads_rows(
        &self,
        kernel: WarpHeads,
        q_out: &mut Out<f32>,
        first: impl FnOnce(&mut Launch),
        (qkv_len, eps): (usize, Option<f32>),
        (positions, slots, cos, sin): RowsIn,
        heads: Heads,
    ) -> Result<()> {
        let name = kernel.name;
        let n = positions.len();
        let (q_dim, kv_dim) = (heads.q_dim(), heads.kv_dim());
        let (n_heads, n_kv_heads, head_dim) = heads.sizes();
        assert!(
            head_dim.is_multiple_of(2) && head_dim <= NORM_ROPE_MAX_HEAD_DIM,
            "{name}: heads of {head_dim}"
        );
        assert!(slots.len() == n && q_out.len() == n * q_dim);
        assert!(qkv_len == n * (q_dim + 2 * kv_dim) && cos.len() == sin.len());
        assert!(kernel.cache_len.is_multiple_of(BLOCK_SIZE * kv_dim));
        if let Some((k_scales, v_scales)) = kernel.scales {
            let rows = kernel.cache_len / head_dim;
            assert!(
                k_scales == rows && v_scales == rows,
                "{name}: a scale a head row"
            );
        }
        let warps = n * (n_heads + 2 * n_kv_heads);
        let cfg = LaunchConfig {
            grid_dim: (u32_of(warps.div_ceil(NORM_ROPE_WARPS), "blocks"), 1, 1),
            block_dim: (32 * NORM_ROPE_WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let nn = u32_of(n, "n");
        let traffic = (kernel.traffic)(n, n_heads, n_kv_heads, head_dim);
        let mut b = self.launcher(kernel.func);
        b.arg(q_out);
        first(&mut b);
        b.arg(positions).arg(slots).arg(cos).arg(sin).arg(&heads);
        if let Some(eps) = &eps {
            b.arg(eps);
        }
        b.arg(&nn);
        // SAFETY: shapes checked, head_dim at most 256; a warp for every (token, head) and
        // whole warps a block; positions and slots as the caller promises.
        self.timed(name, traffic, || unsafe { b.launch(cfg) })
    }
}
