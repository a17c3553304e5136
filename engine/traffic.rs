//! What each kernel launch (GPU) or reference operation (CPU) must move and compute at the
//! least: every input read once, every output written once, as a formula over its arguments.
//! The profiler divides these by measured times to place each kernel against the memory and
//! compute ceilings.
//!
//! Sizes in elements; f32 and u32 are 4 bytes, bf16 2. FLOPs count a multiply-add as two.

/// Bytes moved and floating-point operations done by one launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub bytes: u64,
    pub flops: u64,
}

/// One timed launch or operation.
#[derive(Clone, Debug)]
pub struct KernelTime {
    pub kernel: &'static str,
    pub ms: f64,
    pub traffic: Traffic,
}

const F32: u64 = 4;
const BF16: u64 = 2;

fn t(bytes: u64, flops: u64) -> Traffic {
    Traffic { bytes, flops }
}

/// `n` rows of `dim` bf16 read, widened and written as f32; `n` token ids read.
pub fn embedding_bf16(n: usize, dim: usize) -> Traffic {
    let (n, dim) = (n as u64, dim as u64);
    t(n * dim * (BF16 + F32) + n * F32, 0)
}

/// `rows x dim` read and written, the weight read; per element a square-add and two
/// multiplies.
pub fn rmsnorm_f32(rows: usize, dim: usize) -> Traffic {
    let (rows, dim) = (rows as u64, dim as u64);
    t(2 * rows * dim * F32 + dim * F32, 4 * rows * dim)
}

/// `rmsnorm_f32`'s, and the output written again as bf16.
pub fn rmsnorm_f32_bf16(rows: usize, dim: usize) -> Traffic {
    let norm = rmsnorm_f32(rows, dim);
    t(norm.bytes + (rows * dim) as u64 * BF16, norm.flops)
}

/// `rows x dim` read once (each block's re-reads of the row come from L2), the weight
/// read, the codes and each group's two scales written; per element a square-add, two
/// multiplies and the code's division.
pub fn rmsnorm_q8_f32(rows: usize, dim: usize) -> Traffic {
    let (rows, dim) = (rows as u64, dim as u64);
    t(
        rows * dim * (F32 + 1) + rows * dim / 32 * 2 * F32 + dim * F32,
        5 * rows * dim,
    )
}

/// The matrix once, x once, out written (and read first when accumulating), the bias.
pub fn gemv_bf16(n_in: usize, n_out: usize, accumulate: bool, bias: bool) -> Traffic {
    let (n_in, n_out) = (n_in as u64, n_out as u64);
    let out = n_out * F32 * (1 + accumulate as u64);
    t(
        n_out * n_in * BF16 + n_in * F32 + out + bias as u64 * n_out * F32,
        2 * n_out * n_in,
    )
}

/// Two matrices, x, and the output.
pub fn gemv_swiglu_bf16(n_in: usize, n_out: usize) -> Traffic {
    let (n_in, n_out) = (n_in as u64, n_out as u64);
    t(
        2 * n_out * n_in * BF16 + n_in * F32 + n_out * F32,
        4 * n_out * n_in,
    )
}

/// The matrix once, the `n x n_in` input, the `n x n_out` output.
pub fn gemm_bf16(n: usize, n_in: usize, n_out: usize, bias: bool) -> Traffic {
    let (n, n_in, n_out) = (n as u64, n_in as u64, n_out as u64);
    t(
        n_out * n_in * BF16 + n * (n_in + n_out) * F32 + bias as u64 * n_out * F32,
        2 * n * n_in * n_out,
    )
}

/// As `gemm_bf16`, with the input in bf16 (2 bytes a value, not 4).
pub fn gemm_mma_bf16(n: usize, n_in: usize, n_out: usize, bias: bool) -> Traffic {
    let (n, n_in, n_out) = (n as u64, n_in as u64, n_out as u64);
    t(
        (n_out + n) * n_in * BF16 + n * n_out * F32 + bias as u64 * n_out * F32,
        2 * n * n_in * n_out,
    )
}

/// The skinny matmul: every weight once, the activations (bf16) once per 128-feature tile
/// (read again by each tile's blocks from cache; counted once, as the bytes memory must
/// deliver), the output written (and read when accumulating), or with the reduction split
/// each split's part written: `2 n n_in n_out` FLOP.
pub fn gemm_skinny_bf16(
    n: usize,
    n_in: usize,
    n_out: usize,
    bias: bool,
    accumulate: bool,
    splits: usize,
) -> Traffic {
    let (n, n_in, n_out, s) = (n as u64, n_in as u64, n_out as u64, splits as u64);
    let out = if s > 1 {
        s * n * n_out * F32
    } else {
        (1 + accumulate as u64) * n * n_out * F32 + bias as u64 * n_out * F32
    };
    t((n_out + n) * n_in * BF16 + out, 2 * n * n_in * n_out)
}

/// The split skinny matmul's second half: the parts read, the output written (and read when
/// accumulating), the bias; one add per part.
pub fn gemm_skinny_reduce_f32(
    len: usize,
    n_out: usize,
    splits: usize,
    bias: bool,
    accumulate: bool,
) -> Traffic {
    let (len, s) = (len as u64, splits as u64);
    t(
        (s + 1 + accumulate as u64) * len * F32 + bias as u64 * n_out as u64 * F32,
        s * len,
    )
}

/// Zeroing `len` floats (the output a split GEMM adds its halves into): written once.
pub fn zero_f32(len: usize) -> Traffic {
    t(len as u64 * F32, 0)
}

/// The same matmul as `gemm_mma_bf16`, on Hopper's warpgroup instructions: the same bytes
/// and arithmetic.
pub fn gemm_wgmma_bf16(n: usize, n_in: usize, n_out: usize, bias: bool) -> Traffic {
    gemm_mma_bf16(n, n_in, n_out, bias)
}

/// The same matmul on e4m3 inputs (one byte a value) with their scales: a scale per token
/// and per output feature read once.
pub fn gemm_wgmma_fp8(n: usize, n_in: usize, n_out: usize, bias: bool) -> Traffic {
    let (n, n_in, n_out) = (n as u64, n_in as u64, n_out as u64);
    t(
        (n_out + n) * n_in + (n + n_out) * F32 + n * n_out * F32 + bias as u64 * n_out * F32,
        2 * n * n_in * n_out,
    )
}

/// Each value read as f32 (the second pass finds it in cache) and written as one byte; a
/// scale a row.
pub fn quantize_fp8_f32(n: usize, n_in: usize) -> Traffic {
    let (n, n_in) = (n as u64, n_in as u64);
    t(n * n_in * (F32 + 1) + n * F32, 0)
}

/// The tensor-core probe: each warp runs `iters x 16` m16n8k16 steps (2 x 16 x 8 x 16
/// FLOP each) and each thread writes one float.
pub fn mma_probe_bf16(threads: usize, iters: usize) -> Traffic {
    let warps = (threads / 32) as u64;
    t(
        threads as u64 * F32,
        warps * iters as u64 * 16 * 2 * 16 * 8 * 16,
    )
}

/// Each value read as f32 and written as bf16; the rounding is not counted as arithmetic.
pub fn f32_to_bf16(len: usize) -> Traffic {
    t(len as u64 * (F32 + BF16), 0)
}

/// `x` (`n x heads x head_dim`) read and written, the positions, a cos and a sin per pair;
/// four multiplies and two adds per pair.
pub fn rope_f32(n: usize, n_heads: usize, head_dim: usize) -> Traffic {
    let (n, x) = (n as u64, (n * n_heads * head_dim) as u64);
    t(2 * x * F32 + n * F32 + n * head_dim as u64 * F32, 3 * x)
}

/// The fused q/k/v rows read, q written (f32) and the new keys and values (bf16), positions
/// and slots, the cos and sin of each token's position.
pub fn qkv_rope_write_bf16(
    n: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
) -> Traffic {
    let (q, kv) = ((n_heads * head_dim) as u64, (n_kv_heads * head_dim) as u64);
    let n = n as u64;
    t(
        n * (q + 2 * kv) * F32
            + n * q * F32
            + 2 * n * kv * BF16
            + 2 * n * F32
            + n * head_dim as u64 * F32,
        3 * n * (q + kv),
    )
}

/// `qkv_rope_write_bf16`'s, with the two norms' weights read and a square-add and two
/// multiplies more for each query and key element.
pub fn qkv_norm_rope_write_bf16(
    n: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
) -> Traffic {
    let rope = qkv_rope_write_bf16(n, n_heads, n_kv_heads, head_dim);
    let normed = (n * (n_heads + n_kv_heads) * head_dim) as u64;
    t(
        rope.bytes + 2 * head_dim as u64 * F32,
        rope.flops + 3 * normed,
    )
}

/// `qkv_norm_rope_write_bf16`'s into the fp8 cache (`norm`: with the norms): a byte a key
/// and value, a scale byte a head.
pub fn qkv_rope_write_fp8(
    n: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    norm: bool,
) -> Traffic {
    let bf16 = match norm {
        true => qkv_norm_rope_write_bf16(n, n_heads, n_kv_heads, head_dim),
        false => qkv_rope_write_bf16(n, n_heads, n_kv_heads, head_dim),
    };
    let kv = (n * n_kv_heads * head_dim) as u64;
    let scales = (2 * n * n_kv_heads) as u64;
    t(bf16.bytes - 2 * kv * (BF16 - 1) + scales, bf16.flops)
}

/// Keys and values read and written, the slots.
pub fn kv_write_f32(n: usize, kv_dim: usize) -> Traffic {
    let (n, kv_dim) = (n as u64, kv_dim as u64);
    t(4 * n * kv_dim * F32 + n * F32, 0)
}

/// The keys a batch at these positions attends to: the sum over tokens of position + 1.
pub fn attended(positions: &[u32]) -> usize {
    positions.iter().map(|&p| p as usize + 1).sum()
}

/// The cached keys and values each attended position holds, once per KV head (the query
/// heads of a group share them), `cache_bytes` each (4 for f32, 2 for bf16); the queries and
/// the output. `attended`: the sum over tokens of position + 1. Per (position, query head):
/// a dot product and a weighted add.
pub fn attention_per_head(
    attended: usize,
    n: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    cache_bytes: usize,
) -> Traffic {
    let (a, hd) = (attended as u64, head_dim as u64);
    let q = (n * n_heads * head_dim) as u64;
    t(
        2 * a * n_kv_heads as u64 * hd * cache_bytes as u64 + 2 * q * F32,
        4 * a * n_heads as u64 * hd,
    )
}

/// `attention_f32`'s traffic: `attention_per_head` over an f32 cache.
pub fn attention_f32(
    attended: usize,
    n: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
) -> Traffic {
    attention_per_head(attended, n, n_heads, n_kv_heads, head_dim, 4)
}

/// The prompt attention on tensor cores, for a batch of one sequence at `positions`: each
/// block of 64 (token, query head) rows of a KV group reads that head's keys and values up
/// to its last token's position, once for all its rows; the queries and the output once.
/// The arithmetic counted is the causal part, as for `attention_f32` (the masked half of
/// the diagonal tiles is computed and thrown away).
pub fn attention_mma_bf16(
    positions: &[u32],
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
) -> Traffic {
    attention_mma(positions, n_heads, n_kv_heads, head_dim, BF16)
}

/// `attention_mma_bf16`'s over the fp8 cache: a byte a value (its scales, a byte a head
/// row, left out).
pub fn attention_mma_fp8(
    positions: &[u32],
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
) -> Traffic {
    attention_mma(positions, n_heads, n_kv_heads, head_dim, 1)
}

/// The prompt attention's traffic over a cache of `cache_bytes` a value.
fn attention_mma(
    positions: &[u32],
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    cache_bytes: u64,
) -> Traffic {
    let (n, group) = (positions.len(), n_heads / n_kv_heads);
    let rows_per_block = crate::tiles::ATTN_MMA_ROWS;
    let keys_read: u64 = (0..(n * group).div_ceil(rows_per_block))
        .map(|b| {
            let first = b * rows_per_block / group;
            let last = ((b + 1) * rows_per_block - 1).min(n * group - 1) / group;
            positions[first..=last]
                .iter()
                .max()
                .map_or(0, |&p| p as u64 + 1)
        })
        .sum();
    let attended: u64 = positions.iter().map(|&p| p as u64 + 1).sum();
    let (hd, q) = (head_dim as u64, (n * n_heads * head_dim) as u64);
    t(
        2 * keys_read * n_kv_heads as u64 * hd * cache_bytes + 2 * q * F32,
        4 * attended * n_heads as u64 * hd,
    )
}

/// As `attention_per_head` over a bf16 cache, with the partial results written instead of
/// the output.
pub fn attention_split_bf16(
    attended: usize,
    n: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    n_splits: usize,
) -> Traffic {
    let heads = (n_heads, n_kv_heads, head_dim);
    attention_split(attended, n, heads, n_splits, 2)
}

/// `attention_split_bf16`'s over the fp8 cache (scales left out).
pub fn attention_split_fp8(
    attended: usize,
    n: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    n_splits: usize,
) -> Traffic {
    let heads = (n_heads, n_kv_heads, head_dim);
    attention_split(attended, n, heads, n_splits, 1)
}

/// The split attention's traffic over a cache of `cache_bytes` a value.
fn attention_split(
    attended: usize,
    n: usize,
    (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
    n_splits: usize,
    cache_bytes: usize,
) -> Traffic {
    let whole = attention_per_head(attended, n, n_heads, n_kv_heads, head_dim, cache_bytes);
    let q = (n * n_heads * head_dim) as u64;
    let partials = (n * n_heads * n_splits * (head_dim + 2)) as u64;
    t(whole.bytes - q * F32 + partials * F32, whole.flops)
}

/// The partial results read, the output written.
pub fn attention_combine_f32(
    n: usize,
    n_heads: usize,
    head_dim: usize,
    n_splits: usize,
) -> Traffic {
    let partials = (n * n_heads * n_splits * (head_dim + 2)) as u64;
    let out = (n * n_heads * head_dim) as u64;
    t(
        (partials + out) * F32,
        2 * (n * n_heads * n_splits * head_dim) as u64,
    )
}

/// Sampling: every row's logits read once (the top-k and top-p searches read them again
/// from cache, not counted), the ids written.
pub fn sample_f32(rows: usize, vocab: usize) -> Traffic {
    t((rows * vocab) as u64 * F32 + rows as u64 * 4, 0)
}

/// The penalties: each entry read (3 words) and its logit read and written.
pub fn penalize_f32(entries: usize) -> Traffic {
    t(entries as u64 * (3 * 4 + 2 * F32), 0)
}

/// The grammar masks: each mask's words read, and (at most) its row of logits written.
pub fn mask_logits_f32(n: usize, vocab: usize) -> Traffic {
    t(
        (n * vocab.div_ceil(32)) as u64 * 4 + (n * vocab) as u64 * F32,
        0,
    )
}

/// The CPU's f32 linear layer: the f32 matrix once, the `n x n_in` input, the output.
pub fn matmul_f32(n: usize, n_in: usize, n_out: usize, bias: bool) -> Traffic {
    let (n, n_in, n_out) = (n as u64, n_in as u64, n_out as u64);
    t(
        n_out * n_in * F32 + n * (n_in + n_out) * F32 + bias as u64 * n_out * F32,
        2 * n * n_in * n_out,
    )
}

/// The CPU's embedding: `n` f32 rows read and written, the ids.
pub fn embedding_f32(n: usize, dim: usize) -> Traffic {
    let (n, dim) = (n as u64, dim as u64);
    t(2 * n * dim * F32 + n * F32, 0)
}

/// `m` rows of `dim` read and written, their indices read.
pub fn gather_rows_f32(m: usize, dim: usize) -> Traffic {
    let (m, dim) = (m as u64, dim as u64);
    t(2 * m * dim * F32 + m * F32, 0)
}

/// `m` rows read, `m` rows of the sum read and written, their indices and weights read.
pub fn scatter_add_rows_f32(m: usize, dim: usize) -> Traffic {
    let (m, dim) = (m as u64, dim as u64);
    t(3 * m * dim * F32 + 2 * m * F32, 2 * m * dim)
}

/// The logits read; each token's choices, their weights and pairs written; each expert's
/// walk over the choices twice (L1 and L2, counted once).
pub fn route_experts_f32(n: usize, experts: usize, k: usize) -> Traffic {
    let (n, experts, k) = (n as u64, experts as u64, k as u64);
    t(n * experts * F32 + 5 * n * k * F32 + 2 * experts * F32, 0)
}

/// Each token's row read and written, its `k` experts' rows, pairs and weights read.
pub fn combine_experts_f32(n: usize, dim: usize, k: usize) -> Traffic {
    let (n, dim, k) = (n as u64, dim as u64, k as u64);
    t((2 + k) * n * dim * F32 + 2 * n * k * F32, 2 * n * k * dim)
}

/// Two inputs read, one output written.
pub fn swiglu_f32(n: usize) -> Traffic {
    t(3 * n as u64 * F32, 6 * n as u64)
}

/// `x` read and written.
pub fn scale_f32(n: usize) -> Traffic {
    t(2 * n as u64 * F32, n as u64)
}

/// `x` read and written, `delta` read.
pub fn residual_add_f32(n: usize) -> Traffic {
    t(3 * n as u64 * F32, n as u64)
}

/// The logits read (the id written is negligible).
pub fn argmax_f32(n: usize) -> Traffic {
    t(n as u64 * F32, 0)
}

/// `n` bf16 written.
pub fn fill_random_bf16(n: usize) -> Traffic {
    t(n as u64 * BF16, 0)
}

/// The data read, one word per block written.
pub fn read_probe_u32(words: usize, blocks: usize) -> Traffic {
    t((words + blocks) as u64 * F32, 0)
}

/// The lesson's row sums (`sum_step1_warp_f32`, `sum_step2_block_f32`): the matrix read, one
/// float per row written; an add per element.
pub fn sum_f32(rows: usize, cols: usize) -> Traffic {
    let (rows, cols) = (rows as u64, cols as u64);
    t((rows * cols + rows) * F32, rows * cols)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Hand counts for small shapes.

    #[test]
    fn gemv_counts() {
        // 3 x 8 bf16 = 48 bytes; x 8 f32 = 32; out 3 f32 = 12; 2 * 3 * 8 = 48 FLOPs.
        assert_eq!(gemv_bf16(8, 3, false, false), t(48 + 32 + 12, 48));
        // accumulating reads out too (+12); a bias reads 3 f32 (+12).
        assert_eq!(gemv_bf16(8, 3, true, true), t(48 + 32 + 24 + 12, 48));
        // SwiGLU: two matrices.
        assert_eq!(gemv_swiglu_bf16(8, 3), t(96 + 32 + 12, 96));
    }

    #[test]
    fn gemm_counts() {
        // 2 tokens, 4 -> 3: matrix 12 bf16 = 24; x 8 f32 = 32; out 6 f32 = 24; 2*2*4*3 = 48.
        assert_eq!(gemm_bf16(2, 4, 3, false), t(24 + 32 + 24, 48));
        // The same with x in bf16 (8 values = 16 bytes) and a bias of 3 f32 = 12 bytes.
        assert_eq!(gemm_mma_bf16(2, 4, 3, true), t(24 + 16 + 24 + 12, 48));
        assert_eq!(gemm_wgmma_bf16(2, 4, 3, true), t(24 + 16 + 24 + 12, 48));
        // The split GEMM's zeroed output: 6 floats written, no arithmetic.
        assert_eq!(zero_f32(6), t(24, 0));
    }

    #[test]
    fn prompt_attention_counts() {
        // 3 tokens at positions 5, 6, 7; 4 query heads on 2 KV heads (groups of 2), head 16:
        // 6 rows per KV head, one block, which reads keys 0..=7 of its KV head: 8 keys x 16
        // bf16 x 2 bytes x (k, v) x 2 KV heads = 1024. q and out: 3 x 4 x 16 floats each
        // = 768 bytes. Arithmetic: (6 + 7 + 8) positions x 4 heads x 4 x 16 = 5376.
        assert_eq!(
            attention_mma_bf16(&[5, 6, 7], 4, 2, 16),
            t(1024 + 2 * 768, 5376)
        );
        // 40 tokens, one head per KV head: blocks of 64 rows hold all 40; with 16 query
        // heads per KV head, 4 tokens a block, each block reading up to its own last token.
        let positions: Vec<u32> = (0..40).collect();
        let one = attention_mma_bf16(&positions, 1, 1, 16).bytes;
        assert_eq!(one, 2 * 40 * 16 * 2 + 2 * 40 * 16 * 4);
        let grouped = attention_mma_bf16(&positions, 16, 1, 16).bytes;
        let keys: u64 = (0..10).map(|b| 4 * b + 4).sum();
        assert_eq!(grouped, 2 * keys * 16 * 2 + 2 * 40 * 16 * 16 * 4);
        // One warp, one round: 16 steps of 4096 FLOP; 32 floats written.
        assert_eq!(mma_probe_bf16(32, 1), t(128, 16 * 4096));
        // 10 values: 40 bytes read, 20 written.
        assert_eq!(f32_to_bf16(10), t(60, 0));
    }

    #[test]
    fn norm_rope_and_cache_counts() {
        // 2 rows of 4: read 32 + write 32 bytes, weight 16; 4 FLOPs per element.
        assert_eq!(rmsnorm_f32(2, 4), t(80, 32));
        // 1 token, 2 heads of 4: x 8 floats in and out (64), 1 position (4), 4 cos/sin (16).
        assert_eq!(rope_f32(1, 2, 4), t(64 + 4 + 16, 24));
        // 1 token, q 2 x 4, kv 1 x 4: row of 16 floats read (64), q written (32), k and v
        // written in bf16 (16), position and slot (8), cos and sin (16); RoPE on 12 values.
        assert_eq!(
            qkv_rope_write_bf16(1, 2, 1, 4),
            t(64 + 32 + 16 + 8 + 16, 36)
        );
        assert_eq!(kv_write_f32(2, 4), t(128 + 8, 0));
        assert_eq!(embedding_bf16(2, 4), t(2 * 4 * 6 + 8, 0));
    }

    #[test]
    fn attention_counts() {
        // One token at position 9 (10 keys), 4 query heads over 2 KV heads of 8:
        // keys and values 10 x 2 x 8 x 2 floats = 1280 bytes; q and out 32 floats each = 256;
        // 4 FLOPs per key, head and dimension = 4 x 10 x 4 x 8 = 1280.
        assert_eq!(attention_f32(10, 1, 4, 2, 8), t(1280 + 256, 1280));
        // A bf16 cache: half the keys' and values' bytes.
        assert_eq!(attention_per_head(10, 1, 4, 2, 8, 2), t(640 + 256, 1280));
        // Split in 2 over bf16: out replaced by 4 heads x 2 splits x (8 + 2) partial floats
        // = 320 bytes.
        assert_eq!(
            attention_split_bf16(10, 1, 4, 2, 8, 2),
            t(640 + 128 + 320, 1280)
        );
        assert_eq!(attention_combine_f32(1, 4, 8, 2), t(320 + 128, 128));
    }

    #[test]
    fn cpu_counts() {
        // 2 tokens, 4 -> 3 in f32: matrix 48 bytes, x 32, out 24; 48 FLOPs.
        assert_eq!(matmul_f32(2, 4, 3, false), t(48 + 32 + 24, 48));
        assert_eq!(embedding_f32(2, 4), t(64 + 8, 0));
    }

    #[test]
    fn elementwise_counts() {
        assert_eq!(swiglu_f32(10), t(120, 60));
        assert_eq!(residual_add_f32(10), t(120, 10));
        assert_eq!(argmax_f32(10), t(40, 0));
        assert_eq!(fill_random_bf16(10), t(20, 0));
        assert_eq!(read_probe_u32(16, 2), t(72, 0));
        // 2 rows of 5: 10 floats read, 2 written; 10 adds.
        assert_eq!(sum_f32(2, 5), t(48, 10));
    }
}
