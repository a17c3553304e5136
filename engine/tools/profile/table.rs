//! The profile as a table: where the time went, and how close each kernel came to the ceiling
//! that binds it.

use std::fmt::Write;

use super::report::{Phase, Profile, si};

pub fn render(p: &Profile) -> String {
    let c = &p.ceilings;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "rustle profile: {} on {}: {}",
        p.model, p.device, p.workload
    );
    let _ = writeln!(
        s,
        "  ceilings: memory {}B/s ({}); compute {}FLOP/s ({}){}; ridge {:.1} FLOP/byte",
        si(c.bytes_per_s),
        c.bandwidth_source,
        si(c.flops_per_s),
        c.compute_source,
        c.rustle_gemm_flops_per_s.map_or(String::new(), |r| format!(
            "; rustle's GEMM {}FLOP/s",
            si(r)
        )) + &c.mma_peak_flops_per_s.map_or(String::new(), |m| format!(
            " (mma.sync peak {}FLOP/s, the ceiling of an Ampere-style GEMM)",
            si(m)
        )),
        c.ridge()
    );
    if !c.caches.is_empty() {
        let caches: Vec<String> = c
            .caches
            .iter()
            .map(|k| {
                format!(
                    "{} ({} KiB a core) {}B/s",
                    k.name,
                    k.size >> 10,
                    si(k.bytes_per_s)
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "  caches: {} (a copy within each, every core); an operation whose bytes per call \
             fit one is held to its bandwidth: the bound column names it",
            caches.join(", ")
        );
    }
    for phase in [Phase::Prefill, Phase::Decode] {
        let rows: Vec<_> = p.rows.iter().filter(|r| r.phase == phase).collect();
        if rows.is_empty() {
            continue;
        }
        let total = p.phase_seconds(phase);
        let _ = writeln!(
            s,
            "  {:<22} {:<7} {:>6} {:>10} {:>6} {:>8} {:>9} {:>9} {:>8} {:>8}",
            "kernel",
            "phase",
            "calls",
            "ms",
            "share",
            "GB/s",
            "GFLOP/s",
            "FLOP/B",
            "of roof",
            "bound"
        );
        for r in rows {
            let _ = writeln!(
                s,
                "  {:<22} {:<7} {:>6} {:>10.3} {:>5.1}% {:>8.0} {:>9.1} {:>9.2} {:>7.1}% {:>8}",
                r.kernel,
                phase.name(),
                r.calls,
                r.seconds * 1e3,
                100.0 * r.seconds / total,
                r.bytes_per_s() / 1e9,
                r.flops_per_s() / 1e9,
                r.intensity(),
                100.0 * r.share_of_ceiling(c),
                r.bound(c)
            );
        }
        let bytes: u64 = p
            .rows
            .iter()
            .filter(|r| r.phase == phase)
            .map(|r| r.bytes)
            .sum();
        let flops: u64 = p
            .rows
            .iter()
            .filter(|r| r.phase == phase)
            .map(|r| r.flops)
            .sum();
        let _ = writeln!(
            s,
            "  {:<22} {:<7} {:>6} {:>10.3} {:>6} {:>8.0} {:>9.1} {:>9.2}\n",
            "total",
            phase.name(),
            "",
            total * 1e3,
            "",
            bytes as f64 / total / 1e9,
            flops as f64 / total / 1e9,
            flops as f64 / bytes.max(1) as f64
        );
    }
    s
}
