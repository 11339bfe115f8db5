//! `equarx simulate`: the quantized collectives' error on synthetic data,
//! bit-exact with the emitted HLO, beside the error model.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use clap::Args;

use equarx::ScaleType;
use equarx::numerics::simulate::{self, Distribution};
use equarx::plan::{Algorithm, QuantFormat, Rotation};

use crate::args::choice;
use crate::tables::{Align, Columns};
use crate::{charts, say, say_raw};

#[derive(Args)]
pub struct SimulateArgs {
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
