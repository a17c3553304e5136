//! The attention kernels over the paged cache: `attention_f32` (the lesson's first, one
//! block per token and head) and `attention_bf16` (the same over the bf16 cache), and
//! flash-decoding's `attention_split_bf16` and `attention_combine_f32`.

use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig};

use super::{In, Out, aligned16, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::gpu::tiles::{BLOCK_SIZE, COMBINE_IN_FLIGHT, MAX_HEAD_DIM};
use crate::traffic;

const ATTENTION_THREADS: u32 = 128;

/// What the two split kernels' launches differ in.
pub(super) struct SplitKernel<'a> {
    pub(super) func: &'a CudaFunction,
    pub(super) name: &'static str,
    /// Threads per block.
    pub(super) threads: u32,
    /// Dynamic shared memory per block, within the default 48 KiB.
    pub(super) shared: usize,
}

impl Gpu {
    /// Causal GQA attention over the paged cache; see the kernel's header for the shapes.
    ///
    /// # Safety
    /// Every token's sequence has a row of `block_tables`, whose entries up to the token's
    /// position name blocks of the caches, and its own key and value are written.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attention_f32(
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
        let f = (&self.kernels.attention_f32, "attention_f32", 4);
        let dims = (max_blocks, n_heads, n_kv_heads, head_dim);
        self.per_head(
            f,
            out,
            q,
            k_cache,
            v_cache,
            block_tables,
            token_seq,
            positions,
            dims,
        )
    }

    /// As `attention_f32`, over a bf16 cache.
    ///
    /// # Safety
    /// As `attention_f32`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attention_bf16(
        &self,
        out: &mut Out<f32>,
        q: &In<f32>,
        k_cache: &In<u16>,
        v_cache: &In<u16>,
        block_tables: &In<u32>,
        token_seq: &In<u32>,
        positions: &In<u32>,
        max_blocks: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let f = (&self.kernels.attention_bf16, "attention_bf16", 2);
        let dims = (max_blocks, n_heads, n_kv_heads, head_dim);
        self.per_head(
            f,
            out,
            q,
            k_cache,
            v_cache,
            block_tables,
            token_seq,
            positions,
            dims,
        )
    }

    /// The launch `attention_f32` and `attention_bf16` share: the kernel, its name and the
    /// bytes of a cache element `T`, then the kernel's arguments.
    #[allow(clippy::too_many_arguments)]
    fn per_head<T: DeviceRepr>(
        &self,
        (func, name, cache_bytes): (&CudaFunction, &'static str, usize),
        out: &mut Out<f32>,
        q: &In<f32>,
        k_cache: &In<T>,
        v_cache: &In<T>,
        block_tables: &In<u32>,
        token_seq: &In<u32>,
        positions: &In<u32>,
        (max_blocks, n_heads, n_kv_heads, head_dim): (usize, usize, usize, usize),
    ) -> Result<()> {
        let n = positions.len();
        assert!(
            head_dim <= MAX_HEAD_DIM,
            "{} holds at most 128 dimensions per head (got {head_dim})",
            name
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
        let traffic = move |positions: &[u32]| {
            let attended = traffic::attended(positions);
            traffic::attention_per_head(attended, n, n_heads, n_kv_heads, head_dim, cache_bytes)
        };
        let mut b = self.launcher(func);
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
        self.timed_batch(name, traffic, || unsafe { b.launch(cfg) })
    }

    /// Flash-decoding over splits of `split_len` positions; `n_splits` is
    /// `partial_ml.len() / (2 * n * n_heads)`. See the kernel's header for the shapes.
    ///
    /// # Safety
    /// As `attention_f32`, and `n_splits * split_len` is past every token's position.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attention_split_bf16(
        &self,
        partial_o: &mut Out<f32>,
        partial_ml: &mut Out<f32>,
        q: &In<f32>,
        k_cache: &In<u16>,
        v_cache: &In<u16>,
        block_tables: &In<u32>,
        token_seq: &In<u32>,
        positions: &In<u32>,
        max_blocks: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        split_len: usize,
    ) -> Result<()> {
        let group = n_heads / n_kv_heads.max(1);
        assert!(
            head_dim <= MAX_HEAD_DIM
                && head_dim.is_multiple_of(8)
                && n_kv_heads > 0
                && n_heads.is_multiple_of(n_kv_heads)
                && group <= 32
        );
        // The split's keys and values in shared memory, within the default 48 KiB.
        let shared = 2 * split_len * head_dim * 2;
        assert!(
            shared <= 48 * 1024,
            "attention_split_bf16: split of {split_len} too long"
        );
        let kernel = SplitKernel {
            func: &self.kernels.attention_split_bf16,
            name: "attention_split_bf16",
            threads: 32 * group as u32,
            shared,
        };
        // SAFETY: the caller's guarantee, passed on; the block and shared memory the
        // kernel's header asks for.
        unsafe {
            self.attention_split(
                kernel,
                partial_o,
                partial_ml,
                q,
                k_cache,
                v_cache,
                block_tables,
                token_seq,
                positions,
                max_blocks,
                n_heads,
                n_kv_heads,
                head_dim,
                split_len,
            )
        }
    }

    /// The launch both split kernels share (`attention_split_bf16`,
    /// `attention_split_mma_bf16`): the same arguments and partial results, checked alike,
    /// a grid of `(n_kv_heads, n_splits, n)` blocks of the kernel's size.
    ///
    /// # Safety
    /// As `attention_split_bf16`; `kernel` names a split kernel with its block size and
    /// shared memory.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attention_split(
        &self,
        kernel: SplitKernel,
        partial_o: &mut Out<f32>,
        partial_ml: &mut Out<f32>,
        q: &In<f32>,
        k_cache: &In<u16>,
        v_cache: &In<u16>,
        block_tables: &In<u32>,
        token_seq: &In<u32>,
        positions: &In<u32>,
        max_blocks: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        split_len: usize,
    ) -> Result<()> {
        let name = kernel.name;
        let n = positions.len();
        let n_splits = partial_ml.len() / (2 * n * n_heads);
        assert!(
            aligned16(k_cache, &self.stream) && aligned16(v_cache, &self.stream),
            "{name} copies the cache 16 bytes at a time"
        );
        assert!(
            n_splits > 0
                && partial_ml.len() == 2 * n * n_heads * n_splits
                && partial_o.len() == n * n_heads * n_splits * head_dim
        );
        assert!(q.len() == n * n_heads * head_dim && token_seq.len() == n && split_len > 0);
        assert!(
            k_cache.len() == v_cache.len()
                && max_blocks > 0
                && block_tables.len().is_multiple_of(max_blocks)
        );
        let cfg = LaunchConfig {
            grid_dim: (
                u32_of(n_kv_heads, "n_kv_heads"),
                u32_of(n_splits, "n_splits"),
                u32_of(n, "n"),
            ),
            block_dim: (kernel.threads, 1, 1),
            shared_mem_bytes: kernel.shared as u32,
        };
        let (mb, nh, nkv, hd, sl) = (
            max_blocks as u32,
            n_heads as u32,
            n_kv_heads as u32,
            head_dim as u32,
            u32_of(split_len, "split_len"),
        );
        let traffic = move |positions: &[u32]| {
            let attended = traffic::attended(positions);
            traffic::attention_split_bf16(attended, n, n_heads, n_kv_heads, head_dim, n_splits)
        };
        let mut b = self.launcher(kernel.func);
        b.arg(partial_o)
            .arg(partial_ml)
            .arg(q)
            .arg(k_cache)
            .arg(v_cache)
            .arg(block_tables)
            .arg(token_seq)
            .arg(positions);
        b.arg(&mb).arg(&nh).arg(&nkv).arg(&hd).arg(&sl);
        // SAFETY: shapes checked; the caller sizes n_splits * split_len past every position
        // (the runner computes it from the batch), and the block tables cover each context;
        // the block and shared memory are the kernel's own (the caller's guarantee).
        self.timed_batch(name, traffic, || unsafe { b.launch(cfg) })
    }

    /// Merges flash-decoding's splits: out `[n, n_heads, head_dim]`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_combine_f32(
        &self,
        out: &mut Out<f32>,
        partial_o: &In<f32>,
        partial_ml: &In<f32>,
        positions: &In<u32>,
        split_len: usize,
        n_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        self.combine(
            Copy::None,
            out,
            partial_o,
            partial_ml,
            positions,
            split_len,
            n_heads,
            head_dim,
        )
    }

    /// `attention_combine_f32`, also writing the output rounded to bf16 into `out_bf16`:
    /// o_proj's tensor-core input without a rounding launch of its own.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_combine_f32_bf16(
        &self,
        out: &mut Out<f32>,
        out_bf16: &mut Out<u16>,
        partial_o: &In<f32>,
        partial_ml: &In<f32>,
        positions: &In<u32>,
        split_len: usize,
        n_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        assert_eq!(out_bf16.len(), out.len());
        let bf16 = Copy::Bf16(out_bf16);
        self.combine(
            bf16, out, partial_o, partial_ml, positions, split_len, n_heads, head_dim,
        )
    }

    /// `attention_combine_f32`, also making the output 8-bit codes as `quantize_q8_f32`
    /// makes them (`codes` `[n, n_heads * head_dim]`, `scales` `[n, n_heads * head_dim /
    /// 32][2]`): o_proj's input for its GEMV over GGUF blocks without a launch of its own.
    /// `head_dim` must be whole groups of 32.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_combine_q8_f32(
        &self,
        out: &mut Out<f32>,
        codes: &mut Out<u8>,
        scales: &mut Out<f32>,
        partial_o: &In<f32>,
        partial_ml: &In<f32>,
        positions: &In<u32>,
        split_len: usize,
        n_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        assert!(
            head_dim.is_multiple_of(32),
            "head_dim {head_dim}: whole groups of 32"
        );
        assert!(codes.len() >= out.len() && scales.len() >= out.len() / 16);
        let q8 = Copy::Codes(codes, scales);
        self.combine(
            q8, out, partial_o, partial_ml, positions, split_len, n_heads, head_dim,
        )
    }

    /// The three combine kernels' launch: with the output's copy `copy` asks for.
    #[allow(clippy::too_many_arguments)]
    fn combine(
        &self,
        copy: Copy<'_, '_, '_>,
        out: &mut Out<f32>,
        partial_o: &In<f32>,
        partial_ml: &In<f32>,
        positions: &In<u32>,
        split_len: usize,
        n_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let n = out.len() / (n_heads * head_dim);
        assert!(n > 0 && out.len() == n * n_heads * head_dim && positions.len() == n);
        let n_splits = partial_ml.len() / (2 * n * n_heads);
        assert!(n_splits > 0 && partial_o.len() == n * n_heads * n_splits * head_dim);
        assert!(
            n_splits <= 8192,
            "attention_combine_f32 keeps at most 8192 split weights in shared memory"
        );
        // Groups of head_dim threads share the splits, each taking up to COMBINE_IN_FLIGHT
        // at once: as many groups as the longest token needs, up to the 1024 threads a
        // block may have (the kernel's groups follow each token's own splits).
        let groups = n_splits
            .div_ceil(COMBINE_IN_FLIGHT)
            .clamp(1, 1024 / head_dim);
        let threads = (groups * head_dim).div_ceil(32) * 32;
        assert!(
            threads <= 1024,
            "attention_combine_f32: head_dim {head_dim} over 1024"
        );
        let cfg = LaunchConfig {
            grid_dim: (u32_of(n_heads, "n_heads"), u32_of(n, "n"), 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: (32 + u32_of(n_splits, "n_splits") + threads as u32) * 4,
        };
        let (ns, hd) = (u32_of(n_splits, "n_splits"), u32_of(head_dim, "head_dim"));
        let sl = u32_of(split_len, "split_len");
        let mut traffic = traffic::attention_combine_f32(n, n_heads, head_dim, n_splits);
        let (func, name) = match &copy {
            Copy::None => (&self.kernels.attention_combine_f32, "attention_combine_f32"),
            Copy::Bf16(_) => {
                traffic.bytes += 2 * out.len() as u64;
                let k = &self.kernels.attention_combine_f32_bf16;
                (k, "attention_combine_f32_bf16")
            }
            Copy::Codes(..) => {
                // A byte a value and two floats a group of 32.
                traffic.bytes += (out.len() + out.len() / 4) as u64;
                let k = &self.kernels.attention_combine_q8_f32;
                (k, "attention_combine_q8_f32")
            }
        };
        let mut b = self.launcher(func);
        b.arg(out);
        match copy {
            Copy::None => {}
            Copy::Bf16(o) => {
                b.arg(o);
            }
            Copy::Codes(codes, scales) => {
                b.arg(codes).arg(scales);
            }
        }
        b.arg(partial_o).arg(partial_ml).arg(positions);
        b.arg(&ns).arg(&sl).arg(&hd);
        // SAFETY: shapes checked; a multiple of 32 threads, at least head_dim times the
        // groups a token of n_splits splits uses, and 32 + n_splits + threads floats of
        // shared memory; the caller's positions are those the split kernel ran with (split
        // 0 holds position 0, so every maximum is finite); the bf16 copy as long as out, the
        // codes too, and head_dim whole groups for them.
        self.timed(name, traffic, || unsafe { b.launch(cfg) })
    }
}

/// What a combine kernel writes beside its f32 output.
enum Copy<'a, 'b, 'c> {
    None,
    /// The output rounded to bf16 (`attention_combine_f32_bf16`).
    Bf16(&'a mut Out<'b, u16>),
    /// The output's 8-bit codes and their scales (`attention_combine_q8_f32`).
    Codes(&'a mut Out<'b, u8>, &'a mut Out<'c, f32>),
}
