//! The MLP's gated activations: `swiglu_f32` and `geglu_f32`, and their `_bf16` forms (the
//! same, the output also rounded to bf16).

use super::{In, Out, linear, u32_of};
use crate::config::Activation;
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::traffic;

impl Gpu {
    /// `out = act(gate) * up`, all `[n]`: `swiglu_f32` or `geglu_f32` as `act` says, and
    /// where `out_bf16` is given, their `_bf16` form that also writes it rounded.
    pub fn gated(
        &self,
        act: Activation,
        out: &mut Out<f32>,
        out_bf16: Option<&mut Out<u16>>,
        gate: &In<f32>,
        up: &In<f32>,
    ) -> Result<()> {
        match (act, out_bf16) {
            (Activation::Silu, None) => self.swiglu_f32(out, gate, up),
            (Activation::Silu, Some(b)) => self.swiglu_f32_bf16(out, b, gate, up),
            (Activation::GeluTanh, None) => self.geglu_f32(out, gate, up),
            (Activation::GeluTanh, Some(b)) => self.geglu_f32_bf16(out, b, gate, up),
        }
    }

    /// `out = gelu(gate) * up` (GELU's tanh form), all `[n]`.
    pub fn geglu_f32(&self, out: &mut Out<f32>, gate: &In<f32>, up: &In<f32>) -> Result<()> {
        let n = gate.len();
        assert!(up.len() == n && out.len() == n);
        let nn = u32_of(n, "n");
        let traffic = traffic::swiglu_f32(n);
        let mut b = self.launcher(&self.kernels.geglu_f32);
        b.arg(out).arg(gate).arg(up).arg(&nn);
        // SAFETY: all three hold n floats.
        self.timed("geglu_f32", traffic, || unsafe { b.launch(linear(n)) })
    }

    /// `geglu_f32`, also writing the output rounded to bf16 into `out_bf16` (`[n]`).
    pub fn geglu_f32_bf16(
        &self,
        out: &mut Out<f32>,
        out_bf16: &mut Out<u16>,
        gate: &In<f32>,
        up: &In<f32>,
    ) -> Result<()> {
        let n = gate.len();
        assert!(up.len() == n && out.len() == n && out_bf16.len() == n);
        let nn = u32_of(n, "n");
        let t = traffic::swiglu_f32(n);
        let traffic = traffic::Traffic {
            bytes: t.bytes + 2 * n as u64,
            flops: t.flops,
        };
        let mut b = self.launcher(&self.kernels.geglu_f32_bf16);
        b.arg(out).arg(out_bf16).arg(gate).arg(up).arg(&nn);
        // SAFETY: all four hold n values.
        self.timed("geglu_f32_bf16", traffic, || unsafe { b.launch(linear(n)) })
    }

    /// `out = silu(gate) * up`, all `[n]`.
    pub fn swiglu_f32(&self, out: &mut Out<f32>, gate: &In<f32>, up: &In<f32>) -> Result<()> {
        let n = gate.len();
        assert!(up.len() == n && out.len() == n);
        let nn = u32_of(n, "n");
        let traffic = traffic::swiglu_f32(n);
        let mut b = self.launcher(&self.kernels.swiglu_f32);
        b.arg(out).arg(gate).arg(up).arg(&nn);
        // SAFETY: all three hold n floats.
        self.timed("swiglu_f32", traffic, || unsafe { b.launch(linear(n)) })
    }

    /// `swiglu_f32`, also writing the output rounded to bf16 into `out_bf16` (`[n]`): the
    /// down projection's tensor-core input without a rounding launch of its own.
    pub fn swiglu_f32_bf16(
        &self,
        out: &mut Out<f32>,
        out_bf16: &mut Out<u16>,
        gate: &In<f32>,
        up: &In<f32>,
    ) -> Result<()> {
        let n = gate.len();
        assert!(up.len() == n && out.len() == n && out_bf16.len() == n);
        let nn = u32_of(n, "n");
        let t = traffic::swiglu_f32(n);
        let traffic = traffic::Traffic {
            bytes: t.bytes + 2 * n as u64,
            flops: t.flops,
        };
        let mut b = self.launcher(&self.kernels.swiglu_f32_bf16);
        b.arg(out).arg(out_bf16).arg(gate).arg(up).arg(&nn);
        // SAFETY: all four hold n values.
        self.timed("swiglu_f32_bf16", traffic, || unsafe {
            b.launch(linear(n))
        })
    }
}
