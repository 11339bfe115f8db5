//! `equarx simulate`: the quantized collectives' error on synthetic data,
//! or on saved inputs (`--inputs`, a real model's all-reduce inputs say),
//! bit-exact with the emitted HLO, beside the error model.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;

use equarx::ScaleType;
use equarx::numerics::simulate::{self, Distribution};
use equarx::plan::{Algorithm, QuantFormat, Rotation};

use crate::args::choice;
use crate::tables::{Align, Columns};
use crate::{charts, say, say_raw};

const EXAMPLES: &str = "\
Examples:
  # Every algorithm, rotation and block size on synthetic distributions:
  equarx simulate --group-sizes 4,8 --formats int8,int4

  # The error model against a real model's all-reduce inputs: each plan run
  # on them, beside the error predicted from the prior and from their own
  # statistics (what a calibration profile holds):
  equarx simulate --inputs captures.npz --arrays 'L*' --formats int8,fp8-e4m3,int4

--inputs takes one array per all-reduce, [ranks, elements...]: every rank's
operand (save bf16 as f32, which holds it exactly). bench/model/capture.py
writes such a file from gemma-3-270m's tensor-parallel all-reduces.";

#[derive(Args)]
#[command(after_help = EXAMPLES)]
pub struct SimulateArgs {
    /// Saved all-reduce inputs (.npz, one array per all-reduce, [ranks,
    /// elements...]) instead of synthetic distributions: each plan runs on
    /// every array, beside the error model's predictions from the prior
    /// and from the array's own statistics.
    #[arg(long, value_name = "FILE.npz", conflicts_with_all = ["distributions", "group_sizes", "elements", "channels", "plot", "pipeline_depths", "bidirectional"])]
    inputs: Option<PathBuf>,
    /// With --inputs: only these arrays (names; `PREFIX*` matches every
    /// name that starts with PREFIX). Default: every array, and each must
    /// be a float array of [ranks, elements...].
    #[arg(
        long,
        value_name = "NAME,...",
        value_delimiter = ',',
        requires = "inputs"
    )]
    arrays: Vec<String>,
    /// With --inputs: at most this many elements of each rank's operand
    /// (its first ones), for a quicker look.
    #[arg(long, value_name = "N", requires = "inputs")]
    max_elements: Option<usize>,
    /// Input distributions (per device, bf16).
    #[arg(
        long,
        value_parser = choice::<Distribution>(),
        value_delimiter = ',',
        default_value = "gaussian,heavy-tailed,llm-activations,outliers"
    )]
    distributions: Vec<Distribution>,
    /// Reduce algorithms (two-level: the most balanced grid of each P).
    #[arg(
        long,
        value_parser = choice::<Algorithm>(),
        value_delimiter = ',',
        default_value = "ring,two-shot,two-level"
    )]
    algorithms: Vec<Algorithm>,
    /// Rotations: none, hadamard (power-of-two block sizes only).
    #[arg(
        long,
        value_parser = choice::<Rotation>(),
        value_delimiter = ',',
        default_value = "none,hadamard"
    )]
    rotations: Vec<Rotation>,
    /// Code formats: int8, fp8-e4m3, fp8-e5m2, int4.
    #[arg(long, value_parser = choice::<QuantFormat>(), value_delimiter = ',', default_value = "int8")]
    formats: Vec<QuantFormat>,
    /// Group sizes P.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16,64")]
    group_sizes: Vec<usize>,
    /// Block sizes B.
    #[arg(long, value_delimiter = ',', default_value = "32,64,128,512")]
    block_sizes: Vec<usize>,
    /// Pipeline depths D (lanes do not change the arithmetic; padding can).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pipeline_depths: Vec<usize>,
    /// Ring directions to try: false (one way), true (bidirectional).
    #[arg(long, value_delimiter = ',', default_value = "true")]
    bidirectional: Vec<bool>,
    /// Elements per device.
    #[arg(long, default_value_t = 65_536)]
    elements: usize,
    /// Innermost dimension of the synthetic tensors (outlier channels).
    #[arg(long, default_value_t = 256)]
    channels: usize,
    #[arg(long, value_parser = choice::<ScaleType>(), default_value = "bf16")]
    scale_type: ScaleType,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write error-vs-P charts, one SVG per distribution
    /// (FILE-<distribution>.svg).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

pub fn run(a: SimulateArgs) -> Result<()> {
    if let Some(path) = &a.inputs {
        return on_inputs(&a, path);
    }
    if a.elements == 0 || a.group_sizes.iter().any(|&p| p < 2) {
        bail!("--elements must be positive and every group size at least 2");
    }
    let rows = simulate::sweep(&simulate::Sweep {
        distributions: a.distributions,
        group_sizes: a.group_sizes,
        block_sizes: a.block_sizes,
        algorithms: a.algorithms,
        rotations: a.rotations,
        formats: a.formats,
        depths: a.pipeline_depths,
        bidirectional: a.bidirectional,
        elements: a.elements,
        channels: a.channels,
        scale_type: a.scale_type,
        seed: a.seed,
    })
    .map_err(anyhow::Error::msg)?;
    if let Some(path) = &a.plot {
        plot_errors(&rows, path)?;
    }
    if a.json {
        say!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    say!(
        "relative RMS error (max error / RMS) against the exact sum, {} bf16 elements per device\n",
        a.elements
    );
    use Align::{Left, Right};
    let mut t = Columns::new(&[
        ("distribution", Left),
        ("P", Right),
        ("B", Right),
        ("algorithm", Left),
        ("rotation", Left),
        ("format", Left),
        ("D", Right),
        ("bidi", Right),
        ("equarx", Right),
        ("model", Right),
        ("bf16 ring", Right),
        ("per-tensor int8", Right),
        ("wire", Right),
    ]);
    let cell = |e: simulate::ErrorStats| format!("{:.3}% ({:.3})", e.rel_rms * 100.0, e.max_rel);
    for r in &rows {
        t.row(vec![
            r.distribution.to_string(),
            r.group_size.to_string(),
            r.block_size.to_string(),
            r.algorithm.clone(),
            r.rotation.to_string(),
            r.format.to_string(),
            r.pipeline_depth.to_string(),
            r.bidirectional.to_string(),
            cell(r.equarx),
            format!("{:.3}%", r.predicted_rel_rms * 100.0),
            cell(r.bf16_ring),
            cell(r.per_tensor_int8),
            format!("{:.2}x", r.wire_ratio),
        ]);
    }
    say_raw!("{}", t.render());
    Ok(())
}

/// One SVG per distribution: `errors.svg` → `errors-gaussian.svg`, ...
fn plot_errors(rows: &[simulate::SweepRow], path: &Path) -> Result<()> {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("errors");
    for (dname, svg) in charts::error_charts(rows).map_err(anyhow::Error::msg)? {
        charts::write_svg(&path.with_file_name(format!("{stem}-{dname}.svg")), &svg)?;
    }
    Ok(())
}

/// `--inputs`: every plan on every saved all-reduce's inputs, measured and
/// predicted.
fn on_inputs(a: &SimulateArgs, path: &Path) -> Result<()> {
    use equarx::numerics::check::{Checked, check};
    use equarx::plan::Config;
    let wanted = |name: &str| {
        a.arrays.is_empty()
            || a.arrays.iter().any(|w| match w.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => name == w,
            })
    };
    let mut arrays: Vec<(String, crate::npz::Array)> =
        crate::npz::read_some(path, wanted)?.into_iter().collect();
    arrays.sort_by(|x, y| x.0.cmp(&y.0));
    if arrays.is_empty() {
        bail!("{}: holds no array that --arrays names", path.display());
    }
    let mut rows: Vec<(String, Checked)> = Vec::new();
    for (name, (shape, values)) in &arrays {
        let what = || format!("{}: array {name} {shape:?}", path.display());
        let (Some(&ranks), true) = (shape.first(), shape.len() >= 2) else {
            bail!(
                "{}: an all-reduce's inputs are [ranks, elements...]",
                what()
            );
        };
        let ranks = ranks as usize;
        if ranks < 2 {
            bail!(
                "{}: {ranks} rank(s); an all-reduce needs at least 2",
                what()
            );
        }
        let per = values.len() / ranks;
        if per == 0 {
            bail!("{}: no elements", what());
        }
        let take = a.max_elements.map_or(per, |m| m.min(per));
        let inputs: Vec<Vec<f32>> = values
            .chunks_exact(per)
            .map(|r| r[..take].to_vec())
            .collect();
        let mut configs = Vec::new();
        for &algorithm in &a.algorithms {
            // Two-level runs on the most balanced grid (none for a prime
            // group: left out).
            let Ok(grid) = algorithm.grid(ranks, None) else {
                continue;
            };
            for &rotation in &a.rotations {
                for &format in &a.formats {
                    for &block in &a.block_sizes {
                        configs.push(Config {
                            algorithm,
                            grid,
                            rotation,
                            block,
                            scale_type: a.scale_type,
                            format,
                            ..Config::default()
                        });
                    }
                }
            }
        }
        let checked = check(&inputs, &configs)
            .map_err(anyhow::Error::msg)
            .with_context(what)?;
        rows.extend(checked.into_iter().map(|c| (name.clone(), c)));
    }
    if a.json {
        let out: Vec<serde_json::Value> = rows
            .iter()
            .map(|(name, c)| serde_json::json!({"array": name, "checked": c}))
            .collect();
        say!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    say!(
        "relative RMS error against the exact sum, measured on {} arrays of {} and predicted from the prior and from each array's own statistics (what a profile holds)\n",
        arrays.len(),
        path.display()
    );
    use Align::{Left, Right};
    let mut t = Columns::new(&[
        ("array", Left),
        ("algorithm", Left),
        ("rotation", Left),
        ("format", Left),
        ("B", Right),
        ("measured", Right),
        ("profile", Right),
        ("prior", Right),
        ("profile/measured", Right),
        ("prior/measured", Right),
    ]);
    let pct = |x: f64| format!("{:.3}%", x * 100.0);
    for (name, c) in &rows {
        t.row(vec![
            name.clone(),
            c.config.algorithm_label(),
            c.config.rotation.to_string(),
            c.config.format.to_string(),
            c.config.block.to_string(),
            pct(c.measured),
            pct(c.profile),
            pct(c.prior),
            format!("{:.3}", c.profile / c.measured),
            format!("{:.3}", c.prior / c.measured),
        ]);
    }
    say_raw!("{}", t.render());
    let within = rows
        .iter()
        .filter(|(_, c)| (c.profile / c.measured - 1.0).abs() <= 0.25)
        .count();
    let above = rows.iter().filter(|(_, c)| c.prior >= c.measured).count();
    let (lo, hi) = rows
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), (_, c)| {
            let r = c.profile / c.measured;
            (lo.min(r), hi.max(r))
        });
    say!(
        "\n{within} of {n} within ±25% from the profile (profile/measured {lo:.3}–{hi:.3}); prior ≥ measured for {above} of {n}",
        n = rows.len()
    );
    Ok(())
}
