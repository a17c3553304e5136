//! The kernel table and one checked launch wrapper per kernel: assert the preconditions the
//! kernel's doc header lists, then launch under a `// SAFETY:` note.
//!
//! Each wrapper has the kernel's name and argument order; lengths that a view carries are
//! checked against each other rather than passed twice.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaView, CudaViewMut, LaunchConfig, PushKernelArg,
};

use super::context::{Gpu, gpu_err};
use crate::block_manager::BLOCK_SIZE;
use crate::error::{Error, Result};

/// An input buffer on the device.
pub type In<'a, T> = CudaView<'a, T>;
/// An output buffer on the device.
pub type Out<'a, T> = CudaViewMut<'a, T>;

macro_rules! kernel_table {
    ($($name:ident),* $(,)?) => {
        /// Every kernel of the PTX module, looked up by name once, when the module loads.
        #[derive(Clone)]
        pub struct Kernels {
            $(pub $name: CudaFunction,)*
        }

        impl Kernels {
            pub const NAMES: &[&str] = &[$(stringify!($name)),*];

            pub fn load(module: &Arc<CudaModule>) -> Result<Kernels> {
                Ok(Kernels {
                    $($name: module.load_function(stringify!($name)).map_err(|e| {
                        Error::Gpu(format!("kernel {} is not in the PTX: {e}", stringify!($name)))
                    })?,)*
                })
            }
        }
    };
}

kernel_table!(
    embedding_bf16,
    rmsnorm_f32,
    gemv_bf16,
    gemm_bf16,
    rope_f32,
    kv_write_f32,
    attention_f32,
    swiglu_f32,
    residual_add_f32,
    argmax_f32,
);

/// One-dimensional launch of `n` threads in blocks of 256.
fn linear(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).max(1) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Threads per block of the row-reduction kernels (rmsnorm, argmax, attention).
const ROW_THREADS: u32 = 256;
const ATTENTION_THREADS: u32 = 128;
const ARGMAX_THREADS: u32 = 1024;

fn u32_of(n: usize, what: &str) -> u32 {
    u32::try_from(n).unwrap_or_else(|_| panic!("{what} = {n} does not fit a kernel's u32 argument"))
}

impl Gpu {
    /// `out[t, :] = table[tokens[t], :]`: out `[n, dim]` f32, table `[vocab, dim]` bf16,
    /// tokens `[n]`.
    pub fn embedding_bf16(
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
        let mut b = self.stream.launch_builder(&self.kernels.embedding_bf16);
        b.arg(out).arg(table).arg(tokens).arg(&dim);
        // SAFETY: shapes checked above; every token id is below the vocabulary size (the
        // runner checks ids on the host before they reach the device).
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(gpu_err("embedding_bf16"))
    }

    /// RMSNorm of `n_rows = x.len() / dim` rows: out, x `[n_rows, dim]`, weight `[dim]`.
    pub fn rmsnorm_f32(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        weight: &In<f32>,
        eps: f32,
        dim: usize,
    ) -> Result<()> {
        let rows = x.len() / dim;
        assert!(dim > 0 && x.len() == rows * dim && out.len() == x.len() && weight.len() == dim);
        let cfg = LaunchConfig {
            grid_dim: (u32_of(rows, "rows"), 1, 1),
            block_dim: (ROW_THREADS, 1, 1),
            shared_mem_bytes: 32 * 4,
        };
        let dim = u32_of(dim, "dim");
        let mut b = self.stream.launch_builder(&self.kernels.rmsnorm_f32);
        b.arg(out).arg(x).arg(weight).arg(&eps).arg(&dim);
        // SAFETY: shapes checked; 256 threads (a multiple of 32) and 32 floats of shared memory.
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(gpu_err("rmsnorm_f32"))
    }

    /// One token through a linear layer: out `[n_out]`, x `[n_in]`, w `[n_out, n_in]` bf16,
    /// bias `[n_out]` or none.
    pub fn gemv_bf16(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        assert!(
            n_in.is_multiple_of(8),
            "gemv_bf16 reads 8 weights at a time: n_in {n_in} must be a multiple of 8"
        );
        assert!(x.len() == n_in && out.len() == n_out && w.len() == n_out * n_in);
        assert!(bias.is_none_or(|b| b.len() == n_out));
        let rows_per_block = 256 / 32;
        let cfg = LaunchConfig {
            grid_dim: (n_out.div_ceil(rows_per_block) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (n_in, n_out) = (u32_of(n_in, "n_in"), u32_of(n_out, "n_out"));
        let null = 0u64;
        let mut b = self.stream.launch_builder(&self.kernels.gemv_bf16);
        b.arg(out).arg(x).arg(w);
        match bias {
            Some(bias) => b.arg(bias),
            None => b.arg(&null),
        };
        b.arg(&n_in).arg(&n_out);
        // SAFETY: shapes checked; n_in % 8 == 0, and `w` is a whole allocation (weights are
        // uploaded one tensor per allocation, 256-byte aligned), so every 8-weight group is
        // 16-byte aligned; the weights are not written during the launch.
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(gpu_err("gemv_bf16"))
    }

    /// Many tokens through a linear layer: out `[n, n_out]`, x `[n, n_in]`,
    /// w `[n_out, n_in]` bf16, bias `[n_out]` or none.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bf16(
        &self,
        out: &mut Out<f32>,
        x: &In<f32>,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        assert!(x.len() == n * n_in && out.len() == n * n_out && w.len() == n_out * n_in);
        assert!(bias.is_none_or(|b| b.len() == n_out));
        let cfg = LaunchConfig {
            grid_dim: (n_out.div_ceil(64) as u32, n.div_ceil(64) as u32, 1),
            block_dim: (16, 16, 1),
            shared_mem_bytes: 2 * 16 * 65 * 4,
        };
        let (n, n_in, n_out) = (u32_of(n, "n"), u32_of(n_in, "n_in"), u32_of(n_out, "n_out"));
        let null = 0u64;
        let mut b = self.stream.launch_builder(&self.kernels.gemm_bf16);
        b.arg(out).arg(x).arg(w);
        match bias {
            Some(bias) => b.arg(bias),
            None => b.arg(&null),
        };
        b.arg(&n).arg(&n_in).arg(&n_out);
        // SAFETY: shapes checked; block (16, 16), the grid covers the output in 64 x 64
        // tiles, and the two shared tiles get their 8320 bytes.
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(gpu_err("gemm_bf16"))
    }

    /// Rotate-half RoPE in place: x `[n, n_heads, head_dim]`, positions `[n]`, cos and sin
    /// `[max_pos, head_dim / 2]`.
    pub fn rope_f32(
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
        let mut b = self.stream.launch_builder(&self.kernels.rope_f32);
        b.arg(x)
            .arg(positions)
            .arg(cos)
            .arg(sin)
            .arg(&n_heads)
            .arg(&head_dim)
            .arg(&n);
        // SAFETY: shapes checked; positions are below the table length (the runner never
        // lets a sequence grow past the context the tables were built for).
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(gpu_err("rope_f32"))
    }

    /// Writes k and v (`[n, kv_dim]`) into rows `slots` (`[n]`) of one layer's caches
    /// (`[n_blocks * 16, kv_dim]`).
    pub fn kv_write_f32(
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
        let mut b = self.stream.launch_builder(&self.kernels.kv_write_f32);
        b.arg(k_cache)
            .arg(v_cache)
            .arg(k)
            .arg(v)
            .arg(slots)
            .arg(&kv_dim)
            .arg(&n);
        // SAFETY: shapes checked; slots come from block tables the block manager handed out,
        // so each is inside the pool and distinct.
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(gpu_err("kv_write_f32"))
    }

    /// Causal GQA attention over the paged cache; see the kernel's header for the shapes.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_f32(
        &self,
        out: &mut Out<f32>,
        q: &In<f32>,
        k_cache: &In<f32>,
        v_cache: &In<f32>,
        block_tables: &In<u32>,
        token_seq: &In<u32>,
        positions: &In<u32>,
        max_blocks: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let n = positions.len();
        assert!(
            head_dim <= super::backend::MAX_HEAD_DIM,
            "attention_f32 holds at most 256 dimensions per head (got {head_dim})"
        );
        assert!(
            n_heads.is_multiple_of(n_kv_heads)
                && q.len() == n * n_heads * head_dim
                && out.len() == q.len()
        );
        assert!(
            token_seq.len() == n
                && k_cache.len() == v_cache.len()
                && k_cache.len() % (BLOCK_SIZE * n_kv_heads * head_dim) == 0
        );
        assert!(max_blocks > 0 && block_tables.len() % max_blocks == 0);
        let n_warps = ATTENTION_THREADS / 32;
        let cfg = LaunchConfig {
            grid_dim: (u32_of(n_heads, "n_heads"), u32_of(n, "n"), 1),
            block_dim: (ATTENTION_THREADS, 1, 1),
            shared_mem_bytes: n_warps * (head_dim as u32 + 2) * 4,
        };
        let (mb, nh, nkv, hd) = (
            u32_of(max_blocks, "max_blocks"),
            n_heads as u32,
            n_kv_heads as u32,
            head_dim as u32,
        );
        let mut b = self.stream.launch_builder(&self.kernels.attention_f32);
        b.arg(out)
            .arg(q)
            .arg(k_cache)
            .arg(v_cache)
            .arg(block_tables)
            .arg(token_seq)
            .arg(positions);
        b.arg(&mb).arg(&nh).arg(&nkv).arg(&hd);
        // SAFETY: shapes checked; the batch was built from block tables that cover every
        // position up to each token's own, whose key and value were written before.
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(gpu_err("attention_f32"))
    }

    /// `out = silu(gate) * up`, all `[n]`.
    pub fn swiglu_f32(&self, out: &mut Out<f32>, gate: &In<f32>, up: &In<f32>) -> Result<()> {
        let n = gate.len();
        assert!(up.len() == n && out.len() == n);
        let nn = u32_of(n, "n");
        let mut b = self.stream.launch_builder(&self.kernels.swiglu_f32);
        b.arg(out).arg(gate).arg(up).arg(&nn);
        // SAFETY: all three hold n floats.
        unsafe { b.launch(linear(n)) }
            .map(drop)
            .map_err(gpu_err("swiglu_f32"))
    }

    /// `x += delta`, both `[n]`.
    pub fn residual_add_f32(&self, x: &mut Out<f32>, delta: &In<f32>) -> Result<()> {
        let n = delta.len();
        assert!(x.len() == n);
        let nn = u32_of(n, "n");
        let mut b = self.stream.launch_builder(&self.kernels.residual_add_f32);
        b.arg(x).arg(delta).arg(&nn);
        // SAFETY: both hold n floats and are different buffers.
        unsafe { b.launch(linear(n)) }
            .map(drop)
            .map_err(gpu_err("residual_add_f32"))
    }

    /// `out[0] = argmax(logits)`: out `[1]` u32, logits `[n]`.
    pub fn argmax_f32(&self, out: &mut Out<u32>, logits: &In<f32>) -> Result<()> {
        let n = logits.len();
        assert!(n >= 1 && out.len() == 1);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (ARGMAX_THREADS, 1, 1),
            shared_mem_bytes: 2 * (ARGMAX_THREADS / 32) * 4,
        };
        let nn = u32_of(n, "n");
        let mut b = self.stream.launch_builder(&self.kernels.argmax_f32);
        b.arg(out).arg(logits).arg(&nn);
        // SAFETY: one block of 1024 threads with 2 words per warp of shared memory; n >= 1.
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(gpu_err("argmax_f32"))
    }
}
