//! The fast backend's linear layers: `out[t, o] = sum_i x[t, i] * w[o, i] + bias[o]` with `w`
//! in its stored type, spread over the pool's threads by rows: each thread takes one
//! contiguous share of every matrix in the call, so each core streams its own part of the
//! weights, and several matrices over the same input (q, k, v; gate, up) go in one call.
//!
//! Two kernels, chosen by the number of tokens:
//! - a few tokens (decode): one integer dot product per row and token against the activations
//!   quantized to 8 bits, with the row's unpacking fused in for the common block types
//!   (`fused.rs`, AVX-512 VNNI); otherwise each row unpacked once to codes (`unpack.rs`) and
//!   dotted with each token (`dot.rs`, NEON's dot products on Arm); float-typed weights take
//!   an f32 dot product instead;
//! - many tokens (prefill), where the CPU has AVX-512 BF16: tiles of 32 rows unpacked to
//!   bf16 and multiplied with the tokens in bf16 (`gemm.rs`).

use std::cell::RefCell;

use rayon::prelude::*;

use super::cpu_features::{Features, features};
use super::dot::{Q8Rows, dot_codes, dot_f32};
use super::fused::Q8Token;
use super::gemm::{TILE_ROWS, pack_row, to_bf16_pairs};
use super::timed::Recorder;
use super::unpack::{RUN, is_quantized, row_f32, unpack_row};
use super::weights::Matrix;
use crate::weights::DType;

/// Tokens from which a call takes the bf16 tiles: below it a tile's unpacking is shared by too
/// few tokens. Measured on the 2-core CPU (no GPU): the default model's Q4_1 matrices cost the
/// same either way from 4 to 16 tokens (rounds 70 and 77, `rustle bench --verify`); a mixture
/// of experts' Q4_K experts, about 10 tokens each in a prompt of 161, took the prompt from
/// 476-542 ms through the tiles to 378-394 with the dot products up to 16 (Qwen3-30B-A3B's
/// first 4 layers, round 77).
pub const GEMM_MIN_TOKENS: usize = 16;

/// Rows ahead of the one being multiplied that the 8-bit dot products ask the memory for
/// (`rows_vnni`): the decode waits on memory, not on its arithmetic, without them.
/// Measured (no GPU, the 2-core CPU, round 70): the default model decoded at 87.5 and 92.1
/// tok/s without, 123.8 one row ahead, 142.1 two, 157.7 four, 139.5 eight, 135.2-147.1
/// sixteen.
const PREFETCH_ROWS: usize = 4;

/// One matrix of a call and where its product goes.
pub struct Job<'a> {
    /// `[n_out, n_in]`
    pub w: &'a Matrix,
    /// `[n_out]` or none
    pub bias: Option<&'a [f32]>,
    /// `[n, n_out]`
    pub out: &'a mut [f32],
}

/// The input of a call in the forms the kernels read, made once per call and shared by its
/// jobs and threads.
#[derive(Default)]
pub struct Input {
    /// Batch-invariant mode: a token's kernel never depends on its batch (the two round
    /// differently): by `generated` where it covers the call, else the bf16 tiles for every
    /// token (where the CPU has AVX-512 BF16; else the 8-bit dot products for every token).
    pub invariant: bool,
    /// `[n, n_in]` quantized per 32 (decode, quantized weights)
    q8: Q8Rows,
    /// `[n, n_in / 2]` bf16 pairs (prefill)
    bf16: Vec<u32>,
    /// `[n]` the pass's `Batch::generated`, set by the forward: which tokens are generated
    pub generated: Vec<bool>,
}

impl Input {
    /// The input of a call on some of this pass's tokens (the ones an expert takes): the
    /// same mode, and those tokens' flags where the pass has them.
    pub fn of_rows(&self, n: usize, rows: &[usize]) -> Input {
        let generated = match self.generated.len() == n {
            true => rows.iter().map(|&r| self.generated[r]).collect(),
            false => vec![],
        };
        Input {
            invariant: self.invariant,
            generated,
            ..Input::default()
        }
    }
}

/// `matmul`, timed under its first matrix's type.
pub fn timed_matmul(
    rec: &mut Recorder,
    jobs: &mut [Job],
    x: &[f32],
    n_in: usize,
    input: &mut Input,
) {
    let n = x.len() / n_in;
    let name = super::timed::matmul_name(jobs[0].w);
    let matrices: Vec<&Matrix> = if rec.recording() {
        jobs.iter().map(|j| j.w).collect()
    } else {
        vec![]
    };
    rec.time(
        name,
        || super::timed::matmul(n, n_in, &matrices),
        || matmul(jobs, x, n_in, input),
    );
}

/// Which kernel a call of `n` tokens takes.
fn use_gemm(f: Features, n: usize) -> bool {
    f.bf16 && n >= GEMM_MIN_TOKENS
}

/// Runs every job on `x` (`[n, n_in]`), spread over the current rayon pool.
pub fn matmul(jobs: &mut [Job], x: &[f32], n_in: usize, input: &mut Input) {
    matmul_with(features(), jobs, x, n_in, input)
}

/// `matmul` with the kernels `f` allows (tests run each path on its own).
pub fn matmul_with(f: Features, jobs: &mut [Job], x: &[f32], n_in: usize, input: &mut Input) {
    let n = x.len() / n_in;
    // Which tokens take the bf16 tiles (`gemm`) and which the 8-bit dot products (`dots`).
    // In the batch-invariant mode a token's kernel never depends on its batch: by what the
    // token is where the batch says (a prompt's through the tiles, a generated one through
    // the dot products), else every token through the tiles.
    let routed = input.invariant && f.bf16 && input.generated.len() == n;
    let gemm = if routed {
        input.generated.iter().any(|&g| !g)
    } else if input.invariant {
        f.bf16
    } else {
        use_gemm(f, n)
    };
    let dots = if routed {
        input.generated.iter().any(|&g| g)
    } else {
        !gemm
    };
    for j in jobs.iter() {
        assert_eq!(j.w.cols, n_in, "matmul: weight columns vs input width");
        assert_eq!(j.out.len(), n * j.w.rows, "matmul: output size");
    }
    if gemm {
        input.bf16.resize(n * n_in.div_ceil(2), 0);
        to_bf16_pairs(&mut input.bf16, x, n_in);
    }
    if dots && jobs.iter().any(|j| is_quantized(j.w.dtype)) {
        input.q8.quantize(x, n_in);
    }
    // Raw outputs: each thread writes its own rows' columns of every token's row.
    let outs: Vec<(SendPtr, usize)> = jobs
        .iter_mut()
        .map(|j| (SendPtr(j.out.as_mut_ptr()), j.w.rows))
        .collect();
    let threads = rayon::current_num_threads();
    let input = &*input;
    // With both, the tiles run every token and the dot products then redo the generated ones.
    let only = (gemm && dots).then_some(&input.generated[..]);
    (0..threads).into_par_iter().for_each(|part| {
        SCRATCH.with_borrow_mut(|s| {
            for (j, &(out, n_out)) in jobs.iter().zip(&outs) {
                let align = if gemm { TILE_ROWS } else { 16 };
                let (lo, hi) = share(n_out, threads, part, align);
                if lo == hi {
                    continue;
                }
                // SAFETY: `out` is `[n, n_out]`; this part writes only columns lo..hi,
                // which no other part touches, and the job's slice outlives the call.
                let out = OutRows {
                    ptr: out.0,
                    stride: n_out,
                    n,
                    lo,
                    hi,
                };
                if gemm {
                    gemm_rows(f, s, j.w, &input.bf16, &out);
                }
                if dots {
                    decode_rows(f, s, j.w, x, &input.q8, &out, only);
                }
                if let Some(b) = j.bias {
                    for t in 0..n {
                        for (r, &b) in b.iter().enumerate().take(hi).skip(lo) {
                            // SAFETY: as above.
                            unsafe { *out.ptr.add(t * out.stride + r) += b };
                        }
                    }
                }
            }
        })
    });
}

/// Rows `lo..hi` of `n_out` that part `part` of `parts` takes: equal shares rounded to
/// `align` rows, the last taking what is left.
fn share(n_out: usize, parts: usize, part: usize, align: usize) -> (usize, usize) {
    let per = n_out.div_ceil(parts).div_ceil(align) * align;
    ((part * per).min(n_out), ((part + 1) * per).min(n_out))
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: the pointer is shared only so that threads write disjoint columns (`matmul`).
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

/// `[n, stride]` outputs of one job, of which a part writes columns `lo..hi` (rows `lo..hi`
/// of the job's matrix).
struct OutRows {
    ptr: *mut f32,
    stride: usize,
    n: usize,
    lo: usize,
    hi: usize,
}

/// A thread's scratch, grown to the widest row it has seen, then reused.
#[derive(Default)]
struct Scratch {
    /// `[n_in]` codes of one row
    u: Vec<u8>,
    /// `[n_in / 16]`
    scale: Vec<f32>,
    offset: Vec<f32>,
    /// `[n_in]` one row in f32
    row: Vec<f32>,
    /// `[n_in / 2, 32]` a bf16 tile
    tile: Vec<u32>,
    /// `[n_in / 2]` one row as bf16 pairs
    pairs_row: Vec<u32>,
}

impl Scratch {
    fn fit(&mut self, n_in: usize) {
        if self.u.len() < n_in {
            self.u.resize(n_in, 0);
            self.scale.resize(n_in.div_ceil(RUN), 0.0);
            self.offset.resize(n_in.div_ceil(RUN), 0.0);
            self.row.resize(n_in + 1, 0.0);
            self.pairs_row.resize(n_in.div_ceil(2), 0);
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Rows `out.lo..out.hi` of `w` against each token (each token `only` marks, where given):
/// unpack a row once, then one dot product per token.
fn decode_rows(
    f: Features,
    s: &mut Scratch,
    w: &Matrix,
    x: &[f32],
    q8: &Q8Rows,
    out: &OutRows,
    only: Option<&[bool]>,
) {
    let (lo, hi) = (out.lo, out.hi);
    let n_in = w.cols;
    s.fit(n_in);
    let (u, scale, offset) = (
        &mut s.u[..n_in],
        &mut s.scale[..n_in / RUN],
        &mut s.offset[..n_in / RUN],
    );
    let quantized = is_quantized(w.dtype);
    #[cfg(target_arch = "x86_64")]
    if let Some(kernel) = Fused::for_type(f, w.dtype) {
        // One row at a time: four side by side, which share their activation loads, ran
        // faster with the weights in cache but slower from memory (7.8 -> 10.6-16.5 ms a
        // token, the default model, one thread of this project's 2-core CPU):
        // docs/lessons.md#the-cpu-fast-path. Several tokens (a decode and its guesses) go
        // through a row together, up to 8 at a time, sharing its unpacking; each token's sum
        // is the one-token kernel's, bit for bit.
        // Each token's activations, sliced once for every row; then the rows for each group
        // of tokens (the rows are short, a few tens of blocks: the loop over them is kept
        // bare).
        let (tokens, acts): (Vec<usize>, Vec<Q8Token>) = (0..out.n)
            .filter(|&t| only.is_none_or(|m| m[t]))
            .map(|t| {
                let (xq, xd, xs) = q8.row(t);
                (t, (xq, xd, xs, q8.pairs(t)))
            })
            .unzip();
        let mut done = 0;
        while done < tokens.len() {
            // Up to 8 tokens a pass over the rows.
            let take = (tokens.len() - done).min(8);
            let ts = &tokens[done..done + take];
            let a = &acts[done..done + take];
            // SAFETY: the CPU has the features (`Features`), the type has a kernel, and each
            // row holds `n_in` values, as each activation row does.
            unsafe {
                match take {
                    8 => kernel.rows::<8>(w, out, ts, a),
                    7 => kernel.rows::<7>(w, out, ts, a),
                    6 => kernel.rows::<6>(w, out, ts, a),
                    5 => kernel.rows::<5>(w, out, ts, a),
                    4 => kernel.rows::<4>(w, out, ts, a),
                    3 => kernel.rows::<3>(w, out, ts, a),
                    2 => kernel.rows::<2>(w, out, ts, a),
                    _ => kernel.rows::<1>(w, out, ts, a),
                }
            }
            done += take;
        }
        return;
    }
    for r in lo..hi {
        if quantized {
            unpack(f, w, r, u, scale, offset);
        } else {
            row_f32(w, r, &mut s.row[..n_in], u, scale, offset);
        }
        for t in (0..out.n).filter(|&t| only.is_none_or(|m| m[t])) {
            let y = if quantized {
                let (xq, xd, xs) = q8.row(t);
                dot(f, u, scale, offset, xq, xd, xs)
            } else {
                dot_f32(&s.row[..n_in], &x[t * n_in..(t + 1) * n_in])
            };
            // SAFETY: r is in this part's columns (`matmul`).
            unsafe { *out.ptr.add(t * out.stride + r) = y };
        }
    }
}

/// The fused kernels this CPU has: the unpacking in registers, several tokens a row.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
enum Fused {
    /// `fused::dot_tokens_vnni`
    Vnni,
    /// `fused_avx2::dot_tokens_avx2`
    Avx2,
}

#[cfg(target_arch = "x86_64")]
impl Fused {
    /// The kernel for rows of `dtype` on a CPU of features `f`, if one has it.
    fn for_type(f: Features, dtype: DType) -> Option<Fused> {
        if f.vnni && super::fused::has_kernel(dtype) {
            Some(Fused::Vnni)
        } else if f.avx2 && super::fused_avx2::has_kernel(dtype) {
            Some(Fused::Avx2)
        } else {
            None
        }
    }

    /// Rows `out.lo..out.hi` of `w` against the `T` tokens `ts`, whose activations are
    /// `acts`.
    ///
    /// # Safety
    /// `self` is `for_type(features(), w.dtype)`'s; every row and activation holds `w.cols`
    /// values.
    unsafe fn rows<const T: usize>(
        self,
        w: &Matrix,
        out: &OutRows,
        ts: &[usize],
        acts: &[Q8Token],
    ) {
        // SAFETY: the caller's promise.
        unsafe {
            match self {
                Fused::Vnni => rows_vnni::<T>(w, out, ts, acts),
                Fused::Avx2 => rows_avx2::<T>(w, out, ts, acts),
            }
        }
    }
}

/// Rows `out.lo..out.hi` of `w` against the `T` tokens `ts`, whose activations are `acts`,
/// through the fused kernel (`fused::dot_tokens_vnni`), compiled with its features so that
/// the kernel is inlined into the loop over the rows (a row is a few tens of blocks: a call
/// a row showed).
///
/// # Safety
/// As `dot_tokens_vnni`: the CPU has its features, `w`'s type has a kernel, and every row
/// and activation holds `w.cols` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn rows_vnni<const T: usize>(w: &Matrix, out: &OutRows, ts: &[usize], acts: &[Q8Token]) {
    use super::fused::{Act, dot_tokens_vnni};
    let group: [Act; T] = std::array::from_fn(|i| Act::of(acts[i]));
    // SAFETY (both): the caller's promise, for every row of `w`.
    unsafe { each_row(w, out, ts, |row| dot_tokens_vnni(w.dtype, row, &group)) }
}

/// `rows_vnni` through `fused_avx2::dot_tokens_avx2`, compiled with AVX2's features.
///
/// # Safety
/// As `dot_tokens_avx2`: the CPU has its features, `w`'s type has a kernel, and every row
/// and activation holds `w.cols` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2<const T: usize>(w: &Matrix, out: &OutRows, ts: &[usize], acts: &[Q8Token]) {
    use super::fused::Act;
    use super::fused_avx2::dot_tokens_avx2;
    let group: [Act; T] = std::array::from_fn(|i| Act::of(acts[i]));
    // SAFETY (both): the caller's promise, for every row of `w`.
    unsafe { each_row(w, out, ts, |row| dot_tokens_avx2(w.dtype, row, &group)) }
}

/// The loop over the rows of a fused kernel, `dot(row)` each row's `T` sums, inlined into
/// the kernel's compiled form (`rows_vnni`, `rows_avx2`).
///
/// # Safety
/// `dot` is safe to call on every row of `w` (the callers' promise); `ts` are tokens of
/// `out`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn each_row<const T: usize>(
    w: &Matrix,
    out: &OutRows,
    ts: &[usize],
    dot: impl Fn(&[u8]) -> [f32; T],
) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    for r in out.lo..out.hi {
        // The row PREFETCH_ROWS ahead asked for now, a cache line at a time, so that its
        // bytes are on their way while this row's products are made.
        if r + PREFETCH_ROWS < out.hi {
            let ahead = w.row(r + PREFETCH_ROWS);
            for at in (0..ahead.len()).step_by(64) {
                // SAFETY: `at` is inside the row; a prefetch reads nothing the program sees.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.as_ptr().add(at).cast()) };
            }
        }
        let ys = dot(w.row(r));
        for (&t, y) in ts.iter().zip(ys) {
            // SAFETY: r is in this part's columns (`matmul`), t one of its tokens.
            unsafe { *out.ptr.add(t * out.stride + r) = y };
        }
    }
}

/// `unpack_row`, compiled for AVX2 where the CPU has it so that the compiler vectorizes it.
fn unpack(f: Features, w: &Matrix, r: usize, u: &mut [u8], scale: &mut [f32], offset: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if f.avx2 {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn avx2(w: &Matrix, r: usize, u: &mut [u8], s: &mut [f32], o: &mut [f32]) {
            unpack_row(w, r, u, s, o)
        }
        // SAFETY: the CPU has AVX2, FMA and F16C (`Features`).
        return unsafe { avx2(w, r, u, scale, offset) };
    }
    let _ = f;
    unpack_row(w, r, u, scale, offset)
}

/// `dot_codes`, with VNNI where the CPU has it, else AVX2, or on Arm the best NEON form it has.
fn dot(
    f: Features,
    u: &[u8],
    scale: &[f32],
    offset: &[f32],
    xq: &[i8],
    xd: &[f32],
    xs: &[f32],
) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if f.vnni {
        // SAFETY: the CPU has the features (`Features`); the lengths are one row's.
        return unsafe { super::dot::dot_codes_vnni(u, scale, offset, xq, xd, xs) };
    }
    #[cfg(target_arch = "x86_64")]
    if f.avx2 {
        // SAFETY: the CPU has AVX2 and FMA (`Features`); the lengths are one row's.
        return unsafe { super::dot::dot_codes_avx2(u, scale, offset, xq, xd, xs) };
    }
    #[cfg(target_arch = "aarch64")]
    {
        use super::dot::{dot_codes_neon, dot_codes_sdot, dot_codes_usdot};
        // SAFETY (each): the CPU has the form's features (`Features`); the lengths are one
        // row's, a multiple of 32 as every quantized row is.
        if f.i8mm {
            return unsafe { dot_codes_usdot(u, scale, offset, xq, xd, xs) };
        }
        if f.dotprod {
            return unsafe { dot_codes_sdot(u, scale, offset, xq, xd, xs) };
        }
        if f.neon {
            return unsafe { dot_codes_neon(u, scale, offset, xq, xd, xs) };
        }
    }
    let _ = f;
    dot_codes(u, scale, offset, xq, xd, xs)
}

/// Rows `out.lo..out.hi` of `w` against every token in bf16 tiles of 32 rows.
fn gemm_rows(f: Features, s: &mut Scratch, w: &Matrix, xb: &[u32], out: &OutRows) {
    let (lo, hi) = (out.lo, out.hi);
    // The tiles' multiply is AVX-512 BF16's: `use_gemm` never picks them elsewhere.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (xb, out);
    let n_in = w.cols;
    let pairs = n_in.div_ceil(2);
    s.fit(n_in);
    if s.tile.len() < pairs * TILE_ROWS {
        s.tile.resize(pairs * TILE_ROWS, 0);
    }
    let mut r0 = lo;
    while r0 < hi {
        let rows = TILE_ROWS.min(hi - r0);
        #[cfg(target_arch = "x86_64")]
        if f.bf16 && super::fused::has_bf16_decoder(w.dtype) {
            for r in 0..TILE_ROWS {
                let row = &mut s.pairs_row[..pairs];
                if r < rows {
                    // SAFETY: the CPU has AVX-512 BF16 (`use_gemm`) and the features it
                    // implies (`Features`); the row holds whole blocks of `n_in` values.
                    unsafe { super::fused::row_bf16(w.dtype, w.row(r0 + r), row) };
                } else {
                    row.fill(0);
                }
                for (p, &v) in row.iter().enumerate() {
                    s.tile[p * TILE_ROWS + r] = v;
                }
            }
            // SAFETY: as below.
            unsafe {
                super::gemm::tile_matmul(
                    s.tile.as_ptr(),
                    pairs,
                    xb.as_ptr(),
                    out.n,
                    out.ptr.add(r0),
                    out.stride,
                    rows,
                );
            }
            r0 += rows;
            continue;
        }
        for r in 0..TILE_ROWS {
            let row = &mut s.row[..pairs * 2];
            if r < rows {
                row_f32_fast(
                    f,
                    w,
                    r0 + r,
                    &mut row[..n_in],
                    &mut s.u,
                    &mut s.scale,
                    &mut s.offset,
                );
                row[n_in..].fill(0.0); // an odd width's pad
            } else {
                row.fill(0.0);
            }
            pack_row(&mut s.tile, r, row);
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `use_gemm` chose this path only where the CPU has AVX-512 BF16; the tile
        // holds `pairs` rows of 32, `xb` n rows of `pairs`, and the output's columns
        // r0..r0 + rows are this part's.
        unsafe {
            super::gemm::tile_matmul(
                s.tile.as_ptr(),
                pairs,
                xb.as_ptr(),
                out.n,
                out.ptr.add(r0),
                out.stride,
                rows,
            );
        }
        r0 += rows;
    }
}

/// `row_f32`, compiled for AVX-512 where the CPU has it.
fn row_f32_fast(
    f: Features,
    w: &Matrix,
    r: usize,
    out: &mut [f32],
    u: &mut [u8],
    s: &mut [f32],
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if f.avx2 {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
        unsafe fn wide(
            w: &Matrix,
            r: usize,
            out: &mut [f32],
            u: &mut [u8],
            s: &mut [f32],
            o: &mut [f32],
        ) {
            row_f32(w, r, out, u, s, o)
        }
        if f.bf16 {
            // SAFETY: `bf16` implies AVX-512 F, BW, VL on every CPU that has it (`Features`).
            return unsafe { wide(w, r, out, u, s, o) };
        }
    }
    let _ = f;
    row_f32(w, r, out, u, s, o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::fast::unpack::tests::{TYPES, random_matrix};
    use crate::cpu::ops::matmul_f32;
    use crate::weights::DType;
    use crate::weights::dequant::to_f32;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    /// ||a - b|| / ||b||
    pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
        let (mut d, mut n) = (0f64, 0f64);
        for (&a, &b) in a.iter().zip(b) {
            d += ((a - b) as f64).powi(2);
            n += (b as f64).powi(2);
        }
        (d / n).sqrt()
    }

    /// Every stored type, on every kernel this CPU has and on the portable ones, for one
    /// token (decode), a few, and more than a token group of the bf16 tiles (13 = 12 + 1),
    /// with row counts that are not whole tiles and a bias: against `ops::matmul_f32` on the
    /// same weights dequantized to f32. Outputs start as NaN, so a value not written fails.
    /// The activations are rounded (8 bits per 32, or bf16): errors of a few 1e-3.
    #[test]
    fn every_type_and_kernel_matches_the_reference_matmul() {
        let have = Features::detect();
        // The portable forms, then each step up to what the CPU has: on x86 AVX2 alone; on
        // Arm plain NEON, then with `sdot`, then (with i8mm) `usdot`.
        let none = Features::default();
        let mut paths = vec![none];
        for f in [
            Features {
                avx2: have.avx2,
                ..none
            },
            Features {
                neon: have.neon,
                ..none
            },
            Features {
                neon: have.neon,
                dotprod: have.dotprod,
                ..none
            },
            have,
        ] {
            if !paths.contains(&f) {
                paths.push(f);
            }
        }
        eprintln!("kernel paths checked: {paths:?}");
        let mut rng = StdRng::seed_from_u64(5);
        let mut input = Input::default();
        for dtype in TYPES {
            let (rows, cols) = (45, 512);
            let m = random_matrix(dtype, rows, cols, 11);
            let wf = to_f32(dtype, &m.bytes, rows * cols).unwrap();
            let bias: Vec<f32> = (0..rows).map(|_| rng.random_range(-1.0..1.0)).collect();
            for n in [1, 3, 5, 13] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
                let mut want = vec![0f32; n * rows];
                matmul_f32(&mut want, &x, &wf, Some(&bias), cols);
                for &f in &paths {
                    let mut out = vec![f32::NAN; n * rows];
                    let mut jobs = [Job {
                        w: &m,
                        bias: Some(&bias),
                        out: &mut out,
                    }];
                    matmul_with(f, &mut jobs, &x, cols, &mut input);
                    let err = rel_err(&out, &want);
                    assert!(
                        err < 1e-2,
                        "{dtype}, {n} tokens, {f:?}: relative error {err:.2e}"
                    );
                }
            }
        }
    }

    /// The batch-invariant mode with the batch's flags: each token's outputs are bit for bit
    /// what its own kernel gives it alone (a generated token: the dot products, as a decode
    /// step; a prompt's token: the bf16 tiles), whatever else shares the call.
    #[test]
    fn invariant_mode_routes_each_token_by_what_it_is() {
        let f = Features::detect();
        if !(f.bf16 && f.vnni) {
            eprintln!("no AVX-512 BF16 and VNNI here: one kernel serves every token");
            return;
        }
        let (rows, cols, n) = (64, 256, 5);
        let m = random_matrix(DType::Q4_1, rows, cols, 21);
        let mut rng = StdRng::seed_from_u64(8);
        let x: Vec<f32> = (0..n * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
        let flags = vec![false, true, false, false, true];
        let mut together = vec![f32::NAN; n * rows];
        let mut input = Input {
            invariant: true,
            generated: flags.clone(),
            ..Default::default()
        };
        let mut jobs = [Job {
            w: &m,
            bias: None,
            out: &mut together,
        }];
        matmul_with(f, &mut jobs, &x, cols, &mut input);
        for (t, &generated) in flags.iter().enumerate() {
            let mut alone = vec![f32::NAN; rows];
            // A generated token alone is a decode step; a prompt's token alone, the tiles.
            let mut input = Input {
                invariant: !generated,
                ..Default::default()
            };
            let mut jobs = [Job {
                w: &m,
                bias: None,
                out: &mut alone,
            }];
            matmul_with(f, &mut jobs, &x[t * cols..(t + 1) * cols], cols, &mut input);
            assert!(
                alone == together[t * rows..(t + 1) * rows],
                "token {t} (generated: {generated}) differs from its run alone"
            );
        }
    }

    #[test]
    fn rows_are_shared_in_aligned_parts_that_cover_them_once() {
        for (n_out, parts, align) in [
            (576, 2, 32),
            (192, 2, 32),
            (45, 2, 16),
            (49152, 3, 16),
            (7, 4, 32),
        ] {
            let mut next = 0;
            for p in 0..parts {
                let (lo, hi) = share(n_out, parts, p, align);
                assert_eq!(lo, next.min(n_out));
                assert!(lo <= hi && (hi == n_out || hi % align == 0));
                next = hi;
            }
            assert_eq!(next, n_out);
        }
    }
}
