//! The model on the GPU: bf16 weights (f32 norms and biases), a bf16 paged KV cache,
//! activations for `max_tokens` tokens allocated once, and the forward pass, step for step
//! the CPU's, with the decode step's fusions: q, k and v in one matmul followed by one
//! RoPE-and-cache-write kernel; the residual adds folded into the output matmuls; gate, up and
//! SwiGLU in one kernel; attention split over the context (flash-decoding); greedy decoding's
//! argmax on the device. A prompt's matmuls and (for one sequence) its attention run on
//! tensor cores.

use std::collections::HashMap;

use cudarc::driver::{CudaGraph, CudaSlice};

use super::context::{Gpu, capture_graph};
use super::kernels::attention_mma::attention_mma_supports;
use super::kernels::attention_split_mma::attention_split_mma_supports;
use super::kernels::gemm_blocks::blocks_mma_splits;
use super::kernels::gemm_skinny::{SKINNY_MAX_TOKENS, skinny_splits};
use super::kernels::gemm_wgmma::Fp8Operands;
use super::kernels::{In, Out};
use super::matrix::{
    BlockPart, GpuMatrix, Piece, Synthetic, Uploader, WeightFormat, random_matrix,
};
use super::tiles::{
    BLOCK_SIZE, BLOCKS_MMA_MAX_TOKENS, BLOCKS_MMA_STAGE_K, MAX_HEAD_DIM, QUANT_MAX_TOKENS,
};
use crate::batch::Batch;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::kv::block_manager::blocks_for;
use crate::model::ModelWeights;
use crate::rope::RopeTables;
use crate::weights::blocks::BlockType;

/// Most sequences one forward pass may mix (the block-table buffer is sized for them).
pub const MAX_SEQS: usize = 256;
/// Decode steps of up to this many sequences replay CUDA graphs (one per power of two).
pub const GRAPH_MAX_BATCH: usize = 128;
/// A captured decode step: rows (a power of two), attention splits, ends in the argmax.
type GraphKey = (usize, usize, bool);
/// Positions per flash-decoding split.
pub const SPLIT_LEN: usize = 32;
/// Fewest (token, head, split) rows of the flash-decoding scratch; a batch that needs more
/// than the scratch holds (a long prompt) takes the prompt attention instead
/// (`Attention::of`).
const MIN_PARTIAL_ROWS: usize = 1 << 16;
/// Most rows of the flash-decoding scratch: 1M rows of a 128-wide head are 520 MB.
const MAX_PARTIAL_ROWS: usize = 1 << 20;

/// Rows of flash-decoding scratch for this model: enough for a decode step of
/// `GRAPH_MAX_BATCH` sequences at the model's full context (splits rounded up to a power of
/// two, as the graphs have them), within `MIN_PARTIAL_ROWS..=MAX_PARTIAL_ROWS`.
fn partial_rows_for(c: &Config) -> usize {
    let splits = c.max_seq_len.div_ceil(SPLIT_LEN).next_power_of_two();
    (GRAPH_MAX_BATCH * c.n_heads * splits).clamp(MIN_PARTIAL_ROWS, MAX_PARTIAL_ROWS)
}
/// A prompt chunk of one sequence with at least this many tokens takes the tensor-core
/// attention (`Attention::of`): its 64-row tiles are mostly full, and each key tile is read
/// once for all of them.
const MIN_TENSOR_CORE_ROWS: usize = 64;
/// Where `gemm_wgmma_bf16` exists, the skinny matmul takes at most this many tokens
/// (`takes_skinny`).
const SKINNY_OVER_WGMMA_TOKENS: usize = 16;
/// Most splits the combine kernel's shared memory holds (one float each, under 48 KiB).
const MAX_SPLITS: usize = 8192;
/// Share of the free device memory the KV pool may take by default.
const KV_SHARE_OF_FREE: f64 = 0.9;

/// Whether the GPU kernels can run this model: the GEMV reads 8 weights at a time, so every
/// matrix's input width must be a multiple of 8, and a head must fit the attention kernels.
pub fn check_supported(c: &Config) -> Result<()> {
    let unsupported = |what: String| {
        Err(Error::Unsupported(format!(
            "{what}; run this model with --device cpu"
        )))
    };
    if c.head_dim > MAX_HEAD_DIM || !c.head_dim.is_multiple_of(8) {
        return unsupported(format!(
            "head_dim {} is not a multiple of 8 up to the attention kernels' {MAX_HEAD_DIM}",
            c.head_dim
        ));
    }
    if c.group_size() > 32 {
        return unsupported(format!(
            "{} query heads per KV head is over the attention kernel's 32",
            c.group_size()
        ));
    }
    for (name, width) in [
        ("hidden_size", c.dim),
        ("heads * head_dim", c.q_dim()),
        ("intermediate_size", c.ffn_dim),
    ] {
        if !width.is_multiple_of(8) {
            return unsupported(format!(
                "{name} {width} is not a multiple of 8, as the GEMV kernel needs"
            ));
        }
    }
    Ok(())
}

/// Flash-decoding's split count for this batch, or `None` when its scratch cannot hold
/// every (token, head, split) (a long prompt): then the prompt attention walks the whole
/// context (`Attention::of`).
fn splits_needed(c: &Config, batch: &Batch, partial_rows: usize) -> Option<usize> {
    let longest = batch.positions.iter().max().map_or(1, |&p| p as usize + 1);
    let n_splits = longest.div_ceil(SPLIT_LEN);
    let bucket = n_splits.next_power_of_two();
    let rows = batch.tokens.len().next_power_of_two();
    (rows * c.n_heads * bucket <= partial_rows && bucket <= MAX_SPLITS).then_some(n_splits)
}

/// Whether `batch` is a decode step: one token of each sequence, every row wanting logits.
fn is_decode_step(batch: &Batch) -> bool {
    let n = batch.tokens.len();
    batch.logit_rows.len() == n
        && batch.max_blocks > 0
        && batch.block_tables.len() / batch.max_blocks == n
        && (0..n).all(|i| batch.token_seq[i] as usize == i && batch.logit_rows[i] as usize == i)
}

/// Which kernels a pass attends with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attention {
    /// `attention_split_mma_bf16` (or `attention_split_bf16` for heads it does not take) +
    /// `attention_combine_f32`, with this many splits.
    Split(usize),
    /// `attention_mma_bf16`: one sequence's prompt chunk, a head of 64 or 128.
    TensorCores,
    /// `attention_bf16`: one block per token and head.
    PerHead,
}

impl Attention {
    fn of(c: &Config, batch: &Batch, splits: Option<usize>) -> Attention {
        let one_sequence = batch.token_seq.windows(2).all(|w| w[0] == w[1]);
        let prompt = one_sequence && batch.tokens.len() >= MIN_TENSOR_CORE_ROWS;
        match splits {
            _ if prompt && attention_mma_supports(c.head_dim) => Attention::TensorCores,
            Some(n) => Attention::Split(n),
            None => Attention::PerHead,
        }
    }
}

/// Bytes of KV cache one token holds on the GPU: every layer's key and value rows, bf16.
pub fn kv_bytes_per_token(c: &Config) -> usize {
    2 * c.n_layers * c.kv_dim() * size_of::<u16>()
}

/// bf16 bits of each value, rounded to nearest even.
pub fn to_bf16(x: &[f32]) -> Vec<u16> {
    x.iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect()
}

struct GpuLayer {
    attn_norm: CudaSlice<f32>,    // [dim]
    wqkv: GpuMatrix,              // [q_dim + 2 kv_dim, dim]: q, k, v stacked, one matmul
    bqkv: Option<CudaSlice<f32>>, // [q_dim + 2 kv_dim] (Qwen2)
    wo: GpuMatrix,                // [dim, q_dim]
    ffn_norm: CudaSlice<f32>,     // [dim]
    w_gate: GpuMatrix,            // [ffn_dim, dim]
    w_up: GpuMatrix,              // [ffn_dim, dim]
    w_down: GpuMatrix,            // [dim, ffn_dim]
}

impl GpuLayer {
    fn matrices(&self) -> [&GpuMatrix; 5] {
        [&self.wqkv, &self.wo, &self.w_gate, &self.w_up, &self.w_down]
    }
}

/// A matrix of one tensor, as `Uploader::matrix` takes it.
fn one(name: String, values: &[f32]) -> [Piece<'_>; 1] {
    [Piece {
        name,
        values,
        heads: None,
    }]
}

/// The weights on the device.
pub struct GpuWeights {
    embed: GpuMatrix, // [vocab, dim]
    layers: Vec<GpuLayer>,
    final_norm: CudaSlice<f32>, // [dim]
    lm_head: Option<GpuMatrix>, // [vocab, dim]; None: tied to `embed`
    /// Quantized tensors held in bf16 because no kernel reads their blocks: "name (type)".
    pub fallbacks: Vec<String>,
}

impl GpuWeights {
    /// Uploads a loaded model's weights, the matrices as `format` says (norms and biases
    /// in f32).
    pub fn upload(
        gpu: &Gpu,
        c: &Config,
        w: &ModelWeights,
        format: WeightFormat,
    ) -> Result<GpuWeights> {
        let f32s = |x: &[f32], what: &str| gpu.upload(x, what);
        let mut up = Uploader {
            gpu,
            format,
            stored: w.stored.as_deref(),
            fallbacks: vec![],
        };
        let (dim, q_dim, ffn) = (c.dim, c.q_dim(), c.ffn_dim);
        let mut layers = vec![];
        for (l, lw) in w.layers.iter().enumerate() {
            let what = |s: &str| format!("layer {l} {s}");
            let name = |s: &str| format!("model.layers.{l}.{s}.weight");
            let bqkv = match (&lw.bq, &lw.bk, &lw.bv) {
                (Some(q), Some(k), Some(v)) => {
                    Some(f32s(&[q.as_slice(), k, v].concat(), &what("qkv bias"))?)
                }
                _ => None,
            };
            let qkv = [
                Piece {
                    name: name("self_attn.q_proj"),
                    values: &lw.wq,
                    heads: Some((c.n_heads, c.head_dim)),
                },
                Piece {
                    name: name("self_attn.k_proj"),
                    values: &lw.wk,
                    heads: Some((c.n_kv_heads, c.head_dim)),
                },
                Piece {
                    name: name("self_attn.v_proj"),
                    values: &lw.wv,
                    heads: None,
                },
            ];
            layers.push(GpuLayer {
                attn_norm: f32s(&lw.attn_norm, &what("attn_norm"))?,
                wqkv: up.matrix(&qkv, dim, &what("qkv_proj"))?,
                bqkv,
                wo: up.matrix(
                    &one(name("self_attn.o_proj"), &lw.wo),
                    q_dim,
                    &what("o_proj"),
                )?,
                ffn_norm: f32s(&lw.ffn_norm, &what("ffn_norm"))?,
                w_gate: up.matrix(&one(name("mlp.gate_proj"), &lw.w_gate), dim, &what("gate"))?,
                w_up: up.matrix(&one(name("mlp.up_proj"), &lw.w_up), dim, &what("up_proj"))?,
                w_down: up.matrix(&one(name("mlp.down_proj"), &lw.w_down), ffn, &what("down"))?,
            });
        }
        let embed_name = "model.embed_tokens.weight".to_owned();
        let embed = up.matrix(&one(embed_name, &w.embed), dim, "the embedding")?;
        let lm_head = w
            .lm_head
            .as_deref()
            .map(|h| up.matrix(&one("lm_head.weight".into(), h), dim, "the output head"))
            .transpose()?;
        Ok(GpuWeights {
            layers,
            embed,
            lm_head,
            final_norm: f32s(&w.final_norm, "the final norm")?,
            fallbacks: up.fallbacks,
        })
    }

    /// Random weights of `c`'s shape made on the device (for benchmarks: no download):
    /// matrices about ±1/sqrt(fan_in) in `kind`'s types, norms 1, biases 0. bf16 matrices
    /// are filled on the device, block types on the host.
    pub fn synthetic(gpu: &Gpu, c: &Config, seed: u32, kind: Synthetic) -> Result<GpuWeights> {
        let mut next_seed = seed;
        let mut matrix = |ty: Option<BlockType>,
                          rows: usize,
                          cols: usize,
                          what: &str|
         -> Result<GpuMatrix> {
            next_seed = next_seed.wrapping_add(1);
            let Some(ty) = ty else {
                let mut m = gpu.zeros::<u16>(rows * cols, what)?;
                gpu.fill_random_bf16(&mut m.as_view_mut(), next_seed, 1.0 / (cols as f32).sqrt())?;
                return Ok(GpuMatrix::Bf16(m));
            };
            random_matrix(gpu, ty, rows, cols, next_seed, what)
        };
        let (dim, q, kv, ffn) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let ones = vec![1.0f32; dim];
        let mut layers = vec![];
        for l in 0..c.n_layers {
            let what = format!("layer {l}");
            let (ty, wider) = (kind.ty(), kind.wider(l, c.n_layers));
            let wqkv = if wider == ty {
                matrix(ty, q + 2 * kv, dim, &what)?
            } else {
                // q and k in the common type, v in the wider one: two runs of rows.
                let mut parts = vec![];
                for (t, rows) in [(ty, q + kv), (wider, kv)] {
                    let GpuMatrix::Blocks(p) = matrix(t, rows, dim, &what)? else {
                        unreachable!("mixed types are all blocks")
                    };
                    parts.extend(p);
                }
                GpuMatrix::Blocks(parts)
            };
            layers.push(GpuLayer {
                attn_norm: gpu.upload(&ones, &what)?,
                wqkv,
                bqkv: if c.qkv_bias {
                    Some(gpu.zeros(q + 2 * kv, &what)?)
                } else {
                    None
                },
                wo: matrix(ty, dim, q, &what)?,
                ffn_norm: gpu.upload(&ones, &what)?,
                w_gate: matrix(ty, ffn, dim, &what)?,
                w_up: matrix(ty, ffn, dim, &what)?,
                w_down: matrix(wider, dim, ffn, &what)?,
            });
        }
        Ok(GpuWeights {
            embed: matrix(kind.ty(), c.vocab_size, dim, "the embedding")?,
            lm_head: if c.tie_embeddings {
                None
            } else {
                Some(matrix(kind.head(), c.vocab_size, dim, "the output head")?)
            },
            final_norm: gpu.upload(&ones, "the final norm")?,
            layers,
            fallbacks: vec![],
        })
    }

    /// Bytes one decode step must read from the weights: every matrix and norm once, the
    /// embedding only for its one row (unless it doubles as the head).
    pub fn bytes_per_token(&self, c: &Config) -> usize {
        let layer: usize = self
            .layers
            .iter()
            .map(|l| {
                l.matrices().iter().map(|m| m.bytes()).sum::<usize>()
                    + 4 * (l.attn_norm.len()
                        + l.ffn_norm.len()
                        + l.bqkv.as_ref().map_or(0, |b| b.len()))
            })
            .sum();
        let head = self.lm_head.as_ref().unwrap_or(&self.embed).bytes();
        let embed_row = match &self.lm_head {
            Some(_) => self.embed.bytes() / c.vocab_size,
            None => 0,
        };
        layer + head + embed_row + 4 * c.dim
    }

    /// Bytes of every matrix and vector on the device.
    pub fn bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.matrices().iter().map(|m| m.bytes()).sum::<usize>()
                    + 4 * (l.attn_norm.len()
                        + l.ffn_norm.len()
                        + l.bqkv.as_ref().map_or(0, |b| b.len()))
            })
            .sum();
        layers
            + self.embed.bytes()
            + self.lm_head.as_ref().map_or(0, |h| h.bytes())
            + 4 * self.final_norm.len()
    }

    /// What the device holds, by type: "q4_k 4.17 GB, q6_k 0.81 GB, f32 0.3 MB".
    pub fn summary(&self) -> String {
        let mut by: Vec<(String, usize)> = vec![];
        let mut add = |name: String, bytes: usize| match by.iter_mut().find(|b| b.0 == name) {
            Some(b) => b.1 += bytes,
            None => by.push((name, bytes)),
        };
        let matrices = self
            .layers
            .iter()
            .flat_map(|l| l.matrices())
            .chain([&self.embed])
            .chain(self.lm_head.as_ref());
        for m in matrices {
            match m {
                GpuMatrix::Bf16(w) => add("bf16".into(), 2 * w.len()),
                GpuMatrix::Blocks(parts) => {
                    for p in parts {
                        let scales = 4 * p.scales.as_ref().map_or(0, |s| s.len());
                        add(p.ty.to_string(), p.bytes.len() + scales);
                    }
                }
            }
        }
        by.sort_by_key(|b| std::cmp::Reverse(b.1));
        let parts: Vec<String> = by
            .iter()
            .map(|(n, b)| format!("{n} {}", crate::loader::bytes_text(*b)))
            .collect();
        parts.join(", ")
    }

    /// Whether some layer matrix is fp8 (`--weights fp8`).
    fn has_fp8(&self) -> bool {
        self.layers
            .iter()
            .flat_map(|l| l.matrices())
            .any(|m| m.as_fp8().is_some())
    }

    /// The largest layer matrix held in blocks, in elements (0 if none): the size of the
    /// bf16 scratch a prompt's matmul dequantizes it into. With `fp8_cores` (the GPU has
    /// `gemm_wgmma_fp8`) fp8 matrices need none: they go to the tensor cores as they are.
    fn largest_blocks_matrix(&self, c: &Config, fp8_cores: bool) -> usize {
        let (dim, q, kv, ffn) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let elements = [(q + 2 * kv) * dim, dim * q, ffn * dim, ffn * dim, dim * ffn];
        self.layers
            .iter()
            .flat_map(|l| l.matrices().into_iter().zip(elements))
            .filter(|(m, _)| m.as_bf16().is_none() && !(fp8_cores && m.as_fp8().is_some()))
            .map(|(_, n)| n)
            .max()
            .unwrap_or(0)
    }

    /// Whether every layer matrix and the output head are GGUF blocks (no fp8 rows, no bf16
    /// fallback), whose GEMV reads its input as 8-bit codes alone.
    fn all_codes(&self) -> bool {
        let codes = |m: &GpuMatrix| match m {
            GpuMatrix::Blocks(parts) => parts.iter().all(|p| p.ty != BlockType::Fp8),
            GpuMatrix::Bf16(_) => false,
        };
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        codes(head) && self.layers.iter().flat_map(|l| l.matrices()).all(codes)
    }

    /// Whether some layer matrix is held in GGUF blocks (fp8 rows aside: they take neither
    /// `gemm_<type>` nor `gemm_wgmma_<type>`).
    fn has_blocks(&self) -> bool {
        self.layers
            .iter()
            .flat_map(|l| l.matrices())
            .any(|m| match m {
                GpuMatrix::Blocks(parts) => parts.iter().any(|p| p.ty != BlockType::Fp8),
                GpuMatrix::Bf16(_) => false,
            })
    }
}

/// Most tokens a matmul over GGUF blocks takes through `gemm_wgmma_<type>` (where the type
/// has it): past them, dequantizing the matrix to bf16 once for `gemm_wgmma_bf16` costs
/// less than decoding the blocks in every tile of tokens. Measured on the H200 (Llama 3 8B
/// in Q8_0, BENCHMARKS.md round 36), the prefill through it against the dequantizer's: 128
/// tokens 12.5-12.6 ms against 14.1-14.3, 192 tokens 16.8 against 15.4, 256 17.3 against
/// 16.4, 512 29.4 against 23.8. At 128 tokens, Q4_K_M's mix (round 38) 12.6 against 13.6,
/// Q4_0 (round 39) 11.2 against 13.0.
const WGMMA_BLOCKS_MAX_TOKENS: usize = 128;

/// Whether every part of a matrix of GGUF blocks (rows of `n_in` weights) has its
/// `gemm_wgmma_<type>` on this GPU.
fn wgmma_blocks_take(gpu: &Gpu, parts: &[BlockPart], n_in: usize) -> bool {
    parts.iter().all(|p| gpu.has_wgmma_blocks(p.ty, n_in))
}

/// A matrix's runs of rows of one block type, each with its first row: where its outputs
/// start in a token's row of `n_out`, and its bias.
fn row_runs(parts: &[BlockPart]) -> impl Iterator<Item = (usize, &BlockPart)> {
    parts.iter().scan(0, |row, p| {
        let first = *row;
        *row += p.rows;
        Some((first, p))
    })
}

/// What a linear layer of several tokens needs besides its input and output.
struct MatmulScratch {
    /// `[max_tokens, max(dim, q_dim, ffn_dim)]` the input rounded to bf16 for the tensor cores
    x_bf16: CudaSlice<u16>,
    /// `[largest layer matrix held in blocks]` bf16: such a matrix dequantized for the
    /// tensor cores (`with_bf16`); `None` when every matrix is bf16.
    w_bf16: Option<CudaSlice<u16>>,
    /// The split sums of the skinny matmul (`[splits, SKINNY_MAX_TOKENS, n_out]` for the
    /// model's widest split matrix, `skinny_splits`), of `gemm_<type>` (`[splits,
    /// BLOCKS_MMA_MAX_TOKENS, n_out]`, `blocks_mma_splits`) or of the warpgroup GEMM (`[k_splits,
    /// n, n_out]` for the largest split its plans make up to `max_tokens`): the larger
    parts: CudaSlice<f32>,
    /// `[QUANT_MAX_TOKENS, max(dim, q_dim, ffn_dim)]` i8: the input of a GEMV over GGUF
    /// blocks as 8-bit codes (`quantize_q8_f32`), made once for all the row runs of a matrix
    codes: CudaSlice<u8>,
    /// `[QUANT_MAX_TOKENS, max(dim, q_dim, ffn_dim) / 32][2]`: the codes' scales, (d, d times
    /// the group's sum of codes)
    code_scales: CudaSlice<f32>,
    /// The last quantized matmul left its whole input made: 8-bit codes in `codes` (the
    /// GGUF types' GEMV) or e4m3 in `x_fp8` (fp8's GEMM).
    input_made: bool,
    /// `[max_tokens, max(dim, q_dim, ffn_dim)]` e4m3 and `[max_tokens]` scales: the input of
    /// fp8's tensor-core GEMM (`quantize_fp8_f32`); `None` where no matrix takes it
    /// (`takes_fp8`).
    x_fp8: Option<(CudaSlice<u8>, CudaSlice<f32>)>,
    /// `codes` or `x_fp8` already hold the next quantized matmul's input (up's, after
    /// gate's on the same input, or every GEMV's after `rmsnorm_q8_f32`): it skips
    /// `quantize_q8_f32` or `quantize_fp8_f32`. Set by the caller (or `norm_for_gemv`) for
    /// one call.
    hold_input: bool,
    /// Every matmul through the skinny kernel (whose sums for a token do not depend on the
    /// other tokens of the launch), one token too: `GpuBackend::set_batch_invariant`.
    batch_invariant: bool,
    /// Most tokens a matmul over GGUF blocks takes this pass through the integer GEMV
    /// rather than `gemm_<type>` (`route`).
    blocks_gemv_tokens: usize,
    /// Every matrix is GGUF blocks (`GpuWeights::all_codes`).
    all_codes: bool,
    /// `blocks_gemv_tokens` of a decode step (`Gpu::blocks_gemv_tokens`).
    decode_gemv_tokens: usize,
}

impl MatmulScratch {
    /// Whether a linear layer of `n` tokens takes its input rounded to bf16 in `x_bf16` (a
    /// tensor-core matmul), rather than in f32 (the GEMV of up to `gemv_tokens`).
    fn rounds(&self, n: usize) -> bool {
        n > self.gemv_tokens() || self.batch_invariant
    }

    /// Most tokens this pass keeps its activations in f32 for the GEMVs: one, or
    /// `blocks_gemv_tokens` where every matrix is GGUF blocks (`all_codes`), whose GEMV
    /// takes that many tokens' 8-bit codes at once. A decode step of a few sequences then
    /// takes one token's fusions (the norm making the codes, gate and up in one launch)
    /// rather than rounding for tensor cores it does not use.
    fn gemv_tokens(&self) -> usize {
        match self.all_codes {
            true => self.blocks_gemv_tokens,
            false => 1,
        }
    }

    /// Routes the next pass's matmuls over GGUF blocks. A decode step's tokens (one a
    /// sequence) take the GEMV up to `Gpu::blocks_gemv_tokens`, where `gemm_<type>` begins
    /// to cost less (`BLOCKS_GEMV_MAX_TOKENS`). Any other pass of up to `QUANT_MAX_TOKENS`
    /// (a short prompt) keeps the GEMV, for its accuracy: on the H200 the golden 5-token
    /// prompt's first logit (token 79) came out 25.48 through `gemm_q4_1`'s bf16 activations
    /// against transformers' 24.91, past `default_model_gpu_matches_transformers`'s 0.5,
    /// and within it through the GEMV's 8-bit codes (0.293, BENCHMARKS.md round 41).
    fn route(&mut self, decode: bool) {
        self.blocks_gemv_tokens = match decode {
            true => self.decode_gemv_tokens,
            false => QUANT_MAX_TOKENS,
        };
    }

    /// `blocks`: some matrix is held in blocks; `fp8`: some matrix takes fp8's tensor cores;
    /// `all_codes`: every matrix is GGUF blocks.
    fn new(
        gpu: &Gpu,
        c: &Config,
        max_tokens: usize,
        dequant_elements: usize,
        blocks: bool,
        fp8: bool,
        all_codes: bool,
    ) -> Result<MatmulScratch> {
        let (dim, q, kv, ffn) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let matrices = [
            (dim, q + 2 * kv),
            (q, dim),
            (dim, ffn),
            (ffn, dim),
            (dim, c.vocab_size),
        ];
        let skinny =
            |&(n_in, n_out): &(usize, usize)| match skinny_splits(n_in, n_out, gpu.sm_count) {
                1 => 0,
                s => s * SKINNY_MAX_TOKENS * n_out,
            };
        // Every token count a step may bring: the plans split only small grids, so this is
        // a few dozen MiB at most (Llama 3 8B: 8 x 128 x 4096 for down at 128 tokens).
        let wgmma = |&(n_in, n_out): &(usize, usize)| {
            (1..=max_tokens)
                .map(|n| gpu.wgmma_parts_len(n, n_in, n_out))
                .max()
                .unwrap_or(0)
        };
        // `gemm_<type>`'s and `gemm_wgmma_<type>`'s, where some matrix is held in blocks
        // (the latter's plans, as the warpgroup GEMM's, split only small grids).
        let blocks = |&(n_in, n_out): &(usize, usize)| {
            let few = match blocks_mma_splits(n_in, n_out, gpu.sm_count) {
                1 => 0,
                s => s * BLOCKS_MMA_MAX_TOKENS * n_out,
            };
            let many = (BLOCKS_MMA_MAX_TOKENS + 1..=max_tokens)
                .map(|n| match gpu.wgmma_blocks_plan(n, n_in, n_out).k_splits {
                    1 => 0,
                    s => s * n * n_out,
                })
                .max()
                .unwrap_or(0);
            if blocks { few.max(many) } else { 0 }
        };
        let parts = matrices
            .iter()
            .map(|m| skinny(m).max(wgmma(m)).max(blocks(m)))
            .max()
            .unwrap_or(0);
        let widest = dim.max(q).max(ffn);
        Ok(MatmulScratch {
            x_bf16: gpu.zeros(max_tokens * widest, "activations")?,
            codes: gpu.zeros(QUANT_MAX_TOKENS * widest, "activations as 8-bit codes")?,
            code_scales: gpu.zeros(QUANT_MAX_TOKENS * widest / 16, "the codes' scales")?,
            input_made: false,
            hold_input: false,
            x_fp8: match fp8 {
                false => None,
                true => Some((
                    gpu.zeros(max_tokens * widest, "activations in e4m3")?,
                    gpu.zeros(max_tokens, "the e4m3 activations' scales")?,
                )),
            },
            parts: gpu.zeros(parts.max(1), "the tensor-core matmuls' split sums")?,
            w_bf16: match dequant_elements {
                0 => None,
                n => Some(gpu.zeros(n, "a quantized matrix dequantized for the tensor cores")?),
            },
            batch_invariant: false,
            blocks_gemv_tokens: QUANT_MAX_TOKENS,
            all_codes,
            decode_gemv_tokens: gpu.blocks_gemv_tokens,
        })
    }
}

/// `runner::Choices` on the device.
struct DeviceChoices {
    /// `[rows, SAMPLE_PARAMS]`
    params: CudaSlice<u32>,
    /// `[rows]`
    steps: CudaSlice<u32>,
    /// `[n, 3]`
    entries: CudaSlice<u32>,
    /// `[rows, 3]`
    penalties: CudaSlice<f32>,
}

impl DeviceChoices {
    fn new(gpu: &Gpu) -> Result<DeviceChoices> {
        let u = || gpu.zeros::<u32>(64, "sampling parameters");
        Ok(DeviceChoices {
            params: u()?,
            steps: u()?,
            entries: u()?,
            penalties: gpu.zeros(64, "sampling parameters")?,
        })
    }
}

pub struct GpuBackend {
    pub gpu: Gpu,
    pub weights: GpuWeights,
    /// `[n_layers, n_blocks, BLOCK_SIZE, n_kv_heads, head_dim]` bf16, the CPU cache's layout
    /// (which holds f32): half the bytes per token
    pub k_cache: CudaSlice<u16>,
    pub v_cache: CudaSlice<u16>,
    pub n_blocks: usize,
    rope_cos: CudaSlice<f32>, // [max_pos, head_dim / 2]
    rope_sin: CudaSlice<f32>, // [max_pos, head_dim / 2]
    // Activations, [max_tokens, width] each.
    x: CudaSlice<f32>,      // [.., dim] the residual stream
    xb: CudaSlice<f32>,     // [.., dim] normed input of a block, or a block's output
    qkv: CudaSlice<f32>,    // [.., q_dim + 2 kv_dim]
    q: CudaSlice<f32>,      // [.., q_dim] rotated queries
    att: CudaSlice<f32>,    // [.., q_dim] attention output
    gate: CudaSlice<f32>,   // [.., ffn_dim]
    up: CudaSlice<f32>,     // [.., ffn_dim]
    hidden: CudaSlice<f32>, // [.., ffn_dim] silu(gate) * up
    mm: MatmulScratch,
    head_in: CudaSlice<f32>, // [.., dim] final-normed rows whose logits are wanted
    logits: CudaSlice<f32>,  // [.., vocab]
    partial_o: CudaSlice<f32>, // [PARTIAL_ROWS, head_dim] flash-decoding partial outputs
    partial_ml: CudaSlice<f32>, // [PARTIAL_ROWS, 2] their (max, sum)
    next_ids: CudaSlice<u32>, // [max_tokens] greedy choices, one per logits row
    // The batch, as the kernels read it: [max_tokens] each, and [MAX_SEQS, max_blocks].
    tokens: CudaSlice<u32>,
    positions: CudaSlice<u32>,
    token_seq: CudaSlice<u32>,
    slots: CudaSlice<u32>,
    block_tables: CudaSlice<u32>,
    /// Block tables as uploaded: `[n_seqs, table_stride]`.
    tables_host: Vec<u32>,
    /// Row length of the device block tables: the most blocks one sequence can hold.
    table_stride: usize,
    logits_host: Vec<f32>,
    ids_host: Vec<u32>,
    /// The sampling choices as the kernels read them, grown to the largest batch seen.
    choices: DeviceChoices,
    /// The batch as uploaded, padding rows included (`upload`).
    batch_host: Batch,
    /// The spare KV block padding rows write and read: the pool's last, which the runner
    /// does not report (`n_blocks` excludes it).
    pad_block: usize,
    /// (token, head, split) rows of the flash-decoding scratch (`partial_rows_for`).
    partial_rows: usize,
    max_tokens: usize,
    /// Decode-step graphs, by batch bucket, split count and whether they end in the argmax.
    graphs: HashMap<GraphKey, CudaGraph>,
    /// Replay decode steps as CUDA graphs (on by default; `bench` measures both ways).
    pub use_graphs: bool,
}

impl GpuBackend {
    /// Allocates activations for `max_tokens` tokens and a KV pool of `kv_blocks` blocks, or
    /// by default of most of the free memory (up to what `MAX_SEQS` full contexts need).
    /// RoPE tables come later (`set_rope`): their length depends on the pool's size.
    pub fn new(
        gpu: Gpu,
        c: &Config,
        weights: GpuWeights,
        kv_blocks: Option<usize>,
        max_tokens: usize,
    ) -> Result<GpuBackend> {
        check_supported(c)?;
        let fp8_cores = gpu.has_wgmma_fp8();
        let act = |width: usize| gpu.zeros::<f32>(max_tokens * width, "activations");
        let ids = || gpu.zeros::<u32>(max_tokens, "the batch");
        let block_bytes = kv_bytes_per_token(c) * BLOCK_SIZE;
        let n_blocks = match kv_blocks {
            Some(n) => n,
            None => {
                let (free, _) = gpu.memory();
                let affordable = (free as f64 * KV_SHARE_OF_FREE) as usize / block_bytes;
                affordable.min(blocks_for(c.max_seq_len) * MAX_SEQS)
            }
        };
        if n_blocks == 0 {
            let (free, total) = gpu.memory();
            return Err(Error::GpuOutOfMemory {
                what: "one KV-cache block".into(),
                bytes: block_bytes,
                free,
                total,
            });
        }
        // One block more than the runner is told of: the padding rows' (`upload`).
        let pool = (n_blocks + 1) * BLOCK_SIZE * c.kv_dim() * c.n_layers;
        let partial_rows = partial_rows_for(c);
        let max_blocks = blocks_for(c.max_seq_len).min(n_blocks);
        Ok(GpuBackend {
            k_cache: gpu.zeros(pool, "the KV cache (keys)")?,
            v_cache: gpu.zeros(pool, "the KV cache (values)")?,
            n_blocks,
            rope_cos: gpu.zeros(1, "RoPE tables")?,
            rope_sin: gpu.zeros(1, "RoPE tables")?,
            x: act(c.dim)?,
            xb: act(c.dim)?,
            qkv: act(c.q_dim() + 2 * c.kv_dim())?,
            q: act(c.q_dim())?,
            att: act(c.q_dim())?,
            gate: act(c.ffn_dim)?,
            up: act(c.ffn_dim)?,
            hidden: act(c.ffn_dim)?,
            mm: MatmulScratch::new(
                &gpu,
                c,
                max_tokens,
                weights.largest_blocks_matrix(c, fp8_cores),
                weights.has_blocks(),
                fp8_cores && weights.has_fp8(),
                weights.all_codes(),
            )?,
            head_in: act(c.dim)?,
            logits: act(c.vocab_size)?,
            partial_o: gpu.zeros(partial_rows * c.head_dim, "attention scratch")?,
            partial_ml: gpu.zeros(partial_rows * 2, "attention scratch")?,
            next_ids: ids()?,
            tokens: ids()?,
            positions: ids()?,
            token_seq: ids()?,
            slots: ids()?,
            block_tables: gpu.zeros(MAX_SEQS * max_blocks, "block tables")?,
            tables_host: vec![],
            table_stride: max_blocks,
            logits_host: vec![],
            ids_host: vec![],
            choices: DeviceChoices::new(&gpu)?,
            batch_host: Batch::default(),
            pad_block: n_blocks,
            partial_rows,
            max_tokens,
            graphs: HashMap::new(),
            use_graphs: true,
            weights,
            gpu,
        })
    }

    /// The batch-invariant mode: a token's logits, bit for bit, whatever else shares its
    /// batch. Every matmul goes through the skinny kernel (one token too, where the GEMV
    /// would be faster; 128 rows at a time for a prompt, where the warpgroup GEMM would be),
    /// and attention through `attention_bf16`, whose sums for a token depend on its own
    /// position alone. Decode graphs captured before are dropped.
    pub fn set_batch_invariant(&mut self, on: bool) {
        if self.mm.batch_invariant != on {
            self.mm.batch_invariant = on;
            self.graphs.clear();
        }
    }

    pub fn set_rope(&mut self, rope: &RopeTables) -> Result<()> {
        self.rope_cos = self.gpu.upload(&rope.cos, "RoPE tables")?;
        self.rope_sin = self.gpu.upload(&rope.sin, "RoPE tables")?;
        Ok(())
    }

    /// Whether `n` tokens take the skinny matmul rather than the prompt GEMM: always in the
    /// batch-invariant mode; without `wgmma`, for all it takes (`gemm_mma_bf16` is behind it
    /// even at 128 tokens); with `wgmma`, to `SKINNY_OVER_WGMMA_TOKENS`. On the H200
    /// (Llama-3-8B, `rustle bench --prompt-len N --gemm-plans`, BENCHMARKS.md round 18), us
    /// skinny/wgmma for qkv, o_proj, gate, down: at 16 tokens 19.8/18.7, 12.4/11.0,
    /// 34.9/38.6, 36.0/37.6 (even); at 32, 24.0/21.2, 15.9/12.2, 40.4/38.1, 38.8/37.9, and
    /// at 64 wgmma ahead by a third, now that its reduction splits up to 8 ways to fill the
    /// SMs.
    fn takes_skinny(gpu: &Gpu, mm: &MatmulScratch, n: usize) -> bool {
        if mm.batch_invariant || !gpu.has_wgmma() {
            return mm.batch_invariant || n <= SKINNY_MAX_TOKENS;
        }
        n <= SKINNY_OVER_WGMMA_TOKENS
    }

    /// Whether `n` tokens through `w` take the quantized GEMV (`gemv_blocks`) rather than
    /// the tensor cores: for a matrix held in blocks, up to `QUANT_MAX_TOKENS` tokens (a
    /// decode step: every weight is read once for them all, in its few bits), and for any
    /// number in the batch-invariant mode or where the matrix is larger than the bf16
    /// scratch (the output head), 8 tokens a launch. Up to `BLOCKS_MMA_MAX_TOKENS` tokens
    /// take `gemm_<type>` before this is asked (`takes_block_mma`); more dequantize the
    /// matrix into `mm.w_bf16` and run the bf16 GEMM, whose arithmetic then dwarfs the
    /// extra pass.
    fn takes_blocks(mm: &MatmulScratch, w: &GpuMatrix, n: usize, elements: usize) -> bool {
        if w.as_bf16().is_some() {
            return false;
        }
        if n <= QUANT_MAX_TOKENS || mm.batch_invariant {
            return true;
        }
        let fits = mm.w_bf16.as_ref().is_some_and(|s| s.len() >= elements);
        Self::takes_fp8(mm, w).is_none() && !fits
    }

    /// Whether `n` tokens through `w` take `gemm_<type>` (the tensor cores on the GGUF
    /// blocks, dequantized in registers): more tokens than the GEMV takes
    /// (`blocks_gemv_tokens`), up to `BLOCKS_MMA_MAX_TOKENS` (a batched decode step, a short
    /// prompt), for a matrix of GGUF blocks, outside the batch-invariant mode (whose tokens
    /// take the GEMV whatever their number). More tokens dequantize the matrix to bf16 for
    /// the prompt's GEMM.
    fn takes_block_mma(mm: &MatmulScratch, w: &GpuMatrix, n: usize, n_in: usize) -> bool {
        let GpuMatrix::Blocks(parts) = w else {
            return false;
        };
        (mm.blocks_gemv_tokens + 1..=BLOCKS_MMA_MAX_TOKENS).contains(&n)
            && !mm.batch_invariant
            && n_in.is_multiple_of(BLOCKS_MMA_STAGE_K)
            && parts.iter().all(|p| p.ty != BlockType::Fp8)
    }

    /// Whether `n` tokens through `w` take `gemm_wgmma_<type>` (Hopper's warpgroup tensor
    /// cores on the GGUF blocks, dequantized in registers): more than `gemm_<type>` takes,
    /// up to `WGMMA_BLOCKS_MAX_TOKENS` (or any number through a matrix larger than the bf16
    /// scratch: the output head of a batched step), outside the batch-invariant mode, for a
    /// matrix every part of which has the kernel (`wgmma_blocks_take`). Others dequantize to
    /// bf16 for the prompt's GEMM.
    fn takes_wgmma_blocks(
        gpu: &Gpu,
        mm: &MatmulScratch,
        w: &GpuMatrix,
        n: usize,
        n_in: usize,
    ) -> bool {
        let GpuMatrix::Blocks(parts) = w else {
            return false;
        };
        let rows: usize = parts.iter().map(|p| p.rows).sum();
        let fits = mm.w_bf16.as_ref().is_some_and(|s| s.len() >= rows * n_in);
        n > BLOCKS_MMA_MAX_TOKENS
            && (n <= WGMMA_BLOCKS_MAX_TOKENS || !fits)
            && !mm.batch_invariant
            && wgmma_blocks_take(gpu, parts, n_in)
    }

    /// `out (+)= x w^T + bias` for `n` tokens rounded into `mm.x_bf16`, through
    /// `gemm_<type>` (up to `BLOCKS_MMA_MAX_TOKENS`) or `gemm_wgmma_<type>` (more): a launch
    /// per run of rows of one type; a split reduction leaves every run's parts in
    /// `mm.parts`, which one `gemm_skinny_reduce_f32` adds for the matrix.
    #[allow(clippy::too_many_arguments)]
    fn gemm_blocks(
        gpu: &Gpu,
        out: &mut Out<f32>,
        mm: &mut MatmulScratch,
        w: &GpuMatrix,
        bias: Option<&In<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
        accumulate: bool,
    ) -> Result<()> {
        let GpuMatrix::Blocks(parts) = w else {
            unreachable!("gemm_blocks of a bf16 matrix")
        };
        // The warpgroup kernel's plan, past what `gemm_<type>` takes.
        let plan = (n > BLOCKS_MMA_MAX_TOKENS).then(|| gpu.wgmma_blocks_plan(n, n_in, n_out));
        let splits = match plan {
            Some(plan) => plan.k_splits,
            None => blocks_mma_splits(n_in, n_out, gpu.sm_count),
        };
        let x = &mm.x_bf16.slice(..n * n_in);
        for (row, p) in row_runs(parts) {
            let w = &p.bytes.as_view();
            let last = row + (n - 1) * n_out + p.rows;
            let (out, bias, accumulate) = match splits {
                1 => (
                    &mut out.slice_mut(row..last),
                    bias.map(|b| b.slice(row..row + p.rows)),
                    accumulate,
                ),
                _ => {
                    let end = last + (splits - 1) * n * n_out;
                    (&mut mm.parts.slice_mut(row..end), None, false)
                }
            };
            let (ty, bias) = (p.ty, bias.as_ref());
            match plan {
                Some(plan) => gpu.gemm_wgmma_blocks(
                    ty, out, x, w, bias, n, n_in, p.rows, n_out, accumulate, plan,
                )?,
                None => gpu.gemm_blocks(
                    ty, out, x, w, bias, n, n_in, p.rows, n_out, accumulate, splits,
                )?,
            }
        }
        if splits == 1 {
            return Ok(());
        }
        let parts = &mm.parts.slice(..splits * n * n_out);
        gpu.gemm_skinny_reduce_f32(
            &mut out.slice_mut(..n * n_out),
            parts,
            bias,
            n_out,
            accumulate,
        )
    }

    /// The fp8 matrix `w` when more tokens than the GEMV's go through it on fp8's tensor
    /// cores (`gemm_wgmma_fp8`, on a GPU that has it, where `MatmulScratch::x_fp8` was made
    /// for it), not dequantized to bf16: half the bytes, twice the products a cycle.
    fn takes_fp8<'w>(mm: &MatmulScratch, w: &'w GpuMatrix) -> Option<&'w BlockPart> {
        w.as_fp8()
            .filter(|_| mm.x_fp8.is_some() && !mm.batch_invariant)
    }

    /// `out (+)= x w^T + bias` for `n` tokens on fp8's tensor cores: x made e4m3
    /// (`quantize_fp8_f32`, unless `x_fp8` holds it already), then `gemm_wgmma_fp8`. It adds
    /// into `out` only through a split plan's sum; otherwise through `tmp` and a residual
    /// add (`tmp` must then be given).
    #[allow(clippy::too_many_arguments)]
    fn gemm_fp8(
        gpu: &Gpu,
        out: &mut Out<f32>,
        x: &In<f32>,
        mm: &mut MatmulScratch,
        w: &BlockPart,
        bias: Option<&In<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
        tmp: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let hold = std::mem::take(&mut mm.hold_input);
        mm.input_made = true;
        let (codes, scales) = mm.x_fp8.as_mut().expect("takes_fp8 checked x_fp8");
        if !hold {
            gpu.quantize_fp8_f32(
                &mut codes.slice_mut(..n * n_in),
                &mut scales.slice_mut(..n),
                &x.slice(..n * n_in),
                n,
                n_in,
            )?;
        }
        let w_scales = w.scales.as_ref().expect("fp8 has row scales");
        let ops = || Fp8Operands {
            x: codes.slice(..n * n_in),
            x_scales: scales.slice(..n),
            w: w.bytes.as_view(),
            w_scales: w_scales.as_view(),
        };
        let parts = &mut mm.parts.as_view_mut();
        match tmp {
            None => gpu.gemm_wgmma_fp8(out, ops(), bias, n, n_in, n_out, parts, false),
            Some(_) if gpu.wgmma_parts_len(n, n_in, n_out) > 0 => {
                gpu.gemm_wgmma_fp8(out, ops(), bias, n, n_in, n_out, parts, true)
            }
            Some(tmp) => {
                let tmp = &mut tmp.slice_mut(..n * n_out);
                gpu.gemm_wgmma_fp8(tmp, ops(), bias, n, n_in, n_out, parts, false)?;
                gpu.residual_add_f32(out, &tmp.as_view())
            }
        }
    }

    /// `out (+)= x w^T + bias` through the quantized GEMV: `QUANT_MAX_TOKENS` tokens a
    /// launch, one launch per run of rows of one type. For the GGUF types the tokens are
    /// first made 8-bit codes (`quantize_q8_f32`), once for all the runs; fp8 multiplies
    /// the floats.
    #[allow(clippy::too_many_arguments)]
    fn gemv_blocks(
        gpu: &Gpu,
        out: &mut Out<f32>,
        x: &In<f32>,
        mm: &mut MatmulScratch,
        w: &GpuMatrix,
        bias: Option<&In<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
        accumulate: bool,
    ) -> Result<()> {
        let GpuMatrix::Blocks(parts) = w else {
            unreachable!("gemv_blocks of a bf16 matrix")
        };
        let in_codes = parts.iter().any(|p| p.ty != BlockType::Fp8);
        let hold = std::mem::take(&mut mm.hold_input) && n <= QUANT_MAX_TOKENS;
        mm.input_made = in_codes && n <= QUANT_MAX_TOKENS;
        for first in (0..n).step_by(QUANT_MAX_TOKENS) {
            let tokens = (n - first).min(QUANT_MAX_TOKENS);
            let x = x.slice(first * n_in..(first + tokens) * n_in);
            if in_codes && !hold {
                gpu.quantize_q8_f32(
                    &mut mm.codes.slice_mut(..tokens * n_in),
                    &mut mm.code_scales.slice_mut(..tokens * n_in / 16),
                    &x,
                    tokens * n_in,
                )?;
            }
            let (codes, scales) = (
                mm.codes.slice(..tokens * n_in),
                mm.code_scales.slice(..tokens * n_in / 16),
            );
            // Two runs whose pair of types one kernel takes: one launch.
            if let [a, b] = &parts[..]
                && gpu.kernels.two_types(a.ty, b.ty).is_some()
            {
                let start = first * n_out;
                gpu.gemv_codes_two(
                    (a.ty, b.ty),
                    &mut out.slice_mut(start..start + tokens * n_out),
                    &codes,
                    &scales,
                    (&a.bytes.as_view(), &b.bytes.as_view()),
                    bias,
                    tokens,
                    n_in,
                    (a.rows, n_out),
                    n_out,
                    accumulate,
                )?;
                continue;
            }
            for (row, p) in row_runs(parts) {
                let start = first * n_out + row;
                let out = &mut out.slice_mut(start..start + (tokens - 1) * n_out + p.rows);
                let bias = bias.map(|b| b.slice(row..row + p.rows));
                let w = &p.bytes.as_view();
                match &p.scales {
                    Some(s) => gpu.gemv_blocks(
                        p.ty,
                        out,
                        &x,
                        w,
                        Some(&s.as_view()),
                        bias.as_ref(),
                        tokens,
                        n_in,
                        p.rows,
                        n_out,
                        accumulate,
                    )?,
                    None => gpu.gemv_codes(
                        p.ty,
                        out,
                        &codes,
                        &scales,
                        w,
                        bias.as_ref(),
                        tokens,
                        n_in,
                        p.rows,
                        n_out,
                        accumulate,
                    )?,
                }
            }
        }
        Ok(())
    }

    /// Runs `f` with `w` as bf16 `[n_out, n_in]`: its own buffer, or its blocks dequantized
    /// into the scratch `mm.w_bf16` (lent to `f` for the call).
    fn with_bf16(
        gpu: &Gpu,
        mm: &mut MatmulScratch,
        w: &GpuMatrix,
        n_in: usize,
        n_out: usize,
        f: impl FnOnce(&mut MatmulScratch, &In<u16>) -> Result<()>,
    ) -> Result<()> {
        let parts = match w {
            GpuMatrix::Bf16(w) => return f(mm, &w.as_view()),
            GpuMatrix::Blocks(parts) => parts,
        };
        let mut scratch = mm.w_bf16.take().expect("a bf16 scratch for blocks");
        let mut result = Ok(());
        for (row, p) in row_runs(parts) {
            let out = &mut scratch.slice_mut(row * n_in..(row + p.rows) * n_in);
            let scales = p.scales.as_ref().map(|s| s.as_view());
            // SAFETY: no row list: the kernel reads the part's own rows in order.
            result = unsafe {
                gpu.dequant_blocks(
                    p.ty,
                    Some(out),
                    None,
                    &p.bytes.as_view(),
                    scales.as_ref(),
                    None,
                    p.rows,
                    n_in,
                )
            };
            if result.is_err() {
                break;
            }
        }
        if result.is_ok() {
            result = f(mm, &scratch.slice(..n_out * n_in));
        }
        mm.w_bf16 = Some(scratch);
        result
    }

    /// One linear layer for `n` tokens: `out (+)= x w^T + bias`, added to what `out` holds
    /// when `accumulate` (a fused residual add). The GEMV for one token (or the quantized
    /// GEMV, `takes_blocks`); for a few (see `takes_skinny`) the skinny tensor-core matmul;
    /// for more the prompt GEMM, which cannot accumulate (callers add its output
    /// themselves).
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        gpu: &Gpu,
        out: &mut Out<f32>,
        x: &In<f32>,
        mm: &mut MatmulScratch,
        w: &GpuMatrix,
        bias: Option<&CudaSlice<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
        accumulate: bool,
    ) -> Result<()> {
        let bias = bias.map(|b| b.as_view());
        if Self::takes_block_mma(mm, w, n, n_in) || Self::takes_wgmma_blocks(gpu, mm, w, n, n_in) {
            gpu.f32_to_bf16(&mut mm.x_bf16.slice_mut(..n * n_in), x)?;
            return Self::gemm_blocks(gpu, out, mm, w, bias.as_ref(), n, n_in, n_out, accumulate);
        }
        if Self::takes_blocks(mm, w, n, n_in * n_out) {
            return Self::gemv_blocks(
                gpu,
                out,
                x,
                mm,
                w,
                bias.as_ref(),
                n,
                n_in,
                n_out,
                accumulate,
            );
        }
        if !mm.rounds(n) {
            let w = &w.as_bf16().expect("blocks take gemv_blocks").as_view();
            return gpu.gemv_bf16(out, x, w, bias.as_ref(), n_in, n_out, accumulate);
        }
        gpu.f32_to_bf16(&mut mm.x_bf16.slice_mut(..n * n_in), x)?;
        Self::gemm(
            gpu,
            out,
            x,
            mm,
            w,
            bias.as_ref(),
            n,
            n_in,
            n_out,
            accumulate,
        )
    }

    /// The matmul of `n` tokens whose input `x` the kernel before already rounded into
    /// `mm.x_bf16`: the quantized GEMV where `takes_blocks` (from `x` itself), else the
    /// tensor cores (`gemm_bf16_rounded`).
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        gpu: &Gpu,
        out: &mut Out<f32>,
        x: &In<f32>,
        mm: &mut MatmulScratch,
        w: &GpuMatrix,
        bias: Option<&In<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
        accumulate: bool,
    ) -> Result<()> {
        if Self::takes_block_mma(mm, w, n, n_in) || Self::takes_wgmma_blocks(gpu, mm, w, n, n_in) {
            return Self::gemm_blocks(gpu, out, mm, w, bias, n, n_in, n_out, accumulate);
        }
        if Self::takes_blocks(mm, w, n, n_in * n_out) {
            return Self::gemv_blocks(gpu, out, x, mm, w, bias, n, n_in, n_out, accumulate);
        }
        if let Some(w) = Self::takes_fp8(mm, w) {
            assert!(
                !accumulate,
                "the fp8 GEMM adds into its output through add_matmul"
            );
            return Self::gemm_fp8(gpu, out, x, mm, w, bias, n, n_in, n_out, None);
        }
        Self::with_bf16(gpu, mm, w, n_in, n_out, |mm, w| {
            Self::gemm_rounded(gpu, out, mm, w, bias, n, n_in, n_out, accumulate)
        })
    }

    /// The tensor-core matmul of `n` tokens already rounded into `mm.x_bf16`: the skinny one
    /// where `takes_skinny` (in the batch-invariant mode for any number, `SKINNY_MAX_TOKENS`
    /// rows at a time), else `Gpu::prefill_gemm` (which cannot accumulate).
    #[allow(clippy::too_many_arguments)]
    fn gemm_rounded(
        gpu: &Gpu,
        out: &mut Out<f32>,
        mm: &mut MatmulScratch,
        w: &In<u16>,
        bias: Option<&In<f32>>,
        n: usize,
        n_in: usize,
        n_out: usize,
        accumulate: bool,
    ) -> Result<()> {
        if Self::takes_skinny(gpu, mm, n) {
            let parts = &mut mm.parts.as_view_mut();
            for first in (0..n).step_by(SKINNY_MAX_TOKENS) {
                let rows = first..(first + SKINNY_MAX_TOKENS).min(n);
                gpu.gemm_skinny_bf16(
                    &mut out.slice_mut(rows.start * n_out..rows.end * n_out),
                    &mm.x_bf16.slice(rows.start * n_in..rows.end * n_in),
                    w,
                    bias,
                    n_in,
                    n_out,
                    accumulate,
                    parts,
                )?;
            }
            return Ok(());
        }
        assert!(
            !accumulate,
            "the prompt GEMM writes its output; add it separately"
        );
        let x = mm.x_bf16.slice(..n * n_in);
        let parts = &mut mm.parts.as_view_mut();
        gpu.prefill_gemm(out, &x, w, bias, n, n_in, n_out, parts)
    }

    /// `x += input w^T` for `n` tokens: fused into the matmul's output where the GEMV (bf16
    /// or quantized) or the skinny matmul runs it, or into the in-order sum of a split
    /// warpgroup GEMM; otherwise through `tmp` and a residual add. `rounded`: the kernel
    /// before left `input` rounded to bf16 in `mm.x_bf16` already.
    #[allow(clippy::too_many_arguments)]
    fn add_matmul(
        gpu: &Gpu,
        x: &mut Out<f32>,
        tmp: &mut CudaSlice<f32>,
        input: &In<f32>,
        rounded: bool,
        mm: &mut MatmulScratch,
        w: &GpuMatrix,
        n: usize,
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        if Self::takes_block_mma(mm, w, n, n_in) || Self::takes_wgmma_blocks(gpu, mm, w, n, n_in) {
            if !rounded {
                gpu.f32_to_bf16(&mut mm.x_bf16.slice_mut(..n * n_in), input)?;
            }
            return Self::gemm_blocks(gpu, x, mm, w, None, n, n_in, n_out, true);
        }
        if Self::takes_blocks(mm, w, n, n_in * n_out) {
            return Self::gemv_blocks(gpu, x, input, mm, w, None, n, n_in, n_out, true);
        }
        if !mm.rounds(n) {
            let w = &w.as_bf16().expect("blocks take gemv_blocks").as_view();
            return gpu.gemv_bf16(x, input, w, None, n_in, n_out, true);
        }
        if let Some(w) = Self::takes_fp8(mm, w) {
            return Self::gemm_fp8(gpu, x, input, mm, w, None, n, n_in, n_out, Some(tmp));
        }
        if !rounded {
            gpu.f32_to_bf16(&mut mm.x_bf16.slice_mut(..n * n_in), input)?;
        }
        Self::with_bf16(gpu, mm, w, n_in, n_out, |mm, w| {
            if Self::takes_skinny(gpu, mm, n) {
                return Self::gemm_rounded(gpu, x, mm, w, None, n, n_in, n_out, true);
            }
            if gpu.wgmma_parts_len(n, n_in, n_out) > 0 {
                // A split warpgroup GEMM: its parts' sum adds into x.
                let (xb, parts) = (mm.x_bf16.slice(..n * n_in), &mut mm.parts.as_view_mut());
                return gpu.gemm_wgmma_add_bf16(x, &xb, w, n, n_in, n_out, parts);
            }
            let tmp = &mut tmp.slice_mut(..n * n_out);
            Self::gemm_rounded(gpu, tmp, mm, w, None, n, n_in, n_out, false)?;
            gpu.residual_add_f32(x, &tmp.as_view())
        })
    }

    /// Runs `batch` and returns the logits of its `logit_rows`, `[rows, vocab]`, copied to the
    /// host. A decode step replays a CUDA graph (`run`).
    pub fn forward(&mut self, c: &Config, batch: &Batch) -> Result<&[f32]> {
        let rows = self.run(c, batch, false)?;
        let n = rows * c.vocab_size;
        self.logits_host.resize(n, 0.0);
        self.gpu
            .stream
            .memcpy_dtoh(&self.logits.slice(..n), &mut self.logits_host)
            .map_err(Error::driver("the forward pass failed"))?;
        self.gpu.sync()?;
        Ok(&self.logits_host)
    }

    /// Runs `batch` and returns the most likely next token of each logits row: the argmax
    /// runs on the device, and only the ids come back.
    pub fn forward_greedy(&mut self, c: &Config, batch: &Batch) -> Result<&[u32]> {
        let rows = self.run(c, batch, true)?;
        self.ids_host.resize(rows, 0);
        self.gpu
            .stream
            .memcpy_dtoh(&self.next_ids.slice(..rows), &mut self.ids_host)
            .map_err(Error::driver("the forward pass failed"))?;
        self.gpu.sync()?;
        Ok(&self.ids_host)
    }

    /// Runs `batch` and returns each logits row's token drawn as `choices` says: the
    /// penalties and the draw run on the device, and only the ids come back.
    pub fn forward_sample(
        &mut self,
        c: &Config,
        batch: &Batch,
        choices: &crate::sampler::Choices,
    ) -> Result<&[u32]> {
        let rows = self.run(c, batch, false)?;
        let vocab = c.vocab_size;
        let s = &self.gpu.stream;
        let up_err = Error::driver("copying the sampling parameters to the device");
        let ch = &mut self.choices;
        let grow = |buf: &mut CudaSlice<u32>, n: usize| -> Result<()> {
            if buf.len() < n {
                *buf = self
                    .gpu
                    .zeros(n.next_power_of_two(), "sampling parameters")?;
            }
            Ok(())
        };
        grow(&mut ch.params, choices.params.len())?;
        grow(&mut ch.steps, rows)?;
        grow(&mut ch.entries, choices.penalty_entries.len())?;
        if ch.penalties.len() < choices.penalties.len().max(1) {
            ch.penalties = self.gpu.zeros(
                choices.penalties.len().max(1).next_power_of_two(),
                "penalties",
            )?;
        }
        assert!(choices.params.len() == rows * crate::cpu::ops::SAMPLE_PARAMS);
        assert!(choices.steps.len() == rows);
        s.memcpy_htod(
            &choices.params,
            &mut ch.params.slice_mut(..choices.params.len()),
        )
        .map_err(up_err)?;
        s.memcpy_htod(&choices.steps, &mut ch.steps.slice_mut(..rows))
            .map_err(up_err)?;
        let logits = &mut self.logits.slice_mut(..rows * vocab);
        if !choices.penalty_entries.is_empty() {
            let n = choices.penalty_entries.len();
            assert!(choices.penalties.len() == 3 * rows);
            assert!(
                choices
                    .penalty_entries
                    .chunks_exact(3)
                    .all(|e| (e[0] as usize) < rows && (e[1] as usize) < vocab),
                "penalty entries outside the batch's rows or the vocabulary"
            );
            s.memcpy_htod(&choices.penalty_entries, &mut ch.entries.slice_mut(..n))
                .map_err(up_err)?;
            s.memcpy_htod(&choices.penalties, &mut ch.penalties.slice_mut(..3 * rows))
                .map_err(up_err)?;
            // SAFETY: rows and tokens checked above; the engine builds each row's entries
            // from its distinct tokens.
            unsafe {
                self.gpu.penalize_f32(
                    logits,
                    &ch.entries.slice(..n),
                    &ch.penalties.slice(..3 * rows),
                    vocab,
                )
            }?;
        }
        self.gpu.sample_f32(
            &mut self.next_ids.slice_mut(..rows),
            &logits.as_view(),
            &ch.params.slice(..choices.params.len()),
            &ch.steps.slice(..rows),
        )?;
        self.ids_host.resize(rows, 0);
        s.memcpy_dtoh(&self.next_ids.slice(..rows), &mut self.ids_host)
            .map_err(Error::driver("the forward pass failed"))?;
        self.gpu.sync()?;
        Ok(&self.ids_host)
    }

    /// Uploads `batch` and launches its forward pass, with the argmax when `greedy`; returns
    /// its rows of logits. A decode step (one token of each of at most `GRAPH_MAX_BATCH`
    /// sequences, every row wanting logits) replays a CUDA graph of the whole pass: one
    /// launch instead of hundreds. Graphs are captured once per batch bucket (a power of
    /// two; the rows past the batch are padding that writes and reads a block no sequence
    /// owns) and per attention split count (also rounded up to a power of two: the extra
    /// splits are empty, a block each and no reads), so a handful covers every step.
    fn run(&mut self, c: &Config, batch: &Batch, greedy: bool) -> Result<usize> {
        let rows = batch.logit_rows.len();
        let decode = is_decode_step(batch);
        let bucket = self.graph_bucket(batch, decode);
        self.mm.route(decode);
        self.upload(batch, bucket.unwrap_or(batch.tokens.len()))?;
        let splits = splits_needed(c, batch, self.partial_rows);
        let invariant = self.mm.batch_invariant;
        match (bucket, splits) {
            (Some(n), Some(needed)) => {
                let key = (n, needed.next_power_of_two(), greedy);
                if !self.graphs.contains_key(&key) {
                    let graph = self.capture(c, key)?;
                    self.graphs.insert(key, graph);
                }
                self.graphs[&key]
                    .launch()
                    .map_err(Error::driver("replaying the decode graph"))?;
            }
            _ => {
                let attention = match invariant {
                    true => Attention::PerHead,
                    false => Attention::of(c, batch, splits),
                };
                self.launch(c, batch.tokens.len(), &batch.logit_rows, attention)?;
                if greedy {
                    self.argmax_rows(c, rows)?;
                }
            }
        }
        Ok(rows)
    }

    /// The graph bucket of a decode step (`decode`: `is_decode_step(batch)`): the smallest
    /// power of two that holds its rows, or `None` for any other batch (a prompt chunk, a
    /// mix, too many sequences) or with graphs off.
    fn graph_bucket(&self, batch: &Batch, decode: bool) -> Option<usize> {
        let n = batch.tokens.len();
        (self.use_graphs && decode && n <= GRAPH_MAX_BATCH).then(|| n.next_power_of_two())
    }

    /// Records a decode step of `n` rows (padding included) with `n_splits` attention splits,
    /// and the argmax if `greedy`, as a CUDA graph.
    fn capture(&mut self, c: &Config, (n, n_splits, greedy): GraphKey) -> Result<CudaGraph> {
        let rows: Vec<u32> = (0..n as u32).collect();
        let attention = match self.mm.batch_invariant {
            true => Attention::PerHead,
            false => Attention::Split(n_splits),
        };
        let stream = self.gpu.stream.clone();
        capture_graph(&stream, "the decode graph", || {
            self.launch(c, n, &rows, attention)?;
            if greedy {
                self.argmax_rows(c, n)?;
            }
            Ok(())
        })
    }

    fn argmax_rows(&mut self, c: &Config, rows: usize) -> Result<()> {
        self.gpu.argmax_f32(
            &mut self.next_ids.slice_mut(..rows),
            &self.logits.slice(..rows * c.vocab_size),
        )
    }

    /// Copies the batch description to the device, block tables at a fixed row stride (so
    /// that a captured graph's arguments stay valid as sequences grow), padded to `rows`
    /// rows: each padding row is a sequence of its own whose one token, at position 0, lives
    /// in the spare block (`pad_block`), which no sequence owns.
    fn upload(&mut self, batch: &Batch, rows: usize) -> Result<()> {
        let n = batch.tokens.len();
        let stride = self.table_stride;
        let n_seqs = batch.block_tables.len() / batch.max_blocks.max(1);
        let pad = rows - n;
        assert!(rows <= self.max_tokens && n_seqs + pad <= MAX_SEQS && batch.max_blocks <= stride);
        self.tables_host.clear();
        for row in batch.block_tables.chunks(batch.max_blocks.max(1)) {
            self.tables_host.extend_from_slice(row);
            self.tables_host
                .resize(self.tables_host.len() + stride - row.len(), 0);
        }
        let b = &mut self.batch_host;
        b.tokens.clear();
        b.tokens.extend(&batch.tokens);
        b.positions.clear();
        b.positions.extend(&batch.positions);
        b.token_seq.clear();
        b.token_seq.extend(&batch.token_seq);
        b.slots.clear();
        b.slots.extend(&batch.slots);
        let spare = self.pad_block as u32;
        for i in 0..pad {
            b.tokens.push(0);
            b.positions.push(0);
            b.token_seq.push((n_seqs + i) as u32);
            b.slots.push(spare * BLOCK_SIZE as u32);
            self.tables_host.push(spare);
            self.tables_host
                .resize(self.tables_host.len() + stride - 1, 0);
        }
        let s = &self.gpu.stream;
        let up_err = Error::driver("copying the batch to the device");
        s.memcpy_htod(&b.tokens, &mut self.tokens.slice_mut(..rows))
            .map_err(up_err)?;
        s.memcpy_htod(&b.positions, &mut self.positions.slice_mut(..rows))
            .map_err(up_err)?;
        s.memcpy_htod(&b.token_seq, &mut self.token_seq.slice_mut(..rows))
            .map_err(up_err)?;
        s.memcpy_htod(&b.slots, &mut self.slots.slice_mut(..rows))
            .map_err(up_err)?;
        let len = self.tables_host.len();
        s.memcpy_htod(&self.tables_host, &mut self.block_tables.slice_mut(..len))
            .map_err(up_err)?;
        // The profiler's byte counts of attention need them (a no-op otherwise).
        self.gpu.note_positions(&self.batch_host.positions);
        Ok(())
    }

    /// Every kernel of the forward pass for `n` uploaded tokens, up to the logits of
    /// `logit_rows`, left on the device, attending as `attention` says: step for step
    /// `cpu::forward`, with the GPU's fusions (q, k and v in one matmul; RoPE and the cache
    /// write in one kernel; residual adds inside the output matmuls).
    fn launch(
        &mut self,
        c: &Config,
        n: usize,
        logit_rows: &[u32],
        attention: Attention,
    ) -> Result<()> {
        let (dim, q_dim, kv_dim) = (c.dim, c.q_dim(), c.kv_dim());
        let qkv_dim = q_dim + 2 * kv_dim;
        // SAFETY: every token id is inside the vocabulary: the engine and the runner check
        // ids on the host before a batch is built (padding rows use id 0).
        let (x, tokens) = (&mut self.x.slice_mut(..n * dim), &self.tokens.slice(..n));
        match &self.weights.embed {
            GpuMatrix::Bf16(table) => {
                unsafe { self.gpu.embedding_bf16(x, &table.as_view(), tokens, dim) }?
            }
            GpuMatrix::Blocks(parts) => {
                let p = &parts[0];
                let scales = p.scales.as_ref().map(|s| s.as_view());
                let table = &p.bytes.as_view();
                unsafe {
                    self.gpu.dequant_blocks(
                        p.ty,
                        None,
                        Some(x),
                        table,
                        scales.as_ref(),
                        Some(tokens),
                        n,
                        dim,
                    )
                }?
            }
        }
        for l in 0..c.n_layers {
            let (g, lw) = (&self.gpu, &self.weights.layers[l]);
            // Attention: x += o_proj(attention(rope(q), rope(k), v)) over the normed stream.
            let qkv = &mut self.qkv.slice_mut(..n * qkv_dim);
            if self.mm.rounds(n) {
                // The norm rounds its output for the tensor cores itself.
                g.rmsnorm_f32_bf16(
                    &mut self.xb.slice_mut(..n * dim),
                    &mut self.mm.x_bf16.slice_mut(..n * dim),
                    &self.x.slice(..n * dim),
                    &lw.attn_norm.as_view(),
                    c.rms_eps,
                    dim,
                )?;
                let bias = lw.bqkv.as_ref().map(|b| b.as_view());
                Self::gemm(
                    g,
                    qkv,
                    &self.xb.slice(..n * dim),
                    &mut self.mm,
                    &lw.wqkv,
                    bias.as_ref(),
                    n,
                    dim,
                    qkv_dim,
                    false,
                )?;
            } else {
                Self::norm_for_gemv(
                    g,
                    &mut self.xb.slice_mut(..n * dim),
                    &mut self.mm,
                    &self.x.slice(..n * dim),
                    &lw.attn_norm.as_view(),
                    &[&lw.wqkv],
                    c.rms_eps,
                    dim,
                )?;
                let (xb, bias) = (&self.xb.slice(..n * dim), lw.bqkv.as_ref());
                Self::matmul(
                    g,
                    qkv,
                    xb,
                    &mut self.mm,
                    &lw.wqkv,
                    bias,
                    n,
                    dim,
                    qkv_dim,
                    false,
                )?;
            }
            self.rope_and_cache_write(c, n, l)?;
            let rounded = self.attention(c, n, l, attention)?;
            let (g, lw) = (&self.gpu, &self.weights.layers[l]);
            Self::add_matmul(
                g,
                &mut self.x.slice_mut(..n * dim),
                &mut self.xb,
                &self.att.slice(..n * q_dim),
                rounded,
                &mut self.mm,
                &lw.wo,
                n,
                q_dim,
                dim,
            )?;

            // MLP: x += down(silu(gate(x)) * up(x)) over the normed stream (rounded for the
            // tensor cores by the norm, where `swiglu` takes them).
            let (xb, x) = (&mut self.xb.slice_mut(..n * dim), &self.x.slice(..n * dim));
            if self.mm.rounds(n) {
                let xb_bf16 = &mut self.mm.x_bf16.slice_mut(..n * dim);
                g.rmsnorm_f32_bf16(xb, xb_bf16, x, &lw.ffn_norm.as_view(), c.rms_eps, dim)?;
            } else {
                let (mm, norm) = (&mut self.mm, &lw.ffn_norm.as_view());
                let ws = [&lw.w_gate, &lw.w_up];
                Self::norm_for_gemv(g, xb, mm, x, norm, &ws, c.rms_eps, dim)?;
            }
            self.swiglu(c, n, l)?;
            let (g, lw) = (&self.gpu, &self.weights.layers[l]);
            // `swiglu` rounded `hidden` into `mm.x_bf16` wherever the matmul takes it so.
            let rounded = self.mm.rounds(n);
            Self::add_matmul(
                g,
                &mut self.x.slice_mut(..n * dim),
                &mut self.xb,
                &self.hidden.slice(..n * c.ffn_dim),
                rounded,
                &mut self.mm,
                &lw.w_down,
                n,
                c.ffn_dim,
                dim,
            )?;
        }
        self.head(c, logit_rows)
    }

    /// Whether the matmul of `n` tokens through `w` is the integer GEMV, whose input is
    /// the 8-bit codes alone: `n` not rounded for the tensor cores (a decode step of one
    /// token, or of up to `blocks_gemv_tokens` where every matrix is GGUF blocks), `w` all
    /// GGUF blocks. Its input's maker can then make the codes itself.
    fn gemv_takes_codes(mm: &MatmulScratch, w: &GpuMatrix, n: usize) -> bool {
        let blocks = match w {
            GpuMatrix::Blocks(parts) => parts.iter().all(|p| p.ty != BlockType::Fp8),
            GpuMatrix::Bf16(_) => false,
        };
        blocks && !mm.rounds(n) && n <= QUANT_MAX_TOKENS
    }

    /// The norm before the GEMVs of `ws` (tokens not rounded for the tensor cores): where
    /// every matrix is GGUF blocks, whose GEMV reads the input as 8-bit codes and nothing
    /// else, the norm makes the codes itself (`rmsnorm_q8_f32`, into `mm.codes`) and the
    /// matmuls take them as they are (`mm.hold_input`), leaving `xb` unwritten: one launch
    /// where the norm and `quantize_q8_f32` took two. Otherwise `xb = rmsnorm(x)`.
    #[allow(clippy::too_many_arguments)]
    fn norm_for_gemv(
        gpu: &Gpu,
        xb: &mut Out<f32>,
        mm: &mut MatmulScratch,
        x: &In<f32>,
        weight: &In<f32>,
        ws: &[&GpuMatrix],
        eps: f32,
        dim: usize,
    ) -> Result<()> {
        let n = x.len() / dim;
        if !ws.iter().all(|w| Self::gemv_takes_codes(mm, w, n)) {
            mm.hold_input = false;
            return gpu.rmsnorm_f32(xb, x, weight, eps, dim);
        }
        gpu.rmsnorm_q8_f32(
            &mut mm.codes.slice_mut(..n * dim),
            &mut mm.code_scales.slice_mut(..n * dim / 16),
            x,
            weight,
            eps,
            dim,
        )?;
        mm.hold_input = true;
        Ok(())
    }

    /// RoPE on layer `l`'s queries and keys from the fused projection's rows, the queries to
    /// `q`, the keys and values into their cache slots.
    fn rope_and_cache_write(&mut self, c: &Config, n: usize, l: usize) -> Result<()> {
        let (q_dim, qkv_dim) = (c.q_dim(), c.q_dim() + 2 * c.kv_dim());
        let layer = self.cache_layer(c, l);
        // SAFETY: positions are below the context the RoPE tables cover (the engine checks
        // every request against it); slots come from the block manager, inside the pool and
        // distinct, but for the graphs' padding rows, which write the same values into the
        // spare block's first slot.
        unsafe {
            self.gpu.qkv_rope_write_bf16(
                &mut self.q.slice_mut(..n * q_dim),
                &mut self.k_cache.slice_mut(layer.clone()),
                &mut self.v_cache.slice_mut(layer),
                &self.qkv.slice(..n * qkv_dim),
                &self.positions.slice(..n),
                &self.slots.slice(..n),
                &self.rope_cos.as_view(),
                &self.rope_sin.as_view(),
                c.n_heads,
                c.n_kv_heads,
                c.head_dim,
            )
        }
    }

    /// Layer `l`'s attention, `att = softmax(q K^T / sqrt(head_dim)) V` over each token's own
    /// sequence, with the kernels `attention` names. Returns whether `mm.x_bf16` holds `att`
    /// rounded for o_proj's tensor cores too (the split path's combine writes it).
    fn attention(&mut self, c: &Config, n: usize, l: usize, attention: Attention) -> Result<bool> {
        let (g, q_dim, head_dim) = (&self.gpu, c.q_dim(), c.head_dim);
        let layer = self.cache_layer(c, l);
        let max_blocks = self.table_stride;
        let (q, k, v) = (
            self.q.slice(..n * q_dim),
            self.k_cache.slice(layer.clone()),
            self.v_cache.slice(layer),
        );
        let (tables, token_seq, positions) = (
            self.block_tables.slice(..MAX_SEQS * max_blocks),
            self.token_seq.slice(..n),
            self.positions.slice(..n),
        );
        let out = &mut self.att.slice_mut(..n * q_dim);
        let (nh, nkv) = (c.n_heads, c.n_kv_heads);
        // SAFETY (the three attention launches): the batch was built from the block
        // manager's tables, which cover every position up to each token's own; this layer's
        // keys and values were written just before (`rope_and_cache_write`); the split count
        // covers the longest position (`splits_needed`); the tensor-core kernel is chosen
        // for one sequence's chunk only (`Attention::of`, the graphs' padding rows never take
        // it).
        match attention {
            Attention::Split(n_splits) => {
                let rows = n * nh * n_splits;
                let (partial_o, partial_ml) = (
                    &mut self.partial_o.slice_mut(..rows * head_dim),
                    &mut self.partial_ml.slice_mut(..rows * 2),
                );
                // The query heads of a KV head as the rows of one `mma` where it takes the
                // model's heads; the per-lane kernel otherwise.
                if attention_split_mma_supports(head_dim, nh, nkv, SPLIT_LEN) {
                    unsafe {
                        g.attention_split_mma_bf16(
                            partial_o, partial_ml, &q, &k, &v, &tables, &token_seq, &positions,
                            max_blocks, nh, nkv, head_dim, SPLIT_LEN,
                        )
                    }?;
                } else {
                    unsafe {
                        g.attention_split_bf16(
                            partial_o, partial_ml, &q, &k, &v, &tables, &token_seq, &positions,
                            max_blocks, nh, nkv, head_dim, SPLIT_LEN,
                        )
                    }?;
                }
                let (po, ml) = (&partial_o.as_view(), &partial_ml.as_view());
                if self.mm.rounds(n) {
                    let out_bf16 = &mut self.mm.x_bf16.slice_mut(..n * q_dim);
                    g.attention_combine_f32_bf16(
                        out, out_bf16, po, ml, &positions, SPLIT_LEN, nh, head_dim,
                    )?;
                    return Ok(true);
                }
                if Self::gemv_takes_codes(&self.mm, &self.weights.layers[l].wo, n)
                    && head_dim.is_multiple_of(32)
                {
                    // o_proj's GEMV reads codes alone: the combine makes them.
                    let (mm, len) = (&mut self.mm, n * q_dim);
                    g.attention_combine_q8_f32(
                        out,
                        &mut mm.codes.slice_mut(..len),
                        &mut mm.code_scales.slice_mut(..len / 16),
                        po,
                        ml,
                        &positions,
                        SPLIT_LEN,
                        nh,
                        head_dim,
                    )?;
                    mm.hold_input = true;
                } else {
                    g.attention_combine_f32(out, po, ml, &positions, SPLIT_LEN, nh, head_dim)?;
                }
            }
            Attention::TensorCores => unsafe {
                g.attention_mma_bf16(
                    out, &q, &k, &v, &tables, &token_seq, &positions, max_blocks, nh, nkv, head_dim,
                )
            }?,
            Attention::PerHead => unsafe {
                g.attention_bf16(
                    out, &q, &k, &v, &tables, &token_seq, &positions, max_blocks, nh, nkv, head_dim,
                )
            }?,
        }
        Ok(false)
    }

    /// Layer `l`'s `hidden = silu(xb w_gate^T) * (xb w_up^T)`: one fused GEMV for the tokens
    /// of a pass not rounded for the tensor cores (a token over bf16 or fp8, up to
    /// `blocks_gemv_tokens` over gate and up of one GGUF type); otherwise the two matmuls, on
    /// the input the norm rounded into `mm.x_bf16` where the pass rounds, then the SwiGLU
    /// kernel, which leaves `hidden` rounded there for the down projection.
    fn swiglu(&mut self, c: &Config, n: usize, l: usize) -> Result<()> {
        let (g, lw) = (&self.gpu, &self.weights.layers[l]);
        let (dim, ffn) = (c.dim, c.ffn_dim);
        // The norm made the input's codes (`norm_for_gemv`), for gate and up both.
        let normed_codes = std::mem::take(&mut self.mm.hold_input);
        let f32_input = !self.mm.rounds(n);
        let hidden = &mut self.hidden.slice_mut(..n * ffn);
        if f32_input
            && n == 1
            && let (Some(w_gate), Some(w_up)) = (lw.w_gate.as_bf16(), lw.w_up.as_bf16())
        {
            return g.gemv_swiglu_bf16(
                hidden,
                &self.xb.slice(..dim),
                &w_gate.as_view(),
                &w_up.as_view(),
                dim,
                ffn,
            );
        }
        let xb = &self.xb.slice(..n * dim);
        if f32_input
            && let (GpuMatrix::Blocks(gate), GpuMatrix::Blocks(up)) = (&lw.w_gate, &lw.w_up)
            && let ([gate], [up]) = (gate.as_slice(), up.as_slice())
            && gate.ty == up.ty
            && gate.ty != BlockType::Fp8
        {
            // One GGUF type for both: one launch for gate, up and the SwiGLU, on the
            // input's codes.
            let (codes, scales) = (
                &mut self.mm.codes.slice_mut(..n * dim),
                &mut self.mm.code_scales.slice_mut(..n * dim / 16),
            );
            if !normed_codes {
                g.quantize_q8_f32(codes, scales, xb, n * dim)?;
            }
            return g.gemv_swiglu_codes(
                gate.ty,
                hidden,
                &self.mm.codes.slice(..n * dim),
                &self.mm.code_scales.slice(..n * dim / 16),
                &gate.bytes.as_view(),
                &up.bytes.as_view(),
                n,
                dim,
                ffn,
                ffn,
            );
        }
        if f32_input
            && let (Some(gate), Some(up)) = (lw.w_gate.as_fp8(), lw.w_up.as_fp8())
            && let (Some(gate_scales), Some(up_scales)) = (&gate.scales, &up.scales)
        {
            // fp8 gate and up: one launch for both and the SwiGLU.
            return g.gemv_swiglu_fp8(
                hidden,
                xb,
                &gate.bytes.as_view(),
                &up.bytes.as_view(),
                &gate_scales.as_view(),
                &up_scales.as_view(),
                n,
                dim,
                ffn,
                ffn,
            );
        }
        self.mm.input_made = false;
        for (i, (out, w)) in [(&mut self.gate, &lw.w_gate), (&mut self.up, &lw.w_up)]
            .into_iter()
            .enumerate()
        {
            let out = &mut out.slice_mut(..n * ffn);
            // Up reads the codes (or e4m3) gate's quantized matmul made of the same input.
            self.mm.hold_input = normed_codes || (i == 1 && self.mm.input_made);
            if f32_input {
                Self::matmul(g, out, xb, &mut self.mm, w, None, n, dim, ffn, false)?;
            } else {
                Self::gemm(g, out, xb, &mut self.mm, w, None, n, dim, ffn, false)?;
            }
        }
        self.mm.hold_input = false;
        if f32_input {
            // Quantized gate and up on f32 activations: no bf16 copy for the down GEMV.
            return g.swiglu_f32(
                hidden,
                &self.gate.slice(..n * ffn),
                &self.up.slice(..n * ffn),
            );
        }
        // The down projection's input, rounded for its tensor cores by the same launch (the
        // gate and up matmuls are done with `mm.x_bf16`).
        g.swiglu_f32_bf16(
            hidden,
            &mut self.mm.x_bf16.slice_mut(..n * ffn),
            &self.gate.slice(..n * ffn),
            &self.up.slice(..n * ffn),
        )
    }

    /// The final norm and the output head, for the rows that need logits only: one norm
    /// launch per run of consecutive rows (a decode step's rows are one run).
    fn head(&mut self, c: &Config, logit_rows: &[u32]) -> Result<()> {
        let (g, w, dim) = (&self.gpu, &self.weights, c.dim);
        let head = w.lm_head.as_ref().unwrap_or(&w.embed);
        let rows = logit_rows.len();
        let first = logit_rows.first().map_or(0, |&r| r as usize);
        let one_run = logit_rows
            .iter()
            .zip(first..)
            .all(|(&r, i)| r as usize == i);
        let gemv_norm = rows > 0 && one_run && (rows == 1 || !self.mm.rounds(rows));
        if gemv_norm {
            // A decode step's rows, where the head's GEMV takes them all: over GGUF blocks
            // the norm makes the GEMV's codes.
            let x = &self.x.slice(first * dim..(first + rows) * dim);
            let (xb, norm) = (
                &mut self.head_in.slice_mut(..rows * dim),
                &w.final_norm.as_view(),
            );
            Self::norm_for_gemv(g, xb, &mut self.mm, x, norm, &[head], c.rms_eps, dim)?;
        }
        let mut i = 0;
        while !gemv_norm && i < rows {
            let first = logit_rows[i] as usize;
            let mut len = 1;
            while i + len < rows && logit_rows[i + len] as usize == first + len {
                len += 1;
            }
            g.rmsnorm_f32(
                &mut self.head_in.slice_mut(i * dim..(i + len) * dim),
                &self.x.slice(first * dim..(first + len) * dim),
                &w.final_norm.as_view(),
                c.rms_eps,
                dim,
            )?;
            i += len;
        }
        Self::matmul(
            g,
            &mut self.logits.slice_mut(..rows * c.vocab_size),
            &self.head_in.slice(..rows * dim),
            &mut self.mm,
            head,
            None,
            rows,
            dim,
            c.vocab_size,
            false,
        )
    }

    /// Layer `l`'s part of the cache: `[n_blocks + 1, BLOCK_SIZE, kv_dim]` of each pool.
    fn cache_layer(&self, c: &Config, l: usize) -> std::ops::Range<usize> {
        let layer_len = self.k_cache.len() / c.n_layers;
        l * layer_len..(l + 1) * layer_len
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
            kind(Attention::of(c, b, splits_needed(c, b, MIN_PARTIAL_ROWS)))
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
        // Chunks of two sequences: the split kernels while their scratch holds them, else
        // the per-head kernel.
        assert_eq!(of(&c, &batch(0, 128, &[0, 1])), "split");
        assert_eq!(of(&c, &batch(1024, 128, &[0, 1])), "per head");
        // Heads the tensor-core kernel does not take.
        c.head_dim = 96;
        assert_eq!(of(&c, &batch(1024, 256, &[0])), "per head");
    }
}
