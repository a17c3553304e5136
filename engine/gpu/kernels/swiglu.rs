//! `swiglu_f32`.

use super::{In, Out, linear, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::traffic;

impl Gpu {
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
}
