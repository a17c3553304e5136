// Launch shapes and sizes the host and the kernels must agree on. Plain constants, no
// imports: the host compiles this same file into its launch wrappers (`include!`), so a
// change here changes both sides.

/// Tokens per KV-cache block: a block table entry covers this many positions, and a cache
/// slot is `block * BLOCK_SIZE + offset`.
pub const BLOCK_SIZE: usize = 16;

/// Widest head the attention kernels take (Gemma 3's 256): a lane of a warp holds at most 8
/// of its dimensions.
pub const MAX_HEAD_DIM: usize = 256;

/// Widest head the per-lane flash-decoding kernel (`attention_split_bf16`) takes: a lane
/// holds at most 4 of its dimensions, for each of the four keys and values it has in
/// registers at once. Wider heads attend a block per token and head.
pub const SPLIT_MAX_HEAD_DIM: usize = 128;

/// Tensor-core GEMM: tokens per block tile.
pub const MMA_BM: usize = 128;
/// Tensor-core GEMM: output features per block tile.
pub const MMA_BN: usize = 128;
/// Tensor-core GEMM: depth of one step along the reduction.
pub const MMA_BK: usize = 32;
/// Tensor-core GEMM: steps in shared memory at once (one being computed on, the rest
/// arriving).
pub const MMA_STAGES: usize = 4;
/// Tensor-core GEMM: threads per block, 8 warps.
pub const MMA_THREADS: usize = 256;
/// Tensor-core GEMM: row length of a shared tile in bf16, the step and 8 of padding (see
/// `gemm_mma.rs`).
pub const MMA_STRIDE: usize = MMA_BK + 8;
/// Tensor-core GEMM: dynamic shared memory of a launch, `MMA_STAGES` steps of two
/// `[128][MMA_STRIDE]` bf16 tiles (80 KiB: over the default 48 KiB, so the host raises the
/// kernel's limit when the module loads).
pub const MMA_SHARED_BYTES: usize = MMA_STAGES * 2 * MMA_BM * MMA_STRIDE * 2;

/// Warpgroup GEMM (sm_90a): tokens per block tile, 64 per warpgroup.
pub const WGMMA_BM: usize = 128;
/// Warpgroup GEMM: the widths a block tile of output features can have, one `m64nN` product
/// wide. The host picks the one that fills the GPU best: wider tiles do more arithmetic
/// per byte copied (a step copies `(128 + N) x 64` bf16 for `128 x N x 64` products), so
/// 256 unless a narrower one packs the SMs more evenly.
pub const WGMMA_WIDTHS: [usize; 4] = [128, 192, 224, 256];
/// Warpgroup GEMM: the widest of `WGMMA_WIDTHS`, which sizes the shared buffers.
pub const WGMMA_MAX_BN: usize = WGMMA_WIDTHS[WGMMA_WIDTHS.len() - 1];
/// Warpgroup GEMM: depth of one step along the reduction: 64 bf16, one 128-byte swizzled row.
pub const WGMMA_BK: usize = 64;
/// Warpgroup GEMM: steps in shared memory at once (one being multiplied, one whose products
/// may still be running, two arriving).
pub const WGMMA_STAGES: usize = 4;
/// Warpgroup GEMM: threads that multiply, 2 warpgroups of 128.
pub const WGMMA_THREADS: usize = 256;
/// `gemm_wgmma_bf16` and `_fp8`: threads per block, the two warpgroups that multiply and
/// the warp that copies (`gemm_wgmma.rs`).
pub const WGMMA_GEMM_THREADS: usize = WGMMA_THREADS + 32;
/// Warpgroup GEMM: dynamic shared memory of a launch, `WGMMA_STAGES` steps of a
/// `[WGMMA_BM][64]` and a `[WGMMA_MAX_BN][64]` bf16 tile, 1 KiB to align them to the
/// swizzle's 1024-byte period, and two 8-byte barriers a step (193 KiB: one block per SM).
pub const WGMMA_SHARED_BYTES: usize =
    WGMMA_STAGES * (WGMMA_BM + WGMMA_MAX_BN) * WGMMA_BK * 2 + 1024 + 16 * WGMMA_STAGES;

/// Warpgroup GEMM over GGUF blocks (`gemm_wgmma_<type>`, sm_90a): output features per
/// block, 64 per warpgroup (the `m64` of a product, held in registers).
pub const WGMMA_BLOCKS_ROWS: usize = 128;
/// Warpgroup GEMM over GGUF blocks: the widths a block tile of tokens can have, one
/// `m64nN` product wide (the tokens are the product's `N`, read from shared memory).
pub const WGMMA_BLOCKS_WIDTHS: [usize; 2] = [128, 256];
/// Warpgroup GEMM over GGUF blocks: weights of a row copied at a time, four 64-deep steps
/// (a row's run of them is then whole 16-byte pieces: Q8_0's 272 bytes); `n_in` is a
/// multiple of it.
pub const WGMMA_BLOCKS_STAGE_K: usize = 256;
/// Warpgroup GEMM over GGUF blocks: bytes of a row's run of `WGMMA_BLOCKS_STAGE_K` weights,
/// for blocks of `block_len` weights in `block_bytes`.
pub const fn wgmma_blocks_run(block_len: usize, block_bytes: usize) -> usize {
    WGMMA_BLOCKS_STAGE_K / block_len * block_bytes
}
/// Warpgroup GEMM over GGUF blocks: bytes a row's run takes in shared memory, whole 16-byte
/// pieces: the run itself where it is some (Q8_0's 272, Q4_K's 144), else the aligned
/// pieces around it (Q6_K's 210 bytes start at any even offset: 14 pieces, 224 bytes).
pub const fn wgmma_blocks_run_stride(block_len: usize, block_bytes: usize) -> usize {
    let run = wgmma_blocks_run(block_len, block_bytes);
    match run % 16 {
        0 => run,
        // Runs start at even offsets: up to 14 bytes into their first piece.
        _ => (run + 14).div_ceil(16) * 16,
    }
}
/// Warpgroup GEMM over GGUF blocks: dynamic shared memory of a launch: `WGMMA_STAGES`
/// steps of the tokens' swizzled `[256][64]` bf16 tile, two stages of the rows'
/// `[128][run stride]` bytes (one being decoded, one arriving), and 1 KiB to align the
/// tiles to the swizzle's period (197 KiB for Q8_0: one block per SM).
pub const fn wgmma_blocks_shared_bytes(block_len: usize, block_bytes: usize) -> usize {
    WGMMA_STAGES * WGMMA_BLOCKS_WIDTHS[1] * WGMMA_BK * 2
        + 2 * WGMMA_BLOCKS_ROWS * wgmma_blocks_run_stride(block_len, block_bytes)
        + 1024
}

/// Prompt attention on tensor cores: (token, query head) rows per block, 16 per warp.
pub const ATTN_MMA_ROWS: usize = 64;
/// Prompt attention on tensor cores: keys staged per step.
pub const ATTN_MMA_KEYS: usize = 64;
/// Prompt attention on tensor cores: threads per block, 4 warps.
pub const ATTN_MMA_THREADS: usize = 128;
/// Prompt attention on tensor cores: dynamic shared memory for heads of `head_dim`: two
/// buffers of the keys' and values' bf16 tiles `[64][head_dim + 8]`, and 16 bytes (68 KiB + 16
/// for heads of 128: over the default 48 KiB, so the host raises the kernel's limit when the
/// module loads).
pub const fn attn_mma_shared_bytes(head_dim: usize) -> usize {
    2 * 2 * ATTN_MMA_KEYS * (head_dim + 8) * 2 + 32
}

/// Prompt attention over the fp8 cache (`attention_mma_fp8`): one buffer of bf16 tiles
/// (the e4m3 bytes turned into bf16 there) and two staging buffers of bytes and scales (the
/// next tile's arriving while one is turned), and 32 bytes.
pub const fn attn_mma_fp8_shared_bytes(head_dim: usize) -> usize {
    2 * ATTN_MMA_KEYS * (head_dim + 8) * 2 + 2 * fp8_staging_bytes(ATTN_MMA_KEYS, head_dim) + 32
}

/// Blocks of the table a tile of `keys` positions can touch: one more than it covers when
/// its first position is not a block's first (a sliding window's start).
pub const fn fp8_scale_blocks(keys: usize) -> usize {
    keys / BLOCK_SIZE + 1
}

/// Shared memory of one fp8 staging buffer (`kv_tiles.rs`) for tiles of `keys` keys: the
/// keys' and the values' e4m3 bytes `[keys][head_dim]`, then their scale bytes,
/// `[fp8_scale_blocks][16]` each.
pub const fn fp8_staging_bytes(keys: usize, head_dim: usize) -> usize {
    2 * keys * head_dim + 2 * fp8_scale_blocks(keys) * BLOCK_SIZE
}

/// Skinny GEMM (a few to 128 tokens): output features per block, 16 per warp.
pub const SKINNY_FEATURES: usize = 128;
/// Skinny GEMM: threads per block, 8 warps.
pub const SKINNY_THREADS: usize = 256;
/// Skinny GEMM: depth of one stage of the reduction (two 32-wide steps): 64 bf16, one
/// 128-byte row of shared memory per feature and per token.
pub const SKINNY_KC: usize = 64;
/// Skinny GEMM: most tiles of 8 tokens a launch holds (128 tokens).
pub const SKINNY_MAX_TILES: usize = 16;

/// Skinny GEMM: the tiles of 8 tokens the kernel computes for `n` tokens (1, 2, 4, 8 or 16:
/// one compiled body each).
pub const fn skinny_tiles(n: usize) -> usize {
    match n.div_ceil(8) {
        0..=1 => 1,
        2 => 2,
        3..=4 => 4,
        5..=8 => 8,
        _ => SKINNY_MAX_TILES,
    }
}

/// Skinny GEMM: stages in shared memory for a body of `tiles` token tiles: as many as fit
/// one block's share of an SM (the weights' 16 KiB each, the tokens' 1 KiB per tile), so
/// that up to 112 KiB of weights are in flight per SM.
pub const fn skinny_stages(tiles: usize) -> usize {
    match tiles {
        0..=4 => 8,
        5..=8 => 6,
        _ => 5,
    }
}

/// Skinny GEMM: one stage's bytes: `[128][64]` bf16 of weights, `[8 tiles][64]` of tokens.
pub const fn skinny_stage_bytes(tiles: usize) -> usize {
    (SKINNY_FEATURES + 8 * tiles) * SKINNY_KC * 2
}

/// Skinny GEMM: dynamic shared memory of a launch for `n` tokens (160 KiB at most).
pub const fn skinny_shared_bytes(n: usize) -> usize {
    let tiles = skinny_tiles(n);
    skinny_stages(tiles) * skinny_stage_bytes(tiles)
}

/// GEMM over GGUF blocks (`gemm_<type>`, `gemm_blocks.rs`): output rows per block, 16 per
/// warp.
pub const BLOCKS_MMA_ROWS: usize = 128;
/// GEMM over GGUF blocks: threads per block, 8 warps.
pub const BLOCKS_MMA_THREADS: usize = 256;
/// GEMM over GGUF blocks: most tokens a launch takes (8 tiles of 8).
pub const BLOCKS_MMA_MAX_TOKENS: usize = 64;
/// GEMM over GGUF blocks: weights of a row in one stage of the reduction (a k-quant block,
/// eight of the 32-weight types'); `n_in` is a multiple of it.
pub const BLOCKS_MMA_STAGE_K: usize = 256;
/// GEMM over GGUF blocks: shared memory a block's stages may take: half an SM's, so that two
/// blocks fit on one.
pub const BLOCKS_MMA_SHARED_BUDGET: usize = 112 * 1024;

/// GEMM over GGUF blocks: bytes a row takes in a stage, for blocks of `block_len` weights in
/// `block_bytes`: its `BLOCKS_MMA_STAGE_K` weights' bytes, copied in 16-byte pieces from the
/// aligned address at or before their start (up to 15 bytes more at each end).
pub const fn blocks_mma_pitch(block_len: usize, block_bytes: usize) -> usize {
    (BLOCKS_MMA_STAGE_K / block_len * block_bytes + 15).div_ceil(16) * 16
}

/// GEMM over GGUF blocks: one stage's bytes for `tiles` tiles of 8 tokens: the rows'
/// `[128][pitch]` bytes of blocks, then the tokens' `[8 tiles][256]` bf16.
pub const fn blocks_mma_stage_bytes(tiles: usize, block_len: usize, block_bytes: usize) -> usize {
    BLOCKS_MMA_ROWS * blocks_mma_pitch(block_len, block_bytes) + 8 * tiles * BLOCKS_MMA_STAGE_K * 2
}

/// GEMM over GGUF blocks: stages in shared memory, 2 to 4, as many as the budget holds (all
/// but one in flight while the warps work on the oldest).
pub const fn blocks_mma_stages(tiles: usize, block_len: usize, block_bytes: usize) -> usize {
    let s = BLOCKS_MMA_SHARED_BUDGET / blocks_mma_stage_bytes(tiles, block_len, block_bytes);
    if s < 2 {
        2
    } else if s > 4 {
        4
    } else {
        s
    }
}

/// GEMM over GGUF blocks: dynamic shared memory of a launch for `n` tokens (136 KiB at most,
/// Q8_0's two stages for 64 tokens).
pub const fn blocks_mma_shared_bytes(n: usize, block_len: usize, block_bytes: usize) -> usize {
    let tiles = skinny_tiles(n);
    blocks_mma_stages(tiles, block_len, block_bytes)
        * blocks_mma_stage_bytes(tiles, block_len, block_bytes)
}

/// Keys `attention_split_mma_bf16` stages and multiplies at a time; its splits are a
/// multiple of this long.
pub const ATTN_SPLIT_MMA_KEYS: usize = 32;
/// Query heads sharing a KV head that `attention_split_mma_bf16` takes at most: the rows of
/// its `mma` that are not padding (the first 8 of 16).
pub const ATTN_SPLIT_MMA_MAX_GROUP: usize = 8;

/// Dynamic shared memory of `attention_split_mma_bf16`: one tile of keys and one of values,
/// `[ATTN_SPLIT_MMA_KEYS][head_dim + 8]` bf16 each (8 of padding per row: rows that differ by
/// one start 16 bytes apart in the banks, so `ldmatrix` reads conflict-free).
pub const fn attn_split_mma_shared_bytes(head_dim: usize) -> usize {
    2 * ATTN_SPLIT_MMA_KEYS * (head_dim + 8) * 2
}

/// The same over the fp8 cache (`attention_split_mma_fp8`): the tiles, then one staging
/// buffer (`fp8_staging_bytes`). 49 KiB for heads of 256: over the default 48, so the host
/// raises the kernel's limit when the module loads.
pub const fn attn_split_mma_fp8_shared_bytes(head_dim: usize) -> usize {
    attn_split_mma_shared_bytes(head_dim) + fp8_staging_bytes(ATTN_SPLIT_MMA_KEYS, head_dim)
}

/// Most parts `gemm_skinny_reduce_f32` adds: the skinny matmul's splits and the warpgroup
/// GEMM's are at most this many.
pub const REDUCE_MAX_PARTS: usize = 8;

/// Flash-decoding's combine (`attention_combine_f32`): splits a thread loads at once, with
/// their maxima and sums, right after the wait for the split kernel; a token's splits are
/// shared by `own.div_ceil(COMBINE_IN_FLIGHT)` groups of `head_dim` threads (at most 1024
/// threads), so that up to 8 * 1024 / head_dim splits take one wait for memory.
pub const COMBINE_IN_FLIGHT: usize = 8;

/// Quantized GEMV (`gemv_fp8`, `gemv_<type>`): most tokens one launch multiplies by the
/// matrix.
pub const QUANT_MAX_TOKENS: usize = 8;
/// fp8 GEMV (`gemv_quant.rs`): chunks of 64 columns whose loads a warp issues before it
/// uses any (two 16-byte loads a lane each). Two took 64 registers a thread and ran faster
/// than four (80) or eight (120): four blocks an SM (H200: docs/lessons.md#quantized-gemvs).
pub const FP8_UNROLL: usize = 2;
/// fp8 GEMV: rows of a block, the 16 of an `mma`'s first operand.
pub const FP8_TILE_ROWS: usize = 16;
/// fp8 GEMV: warps of a block, each a part of the reduction.
pub const FP8_PARTS: usize = 8;
/// fp8 GEMV: bytes of dynamic shared memory: each warp's sums for its rows and tokens.
pub const FP8_SHARED_BYTES: usize = FP8_PARTS * FP8_TILE_ROWS * QUANT_MAX_TOKENS * 4;

/// Registers a thread that `build.rs` caps a kernel at in the Hopper builds (sm_90 and
/// sm_90a): a `.maxnreg` in the kernel's PTX entry, as CUDA C++'s `__launch_bounds__` asks
/// for, where fewer registers a thread, and so more warps an SM, measured faster and `ptxas`
/// spills nothing. `gemv_q8_0` 56 -> 48: ten blocks of 4 warps an SM where nine fitted,
/// Q8_0's batch 1 1.3-1.7% faster on the H200 (where caps that made
/// `ptxas` spill, even 20 bytes, lost up to 21%). `gemv_q4_k` 66 -> 64, where its scales
/// read at once (`Codes::SCALES_AT_ONCE`) had taken it: 32 warps an SM where 28 fitted;
/// uncapped that change lost 4% of Q4_K_M's batch 1, capped it gained 1.2-2% (H200). The
/// sm_80 build keeps its registers: the same caps spill there. `gemv_q5_k_q6_k` 86 -> 72,
/// `gemv_q5_k`'s own, so that a Q5_K_M layer's q, k and v in one launch keep its occupancy.
/// Measured: docs/lessons.md#quantized-gemvs. The warpgroup GEMMs (sm_90a only) are capped
/// so that their blocks of 288 threads can launch at all.
pub const REGISTER_CAPS: [(&str, usize); 5] = [
    ("gemv_q8_0", 48),
    ("gemv_q4_k", 64),
    ("gemv_q5_k_q6_k", 72),
    ("gemm_wgmma_bf16", WGMMA_GEMM_REGISTERS),
    ("gemm_wgmma_fp8", WGMMA_GEMM_REGISTERS),
];
/// `gemm_wgmma_bf16` and `_fp8`: registers a thread, so that a block of `WGMMA_GEMM_THREADS`
/// fits an SM. The SM's 65,536 registers are four sub-partitions of 16,384, each warp's in
/// one of them, so a block of nine warps puts three in one sub-partition: 168 a thread at
/// most (allocated 8 at a time). 224, which fits the 65,536 as a whole, left the occupancy
/// query at zero blocks once a kernel used them all (round 86).
const WGMMA_GEMM_REGISTERS: usize = 65536 / 4 / (WGMMA_GEMM_THREADS / 32).div_ceil(4) / 32 / 8 * 8;

/// Integer GEMV (`gemv_codes.rs`): output rows per block, which share each load of the
/// activations' codes.
pub const CODES_ROWS: usize = 2;
/// Integer GEMV: most warps per block, which split each row's spans between them.
pub const CODES_MAX_WARPS: usize = 4;
/// Integer GEMV: bytes of dynamic shared memory for `warps` warps' sums.
pub const fn codes_shared_bytes(warps: usize) -> usize {
    warps * CODES_ROWS * QUANT_MAX_TOKENS * 4
}

/// A mixture of experts' routing (`route.rs`): most threads of its one block (a warp a
/// token, then a warp an expert, at a time); fewer where many experts' rows of
/// probabilities would outgrow 48 KiB of shared memory.
pub const ROUTE_MAX_THREADS: usize = 1024;
/// Most (token, expert) pairs whose choices the routing keeps in shared memory (as u16),
/// where its walks over them read them; more are read from global memory.
pub const ROUTE_SHARED_PAIRS: usize = 2048;
/// The routing's dynamic shared memory: each warp's row of `n_experts` probabilities, each
/// expert's count and first pair, the runs' and pairs' totals, and the `pairs` choices
/// where they fit.
pub const fn route_shared_bytes(warps: usize, n_experts: usize, pairs: usize) -> usize {
    let staged = if pairs <= ROUTE_SHARED_PAIRS {
        pairs
    } else {
        0
    };
    (warps + 2) * n_experts * 4 + 8 + (2 * staged).next_multiple_of(4)
}

/// Integer GEMV of several tokens on the tensor cores (`gemv_mma.rs`): output rows per block,
/// the 16 of an `mma`'s first operand (a gate row and an up row each with the SwiGLU).
pub const MMA_GEMV_ROWS: usize = 16;
/// Integer GEMV on the tensor cores: warps per block, each a part of every row's blocks.
pub const MMA_GEMV_WARPS: usize = 8;
/// Integer GEMV on the tensor cores: bytes of dynamic shared memory for the warps' sums of
/// `tiles` tiles of rows (2 with the SwiGLU: gate and up) and `QUANT_MAX_TOKENS` tokens.
pub const fn mma_gemv_shared_bytes(tiles: usize) -> usize {
    MMA_GEMV_WARPS * tiles * MMA_GEMV_ROWS * QUANT_MAX_TOKENS * 4
}

/// Streamed gate-and-up GEMV (`gemv_stream.rs`): bytes of shared memory before the stages,
/// for their barriers (8 bytes each: at most 16 stages), keeping the stages 128-byte aligned.
pub const STREAM_BARRIER_BYTES: usize = 128;
/// Streamed gate-and-up GEMV: most stages a block keeps on their way.
pub const STREAM_MAX_STAGES: usize = 4;
/// Streamed gate-and-up GEMV: shared memory a block's stages may take by default (the host
/// may be told another: `RUSTLE_STREAM_BYTES`). Small blocks, several an SM, each waiting at
/// its own barrier, kept the memory busier than a few large ones (H200:
/// docs/lessons.md#quantized-gemvs).
pub const STREAM_BLOCK_BYTES: usize = 50 * 1024;
/// Streamed GEMV of one matrix (`gemv_stream_<type>`): shared memory a block's stages may
/// take by default (`RUSTLE_STREAM_ONE_BYTES`).
pub const STREAM_ONE_BLOCK_BYTES: usize = 50 * 1024;
/// Streamed GEMV of one matrix: the fewest rows for which it streams, so that of a decode
/// step's matrices only the output head does (32000 to 152064 rows on Llama-family
/// vocabularies). Smaller matrices keep `gemv_<type>`: a block's share of them is a tile or
/// two, too little to overlap (H200: docs/lessons.md#quantized-gemvs).
pub const STREAM_MIN_ROWS: usize = 16384;
/// Streamed gate-and-up GEMV: the most shared memory a block may ask for (an SM's 228 KiB
/// less the 1 KiB the system keeps a block).
pub const STREAM_MAX_SHARED_BYTES: usize = 227 * 1024;
/// Streamed gate-and-up GEMV: whether a block of `warps` warps copies its tokens' codes
/// into shared memory before it multiplies, for a type of `block_len` weights a block. The
/// k-quants do in blocks of 4 warps or more (a lane's codes are 64 bytes from its
/// neighbour's; Q4_K's and Q5_K's steps went 2% and 6% faster), not in smaller ones, where
/// the copy's shared memory costs an SM more of its warps (with 2 warps a block it gained
/// in two of seven measurements and lost up to 4.5% in the others, Q6_K at every budget);
/// the 32-weight types read them from global memory (32 bytes apart; Q8_0 lost 1.3% by
/// the copy). Measured on the H200: docs/lessons.md#quantized-gemvs.
pub const fn stream_copies_codes(block_len: usize, warps: usize) -> bool {
    block_len == 256 && warps >= 4
}
/// Streamed gate-and-up GEMV: bytes of the block's copy of `n_tokens` tokens' codes of
/// `n_in` activations (a byte each) and their scales (8 bytes a group of 32), rounded up to
/// 128 so that the stages after it stay 128-byte aligned; none where the block reads them
/// from global memory (`stream_copies_codes`).
pub const fn stream_codes_bytes(
    block_len: usize,
    warps: usize,
    n_tokens: usize,
    n_in: usize,
) -> usize {
    if stream_copies_codes(block_len, warps) {
        (n_tokens * (n_in + n_in / 4)).next_multiple_of(128)
    } else {
        0
    }
}
/// Streamed gate-and-up GEMV: dynamic shared memory for the codes' copy (`codes_bytes`,
/// `stream_codes_bytes`) and `stages` slots of `slot_bytes`.
pub const fn stream_shared_bytes(stages: usize, slot_bytes: usize, codes_bytes: usize) -> usize {
    STREAM_BARRIER_BYTES + codes_bytes + stages * slot_bytes
}

/// The staged read probe (`read_staged.rs`, the `probes` feature): threads a block.
#[cfg(feature = "probes")]
pub const STAGED_THREADS: usize = 256;
/// The staged read probe: bytes before the stages for their barriers (8 bytes each: at most
/// 16 stages), keeping the stages 128-byte aligned.
#[cfg(feature = "probes")]
pub const STAGED_BARRIER_BYTES: usize = 128;
/// The staged read probe: dynamic shared memory for `stages` slots of `tile_bytes` and a
/// word a warp.
#[cfg(feature = "probes")]
pub const fn staged_shared_bytes(stages: usize, tile_bytes: usize) -> usize {
    STAGED_BARRIER_BYTES + stages * tile_bytes + 4 * (STAGED_THREADS / 32)
}

/// Dequantizer to bf16 (`gemv_quant.rs`): words a thread's group of 32 takes in shared
/// memory, one of them padding (threads 17 words apart store to different banks).
pub const DEQUANT_STAGE_WORDS: usize = 17;
/// Dequantizer to bf16: bytes of dynamic shared memory for a block of `threads`.
pub const fn dequant_shared_bytes(threads: usize) -> usize {
    threads * DEQUANT_STAGE_WORDS * 4
}
/// Dequantizer: whether a launch makes a whole matrix in pieces of 8 weights straight from
/// the registers (`dequant_q8_0_pieces`: a type with such a kernel, no row ids, bf16 out),
/// so it takes no shared memory, rather than going through `dequant_blocks`.
pub const fn dequant_in_pieces(has_pieces: bool, row_ids: bool, to_f32: bool) -> bool {
    has_pieces && !row_ids && !to_f32
}
