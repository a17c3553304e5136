//! The GPU backend: every kernel against its CPU twin, then whole models against the CPU
//! and against Hugging Face transformers.
//!
//! Kernel tests draw fresh random inputs each run (the seed is printed; set
//! `RUSTLE_TEST_SEED` to repeat one), poison every output with NaN before the launch, and
//! compare by relative error ||gpu - cpu|| / ||cpu||. Without a GPU every test is reported as
//! ignored, with the reason.

mod common;
#[path = "gpu/experts.rs"]
mod experts;
#[path = "gpu/gemv_mma.rs"]
mod gemv_mma;
#[path = "gpu/kv_fp8.rs"]
mod kv_fp8;
#[path = "gpu/speculation.rs"]
mod speculation;

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use libtest_mimic::{Arguments, Completion, Trial};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustle::config::{Activation, Config, HfConfig};
use rustle::cpu::ops;
use rustle::cpu::ops::PagedRef;
use rustle::cpu::quant::BlocksRef;
use rustle::gpu::Gpu;
use rustle::gpu::gemm_plan::{self, GemmPlan, WGMMA_SPLITS};
use rustle::gpu::kernels::attention::PagedIn;
use rustle::gpu::kernels::attention_split_mma::attention_split_mma_supports;
use rustle::gpu::kernels::gemm_mma::Bf16Operands;
use rustle::gpu::kernels::gemv_quant::BlocksIn;
use rustle::gpu::kernels::{In, Out};
use rustle::gpu::matrix::WeightFormat;
use rustle::gpu::matrix::to_bf16;
use rustle::gpu::{gemm_tuning, tuned_plans};
use rustle::kernel_args::{Blocks, Heads, MatmulShape, NormedQkv, Paged, PagedShape, Splits};
use rustle::model::{LayerWeights, Mlp, ModelWeights};
use rustle::runner::{Device, Runner, RunnerOptions};
use rustle::tiles::SPLIT_MAX_HEAD_DIM;
use rustle::weights::blocks::BlockType;

type Test = fn(&Gpu, &mut StdRng);

const TESTS: &[(&str, Test)] = &[
    ("kernel::embedding_bf16", embedding_bf16),
    ("kernel::rmsnorm_f32 (and _bf16)", rmsnorm_f32),
    ("kernel::gemv_bf16", gemv_bf16),
    (
        "kernel::gemv_step1_thread_per_row_bf16, gemv_step2_warp_per_row_bf16",
        gemv_steps,
    ),
    ("kernel::gemv_swiglu_bf16", gemv_swiglu_bf16),
    ("kernel::quantize_q8_f32", quantize_q8_f32),
    ("kernel::rmsnorm_q8_f32", rmsnorm_q8_f32),
    (
        "kernel::gemv_q4_0 .. gemv_fp8 (every block type)",
        |g, rng| gemv_blocks(&without_stream(g), rng),
    ),
    (
        "kernel::gemv_q4_k_q6_k, gemv_q5_k_q6_k (a matrix of two types)",
        gemv_two_types,
    ),
    (
        "kernel::gemv_mma_q4_1 .. gemv_mma_q6_k (1 to 8 tokens on the tensor cores)",
        gemv_mma::gemv_mma_blocks,
    ),
    (
        "kernel::gemv_swiglu_mma_q4_1 .. gemv_swiglu_mma_q6_k (1 to 8 tokens)",
        gemv_mma::gemv_swiglu_mma_blocks,
    ),
    (
        "kernel::gemv_swiglu_q4_0 .. gemv_swiglu_fp8 (every block type)",
        |g, rng| gemv_swiglu_blocks(&without_stream(g), rng),
    ),
    (
        "kernel::gemv_swiglu_stream_q4_0 .. q6_k, gemv_stream_q4_k .. q6_k (grids of the GPU's size and of 2 SMs)",
        gemv_stream_blocks,
    ),
    (
        "kernel::dequant_q4_0 .. dequant_fp8 (every block type)",
        dequant_blocks,
    ),
    (
        "kernel::gemm_q4_0 .. gemm_q6_k (every GGUF type, and its splits)",
        gemm_blocks,
    ),
    (
        "kernel::gemm_wgmma_q4_0 .. gemm_wgmma_q6_k (both tiles of tokens, and their splits)",
        gemm_wgmma_blocks,
    ),
    ("kernel::gemm_step1_simt_bf16", gemm_step1_simt_bf16),
    ("kernel::gemm_mma_bf16", gemm_mma_bf16),
    ("kernel::gemm_wgmma_bf16", gemm_wgmma_bf16),
    (
        "kernel::gemm_wgmma_bf16 on plans measured here (gemm_tuning)",
        gemm_tuning,
    ),
    (
        "kernel::gemm_wgmma_fp8, quantize_fp8_f32 (its input)",
        gemm_wgmma_fp8,
    ),
    ("kernel::gemm_skinny_bf16 (and reduce)", gemm_skinny_bf16),
    ("kernel::f32_to_bf16", f32_to_bf16),
    ("kernel::mma_probe_bf16", mma_probe_bf16),
    ("kernel::rope_f32", rope_f32),
    ("kernel::qkv_rope_write_bf16", qkv_rope_write_bf16),
    ("kernel::qkv_norm_rope_write_bf16", qkv_norm_rope_write_bf16),
    ("kernel::kv_write_f32", kv_write_f32),
    (
        "kernel::attention_f32, attention_bf16 (and both splits + combine)",
        attention_f32,
    ),
    ("kernel::attention_mma_bf16", attention_mma_bf16),
    (
        "kernel::qkv_rope_write_fp8, qkv_norm_rope_write_fp8",
        kv_fp8::rope_write_fp8,
    ),
    (
        "kernel::attention_fp8, attention_split_mma_fp8",
        kv_fp8::attention_fp8,
    ),
    ("kernel::attention_mma_fp8", kv_fp8::attention_mma_fp8),
    ("kernel::swiglu_f32, geglu_f32 (and _bf16)", gated_f32),
    ("kernel::residual_add_f32", residual_add_f32),
    ("kernel::scale_f32", scale_f32),
    (
        "kernel::gather_rows_f32, scatter_add_rows_f32",
        gather_scatter_rows_f32,
    ),
    (
        "kernel::route_experts_f32, combine_experts_f32",
        experts::route_and_combine,
    ),
    (
        "kernel::gemv_experts_q4_0 .. gemv_swiglu_experts_mma_q6_k (runs of 1 to 20 pairs)",
        experts::gemv_experts_blocks,
    ),
    (
        "kernel::gemv_experts_bf16 .. gemv_swiglu_experts_mma_bf16 (CUDA and tensor cores)",
        experts::gemv_experts_bf16,
    ),
    ("kernel::argmax_f32", argmax_f32),
    (
        "kernel::sample_f32, penalize_f32, mask_logits_f32",
        sample_f32,
    ),
    ("kernel::fill_random_bf16", fill_random_bf16),
    ("kernel::read_probe_u32", read_probe_u32),
    #[cfg(feature = "probes")]
    (
        "kernel::read_phases_u32 (a grid barrier between phases)",
        read_phases_u32,
    ),
    #[cfg(feature = "probes")]
    (
        "kernel::read_phases_staged_u32 (bulk copies across grid barriers; Hopper)",
        read_phases_staged_u32,
    ),
    ("kernel::sum_step1_warp_f32, sum_step2_block_f32", sum_steps),
    (
        "model::default_model_gpu_matches_cpu",
        default_model_gpu_matches_cpu,
    ),
    (
        "model::quantized_gguf_gpu_matches_cpu",
        quantized_gguf_gpu_matches_cpu,
    ),
    (
        "model::fp8_logits_stay_near_bf16",
        fp8_logits_stay_near_bf16,
    ),
    (
        "model::kv_fp8_tracks_kv_bf16 (top-1 agreement and logit error over 256 positions)",
        kv_fp8::tracks_kv_bf16,
    ),
    (
        "model::synthetic_llama3_gpu_matches_cpu",
        synthetic_llama3_gpu_matches_cpu,
    ),
    (
        "model::batched_requests_match_their_runs_alone",
        batched_requests_match_their_runs_alone,
    ),
    (
        "model::quantized_batch_matches_runs_alone",
        quantized_batch_matches_runs_alone,
    ),
    (
        "model::few_sequences_decode_as_one (q4_k_m, tiny-quant.gguf)",
        few_sequences_decode_as_one,
    ),
    (
        "model::prompts_on_blocks_match_chunks (q8_0, q4_0, q4_k_m)",
        prompts_on_blocks_match_chunks,
    ),
    (
        "model::default_model_gpu_matches_transformers",
        default_model_gpu_matches_transformers,
    ),
    (
        "model::tiny_models_gpu_match_transformers",
        tiny_models_gpu_match_transformers,
    ),
    (
        "model::tiny_experts_gpu_match_transformers",
        tiny_experts_gpu_match_transformers,
    ),
    (
        "model::tiny_gemma3_gpu_matches_transformers",
        tiny_gemma3_gpu_matches_transformers,
    ),
    (
        "model::default_model_speculation_keeps_greedy_tokens",
        speculation::default_model_speculation_keeps_greedy_tokens,
    ),
    (
        "model::profile_times_every_launch_of_a_step",
        profile_times_every_launch_of_a_step,
    ),
    (
        "model::profile_puts_decode_on_the_slope",
        profile_puts_decode_on_the_slope,
    ),
];

fn main() {
    let mut args = Arguments::from_args();
    // One at a time: the model tests each hold a model and a KV pool on the device.
    args.test_threads.get_or_insert(1);
    let gpu = Gpu::new().map(Arc::new).map_err(|e| e.to_string());
    let seed = std::env::var("RUSTLE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::random::<u32>() as u64);
    match &gpu {
        Ok(g) => eprintln!(
            "GPU tests on {}, seed {seed} (RUSTLE_TEST_SEED)",
            g.description
        ),
        Err(e) => eprintln!("GPU tests ignored: {e}"),
    }
    let trials = TESTS
        .iter()
        .enumerate()
        .map(|(i, &(name, test))| {
            let gpu = gpu.clone();
            Trial::ignorable_test(name, move || match gpu {
                Err(reason) => Ok(Completion::ignored_with(reason)),
                Ok(g) if hopper_only(name) && !g.has_wgmma() => {
                    Ok(Completion::ignored_with(format!(
                        "needs compute capability 9.0 (wgmma or bulk copies); this is {}",
                        g.description
                    )))
                }
                Ok(g) => {
                    test(&g, &mut StdRng::seed_from_u64(seed + i as u64));
                    Ok(Completion::Completed)
                }
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

// ---- helpers -------------------------------------------------------------------------------

/// Tests of kernels in the sm_90a build only: the warpgroup GEMMs, and those whose names
/// end "; Hopper)" (the bulk copies).
fn hopper_only(name: &str) -> bool {
    name.contains("wgmma") || name.ends_with("; Hopper)")
}

fn normal(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    // Sum of uniforms: close enough to normal, never zero-filled.
    (0..n)
        .map(|_| {
            (rng.random::<f32>() + rng.random::<f32>() + rng.random::<f32>() - 1.5) * 2.0 * scale
        })
        .collect()
}

fn up<T: cudarc::driver::DeviceRepr>(g: &Gpu, x: &[T]) -> CudaSlice<T> {
    g.upload(x, "test input").unwrap()
}

/// A device buffer of `n` NaNs: whatever the kernel does not write stays NaN and fails.
/// A paged attention's host buffers (`PagedRef`, a twin's input) uploaded, to hand the
/// kernel the same input (`view`).
struct Uploaded<K> {
    q: CudaSlice<f32>,
    k_cache: CudaSlice<K>,
    v_cache: CudaSlice<K>,
    block_tables: CudaSlice<u32>,
    token_seq: CudaSlice<u32>,
    positions: CudaSlice<u32>,
    shape: PagedShape,
}

impl<K: cudarc::driver::DeviceRepr> Uploaded<K> {
    fn new(g: &Gpu, p: &PagedRef<K>) -> Uploaded<K> {
        Uploaded {
            q: up(g, p.q),
            k_cache: up(g, p.k_cache),
            v_cache: up(g, p.v_cache),
            block_tables: up(g, p.block_tables),
            token_seq: up(g, p.token_seq),
            positions: up(g, p.positions),
            shape: p.shape,
        }
    }

    fn view(&self) -> PagedIn<'_, K> {
        Paged {
            q: self.q.as_view(),
            k_cache: self.k_cache.as_view(),
            v_cache: self.v_cache.as_view(),
            block_tables: self.block_tables.as_view(),
            token_seq: self.token_seq.as_view(),
            positions: self.positions.as_view(),
            shape: self.shape,
        }
    }
}

fn poisoned(g: &Gpu, n: usize) -> CudaSlice<f32> {
    up(g, &vec![f32::NAN; n])
}

fn down<T: cudarc::driver::DeviceRepr + Default + Clone>(g: &Gpu, x: &CudaSlice<T>) -> Vec<T> {
    let mut out = vec![T::default(); x.len()];
    g.stream.memcpy_dtoh(x, &mut out).unwrap();
    g.sync().unwrap();
    out
}

/// ||a - b|| / ||b||, infinite if anything is NaN.
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        if x.is_nan() || y.is_nan() {
            return f64::INFINITY;
        }
        num += ((x - y) as f64).powi(2);
        den += (y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

/// Tolerances. Element-wise f32 arithmetic matches to rounding (1e-6). A reduction over
/// thousands of terms summed in another order (a warp tree on the GPU, a running sum on the
/// CPU) drifts by about sqrt(n) roundings: 8192 squares in RMSNorm, 14336 products in a
/// GEMV row. The approximate `ex2` adds about 2 ulp per exponential.
const ELEMENTWISE: f64 = 1e-6;
const REDUCTION: f64 = 1e-5;
const LONG_REDUCTION: f64 = 5e-5;
/// The tensor-core attention rounds its softmax weights to bf16 (2^-9 relative), its twin
/// does not.
const BF16_WEIGHTS: f64 = 5e-3;
const APPROX_EXP: f64 = 5e-6;
/// A SwiGLU of two GEMV sums, `silu(g) * u`: the relative errors of both sums, and the
/// approximate `ex2`.
const SWIGLU_OF_SUMS: f64 = 2.0 * LONG_REDUCTION + APPROX_EXP;

fn assert_close(what: &str, gpu: &[f32], cpu: &[f32], tol: f64) {
    let e = rel_err(gpu, cpu);
    assert!(e <= tol, "{what}: relative error {e:.3e} > {tol:.0e}");
}

/// Smallest root-mean-square output `assert_strided` measures a matmul's error against.
/// Its tests' outputs are sums of hundreds of products of weights of scale 0.05 or more and
/// activations of scale 1 (0.8 or more, typically); a few outputs that cancel to nearly
/// nothing (one row of one token can) would make a rounding in the sum's order look like a
/// large relative error, so they are held to the error their terms' size allows. A wrong
/// sum is off by far more than `tol` times this.
const MATMUL_OUTPUT_FLOOR: f64 = 0.1;

/// A matmul's output (`shape`'s `n_tokens` rows of `out_stride`) against the twin's: each
/// row's first `n_out` columns within `tol` (relative to their size, or to
/// `MATMUL_OUTPUT_FLOOR` where that is larger), and the columns past them untouched: bit
/// for bit as they were (`start`), or still NaN where the launch began from poison (`None`).
fn assert_strided(
    what: &str,
    out: &[f32],
    cpu: &[f32],
    start: Option<&[f32]>,
    shape: MatmulShape,
    tol: f64,
) {
    let [n_tokens, _, n_out, stride] = shape.sizes();
    let cols = |v: &[f32]| -> Vec<f32> {
        (0..n_tokens)
            .flat_map(|t| v[t * stride..t * stride + n_out].to_vec())
            .collect()
    };
    let (gpu, twin) = (cols(out), cols(cpu));
    let rms = (twin.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / twin.len() as f64).sqrt();
    let e = rel_err(&gpu, &twin) * rms / rms.max(MATMUL_OUTPUT_FLOOR);
    assert!(e <= tol, "{what}: relative error {e:.3e} > {tol:.0e}");
    for t in 0..n_tokens {
        for c in n_out..stride {
            let o = out[t * stride + c];
            let kept = start.map_or(o.is_nan(), |s| o.to_bits() == s[t * stride + c].to_bits());
            assert!(kept, "{what}: column {c} was written");
        }
    }
}

/// bf16 weights as the GPU holds them: random values rounded to bf16 bits.
fn bf16_weights(rng: &mut StdRng, n: usize, scale: f32) -> Vec<u16> {
    to_bf16(&normal(rng, n, scale))
}

// ---- kernels ---------------------------------------------------------------------------------

fn embedding_bf16(g: &Gpu, rng: &mut StdRng) {
    for (vocab, dim, n) in [(1000, 64, 1), (500, 576, 7), (300, 100, 13)] {
        let table = bf16_weights(rng, vocab * dim, 1.0);
        let tokens: Vec<u32> = (0..n).map(|_| rng.random_range(0..vocab as u32)).collect();
        let mut cpu = vec![0.0; n * dim];
        ops::embedding_bf16(&mut cpu, &table, &tokens, dim);
        let mut out = poisoned(g, n * dim);
        // SAFETY: the test builds valid ids, positions, slots and tables for its pool.
        unsafe {
            g.embedding_bf16(
                &mut out.as_view_mut(),
                &up(g, &table).as_view(),
                &up(g, &tokens).as_view(),
                dim,
            )
        }
        .unwrap();
        assert_close(
            &format!("vocab {vocab} dim {dim} n {n}"),
            &down(g, &out),
            &cpu,
            0.0,
        );
    }
}

fn rmsnorm_f32(g: &Gpu, rng: &mut StdRng) {
    for (rows, dim) in [
        (1, 64),
        (5, 576),
        (3, 1000),
        (2, 4096),
        (1, 8192),
        (2, 10_000),
    ] {
        let x = normal(rng, rows * dim, 2.0);
        let w = normal(rng, dim, 1.0);
        let mut cpu = vec![0.0; rows * dim];
        ops::rmsnorm_f32(&mut cpu, &x, &w, 1e-5);
        let mut out = poisoned(g, rows * dim);
        g.rmsnorm_f32(
            &mut out.as_view_mut(),
            &up(g, &x).as_view(),
            &up(g, &w).as_view(),
            1e-5,
            dim,
        )
        .unwrap();
        assert_close(
            &format!("rows {rows} dim {dim}"),
            &down(g, &out),
            &cpu,
            REDUCTION,
        );

        // With the bf16 copy: the f32 output as before, and the copy exactly that output
        // rounded, as `f32_to_bf16`'s twin rounds it.
        let mut out = poisoned(g, rows * dim);
        let mut out_bf16 = up(g, &vec![0x7fc1u16; rows * dim]);
        g.rmsnorm_f32_bf16(
            &mut out.as_view_mut(),
            &mut out_bf16.as_view_mut(),
            &up(g, &x).as_view(),
            &up(g, &w).as_view(),
            1e-5,
            dim,
        )
        .unwrap();
        let out = down(g, &out);
        let what = format!("rows {rows} dim {dim}, with bf16");
        assert_close(&what, &out, &cpu, REDUCTION);
        let mut rounded = vec![0u16; rows * dim];
        ops::f32_to_bf16(&mut rounded, &out);
        assert!(down(g, &out_bf16) == rounded, "{what}: the bf16 copy");
    }
}

fn gemv_bf16(g: &Gpu, rng: &mut StdRng) {
    for (n_in, n_out, bias, accumulate) in [
        (64, 1, false, false),
        (576, 192, true, false),
        (1536, 576, false, true),
        (4096, 1000, true, true),
        (8, 3, false, false),
        (2048, 4099, false, false),
        (14336, 4096, false, true),
    ] {
        let x = normal(rng, n_in, 1.0);
        let w = bf16_weights(rng, n_out * n_in, 0.05);
        let b = bias.then(|| normal(rng, n_out, 1.0));
        // With `accumulate` the output starts as a residual stream; without, as poison.
        let start = if accumulate {
            normal(rng, n_out, 1.0)
        } else {
            vec![f32::NAN; n_out]
        };
        let mut cpu = start.clone();
        ops::gemv_bf16(&mut cpu, &x, &w, b.as_deref(), n_in, accumulate);
        let mut out = up(g, &start);
        let b_dev = b.as_ref().map(|b| up(g, b));
        let b_view = b_dev.as_ref().map(|b| b.as_view());
        g.gemv_bf16(
            &mut out.as_view_mut(),
            &up(g, &x).as_view(),
            &up(g, &w).as_view(),
            b_view.as_ref(),
            n_in,
            accumulate,
        )
        .unwrap();
        let what = format!("{n_out} x {n_in}, bias {bias}, accumulate {accumulate}");
        assert_close(&what, &down(g, &out), &cpu, LONG_REDUCTION);
    }
}

/// A matrix of blocks on the device: `random_blocks`' bytes and fp8's row scales.
struct DeviceBlocks {
    bytes: CudaSlice<u8>,
    row_scales: Option<CudaSlice<f32>>,
}

fn on_device(g: &Gpu, bytes: &[u8], row_scales: &Option<Vec<f32>>) -> DeviceBlocks {
    DeviceBlocks {
        bytes: up(g, bytes),
        row_scales: row_scales.as_ref().map(|s| up(g, s)),
    }
}

impl DeviceBlocks {
    /// The matrix as a wrapper takes it, rows of `ty`.
    fn view(&self, ty: BlockType) -> BlocksIn<'_> {
        Blocks {
            ty,
            bytes: self.bytes.as_view(),
            row_scales: self.row_scales.as_ref().map(|s| s.as_view()),
        }
    }
}

/// The same matrix on the host, as a twin takes it.
fn blocks_ref<'a>(
    ty: BlockType,
    bytes: &'a [u8],
    row_scales: &'a Option<Vec<f32>>,
) -> BlocksRef<'a> {
    Blocks {
        ty,
        bytes,
        row_scales: row_scales.as_deref(),
    }
}

/// `x`'s 8-bit codes and their scales, as the twin of `quantize_q8_f32` makes them.
fn q8_codes(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let n = x.len();
    let (mut codes, mut scales) = (vec![0u8; n], vec![0f32; n / 16]);
    rustle::cpu::quant::quantize_q8_f32(&mut codes, &mut scales, x, n);
    (codes, scales)
}

/// The activations' 8-bit codes against the twin's, bit for bit (the same IEEE division
/// and rounding), over several tokens' rows, with a group of zeros among them.
fn quantize_q8_f32(g: &Gpu, rng: &mut StdRng) {
    for n in [32, 4096, 8 * 14336] {
        let mut x = normal(rng, n, 1.0);
        x[..32].fill(0.0);
        if n > 64 {
            // A group that holds one large value, as the hidden state's outliers do.
            x[40] = 300.0;
        }
        let (codes, scales) = q8_codes(&x);
        let mut codes_dev = up(g, &vec![0xaau8; n]);
        let mut scales_dev = poisoned(g, n / 16);
        g.quantize_q8_f32(
            &mut codes_dev.as_view_mut(),
            &mut scales_dev.as_view_mut(),
            &up(g, &x).as_view(),
            n,
        )
        .unwrap();
        assert!(down(g, &codes_dev) == codes, "{n} values: the codes differ");
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(&down(g, &scales_dev)) == bits(&scales),
            "{n} values: the scales differ"
        );
    }
}

/// The norm's 8-bit codes against the twin's (`rmsnorm_f32`, then `quantize_q8_f32`), with
/// a group of zeros and an outlier, rows of one block to several and a row longer than one
/// round of loads. The kernel sums the squares in another order than the twin, so the
/// scales d agree to 1e-5 and a code may be one off where a value sits on a rounding's edge
/// (a few in a thousand at most); the second scale is d times the sum of the kernel's own
/// codes, to the bit.
fn rmsnorm_q8_f32(g: &Gpu, rng: &mut StdRng) {
    for (rows, dim) in [(1, 576), (1, 4096), (3, 8192), (2, 12_288), (8, 2048)] {
        let n = rows * dim;
        let mut x = normal(rng, n, 2.0);
        x[32..64].fill(0.0);
        x[100] = 300.0;
        let w = normal(rng, dim, 1.0);
        let (mut codes, mut scales) = (vec![0u8; n], vec![0f32; n / 16]);
        rustle::cpu::quant::rmsnorm_q8_f32(&mut codes, &mut scales, &x, &w, 1e-5);
        let mut codes_dev = up(g, &vec![0xaau8; n]);
        let mut scales_dev = poisoned(g, n / 16);
        g.rmsnorm_q8_f32(
            &mut codes_dev.as_view_mut(),
            &mut scales_dev.as_view_mut(),
            &up(g, &x).as_view(),
            &up(g, &w).as_view(),
            1e-5,
            dim,
        )
        .unwrap();
        let what = format!("rows {rows} dim {dim}");
        let (gpu_codes, gpu_scales) = (down(g, &codes_dev), down(g, &scales_dev));
        let code = |c: u8| c as i8 as i32;
        let off: Vec<i32> = gpu_codes
            .iter()
            .zip(&codes)
            .map(|(&a, &b)| (code(a) - code(b)).abs())
            .collect();
        let (worst, differ) = (
            off.iter().copied().max().unwrap(),
            off.iter().filter(|&&d| d > 0).count(),
        );
        assert!(
            worst <= 1 && differ <= 2 + n / 500,
            "{what}: {differ} codes differ from the twin's, by up to {worst}"
        );
        for (grp, gpu) in gpu_scales.chunks_exact(2).enumerate() {
            let d = scales[2 * grp];
            assert!(
                (gpu[0] - d).abs() <= 1e-5 * d,
                "{what}: group {grp}'s d {} against the twin's {d}",
                gpu[0]
            );
            let sum: i32 = gpu_codes[32 * grp..32 * (grp + 1)]
                .iter()
                .map(|&c| code(c))
                .sum();
            assert!(
                gpu[1].to_bits() == (gpu[0] * sum as f32).to_bits(),
                "{what}: group {grp}'s second scale {} is not d times its codes' sum {sum}",
                gpu[1]
            );
        }
        assert!(gpu_scales[2..4] == [0.0, 0.0], "{what}: the group of zeros");
    }
}

/// `g` with the GEMVs on `gemv_<type>` and `gemv_swiglu_<type>`, not the streamed kernels.
fn without_stream(g: &Gpu) -> Gpu {
    let mut g = g.clone();
    g.gemv_stream = false;
    g
}

/// The streamed GEMVs (`gemv_swiglu_stream_<type>`, and the k-quants' `gemv_stream_<type>`)
/// against their twins on `gemv_swiglu_blocks`'s and `gemv_blocks`'s shapes (those whose
/// rows are whole 16-byte pieces, every matrix streamed however few its rows; the others
/// take `gemv_swiglu_<type>` and `gemv_<type>`): once as the engine plans it, once as if
/// the GPU had 2 SMs and a block room for two or three stages of one or two rows, so that
/// each block walks hundreds of tiles and every stage is filled again and again. Each pass
/// must have launched every GGUF type's streamed kernels (the profile's launches), so that
/// a plan that fell back to the others everywhere would not pass for it.
fn gemv_stream_blocks(g: &Gpu, rng: &mut StdRng) {
    assert!(
        g.kernels.gemv_swiglu_stream_q4_k.is_some() && g.kernels.gemv_stream_q4_k.is_some(),
        "this GPU's PTX has no streamed GEMV (it needs sm_90a)"
    );
    let mut small = g.clone();
    (small.sm_count, small.stream_bytes, small.stream_one_bytes) = (2, 24 * 1024, 32 * 1024);
    for g in [g, &small] {
        let mut g = g.clone();
        (g.gemv_stream, g.stream_min_rows) = (true, 1);
        g.profile_start();
        gemv_swiglu_blocks(&g, rng);
        gemv_blocks(&g, rng);
        let launches = g.profile_stop().unwrap();
        for ty in BlockType::ALL.into_iter().filter(|&t| t != BlockType::Fp8) {
            let one = ty.block_len() == 256; // the k-quants stream one matrix too
            let names = [
                format!("gemv_swiglu_stream_{ty}"),
                format!("gemv_stream_{ty}"),
            ];
            for name in &names[..1 + one as usize] {
                assert!(
                    launches.iter().any(|k| k.kernel == *name),
                    "{name} never ran ({} SMs, {} and {} bytes of stages)",
                    g.sm_count,
                    g.stream_bytes,
                    g.stream_one_bytes
                );
            }
        }
    }
}

/// Every block type's GEMV against its twin: one row and rows past a block's 4, widths of
/// one block to a down projection's, 1 to 8 tokens, a wider output row (`out_stride`), bias
/// and accumulation. The GGUF types take the activations as the twin's codes; fp8 as
/// floats, with one past f16's 65504 (the kernel rounds them to f16 after a scale of 2^-8,
/// so that such an outlier stays finite). Columns past `n_out` must stay as they were
/// (poison).
fn gemv_blocks(g: &Gpu, rng: &mut StdRng) {
    for ty in BlockType::ALL {
        let shapes: &[(usize, usize, usize, usize, bool, bool)] = &[
            (256, 1, 1, 1, false, false),
            (512, 37, 3, 40, true, false),
            (4096, 100, 1, 100, false, true),
            (14336, 33, 8, 33, false, true),
            (4096, 1000, 1, 1000, false, false),
            (2048, 16, 5, 17, true, true),
            (768, 7, 2, 9, true, true),
        ];
        for &(n_in, n_out, n_tokens, stride, bias, accumulate) in shapes {
            let (w, scales) =
                rustle::cpu::quant::random_blocks(ty, n_out, n_in, 0.05, rng.random());
            let mut x = normal(rng, n_tokens * n_in, 1.0);
            if ty == BlockType::Fp8 && n_tokens > 1 {
                x[n_in + 7] = 1.0e5;
            }
            let b = bias.then(|| normal(rng, n_out, 1.0));
            let start: Vec<f32> = if accumulate {
                normal(rng, n_tokens * stride, 1.0)
            } else {
                vec![f32::NAN; n_tokens * stride]
            };
            let mut cpu = start.clone();
            let mut out = up(g, &start);
            let shape = MatmulShape::new(n_tokens, n_in, n_out, stride, accumulate);
            let w_dev = on_device(g, &w, &scales);
            let b_dev = b.as_ref().map(|b| up(g, b));
            let b_view = b_dev.as_ref().map(|b| b.as_view());
            if ty == BlockType::Fp8 {
                rustle::cpu::quant::gemv_fp8(
                    &mut cpu,
                    &x,
                    &w,
                    scales.as_deref(),
                    b.as_deref(),
                    shape,
                );
                g.gemv_blocks(
                    &mut out.as_view_mut(),
                    &up(g, &x).as_view(),
                    &w_dev.view(ty),
                    b_view.as_ref(),
                    shape,
                )
                .unwrap();
            } else {
                let (codes, code_scales) = q8_codes(&x);
                rustle::cpu::quant::gemv_codes(
                    &mut cpu,
                    &codes,
                    &code_scales,
                    blocks_ref(ty, &w, &scales),
                    b.as_deref(),
                    shape,
                );
                g.gemv_codes(
                    &mut out.as_view_mut(),
                    &up(g, &codes).as_view(),
                    &up(g, &code_scales).as_view(),
                    &w_dev.view(ty),
                    b_view.as_ref(),
                    shape,
                )
                .unwrap();
            }
            let out = down(g, &out);
            let what = format!(
                "{ty} {n_out} x {n_in}, {n_tokens} tokens, stride {stride}, bias {bias}, accumulate {accumulate}"
            );
            let start = Some(&start[..]);
            assert_strided(&what, &out, &cpu, start, shape, LONG_REDUCTION);
        }
    }
}

/// The GEMVs of a matrix of two types (`gemv_<a>_<b>`) against their twins: a first part of
/// one row to more than a block's, its end inside a block's rows or on their edge, 1 to 8
/// tokens, a wider output row, bias and accumulation. Columns past `n_out` must stay as
/// they were (poison).
fn gemv_two_types(g: &Gpu, rng: &mut StdRng) {
    use rustle::cpu::quant::{gemv_q4_k_q6_k, gemv_q5_k_q6_k};
    type Twin = fn(&mut [f32], &[u8], &[f32], &[u8], &[u8], Option<&[f32]>, MatmulShape);
    let pairs: [(BlockType, BlockType, Twin); 2] = [
        (BlockType::Q4K, BlockType::Q6K, gemv_q4_k_q6_k),
        (BlockType::Q5K, BlockType::Q6K, gemv_q5_k_q6_k),
    ];
    for (a, b, twin) in pairs {
        let shapes: &[(usize, usize, usize, usize, usize, bool, bool)] = &[
            (256, 1, 40, 1, 40, false, false),
            (4096, 61, 100, 1, 100, false, true),
            (2048, 32, 70, 8, 71, true, true),
            (768, 33, 36, 3, 40, true, false),
        ];
        for &(n_in, n_first, n_out, n_tokens, stride, bias, accumulate) in shapes {
            let (w_a, _) = rustle::cpu::quant::random_blocks(a, n_first, n_in, 0.05, rng.random());
            let (w_b, _) =
                rustle::cpu::quant::random_blocks(b, n_out - n_first, n_in, 0.05, rng.random());
            let x = normal(rng, n_tokens * n_in, 1.0);
            let (codes, code_scales) = q8_codes(&x);
            let bias_v = bias.then(|| normal(rng, n_out, 1.0));
            let start: Vec<f32> = if accumulate {
                normal(rng, n_tokens * stride, 1.0)
            } else {
                vec![f32::NAN; n_tokens * stride]
            };
            let mut cpu = start.clone();
            // `n_first` is the first matrix's rows: its bytes say it, to twin and wrapper.
            let shape = MatmulShape::new(n_tokens, n_in, n_out, stride, accumulate);
            twin(
                &mut cpu,
                &codes,
                &code_scales,
                &w_a,
                &w_b,
                bias_v.as_deref(),
                shape,
            );
            let mut out = up(g, &start);
            let b_dev = bias_v.as_ref().map(|b| up(g, b));
            let (w_a_dev, w_b_dev) = (on_device(g, &w_a, &None), on_device(g, &w_b, &None));
            g.gemv_codes_two(
                &mut out.as_view_mut(),
                &up(g, &codes).as_view(),
                &up(g, &code_scales).as_view(),
                (&w_a_dev.view(a), &w_b_dev.view(b)),
                b_dev.as_ref().map(|b| b.as_view()).as_ref(),
                shape,
            )
            .unwrap();
            let what = format!(
                "{a} then {b}, {n_first} and {n_out} rows of {n_in}, {n_tokens} tokens, stride {stride}, bias {bias}, accumulate {accumulate}"
            );
            let out = down(g, &out);
            assert_strided(&what, &out, &cpu, Some(&start[..]), shape, LONG_REDUCTION);
        }
    }
}

/// Every block type's fused gate-and-up GEMV against its twin (fp8 on the activations as
/// they are, the GGUF types on their codes): one block of the k-quants to more rows than a
/// wave of blocks, 1 to 8 tokens, a wider output row. Columns past `n_out`
/// must stay as they were (poison). (At least 32 rows a shape: the error of one output
/// alone, where its sums nearly cancel, says little.)
fn gemv_swiglu_blocks(g: &Gpu, rng: &mut StdRng) {
    for ty in BlockType::ALL {
        for (n_in, n_out, n_tokens, stride) in [
            (256, 40, 1, 40),
            (768, 37, 3, 40),
            (4096, 5000, 1, 5000),
            (2048, 32, 8, 33),
        ] {
            let [(w_gate, gate_scales), (w_up, up_scales)] = [0.05, 0.05]
                .map(|s| rustle::cpu::quant::random_blocks(ty, n_out, n_in, s, rng.random()));
            let x = normal(rng, n_tokens * n_in, 1.0);
            let start = vec![f32::NAN; n_tokens * stride];
            let mut cpu = start.clone();
            let mut out = up(g, &start);
            let shape = MatmulShape::new(n_tokens, n_in, n_out, stride, false);
            let w_gate_dev = on_device(g, &w_gate, &gate_scales);
            let w_up_dev = on_device(g, &w_up, &up_scales);
            if let (Some(gate_scales), Some(up_scales)) = (&gate_scales, &up_scales) {
                // fp8 multiplies the activations as they are.
                rustle::cpu::quant::gemv_swiglu_fp8(
                    &mut cpu,
                    &x,
                    &w_gate,
                    &w_up,
                    gate_scales,
                    up_scales,
                    shape,
                );
                g.gemv_swiglu_fp8(
                    &mut out.as_view_mut(),
                    &up(g, &x).as_view(),
                    &w_gate_dev.view(ty),
                    &w_up_dev.view(ty),
                    shape,
                )
                .unwrap();
            } else {
                let (codes, code_scales) = q8_codes(&x);
                rustle::cpu::quant::gemv_swiglu_codes(
                    &mut cpu,
                    &codes,
                    &code_scales,
                    blocks_ref(ty, &w_gate, &gate_scales),
                    blocks_ref(ty, &w_up, &up_scales),
                    shape,
                );
                g.gemv_swiglu_codes(
                    &mut out.as_view_mut(),
                    &up(g, &codes).as_view(),
                    &up(g, &code_scales).as_view(),
                    &w_gate_dev.view(ty),
                    &w_up_dev.view(ty),
                    shape,
                )
                .unwrap();
            }
            let out = down(g, &out);
            let what = format!("{ty} {n_out} x {n_in}, {n_tokens} tokens, stride {stride}");
            assert_strided(&what, &out, &cpu, None, shape, SWIGLU_OF_SUMS);
        }
    }
}

/// Every block type's dequantizer against its twin: whole matrices to bf16, gathered rows
/// (the embedding) to f32. 257 rows of 96 weights, where a type's blocks fit them, are an
/// odd number of blocks (771 for the 32-weight types): Q8_0's last piece of the matrix then
/// starts half a word in, the end case of `dequant_q8_0_pieces`' loads.
fn dequant_blocks(g: &Gpu, rng: &mut StdRng) {
    for ty in BlockType::ALL {
        let shapes = [(1, 256), (37, 512), (300, 4096), (257, 96)];
        for (rows, n_in) in shapes.into_iter().filter(|&(_, n_in)| ty.fits(n_in)) {
            let (w, scales) = rustle::cpu::quant::random_blocks(ty, rows, n_in, 0.5, rng.random());
            let (w_host, w_dev) = (blocks_ref(ty, &w, &scales), on_device(g, &w, &scales));
            // The whole matrix to bf16, into a poisoned buffer.
            let mut cpu = vec![0u16; rows * n_in];
            rustle::cpu::quant::dequant_blocks(Some(&mut cpu), None, w_host, None, rows, n_in);
            let mut out = up(g, &vec![0x7fc0u16; rows * n_in]);
            let out_view = &mut out.as_view_mut();
            unsafe { g.dequant_blocks(Some(out_view), None, &w_dev.view(ty), None, rows, n_in) }
                .unwrap();
            let as_f32 = |v: &[u16]| {
                v.iter()
                    .map(|&b| half::bf16::from_bits(b).to_f32())
                    .collect::<Vec<_>>()
            };
            let what = format!("{ty} {rows} x {n_in} to bf16");
            // Equal but where the two round an f32 a last bit apart before bf16.
            assert_close(&what, &as_f32(&down(g, &out)), &as_f32(&cpu), 5e-3);
            // Rows gathered by id, to f32.
            let ids: Vec<u32> = (0..7).map(|_| rng.random_range(0..rows as u32)).collect();
            let mut cpu = vec![0f32; ids.len() * n_in];
            let (some_ids, n_ids) = (Some(&ids[..]), ids.len());
            rustle::cpu::quant::dequant_blocks(None, Some(&mut cpu), w_host, some_ids, n_ids, n_in);
            let mut out = poisoned(g, ids.len() * n_in);
            let ids_dev = up(g, &ids);
            // SAFETY: every id is a row of the matrix.
            unsafe {
                g.dequant_blocks(
                    None,
                    Some(&mut out.as_view_mut()),
                    &w_dev.view(ty),
                    Some(&ids_dev.as_view()),
                    ids.len(),
                    n_in,
                )
            }
            .unwrap();
            assert_close(
                &format!("{ty} {rows} x {n_in}, rows {ids:?}"),
                &down(g, &out),
                &cpu,
                ELEMENTWISE,
            );
        }
    }
}

/// The lesson's GEMV steps against their twins: rows past a block of 256 threads (step 1)
/// or of 8 warps (step 2), widths that are not a multiple of a warp, one row, one column.
fn gemv_steps(g: &Gpu, rng: &mut StdRng) {
    type Step = fn(&Gpu, &mut Out<f32>, &In<f32>, &In<u16>, usize, usize) -> rustle::Result<()>;
    type Twin = fn(&mut [f32], &[f32], &[u16], usize);
    let steps: [(&str, Step, Twin); 2] = [
        (
            "step 1",
            Gpu::gemv_step1_thread_per_row_bf16,
            ops::gemv_step1_thread_per_row_bf16,
        ),
        (
            "step 2",
            Gpu::gemv_step2_warp_per_row_bf16,
            ops::gemv_step2_warp_per_row_bf16,
        ),
    ];
    for (name, gpu, twin) in steps {
        for (n_in, n_out) in [(64, 1), (100, 257), (4096, 1000), (1, 9), (2048, 4099)] {
            let x = normal(rng, n_in, 1.0);
            let w = bf16_weights(rng, n_out * n_in, 0.05);
            let mut cpu = vec![0.0; n_out];
            twin(&mut cpu, &x, &w, n_in);
            let mut out = poisoned(g, n_out);
            let (xd, wd) = (up(g, &x), up(g, &w));
            gpu(
                g,
                &mut out.as_view_mut(),
                &xd.as_view(),
                &wd.as_view(),
                n_in,
                n_out,
            )
            .unwrap();
            let what = format!("{name}: {n_out} x {n_in}");
            assert_close(&what, &down(g, &out), &cpu, LONG_REDUCTION);
        }
    }
}

fn gemv_swiglu_bf16(g: &Gpu, rng: &mut StdRng) {
    for (n_in, n_out) in [(64, 96), (576, 1536), (4096, 14336), (8, 5)] {
        let x = normal(rng, n_in, 1.0);
        let (wg, wu) = (
            bf16_weights(rng, n_out * n_in, 0.1),
            bf16_weights(rng, n_out * n_in, 0.1),
        );
        let mut cpu = vec![0.0; n_out];
        ops::gemv_swiglu_bf16(&mut cpu, &x, &wg, &wu, n_in);
        let mut out = poisoned(g, n_out);
        g.gemv_swiglu_bf16(
            &mut out.as_view_mut(),
            &up(g, &x).as_view(),
            &up(g, &wg).as_view(),
            &up(g, &wu).as_view(),
            n_in,
            n_out,
        )
        .unwrap();
        assert_close(
            &format!("{n_out} x {n_in}"),
            &down(g, &out),
            &cpu,
            LONG_REDUCTION,
        );
    }
}

/// A GPU GEMM and its CPU twin: `out [n, n_out] = x [n, n_in] . w^T + bias`, x of type X.
/// The GPU one is `Gpu::gemm_*`, or a closure around one with its launch plan fixed.
type GemmCpu<X> = fn(&mut [f32], &[X], &[u16], Option<&[f32]>, usize);

/// Shapes with tails on every side of the tiles (64 for the SIMT GEMM, 128 for the tensor
/// cores), a deep reduction, and a bias or none.
fn check_gemm<X: cudarc::driver::DeviceRepr>(
    g: &Gpu,
    rng: &mut StdRng,
    gpu: impl Fn(&Gpu, &mut Out<f32>, &In<X>, &In<u16>, Option<&In<f32>>, usize) -> rustle::Result<()>,
    cpu: GemmCpu<X>,
    input: fn(&mut StdRng, usize) -> Vec<X>,
    shapes: &[(usize, usize, usize, bool)],
) {
    for &(n, n_in, n_out, bias) in shapes {
        let x = input(rng, n * n_in);
        let w = bf16_weights(rng, n_out * n_in, 0.05);
        let b = bias.then(|| normal(rng, n_out, 1.0));
        let mut expected = vec![0.0; n * n_out];
        cpu(&mut expected, &x, &w, b.as_deref(), n_in);
        let mut out = poisoned(g, n * n_out);
        let b_dev = b.as_ref().map(|b| up(g, b));
        let b_view = b_dev.as_ref().map(|b| b.as_view());
        gpu(
            g,
            &mut out.as_view_mut(),
            &up(g, &x).as_view(),
            &up(g, &w).as_view(),
            b_view.as_ref(),
            n_in,
        )
        .unwrap();
        assert_close(
            &format!("{n} tokens, {n_out} x {n_in}, bias {bias}"),
            &down(g, &out),
            &expected,
            LONG_REDUCTION,
        );
    }
}

fn gemm_step1_simt_bf16(g: &Gpu, rng: &mut StdRng) {
    let shapes = [
        (2, 64, 64, false),
        (7, 576, 192, true),
        (65, 100, 130, false),
        (128, 1536, 576, true),
        (200, 8, 3, false),
        (300, 4096, 1024, false),
    ];
    let input = |rng: &mut StdRng, len| normal(rng, len, 1.0);
    check_gemm(
        g,
        rng,
        Gpu::gemm_step1_simt_bf16,
        ops::gemm_step1_simt_bf16,
        input,
        &shapes,
    );
}

/// Both sides take the same bf16 inputs, so they differ only in summation order. The small
/// grids with deep reductions (1024 and up) run split in two, one with an odd number of
/// steps and a bias.
fn gemm_mma_bf16(g: &Gpu, rng: &mut StdRng) {
    let input = |rng: &mut StdRng, len| bf16_weights(rng, len, 1.0);
    let gpu = |g: &Gpu, o: &mut Out<f32>, x: &In<u16>, w: &In<u16>, b: Option<&In<f32>>, n_in| {
        g.gemm_mma_bf16(o, bf16_ops(x, w, b), n_in)
    };
    check_gemm(g, rng, gpu, ops::gemm_mma_bf16, input, &TENSOR_GEMM_SHAPES);
}

/// A bf16 GEMM's operands, views of the test's buffers.
fn bf16_ops<'a>(x: &'a In<u16>, w: &'a In<u16>, bias: Option<&'a In<f32>>) -> Bf16Operands<'a> {
    Bf16Operands {
        x: x.slice(..),
        w: w.slice(..),
        bias: bias.map(|b| b.slice(..)),
    }
}

/// The same shapes as `gemm_mma_bf16`, with the plans `gemm_plan` picks; then every tile
/// width and split, over tails on every side (rows past a tile, a reduction that ends
/// inside a 64-wide step, features past a tile, a tile of at most 64 tokens whose second
/// warpgroup has no rows, a split whose last parts have no steps).
fn gemm_wgmma_bf16(g: &Gpu, rng: &mut StdRng) {
    let input = |rng: &mut StdRng, len| bf16_weights(rng, len, 1.0);
    let cpu = ops::gemm_wgmma_bf16;
    // Room for any split of any shape below: the kernel's parts, added in order after it.
    let mut parts: CudaSlice<f32> = g.zeros(8 * 300 * 4096, "split sums").unwrap();
    let parts = std::cell::RefCell::new(&mut parts);
    let gpu = |g: &Gpu, o: &mut Out<f32>, x: &In<u16>, w: &In<u16>, b: Option<&In<f32>>, n_in| {
        let mut parts = parts.borrow_mut();
        g.gemm_wgmma_bf16(o, bf16_ops(x, w, b), n_in, &mut parts.as_view_mut())
    };
    check_gemm(g, rng, gpu, cpu, input, &TENSOR_GEMM_SHAPES);
    for tile_n in [128, 192, 224, 256] {
        for k_splits in WGMMA_SPLITS {
            let plan = GemmPlan { tile_n, k_splits };
            let shapes = [
                (130, 1096, 500, true),
                (64, 2048, 224, false),
                (5, 4104, 300, true),
            ];
            let planned =
                |g: &Gpu, o: &mut Out<f32>, x: &In<u16>, w: &In<u16>, b: Option<&In<f32>>, n_in| {
                    let mut parts = parts.borrow_mut();
                    let p = &mut parts.as_view_mut();
                    g.gemm_wgmma_planned(plan, o, bf16_ops(x, w, b), n_in, p, false)
                };
            check_gemm(g, rng, planned, cpu, input, &shapes);
        }
    }

    // A split plan adding into what the output holds (the residual add of o_proj and down).
    for k_splits in [2, 4, 8] {
        let plan = GemmPlan {
            tile_n: 128,
            k_splits,
        };
        let (n, n_in, n_out) = (40, 4104, 300);
        let (x, w) = (input(rng, n * n_in), bf16_weights(rng, n_out * n_in, 0.05));
        let before = normal(rng, n * n_out, 1.0);
        let mut expected = vec![0.0; n * n_out];
        cpu(&mut expected, &x, &w, None, n_in);
        for (e, b) in expected.iter_mut().zip(&before) {
            *e += b;
        }
        let mut out = up(g, &before);
        let mut parts = parts.borrow_mut();
        let (x_dev, w_dev) = (up(g, &x), up(g, &w));
        g.gemm_wgmma_planned(
            plan,
            &mut out.as_view_mut(),
            bf16_ops(&x_dev.as_view(), &w_dev.as_view(), None),
            n_in,
            &mut parts.as_view_mut(),
            true,
        )
        .unwrap();
        let what = format!("{n} tokens, {n_out} x {n_in}, split {k_splits}, accumulated");
        assert_close(&what, &down(g, &out), &expected, LONG_REDUCTION);
    }
}

/// The plans measured for two shapes of no model's (so that no model test's measuring
/// touches them) at 32 and 64 rows: each one of the candidates, timed no slower than the
/// estimate's, kept in the file, taken by the GEMM for every count of rows it stands for;
/// and the GEMM on them held to its twin.
fn gemm_tuning(g: &Gpu, rng: &mut StdRng) {
    let dir = std::env::temp_dir().join(format!("rustle-gemm-plans-{}", std::process::id()));
    let path = dir.join("plans.json");
    let shapes = [(1088, 704), (2112, 320)];
    gemm_tuning::tune_with(g, &shapes, 64, Some(&path));
    let kept = tuned_plans::load(&path, &g.description, g.kernels_hash).measured();
    assert_eq!(kept.len(), 4, "two shapes at 32 and 64 rows: {kept:?}");
    for m in &kept {
        let (rows, n_in, n_out) = (m.shape.rows, m.shape.n_in, m.shape.n_out);
        assert!(
            gemm_plan::wgmma_candidates(n_in).any(|p| p == m.plan),
            "{m:?}"
        );
        assert!(m.us > 0.0 && m.us <= m.estimate_us, "{m:?}");
        for n in [rows / 2 + 1, rows] {
            assert_eq!(
                g.wgmma_plan(n, n_in, n_out).unwrap(),
                m.plan,
                "{n} rows: {m:?}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    let input = |rng: &mut StdRng, len| bf16_weights(rng, len, 1.0);
    let mut parts: CudaSlice<f32> = g.zeros(8 * 64 * 704, "split sums").unwrap();
    let parts = std::cell::RefCell::new(&mut parts);
    let gpu = |g: &Gpu, o: &mut Out<f32>, x: &In<u16>, w: &In<u16>, b: Option<&In<f32>>, n_in| {
        let mut parts = parts.borrow_mut();
        g.gemm_wgmma_bf16(o, bf16_ops(x, w, b), n_in, &mut parts.as_view_mut())
    };
    let shapes = [
        (20, 1088, 704, true),
        (64, 1088, 704, false),
        (33, 2112, 320, true),
    ];
    check_gemm(g, rng, gpu, ops::gemm_wgmma_bf16, input, &shapes);
}

/// One shape of a GEMM over GGUF blocks: `n` tokens of `n_in` by `n_out` features into rows
/// of `stride`, with or without bias and accumulation.
#[derive(Clone, Copy)]
struct BlocksShape {
    n_in: usize,
    n_out: usize,
    n: usize,
    stride: usize,
    bias: bool,
    accumulate: bool,
}

/// Holds a GEMM over GGUF blocks (`launch(out, x, w, bias, shape, split)`) to its twin's
/// sums (`twin(out, x, w, bias)` on the host) for one shape on fresh random inputs, once
/// for each `(parts, split)` of `splits`: one part straight into the poisoned or
/// accumulated output, more into poisoned parts (rows of `n_out`, not accumulated) that
/// `gemm_skinny_reduce_f32` then adds; every output checked by `assert_strided` (the
/// stride's extra columns must keep their poison).
fn check_blocks_gemm<S: Copy + std::fmt::Debug>(
    g: &Gpu,
    rng: &mut StdRng,
    ty: BlockType,
    shape: BlocksShape,
    twin: impl Fn(&mut [f32], &[u16], &[u8], Option<&[f32]>),
    splits: impl IntoIterator<Item = (usize, S)>,
    launch: impl Fn(&mut Out<f32>, &In<u16>, &BlocksIn, Option<&In<f32>>, MatmulShape, S),
) {
    let BlocksShape {
        n_in,
        n_out,
        n,
        stride,
        bias,
        accumulate,
    } = shape;
    let (w, _) = rustle::cpu::quant::random_blocks(ty, n_out, n_in, 0.05, rng.random());
    let x = bf16_weights(rng, n * n_in, 1.0);
    let b = bias.then(|| normal(rng, n_out, 1.0));
    let start: Vec<f32> = if accumulate {
        normal(rng, n * stride, 1.0)
    } else {
        vec![f32::NAN; n * stride]
    };
    let mut cpu = start.clone();
    twin(&mut cpu, &x, &w, b.as_deref());
    let (x_dev, w_dev) = (up(g, &x), on_device(g, &w, &None));
    let (x_view, w_view) = (x_dev.as_view(), w_dev.view(ty));
    let b_dev = b.as_ref().map(|b| up(g, b));
    let b_view = b_dev.as_ref().map(|b| b.as_view());
    let matmul = MatmulShape::new(n, n_in, n_out, stride, accumulate);
    for (parts, split) in splits {
        let mut out = up(g, &start);
        if parts == 1 {
            let b = b_view.as_ref();
            launch(&mut out.as_view_mut(), &x_view, &w_view, b, matmul, split);
        } else {
            let mut sums = poisoned(g, parts * n * n_out);
            let part = MatmulShape::new(n, n_in, n_out, n_out, false);
            launch(&mut sums.as_view_mut(), &x_view, &w_view, None, part, split);
            g.gemm_skinny_reduce_f32(
                &mut out.as_view_mut(),
                &sums.as_view(),
                b_view.as_ref(),
                n_out,
                accumulate,
            )
            .unwrap();
        }
        let out = down(g, &out);
        let what = format!(
            "{ty} {n_out} x {n_in}, {n} tokens, stride {stride}, bias {bias}, accumulate {accumulate}, split {split:?}"
        );
        assert_strided(&what, &out, &cpu, Some(&start), matmul, LONG_REDUCTION);
    }
}

/// `(n_in, n_out, n, stride, bias, accumulate)` as a `BlocksShape`.
fn blocks_shape(s: &(usize, usize, usize, usize, bool, bool)) -> BlocksShape {
    let &(n_in, n_out, n, stride, bias, accumulate) = s;
    BlocksShape {
        n_in,
        n_out,
        n,
        stride,
        bias,
        accumulate,
    }
}

/// Every GGUF type's tensor-core GEMM against its twin: 1 to 64 tokens (one, two, four and
/// eight tiles of 8, and part-filled tiles), a row and rows past a block's 128, widths of a
/// block to a down projection's, a wider output row (`out_stride`, whose extra columns must
/// keep their poison), bias and accumulation; then the same shapes with the reduction split
/// 2, 3 and 8 ways, the parts added by `gemm_skinny_reduce_f32`.
fn gemm_blocks(g: &Gpu, rng: &mut StdRng) {
    let shapes: &[(usize, usize, usize, usize, bool, bool)] = &[
        (256, 1, 9, 1, false, false),
        (512, 37, 16, 40, true, false),
        (1280, 130, 12, 131, true, true),
        (768, 7, 1, 9, true, true),
        (2048, 130, 33, 130, false, true),
        (4096, 300, 64, 300, false, true),
        (14336, 33, 24, 33, true, false),
    ];
    for ty in BlockType::ALL.into_iter().filter(|&t| t != BlockType::Fp8) {
        for shape in shapes.iter().map(blocks_shape) {
            let BlocksShape {
                n_in,
                n_out,
                n,
                stride,
                ..
            } = shape;
            if !ty.fits(n_in) {
                continue;
            }
            let twin = |out: &mut [f32], x: &[u16], w: &[u8], b: Option<&[f32]>| {
                let acc = shape.accumulate;
                let matmul = MatmulShape::new(n, n_in, n_out, stride, acc);
                rustle::cpu::quant::gemm_blocks(out, x, blocks_ref(ty, w, &None), b, matmul);
            };
            // Splits that would leave a part with no 256-deep chunk are not taken.
            let chunks = n_in / 256;
            let splits = [1, 2, 3, 8]
                .into_iter()
                .filter(|&k| k == 1 || (stride == n_out && (k - 1) * chunks.div_ceil(k) < chunks));
            let launch =
                |out: &mut Out<f32>, x: &In<u16>, w: &BlocksIn, b: Option<&In<f32>>, matmul, k| {
                    g.gemm_blocks(out, x, w, b, matmul, k).unwrap()
                };
            check_blocks_gemm(g, rng, ty, shape, twin, splits.map(|k| (k, k)), launch);
        }
    }
}

/// The GGUF blocks' warpgroup GEMM against its twin: token counts past a tile of 128 and
/// of 256 on both plans' tiles, one row and rows past a block's 128, a reduction of one
/// stage and of many, a wider output row (whose extra columns keep their poison), bias and
/// accumulation; then the reduction split 2, 3 and 8 ways, the parts added by
/// `gemm_skinny_reduce_f32`; then the plan the engine takes for each shape.
fn gemm_wgmma_blocks(g: &Gpu, rng: &mut StdRng) {
    let shapes: &[(usize, usize, usize, usize, bool, bool)] = &[
        (256, 1, 65, 1, false, false),
        (512, 130, 129, 131, true, false),
        (1280, 300, 300, 300, false, true),
        (4096, 256, 200, 256, true, true),
        (2048, 64, 513, 70, false, false),
        (14336, 130, 129, 130, true, false),
    ];
    // Every GGUF type (fp8 has its own kernel, `gemm_wgmma_fp8`).
    for ty in BlockType::ALL.into_iter().filter(|&t| t != BlockType::Fp8) {
        let taken: Vec<BlocksShape> = shapes
            .iter()
            .map(blocks_shape)
            .filter(|s| g.has_wgmma_blocks(ty, s.n_in))
            .collect();
        // Q6_K's rows are whole 16-byte pieces from 2048 weights on: it takes the last three.
        let expected = if ty == BlockType::Q6K {
            3
        } else {
            shapes.len()
        };
        assert_eq!(
            taken.len(),
            expected,
            "gemm_wgmma_{ty} is in the sm_90a build"
        );
        for &shape in &taken {
            gemm_wgmma_blocks_shape(g, rng, ty, shape);
        }
    }
}

/// `gemm_wgmma_blocks`'s checks of one type and shape: every tile and split, then the
/// engine's plan.
fn gemm_wgmma_blocks_shape(g: &Gpu, rng: &mut StdRng, ty: BlockType, shape: BlocksShape) {
    let BlocksShape {
        n_in,
        n_out,
        n,
        stride,
        ..
    } = shape;
    let twin = |out: &mut [f32], x: &[u16], w: &[u8], b: Option<&[f32]>| {
        let matmul = MatmulShape::new(n, n_in, n_out, stride, shape.accumulate);
        rustle::cpu::quant::gemm_blocks(out, x, blocks_ref(ty, w, &None), b, matmul);
    };
    // Splits past the last stage are kept: their parts must be zeros.
    let engine = g.wgmma_blocks_plan(n, n_in, n_out);
    let plans = [128, 256]
        .into_iter()
        .flat_map(|tile_n| [1, 2, 3, 8].map(|k_splits| GemmPlan { tile_n, k_splits }))
        .chain([engine])
        .filter(|p| p.k_splits == 1 || stride == n_out)
        .map(|p| (p.k_splits, p));
    let launch =
        |out: &mut Out<f32>, x: &In<u16>, w: &BlocksIn, b: Option<&In<f32>>, matmul, plan| {
            g.gemm_wgmma_blocks(out, x, w, b, matmul, plan).unwrap()
        };
    check_blocks_gemm(g, rng, ty, shape, twin, plans, launch);
}

/// The batched-decode matmul, both sides on the same bf16 inputs: token counts on every
/// side of each body's tile count (1, 2, 4, 8, 16 tiles of 8), reductions that end inside a
/// 128-deep chunk, features past a 128-wide tile, with and without bias and accumulation,
/// the reduction split every way the kernel takes; then the split's second half alone.
fn gemm_skinny_bf16(g: &Gpu, rng: &mut StdRng) {
    let shapes = [
        (1, 64, 64),
        (2, 576, 192),
        (7, 136, 130),
        (8, 1536, 576),
        (9, 4096, 300),
        (16, 8, 3),
        (31, 1032, 200),
        (33, 2048, 1000),
        (64, 576, 1536),
        (100, 1096, 257),
        (128, 4096, 512),
    ];
    for (i, &(n, n_in, n_out)) in shapes.iter().enumerate() {
        let (bias, accumulate) = (i % 2 == 0, i % 3 == 0);
        let x = bf16_weights(rng, n * n_in, 1.0);
        let w = bf16_weights(rng, n_out * n_in, 0.05);
        let b = bias.then(|| normal(rng, n_out, 1.0));
        let start = normal(rng, n * n_out, 1.0);
        let mut expected = start.clone();
        ops::gemm_skinny_bf16(&mut expected, &x, &w, b.as_deref(), n_in, accumulate);
        let (x_dev, w_dev) = (up(g, &x), up(g, &w));
        let b_dev = b.as_ref().map(|b| up(g, b));
        let b_view = b_dev.as_ref().map(|b| b.as_view());
        let chunks = n_in.div_ceil(64);
        for splits in [1, 2, 3, 8].into_iter().filter(|&s| s <= chunks.max(1)) {
            // The output starts as `start` when accumulating, else as NaN.
            let mut out = if accumulate {
                up(g, &start)
            } else {
                poisoned(g, n * n_out)
            };
            let mut parts = poisoned(g, 8 * n * n_out);
            g.gemm_skinny_planned(
                splits,
                &mut out.as_view_mut(),
                bf16_ops(&x_dev.as_view(), &w_dev.as_view(), b_view.as_ref()),
                n_in,
                accumulate,
                &mut parts.as_view_mut(),
            )
            .unwrap();
            let what = format!(
                "{n} tokens, {n_out} x {n_in}, bias {bias}, accumulate {accumulate}, {splits} splits"
            );
            assert_close(&what, &down(g, &out), &expected, LONG_REDUCTION);
        }
    }
    // The second half alone: three parts of 5 x 7, added in order to a running output.
    let (len, n_out) = (35, 7);
    let parts = normal(rng, 3 * len, 1.0);
    let (start, bias) = (normal(rng, len, 1.0), normal(rng, n_out, 1.0));
    let mut expected = start.clone();
    ops::gemm_skinny_reduce_f32(&mut expected, &parts, Some(&bias), n_out, true);
    let mut out = up(g, &start);
    g.gemm_skinny_reduce_f32(
        &mut out.as_view_mut(),
        &up(g, &parts).as_view(),
        Some(&up(g, &bias).as_view()),
        n_out,
        true,
    )
    .unwrap();
    assert_close("reduce, 3 parts", &down(g, &out), &expected, ELEMENTWISE);
}

/// (tokens, n_in, n_out, bias) for the tensor-core GEMMs.
/// fp8's tensor cores sum the products in an accumulator of their own, with fewer bits
/// than f32 (DeepSeek-V3's report measures about 14 bits kept on Hopper), so a long
/// reduction drifts further from the twin's f32 sum than bf16's products do: up to 2.6e-3
/// on the H200 over the shapes below (4112-deep, unsplit), held to 3 times that.
const FP8_TENSOR_SUM: f64 = 8e-3;

/// A prompt's activations to e4m3 against the twin, bit for bit (the same division and
/// rounding: `cvt.rn.satfinite` and `f32_to_e4m3`), with a row of zeros and a row with an
/// outlier; then `gemm_wgmma_fp8` against its twin on those codes and random e4m3 weights,
/// over the tensor GEMMs' shapes (their reductions made whole 16s) with the plans
/// `gemm_plan` picks, then every tile width and split, and a split adding into the output.
fn gemm_wgmma_fp8(g: &Gpu, rng: &mut StdRng) {
    use rustle::cpu::quant;
    use rustle::gpu::kernels::gemm_wgmma::Fp8Operands;
    let quantize = |rng: &mut StdRng, n: usize, n_in: usize| {
        let mut x = normal(rng, n * n_in, 1.0);
        x[..n_in].fill(0.0);
        if n > 1 {
            x[n_in + 3] = 300.0;
        }
        let (mut codes, mut scales) = (vec![0u8; n * n_in], vec![0f32; n]);
        quant::quantize_fp8_f32(&mut codes, &mut scales, &x, n_in);
        let mut codes_dev = up(g, &vec![0xaau8; n * n_in]);
        let mut scales_dev = poisoned(g, n);
        g.quantize_fp8_f32(
            &mut codes_dev.as_view_mut(),
            &mut scales_dev.as_view_mut(),
            &up(g, &x).as_view(),
            n,
            n_in,
        )
        .unwrap();
        assert!(
            down(g, &codes_dev) == codes,
            "{n} x {n_in}: the codes differ"
        );
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(&down(g, &scales_dev)) == bits(&scales),
            "{n} x {n_in}: the scales differ"
        );
        (codes, scales)
    };
    let mut parts: CudaSlice<f32> = g.zeros(8 * 1100 * 4096, "split sums").unwrap();
    let mut worst = 0f64;
    let mut check = |rng: &mut StdRng,
                     (n, n_in, n_out, bias): (usize, usize, usize, bool),
                     plan: Option<GemmPlan>,
                     before: Option<Vec<f32>>| {
        let (x, x_scales) = quantize(rng, n, n_in);
        let w_f32 = normal(rng, n_out * n_in, 0.05);
        let (w, w_scales) = rustle::weights::blocks::quantize_fp8(&w_f32, n_in);
        let b = bias.then(|| normal(rng, n_out, 1.0));
        let mut expected = vec![0.0; n * n_out];
        quant::gemm_wgmma_fp8(
            &mut expected,
            &x,
            &x_scales,
            &w,
            &w_scales,
            b.as_deref(),
            n_in,
        );
        let accumulate = before.is_some();
        if let Some(before) = &before {
            for (e, b) in expected.iter_mut().zip(before) {
                *e += b;
            }
        }
        let mut out = match &before {
            Some(b) => up(g, b),
            None => poisoned(g, n * n_out),
        };
        let (xd, xsd, wd, wsd) = (up(g, &x), up(g, &x_scales), up(g, &w), up(g, &w_scales));
        let b_dev = b.as_ref().map(|b| up(g, b));
        let ops = || Fp8Operands {
            x: xd.as_view(),
            x_scales: xsd.as_view(),
            w: wd.as_view(),
            w_scales: wsd.as_view(),
            bias: b_dev.as_ref().map(|b| b.as_view()),
        };
        let (o, p) = (&mut out.as_view_mut(), &mut parts.as_view_mut());
        match plan {
            Some(plan) => g.gemm_wgmma_fp8_planned(plan, o, ops(), n_in, p, accumulate),
            None => g.gemm_wgmma_fp8(o, ops(), n_in, p, false),
        }
        .unwrap();
        let what = format!("{n} tokens, {n_out} x {n_in}, bias {bias}, plan {plan:?}");
        let got = down(g, &out);
        worst = worst.max(rel_err(&got, &expected));
        assert_close(&what, &got, &expected, FP8_TENSOR_SUM);
    };
    for (n, n_in, n_out, bias) in TENSOR_GEMM_SHAPES {
        check(rng, (n, n_in.next_multiple_of(16), n_out, bias), None, None);
    }
    // Rows longer than `quantize_fp8_f32` keeps in registers (16384 floats): read twice.
    check(rng, (3, 16400, 64, false), None, None);
    for tile_n in [128, 192, 224, 256] {
        for k_splits in WGMMA_SPLITS {
            let plan = Some(GemmPlan { tile_n, k_splits });
            for shape in [
                (130, 1104, 500, true),
                (64, 2048, 224, false),
                (5, 4112, 300, true),
            ] {
                check(rng, shape, plan, None);
            }
        }
    }
    for k_splits in [2, 4, 8] {
        let plan = Some(GemmPlan {
            tile_n: 128,
            k_splits,
        });
        let before = Some(normal(rng, 40 * 300, 1.0));
        check(rng, (40, 4112, 300, false), plan, before);
    }
    eprintln!("  gemm_wgmma_fp8 against its twin: largest relative error {worst:.2e}");
}

const TENSOR_GEMM_SHAPES: [(usize, usize, usize, bool); 11] = [
    (2, 64, 64, false),
    (7, 576, 192, true),
    (65, 104, 130, false),
    (128, 1536, 576, true),
    (200, 8, 3, false),
    (257, 96, 385, true),
    (300, 4096, 1024, false),
    (512, 14336, 256, false),
    (33, 1032, 200, true),
    (1000, 2048, 2048, false),
    (1100, 1536, 2100, true),
];

/// Powers of two keep every sum exact: the GPU and the CPU agree bit for bit.
fn mma_probe_bf16(g: &Gpu, _: &mut StdRng) {
    // (a, b, iters): 1/16 * 1/16, 1 * 2, -0.5 * 4.
    for (a, b, iters) in [
        (0x3d80, 0x3d80, 10),
        (0x3f80, 0x4000, 3),
        (0xbf00, 0x4080, 7),
    ] {
        let n = 512;
        let mut cpu = vec![0.0; n];
        ops::mma_probe_bf16(&mut cpu, a, b, iters);
        let mut out = poisoned(g, n);
        g.mma_probe_bf16(&mut out.as_view_mut(), a, b, iters)
            .unwrap();
        assert_eq!(down(g, &out), cpu, "a {a:#x} b {b:#x} iters {iters}");
    }
}

/// Rounding is exact arithmetic: the GPU and the CPU agree bit for bit, ties included.
fn f32_to_bf16(g: &Gpu, rng: &mut StdRng) {
    for len in [2, 1000, 4096 * 7] {
        let mut x = normal(rng, len, 3.0);
        // Values exactly halfway between two bf16: 1.00390625 rounds down to the even 1.0,
        // 1.01171875 up to the even 1.015625.
        x[0] = f32::from_bits(0x3f80_8000);
        x[len - 1] = f32::from_bits(0x3f81_8000);
        let mut cpu = vec![0u16; len];
        ops::f32_to_bf16(&mut cpu, &x);
        let mut out = up(g, &vec![0xffffu16; len]);
        g.f32_to_bf16(&mut out.as_view_mut(), &up(g, &x).as_view())
            .unwrap();
        assert_eq!(down(g, &out), cpu, "{len} values");
    }
}

fn rope_f32(g: &Gpu, rng: &mut StdRng) {
    let max_pos = 300;
    for (n, n_heads, head_dim) in [(1, 9, 64), (5, 32, 128), (17, 8, 64), (3, 3, 128)] {
        let half = head_dim / 2;
        let angles: Vec<f32> = (0..max_pos * half)
            .map(|_| rng.random_range(-10.0..10.0))
            .collect();
        let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
        let positions: Vec<u32> = (0..n)
            .map(|_| rng.random_range(0..max_pos as u32))
            .collect();
        let x = normal(rng, n * n_heads * head_dim, 1.0);
        let mut cpu = x.clone();
        ops::rope_f32(&mut cpu, &positions, &cos, &sin, n_heads, head_dim);
        let mut dev = up(g, &x);
        // SAFETY: the test builds valid ids, positions, slots and tables for its pool.
        unsafe {
            g.rope_f32(
                &mut dev.as_view_mut(),
                &up(g, &positions).as_view(),
                &up(g, &cos).as_view(),
                &up(g, &sin).as_view(),
                n_heads,
                head_dim,
            )
        }
        .unwrap();
        assert_close(
            &format!("n {n} heads {n_heads} head_dim {head_dim}"),
            &down(g, &dev),
            &cpu,
            ELEMENTWISE,
        );
    }
}

/// The keys and values land in a bf16 cache: the values are the same rounding on both
/// sides, bit for bit; a rotated key may round the other way where the two sides' f32
/// rotations differ in the last bit.
fn qkv_rope_write_bf16(g: &Gpu, rng: &mut StdRng) {
    rope_write_cases(g, rng, false);
}

/// As `qkv_rope_write_bf16`, each query and key head normed first (Qwen3): the norm's sum
/// of squares is a warp's tree on the GPU and a running sum on the CPU, so q is held to a
/// reduction's tolerance.
fn qkv_norm_rope_write_bf16(g: &Gpu, rng: &mut StdRng) {
    rope_write_cases(g, rng, true);
}

/// RoPE and the cache write from the fused rows, against the twin, with the heads' norms
/// (`qkv_norm_rope_write_bf16`) or without (`qkv_rope_write_bf16`).
fn rope_write_cases(g: &Gpu, rng: &mut StdRng, with_norms: bool) {
    let max_pos = 300;
    for (n, n_heads, n_kv_heads, head_dim, n_blocks) in [
        (1, 9, 3, 64, 4),
        (7, 32, 8, 128, 10),
        (40, 8, 2, 64, 8),
        (3, 6, 2, 80, 2),
    ] {
        let (q_dim, kv_dim) = (n_heads * head_dim, n_kv_heads * head_dim);
        let RopeRows {
            cos,
            sin,
            positions,
            slots,
        } = RopeRows::new(rng, max_pos, head_dim / 2, (n, n_blocks));
        let qkv = normal(rng, n * (q_dim + 2 * kv_dim), 1.0);
        let (kc, vc) = (
            bf16_weights(rng, n_blocks * 16 * kv_dim, 1.0),
            bf16_weights(rng, n_blocks * 16 * kv_dim, 1.0),
        );
        let (q_w, k_w) = (normal(rng, head_dim, 1.0), normal(rng, head_dim, 1.0));
        let (mut cpu_q, mut cpu_k, mut cpu_v) = (vec![0.0; n * q_dim], kc.clone(), vc.clone());
        let heads = Heads::new(n_heads, n_kv_heads, head_dim);
        let (cpu_rows, cpu_tables) = ((&positions[..], &slots[..]), (&cos[..], &sin[..]));
        let cpu_caches = (&mut cpu_k[..], &mut cpu_v[..]);
        match with_norms {
            true => ops::qkv_norm_rope_write_bf16(
                &mut cpu_q,
                cpu_caches,
                NormedQkv {
                    qkv: &qkv,
                    q_norm: &q_w,
                    k_norm: &k_w,
                    eps: 1e-6,
                },
                cpu_rows,
                cpu_tables,
                heads,
            ),
            false => {
                ops::qkv_rope_write_bf16(&mut cpu_q, cpu_caches, &qkv, cpu_rows, cpu_tables, heads)
            }
        }
        let (mut q, mut kd, mut vd) = (poisoned(g, n * q_dim), up(g, &kc), up(g, &vc));
        let (qkv_d, pos_d, slots_d) = (up(g, &qkv), up(g, &positions), up(g, &slots));
        let (cos_d, sin_d, q_w_d, k_w_d) = (up(g, &cos), up(g, &sin), up(g, &q_w), up(g, &k_w));
        let rows = (&pos_d.as_view(), &slots_d.as_view());
        let tables = (&cos_d.as_view(), &sin_d.as_view());
        let caches = (&mut kd.as_view_mut(), &mut vd.as_view_mut());
        let q_out = &mut q.as_view_mut();
        // SAFETY: the test builds valid ids, positions, slots and tables for its pool.
        unsafe {
            match with_norms {
                true => {
                    let normed = NormedQkv {
                        qkv: &qkv_d.as_view(),
                        q_norm: &q_w_d.as_view(),
                        k_norm: &k_w_d.as_view(),
                        eps: 1e-6,
                    };
                    g.qkv_norm_rope_write_bf16(q_out, caches, normed, rows, tables, heads)
                }
                false => {
                    g.qkv_rope_write_bf16(q_out, caches, &qkv_d.as_view(), rows, tables, heads)
                }
            }
        }
        .unwrap();
        let what = format!("n {n}, {n_heads}/{n_kv_heads} heads of {head_dim}");
        let q_tol = if with_norms { REDUCTION } else { ELEMENTWISE };
        assert_close(&format!("{what}: q"), &down(g, &q), &cpu_q, q_tol);
        let widen = |v: &[u16]| v.iter().map(|&b| ops::bf16_to_f32(b)).collect::<Vec<_>>();
        assert_close(
            &format!("{what}: k cache"),
            &widen(&down(g, &kd)),
            &widen(&cpu_k),
            1e-3,
        );
        assert_eq!(down(g, &vd), cpu_v, "{what}: v cache");
    }
}

/// A RoPE write's rows: the tables of random angles (`[max_pos, half]` cos and sin), `n`
/// positions below `max_pos`, and `n` distinct slots of a pool of `n_blocks` blocks.
struct RopeRows {
    cos: Vec<f32>,
    sin: Vec<f32>,
    positions: Vec<u32>,
    slots: Vec<u32>,
}

impl RopeRows {
    fn new(rng: &mut StdRng, max_pos: usize, half: usize, (n, n_blocks): (usize, usize)) -> Self {
        let angles: Vec<f32> = (0..max_pos * half)
            .map(|_| rng.random_range(-10.0..10.0))
            .collect();
        RopeRows {
            cos: angles.iter().map(|a| a.cos()).collect(),
            sin: angles.iter().map(|a| a.sin()).collect(),
            positions: (0..n)
                .map(|_| rng.random_range(0..max_pos as u32))
                .collect(),
            slots: distinct_slots(rng, n_blocks, n),
        }
    }
}

/// `n` distinct slots of a pool of `n_blocks` blocks, in random order.
fn distinct_slots(rng: &mut StdRng, n_blocks: usize, n: usize) -> Vec<u32> {
    let mut all: Vec<u32> = (0..(n_blocks * 16) as u32).collect();
    for i in 0..n {
        let j = rng.random_range(i..all.len());
        all.swap(i, j);
    }
    all.truncate(n);
    all
}

fn kv_write_f32(g: &Gpu, rng: &mut StdRng) {
    for (n_blocks, kv_dim, n) in [(20, 192, 37), (8, 1024, 1), (64, 128, 300)] {
        let k_cache = normal(rng, n_blocks * 16 * kv_dim, 1.0);
        let v_cache = normal(rng, n_blocks * 16 * kv_dim, 1.0);
        let (k, v) = (normal(rng, n * kv_dim, 1.0), normal(rng, n * kv_dim, 1.0));
        let slots = distinct_slots(rng, n_blocks, n);
        let (mut kc, mut vc) = (k_cache.clone(), v_cache.clone());
        ops::kv_write_f32(&mut kc, &mut vc, &k, &v, &slots, kv_dim);
        let (mut kd, mut vd) = (up(g, &k_cache), up(g, &v_cache));
        // SAFETY: the test builds valid ids, positions, slots and tables for its pool.
        unsafe {
            g.kv_write_f32(
                &mut kd.as_view_mut(),
                &mut vd.as_view_mut(),
                &up(g, &k).as_view(),
                &up(g, &v).as_view(),
                &up(g, &slots).as_view(),
                kv_dim,
            )
        }
        .unwrap();
        assert_close("keys", &down(g, &kd), &kc, 0.0);
        assert_close("values", &down(g, &vd), &vc, 0.0);
    }
}

/// One sequence per batch (the kernel's precondition), its blocks scattered over the pool,
/// the batch a chunk that starts at 0 or deep into the sequence; heads of 64 and 128; GQA
/// groups of 1, 3, 4, 7 (a group that does not divide a block's 64 rows) and 8; a single
/// token; the sequence is the second row of the block table. Sliding windows of 1 (a row's
/// own key alone), 50 (a block's rows starting in different key tiles, a row's window
/// starting past the block's first tile) and 100.
fn attention_mma_bf16(g: &Gpu, rng: &mut StdRng) {
    // (head_dim, n_heads, n_kv_heads, first position, tokens, window)
    for (head_dim, n_heads, n_kv_heads, p0, n, window) in [
        (64, 9, 3, 0usize, 40usize, None),
        (128, 32, 8, 0, 200, None),
        (128, 28, 4, 100, 77, None),
        (64, 8, 8, 0, 1, None),
        (128, 8, 1, 500, 130, None),
        (64, 32, 4, 37, 300, None),
        (128, 8, 1, 500, 130, Some(50)),
        (64, 9, 3, 0, 200, Some(1)),
        (128, 28, 4, 100, 77, Some(100)),
    ] {
        let blocks = (p0 + n).div_ceil(16);
        let n_blocks = blocks + 7;
        let max_blocks = blocks + 1;
        let mut pool: Vec<u32> = (0..n_blocks as u32).collect();
        for i in (1..pool.len()).rev() {
            pool.swap(i, rng.random_range(0..=i));
        }
        // Row 0 of the table is another sequence's; this batch's is row 1.
        let mut tables = vec![0u32; 2 * max_blocks];
        tables[max_blocks..max_blocks + blocks].copy_from_slice(&pool[..blocks]);
        tables[..3].copy_from_slice(&pool[blocks..blocks + 3]);
        let token_seq = vec![1u32; n];
        let positions: Vec<u32> = (p0 as u32..(p0 + n) as u32).collect();
        let kv_len = n_blocks * 16 * n_kv_heads * head_dim;
        let (k_cache, v_cache) = (
            bf16_weights(rng, kv_len, 1.0),
            bf16_weights(rng, kv_len, 1.0),
        );
        let q = normal(rng, n * n_heads * head_dim, 1.0);
        let shape =
            PagedShape::new(max_blocks, Heads::new(n_heads, n_kv_heads, head_dim)).windowed(window);
        let host = Paged {
            q: &q[..],
            k_cache: &k_cache[..],
            v_cache: &v_cache[..],
            block_tables: &tables[..],
            token_seq: &token_seq[..],
            positions: &positions[..],
            shape,
        };
        let mut cpu = vec![0.0; q.len()];
        ops::attention_mma_bf16(&mut cpu, &host, n);
        let mut out = poisoned(g, q.len());
        let device = Uploaded::new(g, &host);
        // SAFETY: the test builds valid ids, positions, slots and tables for its pool.
        unsafe { g.attention_mma_bf16(&mut out.as_view_mut(), &device.view()) }.unwrap();
        let what = format!(
            "head_dim {head_dim}, {n_heads} heads over {n_kv_heads}, {n} tokens from {p0}, window {window:?}"
        );
        assert_close(&what, &down(g, &out), &cpu, BF16_WEIGHTS);
    }
}

fn attention_f32(g: &Gpu, rng: &mut StdRng) {
    // head_dim 64 and 128, and 16 and 80 (not multiples of a warp); GQA groups 1, 3, 4, 8;
    // sliding windows of 1 (a token's own key), 37 and 300 (splits wholly before a token's
    // window, and one it starts inside); Gemma 3's heads of 256 (only the tensor-core split kernel
    // takes them).
    for (head_dim, n_heads, n_kv_heads, window) in [
        (64, 9, 3, None),
        (128, 32, 8, None),
        (64, 8, 8, None),
        (128, 8, 1, None),
        (64, 32, 4, None),
        (16, 4, 2, None),
        (80, 6, 2, None),
        (128, 32, 8, Some(37)),
        (64, 8, 8, Some(1)),
        (80, 6, 2, Some(300)),
        (256, 8, 4, None),
        (256, 4, 1, Some(37)),
    ] {
        // Three sequences in one batch: a 40-token prompt chunk (crossing blocks), one decode
        // token at position 700 (44 blocks of context), three tokens at 100..103.
        let seqs: [(usize, usize); 3] = [(0, 40), (700, 1), (100, 3)]; // (first position, tokens)
        let blocks_per_seq: Vec<usize> = seqs.iter().map(|&(p, n)| (p + n).div_ceil(16)).collect();
        let n_blocks: usize = blocks_per_seq.iter().sum::<usize>() + 5;
        let max_blocks = *blocks_per_seq.iter().max().unwrap();
        // Every sequence's blocks are scattered over the pool.
        let mut pool: Vec<u32> = (0..n_blocks as u32).collect();
        for i in (1..pool.len()).rev() {
            pool.swap(i, rng.random_range(0..=i));
        }
        let mut tables = vec![0u32; seqs.len() * max_blocks];
        let mut next = 0;
        for (s, &nb) in blocks_per_seq.iter().enumerate() {
            tables[s * max_blocks..s * max_blocks + nb].copy_from_slice(&pool[next..next + nb]);
            next += nb;
        }
        let (mut token_seq, mut positions) = (vec![], vec![]);
        for (s, &(p0, n)) in seqs.iter().enumerate() {
            for p in p0..p0 + n {
                token_seq.push(s as u32);
                positions.push(p as u32);
            }
        }
        let n = positions.len();
        let kv_len = n_blocks * 16 * n_kv_heads * head_dim;
        let (k_cache, v_cache) = (normal(rng, kv_len, 1.0), normal(rng, kv_len, 1.0));
        let q = normal(rng, n * n_heads * head_dim, 1.0);
        let shape =
            PagedShape::new(max_blocks, Heads::new(n_heads, n_kv_heads, head_dim)).windowed(window);
        let host = Paged {
            q: &q[..],
            k_cache: &k_cache[..],
            v_cache: &v_cache[..],
            block_tables: &tables[..],
            token_seq: &token_seq[..],
            positions: &positions[..],
            shape,
        };
        let mut cpu = vec![0.0; q.len()];
        ops::attention_f32(&mut cpu, &host);
        let mut out = poisoned(g, q.len());
        // SAFETY: the test builds valid ids, positions, slots and tables for its pool.
        unsafe { g.attention_f32(&mut out.as_view_mut(), &Uploaded::new(g, &host).view()) }
            .unwrap();
        // The kernel's exp is ex2.approx (about 2 ulp).
        let what =
            format!("head_dim {head_dim}, {n_heads} heads over {n_kv_heads}, window {window:?}");
        assert_close(&what, &down(g, &out), &cpu, LONG_REDUCTION);

        // The same over a bf16 cache (what the backend keeps), against its twin.
        let (k_cache, v_cache) = (to_bf16(&k_cache), to_bf16(&v_cache));
        let host = Paged {
            q: &q[..],
            k_cache: &k_cache[..],
            v_cache: &v_cache[..],
            block_tables: &tables[..],
            token_seq: &token_seq[..],
            positions: &positions[..],
            shape,
        };
        let mut cpu = vec![0.0; q.len()];
        ops::attention_bf16(&mut cpu, &host);
        let mut out = poisoned(g, q.len());
        let device = Uploaded::new(g, &host);
        // SAFETY: the test builds valid ids, positions, slots and tables for its pool.
        unsafe { g.attention_bf16(&mut out.as_view_mut(), &device.view()) }.unwrap();
        let what = format!("{what}, bf16 cache");
        assert_close(&what, &down(g, &out), &cpu, LONG_REDUCTION);

        // Flash-decoding over the same batch, by both split kernels: the per-lane one with
        // splits of 32 positions (and of 8, so that a split holds fewer keys than a round of
        // eight and its halves are uneven), the tensor-core one (where it takes the heads)
        // with splits of 32 and 64 (two key tiles). Each split's partials against the CPU
        // twin's, then the combined output against the one-pass attention above (the
        // tensor-core kernel's, which rounds its weights to bf16, against its twin's
        // partials combined). Splits past a token's position are empty.
        type Split = unsafe fn(
            &Gpu,
            &mut Out<f32>,
            &mut Out<f32>,
            &PagedIn<u16>,
            usize,
        ) -> rustle::error::Result<()>;
        type Twin = fn(&mut [f32], &mut [f32], &PagedRef<u16>, usize);
        let mut kernels: Vec<(&str, Split, Twin, usize, f64)> = vec![];
        for split_len in [32, 8]
            .into_iter()
            .filter(|_| head_dim <= SPLIT_MAX_HEAD_DIM)
        {
            let (gpu, twin): (Split, Twin) = (Gpu::attention_split_bf16, ops::attention_split_bf16);
            kernels.push(("attention_split_bf16", gpu, twin, split_len, LONG_REDUCTION));
        }
        for split_len in [32, 64] {
            if attention_split_mma_supports(head_dim, n_heads, n_kv_heads, split_len) {
                let (gpu, twin): (Split, Twin) =
                    (Gpu::attention_split_mma_bf16, ops::attention_split_mma_bf16);
                kernels.push((
                    "attention_split_mma_bf16",
                    gpu,
                    twin,
                    split_len,
                    BF16_WEIGHTS,
                ));
            }
        }
        for (name, split_kernel, twin, split_len, tol) in kernels {
            let n_splits = 704usize.div_ceil(split_len);
            let rows = n * n_heads * n_splits;
            let (mut po_cpu, mut ml_cpu) = (vec![0.0; rows * head_dim], vec![0.0; rows * 2]);
            twin(&mut po_cpu, &mut ml_cpu, &host, split_len);
            let pd = &device.positions;
            // The kernel into partials of `rows` rows, poisoned first.
            let run = |rows: usize| {
                let (mut po, mut ml) = (poisoned(g, rows * head_dim), poisoned(g, rows * 2));
                // SAFETY: the test builds valid ids, positions, slots and tables for its pool.
                unsafe {
                    split_kernel(
                        g,
                        &mut po.as_view_mut(),
                        &mut ml.as_view_mut(),
                        &device.view(),
                        split_len,
                    )
                }
                .unwrap();
                (po, ml)
            };
            let (po, ml) = run(rows);
            let what = format!("{what}, {name}, splits of {split_len}");
            assert_close(
                &format!("{what}: partial outputs"),
                &down(g, &po),
                &po_cpu,
                tol,
            );
            // The maxima of empty splits are -inf on both sides; the rest compare as numbers.
            let (ml_gpu, finite) = (down(g, &ml), |v: &f32| v.is_finite());
            assert_eq!(
                ml_gpu.iter().map(finite).collect::<Vec<_>>(),
                ml_cpu.iter().map(finite).collect::<Vec<_>>(),
                "{what}: empty splits"
            );
            let keep = |v: &[f32]| v.iter().copied().filter(finite).collect::<Vec<_>>();
            assert_close(
                &format!("{what}: (m, l)"),
                &keep(&ml_gpu),
                &keep(&ml_cpu),
                tol,
            );
            let splits = Splits::new(n_splits, split_len, head_dim);
            let combine = |po: &CudaSlice<f32>, ml: &CudaSlice<f32>, splits: Splits| {
                let mut combined = poisoned(g, q.len());
                g.attention_combine_f32(
                    &mut combined.as_view_mut(),
                    &po.as_view(),
                    &ml.as_view(),
                    &pd.as_view(),
                    splits,
                )
                .unwrap();
                down(g, &combined)
            };
            let combined = combine(&po, &ml, splits);
            // The combine with a bf16 copy: the same f32 output, the copy exactly it rounded.
            let mut with_copy = poisoned(g, q.len());
            let mut copy = up(g, &vec![0x7fc1u16; q.len()]);
            g.attention_combine_f32_bf16(
                &mut with_copy.as_view_mut(),
                &mut copy.as_view_mut(),
                &po.as_view(),
                &ml.as_view(),
                &pd.as_view(),
                splits,
            )
            .unwrap();
            let with_copy = down(g, &with_copy);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(&with_copy) == bits(&combined),
                "{what}: the combine with a bf16 copy changed its output"
            );
            let mut rounded = vec![0u16; q.len()];
            ops::f32_to_bf16(&mut rounded, &with_copy);
            assert!(down(g, &copy) == rounded, "{what}: the combine's bf16 copy");
            if head_dim % 32 == 0 {
                combine_codes(g, &what, (&po, &ml), pd, &positions, &combined, splits);
            }
            let expected = if tol == LONG_REDUCTION {
                cpu.clone()
            } else {
                let mut out = vec![0.0; q.len()];
                ops::attention_combine_f32(&mut out, &po_cpu, &ml_cpu, &positions, splits);
                out
            };
            assert_close(&format!("{what}: combined"), &combined, &expected, tol);

            // The same tokens in a launch with more (empty) splits per row, as when a longer
            // sequence shares the batch: bit for bit the same result.
            let wide = 3 * n_splits + 5;
            let (po, ml) = run(n * n_heads * wide);
            let wide_splits = Splits::new(wide, split_len, head_dim);
            assert!(
                bits(&combine(&po, &ml, wide_splits)) == bits(&combined),
                "{what}: {wide} splits per row changed a token's result"
            );
        }
    }
}

/// `attention_combine_q8_f32` on the partials `po` and `ml` against its twin on the same
/// partials: the same f32 output as the plain combine's (`combined`), to the bit; codes that
/// are exactly `quantize_q8_f32`'s of that output; and the twin's codes, whose f32 sums run
/// in another order, at most one off and rarely.
fn combine_codes(
    g: &Gpu,
    what: &str,
    (po, ml): (&CudaSlice<f32>, &CudaSlice<f32>),
    pd: &CudaSlice<u32>,
    positions: &[u32],
    combined: &[f32],
    splits: Splits,
) {
    let n = combined.len();
    let mut out = poisoned(g, n);
    let (mut codes, mut scales) = (up(g, &vec![0xaau8; n]), poisoned(g, n / 16));
    g.attention_combine_q8_f32(
        &mut out.as_view_mut(),
        (&mut codes.as_view_mut(), &mut scales.as_view_mut()),
        &po.as_view(),
        &ml.as_view(),
        &pd.as_view(),
        splits,
    )
    .unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(
        bits(&down(g, &out)) == bits(combined),
        "{what}: the combine with codes changed its output"
    );
    let (gpu_codes, gpu_scales) = (down(g, &codes), down(g, &scales));
    let (exact, exact_scales) = q8_codes(combined);
    assert!(gpu_codes == exact, "{what}: the combine's codes");
    assert!(
        bits(&gpu_scales) == bits(&exact_scales),
        "{what}: the combine's scales"
    );

    let (mut twin_out, mut twin_codes, mut twin_scales) =
        (vec![0.0; n], vec![0u8; n], vec![0f32; n / 16]);
    rustle::cpu::quant::attention_combine_q8_f32(
        &mut twin_out,
        (&mut twin_codes, &mut twin_scales),
        &down(g, po),
        &down(g, ml),
        positions,
        splits,
    );
    assert_close(
        &format!("{what}: combined, twin"),
        combined,
        &twin_out,
        REDUCTION,
    );
    let off = |(a, b): (&u8, &u8)| (*a as i8 as i32 - *b as i8 as i32).abs();
    let worst = gpu_codes
        .iter()
        .zip(&twin_codes)
        .map(off)
        .max()
        .unwrap_or(0);
    let differ = gpu_codes
        .iter()
        .zip(&twin_codes)
        .filter(|p| off(*p) > 0)
        .count();
    assert!(
        worst <= 1 && differ <= 2 + n / 500,
        "{what}: {differ} of the combine's codes differ from the twin's, by up to {worst}"
    );
}

/// SwiGLU's and GeGLU's kernels (through `Gpu::gated`, which the forward calls) against
/// their twins, gates wide enough (sd 3) to reach both tails of each activation.
fn gated_f32(g: &Gpu, rng: &mut StdRng) {
    type Twin = fn(&mut [f32], &[f32], &[f32]);
    let acts: [(Activation, Twin); 2] = [
        (Activation::Silu, ops::swiglu_f32),
        (Activation::GeluTanh, ops::geglu_f32),
    ];
    for (act, twin) in acts {
        for n in [1, 1536, 100_003] {
            let (gate, upv) = (normal(rng, n, 3.0), normal(rng, n, 1.0));
            let mut cpu = vec![0.0; n];
            twin(&mut cpu, &gate, &upv);
            let mut out = poisoned(g, n);
            let (gate_d, up_d) = (up(g, &gate), up(g, &upv));
            g.gated(
                act,
                &mut out.as_view_mut(),
                None,
                &gate_d.as_view(),
                &up_d.as_view(),
            )
            .unwrap();
            let what = format!("{act:?}, n {n}");
            assert_close(&what, &down(g, &out), &cpu, APPROX_EXP);

            // With the bf16 copy: the f32 output as before, the copy exactly it rounded.
            let mut out = poisoned(g, n);
            let mut out_bf16 = up(g, &vec![0x7fc1u16; n]);
            g.gated(
                act,
                &mut out.as_view_mut(),
                Some(&mut out_bf16.as_view_mut()),
                &gate_d.as_view(),
                &up_d.as_view(),
            )
            .unwrap();
            let out = down(g, &out);
            assert_close(&format!("{what}, with bf16"), &out, &cpu, APPROX_EXP);
            let mut rounded = vec![0u16; n];
            ops::f32_to_bf16(&mut rounded, &out);
            assert!(down(g, &out_bf16) == rounded, "{what}: the bf16 copy");
        }
    }
}

fn scale_f32(g: &Gpu, rng: &mut StdRng) {
    for (n, s) in [(1, 2.0f32), (1152, 33.94), (100_003, -0.5)] {
        let x = normal(rng, n, 1.0);
        let mut cpu = x.clone();
        ops::scale_f32(&mut cpu, s);
        let mut dev = up(g, &x);
        g.scale_f32(&mut dev.as_view_mut(), s).unwrap();
        assert_close(&format!("n {n}"), &down(g, &dev), &cpu, 0.0);
    }
}

/// An expert's tokens gathered from a batch and its outputs added back, weighted, as the
/// routing of a mixture of experts makes them: a random subset of the tokens in order.
fn gather_scatter_rows_f32(g: &Gpu, rng: &mut StdRng) {
    for (n, dim) in [(1, 8), (7, 576), (130, 2048), (33, 300)] {
        let x = normal(rng, n * dim, 1.0);
        let index: Vec<u32> = (0..n as u32)
            .filter(|_| rng.random::<f32>() < 0.6)
            .collect();
        let index = if index.is_empty() { vec![0] } else { index };
        let m = index.len();
        let (x_dev, index_dev) = (up(g, &x), up(g, &index));
        let mut cpu = vec![0.0; m * dim];
        ops::gather_rows_f32(&mut cpu, &x, &index, dim);
        let mut rows = poisoned(g, m * dim);
        unsafe {
            g.gather_rows_f32(
                &mut rows.as_view_mut(),
                &x_dev.as_view(),
                &index_dev.as_view(),
                dim,
            )
        }
        .unwrap();
        assert_close(
            &format!("gather {m} of {n}x{dim}"),
            &down(g, &rows),
            &cpu,
            0.0,
        );

        let weight: Vec<f32> = (0..m).map(|_| rng.random::<f32>()).collect();
        let expert_out = normal(rng, m * dim, 1.0);
        let mut cpu = normal(rng, n * dim, 1.0);
        let mut sum = up(g, &cpu);
        ops::scatter_add_rows_f32(&mut cpu, &expert_out, &index, &weight, dim);
        unsafe {
            g.scatter_add_rows_f32(
                &mut sum.as_view_mut(),
                &up(g, &expert_out).as_view(),
                &index_dev.as_view(),
                &up(g, &weight).as_view(),
                dim,
            )
        }
        .unwrap();
        assert_close(
            &format!("scatter {m} into {n}x{dim}"),
            &down(g, &sum),
            &cpu,
            ELEMENTWISE,
        );
    }
}

fn residual_add_f32(g: &Gpu, rng: &mut StdRng) {
    for n in [1, 576, 100_003] {
        let (x, d) = (normal(rng, n, 1.0), normal(rng, n, 1.0));
        let mut cpu = x.clone();
        ops::residual_add_f32(&mut cpu, &d);
        let mut dev = up(g, &x);
        g.residual_add_f32(&mut dev.as_view_mut(), &up(g, &d).as_view())
            .unwrap();
        assert_close(&format!("n {n}"), &down(g, &dev), &cpu, 0.0);
    }
}

fn argmax_f32(g: &Gpu, rng: &mut StdRng) {
    for (n, tie) in [
        (1, false),
        (1000, false),
        (49152, true),
        (128_256, false),
        (128_256, true),
    ] {
        let mut logits = normal(rng, n, 5.0);
        if tie {
            // The same maximum twice: the first index wins, as on the CPU.
            let (a, b) = (rng.random_range(0..n / 2), rng.random_range(n / 2..n));
            logits[a] = 100.0;
            logits[b] = 100.0;
        }
        let cpu = ops::argmax_f32(&logits);
        let mut out = up(g, &[u32::MAX]);
        g.argmax_f32(&mut out.as_view_mut(), &up(g, &logits).as_view())
            .unwrap();
        assert_eq!(down(g, &out)[0], cpu, "n {n} tie {tie}");
    }
    // Many rows at once, one block each.
    let (rows, n) = (37, 49152);
    let logits = normal(rng, rows * n, 5.0);
    let cpu: Vec<u32> = logits.chunks(n).map(ops::argmax_f32).collect();
    let mut out = up(g, &vec![u32::MAX; rows]);
    g.argmax_f32(&mut out.as_view_mut(), &up(g, &logits).as_view())
        .unwrap();
    assert_eq!(down(g, &out), cpu, "{rows} rows of {n}");
}

/// The device's sampler against its twin, every row with other parameters: greedy; top-k
/// (down to 1, and past the vocabulary); top-p; min-p; all three; temperatures from 0.3 to 2.
/// Both do the same integer arithmetic on the weights, so they draw the same tokens, unless a
/// weight's last bit lands on a boundary (about one draw in millions); then the penalties,
/// element by element.
fn sample_f32(g: &Gpu, rng: &mut StdRng) {
    for vocab in [1000, 49152] {
        let rows = 48;
        let logits = normal(rng, rows * vocab, 3.0);
        let mut params = vec![];
        for r in 0..rows {
            let t = [0.0, 0.3, 0.7, 1.0, 1.3, 2.0][r % 6];
            let (top_k, top_p, min_p) = match r / 6 {
                0 => (0, 1.0, 0.0),
                1 => (40, 1.0, 0.0),
                2 => (0, 0.9, 0.0),
                3 => (0, 1.0, 0.05),
                4 => (50, 0.8, 0.02),
                5 => (1, 1.0, 0.0),
                6 => (vocab + 5, 0.5, 0.0),
                _ => (0, 0.999, 0.3),
            };
            params.extend(ops::sample_params(t, top_k, top_p, min_p, rng.random()));
        }
        let steps: Vec<u32> = (0..rows).map(|_| rng.random_range(0..10_000)).collect();
        let mut cpu = vec![0u32; rows];
        ops::sample_f32(&mut cpu, &logits, &params, &steps, vocab);
        let mut out = up(g, &vec![u32::MAX; rows]);
        g.sample_f32(
            &mut out.as_view_mut(),
            &up(g, &logits).as_view(),
            &up(g, &params).as_view(),
            &up(g, &steps).as_view(),
        )
        .unwrap();
        assert_eq!(down(g, &out), cpu, "vocab {vocab}: sampled tokens");
    }
    // Penalties: 5 rows of 300, each with its own distinct tokens.
    let (rows, vocab) = (5, 300);
    let logits = normal(rng, rows * vocab, 3.0);
    let mut entries = vec![];
    for r in 0..rows as u32 {
        let mut tokens: Vec<u32> = (0..vocab as u32).collect();
        for i in 0..40 {
            let j = rng.random_range(i..tokens.len());
            tokens.swap(i, j);
        }
        for &t in &tokens[..40] {
            let counts = rng.random_range(0..4u32) | ((rng.random::<bool>() as u32) << 31);
            entries.extend([r, t, counts]);
        }
    }
    let penalties: Vec<f32> = (0..rows)
        .flat_map(|_| {
            [
                rng.random_range(0.8..1.5),
                rng.random_range(-1.0..1.0),
                rng.random_range(-1.0..1.0),
            ]
        })
        .collect();
    let mut cpu = logits.clone();
    ops::penalize_f32(&mut cpu, &entries, &penalties, vocab);
    let mut dev = up(g, &logits);
    // SAFETY: rows and tokens inside the logits, distinct within each row.
    unsafe {
        g.penalize_f32(
            &mut dev.as_view_mut(),
            &up(g, &entries).as_view(),
            &up(g, &penalties).as_view(),
            vocab,
        )
    }
    .unwrap();
    assert_close("penalties", &down(g, &dev), &cpu, ELEMENTWISE);

    // Grammar masks: 3 of 5 rows of 1000 (not a multiple of 32), in shuffled order, each
    // allowing a random quarter of the tokens.
    let vocab: usize = 1000;
    let words = vocab.div_ceil(32);
    let logits = normal(rng, rows * vocab, 3.0);
    let mask_rows = [3u32, 0, 4];
    let masks: Vec<u32> = (0..mask_rows.len() * words)
        .map(|_| rng.random::<u32>() & rng.random::<u32>())
        .collect();
    let mut cpu = logits.clone();
    ops::mask_logits_f32(&mut cpu, &masks, &mask_rows, vocab);
    let blocked = cpu.iter().filter(|l| **l == f32::NEG_INFINITY).count();
    assert!(
        blocked > mask_rows.len() * vocab / 2,
        "{blocked} tokens masked"
    );
    let mut dev = up(g, &logits);
    // SAFETY: the rows are inside the logits and distinct.
    unsafe {
        g.mask_logits_f32(
            &mut dev.as_view_mut(),
            &up(g, &masks).as_view(),
            &up(g, &mask_rows).as_view(),
            vocab,
        )
    }
    .unwrap();
    assert_eq!(down(g, &dev), cpu, "masked logits");
}

fn fill_random_bf16(g: &Gpu, rng: &mut StdRng) {
    for n in [1, 1000, 1_000_003] {
        let (seed, scale) = (rng.random::<u32>(), rng.random_range(0.01..2.0));
        let mut cpu = vec![0u16; n];
        ops::fill_random_bf16(&mut cpu, seed, scale);
        let mut dev = g.zeros::<u16>(n, "test").unwrap();
        g.fill_random_bf16(&mut dev.as_view_mut(), seed, scale)
            .unwrap();
        assert_eq!(down(g, &dev), cpu, "n {n}");
        assert!(cpu.iter().any(|&b| b != 0) || n == 1);
    }
}

fn read_probe_u32(g: &Gpu, rng: &mut StdRng) {
    for (n_words, grid) in [(4, 1), (4 * 1000, 3), (4 * 300_001, 132)] {
        let data: Vec<u32> = (0..n_words).map(|_| rng.random()).collect();
        let mut cpu = vec![0u32; grid];
        ops::read_probe_u32(&mut cpu, &data);
        let mut partial = up(g, &vec![0xdead_beefu32; grid]);
        g.read_probe_u32(&mut partial.as_view_mut(), &up(g, &data).as_view())
            .unwrap();
        assert_eq!(down(g, &partial), cpu, "{n_words} words, grid {grid}");
    }
}

/// The probe in phases against its twin, on grids of one block, a few, and as many as the
/// GPU holds at once (where a barrier that let a block through early, or never, would show:
/// a wrong count, or a hang); phases apart and touching, partial phases of a grid stride,
/// with and without the L2 requests ahead. Outputs poisoned; the barrier's counter checked.
#[cfg(feature = "probes")]
fn read_phases_u32(g: &Gpu, rng: &mut StdRng) {
    let full = g.read_phases_grid().unwrap();
    assert!(
        full >= g.sm_count,
        "{full} blocks at once on {} SMs",
        g.sm_count
    );
    let cases = [
        // (phase_vec4, phase_stride, n_phases, grid, ahead)
        (1, 1, 1, 1, 0),
        (1000, 1000, 3, 3, 2),
        (1000, 1500, 5, full, 1),
        (300_001, 300_007, 4, full, 4),
        (4096, 4096, 64, full, 0),
    ];
    for (phase_vec4, phase_stride, n_phases, grid, ahead) in cases {
        let words = 4 * ((n_phases - 1) * phase_stride + phase_vec4);
        let data: Vec<u32> = (0..words).map(|_| rng.random()).collect();
        let (mut cpu, mut cpu_arrived) = (vec![0u32; grid], [0u32]);
        let args = (phase_vec4, phase_stride, n_phases, ahead);
        ops::read_phases_u32(
            &mut cpu,
            &mut cpu_arrived,
            &data,
            args.0,
            args.1,
            args.2,
            args.3,
        );
        let mut partial = up(g, &vec![0xdead_beefu32; grid]);
        let mut arrived = up(g, &[0xdead_beefu32]);
        g.read_phases_u32(
            &mut partial.as_view_mut(),
            &mut arrived.as_view_mut(),
            &up(g, &data).as_view(),
            phase_vec4,
            phase_stride,
            n_phases,
            ahead,
        )
        .unwrap();
        let case = format!("{n_phases} phases of {phase_vec4} vectors, grid {grid}");
        assert_eq!(down(g, &partial), cpu, "{case}");
        assert_eq!(
            down(g, &arrived),
            cpu_arrived,
            "{case}: the barrier's count"
        );
    }
}

/// The staged probe against its twin, on grids of one block, a few, and as many as the GPU
/// holds at once: phases of one tile, of fewer tiles than blocks (blocks with none, whose
/// copies run phases ahead), of many, of uneven sizes, of nothing between others, and none
/// with any tiles (the barriers and sums alone); one stage and the most; copies asked for by
/// thread 0 (which also arrives at the grid barrier) and by others. A barrier that let
/// a block through early shows as a neighbour's sum not yet stored. Outputs poisoned; the
/// sums and the barrier's counter checked.
#[cfg(feature = "probes")]
fn read_phases_staged_u32(g: &Gpu, rng: &mut StdRng) {
    let uneven = vec![0, 3, 0, 1, 2000, 0, 0, 517, 64];
    let cases = [
        // (tile_bytes, tiles of each phase, stages, producer, grid: None for the most)
        (16, vec![1], 1, 0, Some(1)),
        (1024, vec![7; 3], 2, 255, Some(3)),
        (4096, vec![1000; 5], 3, 0, None),
        (16384, vec![33; 40], 6, 37, None),
        (32768, vec![700; 3], 6, 255, None),
        (8192, uneven, 4, 0, None),
        (16, vec![0; 4], 16, 255, None),
    ];
    for (tile_bytes, phase_tiles, stages, producer, grid) in cases {
        let most = g.read_phases_staged_grid(stages, tile_bytes).unwrap();
        assert!(
            most >= g.sm_count,
            "{most} blocks at once on {} SMs",
            g.sm_count
        );
        let grid = grid.unwrap_or(most);
        let mut starts = vec![0u32];
        for n in &phase_tiles {
            starts.push(starts.last().unwrap() + n);
        }
        let n_phases = phase_tiles.len();
        let words = (*starts.last().unwrap() as usize * tile_bytes / 4).max(4);
        let data: Vec<u32> = (0..words).map(|_| rng.random()).collect();
        let n_sums = ((n_phases - 1) * grid).max(1);
        let (mut cpu, mut cpu_sums, mut cpu_arrived) =
            (vec![0u32; grid], vec![0xdead_beefu32; n_sums], [0u32]);
        ops::read_phases_staged_u32(
            &mut cpu,
            &mut cpu_sums,
            &mut cpu_arrived,
            &data,
            &starts,
            tile_bytes,
            n_phases,
            stages,
            producer,
        );
        let mut partial = up(g, &vec![0xdead_beefu32; grid]);
        let mut sums = up(g, &vec![0xdead_beefu32; n_sums]);
        let mut arrived = up(g, &[0xdead_beefu32]);
        let phases = g.staged_phases(starts).unwrap();
        g.read_phases_staged_u32(
            &mut partial.as_view_mut(),
            &mut sums.as_view_mut(),
            &mut arrived.as_view_mut(),
            &up(g, &data).as_view(),
            &phases,
            tile_bytes,
            stages,
            producer,
        )
        .unwrap();
        let case = format!(
            "phases of {phase_tiles:?} tiles of {tile_bytes} bytes, {stages} stages, producer \
             {producer}, grid {grid}"
        );
        assert_eq!(down(g, &partial), cpu, "{case}");
        assert_eq!(down(g, &sums), cpu_sums, "{case}: the phases' sums");
        assert_eq!(
            down(g, &arrived),
            cpu_arrived,
            "{case}: the barrier's count"
        );
    }
    // Phases whose first tiles decrease are refused before any launch.
    assert!(g.staged_phases(vec![0, 5, 3]).is_err());
    assert!(g.staged_phases(vec![0]).is_err());
}

/// The lesson's reduction steps against their twin: one column, rows past a block of 8
/// warps (step 1), rows narrower than a warp, wider than a block of 1024 threads (step 2),
/// and not a multiple of either; outputs poisoned. The values have both signs and a mean of
/// 0.5, so that no row's sum is near zero by chance (where any change of order is a large
/// relative error).
fn sum_steps(g: &Gpu, rng: &mut StdRng) {
    type Step = fn(&Gpu, &mut Out<f32>, &In<f32>, usize) -> rustle::Result<()>;
    type Twin = fn(&mut [f32], &[f32], usize);
    let steps: [(&str, Step, Twin); 2] = [
        ("step 1", Gpu::sum_step1_warp_f32, ops::sum_step1_warp_f32),
        ("step 2", Gpu::sum_step2_block_f32, ops::sum_step2_block_f32),
    ];
    for (name, gpu, twin) in steps {
        for (n_rows, n_cols) in [
            (1, 1),
            (3, 576),
            (1, 4096),
            (1000, 37),
            (9, 1025),
            (2, 100_003),
        ] {
            let x: Vec<f32> = normal(rng, n_rows * n_cols, 1.0)
                .into_iter()
                .map(|v| v + 0.5)
                .collect();
            let mut cpu = vec![0.0; n_rows];
            twin(&mut cpu, &x, n_cols);
            let mut out = poisoned(g, n_rows);
            gpu(g, &mut out.as_view_mut(), &up(g, &x).as_view(), n_cols).unwrap();
            let what = format!("{name}, {n_rows} rows of {n_cols}");
            assert_close(&what, &down(g, &out), &cpu, LONG_REDUCTION);
        }
    }
}

// ---- whole models ----------------------------------------------------------------------------

/// Greedy tokens from `prompt`, and the margin between the best two logits at each step.
fn greedy(r: &mut Runner, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<f32>) {
    let mut seq = r.solo();
    let mut logits = r.extend(&mut seq, prompt).unwrap().to_vec();
    let (mut out, mut margins) = (vec![], vec![]);
    for _ in 0..steps {
        let best = ops::argmax_f32(&logits);
        let second = logits
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != best as usize)
            .map(|(_, &v)| v)
            .fold(f32::NEG_INFINITY, f32::max);
        margins.push(logits[best as usize] - second);
        out.push(best);
        logits.copy_from_slice(r.extend(&mut seq, &[best]).unwrap());
    }
    seq.release();
    (out, margins)
}

/// GPU and CPU (on the same bf16-rounded weights) must choose the same greedy tokens. Decode
/// differs only in summation order (~1e-6 relative), but the GPU's prefill rounds its
/// activations and its attention's inputs to bf16 for the tensor cores (~0.4% per value),
/// which moves the logits by up to a few tenths; so a divergence is accepted only where the
/// CPU's best two logits were within `near_tie` (`NEAR_TIE` but where a model's own error says
/// otherwise), and the test says so.
fn same_tokens(cpu: &mut Runner, gpu: &mut Runner, prompts: &[Vec<u32>], steps: usize) {
    same_tokens_within(cpu, gpu, prompts, steps, NEAR_TIE)
}

/// The default model's near-tie bound: its GPU logits stay within 0.28 of the CPU's.
const NEAR_TIE: f32 = 0.5;

fn same_tokens_within(
    cpu: &mut Runner,
    gpu: &mut Runner,
    prompts: &[Vec<u32>],
    steps: usize,
    near_tie: f32,
) {
    for prompt in prompts {
        let (c, margins) = greedy(cpu, prompt, steps);
        let (gtok, _) = greedy(gpu, prompt, steps);
        // The GPU's own greedy path (argmax on the device, decode steps replayed as CUDA
        // graphs) must agree with its logits exactly.
        let mut seq = gpu.solo();
        let mut t = gpu.extend_greedy(&mut seq, prompt).unwrap();
        let mut graph_tokens = vec![];
        for _ in 0..steps {
            graph_tokens.push(t);
            t = gpu.extend_greedy(&mut seq, &[t]).unwrap();
        }
        seq.release();
        assert_eq!(
            graph_tokens,
            gtok,
            "{}-token prompt: device argmax and graphs vs logits",
            prompt.len()
        );
        match c.iter().zip(&gtok).position(|(a, b)| a != b) {
            None => eprintln!(
                "  {} prompt tokens: {steps}/{steps} greedy tokens identical",
                prompt.len()
            ),
            Some(i) => {
                assert!(
                    margins[i] < near_tie,
                    "{}-token prompt: step {i}: cpu {} gpu {} (cpu margin {})",
                    prompt.len(),
                    c[i],
                    gtok[i],
                    margins[i]
                );
                eprintln!(
                    "  {} prompt tokens: identical for {i} steps, then a near-tie (margin {})",
                    prompt.len(),
                    margins[i]
                );
            }
        }
    }
}

fn opts() -> RunnerOptions {
    RunnerOptions {
        kv_blocks: Some(common::TEST_KV_BLOCKS),
        max_batch_tokens: 256,
        ..Default::default()
    }
}

fn gpu_device(g: &Gpu) -> Device {
    Device::Gpu(Box::new(g.clone()))
}

fn default_model_gpu_matches_cpu(g: &Gpu, _: &mut StdRng) {
    let path = rustle::loader::resolve_model_path(None).unwrap();
    let m = rustle::loader::load(&path).unwrap();
    let prompts: Vec<Vec<u32>> = common::golden("smollm2-135m")
        .cases
        .iter()
        .map(|c| c.prompt_ids.clone())
        .collect();
    // The GPU keeps the file's Q4_1 and Q8_0 blocks and decodes them to the values the CPU
    // holds: the same weights.
    let cpu_weights = rustle::loader::load(&path).unwrap().weights;
    let mut cpu = Runner::new(m.config.clone(), cpu_weights, &opts(), Device::Cpu).unwrap();
    let mut gpu = Runner::new(m.config.clone(), m.weights, &opts(), gpu_device(g)).unwrap();
    let held = gpu.weights_held();
    assert!(held.contains("q4_1") && !held.contains("bf16"), "{held}");
    eprintln!("  in blocks: {held}");
    same_tokens(&mut cpu, &mut gpu, &prompts, 32);
    // `--weights bf16`: against the CPU on the same weights rounded to bf16.
    let mut cpu_weights = rustle::loader::load(&path).unwrap().weights;
    cpu_weights.round_matrices_to_bf16();
    let mut cpu = Runner::new(m.config.clone(), cpu_weights, &opts(), Device::Cpu).unwrap();
    let bf16 = RunnerOptions {
        weights: WeightFormat::Bf16,
        ..opts()
    };
    let w = rustle::loader::load(&path).unwrap().weights;
    let mut gpu = Runner::new(m.config, w, &bf16, gpu_device(g)).unwrap();
    eprintln!("  in bf16: {}", gpu.weights_held());
    same_tokens(&mut cpu, &mut gpu, &prompts, 32);
}

/// A GGUF file mixing Q4_K, Q5_0, Q6_K and Q8_0 (tests/golden/tiny-quant.gguf, which the CPU
/// runs as transformers does: tests/golden.rs) on the GPU in its blocks, against the CPU.
fn quantized_gguf_gpu_matches_cpu(g: &Gpu, rng: &mut StdRng) {
    // From the repository root, where cargo (and scripts/run-test-binaries.sh) run tests.
    let path = std::path::Path::new("tests/golden/tiny-quant.gguf");
    let m = rustle::loader::load(path).unwrap();
    let cpu_weights = rustle::loader::load(path).unwrap().weights;
    let mut cpu = Runner::new(m.config.clone(), cpu_weights, &opts(), Device::Cpu).unwrap();
    let vocab = m.config.vocab_size as u32;
    let mut gpu = Runner::new(m.config, m.weights, &opts(), gpu_device(g)).unwrap();
    let held = gpu.weights_held();
    eprintln!("  {held}");
    for ty in ["q4_k", "q6_k", "q8_0"] {
        assert!(held.contains(ty), "{ty} not held in blocks: {held}");
    }
    // Prompts of 1 to 100 tokens: decode through the quantized GEMV, 40 tokens through
    // `gemm_<type>` (the tensor cores on the blocks), 100 through the dequantizers and the
    // prompt GEMM.
    let prompts: Vec<Vec<u32>> = [1, 6, 40, 100]
        .iter()
        .map(|&n| (0..n).map(|_| rng.random_range(0..vocab)).collect())
        .collect();
    // This model's GPU prompt path is 0.145 from transformers at its largest top logit
    // (`tiny_models_gpu_match_transformers`), so two logits can close a gap of about 0.3 and
    // more in a rare prompt: random prompts of seed 818740620 diverged at a CPU margin of 0.62
    // (40 tokens), seeds 1-6 at up to 0.44. A wrong kernel moves them by whole units.
    same_tokens_within(&mut cpu, &mut gpu, &prompts, 12, 1.0);
}

/// `--weights fp8` on the default model: the logits of a prompt's last token against the
/// GPU's bf16 weights, as a relative error (printed: the issue asks for the figure).
fn fp8_logits_stay_near_bf16(g: &Gpu, _: &mut StdRng) {
    let path = rustle::loader::resolve_model_path(None).unwrap();
    let cases = &common::golden("smollm2-135m").cases;
    let logits = |format, prompt: &[u32]| {
        let m = rustle::loader::load(&path).unwrap();
        let o = RunnerOptions {
            weights: format,
            ..opts()
        };
        let mut r = Runner::new(m.config, m.weights, &o, gpu_device(g)).unwrap();
        let mut seq = r.solo();
        let l = r.extend(&mut seq, prompt).unwrap().to_vec();
        seq.release();
        l
    };
    let argmax = |l: &[f32]| (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap();
    // The first prompt's 5 tokens take the fp8 GEMV (f32 activations); the last one's 75
    // take fp8's tensor cores (`gemm_wgmma_fp8`, activations in e4m3 too) where the GPU
    // has them.
    for (i, case) in [(0, &cases[0]), (2, &cases[2])] {
        let prompt = &case.prompt_ids;
        let (bf16, fp8) = (
            logits(WeightFormat::Bf16, prompt),
            logits(WeightFormat::Fp8, prompt),
        );
        let e = rel_err(&fp8, &bf16);
        let max_abs = fp8
            .iter()
            .zip(&bf16)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        let same_top = argmax(&fp8) == argmax(&bf16);
        eprintln!(
            "  case {i} ({} tokens): fp8 vs bf16 logits: relative error {e:.3e}, largest \
             difference {max_abs:.3}, same top token {same_top}",
            prompt.len()
        );
        // e4m3 keeps 3 bits of mantissa (each weight within 1/16 of itself): on this small
        // model the logits move by about a tenth of their size.
        assert!(e < 0.25, "case {i}: fp8 logits relative error {e}");
        if i == 0 {
            assert!(same_top, "fp8 changes the top token");
        }
    }
}

/// A prompt of 120 tokens through Q8_0 matrices in one forward pass, where every matmul
/// takes the warpgroup GEMM on the blocks (`gemm_wgmma_q8_0`, seen in the profile, with no
/// dequantizer but the embedding's), against the same prompt in chunks of 40 (`gemm_q8_0`,
/// held to its twin by the kernel tests): the last token's logits near each other (the
/// same bf16 weights and activations both ways, sums in another order) and the same next
/// token, unless the best two are near a tie. Then the same through Q4_K_M's mix, whose
/// Q4_K matrices take `gemm_wgmma_q4_k` (its Q6_K rows of 1024 and 3584 weights are not
/// whole 16-byte pieces: those matrices dequantize).
fn prompts_on_blocks_match_chunks(g: &Gpu, rng: &mut StdRng) {
    use rustle::gpu::matrix::Synthetic;
    let (c, _) = synthetic_llama3(rng);
    let q8_0 = Synthetic::Blocks(BlockType::Q8_0);
    prompt_on_blocks_matches_chunks(g, rng, &c, q8_0, "gemm_wgmma_q8_0", 5 * c.n_layers, 1);
    let q4_0 = Synthetic::Blocks(BlockType::Q4_0);
    prompt_on_blocks_matches_chunks(g, rng, &c, q4_0, "gemm_wgmma_q4_0", 5 * c.n_layers, 1);
    // Q4_K_M: o, gate and up in every layer; qkv and down where v and down are Q4_K too.
    let q4_k_m = Synthetic::KMix(BlockType::Q4K);
    let wide = (0..c.n_layers)
        .filter(|&l| q4_k_m.wider(l, c.n_layers) != Some(BlockType::Q4K))
        .count();
    let taken = 5 * c.n_layers - 2 * wide;
    // The embedding, and qkv's two runs and down of each wider layer.
    let dequant = 1 + 3 * wide;
    prompt_on_blocks_matches_chunks(g, rng, &c, q4_k_m, "gemm_wgmma_q4_k", taken, dequant);
}

/// `prompts_on_blocks_match_chunks` for one kind of weights: `taken` launches of `kernel`
/// in the 120-token pass, and `dequant` of the dequantizers.
fn prompt_on_blocks_matches_chunks(
    g: &Gpu,
    rng: &mut StdRng,
    c: &Config,
    kind: rustle::gpu::matrix::Synthetic,
    kernel: &str,
    taken: usize,
    dequant: usize,
) {
    use rustle::gpu::GpuWeights;
    let c = c.clone();
    let weights = GpuWeights::synthetic(g, &c, 7, kind).unwrap();
    let mut r = Runner::with_gpu_weights(c.clone(), g.clone(), weights, None, &opts()).unwrap();
    let prompt: Vec<u32> = (0..120)
        .map(|_| rng.random_range(0..c.vocab_size as u32))
        .collect();
    let mut whole = r.solo();
    g.profile_start();
    let one = r.extend(&mut whole, &prompt).unwrap().to_vec();
    let launches = g.profile_stop().unwrap();
    let count = |name: &str| {
        launches
            .iter()
            .filter(|l| l.kernel.starts_with(name))
            .count()
    };
    assert_eq!(count(kernel), taken, "{} through {kernel}", kind.name());
    assert_eq!(count("dequant_"), dequant, "{}'s dequantizers", kind.name());
    let mut chunked = r.solo();
    let mut parts = vec![];
    for chunk in prompt.chunks(40) {
        parts = r.extend(&mut chunked, chunk).unwrap().to_vec();
    }
    let e = rel_err(&one, &parts);
    eprintln!(
        "  {}: 120 tokens at once vs in chunks of 40: logits' relative error {e:.3e}",
        kind.name()
    );
    // The two take different attention kernels too (a prompt's, whose softmax weights are
    // rounded to bf16, against the chunks' over the cache): four layers of those differences
    // measured 5.8e-3 to 6.8e-3 (150 tokens against chunks of 50). A wrong tile or stride
    // is off by the logits themselves.
    assert!(e < 2e-2, "relative error {e:.3e}");
    // The same next token, unless the two best are within rounding of each other.
    let top = |l: &[f32]| (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap();
    let mut sorted = parts.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    if sorted[0] - sorted[1] > 1e-2 {
        assert_eq!(top(&one), top(&parts));
    }
    whole.release();
    chunked.release();
}

/// Llama 3 8B's proportions scaled down: head_dim 128, four query heads per KV head,
/// llama3 RoPE scaling, an untied head.
fn synthetic_llama3(rng: &mut StdRng) -> (Config, ModelWeights) {
    let hf: HfConfig = serde_json::from_str(
        r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "intermediate_size": 3584,
            "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
            "vocab_size": 8192, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "tie_word_embeddings": false,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 256}}"#,
    )
    .unwrap();
    let c = Config::resolve(&hf).unwrap();
    let (dim, q, kv, ffn) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
    let s = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
    let norm = |rng: &mut StdRng| {
        (0..dim)
            .map(|_| rng.random_range(0.8..1.2))
            .collect::<Vec<f32>>()
    };
    let layers = (0..c.n_layers)
        .map(|_| LayerWeights {
            attn_norm: norm(rng),
            wq: normal(rng, q * dim, s(dim)),
            wk: normal(rng, kv * dim, s(dim)),
            wv: normal(rng, kv * dim, s(dim)),
            bq: None,
            bk: None,
            bv: None,
            q_norm: None,
            k_norm: None,
            wo: normal(rng, dim * q, s(q)),
            post_attn_norm: None,
            ffn_norm: norm(rng),
            mlp: Mlp::Dense {
                gate: normal(rng, ffn * dim, s(dim)),
                up: normal(rng, ffn * dim, s(dim)),
                down: normal(rng, dim * ffn, s(ffn)),
            },
            post_ffn_norm: None,
        })
        .collect();
    let mut w = ModelWeights {
        embed: normal(rng, c.vocab_size * dim, 1.0),
        layers,
        final_norm: norm(rng),
        lm_head: Some(normal(rng, c.vocab_size * dim, 4.0 * s(dim))),
        rope_freq_factors: None,
        stored: None,
    };
    w.round_matrices_to_bf16();
    (c, w)
}

fn synthetic_llama3_gpu_matches_cpu(g: &Gpu, rng: &mut StdRng) {
    let seed = rng.random::<u64>();
    let (c, w) = synthetic_llama3(&mut StdRng::seed_from_u64(seed));
    let (_, w2) = synthetic_llama3(&mut StdRng::seed_from_u64(seed));
    // Chunks of 64 tokens and more of one prompt (300's, 1300's) take the prompt attention
    // on tensor cores (`attention_mma_bf16`); the 5- and 40-token prompts, and every decode
    // step, the split kernels.
    let prompts: Vec<Vec<u32>> = [5, 40, 300, 1300]
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| rng.random_range(0..c.vocab_size as u32))
                .collect()
        })
        .collect();
    let opts = RunnerOptions {
        kv_blocks: Some((1300 + 32usize).div_ceil(16) + 4),
        ..opts()
    };
    let mut cpu = Runner::new(c.clone(), w, &opts, Device::Cpu).unwrap();
    let mut gpu = Runner::new(c, w2, &opts, gpu_device(g)).unwrap();
    same_tokens(&mut cpu, &mut gpu, &prompts, 32);
}

/// 33 requests of different lengths through the serving engine on the GPU, bf16 weights,
/// arriving over the first steps: each request's greedy tokens must be those of its run alone
/// but at a near-tie (`batch_matches_alone`; a batch's decode step goes through the skinny
/// matmul). Then in the batch-invariant mode (every matmul skinny, attention per head) alone
/// and batched must agree bit for bit.
fn batched_requests_match_their_runs_alone(g: &Gpu, rng: &mut StdRng) {
    use rustle::serve::engine::RequestParams;
    const STEPS: usize = 24;
    let (c, w) = synthetic_llama3(&mut StdRng::seed_from_u64(rng.random()));
    let prompts: Vec<Vec<u32>> = (0..33)
        .map(|i| {
            let n = 3 + (i * 37) % 200;
            (0..n)
                .map(|_| rng.random_range(0..c.vocab_size as u32))
                .collect()
        })
        .collect();
    let mut engine = batch_matches_alone(g, c, w, &prompts, STEPS, 0.5);

    // The batch-invariant mode: alone (each request by itself through the engine) and
    // batched give the same tokens, bit for bit, every one of them.
    engine.model_mut().set_batch_invariant(true);
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let params = RequestParams {
                max_tokens: STEPS,
                ignore_eos: true,
                ..RequestParams::default()
            };
            let id = engine.add_request(p.clone(), params).unwrap();
            let mut out = vec![];
            while engine.has_work() {
                for o in engine.step().unwrap() {
                    assert_eq!(o.id, id);
                    out.extend(o.token);
                }
            }
            out
        })
        .collect();
    let together = engine_run(&mut engine, &prompts, STEPS);
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a, b, "batch-invariant mode: request {i} alone and batched");
    }
    eprintln!("  batch-invariant mode: 33/33 requests identical alone and batched");
}

/// A GGUF model whose matrices stay in their blocks (`tests/golden/tiny-quant.gguf`: Q4_K,
/// Q5_0, Q6_K and Q8_0, a fused q/k/v of two types): batched, each linear layer of 9 to 64
/// tokens goes through `gemm_<type>`; alone, a decode step goes through the quantized GEMV.
/// Each request's greedy tokens must be those of its run alone but at a near-tie, as for
/// `batched_requests_match_their_runs_alone`, with a wider tie: alone, the GEMV multiplies
/// the activations as 8-bit codes (one scale per 32), where the batch rounds them to bf16,
/// and over a dozen steps of this random model's cache the two part by more than bf16 alone
/// does. On the H200 over eight seeds the widest margin a request diverged at was 1.00 (seed
/// 11) and 0.90 (seed 1690584324), the others 0.15 to 0.52; the bf16 test's stay under 0.05.
fn quantized_batch_matches_runs_alone(g: &Gpu, rng: &mut StdRng) {
    let m = rustle::loader::load(std::path::Path::new("tests/golden/tiny-quant.gguf")).unwrap();
    let vocab = m.config.vocab_size as u32;
    let prompts: Vec<Vec<u32>> = (0..40)
        .map(|i| {
            let n = 3 + (i * 7) % 38;
            (0..n).map(|_| rng.random_range(0..vocab)).collect()
        })
        .collect();
    batch_matches_alone(g, m.config, m.weights, &prompts, 12, 1.5);
}

/// A decode step of 2 to 8 sequences over GGUF blocks keeps its activations in f32 for the
/// GEMVs, as a step of one does: the norms make the 8-bit codes (`rmsnorm_q8_f32`), gate and
/// up of one type are one launch (`gemv_swiglu_*`), and nothing is rounded for the tensor
/// cores (no `f32_to_bf16`, `rmsnorm_f32_bf16` or `swiglu_f32_bf16` in the step's profile).
/// Every kernel of that path sums a token's row as it would alone, and the attention's extra
/// splits (the batch's longest context sets their count) are empty, so each sequence's
/// logits must be those of its step alone to the bit. Each sequence runs twice, in two
/// caches: alone, one step at a time, and in the batch, both fed the tokens chosen alone.
/// The GPU is told to take every count the GEMV takes through it (`gemv_tokens_knob`),
/// whatever count the engine routes to `gemm_<type>` by default. Q4_K and Q6_K run twice:
/// every count on `gemv_<type>`, then every count on the tensor cores (`gemv_mma_<type>`);
/// by default one token takes the first and more the second, whose sums differ in order.
fn few_sequences_decode_as_one(g: &Gpu, rng: &mut StdRng) {
    use rustle::gpu::GpuWeights;
    use rustle::gpu::matrix::Synthetic;
    use rustle::tiles::QUANT_MAX_TOKENS;
    let mut g = g.clone();
    g.gemv_tokens_knob = Some(QUANT_MAX_TOKENS);
    let (c, _) = synthetic_llama3(rng);
    for (mma_tokens, kernels) in [
        // Q4_K_M's layers that keep v in Q6_K take q, k and v in one launch.
        (QUANT_MAX_TOKENS + 1, &["gemv_q4_k_q6_k"][..]),
        (
            1,
            &["gemv_mma_q4_k", "gemv_mma_q6_k", "gemv_swiglu_mma_q4_k"][..],
        ),
    ] {
        g.gemv_mma_tokens = mma_tokens;
        let weights = GpuWeights::synthetic(&g, &c, 7, Synthetic::KMix(BlockType::Q4K)).unwrap();
        let mut r = Runner::with_gpu_weights(c.clone(), g.clone(), weights, None, &opts()).unwrap();
        let what = format!("synthetic q4_k_m, the tensor cores from {mma_tokens} tokens");
        few_sequences_match_alone(&mut r, rng, &what, false, kernels);
    }
    let g = &g;
    let m = rustle::loader::load(std::path::Path::new("tests/golden/tiny-quant.gguf")).unwrap();
    let mut r = Runner::new(m.config, m.weights, &opts(), gpu_device(g)).unwrap();
    // Layer 1's gate and up are of different types: two GEMVs and `swiglu_f32`.
    few_sequences_match_alone(&mut r, rng, "tiny-quant.gguf", true, &[]);
}

/// `few_sequences_decode_as_one` on one model: 2, 5 and 8 sequences (5 in a graph of 8
/// rows, 3 of them padding), four teacher-forced steps each, the first profiled with graphs
/// off. Every model here has a layer whose gate and up share a type (`gemv_swiglu_*`);
/// `mixed_mlp`: another's do not (two GEMVs, then `swiglu_f32`); `kernels` must run too.
fn few_sequences_match_alone(
    r: &mut Runner,
    rng: &mut StdRng,
    what: &str,
    mixed_mlp: bool,
    kernels: &[&str],
) {
    use rustle::batch::{Batch, SeqChunk};
    use rustle::kv::block_manager::{BlockManager, BlockTable};
    use rustle::runner::Forward;
    const STEPS: usize = 4;
    let vocab = r.config.vocab_size;
    let mut blocks = BlockManager::new(r.limits().n_blocks, false);
    let mut batch = Batch::default();
    for k in [2, 5, 8] {
        let prompts: Vec<Vec<u32>> = (0..k)
            .map(|i| {
                (0..3 + 5 * i)
                    .map(|_| rng.random_range(0..vocab as u32))
                    .collect()
            })
            .collect();
        let (mut alone, mut batched) = (
            vec![BlockTable::default(); k],
            vec![BlockTable::default(); k],
        );
        let mut next = vec![0u32; k];
        for (i, prompt) in prompts.iter().enumerate() {
            for t in [&mut alone[i], &mut batched[i]] {
                blocks.reserve(t, prompt.len() + STEPS).unwrap();
                let chunk = SeqChunk {
                    table: t,
                    tokens: prompt,
                    logits: 1,
                };
                batch.fill(&[chunk], false);
                next[i] = r.forward_greedy(&batch).unwrap()[0];
                t.len += prompt.len();
            }
        }
        for step in 0..STEPS {
            let mut expected = vec![];
            for (i, t) in alone.iter_mut().enumerate() {
                let token = [next[i]];
                let chunk = SeqChunk {
                    table: t,
                    tokens: &token,
                    logits: 1,
                };
                batch.fill(&[chunk], false);
                expected.extend_from_slice(r.forward(&batch).unwrap());
                t.len += 1;
            }
            let tokens: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
            let chunks: Vec<SeqChunk> = batched
                .iter()
                .zip(&tokens)
                .map(|(table, tokens)| SeqChunk {
                    table,
                    tokens,
                    logits: 1,
                })
                .collect();
            batch.fill(&chunks, false);
            let profiled = step == 0;
            if profiled {
                r.set_graphs(false);
                r.profile_start();
            }
            let got = r.forward(&batch).unwrap().to_vec();
            if profiled {
                let launches = r.profile_stop().unwrap();
                r.set_graphs(true);
                let ran = |name: &str| launches.iter().any(|l| l.kernel.starts_with(name));
                for rounding in ["f32_to_bf16", "rmsnorm_f32_bf16", "swiglu_f32_bf16"] {
                    assert!(!ran(rounding), "{what}, {k} sequences: {rounding} ran");
                }
                for fused in ["rmsnorm_q8_f32", "attention_combine_q8_f32", "gemv_swiglu"] {
                    assert!(ran(fused), "{what}, {k} sequences: no {fused}");
                }
                for kernel in kernels {
                    assert!(ran(kernel), "{what}, {k} sequences: no {kernel}");
                }
                let separate = launches.iter().any(|l| l.kernel == "swiglu_f32");
                assert_eq!(separate, mixed_mlp, "{what}, {k} sequences: swiglu_f32");
            }
            for t in batched.iter_mut() {
                t.len += 1;
            }
            let rows = expected.chunks(vocab).zip(got.chunks(vocab));
            for (i, ((want, have), next)) in rows.zip(next.iter_mut()).enumerate() {
                let differ = want
                    .iter()
                    .zip(have)
                    .filter(|(a, b)| a.to_bits() != b.to_bits());
                assert_eq!(
                    differ.count(),
                    0,
                    "{what}, {k} sequences, step {step}: sequence {i}'s logits differ from its step alone (relative error {:.3e})",
                    rel_err(have, want)
                );
                *next = ops::argmax_f32(want);
            }
        }
        for t in alone.iter_mut().chain(batched.iter_mut()) {
            blocks.release(t);
        }
        eprintln!("  {what}: {k} sequences, {STEPS} steps: every logit as alone, to the bit");
    }
}

/// Runs each of `prompts` alone for `steps` greedy tokens, then all of them through the
/// serving engine, two new requests a step (decode steps of many sequences, padded CUDA-graph
/// buckets, steps that mix decodes with prompt chunks), twice. The batched run must repeat
/// itself exactly, and give each request the tokens of its run alone but at a near-tie:
/// alone, a decode step is one token through a GEMV on f32 activations, in a batch a tensor
/// core matmul's bf16 activations (rounding moves logits by a few hundredths); and a prompt
/// chunk's matmuls change kernel with the batch's size. A near-tie is a step whose best two
/// logits alone are less than `near_tie` apart. Returns the engine.
fn batch_matches_alone(
    g: &Gpu,
    c: Config,
    w: ModelWeights,
    prompts: &[Vec<u32>],
    steps: usize,
    near_tie: f32,
) -> rustle::serve::engine::Engine {
    use rustle::serve::engine::{Engine, EngineOptions};
    let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let opts = RunnerOptions {
        kv_blocks: Some(prompts.len() * (longest + steps).div_ceil(16) + 8),
        max_batch_tokens: 512,
        ..Default::default()
    };
    let mut runner = Runner::new(c, w, &opts, gpu_device(g)).unwrap();
    let alone: Vec<(Vec<u32>, Vec<f32>)> = prompts
        .iter()
        .map(|p| greedy(&mut runner, p, steps))
        .collect();
    let eopts = EngineOptions {
        token_budget: 512,
        max_seqs: 256,
        prefix_cache: false,
        eos: vec![],
        ..Default::default()
    };
    let mut engine = Engine::new(runner, eopts).unwrap();
    let first = engine_run(&mut engine, prompts, steps);
    let again = engine_run(&mut engine, prompts, steps);
    assert_eq!(
        first, again,
        "the same batched run twice gave different tokens"
    );
    let mut ties = vec![];
    for (i, ((tokens, margins), got)) in alone.iter().zip(&first).enumerate() {
        assert_eq!(got.len(), steps, "request {i}");
        if let Some(s) = tokens.iter().zip(got).position(|(a, b)| a != b) {
            assert!(
                margins[s] < near_tie,
                "request {i} ({} prompt tokens): step {s}: alone {} batched {} (margin {})",
                prompts[i].len(),
                tokens[s],
                got[s],
                margins[s]
            );
            ties.push(margins[s]);
        }
    }
    ties.sort_by(f32::total_cmp);
    eprintln!(
        "  {} requests: {} with every greedy token of their run alone, {} diverging at a near-tie (margins {ties:.2?})",
        prompts.len(),
        prompts.len() - ties.len(),
        ties.len(),
    );
    engine
}

/// All of `prompts` through the engine, two new requests a step until all are in, `steps`
/// greedy tokens each; their tokens in the prompts' order.
fn engine_run(
    engine: &mut rustle::serve::engine::Engine,
    prompts: &[Vec<u32>],
    steps: usize,
) -> Vec<Vec<u32>> {
    use rustle::serve::engine::RequestParams;
    let mut out = vec![vec![]; prompts.len()];
    let mut ids = std::collections::HashMap::new();
    let (mut next, mut step) = (0, 0);
    while next < prompts.len() || engine.has_work() {
        for _ in 0..2 {
            if next < prompts.len() {
                let params = RequestParams {
                    max_tokens: steps,
                    ignore_eos: true,
                    ..RequestParams::default()
                };
                ids.insert(
                    engine.add_request(prompts[next].clone(), params).unwrap(),
                    next,
                );
                next += 1;
            }
        }
        for o in engine.step().unwrap() {
            out[ids[&o.id]].extend(o.token);
        }
        step += 1;
        assert!(step < 10_000, "the engine does not finish");
    }
    out
}

/// bf16 weights, and in prefill bf16 activations into the tensor cores and bf16 attention
/// (as a bf16 run of transformers would have), move these logits (about 20 wide) by up to a
/// few tenths from transformers' f32 ones (0.28 seen); steps whose best two logits are that
/// close are near-ties.
const GPU_VS_TRANSFORMERS: common::Tolerance = common::Tolerance {
    near_tie: 0.5,
    logit: 0.5,
};

fn default_model_gpu_matches_transformers(g: &Gpu, _: &mut StdRng) {
    let (mut r, tok) = common::load(None, 256, gpu_device(g));
    let mut worst = 0f32;
    for case in &common::golden("smollm2-135m").cases {
        worst = worst.max(common::check_case(&mut r, &tok, case, &GPU_VS_TRANSFORMERS));
    }
    eprintln!("  largest top-logit error against transformers: {worst:.3e}");
}

/// Every tiny golden model (each architecture, HF folders and GGUF files) on the GPU against
/// transformers, as tests/golden.rs holds the CPU.
fn tiny_models_gpu_match_transformers(g: &Gpu, _: &mut StdRng) {
    golden_models_match(
        g,
        &[
            ("tests/golden/tiny-llama3", "tiny-llama3"),
            ("tests/golden/tiny-qwen2", "tiny-qwen2"),
            ("tests/golden/tiny-mistral", "tiny-mistral"),
            ("tests/golden/tiny-qwen3", "tiny-qwen3"),
            ("tests/golden/tiny-qwen3.gguf", "tiny-qwen3"),
            ("tests/golden/tiny-phi3", "tiny-phi3"),
            ("tests/golden/tiny-phi3.gguf", "tiny-phi3"),
            ("tests/golden/tiny-quant.gguf", "tiny-quant"),
        ],
    );
}

/// Each (model path, golden file) on the GPU against transformers' logits and tokens.
fn golden_models_match(g: &Gpu, models: &[(&str, &str)]) {
    for &(path, golden) in models {
        let (mut r, tok) = common::load(Some(path), 256, gpu_device(g));
        let mut worst = 0f32;
        for case in &common::golden(golden).cases {
            worst = worst.max(common::check_case(&mut r, &tok, case, &GPU_VS_TRANSFORMERS));
        }
        eprintln!("  {path}: largest top-logit error against transformers: {worst:.3e}");
    }
}

/// The tiny mixtures of experts (Mixtral's top 2 of 4, Qwen3-MoE's top 3 of 8, renormalized;
/// HF folders and GGUF files) on the GPU against transformers.
fn tiny_experts_gpu_match_transformers(g: &Gpu, _: &mut StdRng) {
    golden_models_match(
        g,
        &[
            ("tests/golden/tiny-mixtral", "tiny-mixtral"),
            ("tests/golden/tiny-mixtral.gguf", "tiny-mixtral"),
            ("tests/golden/tiny-qwen3moe", "tiny-qwen3moe"),
            ("tests/golden/tiny-qwen3moe.gguf", "tiny-qwen3moe"),
        ],
    );
}

/// Gemma 3's tiny golden models (its GeGLU, scaled embedding, post-norms, local layers with
/// their window and RoPE base, heads of 256) on the GPU against transformers.
fn tiny_gemma3_gpu_matches_transformers(g: &Gpu, _: &mut StdRng) {
    golden_models_match(
        g,
        &[
            ("tests/golden/tiny-gemma3", "tiny-gemma3"),
            ("tests/golden/tiny-gemma3-1b", "tiny-gemma3-1b"),
            ("tests/golden/tiny-gemma3-1b.gguf", "tiny-gemma3-1b"),
        ],
    );
}

/// The profiler sees every launch of a decode step (graphs off), and the byte counts of the
/// matmuls add up to the weights a step must read.
fn profile_times_every_launch_of_a_step(g: &Gpu, _: &mut StdRng) {
    let (mut r, _) = common::load(None, 256, gpu_device(g));
    let c = r.config.clone();
    r.set_graphs(false);
    let weight_bytes = r.weight_bytes_per_step() as u64;
    let mut seq = r.solo();
    let t = r.extend_greedy(&mut seq, &[1, 2, 3]).unwrap();
    g.profile_start();
    r.extend_greedy(&mut seq, &[t]).unwrap();
    let launches = g.profile_stop().unwrap();
    // Per layer: 2 norms (each making the 8-bit codes of the matmul after it), qkv, RoPE +
    // cache write, attention split + combine (which makes o_proj's codes), o_proj, gate with
    // up and the SwiGLU (one launch: both are Q4_1), down's codes and down; then the
    // embedding, the final norm (the head's codes), the head and the argmax.
    assert_eq!(
        launches.len(),
        10 * c.n_layers + 4,
        "{:?}",
        launches.iter().map(|l| l.kernel).collect::<Vec<_>>()
    );
    assert!(launches.iter().all(|l| l.ms > 0.0 && l.traffic.bytes > 0));
    let matmul_bytes: u64 = launches
        .iter()
        .filter(|l| l.kernel.starts_with("gemv"))
        .map(|l| l.traffic.bytes)
        .sum();
    // The matmuls read every weight but the norms and the embedding row, plus small vectors.
    let norms = (4 * (2 * c.n_layers + 1) * c.dim) as u64;
    let matrices = weight_bytes - norms;
    assert!(
        matmul_bytes >= matrices && matmul_bytes < matrices + matrices / 50,
        "{matmul_bytes} vs {matrices}"
    );
    seq.release();
}

/// `rustle profile`'s collection on a small shape: decode's kernels are memory-bound, and the
/// prefill GEMM does far more arithmetic per byte than the decode GEMV.
fn profile_puts_decode_on_the_slope(g: &Gpu, _: &mut StdRng) {
    use rustle::tools::profile::{Phase, collect};
    let args = collect::ProfileArgs {
        shape: Some("smollm2-135m".into()),
        model: None,
        // Past the skinny matmul's 128 rows: the prompt's matmuls take the prompt GEMM.
        prompt_len: 256,
        steps: 4,
        weights: Default::default(),
    };
    let p = collect::gpu(&args).unwrap();
    let c = &p.ceilings;
    assert!(
        c.bytes_per_s > 1e12 && c.flops_per_s > 1e14,
        "ceilings {c:?}"
    );
    let row = |k: &str, phase| {
        p.rows
            .iter()
            .find(|r| r.kernel == k && r.phase == phase)
            .unwrap_or_else(|| panic!("{k}"))
    };
    let (gemm, gemv) = (
        row(
            if g.has_wgmma() {
                "gemm_wgmma_bf16"
            } else {
                "gemm_mma_bf16"
            },
            Phase::Prefill,
        ),
        row("gemv_bf16", Phase::Decode),
    );
    assert!(
        gemm.intensity() > 10.0 * gemv.intensity(),
        "{} vs {}",
        gemm.intensity(),
        gemv.intensity()
    );
    assert!(
        p.rows
            .iter()
            .filter(|r| r.phase == Phase::Decode)
            .all(|r| r.memory_bound(c))
    );
    assert_eq!(row("gemv_swiglu_bf16", Phase::Decode).calls, 4 * 30);
}
