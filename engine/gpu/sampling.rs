//! Sampling on the device: each row's repetition penalties, grammar mask and draw
//! (`penalize_f32`, `mask_logits_f32`, `sample_f32`) run where the logits are, so that only
//! the chosen ids come back.

use cudarc::driver::CudaSlice;

use super::context::Gpu;
use super::kernels::Out;
use crate::cpu::ops::SAMPLE_PARAMS;
use crate::error::{Error, Result};
use crate::sampler::Choices;

/// `Choices` as the kernels read them, grown to the largest batch seen.
pub struct DeviceSampler {
    /// `[rows, SAMPLE_PARAMS]`
    params: CudaSlice<u32>,
    /// `[rows]`
    steps: CudaSlice<u32>,
    /// `[n, 3]`: (row, token, count) of each penalized token
    entries: CudaSlice<u32>,
    /// `[rows, 3]`
    penalties: CudaSlice<f32>,
    /// `[n, ceil(vocab / 32)]` the constrained rows' grammar masks
    masks: CudaSlice<u32>,
    /// `[n]` each mask's row
    mask_rows: CudaSlice<u32>,
}

/// Grows `buf` to hold `n` values (a power of two, so that growing is rare).
fn grow<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    buf: &mut CudaSlice<T>,
    n: usize,
) -> Result<()> {
    if buf.len() < n {
        *buf = gpu.zeros(n.next_power_of_two(), "sampling parameters")?;
    }
    Ok(())
}

impl DeviceSampler {
    pub fn new(gpu: &Gpu) -> Result<DeviceSampler> {
        let u = || gpu.zeros::<u32>(64, "sampling parameters");
        Ok(DeviceSampler {
            params: u()?,
            steps: u()?,
            entries: u()?,
            penalties: gpu.zeros(64, "sampling parameters")?,
            masks: u()?,
            mask_rows: u()?,
        })
    }

    /// Each row of `logits` (`[rows, vocab]`) penalized and drawn from as `choices` says,
    /// its token into `next_ids` (`[rows]`).
    pub fn sample(
        &mut self,
        gpu: &Gpu,
        next_ids: &mut Out<u32>,
        logits: &mut Out<f32>,
        choices: &Choices,
        vocab: usize,
    ) -> Result<()> {
        let rows = next_ids.len();
        assert!(choices.params.len() == rows * SAMPLE_PARAMS && choices.steps.len() == rows);
        assert!(logits.len() == rows * vocab);
        let s = &gpu.stream;
        let up_err = Error::driver("copying the sampling parameters to the device");
        grow(gpu, &mut self.params, choices.params.len())?;
        grow(gpu, &mut self.steps, rows)?;
        grow(gpu, &mut self.entries, choices.penalty_entries.len())?;
        grow(gpu, &mut self.penalties, choices.penalties.len().max(1))?;
        let params = &mut self.params.slice_mut(..choices.params.len());
        s.memcpy_htod(&choices.params, params).map_err(up_err)?;
        s.memcpy_htod(&choices.steps, &mut self.steps.slice_mut(..rows))
            .map_err(up_err)?;
        if !choices.penalty_entries.is_empty() {
            let n = choices.penalty_entries.len();
            assert!(choices.penalties.len() == 3 * rows);
            assert!(
                choices
                    .penalty_entries
                    .chunks_exact(3)
                    .all(|e| (e[0] as usize) < rows && (e[1] as usize) < vocab),
                "penalty entries outside the batch's rows or the vocabulary"
            );
            s.memcpy_htod(&choices.penalty_entries, &mut self.entries.slice_mut(..n))
                .map_err(up_err)?;
            let penalties = &mut self.penalties.slice_mut(..3 * rows);
            s.memcpy_htod(&choices.penalties, penalties)
                .map_err(up_err)?;
            // SAFETY: rows and tokens checked above; the engine builds each row's entries
            // from its distinct tokens.
            unsafe {
                gpu.penalize_f32(
                    logits,
                    &self.entries.slice(..n),
                    &self.penalties.slice(..3 * rows),
                    vocab,
                )
            }?;
        }
        if !choices.mask_rows.is_empty() {
            let n = choices.mask_rows.len();
            assert!(choices.masks.len() == n * vocab.div_ceil(32));
            let mut seen = vec![false; rows];
            for &r in &choices.mask_rows {
                assert!(
                    (r as usize) < rows && !std::mem::replace(&mut seen[r as usize], true),
                    "a grammar mask outside the batch's rows, or two for one row"
                );
            }
            grow(gpu, &mut self.masks, choices.masks.len())?;
            grow(gpu, &mut self.mask_rows, n)?;
            let masks = &mut self.masks.slice_mut(..choices.masks.len());
            s.memcpy_htod(&choices.masks, masks).map_err(up_err)?;
            s.memcpy_htod(&choices.mask_rows, &mut self.mask_rows.slice_mut(..n))
                .map_err(up_err)?;
            // SAFETY: each mask's row is inside the batch and distinct (checked above).
            unsafe {
                gpu.mask_logits_f32(
                    logits,
                    &self.masks.slice(..choices.masks.len()),
                    &self.mask_rows.slice(..n),
                    vocab,
                )
            }?;
        }
        gpu.sample_f32(
            next_ids,
            &logits.as_view(),
            &self.params.slice(..choices.params.len()),
            &self.steps.slice(..rows),
        )
    }
}
