//! The model on the GPU: its weights (`weights.rs`), a bf16 paged KV cache (`kv_pool.rs`),
//! activations for `max_tokens` tokens allocated once, and the forward pass, step for step
//! the CPU's (`cpu::forward`), with the GPU's fusions: q, k and v in one matmul followed by
//! one RoPE-and-cache-write kernel; the residual adds inside the output matmuls; gate, up and
//! SwiGLU in one kernel where one takes them; attention split over the context
//! (flash-decoding); a mixture of experts routed on the host (`experts.rs`). Each matmul follows its plan (`plan.rs`), and the kernel before it makes
//! its input in the form the plan reads. A decode step replays a CUDA graph (`graphs.rs`);
//! greedy decoding's argmax and sampling run on the device (`sampling.rs`).

use cudarc::driver::{CudaGraph, CudaSlice};

use super::attend::{Attention, PagedKv, SplitPlan, SplitScratch, splits_needed};
use super::batch::{DeviceBatch, MAX_SEQS};
use super::context::{Gpu, capture_graph};
use super::experts::{ExpertScratch, ExpertStep};
use super::gemm_tuning;
use super::graphs::{GraphKey, Graphs, is_decode_step};
use super::kernels::gemm_blocks::blocks_mma_splits;
use super::kernels::gemm_skinny::{SKINNY_MAX_TOKENS, skinny_splits};
use super::kv_pool::{KvLayer, KvLayerMut, KvPool};
use super::matmul::{Held, Input, MatmulScratch};
use super::plan::{Caps, Rules};
use super::sampling::DeviceSampler;
use super::step_clock::{Span, StepClock};
use super::steps::{BlockOut, GateUp, Mlp, add_output, copy_for, embed, rmsnorm, swiglu};
use super::weights::{GpuWeights, LayerMlp};
use crate::batch::Batch;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::kernel_args::{Heads, NormedQkv};
use crate::kv::block_manager::blocks_for;
use crate::kv::dtype::KvDtype;
use crate::rope::RopeTables;
use crate::tiles::{BLOCKS_MMA_MAX_TOKENS, MAX_HEAD_DIM, QUANT_MAX_TOKENS};

/// Whether the GPU kernels can run this model: the GEMV reads 8 weights at a time, so every
/// matrix's input width must be a multiple of 8, and a head must fit the attention kernels.
pub fn check_supported(c: &Config) -> Result<()> {
    let unsupported = |what: String| {
        Err(Error::Unsupported(format!(
            "{what}; run this model with --device cpu"
        )))
    };
    // The experts' step adds their sum straight to the stream (`experts::experts`); no model
    // rustle reads has both.
    if c.moe.is_some() && c.post_norms {
        return unsupported("a mixture of experts with a norm after the MLP".into());
    }
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

/// Activations for up to `max_tokens` tokens in one pass, `[max_tokens, width]` each.
struct Activations {
    x: CudaSlice<f32>,      // [.., dim] the residual stream
    xb: CudaSlice<f32>,     // [.., dim] a block's normed input, or an output before its add
    qkv: CudaSlice<f32>,    // [.., q_dim + 2 kv_dim]
    q: CudaSlice<f32>,      // [.., q_dim] rotated queries
    att: CudaSlice<f32>,    // [.., q_dim] attention output
    gate: CudaSlice<f32>,   // [.., ffn_dim]
    up: CudaSlice<f32>,     // [.., ffn_dim]
    hidden: CudaSlice<f32>, // [.., ffn_dim] act(gate) * up
    /// `[.., dim]` a block's output normed before its add (Gemma 3's post-norms); one row
    /// for models without them.
    post: CudaSlice<f32>,
    head_in: CudaSlice<f32>, // [.., dim] final-normed rows whose logits are wanted
    logits: CudaSlice<f32>,  // [.., vocab]
    next_ids: CudaSlice<u32>, // [max_tokens] the token chosen for each logits row
}

impl Activations {
    fn new(gpu: &Gpu, c: &Config, max_tokens: usize) -> Result<Activations> {
        let act = |width: usize| gpu.zeros::<f32>(max_tokens * width, "activations");
        Ok(Activations {
            x: act(c.dim)?,
            xb: act(c.dim)?,
            qkv: act(c.q_dim() + 2 * c.kv_dim())?,
            q: act(c.q_dim())?,
            att: act(c.q_dim())?,
            gate: act(mlp_width(c))?,
            up: act(mlp_width(c))?,
            hidden: act(mlp_width(c))?,
            post: match c.post_norms {
                true => act(c.dim)?,
                false => gpu.zeros(1, "activations")?,
            },
            head_in: act(c.dim)?,
            logits: act(c.vocab_size)?,
            next_ids: gpu.zeros(max_tokens, "the batch")?,
        })
    }
}

/// The widest MLP hidden layer of `c`: the dense one's, or an expert's.
fn mlp_width(c: &Config) -> usize {
    c.moe.map_or(c.ffn_dim, |m| m.expert_ffn_dim.max(c.ffn_dim))
}

/// What one pass decides before its first launch.
#[derive(Clone, Copy, Debug)]
struct Pass {
    rules: Rules,
    attention: Attention,
    /// Ends in the argmax of each logits row.
    greedy: bool,
}

pub struct GpuBackend {
    pub gpu: Gpu,
    pub weights: GpuWeights,
    pub kv: KvPool,
    rope_cos: CudaSlice<f32>, // [max_pos, head_dim / 2]
    rope_sin: CudaSlice<f32>, // [max_pos, head_dim / 2]
    /// The local layers' (cos, sin) tables, where they have their own (Gemma 3).
    rope_local: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    act: Activations,
    mm: MatmulScratch,
    /// What the matmul plans may choose from on this GPU, for this model.
    caps: Caps,
    splits: SplitScratch,
    /// A mixture of experts' buffers, where the model has one.
    experts: Option<ExpertScratch>,
    batch: DeviceBatch,
    sampler: DeviceSampler,
    pub graphs: Graphs,
    /// Every matmul and attention through kernels whose sums for a token do not depend on
    /// the other tokens of the pass (`set_batch_invariant`).
    batch_invariant: bool,
    /// Every matrix is GGUF blocks (`GpuWeights::all_codes`, `Rules::all_codes`).
    all_codes: bool,
    /// Some layer's experts are routed on the host (`GpuWeights::routes_on_host`): no step
    /// is a CUDA graph.
    host_routing: bool,
    /// Most tokens of a decode step the integer GEMV takes (`Gpu::decode_gemv_tokens`).
    decode_gemv_tokens: usize,
    /// `Gpu::gemv_mma_tokens` outside the batch-invariant mode.
    gemv_mma_tokens: usize,
    logits_host: Vec<f32>,
    ids_host: Vec<u32>,
    /// Each pass's span on the GPU's clock, while asked for (`clock_steps`).
    clock: Option<StepClock>,
}

impl GpuBackend {
    /// Allocates activations for `max_tokens` tokens and a KV pool of `kv_blocks` blocks, or
    /// by default of most of the free memory (up to what `MAX_SEQS` full contexts need).
    /// RoPE tables come later (`set_rope`): their length depends on the pool's size.
    pub fn new(
        gpu: Gpu,
        c: &Config,
        weights: GpuWeights,
        kv: (Option<usize>, KvDtype),
        max_tokens: usize,
    ) -> Result<GpuBackend> {
        check_supported(c)?;
        // Before the KV pool takes most of the free memory: the timing needs copies of the
        // largest matrix.
        gemm_tuning::tune(&gpu, &weights.layer_shapes(), max_tokens);
        gpu.release_freed()?;
        let kv = KvPool::new(&gpu, c, kv, MAX_SEQS)?;
        let max_blocks = blocks_for(c.max_seq_len).min(kv.n_blocks);
        let fp8_cores = gpu.has_wgmma_fp8() && weights.has_fp8();
        let caps = Caps {
            wgmma: gpu.has_wgmma(),
            fp8_cores,
            wgmma_blocks: gpu.wgmma_block_types(),
            sm_count: gpu.sm_count,
            slots: gpu.gemm_slots,
            tuned: gpu.tuned_plans.clone(),
            dequant_room: weights.largest_blocks_matrix(gpu.has_wgmma_fp8()),
        };
        let mm = matmul_scratch(&gpu, c, &caps, max_tokens, weights.has_blocks())?;
        // Before any graph captures a launch that names one.
        weights.make_tensor_maps(&gpu, &mm)?;
        Ok(GpuBackend {
            mm,
            act: Activations::new(&gpu, c, max_tokens)?,
            splits: SplitScratch::new(&gpu, c)?,
            experts: c
                .moe
                .map(|m| ExpertScratch::new(&gpu, &m, c.dim, max_tokens))
                .transpose()?,
            batch: DeviceBatch::new(&gpu, max_tokens, max_blocks, kv.pad_block())?,
            sampler: DeviceSampler::new(&gpu)?,
            rope_cos: gpu.zeros(1, "RoPE tables")?,
            rope_sin: gpu.zeros(1, "RoPE tables")?,
            rope_local: None,
            graphs: Graphs::default(),
            batch_invariant: false,
            all_codes: weights.all_codes(),
            host_routing: weights.routes_on_host(),
            decode_gemv_tokens: gpu.decode_gemv_tokens(&weights.block_types()),
            gemv_mma_tokens: gpu.gemv_mma_tokens,
            logits_host: vec![],
            ids_host: vec![],
            clock: None,
            caps,
            kv,
            weights,
            gpu,
        })
    }

    /// The batch-invariant mode: a token's logits, bit for bit, whatever else shares its
    /// batch. Every matmul goes through the skinny kernel (one token too, where the GEMV
    /// would be faster; 128 rows at a time for a prompt, where the warpgroup GEMM would be),
    /// and attention through `attention_bf16`, whose sums for a token depend on its own
    /// position alone. Decode graphs captured before are dropped.
    ///
    /// Over Q4_K and Q6_K every count of tokens takes `gemv_<type>`, as one token does: the
    /// GEMV on the tensor cores (`gemv_mma_<type>`) sums in another order.
    pub fn set_batch_invariant(&mut self, on: bool) {
        if self.batch_invariant != on {
            self.batch_invariant = on;
            self.graphs.clear();
        }
        self.gpu.gemv_mma_tokens = match on {
            true => QUANT_MAX_TOKENS + 1,
            false => self.gemv_mma_tokens,
        };
    }

    /// The RoPE tables: the global layers', and the local layers' where they have their own
    /// (`RopeTables::local`).
    pub fn set_rope(&mut self, rope: &RopeTables, local: Option<&RopeTables>) -> Result<()> {
        self.rope_cos = self.gpu.upload(&rope.cos, "RoPE tables")?;
        self.rope_sin = self.gpu.upload(&rope.sin, "RoPE tables")?;
        self.rope_local = match local {
            Some(t) => Some((
                self.gpu.upload(&t.cos, "RoPE tables")?,
                self.gpu.upload(&t.sin, "RoPE tables")?,
            )),
            None => None,
        };
        Ok(())
    }

    /// From now on (or no longer), each pass's span on the GPU's clock (`step_clock.rs`),
    /// read by `last_step_span`.
    pub fn clock_steps(&mut self, on: bool) -> Result<()> {
        self.clock = match on {
            true => Some(StepClock::new(&self.gpu)?),
            false => None,
        };
        Ok(())
    }

    /// The last pass's span, in milliseconds since `clock_steps(true)`.
    pub fn last_step_span(&self) -> Option<Span> {
        self.clock.as_ref().and_then(StepClock::last)
    }

    /// Runs `batch` and returns the logits of its `logit_rows`, `[rows, vocab]`, copied to the
    /// host. A decode step replays a CUDA graph (`run`).
    pub fn forward(&mut self, c: &Config, batch: &Batch) -> Result<&[f32]> {
        let rows = self.run(c, batch, false)?;
        let n = rows * c.vocab_size;
        self.logits_host.resize(n, 0.0);
        self.clock_end()?;
        self.gpu
            .stream
            .memcpy_dtoh(&self.act.logits.slice(..n), &mut self.logits_host)
            .map_err(Error::driver("the forward pass failed"))?;
        self.gpu.sync()?;
        self.clock_read()?;
        Ok(&self.logits_host)
    }

    /// Runs `batch` and returns the most likely next token of each logits row: the argmax
    /// runs on the device, and only the ids come back.
    pub fn forward_greedy(&mut self, c: &Config, batch: &Batch) -> Result<&[u32]> {
        let rows = self.run(c, batch, true)?;
        self.ids_back(rows)
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
        self.sampler.sample(
            &self.gpu,
            &mut self.act.next_ids.slice_mut(..rows),
            &mut self.act.logits.slice_mut(..rows * c.vocab_size),
            choices,
            c.vocab_size,
        )?;
        self.ids_back(rows)
    }

    /// The first `rows` chosen ids, copied to the host.
    fn ids_back(&mut self, rows: usize) -> Result<&[u32]> {
        self.ids_host.resize(rows, 0);
        self.clock_end()?;
        self.gpu
            .stream
            .memcpy_dtoh(&self.act.next_ids.slice(..rows), &mut self.ids_host)
            .map_err(Error::driver("the forward pass failed"))?;
        self.gpu.sync()?;
        self.clock_read()?;
        Ok(&self.ids_host)
    }

    /// The pass's last work is on the stream (`clock_steps`).
    fn clock_end(&self) -> Result<()> {
        match &self.clock {
            Some(clock) => clock.end(&self.gpu),
            None => Ok(()),
        }
    }

    /// The pass has drained: its span can be read (`clock_steps`).
    fn clock_read(&mut self) -> Result<()> {
        match &mut self.clock {
            Some(clock) => clock.read(),
            None => Ok(()),
        }
    }

    /// Uploads `batch` and launches its forward pass, with the argmax when `greedy`; returns
    /// its rows of logits. A decode step (one token of each of at most `GRAPH_MAX_BATCH`
    /// sequences, every row wanting logits) replays a CUDA graph of the whole pass.
    fn run(&mut self, c: &Config, batch: &Batch, greedy: bool) -> Result<usize> {
        if let Some(clock) = &mut self.clock {
            clock.start(&self.gpu)?;
        }
        let decode = is_decode_step(batch);
        // Experts routed on the host wait for it between layers: no graph holds that.
        let bucket = match self.host_routing {
            true => None,
            false => self.graphs.bucket(batch, decode),
        };
        let rules = Rules {
            invariant: self.batch_invariant,
            // A short prompt keeps the integer GEMV up to `QUANT_MAX_TOKENS` tokens, for its
            // accuracy (`Rules::blocks_gemv_tokens`).
            blocks_gemv_tokens: match decode {
                true => self.decode_gemv_tokens,
                false => QUANT_MAX_TOKENS,
            },
            all_codes: self.all_codes,
        };
        self.batch
            .upload(&self.gpu, batch, bucket.unwrap_or(batch.tokens.len()))?;
        let splits = splits_needed(c, batch, self.splits.rows, self.gpu.sm_count);
        let attention = match self.batch_invariant {
            true => Attention::PerHead,
            false => Attention::of(c, batch, splits),
        };
        let rows = batch.logit_rows.len();
        let (Some(n), Some(splits)) = (bucket, splits) else {
            let pass = Pass {
                rules,
                attention,
                greedy,
            };
            self.launch(c, batch.tokens.len(), &batch.logit_rows, &pass)?;
            return Ok(rows);
        };
        let bucket = SplitPlan {
            count: splits.count.next_power_of_two(),
            len: splits.len,
        };
        let key = (n, bucket, greedy);
        if !self.graphs.contains(&key) {
            let graph = self.capture(c, key, rules)?;
            self.graphs.insert(key, graph);
        }
        self.graphs.replay(&key)?;
        Ok(rows)
    }

    /// Records a decode step of `n` rows (padding included) with `n_splits` attention
    /// splits, ending in the argmax if `greedy`, as a CUDA graph: the ordinary forward pass
    /// (`launch`), recorded instead of run.
    fn capture(&mut self, c: &Config, key: GraphKey, rules: Rules) -> Result<CudaGraph> {
        let (n, splits, greedy) = key;
        let attention = match self.batch_invariant {
            true => Attention::PerHead,
            false => Attention::Split(splits),
        };
        let pass = Pass {
            rules,
            attention,
            greedy,
        };
        let logit_rows: Vec<u32> = (0..n as u32).collect();
        let stream = self.gpu.stream.clone();
        capture_graph(&stream, "the decode graph", || {
            self.launch(c, n, &logit_rows, &pass)
        })
    }

    /// Every kernel of the forward pass for `n` uploaded tokens, up to the logits of
    /// `logit_rows` (and their argmax where `pass.greedy`), left on the device: step for step
    /// `cpu::forward`. A buffer is named where a kernel writes it and where one reads it; a
    /// matmul's input comes with what the kernel that made it left in the scratch (`Held`).
    fn launch(&mut self, c: &Config, n: usize, logit_rows: &[u32], pass: &Pass) -> Result<()> {
        let Self {
            gpu: g,
            weights: w,
            kv,
            act,
            mm,
            caps,
            splits,
            batch,
            rope_cos,
            rope_sin,
            rope_local,
            experts,
            ..
        } = self;
        let (rules, b) = (&pass.rules, &batch.view(n));
        let (dim, q_dim, ffn, eps) = (c.dim, c.q_dim(), mlp_width(c), c.rms_eps);
        let qkv_dim = q_dim + 2 * c.kv_dim();
        let heads = Heads::of(c);
        let x = &mut act.x.slice_mut(..n * dim);
        let xb = &mut act.xb.slice_mut(..n * dim);
        let qkv = &mut act.qkv.slice_mut(..n * qkv_dim);
        let q = &mut act.q.slice_mut(..n * q_dim);
        let att = &mut act.att.slice_mut(..n * q_dim);
        let gate = &mut act.gate.slice_mut(..n * ffn);
        let up = &mut act.up.slice_mut(..n * ffn);
        let hidden = &mut act.hidden.slice_mut(..n * ffn);
        let post = &mut act.post.slice_mut(..if c.post_norms { n * dim } else { 1 });

        embed(g, x, &w.embed, &b.tokens)?;
        if let Some(scale) = c.embed_scale {
            g.scale_f32(x, scale)?;
        }
        for (l, lw) in w.layers.iter().enumerate() {
            // Attention: x += o_proj(attention(rope(q), rope(k), v)) over the normed stream (q
            // and k each normed by head first where the model says: Qwen3).
            let qkv_plan = caps.plan(rules, &lw.wqkv, n);
            let copy = copy_for(rules, n, &[qkv_plan.input]);
            let held = rmsnorm(g, mm, xb, &x.as_view(), &lw.attn_norm.as_view(), eps, copy)?;
            let normed = Input {
                rows: xb.as_view(),
                held,
            };
            let bias = lw.bqkv.as_ref().map(|b| b.as_view());
            mm.matmul(g, qkv, &normed, &lw.wqkv, bias.as_ref(), &qkv_plan)?;
            let rows = (&b.positions, &b.slots);
            let (cos, sin) = match (c.window(l), &*rope_local) {
                (Some(_), Some((cos, sin))) => (cos.as_view(), sin.as_view()),
                _ => (rope_cos.as_view(), rope_sin.as_view()),
            };
            let tables = (&cos, &sin);
            // SAFETY: positions are below the context the RoPE tables cover (the engine
            // checks every request against it); slots come from the block manager, inside
            // the pool and distinct, but for the graphs' padding rows, which write the same
            // values into the spare block's first slot.
            let qkv = &qkv.as_view();
            let norms = lw.qk_norm.as_ref().map(|(q, k)| (q.as_view(), k.as_view()));
            let normed = norms.as_ref().map(|(q_norm, k_norm)| NormedQkv {
                qkv,
                q_norm,
                k_norm,
                eps,
            });
            unsafe {
                match (kv.layer_mut(l), normed) {
                    (KvLayerMut::Bf16(mut k, mut v), Some(normed)) => {
                        g.qkv_norm_rope_write_bf16(q, (&mut k, &mut v), normed, rows, tables, heads)
                    }
                    (KvLayerMut::Bf16(mut k, mut v), None) => {
                        g.qkv_rope_write_bf16(q, (&mut k, &mut v), qkv, rows, tables, heads)
                    }
                    (KvLayerMut::Fp8((mut k, mut v), (mut ks, mut vs)), Some(normed)) => {
                        let cache = ((&mut k, &mut v), (&mut ks, &mut vs));
                        g.qkv_norm_rope_write_fp8(q, cache, normed, rows, tables, heads)
                    }
                    (KvLayerMut::Fp8((mut k, mut v), (mut ks, mut vs)), None) => {
                        let cache = ((&mut k, &mut v), (&mut ks, &mut vs));
                        g.qkv_rope_write_fp8(q, cache, qkv, rows, tables, heads)
                    }
                }
            }?;
            let o_plan = caps.plan(rules, &lw.wo, n);
            let window = c.window(l);
            let paged = match kv.layer(l) {
                KvLayer::Bf16(k, v) => PagedKv::Bf16(b.paged(q.as_view(), (k, v), heads, window)),
                KvLayer::Fp8(caches, scales) => {
                    PagedKv::Fp8(b.paged(q.as_view(), caches, heads, window), scales)
                }
            };
            let copy = copy_for(rules, n, &[o_plan.input]);
            let held = splits.attend(g, mm, att, &paged, pass.attention, copy)?;
            let attended = Input {
                rows: att.as_view(),
                held,
            };
            let post_attn = lw.post_norms.as_ref().map(|(a, _)| a);
            let out = BlockOut { x, xb, post };
            add_output(g, mm, out, &attended, (&lw.wo, &o_plan), post_attn, eps)?;

            // MLP: x += down(act(gate(x)) * up(x)) over the normed stream, or its mixture
            // of experts.
            let mlp = Mlp {
                hidden: &mut *hidden,
                gate: &mut *gate,
                up: &mut *up,
            };
            let post_ffn = lw.post_norms.as_ref().map(|(_, f)| f);
            let w = match &lw.mlp {
                LayerMlp::Dense(w) => w,
                LayerMlp::Experts(e) => {
                    let held = rmsnorm(g, mm, xb, &x.as_view(), &lw.ffn_norm.as_view(), eps, None)?;
                    let normed = Input {
                        rows: xb.as_view(),
                        held,
                    };
                    let scratch = experts
                        .as_mut()
                        .expect("a model of experts has their scratch");
                    let step = ExpertStep {
                        caps,
                        rules,
                        act: c.activation,
                    };
                    super::experts::experts(g, mm, scratch, (x, &normed), mlp, e, &step)?;
                    continue;
                }
            };
            let gate_up = GateUp::plan(caps, rules, w, n, c.activation);
            let copy = copy_for(rules, n, &gate_up.inputs());
            let held = rmsnorm(g, mm, xb, &x.as_view(), &lw.ffn_norm.as_view(), eps, copy)?;
            let normed = Input {
                rows: xb.as_view(),
                held,
            };
            let down_plan = caps.plan(rules, &w.down, n);
            let copy = copy_for(rules, n, &[down_plan.input]);
            let held = swiglu(g, mm, mlp, &normed, w, &gate_up, copy)?;
            let hidden_in = Input {
                rows: hidden.as_view(),
                held,
            };
            let out = BlockOut { x, xb, post };
            add_output(g, mm, out, &hidden_in, (&w.down, &down_plan), post_ffn, eps)?;
        }

        // The final norm and the output head, for the rows that want logits only.
        let rows = logit_rows.len();
        let head = w.head();
        let head_plan = caps.plan(rules, head, rows);
        let head_in = &mut act.head_in.slice_mut(..rows * dim);
        let norm = &w.final_norm.as_view();
        let first = logit_rows.first().map_or(0, |&r| r as usize);
        let one_run = logit_rows
            .iter()
            .zip(first..)
            .all(|(&r, i)| r as usize == i);
        let held = if rows > 0 && one_run && (rows == 1 || !rules.rounds(rows)) {
            // A decode step's rows, where the head's GEMV takes them all: over GGUF blocks
            // the norm makes the GEMV's codes.
            let copy = match rules.rounds(rows) {
                true => None,
                false => copy_for(rules, rows, &[head_plan.input]),
            };
            let x = &x.slice(first * dim..(first + rows) * dim);
            rmsnorm(g, mm, head_in, x, norm, eps, copy)?
        } else {
            // One norm launch per run of consecutive rows.
            let mut i = 0;
            while i < rows {
                let first = logit_rows[i] as usize;
                let mut len = 1;
                while i + len < rows && logit_rows[i + len] as usize == first + len {
                    len += 1;
                }
                g.rmsnorm_f32(
                    &mut head_in.slice_mut(i * dim..(i + len) * dim),
                    &x.slice(first * dim..(first + len) * dim),
                    norm,
                    eps,
                    dim,
                )?;
                i += len;
            }
            Held::ROWS
        };
        let logits = &mut act.logits.slice_mut(..rows * c.vocab_size);
        let normed = Input {
            rows: head_in.as_view(),
            held,
        };
        mm.matmul(g, logits, &normed, head, None, &head_plan)?;
        if pass.greedy {
            g.argmax_f32(&mut act.next_ids.slice_mut(..rows), &logits.as_view())?;
        }
        Ok(())
    }
}

/// The matmuls' scratch for this model, `max_tokens` tokens a pass: the split sums of the
/// largest split any plan makes for its matrices, the bf16 copy of the largest matrix held
/// in blocks (`Caps::dequant_room`), e4m3 activations where fp8's tensor cores run.
fn matmul_scratch(
    gpu: &Gpu,
    c: &Config,
    caps: &Caps,
    max_tokens: usize,
    blocks: bool,
) -> Result<MatmulScratch> {
    let (dim, q, kv, ffn) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
    let expert = c.moe.map_or(ffn, |m| m.expert_ffn_dim);
    let n_experts = c.moe.map_or(1, |m| m.n_experts);
    let matrices = [
        (dim, q + 2 * kv),
        (q, dim),
        (dim, ffn),
        (ffn, dim),
        (dim, expert),
        (expert, dim),
        (dim, n_experts),
        (dim, c.vocab_size),
    ];
    let skinny = |&(n_in, n_out): &(usize, usize)| match skinny_splits(n_in, n_out, gpu.sm_count) {
        1 => 0,
        s => s * SKINNY_MAX_TOKENS * n_out,
    };
    // Every token count a step may bring: the plans split only small grids, so this is a
    // few dozen MiB at most (Llama 3 8B: 8 x 128 x 4096 for down at 128 tokens).
    let wgmma = |&(n_in, n_out): &(usize, usize)| {
        (1..=max_tokens)
            .map(|n| gpu.wgmma_parts_len(n, n_in, n_out))
            .max()
            .unwrap_or(0)
    };
    // `gemm_<type>`'s and `gemm_wgmma_<type>`'s, where some matrix is held in blocks (the
    // latter's plans, as the warpgroup GEMM's, split only small grids).
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
    let widest = dim.max(q).max(ffn).max(expert);
    Ok(MatmulScratch {
        x_bf16: gpu.zeros(max_tokens * widest, "activations")?,
        codes: gpu.zeros(QUANT_MAX_TOKENS * widest, "activations as 8-bit codes")?,
        code_scales: gpu.zeros(QUANT_MAX_TOKENS * widest / 16, "the codes' scales")?,
        x_fp8: match caps.fp8_cores {
            false => None,
            true => Some((
                gpu.zeros(max_tokens * widest, "activations in e4m3")?,
                gpu.zeros(max_tokens, "the e4m3 activations' scales")?,
            )),
        },
        parts: gpu.zeros(parts.max(1), "the tensor-core matmuls' split sums")?,
        w_bf16: match caps.dequant_room {
            0 => None,
            n => Some(gpu.zeros(n, "a quantized matrix dequantized for the tensor cores")?),
        },
    })
}
