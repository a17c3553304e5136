//! The fp8 KV cache's numbers on the host: `gpu-kernels/src/kv_fp8.rs`, the same file,
//! compiled into both (`include!`), so the CPU twins quantize and dequantize bit for bit as
//! the kernels do; and the whole-row steps the twins and tests are made of.

include!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/gpu-kernels/src/kv_fp8.rs"
));

use crate::tiles::BLOCK_SIZE;

/// One row (a token's key or value head) as e4m3 bytes into `out`, returning its scale byte.
pub fn quantize_row(out: &mut [u8], row: &[f32]) -> u8 {
    let amax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = kv_scale_of(amax);
    let factor = kv_quant_factor(scale);
    for (o, &v) in out.iter_mut().zip(row) {
        *o = kv_e4m3_of(v * factor);
    }
    scale
}

/// A stored value: the e4m3 byte times its row's power of two.
pub fn dequantize(byte: u8, scale: u8) -> f32 {
    kv_e4m3_bits_f32(byte as u32) * kv_dequant_factor(scale)
}

/// Where the scale of (slot, KV head) lives in a layer's scales, `[n_blocks, n_kv_heads,
/// 16]`.
pub fn scale_index(slot: usize, kv_head: usize, n_kv_heads: usize) -> usize {
    (slot / BLOCK_SIZE * n_kv_heads + kv_head) * BLOCK_SIZE + slot % BLOCK_SIZE
}

/// One layer's fp8 cache (`[slots, n_kv_heads, head_dim]` bytes, its scales) as the bf16
/// cache that holds the same values, exactly (4 significant bits times a power of two fit
/// bf16's 8); what the attention kernels make of each tile.
pub fn widen_to_bf16(bytes: &[u8], scales: &[u8], n_kv_heads: usize, head_dim: usize) -> Vec<u16> {
    bytes
        .chunks_exact(head_dim)
        .enumerate()
        .flat_map(|(row, head)| {
            let scale = scales[scale_index(row / n_kv_heads, row % n_kv_heads, n_kv_heads)];
            head.iter()
                .map(move |&b| half::bf16::from_f32(dequantize(b, scale)).to_bits())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::blocks::{e4m3_to_f32, f32_to_e4m3};

    /// The integer rounding the kernels use gives the host's e4m3 byte for every value on a
    /// fine grid of the range, its ties and its subnormals included.
    #[test]
    fn e4m3_rounding_matches_the_hosts() {
        let mut checked = 0;
        for e in -14..=9 {
            for m in 0..4096 {
                let x = (1.0 + m as f32 / 4096.0) * 2f32.powi(e);
                for x in [x, -x] {
                    assert_eq!(kv_e4m3_of(x), f32_to_e4m3(x), "{x}");
                    checked += 1;
                }
            }
        }
        // Every byte's value (and the midpoints between neighbours: ties) round-trips.
        for b in 0u8..=0x7e {
            let v = e4m3_to_f32(b);
            assert_eq!(kv_e4m3_of(v), b);
            assert_eq!(
                kv_e4m3_bits_f32(b as u32) * 2f32.powi(120),
                v,
                "byte {b:#x}"
            );
            let next = e4m3_to_f32(b + 1);
            if b < 0x7e {
                let mid = (v + next) / 2.0;
                assert_eq!(kv_e4m3_of(mid), f32_to_e4m3(mid), "tie {mid}");
            }
        }
        assert_eq!(kv_e4m3_of(0.0), 0);
        assert_eq!(kv_e4m3_of(1e9), 0x7e);
        assert!(checked > 100_000);
    }

    /// The scale is the smallest power of two that brings the row under 448, and the
    /// quantized row is within e4m3's half step (2^-4 of a value, or 2^-10 of the scale
    /// below the normals) of the row.
    #[test]
    fn rows_round_within_half_a_step() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for amax_exp in [-20, -7, -1, 0, 3, 8, 12] {
            let row: Vec<f32> = (0..128)
                .map(|_| rng.random_range(-1.0f32..1.0) * 2f32.powi(amax_exp))
                .collect();
            let mut bytes = vec![0u8; 128];
            let scale = quantize_row(&mut bytes, &row);
            let amax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let k = scale as i32 - 127;
            assert!(
                amax <= 448.0 * 2f32.powi(k) && amax > 224.0 * 2f32.powi(k),
                "{amax} {k}"
            );
            for (&b, &x) in bytes.iter().zip(&row) {
                let y = dequantize(b, scale);
                let step = (x.abs() / 16.0).max(2f32.powi(k - 10));
                assert!((x - y).abs() <= step, "{x} -> {y} (scale 2^{k})");
            }
        }
        // A row of zeros keeps zeros, with the smallest scale.
        let mut bytes = vec![1u8; 4];
        assert_eq!(quantize_row(&mut bytes, &[0.0; 4]), KV_SCALE_MIN);
        assert_eq!(bytes, [0; 4]);
    }

    /// Widening is exact: each stored value is a bf16.
    #[test]
    fn widening_to_bf16_is_exact() {
        let (n_kv_heads, head_dim) = (2, 8);
        let values: Vec<f32> = (0..BLOCK_SIZE * 2 * n_kv_heads * head_dim)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let mut bytes = vec![0u8; values.len()];
        let mut scales = vec![0u8; 2 * n_kv_heads * BLOCK_SIZE];
        for (row, (out, v)) in bytes
            .chunks_exact_mut(head_dim)
            .zip(values.chunks_exact(head_dim))
            .enumerate()
        {
            scales[scale_index(row / n_kv_heads, row % n_kv_heads, n_kv_heads)] =
                quantize_row(out, v);
        }
        let wide = widen_to_bf16(&bytes, &scales, n_kv_heads, head_dim);
        for (i, &w) in wide.iter().enumerate() {
            let row = i / head_dim;
            let s = scales[scale_index(row / n_kv_heads, row % n_kv_heads, n_kv_heads)];
            assert_eq!(f32::from_bits((w as u32) << 16), dequantize(bytes[i], s));
        }
    }
}
