//! `rustle bench --lesson`: the lesson's steps (docs/) timed on a model's shapes, each beside
//! the kernel the forward pass runs for the same job and the ceiling the same process
//! measured: the read and copy bandwidth, and cuBLAS's bf16 GEMM on 8192^3.
//!
//! - the GEMV (chapter 3): a thread per row (step 1), a warp per row (step 2), 16-byte loads
//!   with four in flight (`gemv_bf16`, step 3), and cuBLAS, on the decode matrices; the same
//!   weights rotated through enough copies that none is found in the L2;
//! - the residual add alone (chapter 2), on one token and on a prompt;
//! - the reductions alone (chapter 4): a row's sum by a warp (`sum_step1_warp_f32`) and by a
//!   block (`sum_step2_block_f32`), beside `rmsnorm_f32`, whose reduction they isolate;
//! - the GEMM (chapter 5): the SIMT step 1 (`gemm_step1_simt_bf16`), `mma.sync`, the
//!   warpgroup GEMM the prefill runs on Hopper, and cuBLAS, on a prompt's matrices;
//! - attention (chapter 6): step 1 (`attention_f32`), the same body over the bf16 cache
//!   (`attention_bf16`), and the tensor-core prompt kernel (`attention_mma_bf16`), on one
//!   sequence's prompt.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use serde::Serialize;

use super::timing::time_ms;
use super::{ceilings, cublas, prefill_matmuls};
use crate::config::Config;
use crate::error::Result;
use crate::gpu::Gpu;
use crate::gpu::timing::copies;
use crate::kernel_args::{Heads, Paged, PagedShape};
use crate::tiles::BLOCK_SIZE;
use crate::traffic::{self, Traffic};

#[derive(Serialize)]
pub struct LessonRow {
    /// "qkv", "o_proj", "gate", "down"
    pub name: String,
    pub n_out: usize,
    pub n_in: usize,
    /// Microseconds per launch of steps 1, 2 and 3.
    pub steps_us: [f64; 3],
    /// None when cuBLAS could not be loaded.
    pub cublas_us: Option<f64>,
    /// Bytes of weights one launch reads.
    pub bytes: usize,
}

/// The ceilings every figure of the run is a share of, measured by the same process.
#[derive(Serialize)]
pub struct LessonCeilings {
    /// The read probe (`read_probe_u32`): bytes read per second.
    pub read_bytes_per_s: f64,
    /// A device-to-device copy: bytes read + written per second.
    pub copy_bytes_per_s: f64,
    /// Matrix throughput, FLOP/s, and what measured it.
    pub matrix_flops_per_s: f64,
    pub matrix_source: String,
}

/// Which table a step is printed in, and the ceiling its share is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Section {
    /// Bytes over the copy bandwidth.
    Residual,
    /// Bytes over the read bandwidth.
    Reduction,
    /// FLOPs over the matrix throughput.
    Gemm,
    /// FLOPs over the matrix throughput, and bytes over the copy bandwidth.
    Attention,
}

/// One kernel timed on one case.
#[derive(Serialize)]
pub struct StepTime {
    pub section: Section,
    /// The shape it ran on, e.g. "prompt 512: qkv 6144 x 4096".
    pub case: String,
    /// The kernel's name, or "cuBLAS".
    pub kernel: String,
    /// "lesson step 1", "the forward's", ...
    pub role: String,
    /// Microseconds per launch, back to back.
    pub us: f64,
    /// What the launch must move and compute (`engine/traffic.rs`).
    pub bytes: u64,
    pub flops: u64,
}

/// A whole `rustle bench --lesson` run.
#[derive(Serialize)]
pub struct Lesson {
    pub ceilings: LessonCeilings,
    pub prompt_len: usize,
    pub gemv: Vec<LessonRow>,
    pub steps: Vec<StepTime>,
}

/// Every step of the lesson on `c`'s shapes; the GEMM and attention on a prompt of
/// `prompt_len` tokens.
pub fn run(gpu: &Gpu, c: &Config, prompt_len: usize) -> Result<Lesson> {
    let bw = ceilings::gpu_bandwidth(gpu)?;
    let (matrix_flops_per_s, matrix_source) = match ceilings::cublas_gemm_flops(gpu, 8192)? {
        Some(f) => (f, "cuBLAS bf16 GEMM 8192^3".to_string()),
        None => (
            ceilings::rustle_gemm_flops(gpu, 8192)?,
            "rustle's prefill GEMM 8192^3 (no cuBLAS)".to_string(),
        ),
    };
    let ceilings = LessonCeilings {
        read_bytes_per_s: bw.read_bytes_per_s,
        copy_bytes_per_s: bw.copy_bytes_per_s,
        matrix_flops_per_s,
        matrix_source,
    };
    let gemv = gemv_steps(gpu, c)?;
    let mut steps = vec![];
    residual(gpu, c, prompt_len, &mut steps)?;
    reductions(gpu, c, prompt_len, &mut steps)?;
    gemm(gpu, c, prompt_len, &mut steps)?;
    attention(gpu, c, prompt_len, &mut steps)?;
    Ok(Lesson {
        ceilings,
        prompt_len,
        gemv,
        steps,
    })
}

/// Microseconds per launch of `f`, run `launches` times back to back per timed region (the
/// median of 5 regions).
fn time_us(gpu: &Gpu, launches: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    let ms = time_ms(gpu, 5, &mut || (0..launches).try_for_each(|_| f()))?;
    Ok(ms * 1e3 / launches as f64)
}

/// Launches per timed region for the small kernels: back to back, as in a decode step, so
/// that the figure is the kernel's and not the cost of timing one launch alone.
const SMALL_BATCH: usize = 20;

/// `n` random finite f32 on the device, held as `2 n` random bf16 bits: the upper half of
/// each float is a bf16 of about `scale`, so every float is finite (`as_f32` reads them).
fn random_f32(gpu: &Gpu, n: usize, seed: u32, scale: f32) -> Result<CudaSlice<u16>> {
    let mut b = gpu.zeros::<u16>(2 * n, "the lesson benchmark")?;
    gpu.fill_random_bf16(&mut b.as_view_mut(), seed, scale)?;
    Ok(b)
}

fn as_f32(b: &CudaSlice<u16>) -> CudaView<'_, f32> {
    // SAFETY: 2 n bf16 reinterpreted as n f32: same bytes, 4-byte aligned (a fresh
    // allocation), every value finite (`random_f32`).
    unsafe { b.transmute::<f32>(b.len() / 2) }.expect("length fits")
}

fn as_f32_mut(b: &mut CudaSlice<u16>) -> CudaViewMut<'_, f32> {
    let n = b.len() / 2;
    // SAFETY: as `as_f32`.
    unsafe { b.transmute_mut::<f32>(n) }.expect("length fits")
}

/// Each of `c`'s decode matrices through every GEMV step.
fn gemv_steps(gpu: &Gpu, c: &Config) -> Result<Vec<LessonRow>> {
    // Launches per timed region; few, as step 1 takes milliseconds on the large matrices.
    const BATCH: usize = 3;
    let blas = cublas::load(gpu)?;
    let shapes = [
        ("qkv", c.q_dim() + 2 * c.kv_dim(), c.dim),
        ("o_proj", c.dim, c.q_dim()),
        ("gate", c.ffn_dim, c.dim),
        ("down", c.dim, c.ffn_dim),
    ];
    let mut rows = vec![];
    for (name, n_out, n_in) in shapes {
        let bytes = n_out * n_in * 2;
        let k = copies(bytes);
        let mut weights: Vec<CudaSlice<u16>> = vec![];
        for i in 0..k {
            let mut w = gpu.zeros::<u16>(n_out * n_in, "the lesson benchmark")?;
            let scale = 1.0 / (n_in as f32).sqrt();
            gpu.fill_random_bf16(&mut w.as_view_mut(), 300 + i as u32, scale)?;
            weights.push(w);
        }
        let x = random_f32(gpu, n_in, 299, 1.0)?;
        let x_f32 = as_f32(&x);
        let mut out = gpu.zeros::<f32>(n_out, "the lesson benchmark")?;
        let mut time = |step: usize| -> Result<f64> {
            let mut turn = 0;
            time_us(gpu, BATCH, &mut || {
                turn = (turn + 1) % k;
                let (o, w) = (&mut out.as_view_mut(), &weights[turn].as_view());
                match step {
                    1 => gpu.gemv_step1_thread_per_row_bf16(o, &x_f32, w, n_in, n_out),
                    2 => gpu.gemv_step2_warp_per_row_bf16(o, &x_f32, w, n_in, n_out),
                    _ => gpu.gemv_bf16(o, &x_f32, w, None, n_in, false),
                }
            })
        };
        let steps_us = [time(1)?, time(2)?, time(3)?];
        let cublas_us = match &blas {
            None => None,
            Some(blas) => {
                // cuBLAS takes bf16 activations: x's first n_in bf16.
                let mut turn = 0;
                Some(time_us(gpu, BATCH, &mut || {
                    turn = (turn + 1) % k;
                    cublas::linear(gpu, blas, &mut out, &weights[turn], &x, (1, n_in, n_out))
                })?)
            }
        };
        rows.push(LessonRow {
            name: name.into(),
            n_out,
            n_in,
            steps_us,
            cublas_us,
            bytes,
        });
    }
    Ok(rows)
}

/// One `StepTime` from a measured time and the launch's traffic.
fn step(section: Section, case: &str, kernel: &str, role: &str, us: f64, t: Traffic) -> StepTime {
    StepTime {
        section,
        case: case.into(),
        kernel: kernel.into(),
        role: role.into(),
        us,
        bytes: t.bytes,
        flops: t.flops,
    }
}

/// The two cases of the small kernels: one token's row (decode) and a prompt's rows.
fn token_cases(c: &Config, prompt_len: usize) -> [(String, usize); 2] {
    [
        (format!("decode: 1 x {}", c.dim), 1),
        (format!("prompt: {prompt_len} x {}", c.dim), prompt_len),
    ]
}

/// `residual_add_f32` alone on one token and on a prompt, rotating through enough buffers
/// that the large case streams from memory.
fn residual(gpu: &Gpu, c: &Config, prompt_len: usize, steps: &mut Vec<StepTime>) -> Result<()> {
    for (case, rows) in token_cases(c, prompt_len) {
        let n = rows * c.dim;
        let k = copies(8 * n);
        let mut xs = vec![];
        let mut deltas = vec![];
        for i in 0..k as u32 {
            xs.push(random_f32(gpu, n, 400 + i, 1.0)?);
            deltas.push(random_f32(gpu, n, 500 + i, 1.0)?);
        }
        let mut turn = 0;
        let us = time_us(gpu, SMALL_BATCH, &mut || {
            turn = (turn + 1) % k;
            gpu.residual_add_f32(&mut as_f32_mut(&mut xs[turn]), &as_f32(&deltas[turn]))
        })?;
        let t = traffic::residual_add_f32(n);
        let role = "lesson step (chapter 2); the forward's where a matmul cannot add itself";
        steps.push(step(
            Section::Residual,
            &case,
            "residual_add_f32",
            role,
            us,
            t,
        ));
    }
    Ok(())
}

/// The reductions alone, a warp and a block per row, beside `rmsnorm_f32` on the same rows.
fn reductions(gpu: &Gpu, c: &Config, prompt_len: usize, steps: &mut Vec<StepTime>) -> Result<()> {
    let dim = c.dim;
    let weight = random_f32(gpu, dim, 600, 1.0)?;
    for (case, rows) in token_cases(c, prompt_len) {
        let n = rows * dim;
        let k = copies(4 * n);
        let mut xs = vec![];
        for i in 0..k as u32 {
            xs.push(random_f32(gpu, n, 700 + i, 1.0)?);
        }
        let mut sums = gpu.zeros::<f32>(rows, "the lesson benchmark")?;
        let mut normed = gpu.zeros::<f32>(n, "the lesson benchmark")?;
        let kernels = [
            ("sum_step1_warp_f32", "lesson step 1: a warp per row"),
            ("sum_step2_block_f32", "lesson step 2: a block per row"),
            ("rmsnorm_f32", "the forward's norm (a block per row)"),
        ];
        for (i, (kernel, role)) in kernels.into_iter().enumerate() {
            let mut turn = 0;
            let us = time_us(gpu, SMALL_BATCH, &mut || {
                turn = (turn + 1) % k;
                let x = as_f32(&xs[turn]);
                match i {
                    0 => gpu.sum_step1_warp_f32(&mut sums.as_view_mut(), &x, dim),
                    1 => gpu.sum_step2_block_f32(&mut sums.as_view_mut(), &x, dim),
                    _ => {
                        let w = as_f32(&weight);
                        gpu.rmsnorm_f32(&mut normed.as_view_mut(), &x, &w, 1e-5, dim)
                    }
                }
            })?;
            let t = match i {
                0 | 1 => traffic::sum_f32(rows, dim),
                _ => traffic::rmsnorm_f32(rows, dim),
            };
            steps.push(step(Section::Reduction, &case, kernel, role, us, t));
        }
    }
    Ok(())
}

/// The GEMM's steps on a prompt's matrices: the SIMT step 1 here, `mma.sync`, the warpgroup
/// GEMM and cuBLAS as `rustle bench` times them (`prefill_matmuls`).
fn gemm(gpu: &Gpu, c: &Config, n: usize, steps: &mut Vec<StepTime>) -> Result<()> {
    // SIMT launches take milliseconds on the large matrices.
    const SIMT_BATCH: usize = 2;
    let fast = prefill_matmuls::run(gpu, c, n, false)?;
    let forward = if gpu.has_wgmma() {
        "gemm_wgmma_bf16"
    } else {
        "gemm_mma_bf16"
    };
    for (name, n_in, n_out) in prefill_matmuls::prefill_shapes(c) {
        let case = format!("prompt {n}: {name} {n_out} x {n_in}");
        let mut w = gpu.zeros::<u16>(n_out * n_in, "the lesson benchmark")?;
        gpu.fill_random_bf16(&mut w.as_view_mut(), 800, 1.0 / (n_in as f32).sqrt())?;
        let x = random_f32(gpu, n * n_in, 801, 1.0)?;
        let mut out = gpu.zeros::<f32>(n * n_out, "the lesson benchmark")?;
        let us = time_us(gpu, SIMT_BATCH, &mut || {
            let o = &mut out.as_view_mut();
            gpu.gemm_step1_simt_bf16(o, &as_f32(&x), &w.as_view(), None, n_in)
        })?;
        let t = traffic::gemm_bf16(n, n_in, n_out, false);
        let role = "lesson step 1: SIMT tiles";
        steps.push(step(
            Section::Gemm,
            &case,
            "gemm_step1_simt_bf16",
            role,
            us,
            t,
        ));
        let Some(r) = fast.iter().find(|r| r.name == name) else {
            continue;
        };
        let t = traffic::gemm_mma_bf16(n, n_in, n_out, false);
        let role = match forward {
            "gemm_mma_bf16" => "lesson step 2: mma.sync; the forward's on this GPU",
            _ => "lesson step 2: mma.sync",
        };
        steps.push(step(
            Section::Gemm,
            &case,
            "gemm_mma_bf16",
            role,
            r.mma_us,
            t,
        ));
        if let (Some(us), Some(plan)) = (r.wgmma_us, r.wgmma_plan) {
            let role = format!(
                "lesson step 3: wgmma; the forward's (plan: tile {}, split {})",
                plan.tile_n, plan.k_splits
            );
            let t = traffic::gemm_wgmma_bf16(n, n_in, n_out, false);
            steps.push(step(Section::Gemm, &case, "gemm_wgmma_bf16", &role, us, t));
        }
        if let Some(us) = r.cublas_us {
            let role = "reference: bf16 in, f32 out";
            steps.push(step(Section::Gemm, &case, "cuBLAS", role, us, t));
        }
    }
    Ok(())
}

/// Attention over one sequence's prompt of `n` tokens (each attending to itself and those
/// before it): step 1 over an f32 cache, the same body over the bf16 cache, and the
/// tensor-core prompt kernel.
fn attention(gpu: &Gpu, c: &Config, n: usize, steps: &mut Vec<StepTime>) -> Result<()> {
    let (nh, nkv, hd) = (c.n_heads, c.n_kv_heads, c.head_dim);
    let max_blocks = n.div_ceil(BLOCK_SIZE);
    let cache_len = max_blocks * BLOCK_SIZE * nkv * hd;
    let tables: Vec<u32> = (0..max_blocks as u32).collect();
    let positions: Vec<u32> = (0..n as u32).collect();
    let (tables, token_seq, pos) = (
        gpu.upload(&tables, "the lesson benchmark")?,
        gpu.zeros::<u32>(n, "the lesson benchmark")?,
        gpu.upload(&positions, "the lesson benchmark")?,
    );
    let q = random_f32(gpu, n * nh * hd, 900, 1.0)?;
    let (k32, v32) = (
        random_f32(gpu, cache_len, 901, 1.0)?,
        random_f32(gpu, cache_len, 902, 1.0)?,
    );
    let mut k16 = gpu.zeros::<u16>(cache_len, "the lesson benchmark")?;
    let mut v16 = gpu.zeros::<u16>(cache_len, "the lesson benchmark")?;
    gpu.fill_random_bf16(&mut k16.as_view_mut(), 903, 1.0)?;
    gpu.fill_random_bf16(&mut v16.as_view_mut(), 904, 1.0)?;
    let mut out = gpu.zeros::<f32>(n * nh * hd, "the lesson benchmark")?;
    let case = format!("prompt {n}: {nh} heads ({nkv} KV) of {hd}");
    let (tv, sv, pv) = (tables.as_view(), token_seq.as_view(), pos.as_view());
    let shape = PagedShape::new(max_blocks, Heads::of(c));
    let attended = traffic::attended(&positions);
    let mut kernels = vec![
        (
            "attention_f32",
            "lesson step 1: a block per (head, token), f32 cache",
            traffic::attention_f32(attended, n, nh, nkv, hd),
        ),
        (
            "attention_bf16",
            "step 1's body over the bf16 cache: the forward's per-head kernel",
            traffic::attention_per_head(attended, n, nh, nkv, hd, 2),
        ),
    ];
    if crate::gpu::kernels::attention_mma::attention_mma_supports(hd) {
        kernels.push((
            "attention_mma_bf16",
            "lesson step 3: tensor cores; the forward's for a prompt",
            traffic::attention_mma_bf16(&positions, nh, nkv, hd),
        ));
    }
    // One sequence whose block table row names blocks 0.. of the caches.
    let f32_cache = Paged {
        q: as_f32(&q),
        k_cache: as_f32(&k32),
        v_cache: as_f32(&v32),
        block_tables: tv.slice(..),
        token_seq: sv.slice(..),
        positions: pv.slice(..),
        shape,
    };
    let bf16 = Paged {
        q: as_f32(&q),
        k_cache: k16.as_view(),
        v_cache: v16.as_view(),
        block_tables: tv.slice(..),
        token_seq: sv.slice(..),
        positions: pv.slice(..),
        shape,
    };
    for (kernel, role, t) in kernels {
        let us = time_us(gpu, 3, &mut || {
            let o = &mut out.as_view_mut();
            // SAFETY: the block table covers every position; every key and value is
            // written (random).
            unsafe {
                match kernel {
                    "attention_f32" => gpu.attention_f32(o, &f32_cache),
                    "attention_bf16" => gpu.attention_bf16(o, &bf16),
                    _ => gpu.attention_mma_bf16(o, &bf16),
                }
            }
        })?;
        steps.push(step(Section::Attention, &case, kernel, role, us, t));
    }
    Ok(())
}

/// The report: each table says what it measures and against which ceiling of the same run.
pub fn print(l: &Lesson) {
    let ce = &l.ceilings;
    let (read, copy, flops) = (
        ce.read_bytes_per_s,
        ce.copy_bytes_per_s,
        ce.matrix_flops_per_s,
    );
    println!(
        "ceilings measured in this run: read {:.2} TB/s (read_probe_u32), copy {:.2} TB/s \
         (device copy, read + write), matrix {:.1} TFLOP/s ({})",
        read / 1e12,
        copy / 1e12,
        flops / 1e12,
        ce.matrix_source
    );

    println!();
    println!("[gemv] chapter 3, the decode matrices: us per launch (share of the read bandwidth)");
    print_gemv(&l.gemv, read);

    let sections = [
        (
            Section::Residual,
            "[residual] chapter 2, the residual add alone: us per launch, GB/s, share of the copy bandwidth",
        ),
        (
            Section::Reduction,
            "[reduction] chapter 4, the reductions alone beside RMSNorm: us per launch, GB/s, share of the read bandwidth",
        ),
        (
            Section::Gemm,
            "[gemm] chapter 5, a prompt's matrices: us per launch, TFLOP/s, share of the matrix ceiling",
        ),
        (
            Section::Attention,
            "[attention] chapter 6, one sequence's prompt: us per launch, TFLOP/s, share of the matrix ceiling, GB/s",
        ),
    ];
    for (section, title) in sections {
        println!();
        println!("{title}");
        println!(
            "  {:<40} {:<22} {:>10} {:>9} {:>8} {:>9} {:>8}  role",
            "case", "kernel", "us", "GB/s", "of BW", "TFLOP/s", "of MAT"
        );
        for s in l.steps.iter().filter(|s| s.section == section) {
            let sec = s.us * 1e-6;
            let (gbs, tfs) = (s.bytes as f64 / sec, s.flops as f64 / sec);
            let bw = match section {
                Section::Reduction => read,
                _ => copy,
            };
            let bw_share = match section {
                Section::Residual | Section::Reduction => format!("{:.1}%", 100.0 * gbs / bw),
                _ => "-".into(),
            };
            let mat_share = match section {
                Section::Gemm | Section::Attention => format!("{:.1}%", 100.0 * tfs / flops),
                _ => "-".into(),
            };
            println!(
                "  {:<40} {:<22} {:>10.1} {:>9.0} {:>8} {:>9.1} {:>8}  {}",
                s.case,
                s.kernel,
                s.us,
                gbs / 1e9,
                bw_share,
                tfs / 1e12,
                mat_share,
                s.role
            );
        }
    }
}

/// The GEMV table: each step's time and its share of the read bandwidth.
fn print_gemv(rows: &[LessonRow], read_bytes_per_s: f64) {
    println!(
        "  {:<8} {:>6} {:>6} {:>22} {:>22} {:>22} {:>22}",
        "GEMV",
        "rows",
        "cols",
        "1 thread/row us (%)",
        "2 warp/row us (%)",
        "3 gemv_bf16 us (%)",
        "cuBLAS us (%)"
    );
    for r in rows {
        let cell = |us: f64| {
            let share = r.bytes as f64 / (us * 1e-6) / read_bytes_per_s;
            format!("{us:.1} ({:.1}%)", 100.0 * share)
        };
        println!(
            "  {:<8} {:>6} {:>6} {:>22} {:>22} {:>22} {:>22}",
            r.name,
            r.n_out,
            r.n_in,
            cell(r.steps_us[0]),
            cell(r.steps_us[1]),
            cell(r.steps_us[2]),
            r.cublas_us.map_or("no cuBLAS".into(), cell)
        );
    }
}
