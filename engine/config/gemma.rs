//! What Gemma 3's configuration adds to Llama's, checked: the MLP's activation, the
//! embedding's scale, the local layers' sliding window and RoPE base, the query's scale, and
//! transformers 5's `rope_parameters` of one RoPE for each kind of layer.

use serde::Deserialize;

use super::rope_scaling::shown;
use super::{Arch, HfConfig, HfRopeScaling};
use crate::error::{Error, Result};

/// The MLP's gate activation: `down(act(gate x) * up x)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x sigmoid(x)`: SwiGLU (Llama and the others).
    Silu,
    /// GELU's tanh form, `x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`: GeGLU (Gemma).
    GeluTanh,
}

/// Local layers that attend over a sliding window of the last `window` positions (their
/// own included), with a RoPE of their own; the other layers are global.
#[derive(Clone, Debug, PartialEq)]
pub struct Sliding {
    pub window: usize,
    /// `[n_layers]`: which layers are local.
    pub local: Vec<bool>,
    /// The local layers' RoPE base (their frequencies unscaled).
    pub rope_theta: f64,
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

impl HfConfig {
    /// The configuration of the model rustle runs: a multimodal Gemma 3's language model
    /// (its `text_config`, the vision tower left out), else this one. Gemma 3's fields that
    /// its files leave to transformers' defaults (`Gemma3TextConfig`'s) are filled in.
    pub fn language_model(self) -> HfConfig {
        let wrapped = self
            .architectures
            .as_ref()
            .and_then(|a| a.first())
            .map(String::as_str)
            == Some("Gemma3ForConditionalGeneration");
        let mut text = match (wrapped, self.text_config.clone()) {
            (true, Some(text)) => HfConfig {
                architectures: Some(vec!["Gemma3ForCausalLM".into()]),
                model_type: Some("gemma3_text".into()),
                bos_token_id: text.bos_token_id.or(self.bos_token_id),
                eos_token_id: text.eos_token_id.clone().or(self.eos_token_id.clone()),
                torch_dtype: text.torch_dtype.clone().or(self.torch_dtype.clone()),
                dtype: text.dtype.clone().or(self.dtype.clone()),
                ..*text
            },
            _ => self,
        };
        if text.model_type.as_deref() == Some("gemma3_text") {
            text.fill_gemma3_defaults();
        }
        text
    }

    /// `Gemma3TextConfig`'s defaults for the fields not set.
    fn fill_gemma3_defaults(&mut self) {
        fn or<T>(field: &mut Option<T>, default: T) {
            field.get_or_insert(default);
        }
        or(&mut self.vocab_size, 262_208);
        or(&mut self.num_attention_heads, 8);
        or(&mut self.num_key_value_heads, 4);
        or(&mut self.head_dim, 256);
        or(&mut self.max_position_embeddings, 131_072);
        or(&mut self.rms_norm_eps, 1e-6);
        or(&mut self.query_pre_attn_scalar, 256.0);
        or(&mut self.sliding_window, 4096);
        or(&mut self.tie_word_embeddings, true);
        if self.hidden_activation.is_none() && self.hidden_act.is_none() {
            self.hidden_activation = Some("gelu_pytorch_tanh".into());
        }
        if self.rope_parameters.is_none() {
            or(&mut self.rope_theta, 1_000_000.0);
            or(&mut self.rope_local_base_freq, 10_000.0);
        }
    }
}

/// The activation `hidden_activation` (or `hidden_act`) names; SiLU where neither is set.
pub(super) fn resolve_activation(
    hf: &HfConfig,
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
pub(super) fn embed_scale(hf: &HfConfig, dim: usize) -> f32 {
    let scale = (dim as f32).sqrt();
    match hf.torch_dtype.as_deref().or(hf.dtype.as_deref()) {
        Some("bfloat16") => half::bf16::from_f32(scale).to_f32(),
        Some("float16") => half::f16::from_f32(scale).to_f32(),
        _ => scale,
    }
}

/// Which of `n_layers` layers are local, over what window, and their RoPE base.
pub(super) fn resolve_sliding(
    hf: &HfConfig,
    n_layers: usize,
    name: &dyn Fn(&str) -> String,
) -> Result<Sliding> {
    let window = hf
        .sliding_window
        .ok_or_else(|| Error::Config(format!("missing field {}", name("sliding_window"))))?;
    if window == 0 {
        return Err(Error::Config(format!(
            "{} must be positive",
            name("sliding_window")
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
        .or(hf
            .rope_parameters
            .as_ref()
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
        rope_theta,
    })
}

/// `sqrt(head_dim / query_pre_attn_scalar)` for Gemma 3 (1 for the others), and a refusal of
/// the soft caps rustle does not apply.
pub(super) fn query_scale(
    hf: &HfConfig,
    arch: Arch,
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
    if arch != Arch::Gemma3 {
        return Ok(1.0);
    }
    let scalar = hf.query_pre_attn_scalar.unwrap_or(head_dim as f64);
    if !(scalar > 0.0 && scalar.is_finite()) {
        return Err(Error::Config(format!(
            "{} is {}; it must be a positive number such as the head's width",
            name("query_pre_attn_scalar"),
            shown(scalar)
        )));
    }
    Ok((head_dim as f64 / scalar).sqrt() as f32)
}
