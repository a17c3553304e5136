//! Argument structs a kernel shares with its launch wrapper, its CPU twin and its test:
//! `gpu-kernels/src/args.rs`, the same file, compiled into both (`include!`); and the
//! host's groupings of the buffers that travel with them.

#![allow(dead_code)]
include!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/gpu-kernels/src/args.rs"
));

use crate::batch::Batch;
use crate::config::Config;
use crate::weights::blocks::BlockType;

/// A struct a kernel takes by value: its bytes are the parameter (`gpu::launch`).
///
/// # Safety
/// `#[repr(C)]` plain data, defined once for both sides (`gpu-kernels/src/args.rs`).
pub unsafe trait ByValue: Copy {}

// SAFETY: plain `#[repr(C)]` structs of `u32`s, whose definitions are the kernels' own.
unsafe impl ByValue for PagedShape {}
unsafe impl ByValue for Heads {}
unsafe impl ByValue for Splits {}
unsafe impl ByValue for MatmulShape {}
unsafe impl ByValue for RouteShape {}

/// Every `ByValue` struct and its size: what a kernel's parameter of that type must take in
/// the PTX (`gpu::ptx`'s test).
pub const BY_VALUE: &[(&str, usize)] = &[
    ("PagedShape", size_of::<PagedShape>()),
    ("Heads", size_of::<Heads>()),
    ("Splits", size_of::<Splits>()),
    ("MatmulShape", size_of::<MatmulShape>()),
    ("RouteShape", size_of::<RouteShape>()),
];

/// A size as a kernel's `u32`; one that does not fit is a bug in the caller (the model's
/// sizes are bounded when its config is read).
pub fn u32_of(n: usize, what: &str) -> u32 {
    u32::try_from(n).unwrap_or_else(|_| panic!("{what} = {n} does not fit a kernel's u32 argument"))
}

impl Heads {
    pub fn new(n_heads: usize, n_kv_heads: usize, head_dim: usize) -> Heads {
        Heads {
            n_heads: u32_of(n_heads, "n_heads"),
            n_kv_heads: u32_of(n_kv_heads, "n_kv_heads"),
            head_dim: u32_of(head_dim, "head_dim"),
        }
    }

    /// The model's heads.
    pub fn of(c: &Config) -> Heads {
        Heads::new(c.n_heads, c.n_kv_heads, c.head_dim)
    }

    /// `(n_heads, n_kv_heads, head_dim)` as sizes.
    pub fn sizes(&self) -> (usize, usize, usize) {
        (
            self.n_heads as usize,
            self.n_kv_heads as usize,
            self.head_dim as usize,
        )
    }

    /// `n_heads * head_dim`: a token's queries.
    pub fn q_dim(&self) -> usize {
        (self.n_heads * self.head_dim) as usize
    }

    /// `n_kv_heads * head_dim`: a token's keys (or values).
    pub fn kv_dim(&self) -> usize {
        (self.n_kv_heads * self.head_dim) as usize
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        (self.n_heads / self.n_kv_heads) as usize
    }
}

impl PagedShape {
    /// The shape of attention over every earlier position.
    pub fn new(max_blocks: usize, heads: Heads) -> PagedShape {
        PagedShape {
            max_blocks: u32_of(max_blocks, "max_blocks"),
            heads,
            window: 0,
        }
    }

    /// The same over a sliding window of `window` positions (`None`: every position).
    pub fn windowed(self, window: Option<usize>) -> PagedShape {
        let window = window.map_or(0, |w| u32_of(w, "window"));
        PagedShape { window, ..self }
    }
}

impl Splits {
    pub fn new(n_splits: usize, split_len: usize, head_dim: usize) -> Splits {
        Splits {
            n_splits: u32_of(n_splits, "n_splits"),
            split_len: u32_of(split_len, "split_len"),
            head_dim: u32_of(head_dim, "head_dim"),
        }
    }
}

/// The fused projection's rows and the norms of their query and key heads (Qwen3), as
/// `qkv_norm_rope_write_bf16` takes them: `V` is a device view for the kernel's wrapper and
/// a host slice for its CPU twin.
#[derive(Clone, Copy)]
pub struct NormedQkv<V> {
    /// `[n, q_dim + 2 * kv_dim]`, each row `[q | k | v]`
    pub qkv: V,
    /// `[head_dim]` each: the norm of every query head, of every key head
    pub q_norm: V,
    pub k_norm: V,
    pub eps: f32,
}

/// What every paged-attention kernel reads: the queries, one layer's KV cache, and where
/// each token's sequence lives in it. `F`, `K` and `I` are how the f32 queries, the cache's
/// elements and the u32 indices are held: device views for a kernel's wrapper
/// (`gpu::kernels::attention::PagedIn`), host slices for its CPU twin (`cpu::ops::PagedRef`).
#[derive(Clone, Copy)]
pub struct Paged<F, K, I> {
    /// `[n, n_heads, head_dim]`
    pub q: F,
    /// One layer's keys and values, `[n_blocks * BLOCK_SIZE, n_kv_heads, head_dim]` each
    pub k_cache: K,
    pub v_cache: K,
    /// `[n_seqs, max_blocks]` each sequence's blocks
    pub block_tables: I,
    /// `[n]` each token's sequence: its row of `block_tables`
    pub token_seq: I,
    /// `[n]` each token's position in its sequence
    pub positions: I,
    pub shape: PagedShape,
}

impl<'a, K> Paged<&'a [f32], &'a [K], &'a [u32]> {
    /// The queries `q` over one layer's cache, for the tokens of `batch` (on the host).
    pub fn of_batch(
        batch: &'a Batch,
        q: &'a [f32],
        (k_cache, v_cache): (&'a [K], &'a [K]),
        heads: Heads,
    ) -> Self {
        Paged {
            q,
            k_cache,
            v_cache,
            block_tables: &batch.block_tables,
            token_seq: &batch.token_seq,
            positions: &batch.positions,
            shape: PagedShape::new(batch.max_blocks, heads),
        }
    }
}

impl RouteShape {
    /// `n_tokens` tokens' routing over `moe`'s experts.
    pub fn new(n_tokens: usize, moe: &crate::config::Moe) -> RouteShape {
        RouteShape {
            n_tokens: u32_of(n_tokens, "n_tokens"),
            n_experts: u32_of(moe.n_experts, "n_experts"),
            top_k: u32_of(moe.top_k, "top_k"),
            renormalize: moe.renormalize as u32,
        }
    }
}

impl MatmulShape {
    /// `n_tokens` rows of `n_in` through `n_out` rows of weights, into rows of `out_stride`
    /// floats, added to what they hold where `accumulate`.
    pub fn new(
        n_tokens: usize,
        n_in: usize,
        n_out: usize,
        out_stride: usize,
        accumulate: bool,
    ) -> MatmulShape {
        MatmulShape {
            n_tokens: u32_of(n_tokens, "n_tokens"),
            n_in: u32_of(n_in, "n_in"),
            n_out: u32_of(n_out, "n_out"),
            out_stride: u32_of(out_stride, "out_stride"),
            accumulate: accumulate as u32,
        }
    }
}

/// A matrix of quantized rows as a matmul reads it: its block type, its bytes (`[n_rows]`
/// rows of `ty.row_bytes(n_in)`, as the file has them), and fp8's scales (`[n_rows]` f32,
/// one a row; none for the GGUF types, whose scales are inside their blocks). `B` and `S`
/// are how the bytes and the scales are held: device views for a kernel's wrapper
/// (`gpu::kernels::gemv_quant::BlocksIn`), host slices for its CPU twin
/// (`cpu::quant::BlocksRef`).
#[derive(Clone, Copy)]
pub struct Blocks<B, S> {
    pub ty: BlockType,
    pub bytes: B,
    pub row_scales: Option<S>,
}

/// A mixture of experts' routing as `route_experts_f32` writes it and the grouped GEMVs and
/// `combine_experts_f32` read it (`gpu-kernels/src/route.rs` gives the shapes): `U` and `F`
/// are how its `u32` and `f32` buffers are held, device views for the kernels' wrappers and
/// host slices for their CPU twins.
pub struct Routing<U, F> {
    /// `[n_tokens, top_k]`: each token's experts, the most probable first.
    pub choice: U,
    /// `[n_tokens, top_k]`: their weights.
    pub choice_weight: F,
    /// `[n_tokens * top_k]`: the token of each pair, pairs grouped by expert.
    pub index: U,
    /// `[n_experts]`: the expert of each run of pairs (0 for the empty runs at the end).
    pub run_expert: U,
    /// `[n_experts + 1]`: where each run starts (the last, `n_tokens * top_k`, where all end).
    pub run_start: U,
    /// `[n_tokens, top_k]`: the pair that each token's choice became.
    pub pair_of: U,
}

/// A grouped GEMV's runs of pairs, `Routing`'s `run_expert` and `run_start`: `U` as there.
#[derive(Clone, Copy)]
pub struct Runs<U> {
    /// `[n_experts]`
    pub expert: U,
    /// `[n_experts + 1]`
    pub start: U,
}
