//! `route_experts_f32` and `combine_experts_f32`: a mixture of experts' routing on the
//! device, and its experts' outputs added back (`gpu-kernels/src/route.rs`).

use cudarc::driver::LaunchConfig;

use super::{In, Out, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::kernel_args::{RouteShape, Routing};
use crate::tiles::{ROUTE_MAX_THREADS, route_shared_bytes};
use crate::traffic;

/// The routing's buffers on the device, as the kernel writes them.
pub type RoutingOut<'a> = Routing<Out<'a, u32>, Out<'a, f32>>;

impl Gpu {
    /// `route_experts_f32`: the `shape.top_k` experts of each of `shape.n_tokens` tokens
    /// from their router `logits` (`[n_tokens, n_experts]`), and the pairs grouped by expert
    /// into `r` (`kernel_args::Routing` gives the shapes).
    pub fn route_experts_f32(
        &self,
        logits: &In<f32>,
        r: &mut RoutingOut,
        shape: RouteShape,
    ) -> Result<()> {
        let [n, experts, k] = shape.sizes();
        let pairs = shape.pairs();
        assert!(
            0 < k && k <= experts && n > 0,
            "top {k} of {experts} experts"
        );
        assert!(logits.len() >= n * experts);
        for (buffer, len) in [(&r.choice, pairs), (&r.index, pairs), (&r.pair_of, pairs)] {
            assert!(buffer.len() >= len);
        }
        assert!(r.choice_weight.len() >= pairs);
        assert!(r.run_expert.len() >= experts && r.run_start.len() > experts);
        // The most warps whose rows of probabilities fit the default 48 KiB.
        let fits = |warps: usize| route_shared_bytes(warps, experts, pairs) <= 48 * 1024;
        let warps = [ROUTE_MAX_THREADS / 32, 16, 8, 4]
            .into_iter()
            .find(|&w| fits(w))
            .unwrap_or_else(|| panic!("{experts} experts' routing outgrows shared memory"));
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (32 * warps as u32, 1, 1),
            shared_mem_bytes: route_shared_bytes(warps, experts, pairs) as u32,
        };
        let mut b = self.launcher(&self.kernels.route_experts_f32);
        b.arg(logits)
            .arg(&r.choice)
            .arg(&r.choice_weight)
            .arg(&r.index)
            .arg(&r.run_expert)
            .arg(&r.run_start)
            .arg(&r.pair_of)
            .arg(&shape);
        // SAFETY: every buffer holds what the shape asks (checked), each its own (Rust's
        // borrows); one block with the shared memory its warps and experts need.
        self.timed(
            "route_experts_f32",
            traffic::route_experts_f32(n, experts, k),
            || unsafe { b.launch(cfg) },
        )
    }

    /// `combine_experts_f32`: `x[t] += sum over s of choice_weight[t, s] * rows[pair_of[t,
    /// s]]`, `x` `[n_tokens, dim]`, `rows` `[n_tokens * top_k, dim]`.
    ///
    /// # Safety
    /// Every `pair_of` is below `n_tokens * top_k` (`route_experts_f32` makes them so).
    pub unsafe fn combine_experts_f32(
        &self,
        x: &mut Out<f32>,
        rows: &In<f32>,
        (pair_of, choice_weight): (&In<u32>, &In<f32>),
        dim: usize,
        top_k: usize,
    ) -> Result<()> {
        let n = x.len() / dim;
        assert!(n > 0 && x.len() == n * dim && rows.len() >= n * top_k * dim);
        assert!(pair_of.len() >= n * top_k && choice_weight.len() >= n * top_k);
        let (d, k) = (u32_of(dim, "dim"), u32_of(top_k, "top_k"));
        let cfg = LaunchConfig {
            grid_dim: (dim.div_ceil(256) as u32, n as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&self.kernels.combine_experts_f32);
        b.arg(x).arg(rows).arg(pair_of).arg(choice_weight);
        b.arg(&d).arg(&k);
        // SAFETY: the buffers hold the shapes (checked), the pairs inside rows (the
        // caller's); x is none of the inputs (Rust's borrows); the grid's y is n.
        self.timed(
            "combine_experts_f32",
            traffic::combine_experts_f32(n, dim, top_k),
            || unsafe { b.launch(cfg) },
        )
    }
}
