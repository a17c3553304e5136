//! Timing shared by the tools: a median over CUDA-event-timed repetitions, and launches
//! summed by kernel.

use cudarc::driver::sys::CUevent_flags;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::traffic::KernelTime;

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

/// Median milliseconds of `reps` replays of `launches` captured once as a CUDA graph
/// (`what` names it in errors): launches as a decode step replays them. Used by the
/// probes alone (`--features probes`).
#[cfg(feature = "probes")]
pub fn time_graph_ms(
    gpu: &Gpu,
    reps: usize,
    what: &str,
    launches: &mut dyn FnMut() -> Result<()>,
) -> Result<f64> {
    use crate::gpu::context::capture_graph;
    let graph = capture_graph(&gpu.stream, what, launches)?;
    time_ms(gpu, reps, &mut || {
        graph
            .launch()
            .map_err(Error::driver(&format!("replaying {what}")))
    })
}

/// One kernel's launches (or one CPU operation's calls), summed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelRow {
    pub kernel: String,
    pub calls: usize,
    pub us: f64,
    /// Bytes the launches must move, by the formulas beside the launch wrappers
    /// (`traffic.rs`).
    pub bytes: u64,
    pub flops: u64,
}

/// Timed launches summed by kernel, the most time first.
pub fn by_kernel(launches: impl IntoIterator<Item = KernelTime>) -> Vec<KernelRow> {
    let mut kernels: Vec<KernelRow> = vec![];
    for l in launches {
        let i = match kernels.iter().position(|r| r.kernel == l.kernel) {
            Some(i) => i,
            None => {
                kernels.push(KernelRow {
                    kernel: l.kernel.into(),
                    calls: 0,
                    us: 0.0,
                    bytes: 0,
                    flops: 0,
                });
                kernels.len() - 1
            }
        };
        let row = &mut kernels[i];
        row.calls += 1;
        row.us += l.ms * 1e3;
        row.bytes += l.traffic.bytes;
        row.flops += l.traffic.flops;
    }
    kernels.sort_by(|a, b| b.us.total_cmp(&a.us));
    kernels
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::Traffic;

    #[test]
    fn by_kernel_sums_each_kernel_slowest_first() {
        let t = |kernel, ms, bytes, flops| KernelTime {
            kernel,
            ms,
            traffic: Traffic { bytes, flops },
        };
        let rows = by_kernel([t("a", 1.0, 10, 20), t("b", 4.0, 1, 0), t("a", 2.0, 10, 20)]);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].kernel.as_str(), rows[0].us), ("b", 4000.0));
        assert_eq!(
            (rows[1].calls, rows[1].us, rows[1].bytes, rows[1].flops),
            (2, 3000.0, 20, 40)
        );
    }
}
