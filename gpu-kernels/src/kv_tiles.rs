//! Staging a tile of the paged cache's keys and values in shared memory, as the tensor-core
//! attention kernels (`attention_mma_*`, `attention_split_mma_*`) read them: rows of
//! `head_dim + 8` bf16 a key, each from its slot through the sequence's block table, zeros
//! for the keys past the last valid position.
//!
//! From the bf16 cache that is one `cp.async` per 16 bytes, straight into the tiles. From the
//! fp8 cache (`kv_fp8.rs`) it is two steps: `request` copies the e4m3 bytes and the scales
//! of the tile's blocks into a staging area, as asynchronously; `land`, after the copies have
//! arrived, turns each 16 bytes into 16 bf16 in the tiles, times the row's power of two,
//! exactly. From there the kernels run the same instructions over both caches: an fp8 cache
//! costs its attention a pass over shared memory and a few integer steps a value, and saves
//! half the bytes read from memory.

use crate::device::{fma_bf16x2, prmt};
use crate::kv_fp8::kv_dequant_factor;
use crate::mma::{cp_async_16, ld_shared_u32, ld_shared_v4, st_shared_v4};
use crate::tiles::{BLOCK_SIZE, fp8_scale_blocks, fp8_staging_bytes};

/// The threads that share a tile's copies: this one is `index` of `size`.
#[derive(Clone, Copy)]
pub struct Team {
    pub index: usize,
    pub size: usize,
}

/// Which keys a tile holds and where they are: `KEYS` keys from position `k0`, those below
/// `end` real (the rest zeros), KV head `kv_head` of `n_kv_heads`, heads `head_dim` wide,
/// through the sequence's row of the block table.
#[derive(Clone, Copy)]
pub struct TileSpan {
    pub k0: usize,
    pub end: usize,
    pub table: *const u32,
    pub kv_head: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl TileSpan {
    /// The first element of position `p`'s row of the cache (`[slots, n_kv_heads,
    /// head_dim]`).
    ///
    /// # Safety
    /// `p` is a position of the sequence: its table entry is valid.
    #[inline(always)]
    unsafe fn row(&self, p: usize) -> usize {
        // SAFETY: the caller's guarantee.
        let block = unsafe { *self.table.add(p / BLOCK_SIZE) } as usize;
        ((block * BLOCK_SIZE + p % BLOCK_SIZE) * self.n_kv_heads + self.kv_head) * self.head_dim
    }
}

/// The bf16 tiles of one buffer: shared addresses of the keys' and the values' tile, rows
/// `head_dim + 8` bf16 apart.
#[derive(Clone, Copy)]
pub struct Tiles {
    pub k: u32,
    pub v: u32,
}

/// The row stride of a tile, in bf16: 8 of padding, so that rows one apart start 16 bytes
/// apart in the banks and `ldmatrix` reads conflict-free.
#[inline(always)]
pub const fn tile_stride(head_dim: usize) -> usize {
    head_dim + 8
}

/// The shared address of (key, dimension d) in a tile.
#[inline(always)]
pub fn tile_at(tile: u32, head_dim: usize, key: usize, d: usize) -> u32 {
    tile + ((key * tile_stride(head_dim) + d) * 2) as u32
}

/// A cache that stages into bf16 tiles.
pub trait KvTiles: Copy {
    /// Whether `land` does anything (and needs a barrier after it).
    const STAGED: bool;

    /// Starts the copies of `span`'s keys and values (for the bf16 cache, into `tiles`;
    /// for fp8, into staging buffer `buffer`), without waiting and without committing them.
    ///
    /// # Safety
    /// The team calls it together; the tiles and the staging have the room the kernel's
    /// shared memory gives them; every position of `span` below `end` is the sequence's.
    unsafe fn request<const KEYS: usize>(
        self,
        team: Team,
        span: TileSpan,
        tiles: Tiles,
        buffer: usize,
    );

    /// Makes the tiles from what `request` staged in `buffer` (nothing for the bf16 cache).
    ///
    /// # Safety
    /// The team calls it together after its copies of `buffer` have landed and are visible
    /// to every thread of it (a wait and a barrier), with the same `span`; nobody reads the
    /// tiles until the barrier after it.
    unsafe fn land<const KEYS: usize>(
        self,
        team: Team,
        span: TileSpan,
        tiles: Tiles,
        buffer: usize,
    );
}

/// The bf16 cache: one layer's `[slots, n_kv_heads, head_dim]` keys and values.
#[derive(Clone, Copy)]
pub struct Bf16Cache {
    pub k: *const u16,
    pub v: *const u16,
}

impl KvTiles for Bf16Cache {
    const STAGED: bool = false;

    #[inline(always)]
    unsafe fn request<const KEYS: usize>(self, team: Team, span: TileSpan, tiles: Tiles, _: usize) {
        // 16-byte pieces: 8 bf16 of a key's head.
        let per_key = span.head_dim / 8;
        let mut piece = team.index;
        while piece < KEYS * per_key {
            let (key, part) = (piece / per_key, piece % per_key);
            let p = span.k0 + key;
            let valid = p < span.end;
            // SAFETY: p is a position of the sequence when valid (the caller's), and the 16
            // bytes lie inside its row (aligned: head_dim % 8 == 0); otherwise nothing is
            // read and zeros land. Destinations inside the tiles, 16-byte aligned.
            unsafe {
                let src = if valid { span.row(p) + 8 * part } else { 0 };
                let d = 8 * part;
                cp_async_16(
                    tile_at(tiles.k, span.head_dim, key, d),
                    self.k.add(src),
                    valid,
                );
                cp_async_16(
                    tile_at(tiles.v, span.head_dim, key, d),
                    self.v.add(src),
                    valid,
                );
            }
            piece += team.size;
        }
    }

    #[inline(always)]
    unsafe fn land<const KEYS: usize>(self, _: Team, _: TileSpan, _: Tiles, _: usize) {}
}

/// The fp8 cache: one layer's e4m3 keys and values (`[slots, n_kv_heads, head_dim]`), their
/// scale bytes (`[n_blocks, n_kv_heads, 16]`), and the staging area in shared memory
/// (`tiles::fp8_staging_bytes` a buffer, from `staging`).
#[derive(Clone, Copy)]
pub struct Fp8Cache {
    pub k: *const u8,
    pub v: *const u8,
    pub k_scales: *const u8,
    pub v_scales: *const u8,
    pub staging: u32,
}

/// Where the parts of staging buffer `buffer` begin: keys, values, keys' scales, values'.
#[inline(always)]
fn staged<const KEYS: usize>(staging: u32, head_dim: usize, buffer: usize) -> [u32; 4] {
    let k = staging + (buffer * fp8_staging_bytes(KEYS, head_dim)) as u32;
    let v = k + (KEYS * head_dim) as u32;
    let k_scales = v + (KEYS * head_dim) as u32;
    let v_scales = k_scales + (fp8_scale_blocks(KEYS) * BLOCK_SIZE) as u32;
    [k, v, k_scales, v_scales]
}

impl KvTiles for Fp8Cache {
    const STAGED: bool = true;

    #[inline(always)]
    unsafe fn request<const KEYS: usize>(
        self,
        team: Team,
        span: TileSpan,
        _: Tiles,
        buffer: usize,
    ) {
        let head_dim = span.head_dim;
        let [k, v, k_scales, v_scales] = staged::<KEYS>(self.staging, head_dim, buffer);
        // 16-byte pieces: 16 e4m3 of a key's head.
        let per_key = head_dim / 16;
        let mut piece = team.index;
        while piece < KEYS * per_key {
            let (key, part) = (piece / per_key, piece % per_key);
            let p = span.k0 + key;
            let valid = p < span.end;
            let at = (key * head_dim + 16 * part) as u32;
            // SAFETY: as `Bf16Cache::request`'s, for 16 bytes (head_dim % 16 == 0); the
            // destinations inside this buffer's staging.
            unsafe {
                let src = if valid { span.row(p) + 16 * part } else { 0 };
                cp_async_16(k + at, self.k.add(src), valid);
                cp_async_16(v + at, self.v.add(src), valid);
            }
            piece += team.size;
        }
        // The scales of the blocks the tile touches: 16 bytes a (block, head), one copy
        // each; a block past the last real position (its table entry unknown) as zeros.
        let first = span.k0 / BLOCK_SIZE;
        let mut b = team.index;
        while b < fp8_scale_blocks(KEYS) {
            let valid = (first + b) * BLOCK_SIZE < span.end;
            let at = (b * BLOCK_SIZE) as u32;
            // SAFETY: the block's table entry is valid when one of its positions is below
            // `end`; its 16 scales of this head are 16-byte aligned.
            unsafe {
                let src = if valid {
                    let block = *span.table.add(first + b) as usize;
                    (block * span.n_kv_heads + span.kv_head) * BLOCK_SIZE
                } else {
                    0
                };
                cp_async_16(k_scales + at, self.k_scales.add(src), valid);
                cp_async_16(v_scales + at, self.v_scales.add(src), valid);
            }
            b += team.size;
        }
    }

    #[inline(always)]
    unsafe fn land<const KEYS: usize>(
        self,
        team: Team,
        span: TileSpan,
        tiles: Tiles,
        buffer: usize,
    ) {
        let head_dim = span.head_dim;
        let [k, v, k_scales, v_scales] = staged::<KEYS>(self.staging, head_dim, buffer);
        let per_key = head_dim / 16;
        let mut piece = team.index;
        while piece < KEYS * per_key {
            let (key, part) = (piece / per_key, piece % per_key);
            // The key's scale byte: its block's row of staged scales, its place in it.
            let p = span.k0 + key;
            let scale_at =
                ((p / BLOCK_SIZE - span.k0 / BLOCK_SIZE) * BLOCK_SIZE + p % BLOCK_SIZE) as u32;
            let from = (key * head_dim + 16 * part) as u32;
            let to = |tile: u32| tile_at(tile, head_dim, key, 16 * part);
            // SAFETY: inside this buffer's staging (landed, the caller's); the destination's
            // 32 bytes are inside the tile, 16-byte aligned, and this thread's alone.
            unsafe {
                widen_16(k + from, k_scales + scale_at, to(tiles.k));
                widen_16(v + from, v_scales + scale_at, to(tiles.v));
            }
            piece += team.size;
        }
    }
}

/// Sixteen staged e4m3 bytes at `from` into sixteen bf16 at `to`, times the power of two of
/// the scale byte at `scale`: exact (`kv_fp8.rs`). Two bytes at a time: each byte's seven
/// magnitude bits move to bits 4..10 of a bf16 and its sign to bit 15 (`prmt` places them),
/// which reads as the byte's value times 2^-120 (`kv_e4m3_bits_f32`'s factor, a subnormal
/// bf16 for e4m3's subnormals), then one `fma.rn.bf16x2` multiplies the pair by the scale
/// times 2^120: a power of two, so exact. Three instructions a value, where an f32 for each
/// took six and a rounding to pack.
///
/// # Safety
/// `from` and `to` are 16-byte aligned shared addresses with 16 bytes to read and 32 to
/// write; `scale` a shared address with a byte to read.
#[inline(always)]
unsafe fn widen_16(from: u32, scale: u32, to: u32) {
    // SAFETY: the caller's guarantee; the word holding the scale byte is 4-byte aligned.
    unsafe {
        let word = ld_shared_u32(scale & !3);
        let byte = (word >> (8 * (scale & 3))) & 0xff;
        // The f32 factor's top half, in both halves: the bf16 pair (2^(k + 120), same).
        let half = kv_dequant_factor(byte as u8).to_bits() >> 16;
        let factor = half | (half << 16);
        let bytes = ld_shared_v4(from);
        let mut out = [0u32; 8];
        for w in 0..4 {
            let magnitude = bytes[w] & 0x7f7f_7f7f;
            let sign = bytes[w] ^ magnitude;
            // Bytes 0 and 1 into the halves' low bits (magnitude) and top bits (sign); then
            // bytes 2 and 3.
            let lo = (prmt(magnitude, 0, 0x4140) << 4) | prmt(sign, 0, 0x1404);
            let hi = (prmt(magnitude, 0, 0x4342) << 4) | prmt(sign, 0, 0x3424);
            // + -0: a zero byte stays a zero of its sign.
            out[2 * w] = fma_bf16x2(lo, factor, 0x8000_8000);
            out[2 * w + 1] = fma_bf16x2(hi, factor, 0x8000_8000);
        }
        st_shared_v4(to, [out[0], out[1], out[2], out[3]]);
        st_shared_v4(to + 16, [out[4], out[5], out[6], out[7]]);
    }
}
