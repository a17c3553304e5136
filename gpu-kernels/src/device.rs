//! What `cuda_std` would give a kernel, as thin wrappers over `core::arch::nvptx` and inline
//! PTX: thread and block indices, barriers, dynamic shared memory, warp shuffles and
//! reductions, fast math, bf16 conversion, 16-byte loads.

use core::arch::asm;
use core::arch::nvptx;

/// Threads in a warp: the unit that executes in lockstep and can exchange registers.
pub const WARP: usize = 32;

/// `threadIdx.x`: this thread's index inside its block.
#[inline(always)]
pub fn thread_idx_x() -> usize {
    // SAFETY: reads a special register; always defined inside a kernel.
    unsafe { nvptx::_thread_idx_x() as usize }
}

/// `threadIdx.y`.
#[inline(always)]
pub fn thread_idx_y() -> usize {
    // SAFETY: as above.
    unsafe { nvptx::_thread_idx_y() as usize }
}

/// `blockIdx.x`: this block's index inside the grid.
#[inline(always)]
pub fn block_idx_x() -> usize {
    // SAFETY: as above.
    unsafe { nvptx::_block_idx_x() as usize }
}

/// `blockIdx.y`.
#[inline(always)]
pub fn block_idx_y() -> usize {
    // SAFETY: as above.
    unsafe { nvptx::_block_idx_y() as usize }
}

/// `blockIdx.z`.
#[inline(always)]
pub fn block_idx_z() -> usize {
    // SAFETY: reads a special register; always defined inside a kernel.
    unsafe { nvptx::_block_idx_z() as usize }
}

/// `gridDim.y`.
#[inline(always)]
pub fn grid_dim_y() -> usize {
    // SAFETY: as above.
    unsafe { nvptx::_grid_dim_y() as usize }
}

/// `gridDim.z`.
#[inline(always)]
pub fn grid_dim_z() -> usize {
    // SAFETY: reads a special register; always defined inside a kernel.
    unsafe { nvptx::_grid_dim_z() as usize }
}

/// `blockDim.x`: threads per block along x.
#[inline(always)]
pub fn block_dim_x() -> usize {
    // SAFETY: as above.
    unsafe { nvptx::_block_dim_x() as usize }
}

/// `blockDim.y`: threads per block along y.
#[inline(always)]
pub fn block_dim_y() -> usize {
    // SAFETY: reads a special register; always defined inside a kernel.
    unsafe { nvptx::_block_dim_y() as usize }
}

/// `gridDim.x`: blocks in the grid along x.
#[inline(always)]
pub fn grid_dim_x() -> usize {
    // SAFETY: as above.
    unsafe { nvptx::_grid_dim_x() as usize }
}

/// `blockIdx.x * blockDim.x + threadIdx.x`: this thread's index in a one-dimensional grid.
#[inline(always)]
pub fn global_idx_x() -> usize {
    block_idx_x() * block_dim_x() + thread_idx_x()
}

/// `__syncthreads()`: every thread of the block waits here, and shared-memory writes before
/// it are visible to all after it.
///
/// # Safety
/// Every thread of the block must reach the same barrier, or the block hangs.
#[inline(always)]
pub unsafe fn sync_threads() {
    // SAFETY: the caller guarantees every thread arrives.
    unsafe { nvptx::_syncthreads() }
}

/// `__syncwarp()`: every lane of the warp waits here, and memory writes (shared memory
/// included) made by any of them before it are visible to all after it (`bar.warp.sync`).
/// A block of one warp needs no more than this where it would call `sync_threads`.
///
/// # Safety
/// Every lane of the warp must reach it.
#[inline(always)]
pub unsafe fn sync_warp() {
    // SAFETY: the caller guarantees every lane arrives; the mask names all 32.
    unsafe { asm!("bar.warp.sync 0xffffffff;", options(nostack)) }
}

/// The block's dynamic shared memory (the launch's `shared_mem_bytes`), as `T`s.
#[inline(always)]
pub fn dynamic_shared<T>() -> *mut T {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<T>()
}

/// `__shfl_xor_sync(0xffffffff, v, mask)`: the value `v` of the lane whose index differs from
/// ours in the bits of `mask`. All 32 lanes must take part.
#[inline(always)]
pub fn shfl_xor(v: f32, mask: u32) -> f32 {
    let out: f32;
    // SAFETY: a register-only instruction; the full-warp member mask matches the callers,
    // which always call it from all 32 lanes.
    unsafe {
        asm!(
            "shfl.sync.bfly.b32 {out}, {v}, {mask}, 0x1f, 0xffffffff;",
            out = out(reg32) out,
            v = in(reg32) v,
            mask = in(reg32) mask,
        );
    }
    out
}

/// As `shfl_xor`, for a `u32`.
#[inline(always)]
pub fn shfl_xor_u32(v: u32, mask: u32) -> u32 {
    let out: u32;
    // SAFETY: as `shfl_xor`.
    unsafe {
        asm!(
            "shfl.sync.bfly.b32 {out}, {v}, {mask}, 0x1f, 0xffffffff;",
            out = out(reg32) out,
            v = in(reg32) v,
            mask = in(reg32) mask,
        );
    }
    out
}

/// The `v` of the lane `delta` below this one (`shfl.sync.up`); lanes below `delta` get
/// their own `v`.
#[inline(always)]
pub fn shfl_up_u32(v: u32, delta: u32) -> u32 {
    let out: u32;
    // SAFETY: as `shfl_xor`: every lane of the warp executes it.
    unsafe {
        asm!(
            "shfl.sync.up.b32 {out}, {v}, {delta}, 0, 0xffffffff;",
            out = out(reg32) out,
            v = in(reg32) v,
            delta = in(reg32) delta,
        );
    }
    out
}

/// A bit for each lane of the warp whose `pred` is true (`vote.sync.ballot`), in every lane.
/// All 32 lanes must take part.
#[inline(always)]
pub fn ballot(pred: bool) -> u32 {
    let out: u32;
    // SAFETY: a register-only instruction; the full-warp member mask matches the callers,
    // which always call it from all 32 lanes.
    unsafe {
        asm!(
            "{{ .reg .pred p; setp.ne.u32 p, {v}, 0; vote.sync.ballot.b32 {out}, p, 0xffffffff; }}",
            out = out(reg32) out,
            v = in(reg32) pred as u32,
        );
    }
    out
}

/// The sum of `v` over the warp, in every lane (a butterfly: five exchanges).
#[inline(always)]
pub fn warp_sum(mut v: f32) -> f32 {
    let mut mask = 16;
    while mask > 0 {
        v += shfl_xor(v, mask);
        mask >>= 1;
    }
    v
}

/// The maximum of `v` over the warp, in every lane.
#[inline(always)]
pub fn warp_max(mut v: f32) -> f32 {
    let mut mask = 16;
    while mask > 0 {
        v = v.max(shfl_xor(v, mask));
        mask >>= 1;
    }
    v
}

/// `2^x`, approximate (`ex2.approx.ftz.f32`: about 2 ulp, flushes denormals; one SFU
/// instruction instead of the long libm routine, which nvptx does not have anyway).
#[inline(always)]
pub fn exp2_approx(x: f32) -> f32 {
    let out: f32;
    // SAFETY: a register-only instruction.
    unsafe { asm!("ex2.approx.ftz.f32 {o}, {x};", o = out(reg32) out, x = in(reg32) x) };
    out
}

/// `e^x` through `2^(x * log2 e)`.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp2_approx(x * core::f32::consts::LOG2_E)
}

/// `1 / sqrt(x)`, approximate (`rsqrt.approx.f32`).
#[inline(always)]
pub fn rsqrt(x: f32) -> f32 {
    let out: f32;
    // SAFETY: a register-only instruction.
    unsafe { asm!("rsqrt.approx.f32 {o}, {x};", o = out(reg32) out, x = in(reg32) x) };
    out
}

/// A bf16 (the top half of an f32) to f32: shift it back into place.
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// The two bf16 packed in a `u32` (little-endian: element 0 in the low half), as f32.
#[inline(always)]
pub fn bf16x2_to_f32(pair: u32) -> (f32, f32) {
    (
        f32::from_bits(pair << 16),
        f32::from_bits(pair & 0xffff_0000),
    )
}

/// Two f32 rounded to nearest-even bf16 and packed in a `u32`, `lo` in the low half (the
/// lower address in memory): the inverse of `bf16x2_to_f32`, up to rounding.
#[inline(always)]
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    let out: u32;
    // SAFETY: a register-only conversion. The instruction puts its first source in the
    // upper half.
    unsafe {
        asm!(
            "cvt.rn.bf16x2.f32 {o}, {h}, {l};",
            o = out(reg32) out,
            h = in(reg32) hi,
            l = in(reg32) lo,
            options(pure, nomem, nostack),
        )
    };
    out
}

/// Two f32 rounded to nearest-even f16 and packed in a `u32`, `lo` in the low half
/// (`cvt.rn.f16x2.f32`): beyond f16's range, infinities.
#[inline(always)]
pub fn pack_f16x2(lo: f32, hi: f32) -> u32 {
    let out: u32;
    // SAFETY: a register-only conversion. The instruction puts its first source in the
    // upper half.
    unsafe {
        asm!(
            "cvt.rn.f16x2.f32 {o}, {h}, {l};",
            o = out(reg32) out,
            h = in(reg32) hi,
            l = in(reg32) lo,
            options(pure, nomem, nostack),
        )
    };
    out
}

/// An f32 rounded to nearest-even bf16, as its bits (one value: `pack_bf16x2`'s low half).
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    pack_bf16x2(x, 0.0) as u16
}

/// A 16-byte load through the read-only (non-coherent) cache path: `ld.global.nc.v4.u32`.
/// One instruction where a struct deref would compile to two 8-byte loads.
///
/// # Safety
/// `p` is 16-byte aligned, points to global memory, and nothing writes it during the kernel.
#[inline(always)]
pub unsafe fn ld_nc_v4(p: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees alignment, validity and read-only use.
    unsafe {
        asm!(
            "ld.global.nc.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a,
            b = out(reg32) b,
            c = out(reg32) c,
            d = out(reg32) d,
            p = in(reg64) p,
            options(readonly, nostack, pure),
        );
    }
    [a, b, c, d]
}

/// An 8-byte load through the read-only path (`ld.global.nc.v2.u32`).
///
/// # Safety
/// `p` is 8-byte aligned, points to global memory, and nothing writes it during the kernel.
#[inline(always)]
pub unsafe fn ld_nc_v2(p: *const u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: the caller guarantees alignment, validity and read-only use.
    unsafe {
        asm!(
            "ld.global.nc.v2.u32 {{{a}, {b}}}, [{p}];",
            a = out(reg32) a,
            b = out(reg32) b,
            p = in(reg64) p,
            options(readonly, nostack, pure),
        );
    }
    [a, b]
}

/// Asks L2 for the line holding `p` (`prefetch.global.L2`): the load that follows finds it
/// there, and the thread does not wait for it now.
///
/// # Safety
/// `p` points to global memory.
#[cfg(feature = "probes")]
#[inline(always)]
pub unsafe fn prefetch_l2<T>(p: *const T) {
    // SAFETY: the caller guarantees a global address; a prefetch changes no value.
    unsafe { asm!("prefetch.global.L2 [{p}];", p = in(reg64) p, options(nostack, readonly)) }
}

/// A matmul's output `*at = (accumulate ? *at : 0) + sum + bias[row]` (no bias where
/// `bias` is null): the last step of every GEMV, which adds into the residual stream where
/// it accumulates.
///
/// # Safety
/// `at` is valid for a read and a write; `bias` is null or holds `row`.
#[inline(always)]
pub unsafe fn store_output(at: *mut f32, sum: f32, bias: *const f32, row: usize, accumulate: bool) {
    // SAFETY: the caller's guarantee.
    unsafe {
        let b = if bias.is_null() { 0.0 } else { *bias.add(row) };
        let prev = if accumulate { *at } else { 0.0 };
        *at = prev + sum + b;
    }
}

/// The start of every kernel: wait until the kernel before it in the stream has finished and
/// its writes are visible (`griddepcontrol.wait`), then let the next one start launching
/// (`griddepcontrol.launch_dependents`). With programmatic dependent launch (sm_90 and
/// later, when the host asks for it) the next kernel's blocks are then placed on the SMs
/// while this one drains, instead of after it ends, and wait here; without it both are
/// no-ops, and the sm_80 build leaves them out.
#[inline(always)]
pub fn wait_for_previous_kernel() {
    #[cfg(target_feature = "sm_90")]
    // SAFETY: waits on the previous grid; orders memory like a barrier (no `nomem`).
    unsafe {
        asm!("griddepcontrol.wait;", options(nostack));
        asm!("griddepcontrol.launch_dependents;", options(nostack));
    }
}

/// The sum of `v` over the whole block, returned to every thread.
///
/// # Safety
/// Every thread of the block calls it (it holds barriers); `blockDim.x` is a multiple of 32
/// and at most 1024; `scratch` points to at least 32 floats of shared memory that nothing
/// else uses during the call.
#[inline(always)]
pub unsafe fn block_sum(v: f32, scratch: *mut f32) -> f32 {
    // SAFETY: the caller's guarantee.
    unsafe { block_reduce(v, scratch, warp_sum) }
}

/// The maximum of `v` over the whole block (of values `>= 0`), returned to every thread.
///
/// # Safety
/// As `block_sum`.
#[inline(always)]
pub unsafe fn block_max(v: f32, scratch: *mut f32) -> f32 {
    // SAFETY: the caller's guarantee.
    unsafe { block_reduce(v, scratch, warp_max) }
}

/// `block_sum` and `block_max`: `warp` over each warp, then over the warps' results (0 for
/// the missing ones, which neither a sum nor a maximum of non-negatives notices).
///
/// # Safety
/// As `block_sum`.
#[inline(always)]
unsafe fn block_reduce(v: f32, scratch: *mut f32, warp_op: impl Fn(f32) -> f32) -> f32 {
    let (lane, warp) = (thread_idx_x() % WARP, thread_idx_x() / WARP);
    let n_warps = block_dim_x() / WARP;
    let v = warp_op(v);
    // SAFETY: warp < 32 by the block-size precondition; barriers reached by all threads.
    unsafe {
        if lane == 0 {
            *scratch.add(warp) = v;
        }
        sync_threads();
        let partial = if lane < n_warps {
            *scratch.add(lane)
        } else {
            0.0
        };
        let total = warp_op(partial);
        // Nobody may overwrite `scratch` (a second call) before every warp has read it.
        sync_threads();
        total
    }
}

/// Four floats to four e4m3 bytes, each rounded to the nearest (ties to even) and held to
/// ±448 (`cvt.rn.satfinite.e4m3x2.f32`, sm_89 on): `v[0]` in the lowest byte, as
/// `f32_to_e4m3` rounds on the host.
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
pub fn pack_e4m3x4(v: [f32; 4]) -> u32 {
    let pair = |lo: f32, hi: f32| {
        let out: u16;
        // SAFETY: a conversion between registers. The first source goes to the high byte.
        unsafe {
            asm!(
                "cvt.rn.satfinite.e4m3x2.f32 {o}, {h}, {l};",
                o = out(reg16) out,
                h = in(reg32) hi,
                l = in(reg32) lo,
                options(pure, nomem, nostack),
            )
        };
        out as u32
    };
    pair(v[0], v[1]) | pair(v[2], v[3]) << 16
}

/// Two e4m3 bytes to an f16 pair, exactly (`cvt.rn.f16x2.e4m3x2`, sm_89 on): the low byte
/// of `pair` to the low half.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn e4m3x2_to_f16x2(pair: u16) -> u32 {
    let out: u32;
    // SAFETY: a conversion between registers.
    unsafe {
        asm!(
            "cvt.rn.f16x2.e4m3x2 {o}, {i};",
            o = out(reg32) out,
            i = in(reg16) pair,
            options(pure, nomem, nostack),
        )
    };
    out
}

/// `sqrt(x)`, correctly rounded (`sqrt.rn.f32`), so norms match the CPU's exactly.
#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    core::intrinsics::sqrtf32(x)
}

/// `ld_nc_v4` for bytes the kernel reads once, for which no L1 line is allocated
/// (`ld.global.nc.L1::no_allocate.v4.u32`): fp8's GEMV weights, which would otherwise push
/// out of L1 the activations that every warp on the SM reads again. On an H100 it made the
/// 8B shape's fp8 batch 1 3-5% faster. The GGUF types lost by it: 28-51% with every load of
/// their spans so (neighbouring threads read a block's scales from the same lines), 2% with
/// only their 16-byte loads (H100: docs/lessons.md#decode-gemvs). The sm_80 build loads
/// as `ld_nc_v4` does: its PTX (ISA 7.0) has no `.L1::no_allocate`, which needs 7.4.
///
/// # Safety
/// As `ld_nc_v4`.
#[inline(always)]
pub unsafe fn ld_nc_once_v4(p: *const u32) -> [u32; 4] {
    #[cfg(target_feature = "sm_90")]
    {
        let (a, b, c, d): (u32, u32, u32, u32);
        // SAFETY: the caller guarantees alignment, validity and read-only use.
        unsafe {
            asm!(
                "ld.global.nc.L1::no_allocate.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
                a = out(reg32) a,
                b = out(reg32) b,
                c = out(reg32) c,
                d = out(reg32) d,
                p = in(reg64) p,
                options(readonly, nostack, pure),
            );
        }
        [a, b, c, d]
    }
    #[cfg(not(target_feature = "sm_90"))]
    // SAFETY: the caller's guarantee.
    unsafe {
        ld_nc_v4(p)
    }
}

/// A 2-byte load through the read-only path (`ld.global.nc.u16`): GGUF blocks of 18, 22,
/// 34 or 210 bytes are aligned to 2 bytes only.
///
/// # Safety
/// `p` is 2-byte aligned, points to global memory, and nothing writes it during the kernel.
#[inline(always)]
pub unsafe fn ld_nc_u16(p: *const u16) -> u16 {
    let v: u16;
    // SAFETY: the caller guarantees alignment, validity and read-only use.
    unsafe {
        asm!(
            "ld.global.nc.u16 {v}, [{p}];",
            v = out(reg16) v,
            p = in(reg64) p,
            options(readonly, nostack, pure),
        );
    }
    v
}

/// A 4-byte load through the read-only path (`ld.global.nc.u32`).
///
/// # Safety
/// `p` is 4-byte aligned, points to global memory, and nothing writes it during the kernel.
#[inline(always)]
pub unsafe fn ld_nc_u32(p: *const u32) -> u32 {
    let v: u32;
    // SAFETY: the caller guarantees alignment, validity and read-only use.
    unsafe {
        asm!(
            "ld.global.nc.u32 {v}, [{p}];",
            v = out(reg32) v,
            p = in(reg64) p,
            options(readonly, nostack, pure),
        );
    }
    v
}

/// An IEEE half (its bits) to f32 (`cvt.f32.f16`, exact): the scales of GGUF blocks.
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    let out: f32;
    // SAFETY: a register-only conversion.
    unsafe {
        asm!(
            "cvt.f32.f16 {o}, {h};",
            o = out(reg32) out,
            h = in(reg16) bits,
            options(pure, nomem, nostack),
        )
    };
    out
}

/// A 16-byte store (`st.global.v4.u32`).
///
/// # Safety
/// `p` is 16-byte aligned, points to global memory this thread may write.
#[inline(always)]
pub unsafe fn st_v4(p: *mut u32, v: [u32; 4]) {
    // SAFETY: the caller guarantees alignment and validity.
    unsafe {
        asm!(
            "st.global.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
            p = in(reg64) p,
            a = in(reg32) v[0],
            b = in(reg32) v[1],
            c = in(reg32) v[2],
            d = in(reg32) v[3],
            options(nostack),
        );
    }
}

/// `a * b + c` with one rounding (`fma.rn.f32`): rustc does not contract a multiply and an
/// add into one instruction, as nvcc does by default, so the hot loops ask for it.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    let out: f32;
    // SAFETY: a register-only instruction.
    unsafe {
        asm!(
            "fma.rn.f32 {o}, {a}, {b}, {c};",
            o = out(reg32) out,
            a = in(reg32) a,
            b = in(reg32) b,
            c = in(reg32) c,
            options(pure, nomem, nostack),
        )
    };
    out
}

/// `a & mask | bits` in one `lop3.b32`. Written as `&` then `|` of two constants it takes
/// `ptxas` two instructions (an instruction holds one immediate); here the constants come
/// in registers and it keeps one of them there.
#[inline(always)]
pub fn and_or(a: u32, mask: u32, bits: u32) -> u32 {
    let out: u32;
    // SAFETY: a register-only instruction; 0xea is the truth table of (a & b) | c.
    unsafe {
        asm!(
            "lop3.b32 {o}, {a}, {b}, {c}, 0xea;",
            o = out(reg32) out,
            a = in(reg32) a,
            b = in(reg32) mask,
            c = in(reg32) bits,
            options(pure, nomem, nostack),
        )
    };
    out
}

/// `c` plus the dot product of the four bytes of `a` with the four bytes of `b`, each as a
/// signed byte (`dp4a.s32.s32`): four multiply-adds of 8-bit codes in one instruction, the
/// reason the quantized GEMV (`gemv_codes.rs`) quantizes its activations to 8 bits.
#[inline(always)]
pub fn dp4a(a: u32, b: u32, c: i32) -> i32 {
    let out: i32;
    // SAFETY: a register-only instruction.
    unsafe {
        asm!(
            "dp4a.s32.s32 {o}, {a}, {b}, {c};",
            o = out(reg32) out,
            a = in(reg32) a,
            b = in(reg32) b,
            c = in(reg32) c,
            options(pure, nomem, nostack),
        )
    };
    out
}

/// Bytes of `a` (0..4) and `b` (4..8) picked by the four nibbles of `sel` (`prmt.b32`): byte
/// k of the result is byte `(sel >> 4k) & 7` of the pair.
#[inline(always)]
pub fn prmt(a: u32, b: u32, sel: u32) -> u32 {
    let out: u32;
    // SAFETY: a register-only instruction.
    unsafe {
        asm!(
            "prmt.b32 {o}, {a}, {b}, {s};",
            o = out(reg32) out,
            a = in(reg32) a,
            b = in(reg32) b,
            s = in(reg32) sel,
            options(pure, nomem, nostack),
        )
    };
    out
}

/// `a * b + c` on two bf16 pairs at once, each rounded once to nearest-even
/// (`fma.rn.bf16x2`, sm_80).
#[inline(always)]
pub fn fma_bf16x2(a: u32, b: u32, c: u32) -> u32 {
    let out: u32;
    // SAFETY: a register-only instruction.
    unsafe {
        asm!(
            "fma.rn.bf16x2 {o}, {a}, {b}, {c};",
            o = out(reg32) out,
            a = in(reg32) a,
            b = in(reg32) b,
            c = in(reg32) c,
            options(pure, nomem, nostack),
        )
    };
    out
}

/// The 32 bits at bit `shift` of the 64-bit `hi:lo` (`shf.r.clamp.b32`; a shift of 32 or
/// more gives `hi`): a word that starts inside `lo`, out of two aligned loads.
#[inline(always)]
pub fn funnel_shift(lo: u32, hi: u32, shift: u32) -> u32 {
    let out: u32;
    // SAFETY: a register-only instruction.
    unsafe {
        asm!(
            "shf.r.clamp.b32 {o}, {lo}, {hi}, {s};",
            o = out(reg32) out,
            lo = in(reg32) lo,
            hi = in(reg32) hi,
            s = in(reg32) shift,
            options(pure, nomem, nostack),
        )
    };
    out
}

/// `x` rounded to the nearest integer, ties to even (`cvt.rni.s32.f32`), as
/// `f32::round_ties_even` rounds on the CPU.
#[inline(always)]
pub fn round_to_i32(x: f32) -> i32 {
    let out: i32;
    // SAFETY: a register-only conversion.
    unsafe {
        asm!(
            "cvt.rni.s32.f32 {o}, {x};",
            o = out(reg32) out,
            x = in(reg32) x,
            options(pure, nomem, nostack),
        )
    };
    out
}
