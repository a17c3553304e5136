//! The paged KV cache on the device: every layer's keys and values, in bf16 or (`--kv-dtype
//! fp8`) e4m3 bytes with a scale byte per token and head, in the CPU cache's layout (which
//! holds f32), plus one spare block that a graph's padding rows write and read.

use cudarc::driver::CudaSlice;

use super::context::Gpu;
use super::kernels::attention::KvScales;
use super::kernels::{In, Out};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::kv::block_manager::blocks_for;
use crate::kv::dtype::{KvDtype, block_bytes};
use crate::tiles::BLOCK_SIZE;

/// Share of the free device memory the KV pool may take by default.
const KV_SHARE_OF_FREE: f64 = 0.9;

/// Every layer's keys and values, `[n_layers, n_blocks + 1, BLOCK_SIZE, n_kv_heads,
/// head_dim]` each.
enum Caches {
    Bf16 {
        k: CudaSlice<u16>,
        v: CudaSlice<u16>,
    },
    /// e4m3 bytes, and the scales `[n_layers, n_blocks + 1, n_kv_heads, BLOCK_SIZE]` bytes
    /// each (`kv::fp8`).
    Fp8 {
        k: CudaSlice<u8>,
        v: CudaSlice<u8>,
        k_scales: CudaSlice<u8>,
        v_scales: CudaSlice<u8>,
    },
}

pub struct KvPool {
    caches: Caches,
    /// Blocks the runner may hand out; block `n_blocks` is the spare.
    pub n_blocks: usize,
    n_layers: usize,
}

/// One layer of the pool, to read: its keys and values, and in fp8 their scales.
pub enum KvLayer<'a> {
    Bf16(In<'a, u16>, In<'a, u16>),
    Fp8((In<'a, u8>, In<'a, u8>), KvScales<'a>),
}

/// One layer of the pool, to write.
pub enum KvLayerMut<'a> {
    Bf16(Out<'a, u16>, Out<'a, u16>),
    Fp8((Out<'a, u8>, Out<'a, u8>), (Out<'a, u8>, Out<'a, u8>)),
}

impl KvPool {
    /// A pool of `kv_blocks` blocks of `dtype`, or by default of most of the free memory (up
    /// to what `max_seqs` full contexts need).
    pub fn new(
        gpu: &Gpu,
        c: &Config,
        (kv_blocks, dtype): (Option<usize>, KvDtype),
        max_seqs: usize,
    ) -> Result<KvPool> {
        dtype.check(c)?;
        let block_bytes = block_bytes(dtype, c);
        let n_blocks = match kv_blocks {
            Some(n) => n,
            None => {
                let (free, _) = gpu.memory();
                let affordable = (free as f64 * KV_SHARE_OF_FREE) as usize / block_bytes;
                affordable.min(blocks_for(c.max_seq_len) * max_seqs)
            }
        };
        if n_blocks == 0 {
            let (free, total) = gpu.memory();
            return Err(Error::GpuOutOfMemory {
                what: "one KV-cache block".into(),
                bytes: block_bytes,
                free,
                total,
            });
        }
        // One block more than the runner is told of: the padding rows'.
        let rows = (n_blocks + 1) * BLOCK_SIZE * c.n_kv_heads * c.n_layers;
        let pool = rows * c.head_dim;
        let caches = match dtype {
            KvDtype::Bf16 => Caches::Bf16 {
                k: gpu.zeros(pool, "the KV cache (keys)")?,
                v: gpu.zeros(pool, "the KV cache (values)")?,
            },
            // Zeros for the scales too: a scale the attention stages for a slot never
            // written (past a sequence's last position) must still be a finite power of two.
            KvDtype::Fp8 => Caches::Fp8 {
                k: gpu.zeros(pool, "the KV cache (keys)")?,
                v: gpu.zeros(pool, "the KV cache (values)")?,
                k_scales: gpu.zeros(rows, "the KV cache (keys' scales)")?,
                v_scales: gpu.zeros(rows, "the KV cache (values' scales)")?,
            },
        };
        Ok(KvPool {
            caches,
            n_blocks,
            n_layers: c.n_layers,
        })
    }

    /// The spare block graph padding rows write and read.
    pub fn pad_block(&self) -> usize {
        self.n_blocks
    }

    /// What the pool holds.
    pub fn dtype(&self) -> KvDtype {
        match self.caches {
            Caches::Bf16 { .. } => KvDtype::Bf16,
            Caches::Fp8 { .. } => KvDtype::Fp8,
        }
    }

    /// Layer `l`'s keys and values, to read.
    pub fn layer(&self, l: usize) -> KvLayer<'_> {
        let range = |len: usize| layer_range(len, self.n_layers, l);
        match &self.caches {
            Caches::Bf16 { k, v } => {
                let r = range(k.len());
                KvLayer::Bf16(k.slice(r.clone()), v.slice(r))
            }
            Caches::Fp8 {
                k,
                v,
                k_scales,
                v_scales,
            } => {
                let (r, s) = (range(k.len()), range(k_scales.len()));
                KvLayer::Fp8(
                    (k.slice(r.clone()), v.slice(r)),
                    (k_scales.slice(s.clone()), v_scales.slice(s)),
                )
            }
        }
    }

    /// Layer `l`'s keys and values, to write.
    pub fn layer_mut(&mut self, l: usize) -> KvLayerMut<'_> {
        let n_layers = self.n_layers;
        let range = |len: usize| layer_range(len, n_layers, l);
        match &mut self.caches {
            Caches::Bf16 { k, v } => {
                let r = range(k.len());
                KvLayerMut::Bf16(k.slice_mut(r.clone()), v.slice_mut(r))
            }
            Caches::Fp8 {
                k,
                v,
                k_scales,
                v_scales,
            } => {
                let (r, s) = (range(k.len()), range(k_scales.len()));
                KvLayerMut::Fp8(
                    (k.slice_mut(r.clone()), v.slice_mut(r)),
                    (k_scales.slice_mut(s.clone()), v_scales.slice_mut(s)),
                )
            }
        }
    }
}

/// Layer `l`'s part of a buffer of `len` elements that holds `n_layers` layers alike.
fn layer_range(len: usize, n_layers: usize, l: usize) -> std::ops::Range<usize> {
    let per_layer = len / n_layers;
    l * per_layer..(l + 1) * per_layer
}

/// The e4m3 noise `fill_noise` repeats: 1 MiB of bytes from a linear congruential generator,
/// NaN's two codes (0x7f, 0xff) moved one step down.
fn fp8_noise() -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..1 << 20)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let b = (state >> 56) as u8;
            if b & 0x7f == 0x7f { b - 1 } else { b }
        })
        .collect()
}

/// The scale byte of the noise: 2^-8, so that its values stay within ±1.75, as the bf16
/// noise's within ±1.
const NOISE_SCALE: u8 = 127 - 8;

impl KvPool {
    /// Fills every layer's keys and values with noise (the bf16 cache: random values of unit
    /// scale made on the device; fp8: a repeated pattern of bytes, one scale), so that
    /// attention over positions no sequence wrote reads real-looking data (`bench`).
    pub fn fill_noise(&mut self, gpu: &Gpu) -> Result<()> {
        let copy_error = |e| Error::Driver {
            what: "filling the KV cache with noise".into(),
            source: e,
        };
        match &mut self.caches {
            Caches::Bf16 { k, v } => {
                gpu.fill_random_bf16(&mut k.as_view_mut(), 3, 1.0)?;
                gpu.fill_random_bf16(&mut v.as_view_mut(), 4, 1.0)
            }
            Caches::Fp8 {
                k,
                v,
                k_scales,
                v_scales,
            } => {
                let noise = fp8_noise();
                for cache in [k, v] {
                    for start in (0..cache.len()).step_by(noise.len()) {
                        let end = (start + noise.len()).min(cache.len());
                        let dst = &mut cache.slice_mut(start..end);
                        let src = &noise[..end - start];
                        gpu.stream.memcpy_htod(src, dst).map_err(copy_error)?;
                    }
                }
                let scales = vec![NOISE_SCALE; k_scales.len()];
                for s in [k_scales, v_scales] {
                    gpu.stream.memcpy_htod(&scales, s).map_err(copy_error)?;
                }
                Ok(())
            }
        }
    }
}
