//! A mixture of experts' grouped GEMVs: one launch multiplies every chosen expert's matrix
//! by the rows of the tokens that chose it, each expert's weights read once a step.
//!
//! A layer's experts are stacked, `[n_experts, n_out, n_in]` (GGUF's `ffn_gate_exps` as the
//! file has it; the others stacked at load), and the routing (`route.rs`) left the (token,
//! expert) pairs grouped by expert in runs. Block `(b, j)` of the grid takes the rows of
//! block b of a dense GEMV (`gemv_codes`, `gemv_bf16`) in run j's expert, over that run's
//! pairs: at most `QUANT_MAX_TOKENS` at a time, the later ones finding the weights in L1.
//! Where the runs are long (a step of many tokens: about 4 pairs an expert at 64 sequences of
//! Qwen3-30B-A3B) the GGUF types that have one take the tensor cores' GEMV (`gemv_mma`) the
//! same way: 3858.9 tok/s where the dp4a GEMV gave 1374.9 (H100, bench/history/rounds.md
//! round 75).
//! The grid's y is the most runs a pass can have, `min(n_experts, pairs)`; the blocks of the
//! empty runs at the end leave at once, so the launch is the same whatever the routing (a
//! CUDA graph replays it).
//!
//! Row p of the input and of the output is pair p's: the host gathers each pair's token row
//! (`gather_rows_f32`) before the first GEMV, and the second's input is the first's output.

use crate::args::MatmulShape;
use crate::codes::Codes;
use crate::device::{block_idx_x, block_idx_y, sync_threads, wait_for_previous_kernel};
use crate::gemv::{gemv_bf16_token, gemv_swiglu_bf16_token};
use crate::gemv_codes::{CodesIn, gemv_codes};
use crate::gemv_mma::{MmaCodes, gemv_mma};
use crate::gemv_mma_bf16::gemv_mma_bf16_pass;
use crate::quant_blocks::{Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q5K, Q6K, Q8_0};
use crate::tiles::QUANT_MAX_TOKENS;

/// Run j's expert and its pairs `[first, end)`, read after the wait for the routing.
///
/// # Safety
/// `run_expert` holds j, `run_start` j + 1.
#[inline(always)]
unsafe fn run(run_expert: *const u32, run_start: *const u32, j: usize) -> (usize, usize, usize) {
    // SAFETY: the caller's guarantee.
    unsafe {
        let (first, end) = (*run_start.add(j), *run_start.add(j + 1));
        (*run_expert.add(j) as usize, first as usize, end as usize)
    }
}

/// A GEMV of GGUF blocks over run `block_idx_y()`'s expert and pairs: `pass` (a dense
/// GEMV's body for one block of rows: `gemv_codes`, `gemv_mma`) on each `QUANT_MAX_TOKENS`
/// of the run's pairs in turn, given its output, its inputs moved to those pairs and that
/// expert, and the pass's shape. `row_bytes` is a row's bytes of the type.
///
/// - `out`: `[pairs, out_stride]` f32, columns `0..n_out`
/// - `codes`, `scales`: `[pairs, n_in]` i8 and `[pairs, n_in / 32][2]` f32
///   (`quantize_q8_f32`'s), pair p's row p
/// - `w` (and `w_up` with the SwiGLU): `[n_experts, n_out]` rows of `n_in` weights
/// - `run_expert`, `run_start`: `route_experts_f32`'s
/// - `shape`: `n_in`, `n_out`, `out_stride`; `n_tokens` is the pairs, `accumulate` 0
///
/// # Safety
/// `pass`'s preconditions for every run (its pairs as the tokens), and `n_in / 32` even (so
/// that each pair's scales start 16-byte aligned); the grid's y at most `n_experts`.
#[inline(always)]
unsafe fn over_runs(
    out: *mut f32,
    input: CodesIn,
    (run_expert, run_start): (*const u32, *const u32),
    shape: MatmulShape,
    row_bytes: usize,
    pass: impl Fn(*mut f32, CodesIn, MatmulShape),
) {
    wait_for_previous_kernel();
    let [_, n_in, n_out, out_stride] = shape.sizes();
    // SAFETY: the grid's y is at most n_experts: inside both.
    let (expert, first, end) = unsafe { run(run_expert, run_start, block_idx_y()) };
    let matrix = expert * n_out * row_bytes;
    let mut p = first;
    while p < end {
        let tokens = (end - p).min(QUANT_MAX_TOKENS);
        if p > first {
            // SAFETY: uniform in the block (its run's); the last pass's sums are read
            // before the next one writes shared memory.
            unsafe { sync_threads() };
        }
        // SAFETY: pairs p .. p + tokens of the run: inside codes, scales and out; the
        // expert's matrices inside the stacks (the preconditions).
        let at = unsafe {
            CodesIn {
                codes: input.codes.add(p * n_in),
                scales: input.scales.add(p * n_in / 16),
                w: input.w.add(matrix),
                w_up: input.w_up.wrapping_add(matrix),
                bias: core::ptr::null(),
            }
        };
        let shape = MatmulShape {
            n_tokens: tokens as u32,
            accumulate: 0,
            ..shape
        };
        // SAFETY: as above: pair p's row of out.
        pass(unsafe { out.add(p * out_stride) }, at, shape);
        p += tokens;
    }
}

/// `gemv_codes` over run `block_idx_y()`'s expert and pairs (`over_runs`): `out[p, o] =
/// sum_i w[e, o, i] x[p, i]` for the run's pairs p (with `SWIGLU`, `silu(gate) * up` of the
/// expert's two matrices).
///
/// # Safety
/// `over_runs`' preconditions, with `gemv_codes`'s.
#[inline(always)]
unsafe fn gemv_experts_codes<B: Codes, const SWIGLU: bool>(
    out: *mut f32,
    input: CodesIn,
    run_expert: *const u32,
    run_start: *const u32,
    shape: MatmulShape,
) {
    let row_bytes = shape.n_in as usize / B::BLOCK_LEN * B::BLOCK_BYTES;
    // SAFETY: the caller's; each pass is gemv_codes's over at most QUANT_MAX_TOKENS pairs.
    let pass = |out, at, shape| unsafe { gemv_codes::<B, SWIGLU>(out, at, shape, block_idx_x()) };
    unsafe { over_runs(out, input, (run_expert, run_start), shape, row_bytes, pass) }
}

/// `gemv_mma` over run `block_idx_y()`'s expert and pairs (`over_runs`), on the tensor cores
/// (`M` = 2: the gate and up with their SwiGLU): `gemv_experts_codes`' product where the runs
/// are long enough that a pass's eight columns are not mostly empty (the host decides,
/// `Gpu::gemv_on_mma`).
///
/// # Safety
/// `over_runs`' preconditions, with `gemv_mma`'s.
#[inline(always)]
unsafe fn gemv_experts_mma<B: MmaCodes, const M: usize>(
    out: *mut f32,
    input: CodesIn,
    run_expert: *const u32,
    run_start: *const u32,
    shape: MatmulShape,
) {
    let row_bytes = shape.n_in as usize / B::BLOCK_LEN * B::BLOCK_BYTES;
    // SAFETY: the caller's; each pass is gemv_mma's over at most QUANT_MAX_TOKENS pairs.
    let pass = |out, at, shape| unsafe { gemv_mma::<B, M>(out, at, shape) };
    unsafe { over_runs(out, input, (run_expert, run_start), shape, row_bytes, pass) }
}

/// A grouped GEMV's two entry points for each type: `$gemv` (one matrix) and `$swiglu` (the
/// gate and up with their SwiGLU), each `$inner` (`gemv_experts_codes`, `gemv_experts_mma`)
/// over the type with its generic argument `$one` or `$two` (`false` / `true` for the SwiGLU
/// flag, 1 / 2 for the tiles of rows).
macro_rules! grouped_kernels {
    ($inner:ident, $one:tt, $two:tt; $($ty:ident => $gemv:ident, $swiglu:ident;)*) => {$(
        #[doc = concat!("`", stringify!($inner), "` over `", stringify!($ty), "` experts.")]
        ///
        /// # Safety
        #[doc = concat!("The host's launch wrapper checks `", stringify!($inner), "`'s preconditions.")]
        #[unsafe(no_mangle)]
        pub unsafe extern "gpu-kernel" fn $gemv(
            out: *mut f32,
            codes: *const u8,
            scales: *const f32,
            w: *const u8,
            run_expert: *const u32,
            run_start: *const u32,
            shape: MatmulShape,
        ) {
            let (w_up, bias) = (core::ptr::null(), core::ptr::null());
            let input = CodesIn { codes, scales, w, w_up, bias };
            // SAFETY: the wrapper's checks.
            unsafe { $inner::<$ty, $one>(out, input, run_expert, run_start, shape) }
        }

        #[doc = concat!("`", stringify!($inner), "` with the SwiGLU over `", stringify!($ty), "` experts.")]
        ///
        /// # Safety
        #[doc = concat!("The host's launch wrapper checks `", stringify!($inner), "`'s preconditions.")]
        #[unsafe(no_mangle)]
        pub unsafe extern "gpu-kernel" fn $swiglu(
            out: *mut f32,
            codes: *const u8,
            scales: *const f32,
            w_gate: *const u8,
            w_up: *const u8,
            run_expert: *const u32,
            run_start: *const u32,
            shape: MatmulShape,
        ) {
            let (w, bias) = (w_gate, core::ptr::null());
            let input = CodesIn { codes, scales, w, w_up, bias };
            // SAFETY: the wrapper's checks.
            unsafe { $inner::<$ty, $two>(out, input, run_expert, run_start, shape) }
        }
    )*};
}

grouped_kernels! { gemv_experts_codes, false, true;
    Q4_0 => gemv_experts_q4_0, gemv_swiglu_experts_q4_0;
    Q4_1 => gemv_experts_q4_1, gemv_swiglu_experts_q4_1;
    Q5_0 => gemv_experts_q5_0, gemv_swiglu_experts_q5_0;
    Q5_1 => gemv_experts_q5_1, gemv_swiglu_experts_q5_1;
    Q8_0 => gemv_experts_q8_0, gemv_swiglu_experts_q8_0;
    Q4K => gemv_experts_q4_k, gemv_swiglu_experts_q4_k;
    Q5K => gemv_experts_q5_k, gemv_swiglu_experts_q5_k;
    Q6K => gemv_experts_q6_k, gemv_swiglu_experts_q6_k;
}

grouped_kernels! { gemv_experts_mma, 1, 2;
    Q4_1 => gemv_experts_mma_q4_1, gemv_swiglu_experts_mma_q4_1;
    Q8_0 => gemv_experts_mma_q8_0, gemv_swiglu_experts_mma_q8_0;
    Q4K => gemv_experts_mma_q4_k, gemv_swiglu_experts_mma_q4_k;
    Q6K => gemv_experts_mma_q6_k, gemv_swiglu_experts_mma_q6_k;
}

/// `gemv_bf16` over run `block_idx_y()`'s expert and pairs, a pair at a time: `out[p, :] =
/// w[e] x[p, :]` for the run's pairs p.
///
/// - `out`: `[pairs, n_out]` f32
/// - `x`: `[pairs, n_in]` f32, pair p's row p
/// - `w`: `[n_experts, n_out, n_in]` bf16
/// - `run_expert`, `run_start`: `route_experts_f32`'s
/// - `shape`: `n_in` and `n_out` (`out_stride` is `n_out`, `accumulate` 0)
///
/// Thread mapping: `gemv_bf16`'s in x, a run a block in y.
///
/// # Safety
/// `gemv_bf16`'s preconditions for each pair; the grid's y at most `n_experts`.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn gemv_experts_bf16(
    out: *mut f32,
    x: *const f32,
    w: *const u16,
    run_expert: *const u32,
    run_start: *const u32,
    shape: MatmulShape,
) {
    wait_for_previous_kernel();
    let [_, n_in, n_out, _] = shape.sizes();
    // SAFETY: the grid's y is at most n_experts.
    let (expert, first, end) = unsafe { run(run_expert, run_start, block_idx_y()) };
    for p in first..end {
        // SAFETY: uniform in the block; orders the last pair's shared sums before the next.
        unsafe { sync_threads() };
        // SAFETY: pair p < pairs: its rows of x and out; the expert's matrix in the stack.
        unsafe {
            let w = w.add(expert * n_out * n_in);
            let bias = core::ptr::null();
            gemv_bf16_token(
                out.add(p * n_out),
                x.add(p * n_in),
                w,
                bias,
                n_in,
                n_out,
                false,
            )
        }
    }
}

/// `gemv_swiglu_bf16` over run `block_idx_y()`'s expert and pairs: `out[p, o] = silu(w_gate[e,
/// o] . x[p]) * (w_up[e, o] . x[p])`, buffers and mapping as `gemv_experts_bf16`'s.
///
/// # Safety
/// As `gemv_experts_bf16`.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn gemv_swiglu_experts_bf16(
    out: *mut f32,
    x: *const f32,
    w_gate: *const u16,
    w_up: *const u16,
    run_expert: *const u32,
    run_start: *const u32,
    shape: MatmulShape,
) {
    wait_for_previous_kernel();
    let [_, n_in, n_out, _] = shape.sizes();
    // SAFETY: the grid's y is at most n_experts.
    let (expert, first, end) = unsafe { run(run_expert, run_start, block_idx_y()) };
    let matrix = expert * n_out * n_in;
    for p in first..end {
        // SAFETY: as in gemv_experts_bf16.
        unsafe { sync_threads() };
        unsafe {
            let (gate, up) = (w_gate.add(matrix), w_up.add(matrix));
            gemv_swiglu_bf16_token(out.add(p * n_out), x.add(p * n_in), gate, up, n_in, n_out)
        }
    }
}

/// `gemv_mma_bf16_pass` over run `block_idx_y()`'s expert and pairs, 8 pairs a pass:
/// `gemv_experts_bf16`'s product (with `M` = 2, `gemv_swiglu_experts_bf16`'s) on the tensor
/// cores, the activations rounded to bf16, where the runs are long enough that a pass's
/// eight columns are not mostly empty (the host decides).
///
/// - `out`: `[pairs, out_stride]` f32, columns `0..n_out`; `x`: `[pairs, n_in]` f32
/// - `w`: `M` stacks `[n_experts, n_out, n_in]` bf16
///
/// Grid: (n_out / 16 rounded up, the runs), `MMA_GEMV_WARPS` warps a block.
///
/// # Safety
/// `gemv_mma_bf16_pass`'s preconditions for every run (its pairs as the tokens); the grid's y
/// at most `n_experts`.
#[inline(always)]
unsafe fn experts_mma_bf16<const M: usize>(
    out: *mut f32,
    x: *const f32,
    w: [*const u16; M],
    (run_expert, run_start): (*const u32, *const u32),
    shape: MatmulShape,
) {
    wait_for_previous_kernel();
    let [_, n_in, n_out, out_stride] = shape.sizes();
    // SAFETY: the grid's y is at most n_experts.
    let (expert, first, end) = unsafe { run(run_expert, run_start, block_idx_y()) };
    let w = w.map(|m| m.wrapping_add(expert * n_out * n_in));
    let mut p = first;
    while p < end {
        let tokens = (end - p).min(QUANT_MAX_TOKENS);
        if p > first {
            // SAFETY: uniform in the block (its run's); the last pass's sums are read
            // before this one writes shared memory.
            unsafe { sync_threads() };
        }
        // SAFETY: pairs p .. p + tokens of the run: inside x and out (the preconditions).
        unsafe {
            let (out, x) = (out.add(p * out_stride), x.add(p * n_in));
            gemv_mma_bf16_pass::<M>(out, x, w, tokens, (n_in, n_out, out_stride))
        }
        p += tokens;
    }
}

/// `experts_mma_bf16` of one matrix: `gemv_experts_bf16` on the tensor cores.
///
/// # Safety
/// The host's launch wrapper checks `experts_mma_bf16`'s preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn gemv_experts_mma_bf16(
    out: *mut f32,
    x: *const f32,
    w: *const u16,
    run_expert: *const u32,
    run_start: *const u32,
    shape: MatmulShape,
) {
    // SAFETY: the wrapper's checks.
    unsafe { experts_mma_bf16::<1>(out, x, [w], (run_expert, run_start), shape) }
}

/// `experts_mma_bf16` of the gate and up with their SwiGLU: `gemv_swiglu_experts_bf16` on the
/// tensor cores.
///
/// # Safety
/// As `gemv_experts_mma_bf16`.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn gemv_swiglu_experts_mma_bf16(
    out: *mut f32,
    x: *const f32,
    w_gate: *const u16,
    w_up: *const u16,
    run_expert: *const u32,
    run_start: *const u32,
    shape: MatmulShape,
) {
    let w = [w_gate, w_up];
    // SAFETY: the wrapper's checks.
    unsafe { experts_mma_bf16::<2>(out, x, w, (run_expert, run_start), shape) }
}
