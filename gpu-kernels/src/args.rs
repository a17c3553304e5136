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
