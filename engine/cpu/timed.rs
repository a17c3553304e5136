//! The reference operations as the forward pass calls them: each delegates to its function in
//! `ops` and, while a profile is being recorded, times it and counts its traffic, so the
//! forward reads the same with or without the profiler.

use std::time::Instant;

use super::ops;
use crate::traffic::{self, KernelTime, Traffic};

#[derive(Default)]
pub struct Ops {
    /// Every operation since `profile_start`, while profiling.
    record: Option<Vec<KernelTime>>,
}

impl Ops {
    pub fn profile_start(&mut self) {
        self.record = Some(vec![]);
    }

    pub fn profile_stop(&mut self) -> Vec<KernelTime> {
        self.record.take().unwrap_or_default()
    }

    fn run(&mut self, kernel: &'static str, traffic: impl FnOnce() -> Traffic, op: impl FnOnce()) {
        let Some(record) = self.record.as_mut() else {
            return op();
        };
        let start = Instant::now();
        op();
        let ms = start.elapsed().as_secs_f64() * 1e3;
        record.push(KernelTime {
            kernel,
            ms,
            traffic: traffic(),
        });
    }

    pub fn embedding_f32(&mut self, out: &mut [f32], table: &[f32], tokens: &[u32], dim: usize) {
        let n = tokens.len();
        self.run(
            "embedding_f32",
            || traffic::embedding_f32(n, dim),
            || ops::embedding_f32(out, table, tokens, dim),
        );
    }

    pub fn rmsnorm_f32(&mut self, out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
        let (rows, dim) = (x.len() / weight.len(), weight.len());
        self.run(
            "rmsnorm_f32",
            || traffic::rmsnorm_f32(rows, dim),
            || ops::rmsnorm_f32(out, x, weight, eps),
        );
    }

    pub fn matmul_f32(
        &mut self,
        out: &mut [f32],
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        n_in: usize,
    ) {
        let (n, n_out) = (x.len() / n_in, w.len() / n_in);
        let t = move || traffic::matmul_f32(n, n_in, n_out, bias.is_some());
        self.run("matmul_f32", t, || ops::matmul_f32(out, x, w, bias, n_in));
    }

    #[allow(clippy::too_many_arguments)]
    pub fn rope_f32(
        &mut self,
        x: &mut [f32],
        positions: &[u32],
        cos: &[f32],
        sin: &[f32],
        n_heads: usize,
        head_dim: usize,
    ) {
        let n = positions.len();
        self.run(
            "rope_f32",
            || traffic::rope_f32(n, n_heads, head_dim),
            || ops::rope_f32(x, positions, cos, sin, n_heads, head_dim),
        );
    }

    pub fn kv_write_f32(
        &mut self,
        k_cache: &mut [f32],
        v_cache: &mut [f32],
        k: &[f32],
        v: &[f32],
        slots: &[u32],
        kv_dim: usize,
    ) {
        let n = slots.len();
        self.run(
            "kv_write_f32",
            || traffic::kv_write_f32(n, kv_dim),
            || ops::kv_write_f32(k_cache, v_cache, k, v, slots, kv_dim),
        );
    }

    #[allow(clippy::too_many_arguments)]
    pub fn attention_f32(
        &mut self,
        out: &mut [f32],
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        block_tables: &[u32],
        token_seq: &[u32],
        positions: &[u32],
        max_blocks: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) {
        let attended: usize = positions.iter().map(|&p| p as usize + 1).sum();
        let n = positions.len();
        self.run(
            "attention_f32",
            || traffic::attention_f32(attended, n, n_heads, n_kv_heads, head_dim),
            || {
                ops::attention_f32(
                    out,
                    q,
                    k_cache,
                    v_cache,
                    block_tables,
                    token_seq,
                    positions,
                    max_blocks,
                    n_heads,
                    n_kv_heads,
                    head_dim,
                )
            },
        );
    }

    pub fn swiglu_f32(&mut self, out: &mut [f32], gate: &[f32], up: &[f32]) {
        let n = gate.len();
        self.run(
            "swiglu_f32",
            || traffic::swiglu_f32(n),
            || ops::swiglu_f32(out, gate, up),
        );
    }

    pub fn residual_add_f32(&mut self, x: &mut [f32], delta: &[f32]) {
        let n = delta.len();
        self.run(
            "residual_add_f32",
            || traffic::residual_add_f32(n),
            || ops::residual_add_f32(x, delta),
        );
    }
}
