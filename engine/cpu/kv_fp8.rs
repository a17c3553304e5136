//! The fp8 KV cache's twins (`--kv-dtype fp8`): the cache write quantizes each key and value
//! head to e4m3 bytes and a power-of-two scale (`kv::fp8`), bit for bit as the kernels do;
//! the attention twins widen the layer to the bf16 cache that holds the same values exactly
//! (as the kernels widen each tile) and run the bf16 twins.
//!
//! - caches: one layer, `[n_blocks * BLOCK_SIZE, n_kv_heads, head_dim]` e4m3 bytes
//! - scales: one layer, `[n_blocks, n_kv_heads, BLOCK_SIZE]` scale bytes (`kv::fp8`)

use super::ops::{
    NormedQkv, PagedRef, attention_bf16, attention_mma_bf16, attention_split_mma_bf16,
    normed_heads, rope_rows,
};
use crate::kernel_args::{Heads, Paged};
use crate::kv::fp8::{quantize_row, scale_index, widen_to_bf16};

/// One layer of the fp8 cache, to write: the keys' and values' bytes, then their scales.
pub type Fp8KvMut<'a> = ((&'a mut [u8], &'a mut [u8]), (&'a mut [u8], &'a mut [u8]));

/// RoPE on q and k and the cache write, keys and values quantized by head: the twin of the
/// GPU's `qkv_rope_write_fp8`. The other arguments as `qkv_rope_write_bf16`'s.
pub fn qkv_rope_write_fp8(
    q_out: &mut [f32],
    ((k_cache, v_cache), (k_scales, v_scales)): Fp8KvMut,
    qkv: &[f32],
    rows: (&[u32], &[u32]),
    tables: (&[f32], &[f32]),
    heads: Heads,
) {
    let (_, n_kv_heads, head_dim) = heads.sizes();
    rope_rows(q_out, qkv, rows, tables, heads, |slot, k, v| {
        for h in 0..n_kv_heads {
            let at = (slot * n_kv_heads + h) * head_dim..(slot * n_kv_heads + h + 1) * head_dim;
            let head = h * head_dim..(h + 1) * head_dim;
            let s = scale_index(slot, h, n_kv_heads);
            k_scales[s] = quantize_row(&mut k_cache[at.clone()], &k[head.clone()]);
            v_scales[s] = quantize_row(&mut v_cache[at], &v[head]);
        }
    });
}

/// `qkv_rope_write_fp8` with each query and key head RMSNormed first: the twin of the GPU's
/// `qkv_norm_rope_write_fp8` (Qwen3). The arguments as `qkv_rope_write_fp8`'s, the norms as
/// `qkv_norm_rope_write_bf16` takes them.
pub fn qkv_norm_rope_write_fp8(
    q_out: &mut [f32],
    cache: Fp8KvMut,
    rows_in: NormedQkv<&[f32]>,
    rows: (&[u32], &[u32]),
    tables: (&[f32], &[f32]),
    heads: Heads,
) {
    let normed = normed_heads(rows_in, heads);
    qkv_rope_write_fp8(q_out, cache, &normed, rows, tables, heads);
}

/// `p`'s fp8 cache widened to bf16, and `f` run over it.
fn over_bf16<R>(
    p: &PagedRef<u8>,
    (k_scales, v_scales): (&[u8], &[u8]),
    f: impl FnOnce(&PagedRef<u16>) -> R,
) -> R {
    let (_, n_kv_heads, head_dim) = p.shape.heads.sizes();
    let k = widen_to_bf16(p.k_cache, k_scales, n_kv_heads, head_dim);
    let v = widen_to_bf16(p.v_cache, v_scales, n_kv_heads, head_dim);
    f(&Paged {
        q: p.q,
        k_cache: &k,
        v_cache: &v,
        block_tables: p.block_tables,
        token_seq: p.token_seq,
        positions: p.positions,
        shape: p.shape,
    })
}

/// As `attention_bf16`, over the fp8 cache: the twin of the GPU's `attention_fp8`.
pub fn attention_fp8(out: &mut [f32], p: &PagedRef<u8>, scales: (&[u8], &[u8])) {
    over_bf16(p, scales, |p| attention_bf16(out, p))
}

/// As `attention_mma_bf16`, over the fp8 cache: the twin of the GPU's `attention_mma_fp8`.
pub fn attention_mma_fp8(out: &mut [f32], p: &PagedRef<u8>, scales: (&[u8], &[u8]), n: usize) {
    over_bf16(p, scales, |p| attention_mma_bf16(out, p, n))
}

/// As `attention_split_mma_bf16`, over the fp8 cache: the twin of the GPU's
/// `attention_split_mma_fp8`.
pub fn attention_split_mma_fp8(
    partial_o: &mut [f32],
    partial_ml: &mut [f32],
    p: &PagedRef<u8>,
    scales: (&[u8], &[u8]),
    split_len: usize,
) {
    over_bf16(p, scales, |p| {
        attention_split_mma_bf16(partial_o, partial_ml, p, split_len)
    })
}
