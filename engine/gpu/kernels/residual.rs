//! `residual_add_f32` and `scale_f32`.

use super::{In, Out, linear, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::traffic;

impl Gpu {
    /// `x += delta`, both `[n]`.
    pub fn residual_add_f32(&self, x: &mut Out<f32>, delta: &In<f32>) -> Result<()> {
        let n = delta.len();
        assert!(x.len() == n);
        let nn = u32_of(n, "n");
        let traffic = traffic::residual_add_f32(n);
        let mut b = self.launcher(&self.kernels.residual_add_f32);
        b.arg(x).arg(delta).arg(&nn);
        // SAFETY: both hold n floats and are different buffers.
        self.timed("residual_add_f32", traffic, || unsafe {
            b.launch(linear(n))
        })
    }

    /// `x *= scale`, `[n]`: Gemma 3's embedding scale.
    pub fn scale_f32(&self, x: &mut Out<f32>, scale: f32) -> Result<()> {
        let n = x.len();
        let nn = u32_of(n, "n");
        let traffic = traffic::scale_f32(n);
        let mut b = self.launcher(&self.kernels.scale_f32);
        b.arg(x).arg(&scale).arg(&nn);
        // SAFETY: x holds n floats.
        self.timed("scale_f32", traffic, || unsafe { b.launch(linear(n)) })
    }
}
