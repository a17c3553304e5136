//! The MLP's gated activations: `swiglu_f32` and `geglu_f32`, and their `_bf16` forms (the
//! same, the output also rounded to bf16), all through `Gpu::gated`.

use super::{In, Out, linear, u32_of};
use crate::config::Activation;
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::traffic;

impl Gpu {
    /// `out = act(gate) * up`, all `[n]`: `swiglu_f32` or `geglu_f32` as `act` says, and
    /// where `out_bf16` (`[n]`) is given, their `_bf16` form that also writes it rounded.
    pub fn gated(
        &self,
        act: Activation,
        out: &mut Out<f32>,
        out_bf16: Option<&mut Out<u16>>,
        gate: &In<f32>,
        up: &In<f32>,
    ) -> Result<()> {
        let n = gate.len();
        assert!(up.len() == n && out.len() == n);
        assert!(out_bf16.as_ref().is_none_or(|b| b.len() == n));
        let k = &self.kernels;
        let (func, name) = match (act, out_bf16.is_some()) {
            (Activation::Silu, false) => (&k.swiglu_f32, "swiglu_f32"),
            (Activation::Silu, true) => (&k.swiglu_f32_bf16, "swiglu_f32_bf16"),
            (Activation::GeluTanh, false) => (&k.geglu_f32, "geglu_f32"),
            (Activation::GeluTanh, true) => (&k.geglu_f32_bf16, "geglu_f32_bf16"),
        };
        let mut traffic = traffic::swiglu_f32(n);
        if out_bf16.is_some() {
            traffic.bytes += 2 * n as u64;
        }
        let nn = u32_of(n, "n");
        let mut b = self.launcher(func);
        b.arg(out);
        if let Some(out_bf16) = out_bf16 {
            b.arg(out_bf16);
        }
        b.arg(gate).arg(up).arg(&nn);
        // SAFETY: every buffer holds n values (checked).
        self.timed(name, traffic, || unsafe { b.launch(linear(n)) })
    }
}
