//! The attention kernels over the paged cache: `attention_f32` (the lesson's first, one
//! block per token and head) and `attention_bf16` (the same over the bf16 cache), and
//! flash-decoding's `attention_split_bf16` and `attention_combine_f32`.

use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig};

use super::{In, Out, aligned16, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::kernel_args::{Paged, Splits};
use crate::tiles::{BLOCK_SIZE, COMBINE_IN_FLIGHT, MAX_HEAD_DIM, SPLIT_MAX_HEAD_DIM};
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

/// A paged attention's inputs on the device (`kernel_args::Paged`): the queries, one layer's
/// cache of `K`, and the batch's map into it.
pub type PagedIn<'a, K> = Paged<In<'a, f32>, In<'a, K>, In<'a, u32>>;

/// One layer's scales of the fp8 cache, the keys' and the values': `[n_blocks, n_kv_heads,
/// 16]` bytes each (`kv::fp8`).
pub type KvScales<'a> = (In<'a, u8>, In<'a, u8>);

/// Checks `scales` against the fp8 cache of `p`: a byte a head row, 16-byte aligned.
pub(super) fn check_scales(g: &Gpu, name: &str, p: &PagedIn<u8>, scales: &KvScales) {
    let rows = p.k_cache.len() / p.shape.heads.head_dim as usize;
    assert!(
        scales.0.len() == rows && scales.1.len() == rows,
        "{name}: a scale a head row ({rows})"
    );
    assert!(
        aligned16(&scales.0, &g.stream) && aligned16(&scales.1, &g.stream),
        "{name} copies the scales 16 bytes at a time"
    );
}

impl Gpu {
    /// Causal GQA attention over the paged cache; see the kernel's header for the shapes.
    ///
    /// # Safety
    /// Every token's sequence has a row of `block_tables`, whose entries up to the token's
    /// position name blocks of the caches, and its own key and value are written.
    pub unsafe fn attention_f32(&self, out: &mut Out<f32>, p: &PagedIn<f32>) -> Result<()> {
        self.per_head(
            (&self.kernels.attention_f32, "attention_f32", 4),
            out,
            p,
            None,
        )
    }

    /// As `attention_f32`, over a bf16 cache.
    ///
    /// # Safety
    /// As `attention_f32`.
    pub unsafe fn attention_bf16(&self, out: &mut Out<f32>, p: &PagedIn<u16>) -> Result<()> {
        self.per_head(
            (&self.kernels.attention_bf16, "attention_bf16", 2),
            out,
            p,
            None,
        )
    }

    /// As `attention_f32`, over the fp8 cache: e4m3 keys and values, and their `scales`.
    ///
    /// # Safety
    /// As `attention_f32`.
    pub unsafe fn attention_fp8(
        &self,
        out: &mut Out<f32>,
        p: &PagedIn<u8>,
        scales: &KvScales,
    ) -> Result<()> {
        check_scales(self, "attention_fp8", p, scales);
        let kernel = (&self.kernels.attention_fp8, "attention_fp8", 1);
        self.per_head(kernel, out, p, Some(scales))
    }

    /// The launch `attention_f32`, `attention_bf16` and `attention_fp8` share: the kernel,
    /// its name and the bytes of a cache element `T`, then the kernel's arguments (the
    /// scales of an fp8 cache after the caches).
    fn per_head<T: DeviceRepr>(
        &self,
        (func, name, cache_bytes): (&CudaFunction, &'static str, usize),
        out: &mut Out<f32>,
        p: &PagedIn<T>,
        scales: Option<&KvScales>,
    ) -> Result<()> {
        let n = p.positions.len();
        let heads = p.shape.heads;
        let (n_heads, n_kv_heads, head_dim) = heads.sizes();
        assert!(
            head_dim <= MAX_HEAD_DIM,
            "{name} holds at most {MAX_HEAD_DIM} dimensions per head (got {head_dim})"
        );
        assert!(
            n_kv_heads > 0
                && n_heads.is_multiple_of(n_kv_heads)
                && p.q.len() == n * heads.q_dim()
                && out.len() == p.q.len()
        );
        assert!(
            p.token_seq.len() == n
                && p.k_cache.len() == p.v_cache.len()
                && p.k_cache.len() % (BLOCK_SIZE * heads.kv_dim()) == 0
        );
        let max_blocks = p.shape.max_blocks as usize;
        assert!(max_blocks > 0 && p.block_tables.len() % max_blocks == 0);
        let n_warps = ATTENTION_THREADS / 32;
        let cfg = LaunchConfig {
            grid_dim: (heads.n_heads, u32_of(n, "n"), 1),
            block_dim: (ATTENTION_THREADS, 1, 1),
            shared_mem_bytes: n_warps * (heads.head_dim + 2) * 4,
        };
        let traffic = move |positions: &[u32]| {
            let attended = traffic::attended(positions);
            traffic::attention_per_head(attended, n, n_heads, n_kv_heads, head_dim, cache_bytes)
        };
        let mut b = self.launcher(func);
        b.arg(out).arg(&p.q).arg(&p.k_cache).arg(&p.v_cache);
        if let Some((k_scales, v_scales)) = scales {
            b.arg(k_scales).arg(v_scales);
        }
        b.arg(&p.block_tables)
            .arg(&p.token_seq)
            .arg(&p.positions)
            .arg(&p.shape);
        // SAFETY: shapes checked; the batch was built from block tables that cover every
        // position up to each token's own, whose key and value were written before.
        self.timed_batch(name, traffic, || unsafe { b.launch(cfg) })
    }

    /// Flash-decoding over splits of `split_len` positions; `n_splits` is
    /// `partial_ml.len() / (2 * n * n_heads)`. See the kernel's header for the shapes.
    ///
    /// # Safety
    /// As `attention_f32`, and `n_splits * split_len` is past every token's position.
    pub unsafe fn attention_split_bf16(
        &self,
        partial_o: &mut Out<f32>,
        partial_ml: &mut Out<f32>,
        p: &PagedIn<u16>,
        split_len: usize,
    ) -> Result<()> {
        let heads = p.shape.heads;
        let head_dim = heads.head_dim as usize;
        assert!(
            head_dim <= SPLIT_MAX_HEAD_DIM
                && head_dim.is_multiple_of(8)
                && heads.n_kv_heads > 0
                && heads.n_heads.is_multiple_of(heads.n_kv_heads)
                && heads.group() <= 32
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
            threads: 32 * heads.group() as u32,
            shared,
        };
        // SAFETY: the caller's guarantee, passed on; the block and shared memory the
        // kernel's header asks for.
        unsafe { self.attention_split(kernel, partial_o, partial_ml, p, None, split_len) }
    }

    /// The launch the split kernels share (`attention_split_bf16`,
    /// `attention_split_mma_bf16`, and `attention_split_mma_fp8` with its `scales`): the
    /// same arguments and partial results, checked alike, a grid of `(n_kv_heads, n_splits,
    /// n)` blocks of the kernel's size.
    ///
    /// # Safety
    /// As `attention_split_bf16`; `kernel` names a split kernel with its block size and
    /// shared memory.
    pub(super) unsafe fn attention_split<T: DeviceRepr>(
        &self,
        kernel: SplitKernel,
        partial_o: &mut Out<f32>,
        partial_ml: &mut Out<f32>,
        p: &PagedIn<T>,
        scales: Option<&KvScales>,
        split_len: usize,
    ) -> Result<()> {
        let name = kernel.name;
        let n = p.positions.len();
        let heads = p.shape.heads;
        let (n_heads, n_kv_heads, head_dim) = heads.sizes();
        let n_splits = partial_ml.len() / (2 * n * n_heads);
        assert!(
            aligned16(&p.k_cache, &self.stream) && aligned16(&p.v_cache, &self.stream),
            "{name} copies the cache 16 bytes at a time"
        );
        assert!(
            n_splits > 0
                && partial_ml.len() == 2 * n * n_heads * n_splits
                && partial_o.len() == n * n_heads * n_splits * head_dim
        );
        assert!(p.q.len() == n * heads.q_dim() && p.token_seq.len() == n && split_len > 0);
        let max_blocks = p.shape.max_blocks as usize;
        assert!(
            p.k_cache.len() == p.v_cache.len()
                && max_blocks > 0
                && p.block_tables.len().is_multiple_of(max_blocks)
        );
        let cfg = LaunchConfig {
            grid_dim: (
                heads.n_kv_heads,
                u32_of(n_splits, "n_splits"),
                u32_of(n, "n"),
            ),
            block_dim: (kernel.threads, 1, 1),
            shared_mem_bytes: kernel.shared as u32,
        };
        let sl = u32_of(split_len, "split_len");
        let split_traffic = match scales {
            Some(_) => traffic::attention_split_fp8,
            None => traffic::attention_split_bf16,
        };
        let traffic = move |positions: &[u32]| {
            let attended = traffic::attended(positions);
            split_traffic(attended, n, n_heads, n_kv_heads, head_dim, n_splits)
        };
        let mut b = self.launcher(kernel.func);
        b.arg(partial_o)
            .arg(partial_ml)
            .arg(&p.q)
            .arg(&p.k_cache)
            .arg(&p.v_cache);
        if let Some((k_scales, v_scales)) = scales {
            b.arg(k_scales).arg(v_scales);
        }
        b.arg(&p.block_tables)
            .arg(&p.token_seq)
            .arg(&p.positions)
            .arg(&p.shape)
            .arg(&sl);
        // SAFETY: shapes checked; the caller sizes n_splits * split_len past every position
        // (the runner computes it from the batch), and the block tables cover each context;
        // the block and shared memory are the kernel's own (the caller's guarantee).
        self.timed_batch(name, traffic, || unsafe { b.launch(cfg) })
    }

    /// Merges flash-decoding's splits: out `[n, n_heads, head_dim]`, from `splits.n_splits`
    /// partial results a row.
    pub fn attention_combine_f32(
        &self,
        out: &mut Out<f32>,
        partial_o: &In<f32>,
        partial_ml: &In<f32>,
        positions: &In<u32>,
        splits: Splits,
    ) -> Result<()> {
        self.combine(Copy::None, out, partial_o, partial_ml, positions, splits)
    }

    /// `attention_combine_f32`, also writing the output rounded to bf16 into `out_bf16`:
    /// o_proj's tensor-core input without a rounding launch of its own.
    pub fn attention_combine_f32_bf16(
        &self,
        out: &mut Out<f32>,
        out_bf16: &mut Out<u16>,
        partial_o: &In<f32>,
        partial_ml: &In<f32>,
        positions: &In<u32>,
        splits: Splits,
    ) -> Result<()> {
        assert_eq!(out_bf16.len(), out.len());
        let bf16 = Copy::Bf16(out_bf16);
        self.combine(bf16, out, partial_o, partial_ml, positions, splits)
    }

    /// `attention_combine_f32`, also making the output 8-bit codes as `quantize_q8_f32`
    /// makes them (`codes` `[n, n_heads * head_dim]`, `scales` `[n, n_heads * head_dim /
    /// 32][2]`): o_proj's input for its GEMV over GGUF blocks without a launch of its own.
    /// `head_dim` must be whole groups of 32.
    pub fn attention_combine_q8_f32(
        &self,
        out: &mut Out<f32>,
        (codes, scales): (&mut Out<u8>, &mut Out<f32>),
        partial_o: &In<f32>,
        partial_ml: &In<f32>,
        positions: &In<u32>,
        splits: Splits,
    ) -> Result<()> {
        let head_dim = splits.head_dim;
        assert!(
            head_dim.is_multiple_of(32),
            "head_dim {head_dim}: whole groups of 32"
        );
        assert!(codes.len() >= out.len() && scales.len() >= out.len() / 16);
        let q8 = Copy::Codes(codes, scales);
        self.combine(q8, out, partial_o, partial_ml, positions, splits)
    }

    /// The three combine kernels' launch: with the output's copy `copy` asks for.
    fn combine(
        &self,
        copy: Copy<'_, '_, '_>,
        out: &mut Out<f32>,
        partial_o: &In<f32>,
        partial_ml: &In<f32>,
        positions: &In<u32>,
        splits: Splits,
    ) -> Result<()> {
        let (n_splits, head_dim) = (splits.n_splits as usize, splits.head_dim as usize);
        let n = positions.len();
        assert!(n > 0 && head_dim > 0 && out.len().is_multiple_of(n * head_dim));
        let n_heads = out.len() / (n * head_dim);
        assert!(
            n_splits > 0
                && splits.split_len > 0
                && partial_ml.len() == 2 * n * n_heads * n_splits
                && partial_o.len() == n * n_heads * n_splits * head_dim
        );
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
        b.arg(partial_o).arg(partial_ml).arg(positions).arg(&splits);
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
