//! `mica trace-chart TRACE.json -o chart.svg`: a flame chart of a `--trace` file's summary
//! (`profile.rs`), drawn with plotters' SVG backend, and a table of the spans by total time
//! on stdout. Icicle layout: the whole trace on top, a row per thread track under it, then
//! each span's children below it; a rectangle's width is its summed time.

mod profile;

use anyhow::{Context, Result, anyhow};
use clap::Args;
use plotters::prelude::*;
use profile::{Node, Profile};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct TraceChartArgs {
    /// A Chrome trace-event JSON file (as `--trace FILE` writes). (Not named `trace`: that
    /// is the id of the global `--trace` option.)
    #[arg(value_name = "TRACE")]
    pub input: PathBuf,
    /// The SVG file to write.
    #[arg(short = 'o', long = "output", value_name = "SVG")]
    pub output: PathBuf,
    /// Width of the chart in pixels.
    #[arg(long = "width", default_value_t = 1600, value_parser = clap::value_parser!(u32).range(200..=20000))]
    pub width: u32,
}

const ROW: i32 = 20;
const TOP: i32 = 44;
const FONT_PX: f64 = 15.0;
/// Plotters writes a font size of 0.8 × the one asked for: `FONT_PX` comes out as 12 px.
/// The naive width of one character at that size (labels are cut to fit their rectangle).
const CHAR_PX: f64 = 6.8;

pub fn trace_chart(args: TraceChartArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.input)
        .with_context(|| format!("cannot read {}", args.input.display()))?;
    let profile = Profile::parse(&text).with_context(|| format!("{}", args.input.display()))?;
    let title = format!(
        "{}: {:.1} ms of spans on {} thread(s); width: summed time, rows: thread, then spans by nesting",
        args.input
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        profile.root.total_us / 1e3,
        profile.root.children.len()
    );
    draw(&profile.root, &title, args.width, &args.output)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    println!(
        "{:<16} {:>9} {:>12} {:>12}",
        "span", "count", "total ms", "self ms"
    );
    for (name, count, total, own) in profile.by_name() {
        println!(
            "{name:<16} {count:>9} {:>12.3} {:>12.3}",
            total / 1e3,
            own / 1e3
        );
    }
    if profile.open_spans > 0 {
        eprintln!(
            "note: {} span(s) were never closed (the run was cut off); they are not counted",
            profile.open_spans
        );
    }
    eprintln!("wrote {}", args.output.display());
    Ok(())
}

/// Draws `root` as an icicle chart into an SVG file of `width` pixels.
fn draw(root: &Node, title: &str, width: u32, out: &std::path::Path) -> Result<()> {
    let height = TOP as u32 + root.depth() as u32 * ROW as u32 + 8;
    let area = SVGBackend::new(out, (width, height)).into_drawing_area();
    let err = |e| anyhow!("{e:?}");
    area.fill(&WHITE).map_err(err)?;
    area.draw(&Text::new(
        title.to_string(),
        (8, 10),
        ("sans-serif", 19.0).into_font().color(&BLACK),
    ))
    .map_err(err)?;
    let scale = f64::from(width - 16) / root.total_us.max(1e-9);
    let mut stack = vec![(root, 8.0f64, 0i32)];
    while let Some((node, x0, depth)) = stack.pop() {
        let w = node.total_us * scale;
        if w < 0.5 {
            continue;
        }
        let y0 = TOP + depth * ROW;
        let (l, r) = (x0.round() as i32, (x0 + w).round() as i32);
        area.draw(&Rectangle::new(
            [(l, y0), (r.max(l + 1), y0 + ROW - 2)],
            color(&node.name).filled(),
        ))
        .map_err(err)?;
        if let Some(label) = label(node, w) {
            area.draw(&Text::new(
                label,
                (l + 3, y0 + 3),
                ("sans-serif", FONT_PX).into_font().color(&BLACK),
            ))
            .map_err(err)?;
        }
        let mut x = x0;
        for c in &node.children {
            stack.push((c, x, depth + 1));
            x += c.total_us * scale;
        }
    }
    area.present().map_err(err)?;
    Ok(())
}

/// The text a rectangle `w` pixels wide shows: name, time and count when they fit, else
/// the name cut short, else nothing.
fn label(node: &Node, w: f64) -> Option<String> {
    let fits = ((w - 6.0) / CHAR_PX).floor().max(0.0) as usize;
    let full = format!(
        "{} {:.2} ms ×{}",
        node.name,
        node.total_us / 1e3,
        node.count
    );
    if full.chars().count() <= fits {
        return Some(full);
    }
    let n = node.name.chars().count();
    if n <= fits {
        return Some(node.name.clone());
    }
    (fits >= 4).then(|| node.name.chars().take(fits - 1).chain(['…']).collect())
}

/// A warm color of the flame-graph kind, the same for every span of one name.
fn color(name: &str) -> RGBColor {
    let h = name.bytes().fold(2166136261u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(16777619)
    });
    let r = 205 + (h % 50) as u8;
    let g = 90 + ((h >> 8) % 130) as u8;
    let b = 40 + ((h >> 16) % 50) as u8;
    RGBColor(r, g, b)
}
