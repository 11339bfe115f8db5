//! The charts behind `equarx simulate --plot` and `equarx model --plot`:
//! what goes on them, drawn by [`crate::plot`]. They return SVG text;
//! [`write_svg`] puts it in a file.

use std::path::Path;

use anyhow::{Context, Result};

use equarx::Options;
use equarx::cost::{self, Topology};
use equarx::numerics::simulate::SweepRow;

use crate::model::model_bf16;

use crate::plot::{Chart, Series, svg};

/// Error against P from a `simulate` sweep, one chart per input
/// distribution: equarx per algorithm, rotation and block size, a bf16 ring
/// and per-tensor int8.
/// Each comes with the distribution's command-line name.
pub fn error_charts(rows: &[SweepRow]) -> Result<Vec<(String, String)>, String> {
    let mut dists: Vec<_> = rows.iter().map(|r| r.distribution).collect();
    dists.dedup();
    let mut charts = Vec::new();
    for d in dists {
        let mine: Vec<&SweepRow> = rows.iter().filter(|r| r.distribution == d).collect();
        // One line per configuration (the algorithm named by kind: a
        // two-level grid changes with P).
        let kind = |r: &SweepRow| {
            let algorithm = r
                .algorithm
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_string();
            let rotated = r.rotation == equarx::plan::Rotation::Hadamard;
            (algorithm, rotated, r.block_size)
        };
        let mut configs: Vec<(String, bool, usize)> = mine.iter().map(|r| kind(r)).collect();
        configs.sort();
        configs.dedup();
        let line = |label: String, f: &dyn Fn(&SweepRow) -> Option<f64>| Series {
            points: {
                let mut p: Vec<(f64, f64)> = mine
                    .iter()
                    .filter_map(|r| f(r).map(|y| (r.group_size as f64, y)))
                    .collect();
                p.dedup_by(|a, b| a.0 == b.0);
                p
            },
            label,
        };
        let mut series: Vec<Series> = configs
            .iter()
            .map(|c| {
                let label = format!(
                    "equarx {}{} B={}",
                    c.0,
                    if c.1 { " + hadamard" } else { "" },
                    c.2
                );
                line(label, &|r| {
                    (kind(r) == *c).then_some(r.equarx.rel_rms * 100.0)
                })
            })
            .collect();
        series.push(line("bf16 ring".into(), &|r| {
            Some(r.bf16_ring.rel_rms * 100.0)
        }));
        series.push(line("per-tensor int8".into(), &|r| {
            Some(r.per_tensor_int8.rel_rms * 100.0)
        }));
        let dname = d.to_string();
        let title = format!("all-reduce error vs the exact sum, {dname} inputs");
        let chart = Chart {
            title: &title,
            x_label: "group size P",
            y_label: "relative RMS error (%)",
            log_y: true,
        };
        charts.push((dname, svg(&chart, &series)?));
    }
    Ok(charts)
}

/// Predicted speedup over message size (bf16 payload bytes), one line per
/// named topology, at group size `group_size`.
pub fn speedup_chart(
    sizes: &[u64],
    group_size: usize,
    options: &Options,
) -> Result<String, String> {
    let mut series = Vec::new();
    for name in cost::NAMES {
        let t = Topology::parse(name)?;
        let mut points = Vec::new();
        for &bytes in sizes {
            let (_, p) =
                model_bf16(group_size, bytes, options, &t, None).map_err(|e| e.to_string())?;
            points.push((bytes as f64 / (1 << 20) as f64, p.speedup()));
        }
        series.push(Series {
            label: t.name.clone(),
            points,
        });
    }
    let title = format!("predicted equarx speedup over a bf16 ring, P = {group_size} (a model)");
    let chart = Chart {
        title: &title,
        x_label: "bf16 payload (MiB)",
        y_label: "speedup",
        log_y: false,
    };
    svg(&chart, &series)
}

/// Writes a chart into `path` (atomically).
pub fn write_svg(path: &Path, svg: &str) -> Result<()> {
    equarx::io::write_atomic(path, svg.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
