//! Rotary position embedding tables, computed once on the host in f64.
//!
//! Rotate-half RoPE (the Hugging Face layout): for head dimension d and pair index
//! i < d/2, the pair (x[i], x[i + d/2]) at position p turns by the angle p * inv_freq[i],
//! where inv_freq[i] = theta^(-2i/d), stretched by the model's `rope_scaling`.
//!
//! A model that turns only the first r < d dimensions of a head (`partial_rotary_factor`)
//! pairs (x[i], x[i + r/2]) for i < r/2 and leaves the rest. The kernels pair i with
//! i + d/2 for every head; the loader reorders each query and key head's rows so that HF's
//! pair (i, i + r/2) lands on (i, i + d/2) (`model::HeadOrder`), and these tables turn pairs
//! r/2 and up by nothing: cos 1, sin 0. A dot product of a query and a key is the same in
//! any order of their dimensions, so attention is unchanged.

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

/// The frequency of each pair of the kernels' layout (`head_dim / 2` of them), with the
/// model's scaling applied, for sequences of up to `n_positions`; pairs past the turning
/// ones (`rotary_dim / 2`) have frequency 0. `freq_factors` are Llama 3.1's divisors as GGUF
/// files store them (`rope_freqs.weight`), one per turning pair.
pub fn inv_freqs(config: &Config, freq_factors: Option<&[f32]>, n_positions: usize) -> Vec<f64> {
    let d = config.rotary_dim as f64;
    let turning = config.rotary_dim / 2;
    (0..config.head_dim / 2)
        .map(|i| {
            if i >= turning {
                return 0.0;
            }
            let f = config.rope_theta.powf(-2.0 * i as f64 / d);
            let f = match &config.rope_scaling {
                RopeScaling::None => f,
                RopeScaling::Linear { factor } => f / factor,
                &RopeScaling::Llama3 {
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
                // One set of factors for the whole run, chosen by the longest sequence it
                // holds (as llama.cpp chooses by its context): transformers switches to the
                // long ones once a sequence passes the original context, recomputing every
                // position, which a cache of earlier keys cannot.
                RopeScaling::LongRope {
                    short,
                    long,
                    original_max_position,
                    ..
                } => match n_positions > *original_max_position {
                    true => f / long[i],
                    false => f / short[i],
                },
            };
            match freq_factors {
                Some(ff) => f / ff[i] as f64,
                None => f,
            }
        })
        .collect()
}

impl RopeTables {
    /// The local layers' tables (`Config::sliding`: their own base, unscaled), where the
    /// model has local layers with a RoPE of their own.
    pub fn local(config: &Config, n_positions: usize) -> Result<Option<RopeTables>> {
        let Some(theta) = config.sliding.as_ref().and_then(|s| s.rope_theta) else {
            return Ok(None);
        };
        let local = Config {
            rope_theta: theta,
            rope_scaling: RopeScaling::None,
            ..config.clone()
        };
        RopeTables::new(&local, n_positions, None).map(Some)
    }

    /// Tables for positions `0..n_positions`: size them by the longest sequence the KV pool
    /// holds, not the model's context (which may be millions of positions).
    pub fn new(
        config: &Config,
        n_positions: usize,
        freq_factors: Option<&[f32]>,
    ) -> Result<RopeTables> {
        let inv = inv_freqs(config, freq_factors, n_positions);
        let half_dim = inv.len();
        // `longrope` scales cos and sin of the turning pairs (so q . k by its square there).
        let scale = match config.rope_scaling {
            RopeScaling::LongRope {
                attention_factor, ..
            } => attention_factor,
            _ => 1.0,
        };
        let turning = config.rotary_dim / 2;
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
                for (i, ((c, s), &f)) in c.iter_mut().zip(s.iter_mut()).zip(&inv).enumerate() {
                    let angle = p as f64 * f;
                    let scale = if i < turning { scale } else { 1.0 };
                    *c = (angle.cos() * scale) as f32;
                    *s = (angle.sin() * scale) as f32;
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
        let f = inv_freqs(&c, None, 8);
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
        let plain = inv_freqs(&config(""), None, 8);
        let scaled = inv_freqs(&c, None, 8);
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

    #[test]
    fn partial_rotary_and_longrope() {
        // Heads of 128 (256 / 2), of which 64 turn: 32 turning pairs, then 32 that stay.
        let c = config(
            r#", "partial_rotary_factor": 0.5, "original_max_position_embeddings": 4,
                "rope_scaling": {"rope_type": "longrope", "short_factor": SHORT,
                                 "long_factor": LONG}"#
                .replace("SHORT", &format!("{:?}", vec![2.0; 32]))
                .replace("LONG", &format!("{:?}", vec![8.0; 32]))
                .as_str(),
        );
        assert_eq!((c.head_dim, c.rotary_dim), (128, 64));
        let base = |i: usize| 500000f64.powf(-2.0 * i as f64 / 64.0);
        // Up to the original context of 4 the short factors, past it the long ones.
        let short = inv_freqs(&c, None, 4);
        let long = inv_freqs(&c, None, 5);
        assert_eq!(short.len(), 64);
        assert!((short[1] - base(1) / 2.0).abs() < 1e-18);
        assert!((long[1] - base(1) / 8.0).abs() < 1e-18);
        assert!(short[32..].iter().chain(&long[32..]).all(|&f| f == 0.0));
        // cos and sin of the turning pairs scaled by sqrt(1 + ln(8 / 4) / ln(4)); the rest
        // turn by nothing.
        let t = RopeTables::new(&c, 8, None).unwrap();
        let scale = (1.0 + 2f64.ln() / 4f64.ln()).sqrt();
        let angle = 3.0 * base(1) / 8.0;
        assert!((t.cos[3 * 64 + 1] as f64 - angle.cos() * scale).abs() < 1e-6);
        assert!((t.sin[3 * 64 + 1] as f64 - angle.sin() * scale).abs() < 1e-6);
        assert_eq!((t.cos[3 * 64 + 40], t.sin[3 * 64 + 40]), (1.0, 0.0));
    }
}
