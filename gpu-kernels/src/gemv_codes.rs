//! The decode step's linear layers over GGUF weights, in integers (`codes.rs`):
//! - `quantize_q8_f32`: a matmul's input to 8-bit codes, one scale per 32, once for all the
//!   matrices that read it;
//! - `gemv_<type>`: up to `QUANT_MAX_TOKENS` tokens' codes times the matrix, four weights a
//!   `dp4a`;
//! - `gemv_swiglu_<type>`: the same over the gate and up matrices at once, their SwiGLU
//!   applied to the two sums.
//!
//! At 4.5 bits a weight the H200's memory brings about seven billion weights a second, so
//! its SMs have a handful of instructions per weight to spend before the GEMV stops being
//! bound by memory. Decoding each weight to a float and multiplying it by a float
//! activation took an extract, the exponent trick and two fused multiply-adds a weight
//! (on the H200: docs/lessons.md#quantized-gemvs); the integer dot takes a mask and a
//! quarter of a `dp4a` a weight, and the block's scales once per group of 32.

use crate::args::MatmulShape;
use crate::codes::Codes;
use crate::device::{
    WARP, block_dim_x, block_idx_x, dynamic_shared, exp, global_idx_x, ld_nc_u32, ld_nc_v4,
    round_to_i32, store_output, sync_threads, thread_idx_x, wait_for_previous_kernel, warp_max,
    warp_sum,
};
use crate::quant_blocks::{Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q5K, Q6K, Q8_0};
use crate::tiles::{CODES_ROWS, QUANT_MAX_TOKENS};
use crate::unroll::unroll;

/// `codes[i] = round(x[i] / d)` with `d = max |x| / 127` over each group of 32 values, and
/// `scales[g] = (d, d * sum of group g's codes)`.
///
/// - `codes`: `[n]` i8
/// - `scales`: `[n / 32][2]` f32
/// - `x`: `[n]` f32 (any number of tokens' rows, one after the other)
///
/// Thread mapping: a thread per value, a warp per group: its maximum and its sum are
/// shuffles, and lane 0 writes the scales. The division is IEEE's and the rounding ties to
/// even, as the CPU twin's, so the codes are the same bits on both.
///
/// # Safety
/// `n % 32 == 0`; the buffers hold what is listed above and do not overlap.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn quantize_q8_f32(
    codes: *mut u8,
    scales: *mut f32,
    x: *const f32,
    n: u32,
) {
    wait_for_previous_kernel();
    let i = global_idx_x();
    // n is whole groups, so a warp leaves here whole or not at all.
    if i >= n as usize {
        return;
    }
    // SAFETY: i < n; the buffers as the preconditions list.
    unsafe { write_code(codes, scales, i, *x.add(i)) }
}

/// Value `v` of `x` at `i` to its code, and (lane 0) its group's scales: a warp's 32
/// consecutive values are one group, its maximum and its sum shuffles.
///
/// # Safety
/// The whole warp calls it with consecutive `i`, the first a multiple of 32; `codes` holds
/// `i`, `scales` group `i / 32`'s pair.
#[inline(always)]
pub(crate) unsafe fn write_code(codes: *mut u8, scales: *mut f32, i: usize, v: f32) {
    let max = warp_max(v.abs());
    let d = max / 127.0;
    let q = if max > 0.0 { round_to_i32(v / d) } else { 0 };
    // SAFETY (all): the caller's; group i / 32's scales are floats i / 16 and i / 16 + 1.
    unsafe { *codes.add(i) = q as i8 as u8 };
    let sum = warp_sum(q as f32);
    if i.is_multiple_of(WARP) {
        unsafe {
            *scales.add(i / 16) = d;
            *scales.add(i / 16 + 1) = d * sum;
        }
    }
}

/// A GEMV's inputs over the activations' 8-bit codes, as its entry point was given them
/// (shapes as `gemv_codes` lists them): `gemv_codes`' and `gemv_stream`'s.
#[derive(Clone, Copy)]
pub(crate) struct CodesIn {
    pub codes: *const u8,
    pub scales: *const f32,
    /// The matrix; the gate's with `SWIGLU`.
    pub w: *const u8,
    /// The up matrix with `SWIGLU`; unused without.
    pub w_up: *const u8,
    /// Null for none; always null with `SWIGLU`.
    pub bias: *const f32,
}

/// `out[t, o] = (accumulate ? out[t, o] : 0) + sum_i w[o, i] x[t, i] + bias[o]` for tokens
/// `t < n_tokens`, x as `quantize_q8_f32` left it.
///
/// - `out`: `[n_tokens, out_stride]` f32, this matrix's rows at columns `0..n_out`
/// - `codes`: `[n_tokens, n_in]` i8; `scales`: `[n_tokens, n_in / 32][2]` f32
/// - `w`: `[n_out, n_in / BLOCK_LEN]` blocks, as the file has them
/// - `bias`: null or `[n_out]`
/// - `shape`: `n_tokens`, `n_in`, `n_out`, `out_stride` and `accumulate` (`MatmulShape`)
///
/// Thread mapping: a block takes `CODES_ROWS` consecutive rows and splits each row's spans
/// (`Codes`) between its threads: thread `i` takes spans `i, i + blockDim, ...` of every
/// row, loads the span of each row (all the loads issued before any is used), then
/// multiplies them by the token's codes, which it loads once for all the rows; token by
/// token. Each warp's sums meet in shuffles, then the warps' in shared memory, added in
/// warp order (the same sums every run). Splitting a row between a block's warps, rather
/// than giving a warp rows of its own, puts the loads of a whole short row in flight at
/// once. (A block that walked groups of rows one after the other, loading the next group
/// while it multiplied the last, was slower: Q4_K_M 224.2 against 305.7 tok/s on the H200,
/// docs/lessons.md#tried-and-dropped.) A thread's first spans are loaded before the wait for
/// the kernel before, where the type gains by it (`Codes::LOADS_AHEAD`).
///
/// With `SWIGLU`, the MLP's first half instead: `out[t, o] = silu(g) * u` with `g` and
/// `u` row o of `w` (the gate) and of `w_up` times the token; a block takes row o of each
/// as its two rows, and its first threads apply the SwiGLU to the two sums (no bias, and
/// `accumulate` unread). One launch where gate, up and the SwiGLU took three.
///
/// # Safety
/// `n_in` is whole blocks and whole spans; `w`'s rows (and `w_up`'s, with `SWIGLU`) start
/// where `Codes::load_span` allows; the buffers are as listed, `codes` and `scales` 16-byte
/// aligned, `out` not overlapping the inputs; `1 <= n_tokens <= QUANT_MAX_TOKENS`;
/// `blockDim.x` is a multiple of 32; the launch gives `codes_shared_bytes(blockDim.x / 32)`
/// bytes of dynamic shared memory and `n_out.div_ceil(CODES_ROWS)` blocks (`n_out` with
/// `SWIGLU`).
#[inline(always)]
pub(crate) unsafe fn gemv_codes<B: Codes, const SWIGLU: bool>(
    out: *mut f32,
    input: CodesIn,
    shape: MatmulShape,
    block: usize,
) {
    let CodesIn {
        codes,
        scales,
        w,
        w_up,
        bias,
    } = input;
    let [n_tokens, n_in, n_out, out_stride] = shape.sizes();
    let accumulate = shape.accumulates();
    // A type that loads nothing ahead waits before anything else, as it always did (the
    // code it was measured with on the H200: docs/lessons.md#quantized-gemvs).
    if !B::LOADS_AHEAD {
        wait_for_previous_kernel();
    }
    const R: usize = CODES_ROWS;
    const T: usize = QUANT_MAX_TOKENS;
    const {
        assert!(
            !SWIGLU || R == 2,
            "SwiGLU's block takes a gate row and an up row"
        )
    };
    let first = block * if SWIGLU { 1 } else { R };
    let row_bytes = n_in / B::BLOCK_LEN * B::BLOCK_BYTES;
    // Rows past the matrix read its last row again and write nothing.
    let mut rows = [w; R];
    unroll!(r < R => {
        rows[r] = if SWIGLU {
            [w, w_up][r].wrapping_add(first * row_bytes)
        } else {
            w.wrapping_add((first + r).min(n_out - 1) * row_bytes)
        };
    });
    let (groups, spans) = (n_in / 32, n_in / (32 * B::GROUPS));
    let s0 = thread_idx_x();
    // The weights never change, so a thread's first span of each row is loaded before the
    // wait for the kernel before (where the type gains by it: `Codes::LOADS_AHEAD`): the
    // blocks placed while it drains have their first weights on the way (all of a
    // 4096-wide row's, whose spans are one a thread). A thread past the row's spans loads
    // the last one again and leaves it unused.
    // SAFETY: min(s0, spans - 1) is a span of a row inside the matrix (a row is at least one).
    let ahead =
        B::LOADS_AHEAD.then(|| rows.map(|row| unsafe { B::load_span(row, s0.min(spans - 1)) }));
    if B::LOADS_AHEAD {
        wait_for_previous_kernel();
    }
    // [warps][R][T] f32: each warp's sums.
    let partial = dynamic_shared::<f32>();
    let (warp, lane) = (thread_idx_x() / WARP, thread_idx_x() % WARP);
    // The warp's sum of row r for token t to shared memory. (Scalars: a closure that took
    // the rows' sums as an array kept them packed in 64-bit registers, and Q4_K's GEMV
    // went past 64 registers a thread.)
    let keep = |t: usize, r: usize, sum: f32| {
        let v = warp_sum(sum);
        if lane == 0 {
            // SAFETY: inside the launch's shared memory (the preconditions).
            unsafe { *partial.add((warp * R + r) * T + t) = v };
        }
    };
    // Token 0 takes the spans loaded ahead, if any.
    let mut t0 = 0;
    if let Some(ahead) = &ahead {
        // SAFETY: the rows, codes and scales as the preconditions list.
        let acc = unsafe { ahead_sums::<B, R>(&rows, codes, scales, spans, ahead) };
        unroll!(r < R => { keep(0, r, acc[r]); });
        t0 = 1;
    }
    // The other tokens one after the other, in a loop the compiler keeps rolled: sums for
    // all eight at once took 198 registers a thread (Q4_K), and the occupancy with them. A
    // token after the first finds the spans' bytes in L1.
    for t in t0..n_tokens {
        let mut acc = [0.0f32; R];
        let mut s = thread_idx_x();
        while s < spans {
            let mut span = [core::mem::MaybeUninit::<B::Span>::uninit(); R];
            unroll!(r < R => {
                // SAFETY: s < spans of a row inside the matrix.
                span[r].write(unsafe { B::load_span(rows[r], s) });
            });
            // SAFETY: every element was written just above.
            let span = span.map(|v| unsafe { v.assume_init() });
            // SAFETY: token t's groups of span s: inside codes and scales.
            unsafe { add_span::<B, R>(&mut acc, &span, codes, scales, t * groups, s) };
            s += block_dim_x();
        }
        unroll!(r < R => { keep(t, r, acc[r]); });
    }
    // SAFETY: every thread of the block reaches this barrier.
    unsafe { sync_threads() };
    // The sum of the warps' sums of row r of the block for token t, in warp order.
    let total = |r: usize, t: usize| {
        let mut sum = 0.0;
        for warp in 0..block_dim_x() / WARP {
            // SAFETY: written above, before the barrier.
            sum += unsafe { *partial.add((warp * R + r) * T + t) };
        }
        sum
    };
    if SWIGLU {
        let t = thread_idx_x();
        if t < n_tokens {
            let (g, u) = (total(0, t), total(1, t));
            // SAFETY: row `first` < n_out (one block a row), t < n_tokens: inside out.
            unsafe { *out.add(t * out_stride + first) = g / (1.0 + exp(-g)) * u };
        }
        return;
    }
    // Thread i adds up (row r of the block, token t) for i = r * n_tokens + t.
    let mut i = thread_idx_x();
    while i < R * n_tokens {
        let (r, t) = (i / n_tokens, i % n_tokens);
        let row = first + r;
        if row < n_out {
            let sum = total(r, t);
            // SAFETY: row < n_out, t < n_tokens: inside out and bias.
            unsafe { store_output(out.add(t * out_stride + row), sum, bias, row, accumulate) };
        }
        i += block_dim_x();
    }
}

/// Token 0's sums of `rows` over this thread's spans (`threadIdx.x`, then every
/// `blockDim.x`-th), the first of them `ahead`, which the caller loaded before its wait. A
/// function inlined by force, not a closure: the compiler kept Q6_K's closure out of line,
/// its spans passed on the stack.
///
/// # Safety
/// As `gemv_codes`: the rows are `spans` spans each, token 0's groups inside `codes` and
/// `scales`; `ahead` the rows' span `threadIdx.x` if that is below `spans`.
#[inline(always)]
unsafe fn ahead_sums<B: Codes, const R: usize>(
    rows: &[*const u8; R],
    codes: *const u8,
    scales: *const f32,
    spans: usize,
    ahead: &[B::Span; R],
) -> [f32; R] {
    let mut acc = [0.0f32; R];
    let mut s = thread_idx_x();
    if s < spans {
        // SAFETY: token 0's groups of span s: inside codes and scales.
        unsafe { add_span::<B, R>(&mut acc, ahead, codes, scales, 0, s) };
        s += block_dim_x();
    }
    while s < spans {
        // SAFETY: s < spans of a row inside the matrix; its groups as above.
        unsafe {
            let span = rows.map(|row| B::load_span(row, s));
            add_span::<B, R>(&mut acc, &span, codes, scales, 0, s);
        }
        s += block_dim_x();
    }
    acc
}

/// `acc[r] +=` span `s` of row r (`span[r]`) times its groups of the token whose groups
/// start at `first_group`.
///
/// # Safety
/// As `span_codes`.
#[inline(always)]
unsafe fn add_span<B: Codes, const R: usize>(
    acc: &mut [f32; R],
    span: &[B::Span; R],
    codes: *const u8,
    scales: *const f32,
    first_group: usize,
    s: usize,
) {
    // SAFETY: the caller's.
    let (x, d, ds) = unsafe { span_codes::<B>(codes, scales, first_group, s) };
    unroll!(r < R => {
        acc[r] += B::dot(&span[r], &x, d, ds);
    });
}

/// The activations' codes of span `s`'s groups (`B::group(s, k)`, k < `B::GROUPS`), of the
/// token whose groups start at group `first`: its codes four to a word, each group's `d`
/// and `d` times the sum of its codes (`quantize_q8_f32`'s layout).
///
/// # Safety
/// The groups are inside `codes` and `scales`, which are 16-byte aligned and read-only
/// during the kernel.
#[inline(always)]
pub(crate) unsafe fn span_codes<B: Codes>(
    codes: *const u8,
    scales: *const f32,
    first: usize,
    s: usize,
) -> ([[u32; 8]; 2], [f32; 2], [f32; 2]) {
    let mut x = [[0u32; 8]; 2];
    let (mut d, mut ds) = ([0.0f32; 2], [0.0f32; 2]);
    unroll!(k < 2 => {
        if k < B::GROUPS {
            let g = first + B::group(s, k);
            // SAFETY: group g: inside codes and scales, aligned (the caller's guarantee).
            unsafe {
                let p = codes.add(32 * g) as *const u32;
                let (a, b) = (ld_nc_v4(p), ld_nc_v4(p.add(4)));
                x[k] = [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]];
                if !B::SCALES_AT_ONCE {
                    let sc = scales.add(2 * g) as *const u32;
                    d[k] = f32::from_bits(ld_nc_u32(sc));
                    ds[k] = f32::from_bits(ld_nc_u32(sc.add(1)));
                }
            }
        }
    });
    if B::SCALES_AT_ONCE {
        // SAFETY: groups g and g + 1, g even (span s's groups are 2s and 2s + 1, and a
        // token's groups whole blocks of 8): inside scales, at a multiple of 16 bytes.
        let [d0, ds0, d1, ds1] =
            unsafe { ld_nc_v4(scales.add(2 * (first + B::group(s, 0))) as *const u32) };
        let f = f32::from_bits;
        (d, ds) = ([f(d0), f(d1)], [f(ds0), f(ds1)]);
    }
    (x, d, ds)
}

/// `gemv_<type>` and `gemv_swiglu_<type>`: `gemv_codes` over the type, without and with
/// `SWIGLU`.
macro_rules! codes_kernels {
    ($($ty:ident => $gemv:ident, $swiglu:ident;)*) => {$(
        #[doc = concat!("`gemv_codes` over `", stringify!($ty), "` weights.")]
        ///
        /// # Safety
        /// The host's launch wrapper checks `gemv_codes`'s preconditions.
        #[unsafe(no_mangle)]
        pub unsafe extern "gpu-kernel" fn $gemv(
            out: *mut f32,
            codes: *const u8,
            scales: *const f32,
            w: *const u8,
            bias: *const f32,
            shape: MatmulShape,
        ) {
            let w_up = core::ptr::null();
            let input = CodesIn { codes, scales, w, w_up, bias };
            // SAFETY: the wrapper's checks.
            unsafe { gemv_codes::<$ty, false>(out, input, shape, block_idx_x()) }
        }

        #[doc = concat!("`gemv_codes` with `SWIGLU` over `", stringify!($ty), "` weights.")]
        ///
        /// # Safety
        /// The host's launch wrapper checks `gemv_codes`'s preconditions.
        #[unsafe(no_mangle)]
        pub unsafe extern "gpu-kernel" fn $swiglu(
            out: *mut f32,
            codes: *const u8,
            scales: *const f32,
            w_gate: *const u8,
            w_up: *const u8,
            shape: MatmulShape,
        ) {
            let (w, bias) = (w_gate, core::ptr::null());
            let input = CodesIn { codes, scales, w, w_up, bias };
            // SAFETY: the wrapper's checks.
            unsafe { gemv_codes::<$ty, true>(out, input, shape, block_idx_x()) }
        }
    )*};
}

codes_kernels! {
    Q4_0 => gemv_q4_0, gemv_swiglu_q4_0;
    Q4_1 => gemv_q4_1, gemv_swiglu_q4_1;
    Q5_0 => gemv_q5_0, gemv_swiglu_q5_0;
    Q5_1 => gemv_q5_1, gemv_swiglu_q5_1;
    Q8_0 => gemv_q8_0, gemv_swiglu_q8_0;
    Q4K => gemv_q4_k, gemv_swiglu_q4_k;
    Q5K => gemv_q5_k, gemv_swiglu_q5_k;
    Q6K => gemv_q6_k, gemv_swiglu_q6_k;
}

/// `gemv_<a>_<b>`: one matrix whose first `n_first` rows are of type `A` (from `w`) and the
/// rest of type `B` (from `w_b`), in one launch: `gemv_codes` over `A` in the first
/// `n_first.div_ceil(CODES_ROWS)` blocks, over `B` in the others. Q4_K_M and Q5_K_M files
/// keep some layers' v projection in Q6_K beside their q and k: the fused q, k and v
/// matrix took two launches there, the second a grid of a few hundred blocks that paid a
/// launch's ramp and tail for 3 MB; one launch made Q4_K_M's batch 1 1.008-1.016x as fast on
/// the H200 (docs/lessons.md#quantized-gemvs).
///
/// # Safety
/// `gemv_codes`'s preconditions for each part (rows `0..n_first` of `out` and `bias` for
/// `A`, `n_first..n_out` for `B`), the two types' blocks taking the same `blockDim.x`, and
/// `n_first.div_ceil(CODES_ROWS) + (n_out - n_first).div_ceil(CODES_ROWS)` blocks.
#[inline(always)]
unsafe fn gemv_codes_two<A: Codes, B: Codes>(
    out: *mut f32,
    input: CodesIn,
    w_b: *const u8,
    shape: MatmulShape,
    n_first: u32,
) {
    let (w, bias) = (input.w, input.bias);
    let blocks_a = (n_first as usize).div_ceil(CODES_ROWS);
    let block = block_idx_x();
    // SAFETY (both): the caller's; B's rows are `out`'s and `bias`'s from n_first on.
    unsafe {
        if block < blocks_a {
            let input = CodesIn { w_up: w, ..input };
            let shape = MatmulShape {
                n_out: n_first,
                ..shape
            };
            gemv_codes::<A, false>(out, input, shape, block)
        } else {
            let bias_b = if bias.is_null() {
                bias
            } else {
                bias.add(n_first as usize)
            };
            let input = CodesIn {
                w: w_b,
                w_up: w_b,
                bias: bias_b,
                ..input
            };
            let shape = MatmulShape {
                n_out: shape.n_out - n_first,
                ..shape
            };
            gemv_codes::<B, false>(out.add(n_first as usize), input, shape, block - blocks_a)
        }
    }
}

/// `gemv_<a>_<b>`: `gemv_codes_two` over the pair.
macro_rules! two_type_kernels {
    ($($a:ident, $b:ident => $name:ident;)*) => {$(
        #[doc = concat!("`gemv_codes_two` over `", stringify!($a), "` rows, then `", stringify!($b), "` rows.")]
        ///
        /// # Safety
        /// The host's launch wrapper checks `gemv_codes_two`'s preconditions.
        #[unsafe(no_mangle)]
        pub unsafe extern "gpu-kernel" fn $name(
            out: *mut f32,
            codes: *const u8,
            scales: *const f32,
            w: *const u8,
            w_b: *const u8,
            bias: *const f32,
            shape: MatmulShape,
            n_first: u32,
        ) {
            let w_up = core::ptr::null();
            let input = CodesIn { codes, scales, w, w_up, bias };
            // SAFETY: the wrapper's checks.
            unsafe { gemv_codes_two::<$a, $b>(out, input, w_b, shape, n_first) }
        }
    )*};
}

two_type_kernels! {
    Q4K, Q6K => gemv_q4_k_q6_k;
    Q5K, Q6K => gemv_q5_k_q6_k;
}
