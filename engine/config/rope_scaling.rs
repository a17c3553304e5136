//! RoPE's scaling for long contexts as `config.json` (or GGUF metadata) writes it
//! (`HfRopeScaling`), checked into the form the RoPE tables take (`RopeScaling`).

use serde::Deserialize;

use crate::config::limits;
use crate::error::{Error, Result};

#[derive(Clone, Debug, Default, Deserialize)]
pub struct HfRopeScaling {
    /// Newer files say `rope_type`, older ones `type`.
    pub rope_type: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub factor: Option<f64>,
    pub low_freq_factor: Option<f64>,
    pub high_freq_factor: Option<f64>,
    pub original_max_position_embeddings: Option<usize>,
    /// `longrope`'s divisors of each turning pair's frequency: `short_factor` within the
    /// original context, `long_factor` past it.
    pub short_factor: Option<Vec<f64>>,
    pub long_factor: Option<Vec<f64>>,
    /// `longrope`'s scale of cos and sin (default from the extension's ratio).
    pub attention_factor: Option<f64>,
    /// Only inside `rope_parameters`.
    pub rope_theta: Option<f64>,
    /// Only inside `rope_parameters` (transformers 5).
    pub partial_rotary_factor: Option<f64>,
}

/// How RoPE frequencies are stretched for long contexts.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f64,
    },
    /// Llama 3.1's: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position: usize,
    },
    /// Phi-3's `longrope` (also `su`): each turning pair's frequency divided by its factor,
    /// `short` for a context up to `original_max_position` and `long` past it, and cos and
    /// sin scaled by `attention_factor`.
    LongRope {
        short: Vec<f64>,
        long: Vec<f64>,
        original_max_position: usize,
        attention_factor: f64,
    },
}

/// A number for a message: exponent notation when plain digits would run long.
pub(super) fn shown(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-4..1e6).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        v.to_string()
    }
}

/// What a `longrope` scaling is checked against: the turning pairs its factors cover, and
/// the context it extends (`max_position_embeddings` over the original).
pub(super) struct Extension {
    pub rotary_dim: usize,
    pub max_position: usize,
    pub original_max_position: Option<usize>,
}

pub(super) fn resolve_rope_scaling(
    s: Option<&HfRopeScaling>,
    ext: &Extension,
    name: &dyn Fn(&str) -> String,
) -> Result<RopeScaling> {
    let Some(s) = s else {
        return Ok(RopeScaling::None);
    };
    let kind = s
        .rope_type
        .as_deref()
        .or(s.kind.as_deref())
        .unwrap_or("default");
    let scaling = name("rope_scaling");
    let err = |msg: String| Error::Config(format!("{scaling} {kind:?}: {msg}"));
    // Stretching only: a factor below 1 would squeeze positions together.
    let factor = || match s.factor {
        Some(f) if f >= 1.0 && f.is_finite() => Ok(f),
        Some(f) => Err(err(format!(
            "`factor` is {}; it must be finite and at least 1",
            shown(f)
        ))),
        None => Err(err("missing `factor`".into())),
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: factor()? }),
        "llama3" => {
            let field = |v: Option<f64>, field: &str| match v {
                Some(v) if v > 0.0 && v.is_finite() => Ok(v),
                Some(v) => Err(err(format!(
                    "`{field}` is {}; it must be positive",
                    shown(v)
                ))),
                None => Err(err(format!("missing `{field}`"))),
            };
            let low = field(s.low_freq_factor, "low_freq_factor")?;
            let high = field(s.high_freq_factor, "high_freq_factor")?;
            if high <= low {
                return Err(err(format!(
                    "high_freq_factor {} must exceed low_freq_factor {}",
                    shown(high),
                    shown(low)
                )));
            }
            let original_max_position = match s.original_max_position_embeddings {
                Some(n) if (1..=limits::CONTEXT).contains(&n) => n,
                Some(n) => {
                    return Err(err(format!(
                        "`original_max_position_embeddings` is {n}; it must be 1 to {}",
                        limits::CONTEXT
                    )));
                }
                None => return Err(err("missing `original_max_position_embeddings`".into())),
            };
            Ok(RopeScaling::Llama3 {
                factor: factor()?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position,
            })
        }
        "longrope" | "su" => {
            let original_max_position = match s
                .original_max_position_embeddings
                .or(ext.original_max_position)
            {
                Some(n) if (1..=limits::CONTEXT).contains(&n) => n,
                Some(n) => {
                    return Err(err(format!(
                        "`original_max_position_embeddings` is {n}; it must be 1 to {}",
                        limits::CONTEXT
                    )));
                }
                None => return Err(err("missing `original_max_position_embeddings`".into())),
            };
            let pairs = ext.rotary_dim / 2;
            let factors = |v: &Option<Vec<f64>>, field: &str| match v {
                Some(f) if f.len() != pairs => Err(err(format!(
                    "`{field}` has {} factors; RoPE turns {pairs} pairs of each head",
                    f.len()
                ))),
                Some(f) => match f.iter().find(|x| !(**x > 0.0 && x.is_finite())) {
                    Some(bad) => Err(err(format!(
                        "`{field}` holds {}; factors must be positive",
                        shown(*bad)
                    ))),
                    None => Ok(f.clone()),
                },
                None => Err(err(format!("missing `{field}`"))),
            };
            // transformers' default: the square root of 1 + ln(extension) / ln(original).
            let extension = ext.max_position as f64 / original_max_position as f64;
            let attention_factor = match s.attention_factor {
                Some(a) if a > 0.0 && a.is_finite() => a,
                Some(a) => {
                    return Err(err(format!(
                        "`attention_factor` is {}; it must be positive",
                        shown(a)
                    )));
                }
                None if extension <= 1.0 => 1.0,
                None => (1.0 + extension.ln() / (original_max_position as f64).ln()).sqrt(),
            };
            Ok(RopeScaling::LongRope {
                short: factors(&s.short_factor, "short_factor")?,
                long: factors(&s.long_factor, "long_factor")?,
                original_max_position,
                attention_factor,
            })
        }
        other => Err(Error::Config(format!(
            "{scaling} type {other:?} is not supported (default, linear, llama3, longrope are)"
        ))),
    }
}
