//! The model's weights on the device: uploaded from a loaded model (matrices as
//! `WeightFormat` says, norms and biases in f32) or made at random in a named shape for the
//! benchmarks, and what they weigh.

use cudarc::driver::CudaSlice;

use super::attend::GRAPH_MAX_BATCH;
use super::context::Gpu;
use super::matmul::MatmulScratch;
use super::matrix::{
    GpuMatrix, MatrixData, Piece, Synthetic, Uploader, WeightFormat, random_matrix,
};
use crate::config::{Config, Moe};
use crate::error::Result;
use crate::model::{Experts, Mlp, ModelWeights};
use crate::tiles::{WGMMA_BM, WGMMA_WIDTHS};
use crate::weights::blocks::BlockType;

/// One decoder layer's weights.
pub struct GpuLayer {
    pub attn_norm: CudaSlice<f32>,    // [dim]
    pub wqkv: GpuMatrix,              // [q_dim + 2 kv_dim, dim]: q, k, v stacked, one matmul
    pub bqkv: Option<CudaSlice<f32>>, // [q_dim + 2 kv_dim] (Qwen2)
    /// `[head_dim]` each: the norms of every query and key head (Qwen3).
    pub qk_norm: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    pub wo: GpuMatrix,            // [dim, q_dim]
    pub ffn_norm: CudaSlice<f32>, // [dim]
    /// `[dim]` each: the norms of the attention's and the MLP's outputs before their adds
    /// (Gemma 3).
    pub post_norms: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    pub mlp: LayerMlp,
}

/// A SwiGLU (or GeGLU) MLP's three matrices: a dense layer's, or one expert's.
pub struct GpuMlp {
    pub gate: GpuMatrix, // [ffn_dim, dim]
    pub up: GpuMatrix,   // [ffn_dim, dim]
    pub down: GpuMatrix, // [dim, ffn_dim]
}

impl GpuMlp {
    pub fn matrices(&self) -> [&GpuMatrix; 3] {
        [&self.gate, &self.up, &self.down]
    }
}

/// A layer's mixture of experts on the device.
pub struct GpuExperts {
    pub moe: Moe,
    /// `[n_experts, dim]`, bf16 whatever the experts' format: the routing's choices are
    /// worth the precision, and the matrix is small.
    pub router: GpuMatrix,
    pub experts: ExpertWeights,
}

/// A layer's experts' matrices on the device.
pub enum ExpertWeights {
    /// Every expert's gate, up and down stacked into one matrix each (`[n_experts *
    /// expert_ffn_dim, dim]`, and `[n_experts * dim, expert_ffn_dim]` for down), in bf16 or
    /// one GGUF type: routed on the device and multiplied by the grouped GEMVs
    /// (`gpu::experts`), with no wait on the host.
    Stacked(GpuMlp),
    /// `[n_experts]` MLPs, each `expert_ffn_dim` wide, routed on the host: the formats the
    /// grouped GEMVs do not read (fp8, an expert of several types).
    Each(Vec<GpuMlp>),
}

impl ExpertWeights {
    /// Every matrix of the layer's experts.
    pub fn matrices(&self) -> Vec<&GpuMatrix> {
        match self {
            ExpertWeights::Stacked(m) => m.matrices().to_vec(),
            ExpertWeights::Each(all) => all.iter().flat_map(GpuMlp::matrices).collect(),
        }
    }
}

/// Whether a layer's stacked experts (`m`, its matrices `dim` and `ffn` wide) are ones the
/// grouped GEMVs read: bf16 through and through, or each matrix one GGUF type (gate and up
/// the same) whose rows hold an even number of groups of 32 (each pair's scales then start
/// 16-byte aligned).
pub fn grouped_reads(m: &GpuMlp) -> bool {
    let one_type = |w: &GpuMatrix| match &w.data {
        MatrixData::Bf16(_) => Some(None),
        MatrixData::Blocks(parts) => match parts.as_slice() {
            [p] if p.ty != BlockType::Fp8 && w.n_in.is_multiple_of(64) => Some(Some(p.ty)),
            _ => None,
        },
    };
    match m.matrices().map(one_type) {
        [Some(None), Some(None), Some(None)] => true,
        [Some(Some(g)), Some(Some(u)), Some(Some(_))] => g == u,
        _ => false,
    }
}

/// A layer's MLP on the device: one, or a mixture of experts.
pub enum LayerMlp {
    Dense(GpuMlp),
    Experts(GpuExperts),
}

impl GpuLayer {
    /// The layer's matrices, every expert's included (the experts' router, bf16 whatever
    /// the others are, aside).
    fn matrices(&self) -> Vec<&GpuMatrix> {
        let mut m = vec![&self.wqkv, &self.wo];
        match &self.mlp {
            LayerMlp::Dense(d) => m.extend(d.matrices()),
            LayerMlp::Experts(e) => m.extend(e.experts.matrices()),
        }
        m
    }

    /// The matrices the matmuls' plans multiply: every one but stacked experts, which only
    /// the grouped GEMVs read (never dequantized for a prompt, never a dense GEMV's).
    fn planned(&self) -> Vec<&GpuMatrix> {
        let mut m = vec![&self.wqkv, &self.wo];
        match &self.mlp {
            LayerMlp::Dense(d) => m.extend(d.matrices()),
            LayerMlp::Experts(e) => match &e.experts {
                ExpertWeights::Each(_) => m.extend(e.experts.matrices()),
                ExpertWeights::Stacked(_) => {}
            },
        }
        m
    }

    /// Whether the layer's experts are routed on the host (`ExpertWeights::Each`).
    fn routes_on_host(&self) -> bool {
        matches!(&self.mlp, LayerMlp::Experts(e) if matches!(e.experts, ExpertWeights::Each(_)))
    }

    /// The router's bytes, where the layer has experts.
    fn router_bytes(&self) -> usize {
        match &self.mlp {
            LayerMlp::Dense(_) => 0,
            LayerMlp::Experts(e) => e.router.bytes(),
        }
    }

    /// Bytes a step of `n_tokens` tokens reads of the layer: a mixture of experts reads its
    /// router and the experts its tokens chose, not all of them: one token's `top_k`, and
    /// for more tokens the share of experts that some token chooses where each picks its
    /// `top_k` evenly at random, `1 - (1 - top_k / n_experts)^n_tokens` (about 98% of
    /// Qwen3-30B-A3B's 128 at 64 tokens).
    fn bytes_per_step(&self, n_tokens: usize) -> usize {
        let LayerMlp::Experts(e) = &self.mlp else {
            return self.bytes();
        };
        let experts: usize = e.experts.matrices().iter().map(|m| m.bytes()).sum();
        let (k, n) = (e.moe.top_k, e.moe.n_experts);
        let chosen = match n_tokens {
            1 => experts * k / n,
            _ => {
                let missed = (1.0 - k as f64 / n as f64).powi(n_tokens.min(1 << 20) as i32);
                (experts as f64 * (1.0 - missed)) as usize
            }
        };
        self.bytes() - experts + chosen
    }

    /// Bytes of the layer's matrices, norms and bias on the device.
    fn bytes(&self) -> usize {
        let vectors = self.attn_norm.len()
            + self.ffn_norm.len()
            + self
                .post_norms
                .as_ref()
                .map_or(0, |(a, f)| a.len() + f.len())
            + self.bqkv.as_ref().map_or(0, |b| b.len())
            + self.qk_norm.as_ref().map_or(0, |(q, k)| q.len() + k.len());
        self.matrices().iter().map(|m| m.bytes()).sum::<usize>() + self.router_bytes() + 4 * vectors
    }
}

/// An MLP's gate, up and down (`[ffn, dim]`, `[ffn, dim]`, `[dim, ffn]`) under `prefix`
/// (`model.layers.L.mlp`, or `...mlp.experts.E`): the names the stored blocks go by.
fn mlp_of(
    up: &mut Uploader,
    prefix: &str,
    [gate, w_up, down]: [&Vec<f32>; 3],
    ffn: usize,
) -> Result<GpuMlp> {
    let dim = gate.len() / ffn;
    let name = |s: &str| format!("{prefix}.{s}.weight");
    Ok(GpuMlp {
        gate: up.matrix(&one(name("gate_proj"), gate), dim, &name("gate_proj"))?,
        up: up.matrix(&one(name("up_proj"), w_up), dim, &name("up_proj"))?,
        down: up.matrix(&one(name("down_proj"), down), ffn, &name("down_proj"))?,
    })
}

/// A layer's experts under `prefix` (`model.layers.L.mlp.experts`): stacked where the
/// grouped GEMVs read them (`grouped_reads`), else one MLP each.
fn experts_of(up: &mut Uploader, prefix: &str, e: &Experts<Vec<f32>>) -> Result<ExpertWeights> {
    let f = e.moe.expert_ffn_dim;
    let dim = e.router.len() / e.moe.n_experts;
    if up.format != WeightFormat::Fp8 {
        let mut stack = |part: &str, all: &[Vec<f32>], n_in: usize| {
            let pieces: Vec<Piece> = all
                .iter()
                .enumerate()
                .map(|(i, values)| Piece {
                    name: format!("{prefix}.{i}.{part}.weight"),
                    values,
                    heads: None,
                })
                .collect();
            up.matrix(&pieces, n_in, &format!("{prefix}.{part} (stacked)"))
        };
        let stacked = GpuMlp {
            gate: stack("gate_proj", &e.gate, dim)?,
            up: stack("up_proj", &e.up, dim)?,
            down: stack("down_proj", &e.down, f)?,
        };
        if grouped_reads(&stacked) {
            return Ok(ExpertWeights::Stacked(stacked));
        }
    }
    let mut each = vec![];
    for (i, ((gate, w_up), down)) in e.gate.iter().zip(&e.up).zip(&e.down).enumerate() {
        each.push(mlp_of(up, &format!("{prefix}.{i}"), [gate, w_up, down], f)?);
    }
    Ok(ExpertWeights::Each(each))
}

/// `values` (`[rows, n_in]`) in bf16 whatever the upload's format.
fn bf16_matrix(gpu: &Gpu, values: &[f32], n_in: usize, what: &str) -> Result<GpuMatrix> {
    Ok(GpuMatrix {
        n_out: values.len() / n_in,
        n_in,
        data: MatrixData::Bf16(gpu.upload(&super::matrix::to_bf16(values), what)?),
    })
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
    pub embed: GpuMatrix, // [vocab, dim]
    pub layers: Vec<GpuLayer>,
    pub final_norm: CudaSlice<f32>, // [dim]
    pub lm_head: Option<GpuMatrix>, // [vocab, dim]; None: tied to `embed`
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
            let name = |s: &str| format!("model.layers.{l}.{s}");
            let bqkv = match (&lw.bq, &lw.bk, &lw.bv) {
                (Some(q), Some(k), Some(v)) => {
                    Some(f32s(&[q.as_slice(), k, v].concat(), &what("qkv bias"))?)
                }
                _ => None,
            };
            let qk_norm = match (&lw.q_norm, &lw.k_norm) {
                (Some(q), Some(k)) => Some((f32s(q, &what("q_norm"))?, f32s(k, &what("k_norm"))?)),
                _ => None,
            };
            let post_norms = match (&lw.post_attn_norm, &lw.post_ffn_norm) {
                (Some(a), Some(f)) => Some((
                    f32s(a, &what("post_attention_norm"))?,
                    f32s(f, &what("post_feedforward_norm"))?,
                )),
                _ => None,
            };
            let qkv = [
                Piece {
                    name: name("self_attn.q_proj.weight"),
                    values: &lw.wq,
                    heads: Some(c.n_heads),
                },
                Piece {
                    name: name("self_attn.k_proj.weight"),
                    values: &lw.wk,
                    heads: Some(c.n_kv_heads),
                },
                Piece {
                    name: name("self_attn.v_proj.weight"),
                    values: &lw.wv,
                    heads: None,
                },
            ];
            layers.push(GpuLayer {
                attn_norm: f32s(&lw.attn_norm, &what("attn_norm"))?,
                wqkv: up.matrix(&qkv, dim, &what("qkv_proj"))?,
                bqkv,
                qk_norm,
                wo: up.matrix(
                    &one(name("self_attn.o_proj.weight"), &lw.wo),
                    q_dim,
                    &what("o_proj"),
                )?,
                ffn_norm: f32s(&lw.ffn_norm, &what("ffn_norm"))?,
                post_norms,
                mlp: match &lw.mlp {
                    Mlp::Dense {
                        gate,
                        up: w_up,
                        down,
                    } => LayerMlp::Dense(mlp_of(&mut up, &name("mlp"), [gate, w_up, down], ffn)?),
                    Mlp::Experts(e) => {
                        let experts = experts_of(&mut up, &name("mlp.experts"), e)?;
                        LayerMlp::Experts(GpuExperts {
                            moe: e.moe,
                            router: bf16_matrix(gpu, &e.router, dim, &what("router"))?,
                            experts,
                        })
                    }
                },
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
                return Ok(GpuMatrix {
                    n_out: rows,
                    n_in: cols,
                    data: MatrixData::Bf16(m),
                });
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
                    let MatrixData::Blocks(p) = matrix(t, rows, dim, &what)?.data else {
                        unreachable!("mixed types are all blocks")
                    };
                    parts.extend(p);
                }
                GpuMatrix {
                    n_out: q + 2 * kv,
                    n_in: dim,
                    data: MatrixData::Blocks(parts),
                }
            };
            layers.push(GpuLayer {
                attn_norm: gpu.upload(&ones, &what)?,
                wqkv,
                bqkv: if c.qkv_bias {
                    Some(gpu.zeros(q + 2 * kv, &what)?)
                } else {
                    None
                },
                qk_norm: match c.qk_norm {
                    true => Some((
                        gpu.upload(&vec![1.0f32; c.head_dim], &what)?,
                        gpu.upload(&vec![1.0f32; c.head_dim], &what)?,
                    )),
                    false => None,
                },
                wo: matrix(ty, dim, q, &what)?,
                ffn_norm: gpu.upload(&ones, &what)?,
                post_norms: match c.post_norms {
                    true => Some((gpu.upload(&ones, &what)?, gpu.upload(&ones, &what)?)),
                    false => None,
                },
                mlp: match c.moe {
                    None => LayerMlp::Dense(GpuMlp {
                        gate: matrix(ty, ffn, dim, &what)?,
                        up: matrix(ty, ffn, dim, &what)?,
                        down: matrix(wider, dim, ffn, &what)?,
                    }),
                    Some(moe) => {
                        let (f, n) = (moe.expert_ffn_dim, moe.n_experts);
                        // Stacked where the grouped GEMVs read the types (not fp8).
                        let stacked = GpuMlp {
                            gate: matrix(ty, n * f, dim, &what)?,
                            up: matrix(ty, n * f, dim, &what)?,
                            down: matrix(wider, n * dim, f, &what)?,
                        };
                        let experts = if grouped_reads(&stacked) {
                            ExpertWeights::Stacked(stacked)
                        } else {
                            drop(stacked);
                            let mut each = vec![];
                            for _ in 0..n {
                                each.push(GpuMlp {
                                    gate: matrix(ty, f, dim, &what)?,
                                    up: matrix(ty, f, dim, &what)?,
                                    down: matrix(wider, dim, f, &what)?,
                                });
                            }
                            ExpertWeights::Each(each)
                        };
                        LayerMlp::Experts(GpuExperts {
                            moe,
                            router: matrix(None, moe.n_experts, dim, &what)?,
                            experts,
                        })
                    }
                },
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
        self.bytes_per_step(c, 1)
    }

    /// Bytes a step of `n_tokens` tokens must read from the weights: as `bytes_per_token`,
    /// with the experts its tokens are likely to choose (`GpuLayer::bytes_per_step`).
    pub fn bytes_per_step(&self, c: &Config, n_tokens: usize) -> usize {
        let layer: usize = self.layers.iter().map(|l| l.bytes_per_step(n_tokens)).sum();
        let head = self.head().bytes();
        let embed_row = match &self.lm_head {
            Some(_) => self.embed.bytes() / c.vocab_size,
            None => 0,
        };
        layer + head + embed_row + 4 * c.dim
    }

    /// Bytes of every matrix and vector on the device.
    pub fn bytes(&self) -> usize {
        let layers: usize = self.layers.iter().map(GpuLayer::bytes).sum();
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
        let routers = self.layers.iter().filter_map(|l| match &l.mlp {
            LayerMlp::Experts(e) => Some(&e.router),
            LayerMlp::Dense(_) => None,
        });
        let matrices = self
            .layers
            .iter()
            .flat_map(|l| l.matrices())
            .chain(routers)
            .chain([&self.embed])
            .chain(self.lm_head.as_ref());
        for m in matrices {
            match &m.data {
                MatrixData::Bf16(w) => add("bf16".into(), 2 * w.len()),
                MatrixData::Blocks(parts) => {
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

    /// Whether some layer's experts are routed on the host (`gpu::experts`): a step then
    /// waits on the host between layers, and no CUDA graph holds it.
    pub fn routes_on_host(&self) -> bool {
        self.layers.iter().any(GpuLayer::routes_on_host)
    }

    /// Whether some layer matrix is fp8 (`--weights fp8`).
    pub fn has_fp8(&self) -> bool {
        self.layers
            .iter()
            .flat_map(|l| l.planned())
            .any(|m| m.as_fp8().is_some())
    }

    /// The largest layer matrix held in blocks, in elements (0 if none): the size of the
    /// bf16 scratch a prompt's matmul dequantizes it into. With `fp8_cores` (the GPU has
    /// `gemm_wgmma_fp8`) fp8 matrices need none: they go to the tensor cores as they are.
    pub fn largest_blocks_matrix(&self, fp8_cores: bool) -> usize {
        self.layers
            .iter()
            .flat_map(|l| l.planned())
            .filter(|m| m.as_bf16().is_none() && !(fp8_cores && m.as_fp8().is_some()))
            .map(|m| m.n_out * m.n_in)
            .max()
            .unwrap_or(0)
    }

    /// Whether every layer matrix and the output head are GGUF blocks (no fp8 rows, no bf16
    /// fallback), whose GEMV reads its input as 8-bit codes alone.
    pub fn all_codes(&self) -> bool {
        self.head().is_gguf()
            && self
                .layers
                .iter()
                .flat_map(|l| l.planned())
                .all(GpuMatrix::is_gguf)
    }

    /// Whether some layer matrix is held in GGUF blocks (fp8 rows aside: they take neither
    /// `gemm_<type>` nor `gemm_wgmma_<type>`).
    pub fn has_blocks(&self) -> bool {
        self.layers
            .iter()
            .flat_map(|l| l.planned())
            .any(GpuMatrix::is_gguf)
    }

    /// The block types of the layer matrices and the output head held in blocks, each once.
    pub fn block_types(&self) -> Vec<BlockType> {
        let mut types = vec![];
        let matrices = self.layers.iter().flat_map(|l| l.planned());
        for m in matrices.chain([self.head()]) {
            if let MatrixData::Blocks(parts) = &m.data {
                for p in parts {
                    if !types.contains(&p.ty) {
                        types.push(p.ty);
                    }
                }
            }
        }
        types
    }

    /// The output head: its own matrix, or the embedding it is tied to.
    pub fn head(&self) -> &GpuMatrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Makes the map of every matrix the warpgroup GEMMs may multiply in a decode step a
    /// CUDA graph captures: the weights in boxes of each tile width the GEMM runs
    /// (`WGMMA_WIDTHS`), the bf16 weights, the fp8 ones, and the bf16 scratch that a GGUF
    /// matrix is dequantized into (`scratch.w_bf16`), at each such matrix's shape; the
    /// activations' scratch (`scratch.x_bf16`, `x_fp8`) at each input width and each graph
    /// bucket of rows (`GRAPH_MAX_BATCH`), in boxes of `WGMMA_BM` rows. Nothing on a GPU
    /// without the warpgroup GEMM.
    pub fn make_tensor_maps(&self, gpu: &Gpu, scratch: &MatmulScratch) -> Result<()> {
        if !gpu.has_wgmma() {
            return Ok(());
        }
        let dequantized = scratch.w_bf16.as_ref();
        let buckets = (0..=GRAPH_MAX_BATCH.ilog2()).map(|p| 1usize << p);
        let mut widths: Vec<usize> = self.planned_matrices().map(|m| m.n_in).collect();
        widths.sort_unstable();
        widths.dedup();
        for n_in in widths {
            for rows in buckets.clone() {
                if rows * n_in <= scratch.x_bf16.len() {
                    let x = scratch.x_bf16.slice(..rows * n_in);
                    gpu.matrix_map(&x, rows, n_in, WGMMA_BM)?;
                }
                if let Some((codes, _)) = scratch
                    .x_fp8
                    .as_ref()
                    .filter(|(c, _)| rows * n_in <= c.len())
                {
                    gpu.matrix_map(&codes.slice(..rows * n_in), rows, n_in, WGMMA_BM)?;
                }
            }
        }
        for m in self.planned_matrices() {
            for &tile in &WGMMA_WIDTHS {
                if let Some(w) = m.as_bf16() {
                    gpu.matrix_map(&w.as_view(), m.n_out, m.n_in, tile)?;
                } else if let Some(fp8) = m.as_fp8().filter(|_| gpu.has_wgmma_fp8()) {
                    gpu.matrix_map(&fp8.bytes.as_view(), m.n_out, m.n_in, tile)?;
                } else if let Some(scratch) = dequantized.filter(|s| m.n_out * m.n_in <= s.len()) {
                    // A matrix of blocks larger than the scratch (a GGUF file's output head)
                    // never takes the bf16 GEMM: its plan keeps the quantized GEMV.
                    let w = scratch.slice(..m.n_out * m.n_in);
                    gpu.matrix_map(&w, m.n_out, m.n_in, tile)?;
                }
            }
        }
        Ok(())
    }

    /// The distinct `(n_in, n_out)` of the layers' matrices: what the warpgroup GEMM's plans
    /// are measured on (`gemm_tuning`; the output head, read once a step, keeps the
    /// estimate).
    pub fn layer_shapes(&self) -> Vec<(usize, usize)> {
        let mut shapes: Vec<(usize, usize)> = self
            .layers
            .iter()
            .flat_map(|l| l.planned())
            .map(|m| (m.n_in, m.n_out))
            .collect();
        shapes.sort_unstable();
        shapes.dedup();
        shapes
    }

    /// Every matrix the matmuls' plans multiply: the layers' (`GpuLayer::planned`) and the
    /// output head.
    pub fn planned_matrices(&self) -> impl Iterator<Item = &GpuMatrix> {
        self.layers
            .iter()
            .flat_map(|l| l.planned())
            .chain([self.head()])
    }
}
