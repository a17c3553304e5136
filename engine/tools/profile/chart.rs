//! The roofline chart: log-log, arithmetic intensity (FLOP/byte) against FLOP/s, the
//! bandwidth slope and the compute roof as measured, one point per kernel and phase.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::FontStyle;

use super::report::{Phase, Profile, si};
use crate::error::{Error, Result};

/// The chart's font, from the `dejavu` crate: no system fonts needed, on any machine.
fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
    });
}

/// Writes `roofline.svg` and `roofline.png` into `dir`; returns their paths.
pub fn write(p: &Profile, dir: &Path) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    register_font();
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let (svg, png) = (dir.join("roofline.svg"), dir.join("roofline.png"));
    let chart_err = |path: &Path| {
        let path = path.to_owned();
        move |e: String| Error::Format {
            path: path.clone(),
            format: "chart",
            reason: e,
        }
    };
    draw(p, SVGBackend::new(&svg, (1200, 800)).into_drawing_area()).map_err(chart_err(&svg))?;
    draw(p, BitMapBackend::new(&png, (1200, 800)).into_drawing_area()).map_err(chart_err(&png))?;
    Ok((svg, png))
}

fn draw<DB: DrawingBackend>(
    p: &Profile,
    area: DrawingArea<DB, plotters::coord::Shift>,
) -> std::result::Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(e)?;
    let c = &p.ceilings;
    // Kernels that do no arithmetic (copies, gathers) have no place on a log intensity axis;
    // the table lists them.
    let points: Vec<_> = p
        .rows
        .iter()
        .filter(|r| r.flops > 0 && r.bytes > 0 && r.seconds > 0.0)
        .collect();
    let lo_i = points
        .iter()
        .map(|r| r.intensity())
        .fold(c.ridge(), f64::min)
        / 4.0;
    let hi_i = points
        .iter()
        .map(|r| r.intensity())
        .fold(c.ridge(), f64::max)
        * 4.0;
    let lo_f = points
        .iter()
        .map(|r| r.flops_per_s())
        .fold(c.attainable(lo_i), f64::min)
        / 4.0;
    let hi_f = c.flops_per_s * 3.0;
    let mut chart = ChartBuilder::on(&area)
        .caption(
            format!("Roofline: {} on {}", p.model, p.device),
            ("sans-serif", 26),
        )
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d((lo_i..hi_i).log_scale(), (lo_f..hi_f).log_scale())
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("arithmetic intensity (FLOP / byte)")
        .y_desc("FLOP / s")
        .y_label_formatter(&|v| format!("{:.0e}", v))
        .x_label_formatter(&|v| format!("{v:.2}"))
        .label_style(("sans-serif", 16))
        .draw()
        .map_err(e)?;
    // The roof: bandwidth slope up to the ridge, compute roof after.
    let roof: Vec<(f64, f64)> = (0..=200)
        .map(|k| lo_i * (hi_i / lo_i).powf(k as f64 / 200.0))
        .map(|i| (i, c.attainable(i)))
        .collect();
    chart
        .draw_series(LineSeries::new(roof, BLACK.stroke_width(3)))
        .map_err(e)?
        .label(format!(
            "measured roof: memory {}B/s, compute {}FLOP/s",
            si(c.bytes_per_s),
            si(c.flops_per_s)
        ))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(3)));
    // Each cache's slope (CPU): the roof of the operations whose bytes per call fit in it,
    // drawn hollow.
    let cache_colors = [RGBColor(44, 160, 44), RGBColor(148, 103, 189)];
    for (k, color) in c.caches.iter().zip(cache_colors.into_iter().cycle()) {
        let slope: Vec<(f64, f64)> = (0..=200)
            .map(|j| lo_i * (hi_i / lo_i).powf(j as f64 / 200.0))
            .map(|i| (i, c.attainable_at(i, k.bytes_per_s)))
            .collect();
        chart
            .draw_series(DashedLineSeries::new(slope, 8, 5, color.stroke_width(2)))
            .map_err(e)?
            .label(format!(
                "{} cache ({} KiB a core): {}B/s (hollow points)",
                k.name,
                k.size >> 10,
                si(k.bytes_per_s)
            ))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    // The tensor instruction rustle's GEMM is written with has its own, lower roof on GPUs
    // whose reference GEMM uses a newer one (wgmma on Hopper).
    if let Some(peak) = c.mma_peak_flops_per_s.filter(|&p| p < c.flops_per_s) {
        let grey = RGBColor(120, 120, 120);
        let from = peak / c.bytes_per_s;
        chart
            .draw_series(LineSeries::new(
                [(from, peak), (hi_i, peak)],
                grey.stroke_width(2),
            ))
            .map_err(e)?
            .label(format!("mma.sync peak: {}FLOP/s", si(peak)))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(2))
            });
    }
    for (phase, color) in [
        (Phase::Prefill, RGBColor(31, 119, 180)),
        (Phase::Decode, RGBColor(255, 127, 14)),
    ] {
        let ps: Vec<_> = points.iter().filter(|r| r.phase == phase).collect();
        chart
            .draw_series(ps.iter().map(|r| {
                // Hollow: held to a cache's bandwidth, not memory's.
                let style = match r.bandwidth(c).0 {
                    "memory" => color.filled(),
                    _ => color.stroke_width(2),
                };
                Circle::new((r.intensity(), r.flops_per_s()), 7, style)
            }))
            .map_err(e)?
            .label(phase.name())
            .legend(move |(x, y)| Circle::new((x + 10, y), 6, color.filled()));
        chart
            .draw_series(ps.iter().map(|r| {
                Text::new(
                    r.kernel.clone(),
                    (r.intensity(), r.flops_per_s() * 1.25),
                    ("sans-serif", 14).into_font().color(&color),
                )
            }))
            .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(e)?;
    area.present().map_err(e)?;
    Ok(())
}
