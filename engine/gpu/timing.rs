//! Timing work on the GPU's stream with CUDA events: what the plan tuning (`gemm_tuning`)
//! and the measuring tools (`tools/`) share, with the copies of a matrix they rotate among.

use cudarc::driver::CudaSlice;
use cudarc::driver::sys::CUevent_flags;

use super::context::Gpu;
use crate::error::{Error, Result};

/// Median milliseconds of `reps` runs of `f`, timed with CUDA events after one warm-up.
pub fn time_ms(gpu: &Gpu, reps: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let event = || {
        gpu.ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(Error::driver("event"))
    };
    let (start, end) = (event()?, event()?);
    let mut times = vec![];
    for _ in 0..reps {
        start.record(&gpu.stream).map_err(Error::driver("event"))?;
        f()?;
        end.record(&gpu.stream).map_err(Error::driver("event"))?;
        times.push(start.elapsed_ms(&end).map_err(Error::driver("event"))? as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Copies of a matrix of `bytes` to rotate through, so that each launch reads its matrix from
/// memory as a model step does: together well past the L2 (50 MB on the H100, 60 MB on the
/// H200), 2 to 16 of them.
pub fn copies(bytes: usize) -> usize {
    (256usize << 20).div_ceil(bytes).clamp(2, 16)
}

/// `count` bf16 matrices `[n_out, n_in]` of random values scaled by `1 / sqrt(n_in)` (a
/// layer's weights' size), the `i`-th from seed `seed + i`; `what` names them in errors.
pub fn random_matrices(
    gpu: &Gpu,
    count: usize,
    (n_out, n_in): (usize, usize),
    seed: u32,
    what: &str,
) -> Result<Vec<CudaSlice<u16>>> {
    (0..count)
        .map(|i| {
            let mut w = gpu.zeros::<u16>(n_out * n_in, what)?;
            gpu.fill_random_bf16(
                &mut w.as_view_mut(),
                seed + i as u32,
                1.0 / (n_in as f32).sqrt(),
            )?;
            Ok(w)
        })
        .collect()
}
