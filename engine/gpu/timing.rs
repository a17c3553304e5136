//! Timing work on the GPU's stream with CUDA events: what the plan tuning (`gemm_tuning`)
//! and the measuring tools (`tools/`) share.

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
