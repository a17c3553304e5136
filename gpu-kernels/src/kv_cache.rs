//! Writing new keys and values into the paged KV cache.

use crate::device::global_idx_x;

/// Copies token `t`'s key and value rows to row `slots[t]` of the cache.
///
/// A step of the lesson, kept and tested as the simplest form: the forward pass writes the
/// cache (in bf16) inside `qkv_rope_write_bf16`, right after RoPE.
///
/// - `k_cache`, `v_cache`: one layer, `[n_blocks * 16, kv_dim]` f32 (a slot is
///   `block * 16 + offset`, from the sequence's block table)
/// - `k`, `v`: `[n, kv_dim]` f32
/// - `slots`: `[n]` u32
///
/// Thread mapping: one thread per element of `[n, kv_dim]`; consecutive threads copy
/// consecutive floats of one row.
///
/// PRECONDITIONS: every `slots[t] < n_blocks * 16`; no two tokens share a slot.
///
/// # Safety
/// The host's launch wrapper checks the preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "gpu-kernel" fn kv_write_f32(
    k_cache: *mut f32,
    v_cache: *mut f32,
    k: *const f32,
    v: *const f32,
    slots: *const u32,
    kv_dim: u32,
    n: u32,
) {
    crate::device::wait_for_previous_kernel();
    let kv_dim = kv_dim as usize;
    let idx = global_idx_x();
    if idx >= n as usize * kv_dim {
        return;
    }
    let (t, i) = (idx / kv_dim, idx % kv_dim);
    // SAFETY: t < n, slots[t] is a valid slot (preconditions).
    unsafe {
        let dst = *slots.add(t) as usize * kv_dim + i;
        *k_cache.add(dst) = *k.add(idx);
        *v_cache.add(dst) = *v.add(idx);
    }
}
