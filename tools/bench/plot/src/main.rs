// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `vuc-bench-plot COMPARE_JSON OUT.svg|OUT.png`: draws the results of
//! `tools/bench/compare.sh` with plotters: AES-128-CBC encrypt throughput
//! (MiB/s, log scale) against payload size (log scale), one panel per queue
//! depth, one line per system (our daemon and DPDK from the median run of
//! each cell; the raw single-stream ciphers, which have no queue depth, in
//! every panel). Text needs a TrueType font: `$PLOT_FONT`, else
//! DejaVu Sans or Liberation Sans from their Debian paths.

use std::error::Error;
use std::process::ExitCode;

use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;

const SYSTEMS: [(&str, &str, RGBColor); 4] = [
    ("ours", "our daemon", RGBColor(0xd6, 0x27, 0x28)),
    ("dpdk", "DPDK 22.11 vhost_crypto", RGBColor(0x1f, 0x77, 0xb4)),
    (
        "openssl",
        "openssl speed (raw single stream)",
        RGBColor(0x2c, 0xa0, 0x2c),
    ),
    (
        "algos",
        "algorithms single stream (raw)",
        RGBColor(0x94, 0x67, 0xbd),
    ),
];

/// MiB/s of `system` at this size and depth, from the `table` rows.
fn mib(row: &Value, system: &str) -> Option<f64> {
    let size = row["size"].as_f64()?;
    let v = match system {
        "ours" | "dpdk" => row[system]["mib_per_sec"].as_f64(),
        "openssl" => row["openssl_ops_per_sec"].as_f64().map(|o| o * size / 1048576.0),
        _ => row["algos_ops_per_sec"].as_f64().map(|o| o * size / 1048576.0),
    }?;
    (v > 0.0).then_some(v)
}

fn run(input: &str, output: &str) -> Result<(), Box<dyn Error>> {
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(input)?)?;
    let table = doc["table"].as_array().ok_or("no \"table\" array in the input")?;
    let mut depths: Vec<u64> = table.iter().filter_map(|r| r["depth"].as_u64()).collect();
    depths.sort_unstable();
    depths.dedup();
    let sizes: Vec<f64> = table.iter().filter_map(|r| r["size"].as_f64()).collect();
    let ys: Vec<f64> = table
        .iter()
        .flat_map(|r| SYSTEMS.iter().filter_map(move |s| mib(r, s.0)))
        .collect();
    if depths.is_empty() || ys.is_empty() {
        return Err("nothing to plot".into());
    }
    let (xmin, xmax) = sizes
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &s| (a.min(s), b.max(s)));
    let (ymin, ymax) = ys
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let (ylo, yhi) = (10f64.powf(ymin.log10().floor()), 10f64.powf(ymax.log10().ceil()));
    let (xlo, xhi) = (xmin / 1.3, xmax * 1.3);

    let size = (60 + 420 * depths.len() as u32, 520);
    let frame = Frame {
        table,
        depths: &depths,
        x: (xlo, xhi),
        y: (ylo, yhi),
        meta: &doc["meta"],
    };
    // Text layout needs a font for SVG too (plotters' ab_glyph feature).
    register_font()?;
    if output.ends_with(".png") {
        draw(BitMapBackend::new(output, size).into_drawing_area(), &frame)
    } else {
        draw(SVGBackend::new(output, size).into_drawing_area(), &frame)
    }
}

struct Frame<'a> {
    table: &'a [Value],
    depths: &'a [u64],
    x: (f64, f64),
    y: (f64, f64),
    meta: &'a Value,
}

fn register_font() -> Result<(), Box<dyn Error>> {
    let candidates = [
        std::env::var("PLOT_FONT").unwrap_or_default(),
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf".into(),
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf".into(),
    ];
    let bytes = candidates
        .iter()
        .filter(|p| !p.is_empty())
        .find_map(|p| std::fs::read(p).ok())
        .ok_or("no TrueType font for the text (set PLOT_FONT to a .ttf file)")?;
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    for family in ["sans-serif", "serif", "monospace"] {
        plotters::style::register_font(family, FontStyle::Normal, bytes).map_err(|_| "unusable font file")?;
    }
    Ok(())
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, f: &Frame<'_>) -> Result<(), Box<dyn Error>>
where
    DB::ErrorType: 'static,
{
    let (table, depths, meta) = (f.table, f.depths, f.meta);
    let ((xlo, xhi), (ylo, yhi)) = (f.x, f.y);
    root.fill(&WHITE)?;
    let title = format!(
        "AES-128-CBC encrypt throughput vs payload size ({}, commit {}, load {})",
        meta["date"].as_str().unwrap_or("?"),
        meta["commit"].as_str().unwrap_or("?"),
        meta["load_before"].as_str().unwrap_or("?"),
    );
    let root = root.titled(&title, ("sans-serif", 16))?;
    let panels = root.split_evenly((1, depths.len()));
    for (panel, &depth) in panels.iter().zip(depths) {
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("queue depth {depth}"), ("sans-serif", 14))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d((xlo..xhi).log_scale(), (ylo..yhi).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("payload bytes")
            .y_desc("MiB/s")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y}"))
            .light_line_style(RGBColor(0xee, 0xee, 0xee))
            .draw()?;
        for &(key, label, color) in &SYSTEMS {
            let mut pts: Vec<(f64, f64)> = table
                .iter()
                .filter(|r| r["depth"].as_u64() == Some(depth))
                .filter_map(|r| Some((r["size"].as_f64()?, mib(r, key)?)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            if pts.is_empty() {
                continue;
            }
            let raw = matches!(key, "openssl" | "algos");
            let style = color.stroke_width(if raw { 1 } else { 2 });
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), style))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 11))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: vuc-bench-plot COMPARE_JSON OUT.svg|OUT.png");
        return ExitCode::from(2);
    }
    match run(&args[1], &args[2]) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vuc-bench-plot: {e}");
            ExitCode::FAILURE
        }
    }
}
