//! Timing shared by the tools: a median over CUDA-event-timed repetitions, and launches
//! summed by kernel.

use serde::Serialize;

#[cfg(feature = "probes")]
use crate::error::{Error, Result};
#[cfg(feature = "probes")]
use crate::gpu::Gpu;
pub use crate::gpu::timing::time_ms;
use crate::traffic::KernelTime;

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
