// Argument structs a kernel shares with its launch wrapper, its CPU twin and its test: the
// sizes that travel together, as one `#[repr(C)]` value, so that each side spells them once.
// No imports: the host compiles this same file too (`engine/kernel_args.rs`, `include!`).
//
// Kernels take these by value, after their pointer arguments. Pointers stay arguments of
// their own: the compiler knows a kernel's pointer arguments point at global memory and
// loads through them with `ld.global`, where a pointer read from a struct would take the
// generic address path.

/// The paged attention's shape: the query and key/value heads, and how the batch's tokens
/// find their sequences' blocks. Every attention kernel takes it, with the queries, one
/// layer's cache (`[n_blocks * BLOCK_SIZE, n_kv_heads, head_dim]`), the block tables
/// (`[n_seqs, max_blocks]`), each token's sequence and each token's position (`[n]`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedShape {
    /// Row stride of the block tables: the most blocks a sequence holds.
    pub max_blocks: u32,
    pub heads: Heads,
    /// A sliding window: the query at position p attends to positions `p + 1 - window ..=
    /// p` only (Gemma 3's local layers); 0 for every position up to p.
    pub window: u32,
}

impl PagedShape {
    /// The first position the query at `position` attends to: 0, or the window's first.
    pub fn first_position(&self, position: usize) -> usize {
        match self.window {
            0 => 0,
            w => (position + 1).saturating_sub(w as usize),
        }
    }
}

/// A layer's attention heads.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    /// Query heads: a multiple of `n_kv_heads`, each KV head serving a group of them.
    pub n_heads: u32,
    /// Key and value heads.
    pub n_kv_heads: u32,
    /// Dimensions of one head.
    pub head_dim: u32,
}

/// Flash-decoding's splits of the context: `n_splits` of `split_len` positions each, the
/// partial results of a (token, head) row in `n_splits` consecutive rows of `head_dim`
/// values (and two floats, the running maximum and sum, for each).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Splits {
    pub n_splits: u32,
    pub split_len: u32,
    pub head_dim: u32,
}

/// A linear layer's sizes, for the matmuls that write into a wider output and may add to
/// it: `out[t, o] (+)= sum_i x[t, i] w[o, i] (+ bias[o])` for tokens `t < n_tokens` and the
/// matrix's rows `o < n_out`. The GEMVs and GEMMs over quantized weights take it (the GGUF
/// types' and fp8's); several matrices' rows then land side by side in one output, as the
/// runs of a fused q, k and v matrix do.
///
/// - `x`: `[n_tokens, n_in]`, in the form the kernel reads (f32, bf16, or 8-bit codes)
/// - `w`: `[n_out]` rows of `n_in` weights
/// - `out`: `[n_tokens, out_stride]` f32, this matrix's columns `0..n_out` of each row
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulShape {
    /// Tokens: the rows of `x` and of `out`.
    pub n_tokens: u32,
    /// A token's inputs: the columns of `x`, the weights of a row of `w`.
    pub n_in: u32,
    /// The matrix's rows: the columns of `out` it writes.
    pub n_out: u32,
    /// Floats from one token's row of `out` to the next's: `n_out` or more.
    pub out_stride: u32,
    /// 1: the product is added to what `out` holds (a residual add); 0: it replaces it.
    pub accumulate: u32,
}

impl MatmulShape {
    /// `[n_tokens, n_in, n_out, out_stride]`, as the indices they count.
    #[inline(always)]
    pub fn sizes(&self) -> [usize; 4] {
        [self.n_tokens, self.n_in, self.n_out, self.out_stride].map(|v| v as usize)
    }

    /// Whether the product is added to what `out` holds.
    #[inline(always)]
    pub fn accumulates(&self) -> bool {
        self.accumulate != 0
    }
}

/// A mixture of experts' routing: each of `n_tokens` tokens' router logits over `n_experts`
/// experts, of which it keeps the `top_k` most probable. `route_experts_f32` takes it, and
/// `combine_experts_f32` its `top_k`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteShape {
    pub n_tokens: u32,
    pub n_experts: u32,
    pub top_k: u32,
    /// 1: the kept probabilities are divided by their sum (Mixtral, Qwen3-MoE's
    /// `norm_topk_prob`); 0: they stay the softmax over every expert.
    pub renormalize: u32,
}

impl RouteShape {
    /// `[n_tokens, n_experts, top_k]`, as the indices they count.
    #[inline(always)]
    pub fn sizes(&self) -> [usize; 3] {
        [self.n_tokens, self.n_experts, self.top_k].map(|v| v as usize)
    }

    /// The (token, expert) pairs a pass routes: `n_tokens * top_k`.
    #[inline(always)]
    pub fn pairs(&self) -> usize {
        self.n_tokens as usize * self.top_k as usize
    }
}
