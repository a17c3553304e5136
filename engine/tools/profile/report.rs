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
    /// Caches private to each core, smallest first, each with its own bandwidth (the CPU;
    /// none on the GPU). An operation whose bytes per call fit in one works on data the
    /// operation before it left there (the residual stream, a norm's output), so memory's
    /// bandwidth is not its limit: it is placed against the smallest cache that holds them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caches: Vec<CacheCeiling>,
}

/// One cache level's bandwidth, measured by the same run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CacheCeiling {
    /// "L1d", "L2"
    pub name: String,
    /// Capacity per core, bytes.
    pub size: u64,
    /// A copy within it on every core, bytes read + written per second.
    pub bytes_per_s: f64,
}

impl Ceilings {
    /// The intensity (FLOP/byte) where the memory bandwidth slope meets the compute roof.
    pub fn ridge(&self) -> f64 {
        self.flops_per_s / self.bytes_per_s
    }

    /// The most FLOP/s a kernel of this intensity can reach from memory.
    pub fn attainable(&self, intensity: f64) -> f64 {
        self.attainable_at(intensity, self.bytes_per_s)
    }

    /// The most FLOP/s a kernel of this intensity can reach at `bytes_per_s`.
    pub fn attainable_at(&self, intensity: f64, bytes_per_s: f64) -> f64 {
        (intensity * bytes_per_s).min(self.flops_per_s)
    }

    /// The bandwidth a kernel moving `bytes_per_call` per launch is held to, and its name:
    /// the smallest cache that holds them, else memory.
    pub fn bandwidth_for(&self, bytes_per_call: u64) -> (&str, f64) {
        self.caches
            .iter()
            .find(|c| bytes_per_call <= c.size)
            .map_or(("memory", self.bytes_per_s), |c| {
                (c.name.as_str(), c.bytes_per_s)
            })
    }
}

/// `x` with an SI prefix: "23.4 G", "755.4 T", "12.0 " (append the unit).
pub fn si(x: f64) -> String {
    let (v, p) = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(scale, _)| x >= *scale)
        .map_or((x, ""), |(scale, p)| (x / scale, p));
    format!("{v:.1} {p}")
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
    /// Bytes one launch moves, on average.
    pub fn bytes_per_call(&self) -> u64 {
        self.bytes / self.calls.max(1) as u64
    }
    /// The bandwidth ceiling this kernel is held to (memory, or the cache its bytes per call
    /// fit in) and its name.
    pub fn bandwidth<'c>(&self, c: &'c Ceilings) -> (&'c str, f64) {
        c.bandwidth_for(self.bytes_per_call())
    }
    /// Whether a bandwidth (below its ridge) or the compute roof binds it.
    pub fn memory_bound(&self, c: &Ceilings) -> bool {
        self.intensity() * self.bandwidth(c).1 < c.flops_per_s
    }
    /// What binds it: "memory", a cache's name, or "compute".
    pub fn bound(&self, c: &Ceilings) -> String {
        match self.memory_bound(c) {
            true => self.bandwidth(c).0.to_string(),
            false => "compute".into(),
        }
    }
    /// Achieved over what the binding ceiling allows at this intensity.
    pub fn share_of_ceiling(&self, c: &Ceilings) -> f64 {
        if self.memory_bound(c) {
            self.bytes_per_s() / self.bandwidth(c).1
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
            caches: vec![],
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

    #[test]
    fn operations_that_fit_a_cache_meet_its_bandwidth() {
        let mut c = ceilings();
        c.caches = vec![
            CacheCeiling {
                name: "L1d".into(),
                size: 32 << 10,
                bytes_per_s: 40e12,
            },
            CacheCeiling {
                name: "L2".into(),
                size: 1 << 20,
                bytes_per_s: 16e12,
            },
        ];
        let add = |bytes_per_call: u64| Row {
            kernel: "residual_add_f32".into(),
            phase: Phase::Decode,
            calls: 10,
            seconds: 1e-3,
            bytes: 10 * bytes_per_call,
            flops: 10 * bytes_per_call / 12,
        };
        // 12 KiB a call: it fits the L1d, and is held to its bandwidth.
        let small = add(12 << 10);
        assert_eq!(small.bandwidth(&c).0, "L1d");
        assert_eq!(small.bound(&c), "L1d");
        let mid = add(600 << 10);
        assert_eq!(mid.bound(&c), "L2");
        assert!((mid.share_of_ceiling(&c) - mid.bytes_per_s() / 16e12).abs() < 1e-12);
        // Past every cache: memory, as before.
        let big = add(8 << 20);
        assert_eq!(big.bound(&c), "memory");
        assert_eq!(big.share_of_ceiling(&c), big.bytes_per_s() / 4e12);
        // Without caches (the GPU) nothing changes.
        c.caches.clear();
        assert_eq!(small.bound(&c), "memory");
    }

    #[test]
    fn si_prefixes() {
        assert_eq!(si(23.4e9), "23.4 G");
        assert_eq!(si(28.2e9), "28.2 G");
        assert_eq!(si(755.4e12), "755.4 T");
        assert_eq!(si(12.0), "12.0 ");
    }
}
