//! Rotary position embedding tables, computed once on the host in f64.
//!
//! Rotate-half RoPE (the Hugging Face layout): for head dimension d and pair index
//! i < d/2, the pair (x[i], x[i + d/2]) at position p turns by the angle p * inv_freq[i],
//! where inv_freq[i] = theta^(-2i/d), stretched by the model's `rope_scaling`.

use rayon::prelude::*;

use crate::config::{Config, RopeScaling};
use crate::error::{Error, Result};

/// cos and sin of every angle a position up to `n_positions` needs.
pub struct RopeTables {
    /// `[n_positions, head_dim / 2]`
    pub cos: Vec<f32>,
    /// `[n_positions, head_dim / 2]`
    pub sin: Vec<f32>,
    pub half_dim: usize,
}

/// The frequency of each rotating pair, with the model's scaling applied. `freq_factors`
/// are Llama 3.1's divisors as GGUF files store them (`rope_freqs.weight`), one per pair.
pub fn inv_freqs(config: &Config, freq_factors: Option<&[f32]>) -> Vec<f64> {
    let d = config.head_dim as f64;
    let half = config.head_dim / 2;
    (0..half)
        .map(|i| {
            let f = config.rope_theta.powf(-2.0 * i as f64 / d);
            let f = match config.rope_scaling {
                RopeScaling::None => f,
                RopeScaling::Linear { factor } => f / factor,
                RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position,
                } => {
                    let old = original_max_position as f64;
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < old / high_freq_factor {
                        f // high frequencies: kept
                    } else if wavelen > old / low_freq_factor {
                        f / factor // low frequencies: stretched fully
                    } else {
                        // a smooth ramp between the two
                        let smooth = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                }
            };
            match freq_factors {
                Some(ff) => f / ff[i] as f64,
                None => f,
            }
        })
        .collect()
}

impl RopeTables {
    /// Tables for positions `0..n_positions`: size them by the longest sequence the KV pool
    /// holds, not the model's context (which may be millions of positions).
    pub fn new(
        config: &Config,
        n_positions: usize,
        freq_factors: Option<&[f32]>,
    ) -> Result<RopeTables> {
        let inv = inv_freqs(config, freq_factors);
        let half_dim = inv.len();
        let n = n_positions.saturating_mul(half_dim);
        let table = || {
            let mut t = Vec::new();
            t.try_reserve_exact(n).map_err(|_| {
                Error::Usage(format!(
                    "cannot allocate RoPE tables for {n_positions} positions; lower --kv-blocks"
                ))
            })?;
            t.resize(n, 0f32);
            Ok::<_, Error>(t)
        };
        let (mut cos, mut sin) = (table()?, table()?);
        cos.par_chunks_mut(half_dim.max(1))
            .zip(sin.par_chunks_mut(half_dim.max(1)))
            .enumerate()
            .for_each(|(p, (c, s))| {
                for ((c, s), &f) in c.iter_mut().zip(s.iter_mut()).zip(&inv) {
                    let angle = p as f64 * f;
                    *c = angle.cos() as f32;
                    *s = angle.sin() as f32;
                }
            });
        Ok(RopeTables { cos, sin, half_dim })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HfConfig;

    fn config(scaling: &str) -> Config {
        let json = format!(
            r#"{{"model_type": "llama", "hidden_size": 256, "intermediate_size": 1,
                "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 1,
                "max_position_embeddings": 8, "rope_theta": 500000.0 {scaling}}}"#
        );
        let hf: HfConfig = serde_json::from_str(&json).unwrap();
        Config::resolve(&hf).unwrap()
    }

    #[test]
    fn plain_frequencies_and_tables() {
        let c = config("");
        let f = inv_freqs(&c, None);
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        assert!((f[1] - 500000f64.powf(-2.0 / 128.0)).abs() < 1e-15);
        let t = RopeTables::new(&c, 3, None).unwrap();
        // position 2, pair 0: angle 2 radians
        assert!((t.cos[2 * 64] - 2f32.cos()).abs() < 1e-7);
        assert!((t.sin[2 * 64] - 2f32.sin()).abs() < 1e-7);
    }

    #[test]
    fn llama3_scaling_keeps_high_stretches_low() {
        let c = config(
            r#", "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}"#,
        );
        let plain = inv_freqs(&config(""), None);
        let scaled = inv_freqs(&c, None);
        // wavelength 2*pi < 8192/4: kept
        assert_eq!(scaled[0], plain[0]);
        // the lowest frequency has wavelength > 8192: divided by 8
        assert!((scaled[63] - plain[63] / 8.0).abs() < 1e-18);
        // in between: strictly between the two
        let mid = (0..64)
            .find(|&i| {
                let w = 2.0 * std::f64::consts::PI / plain[i];
                w > 2048.0 && w < 8192.0
            })
            .unwrap();
        assert!(scaled[mid] < plain[mid] && scaled[mid] > plain[mid] / 8.0);
    }
}
