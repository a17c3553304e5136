//! Attention in the forward pass: which kernels a pass attends with (a prompt's tensor
//! cores, flash-decoding's splits, or a block per token and head), the splits' scratch, and
//! one layer's attention.

use cudarc::driver::CudaSlice;

use super::context::Gpu;
use super::kernels::attention::{KvScales, PagedIn};
use super::kernels::attention_mma::attention_mma_supports;
use super::kernels::attention_split_mma::attention_split_mma_supports;
use super::kernels::{In, Out};
use super::matmul::{Held, MatmulScratch};
use super::plan::Form;
use crate::batch::Batch;
use crate::config::Config;
use crate::error::Result;
use crate::kernel_args::Splits;
use crate::tiles::SPLIT_MAX_HEAD_DIM;

/// Positions per flash-decoding split, at the least: a pass with few (token, KV head) pairs
/// needs many splits to fill the GPU (docs/lessons.md#attention).
pub const SPLIT_LEN: usize = 32;
/// Longest split a pass takes (`splits_needed`).
const MAX_SPLIT_LEN: usize = 1024;
/// Split warps a pass keeps per SM before its splits grow longer: a warp is a block of
/// `attention_split_mma_bf16`, and past a few waves of them more splits only add partial
/// results for the combine to write and read (measured: docs/lessons.md#attention).
pub const SPLIT_WARPS_PER_SM: usize = 16;
/// Decode steps of up to this many sequences replay CUDA graphs (one per power of two);
/// the splits' scratch holds such a step at the model's full context.
pub const GRAPH_MAX_BATCH: usize = 128;
/// Fewest (token, head, split) rows of the flash-decoding scratch; a batch that needs more
/// than the scratch holds (a long prompt) takes the prompt attention instead
/// (`Attention::of`).
const MIN_PARTIAL_ROWS: usize = 1 << 16;
/// Most rows of the flash-decoding scratch: 1M rows of a 128-wide head are 520 MB.
const MAX_PARTIAL_ROWS: usize = 1 << 20;
/// A prompt chunk of one sequence with at least this many tokens takes the tensor-core
/// attention (`Attention::of`): its 64-row tiles are mostly full, and each key tile is read
/// once for all of them.
const MIN_TENSOR_CORE_ROWS: usize = 64;
/// Most splits the combine kernel's shared memory holds (one float each, under 48 KiB).
const MAX_SPLITS: usize = 8192;

/// A layer's paged attention input over the pool's cache, bf16 or fp8 with its scales.
pub enum PagedKv<'a> {
    Bf16(PagedIn<'a, u16>),
    Fp8(PagedIn<'a, u8>, KvScales<'a>),
}

impl<'a> PagedKv<'a> {
    fn positions(&self) -> &In<'a, u32> {
        match self {
            PagedKv::Bf16(p) => &p.positions,
            PagedKv::Fp8(p, _) => &p.positions,
        }
    }

    fn shape(&self) -> crate::kernel_args::PagedShape {
        match self {
            PagedKv::Bf16(p) => p.shape,
            PagedKv::Fp8(p, _) => p.shape,
        }
    }
}

/// Which kernels a pass attends with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attention {
    /// `attention_split_mma_bf16` (or `attention_split_bf16` for heads it does not take) +
    /// `attention_combine_f32`, with these splits.
    Split(SplitPlan),
    /// `attention_mma_bf16`: one sequence's prompt chunk, a head of 64 or 128.
    TensorCores,
    /// `attention_bf16`: one block per token and head.
    PerHead,
}

impl Attention {
    /// The kernels for `batch`: the tensor cores for a long enough chunk of one prompt,
    /// else the splits while their scratch holds them (`splits`, from `splits_needed`),
    /// else a block per token and head.
    pub fn of(c: &Config, batch: &Batch, splits: Option<SplitPlan>) -> Attention {
        let one_sequence = batch.token_seq.windows(2).all(|w| w[0] == w[1]);
        let prompt = one_sequence && batch.tokens.len() >= MIN_TENSOR_CORE_ROWS;
        match splits {
            _ if prompt && attention_mma_supports(c.head_dim) => Attention::TensorCores,
            Some(n) => Attention::Split(n),
            None => Attention::PerHead,
        }
    }
}

/// Flash-decoding's splits for one pass: `count` of them (covering the longest position),
/// `len` positions each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SplitPlan {
    pub count: usize,
    pub len: usize,
}

/// Flash-decoding's splits for this batch on a GPU of `sm_count` SMs, or `None` when the
/// scratch (of `partial_rows`) cannot hold every (token, head, split) (a long prompt): then
/// the prompt attention walks the whole context (`Attention::of`). Splits are `SPLIT_LEN`
/// positions long while the pass has few (token, KV head) pairs, and twice as long for each
/// doubling that still leaves `SPLIT_WARPS_PER_SM` warps an SM of non-empty splits; only
/// `attention_split_mma_bf16` takes them longer than `SPLIT_LEN` (the per-lane kernel
/// stages a whole split in shared memory). Heads wider than the per-lane kernel takes
/// (Gemma 3's 256) have splits where the tensor-core kernel takes their groups, else none:
/// a block per token and head.
pub fn splits_needed(
    c: &Config,
    batch: &Batch,
    partial_rows: usize,
    sm_count: usize,
) -> Option<SplitPlan> {
    let mma = |len: usize| attention_split_mma_supports(c.head_dim, c.n_heads, c.n_kv_heads, len);
    if c.head_dim > SPLIT_MAX_HEAD_DIM && !mma(SPLIT_LEN) {
        return None;
    }
    let longest = batch.positions.iter().max().map_or(1, |&p| p as usize + 1);
    let warps = |len: usize| -> usize {
        let per_head: usize = batch
            .positions
            .iter()
            .map(|&p| (p as usize + 1).div_ceil(len))
            .sum();
        per_head * c.n_kv_heads
    };
    let mut len = SPLIT_LEN;
    if mma(MAX_SPLIT_LEN) {
        while len < MAX_SPLIT_LEN && warps(2 * len) >= SPLIT_WARPS_PER_SM * sm_count {
            len *= 2;
        }
    }
    let count = longest.div_ceil(len);
    let bucket = count.next_power_of_two();
    let rows = batch.tokens.len().next_power_of_two();
    (rows * c.n_heads * bucket <= partial_rows && bucket <= MAX_SPLITS)
        .then_some(SplitPlan { count, len })
}

/// Flash-decoding's partial results, sized once for the model.
pub struct SplitScratch {
    /// `[rows, head_dim]` each split's unnormalised output
    partial_o: CudaSlice<f32>,
    /// `[rows, 2]` its (max, sum)
    partial_ml: CudaSlice<f32>,
    /// (token, head, split) rows it holds: enough for a decode step of `GRAPH_MAX_BATCH`
    /// sequences at the model's full context (splits rounded up to a power of two, as the
    /// graphs have them), within `MIN_PARTIAL_ROWS..=MAX_PARTIAL_ROWS`.
    pub rows: usize,
}

impl SplitScratch {
    pub fn new(gpu: &Gpu, c: &Config) -> Result<SplitScratch> {
        let splits = c.max_seq_len.div_ceil(SPLIT_LEN).next_power_of_two();
        let rows = (GRAPH_MAX_BATCH * c.n_heads * splits).clamp(MIN_PARTIAL_ROWS, MAX_PARTIAL_ROWS);
        Ok(SplitScratch {
            partial_o: gpu.zeros(rows * c.head_dim, "attention scratch")?,
            partial_ml: gpu.zeros(rows * 2, "attention scratch")?,
            rows,
        })
    }

    /// `att = softmax(q K^T / sqrt(head_dim)) V` over each token's own sequence, with the
    /// kernels `attention` names. The splits' combine also writes `att` in the form `copy`
    /// (`steps::copy_for`) where one launch can: rounded to bf16 for o_proj's tensor cores,
    /// or as its integer GEMV's codes. The returned `Held` says what it made.
    pub fn attend(
        &mut self,
        g: &Gpu,
        mm: &mut MatmulScratch,
        att: &mut Out<f32>,
        p: &PagedKv,
        attention: Attention,
        copy: Option<Form>,
    ) -> Result<Held> {
        let heads = p.shape().heads;
        let (nh, nkv, head_dim) = heads.sizes();
        let n = p.positions().len();
        // SAFETY (the three attention launches): the batch was built from the block
        // manager's tables, which cover every position up to each token's own; this layer's
        // keys and values were written just before (`qkv_rope_write_bf16`); the split count
        // covers the longest position (`splits_needed`); the tensor-core kernel is chosen
        // for one sequence's chunk only (`Attention::of`, the graphs' padding rows never take
        // it).
        let plan = match attention {
            Attention::Split(plan) => plan,
            Attention::TensorCores => {
                match p {
                    PagedKv::Bf16(p) => unsafe { g.attention_mma_bf16(att, p) },
                    PagedKv::Fp8(p, scales) => unsafe { g.attention_mma_fp8(att, p, scales) },
                }?;
                return Ok(Held::ROWS);
            }
            Attention::PerHead => {
                match p {
                    PagedKv::Bf16(p) => unsafe { g.attention_bf16(att, p) },
                    PagedKv::Fp8(p, scales) => unsafe { g.attention_fp8(att, p, scales) },
                }?;
                return Ok(Held::ROWS);
            }
        };
        let rows = n * nh * plan.count;
        let (partial_o, partial_ml) = (
            &mut self.partial_o.slice_mut(..rows * head_dim),
            &mut self.partial_ml.slice_mut(..rows * 2),
        );
        // The query heads of a KV head as the rows of one `mma` where it takes the model's
        // heads; the per-lane kernel otherwise (the fp8 cache refuses such models at load:
        // `KvDtype::check`).
        let mma = attention_split_mma_supports(head_dim, nh, nkv, plan.len);
        match p {
            PagedKv::Bf16(p) if mma => unsafe {
                g.attention_split_mma_bf16(partial_o, partial_ml, p, plan.len)
            },
            PagedKv::Bf16(p) => unsafe {
                g.attention_split_bf16(partial_o, partial_ml, p, plan.len)
            },
            PagedKv::Fp8(p, scales) => unsafe {
                g.attention_split_mma_fp8(partial_o, partial_ml, p, scales, plan.len)
            },
        }?;
        let (po, ml) = (&partial_o.as_view(), &partial_ml.as_view());
        let (positions, len) = (p.positions(), n * heads.q_dim());
        let splits = Splits::new(plan.count, plan.len, head_dim);
        match copy {
            Some(Form::Bf16) => {
                let out_bf16 = &mut mm.x_bf16.slice_mut(..len);
                g.attention_combine_f32_bf16(att, out_bf16, po, ml, positions, splits)?;
                Ok(Held::rows_and(Form::Bf16))
            }
            // A group of 32 codes must not cross a head.
            Some(Form::Codes) if head_dim.is_multiple_of(32) => {
                let codes = (
                    &mut mm.codes.slice_mut(..len),
                    &mut mm.code_scales.slice_mut(..len / 16),
                );
                g.attention_combine_q8_f32(att, codes, po, ml, positions, splits)?;
                Ok(Held::rows_and(Form::Codes))
            }
            _ => {
                g.attention_combine_f32(att, po, ml, positions, splits)?;
                Ok(Held::ROWS)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `count` tokens of sequence `seq` from position `first`.
    fn batch(first: u32, count: u32, seqs: &[u32]) -> Batch {
        let n = (count as usize) * seqs.len();
        Batch {
            tokens: vec![1; n],
            positions: seqs.iter().flat_map(|_| first..first + count).collect(),
            token_seq: seqs.iter().flat_map(|&s| vec![s; count as usize]).collect(),
            slots: vec![0; n],
            block_tables: vec![0; seqs.len() * 128],
            max_blocks: 128,
            logit_rows: vec![n as u32 - 1],
            guesses: false,
        }
    }

    fn kind(a: Attention) -> &'static str {
        match a {
            Attention::Split(_) => "split",
            Attention::TensorCores => "tensor cores",
            Attention::PerHead => "per head",
        }
    }

    /// Which attention kernels `tests/gpu.rs`'s synthetic Llama 3 (8 heads of 128) takes:
    /// the GPU tests rely on its prompts reaching the tensor-core one and its decode steps
    /// the split kernels.
    #[test]
    fn prompts_take_the_tensor_cores_and_decode_the_splits() {
        let mut c = crate::shapes::shape_config("llama3-8b").unwrap();
        c.n_heads = 8;
        c.n_kv_heads = 2;
        let of = |c: &Config, b: &Batch| {
            kind(Attention::of(
                c,
                b,
                splits_needed(c, b, MIN_PARTIAL_ROWS, 132),
            ))
        };
        // One decode token deep in the context; 33 sequences' decode tokens.
        assert_eq!(of(&c, &batch(1299, 1, &[0])), "split");
        let seqs: Vec<u32> = (0..33).collect();
        assert_eq!(of(&c, &batch(200, 1, &seqs)), "split");
        // A 256-token chunk of one prompt, at its start and deep into it.
        assert_eq!(of(&c, &batch(0, 256, &[0])), "tensor cores");
        assert_eq!(of(&c, &batch(1024, 256, &[0])), "tensor cores");
        // A short chunk of one prompt: the split kernels.
        assert_eq!(of(&c, &batch(40, 5, &[0])), "split");
        // Chunks of two sequences: the split kernels while their scratch holds them (deep
        // in the context, with splits grown long), else the per-head kernel (heads only the
        // per-lane split kernel takes, whose splits stay short).
        assert_eq!(of(&c, &batch(0, 128, &[0, 1])), "split");
        assert_eq!(of(&c, &batch(1024, 128, &[0, 1])), "split");
        // Gemma 3's heads of 256: the tensor-core split kernel's, not the prompt kernel's.
        c.head_dim = 256;
        assert_eq!(of(&c, &batch(1299, 1, &[0])), "split");
        assert_eq!(of(&c, &batch(0, 256, &[0])), "split");
        // Heads the tensor-core kernel does not take.
        c.head_dim = 96;
        assert_eq!(of(&c, &batch(1024, 256, &[0])), "per head");
        assert_eq!(of(&c, &batch(1024, 128, &[0, 1])), "per head");
    }

    /// Llama 3 8B's heads (8 KV heads of 128) on 132 SMs: a batch-1 or 8-sequence decode
    /// keeps splits of 32 positions; 64 and 256 sequences at 576 positions, and a mixed
    /// step's prompt chunk, take longer ones while 16 warps an SM remain; heads only the
    /// per-lane kernel takes stay at 32.
    #[test]
    fn splits_grow_longer_only_when_the_gpu_stays_full() {
        let mut c = crate::shapes::shape_config("llama3-8b").unwrap();
        let plan = |c: &Config, b: &Batch| splits_needed(c, b, MAX_PARTIAL_ROWS, 132).unwrap();
        let decode = |n: u32, pos: u32| batch(pos, 1, &(0..n).collect::<Vec<_>>());
        assert_eq!(
            plan(&c, &decode(1, 8191)),
            SplitPlan {
                count: 256,
                len: 32
            }
        );
        assert_eq!(plan(&c, &decode(8, 575)), SplitPlan { count: 18, len: 32 });
        // 64 x 8 x ceil(576 / len) warps: 2,560 at 128 (>= 16 x 132 = 2,112), 1,536 at 256.
        assert_eq!(plan(&c, &decode(64, 575)), SplitPlan { count: 5, len: 128 });
        // 256 x 8 x ceil(576 / 512) = 4,096; at 1024, 2,048.
        assert_eq!(
            plan(&c, &decode(256, 575)),
            SplitPlan { count: 2, len: 512 }
        );
        // Every split still covers the longest position.
        let p = plan(&c, &decode(200, 1999));
        assert!(p.count * p.len >= 2000 && p.len <= MAX_SPLIT_LEN, "{p:?}");
        // A prompt chunk of 300 tokens from 700 with 100 decode tokens.
        let mut mixed = batch(700, 300, &[0]);
        mixed.positions.extend(std::iter::repeat_n(400, 100));
        mixed.token_seq.extend(1..=100);
        mixed.tokens.extend([1; 100]);
        assert!(plan(&c, &mixed).len > SPLIT_LEN);
        c.head_dim = 96;
        assert_eq!(plan(&c, &decode(256, 575)).len, SPLIT_LEN);
    }
}
