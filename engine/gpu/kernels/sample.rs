//! `sample_f32`, `penalize_f32` and `mask_logits_f32`: each row's next token chosen on the
//! device.

use cudarc::driver::LaunchConfig;

use super::{In, Out, linear, u32_of};
use crate::error::Result;
use crate::gpu::context::Gpu;
use crate::traffic;

/// Threads per row of `sample_f32`: 1024, each owning a slice of the vocabulary.
const SAMPLE_THREADS: u32 = 1024;

/// Threads per mask of `mask_logits_f32`, striding over the vocabulary.
const MASK_THREADS: u32 = 256;

/// Words of a row's parameters: `cpu::ops::SAMPLE_PARAMS`, the kernel's `SAMPLE_PARAMS`.
const PARAMS: usize = crate::cpu::ops::SAMPLE_PARAMS;

impl Gpu {
    /// A token per row drawn as its parameters say: out `[rows]`, logits `[rows, vocab]`,
    /// params `[rows, 6]` (`cpu::ops::sample_params`), steps `[rows]` (each row's draw index).
    pub fn sample_f32(
        &self,
        out: &mut Out<u32>,
        logits: &In<f32>,
        params: &In<u32>,
        steps: &In<u32>,
    ) -> Result<()> {
        let rows = out.len();
        assert!(rows >= 1 && logits.len() >= rows && logits.len().is_multiple_of(rows));
        assert!(params.len() == rows * PARAMS && steps.len() == rows);
        let vocab = logits.len() / rows;
        let cfg = LaunchConfig {
            grid_dim: (u32_of(rows, "rows"), 1, 1),
            block_dim: (SAMPLE_THREADS, 1, 1),
            shared_mem_bytes: (SAMPLE_THREADS / 32) * 8,
        };
        let traffic = traffic::sample_f32(rows, vocab);
        let v = u32_of(vocab, "vocab");
        let mut b = self.launcher(&self.kernels.sample_f32);
        b.arg(out).arg(logits).arg(params).arg(steps).arg(&v);
        // SAFETY: a block of 1024 threads per row with 8 bytes of shared memory per warp;
        // every row holds vocab >= 1 logits, its parameters and its step.
        self.timed("sample_f32", traffic, || unsafe { b.launch(cfg) })
    }

    /// The penalties, in place: logits `[rows, vocab]`, entries `[n, 3]` (row, token, times
    /// generated with bit 31 set for a prompt token), penalties `[rows, 3]` (repeat,
    /// presence, frequency).
    ///
    /// # Safety
    /// Every entry's row is below `rows` and its token below `vocab`, and no `(row, token)`
    /// appears twice (the engine builds them from each request's distinct tokens).
    pub unsafe fn penalize_f32(
        &self,
        logits: &mut Out<f32>,
        entries: &In<u32>,
        penalties: &In<f32>,
        vocab: usize,
    ) -> Result<()> {
        let n = entries.len() / 3;
        assert!(entries.len() == 3 * n && vocab > 0 && logits.len().is_multiple_of(vocab));
        assert!(penalties.len() == 3 * (logits.len() / vocab));
        if n == 0 {
            return Ok(());
        }
        let traffic = traffic::penalize_f32(n);
        let (nn, v) = (u32_of(n, "entries"), u32_of(vocab, "vocab"));
        let mut b = self.launcher(&self.kernels.penalize_f32);
        b.arg(logits).arg(entries).arg(penalties).arg(&nn).arg(&v);
        // SAFETY: one thread per entry; the caller's guarantee covers the indices.
        self.timed("penalize_f32", traffic, || unsafe { b.launch(linear(n)) })
    }

    /// Grammar masks, in place: logits `[rows, vocab]`, masks `[n, ceil(vocab / 32)]` (bit
    /// `t % 32` of word `t / 32` set: token `t` allowed), mask_rows `[n]` (each mask's row).
    ///
    /// # Safety
    /// Every entry of `mask_rows` is below `rows`, and none appears twice.
    pub unsafe fn mask_logits_f32(
        &self,
        logits: &mut Out<f32>,
        masks: &In<u32>,
        mask_rows: &In<u32>,
        vocab: usize,
    ) -> Result<()> {
        let n = mask_rows.len();
        assert!(vocab > 0 && logits.len().is_multiple_of(vocab));
        assert!(masks.len() == n * vocab.div_ceil(32) && n <= logits.len() / vocab);
        if n == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (u32_of(n, "masks"), 1, 1),
            block_dim: (MASK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let traffic = traffic::mask_logits_f32(n, vocab);
        let v = u32_of(vocab, "vocab");
        let mut b = self.launcher(&self.kernels.mask_logits_f32);
        b.arg(logits).arg(masks).arg(mask_rows).arg(&v);
        // SAFETY: one block per mask, each mask `words` long (checked); the caller's
        // guarantee covers the rows.
        self.timed("mask_logits_f32", traffic, || unsafe { b.launch(cfg) })
    }
}
