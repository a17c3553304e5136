//! `rustle profile`: every kernel of a prefill and of decode steps placed against the
//! machine's two limits, memory bandwidth and matrix throughput, both measured in the same
//! run. Decode's kernels land on the bandwidth slope, prefill's matmuls near the compute roof.
//!
//! - `report`: the saved profile (JSON) and what follows from it (intensity, bound, share)
//! - `table`: the table on stdout
//! - `chart`: the roofline, as SVG and PNG
//! - `collect`: running the model on the GPU or the CPU with every launch timed

pub mod chart;
pub mod collect;
pub mod report;
pub mod table;

pub use report::{CacheCeiling, Ceilings, Phase, Profile, Row};
