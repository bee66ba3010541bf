//! SVG charts drawn with `plotters` (its SVG backend only: no font files or native
//! libraries; text is left to the viewer's sans-serif font):
//! - `mica bench --chart FILE`: tokens/s of each test, one bar per thread count, with the
//!   repetitions' standard deviation;
//! - `mica perplexity --kl-base M --kl-chart FILE`: the histogram of per-token
//!   KL-divergences, on logarithmic bins.

use anyhow::{Result, anyhow};
use plotters::prelude::*;
use std::path::Path;

/// One bar of [`bench_chart`].
#[derive(Debug, Clone, PartialEq)]
pub struct BenchBar {
    /// The test, as `mica bench` names it (`pp512`, `tg128`, …).
    pub test: String,
    pub threads: usize,
    /// Mean tokens/s and its standard deviation over the repetitions.
    pub avg: f64,
    pub std: f64,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(43, 108, 176),
    RGBColor(221, 107, 32),
    RGBColor(56, 161, 105),
    RGBColor(128, 90, 213),
    RGBColor(197, 48, 48),
    RGBColor(113, 128, 150),
];

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart: {e:?}")
}

/// Tokens/s per test (x) and thread count (bars side by side, a color each), logarithmic y
/// (prompt and generation speeds differ by an order of magnitude).
pub fn bench_chart(path: &Path, title: &str, bars: &[BenchBar]) -> Result<()> {
    anyhow::ensure!(!bars.is_empty(), "no results to draw");
    let mut tests: Vec<&str> = Vec::new();
    let mut threads: Vec<usize> = Vec::new();
    for b in bars {
        if !tests.contains(&b.test.as_str()) {
            tests.push(&b.test);
        }
        if !threads.contains(&b.threads) {
            threads.push(b.threads);
        }
    }
    threads.sort_unstable();
    let hi = bars.iter().map(|b| b.avg + b.std).fold(1.0f64, f64::max) * 2.0;
    let lo = bars
        .iter()
        .map(|b| (b.avg - b.std).max(b.avg * 0.5))
        .fold(f64::MAX, f64::min)
        .max(1e-3)
        / 2.0;
    let width = (160 + 110 * tests.len() as u32 * threads.len().min(4) as u32).clamp(480, 1600);
    let root = SVGBackend::new(path, (width, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let n = tests.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 14))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), (lo..hi).log_scale())
        .map_err(err)?;
    let names: Vec<String> = tests.iter().map(|s| s.to_string()).collect();
    let label = move |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
            names[i as usize].clone()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n.max(2))
        .x_label_formatter(&label)
        .y_desc("tokens/s (log scale)")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(err)?;
    let group = 0.8;
    let w = group / threads.len() as f64;
    for (k, &t) in threads.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let mine: Vec<(f64, &BenchBar)> = bars
            .iter()
            .filter(|b| b.threads == t)
            .map(|b| {
                let i = tests.iter().position(|x| *x == b.test).unwrap_or(0) as f64;
                (i - group / 2.0 + w * (k as f64 + 0.5), b)
            })
            .collect();
        chart
            .draw_series(mine.iter().map(|&(x, b)| {
                Rectangle::new([(x - w * 0.45, lo), (x + w * 0.45, b.avg)], color.filled())
            }))
            .map_err(err)?
            .label(format!("{t} thread{}", if t == 1 { "" } else { "s" }))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
        chart
            .draw_series(mine.iter().map(|&(x, b)| {
                PathElement::new(
                    vec![(x, (b.avg - b.std).max(lo)), (x, b.avg + b.std)],
                    BLACK,
                )
            }))
            .map_err(err)?;
        chart
            .draw_series(mine.iter().map(|&(x, b)| {
                Text::new(
                    format!("{:.1}", b.avg),
                    (x, b.avg * 1.08),
                    ("sans-serif", 11).into_font().color(&BLACK).pos(
                        plotters::style::text_anchor::Pos::new(
                            plotters::style::text_anchor::HPos::Center,
                            plotters::style::text_anchor::VPos::Bottom,
                        ),
                    ),
                )
            }))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Bins of `values` (all > 0 are binned on a log10 scale; zeros are counted apart):
/// `(log10 lower edge, count)` for `per_decade` bins per decade, and the zeros.
pub fn log_bins(values: &[f64], per_decade: usize) -> (Vec<(f64, usize)>, usize) {
    let pos: Vec<f64> = values.iter().copied().filter(|v| *v > 0.0).collect();
    let zeros = values.len() - pos.len();
    if pos.is_empty() {
        return (Vec::new(), zeros);
    }
    let step = 1.0 / per_decade as f64;
    let lmin = pos.iter().map(|v| v.log10()).fold(f64::MAX, f64::min);
    let lmax = pos.iter().map(|v| v.log10()).fold(f64::MIN, f64::max);
    let start = (lmin / step).floor() * step;
    let nb = (((lmax - start) / step).floor() as usize + 1).max(1);
    let mut counts = vec![0usize; nb];
    for v in pos {
        let i = (((v.log10() - start) / step).floor() as usize).min(nb - 1);
        counts[i] += 1;
    }
    let bins = counts
        .into_iter()
        .enumerate()
        .map(|(i, c)| (start + i as f64 * step, c))
        .collect();
    (bins, zeros)
}

/// A histogram of per-token KL-divergences on logarithmic bins (four per decade), with the
/// mean and the 99th percentile marked.
pub fn kl_histogram(path: &Path, title: &str, kld: &[f64], mean: f64, p99: f64) -> Result<()> {
    const PER_DECADE: usize = 4;
    let (bins, zeros) = log_bins(kld, PER_DECADE);
    anyhow::ensure!(!bins.is_empty(), "no positive KL-divergence to draw");
    let step = 1.0 / PER_DECADE as f64;
    let x0 = bins[0].0;
    let x1 = bins[bins.len() - 1].0 + step;
    let ymax = bins.iter().map(|b| b.1).max().unwrap_or(1) as f64 * 1.15;
    let root = SVGBackend::new(path, (900, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 15))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(((x1 - x0).ceil() as usize + 1).max(2))
        .x_label_formatter(&|x| format!("1e{}", x.round() as i64))
        .x_desc(format!(
            "KL(base ‖ model) per token, log scale ({} positions{})",
            kld.len(),
            if zeros > 0 {
                format!(", {zeros} exactly 0 not shown")
            } else {
                String::new()
            }
        ))
        .y_desc("positions")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(err)?;
    let bar = RGBColor(43, 108, 176);
    chart
        .draw_series(bins.iter().map(|&(l, c)| {
            Rectangle::new(
                [(l + step * 0.05, 0.0), (l + step * 0.95, c as f64)],
                bar.filled(),
            )
        }))
        .map_err(err)?;
    for (v, name, color) in [(mean, "mean", RGBColor(197, 48, 48)), (p99, "99%", BLACK)] {
        if v > 0.0 {
            let x = v.log10().clamp(x0, x1);
            chart
                .draw_series([PathElement::new(vec![(x, 0.0), (x, ymax)], color)])
                .map_err(err)?
                .label(format!("{name} {v:.5}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], color));
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_bins_count_every_value_once() {
        let v = [0.0, 1e-4, 2e-4, 1e-3, 0.5, 0.0];
        let (bins, zeros) = log_bins(&v, 4);
        assert_eq!(zeros, 2);
        assert_eq!(bins.iter().map(|b| b.1).sum::<usize>(), 4);
        assert!((bins[0].0 - (-4.0)).abs() < 1e-9, "{bins:?}");
        // 0.5 = 10^-0.30 falls in the bin starting at -0.5.
        let last = bins.last().unwrap();
        assert!((last.0 + 0.5).abs() < 1e-9 && last.1 == 1, "{bins:?}");
        assert_eq!(log_bins(&[0.0], 4), (Vec::new(), 1));
    }

    #[test]
    fn charts_are_svg_documents_naming_their_parts() {
        let dir = std::env::temp_dir().join(format!("mica-charts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("bench.svg");
        let bars = vec![
            BenchBar {
                test: "pp64".into(),
                threads: 1,
                avg: 300.0,
                std: 5.0,
            },
            BenchBar {
                test: "tg16".into(),
                threads: 1,
                avg: 40.0,
                std: 1.0,
            },
            BenchBar {
                test: "pp64".into(),
                threads: 2,
                avg: 560.0,
                std: 9.0,
            },
            BenchBar {
                test: "tg16".into(),
                threads: 2,
                avg: 70.0,
                std: 2.0,
            },
        ];
        bench_chart(&p, "mica bench", &bars).unwrap();
        let s = std::fs::read_to_string(&p).unwrap();
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        for part in [
            "pp64",
            "tg16",
            "1 thread",
            "2 threads",
            "mica bench",
            "560.0",
        ] {
            assert!(s.contains(part), "{part} missing");
        }
        let k = dir.join("kl.svg");
        kl_histogram(&k, "KL", &[1e-5, 1e-4, 1e-4, 3e-3, 0.0], 6e-4, 3e-3).unwrap();
        let s = std::fs::read_to_string(&k).unwrap();
        assert!(s.contains("exactly 0 not shown") && s.contains("mean 0.00060"));
        assert!(bench_chart(&p, "x", &[]).is_err());
        assert!(kl_histogram(&k, "x", &[0.0], 0.0, 0.0).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
