//! A profile as saved and loaded (`--from profile.json`), and the roofline arithmetic.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Prefill,
    Decode,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
        }
    }
}

/// The machine's limits, measured by the same run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ceilings {
    /// Memory bandwidth, bytes per second (a device copy, read + write).
    pub bytes_per_s: f64,
    /// Matrix throughput, FLOP per second (the fastest GEMM the process ran).
    pub flops_per_s: f64,
    /// How each was measured, for the reader.
    pub bandwidth_source: String,
    pub compute_source: String,
    /// rustle's own GEMM on the same shape, FLOP per second, beside the reference.
    pub rustle_gemm_flops_per_s: Option<f64>,
    /// The peak of the tensor instruction of rustle's Ampere-style GEMM (`mma.sync`), FLOP
    /// per second: that GEMM's ceiling, below the reference's on GPUs with newer
    /// instructions (Hopper's `wgmma`, which `gemm_wgmma_bf16` uses).
    #[serde(default)]
    pub mma_peak_flops_per_s: Option<f64>,
}

impl Ceilings {
    /// The intensity (FLOP/byte) where the bandwidth slope meets the compute roof.
    pub fn ridge(&self) -> f64 {
        self.flops_per_s / self.bytes_per_s
    }

    /// The most FLOP/s a kernel of this intensity can reach.
    pub fn attainable(&self, intensity: f64) -> f64 {
        (intensity * self.bytes_per_s).min(self.flops_per_s)
    }
}

/// One kernel in one phase, all its launches summed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    pub kernel: String,
    pub phase: Phase,
    pub calls: usize,
    pub seconds: f64,
    /// Bytes and FLOPs its launches must move and compute (the counting formulas).
    pub bytes: u64,
    pub flops: u64,
}

impl Row {
    pub fn bytes_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds
    }
    pub fn flops_per_s(&self) -> f64 {
        self.flops as f64 / self.seconds
    }
    /// FLOP per byte.
    pub fn intensity(&self) -> f64 {
        self.flops as f64 / self.bytes.max(1) as f64
    }
    /// Whether the bandwidth (below the ridge) or the compute roof binds it.
    pub fn memory_bound(&self, c: &Ceilings) -> bool {
        self.intensity() < c.ridge()
    }
    /// Achieved over what the binding ceiling allows at this intensity.
    pub fn share_of_ceiling(&self, c: &Ceilings) -> f64 {
        if self.memory_bound(c) {
            self.bytes_per_s() / c.bytes_per_s
        } else {
            self.flops_per_s() / c.flops_per_s
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Profile {
    pub device: String,
    pub model: String,
    /// What ran: "prefill of 512 tokens, then 16 decode steps".
    pub workload: String,
    pub ceilings: Ceilings,
    pub rows: Vec<Row>,
}

impl Profile {
    pub fn load(path: &std::path::Path) -> Result<Profile> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        serde_json::from_str(&text).map_err(|e| Error::Format {
            path: path.to_owned(),
            format: "profile JSON",
            reason: e.to_string(),
        })
    }

    pub fn save(&self, path: &std::path::Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("a profile serialises");
        std::fs::write(path, text).map_err(|e| Error::io(path, e))
    }

    /// Total seconds of a phase's kernels.
    pub fn phase_seconds(&self, phase: Phase) -> f64 {
        self.rows
            .iter()
            .filter(|r| r.phase == phase)
            .map(|r| r.seconds)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ceilings() -> Ceilings {
        Ceilings {
            bytes_per_s: 4e12,
            flops_per_s: 800e12,
            bandwidth_source: "test".into(),
            compute_source: "test".into(),
            rustle_gemm_flops_per_s: None,
            mma_peak_flops_per_s: None,
        }
    }

    #[test]
    fn roofline_arithmetic() {
        let c = ceilings();
        assert_eq!(c.ridge(), 200.0);
        assert_eq!(c.attainable(1.0), 4e12);
        assert_eq!(c.attainable(1000.0), 800e12);
        // A decode GEMV: 2 FLOP per 2-byte weight, intensity 1: memory-bound.
        let gemv = Row {
            kernel: "gemv".into(),
            phase: Phase::Decode,
            calls: 1,
            seconds: 1e-3,
            bytes: 2_000_000_000,
            flops: 2_000_000_000,
        };
        assert!(gemv.memory_bound(&c));
        assert_eq!(gemv.share_of_ceiling(&c), 0.5); // 2 TB/s of 4
        // A prefill GEMM at intensity 500: compute-bound.
        let gemm = Row {
            kernel: "gemm".into(),
            phase: Phase::Prefill,
            calls: 1,
            seconds: 1.0,
            bytes: 1_000_000_000_000,
            flops: 500_000_000_000_000,
        };
        assert!(!gemm.memory_bound(&c));
        assert_eq!(gemm.share_of_ceiling(&c), 500e12 / 800e12);
    }
}
