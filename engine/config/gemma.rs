//! What Gemma 3's configuration adds to Llama's, checked: the MLP's activation, the
//! embedding's scale, the local layers' sliding window and RoPE base, the query's scale, and
//! transformers 5's `rope_parameters` of one RoPE for each kind of layer.

use serde::Deserialize;

use super::limits;
use super::rope_scaling::{HfRopeScaling, shown};
use crate::error::{Error, Result};

/// The fields of `config.json` that Gemma 3 adds (flattened into `HfConfig`).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct HfGemma {
    /// Every `sliding_window_pattern`-th layer global, the others local (older files), or
    /// each layer's kind (`sliding_attention`, `full_attention`).
    pub sliding_window_pattern: Option<usize>,
    pub layer_types: Option<Vec<String>>,
    /// The RoPE base of the local layers.
    pub rope_local_base_freq: Option<f64>,
    /// Attention scores scaled by `query_pre_attn_scalar^-1/2`, not `head_dim`'s.
    pub query_pre_attn_scalar: Option<f64>,
    /// The MLP's activation: Gemma's `gelu_pytorch_tanh` (`hidden_activation`, or
    /// `hidden_act`); SiLU where unset.
    pub hidden_activation: Option<String>,
    pub hidden_act: Option<String>,
    /// Gemma 2's soft caps of the logits and of attention scores, which rustle does not
    /// apply: a model that sets them is refused.
    pub final_logit_softcapping: Option<f64>,
    pub attn_logit_softcapping: Option<f64>,
    /// The weights' dtype (`torch_dtype`, transformers 5's `dtype`): Gemma rounds its
    /// embedding's scale to it.
    pub torch_dtype: Option<String>,
    pub dtype: Option<String>,
}

/// The MLP's gate activation: `down(act(gate x) * up x)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x sigmoid(x)`: SwiGLU (Llama and the others).
    Silu,
    /// GELU's tanh form, `x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`: GeGLU (Gemma).
    GeluTanh,
}

/// Local layers that attend over a sliding window of the last `window` positions (their
/// own included), with a RoPE of their own (Gemma 3) or the global layers' (Mistral, every
/// layer local); the other layers are global.
#[derive(Clone, Debug, PartialEq)]
pub struct Sliding {
    pub window: usize,
    /// `[n_layers]`: which layers are local.
    pub local: Vec<bool>,
    /// The local layers' RoPE base (their frequencies unscaled); `None`: the global layers'
    /// RoPE.
    pub rope_theta: Option<f64>,
}

/// `rope_parameters` as transformers 5 writes it: one set for every layer, or (Gemma 3) one
/// for each kind of layer.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum RopeParameters {
    ByLayerType {
        full_attention: HfRopeScaling,
        sliding_attention: Option<Box<HfRopeScaling>>,
    },
    Every(HfRopeScaling),
}

impl RopeParameters {
    /// The global layers' RoPE (every layer's, where there is one).
    pub fn global(&self) -> &HfRopeScaling {
        match self {
            RopeParameters::ByLayerType { full_attention, .. } => full_attention,
            RopeParameters::Every(p) => p,
        }
    }

    /// The local layers' RoPE, where the file gives one of their own.
    fn local(&self) -> Option<&HfRopeScaling> {
        match self {
            RopeParameters::ByLayerType {
                sliding_attention, ..
            } => sliding_attention.as_deref(),
            RopeParameters::Every(_) => None,
        }
    }
}

/// The activation `hidden_activation` (or `hidden_act`) names; SiLU where neither is set.
pub(super) fn resolve_activation(
    hf: &HfGemma,
    name: &dyn Fn(&str) -> String,
) -> Result<Activation> {
    let (field, value) = match (&hf.hidden_activation, &hf.hidden_act) {
        (Some(a), _) => ("hidden_activation", a),
        (None, Some(a)) => ("hidden_act", a),
        (None, None) => return Ok(Activation::Silu),
    };
    match value.as_str() {
        "silu" | "swish" => Ok(Activation::Silu),
        "gelu_pytorch_tanh" | "gelu_tanh" => Ok(Activation::GeluTanh),
        other => Err(Error::Unsupported(format!(
            "{} is {other:?}; rustle reads silu and gelu_pytorch_tanh",
            name(field)
        ))),
    }
}

/// Gemma's embedding scale, sqrt(hidden), rounded to the weights' dtype as transformers
/// multiplies in it.
pub(super) fn embed_scale(hf: &HfGemma, dim: usize) -> f32 {
    let scale = (dim as f32).sqrt();
    match hf.torch_dtype.as_deref().or(hf.dtype.as_deref()) {
        Some("bfloat16") => half::bf16::from_f32(scale).to_f32(),
        Some("float16") => half::f16::from_f32(scale).to_f32(),
        _ => scale,
    }
}

/// Which of `n_layers` layers are local, over what window (`sliding_window`), and their RoPE
/// base (`rope_parameters`' for the local layers, where the file gives them).
pub(super) fn resolve_sliding(
    hf: &HfGemma,
    sliding_window: Option<usize>,
    rope_parameters: Option<&RopeParameters>,
    n_layers: usize,
    name: &dyn Fn(&str) -> String,
) -> Result<Sliding> {
    let window = sliding_window
        .ok_or_else(|| Error::Config(format!("missing field {}", name("sliding_window"))))?;
    if window == 0 || window > limits::CONTEXT {
        return Err(Error::Config(format!(
            "{} is {window}; it must be 1 to {}",
            name("sliding_window"),
            limits::CONTEXT
        )));
    }
    let local = match (&hf.layer_types, hf.sliding_window_pattern) {
        (Some(types), _) => {
            if types.len() != n_layers {
                return Err(Error::Config(format!(
                    "{} names {} layers; the model has {n_layers}",
                    name("layer_types"),
                    types.len()
                )));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    "sliding_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(Error::Config(format!(
                        "{} holds {other:?}; rustle reads sliding_attention and full_attention",
                        name("layer_types")
                    ))),
                })
                .collect::<Result<Vec<bool>>>()?
        }
        // Every pattern-th layer global (Gemma 3's released models: 6).
        (None, pattern) => {
            let pattern = pattern.unwrap_or(6);
            if pattern == 0 {
                return Err(Error::Config(format!(
                    "{} must be positive",
                    name("sliding_window_pattern")
                )));
            }
            (0..n_layers).map(|l| (l + 1) % pattern != 0).collect()
        }
    };
    let rope_theta = hf
        .rope_local_base_freq
        .or(rope_parameters
            .and_then(|p| p.local())
            .and_then(|p| p.rope_theta))
        .unwrap_or(10000.0);
    if !(rope_theta > 1.0 && rope_theta.is_finite()) {
        return Err(Error::Config(format!(
            "{} is {}; it must be a finite number above 1 such as 10000",
            name("rope_local_base_freq"),
            shown(rope_theta)
        )));
    }
    Ok(Sliding {
        window,
        local,
        rope_theta: Some(rope_theta),
    })
}

/// `sqrt(head_dim / query_pre_attn_scalar)` for Gemma 3 (`gemma`; 1 for the others), and a refusal of
/// the soft caps rustle does not apply.
pub(super) fn query_scale(
    hf: &HfGemma,
    gemma: bool,
    head_dim: usize,
    name: &dyn Fn(&str) -> String,
) -> Result<f32> {
    for (field, cap) in [
        ("final_logit_softcapping", hf.final_logit_softcapping),
        ("attn_logit_softcapping", hf.attn_logit_softcapping),
    ] {
        if cap.is_some() {
            return Err(Error::Unsupported(format!(
                "{} is set: rustle does not cap logits or attention scores (Gemma 2's)",
                name(field)
            )));
        }
    }
    if !gemma {
        return Ok(1.0);
    }
    let scalar = hf.query_pre_attn_scalar.unwrap_or(head_dim as f64);
    if !(scalar >= 1.0 && scalar.is_finite()) {
        return Err(Error::Config(format!(
            "{} is {}; it must be a number of at least 1 such as the head's width",
            name("query_pre_attn_scalar"),
            shown(scalar)
        )));
    }
    Ok((head_dim as f64 / scalar).sqrt() as f32)
}
