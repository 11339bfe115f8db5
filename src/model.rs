//! `equarx model`: the time model's predictions over message sizes on a
//! named topology (a model from public figures, not a measurement).

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use clap::Args;

use equarx::Options;
use equarx::cost::{Prediction, Topology, predict};
use equarx::numerics::error::Data;
use equarx::passes::Platform;
use equarx::passes::quantize_collectives::choose::{Payload, choose_plan};
use equarx::passes::quantize_collectives::skip::SkipReason;
use equarx::passes::quantize_collectives::{charges, faster};
use equarx::plan::{Collective, Kernels, Plan, Rotation};

use crate::args::PassArgs;
use crate::tables::{Align, Columns, human_bytes};
use crate::{charts, say, say_raw};

#[derive(Args)]
pub struct ModelArgs {
    /// Group size P.
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Message sizes (bf16 payload), e.g. 64KiB,1MiB,16MiB.
    #[arg(long, value_delimiter = ',', value_parser = equarx::options::parse_bytes,
          default_value = "16KiB,64KiB,256KiB,1MiB,4MiB,16MiB,64MiB,256MiB")]
    sizes: Vec<u64>,
    /// Also write a chart of the predicted speedup over message size for
    /// every known topology (SVG).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    #[command(flatten)]
    pass: PassArgs,
}

pub fn run(a: ModelArgs) -> Result<()> {
    let o = a.pass.options()?.pass;
    // A named stage charges what the pass charges there (`--stage tiled`:
    // XLA:TPU's hook; on XLA:TPU and XLA:GPU, unless `--kernels hlo`,
    // equarx's own kernels' plan where it is predicted faster).
    let (topology, own) = match o.stage {
        Some(stage) => {
            let c = charges(&o, stage);
            (c.hlo.topology_for(c.platform), c.own)
        }
        None => (o.stated_topology(), None),
    };
    if let Some(path) = &a.plot {
        plot_speedups(&a, &o, path)?;
    }
    if a.group_size < 2 {
        bail!("--group-size must be at least 2");
    }
    say!(
        "model (not a measurement): {}, P = {}, {}",
        topology.name,
        a.group_size,
        topology.source
    );
    say!(
        "ring bandwidth per device: bf16 {:.0} GB/s, equarx {:.0} GB/s{}; step latency {} us",
        topology.ring_gbps(true),
        topology.ring_gbps(o.bidirectional),
        if topology.wraparound {
            ""
        } else {
            " (no wraparound: halved)"
        },
        topology.step_latency_us
    );
    let k = topology.kernels;
    say!(
        "kernels: {}: {} kernels per ring hop, {} per ring phase, {} per other phase; {} us each \
         (assumption)",
        k.source,
        k.ring_hop,
        k.ring_phase,
        k.phase,
        topology.kernel_latency_us
    );
    if let Some((kind, m)) = &own {
        let k = m.topology_for(Platform::Tpu).kernels;
        say!(
            "kernels: equarx's own {kind} kernels for the all-reduces they take (two-shot), {} \
             per phase and {} per op, their codes in unpadded rows; a row says ({kind}) where \
             they are predicted faster (an operand they cannot take keeps the HLO form: see the \
             report)",
            k.phase,
            k.op
        );
    }
    if topology.wire_row_bytes > 0 {
        say!(
            "wire: a block's codes in {}-byte tile rows (XLA:TPU past its tiling), as its compiled \
             buffers hold them",
            topology.wire_row_bytes
        );
    }
    use Align::{Left, Right};
    let mut t = Columns::new(&[
        ("bf16 size", Right),
        ("baseline us", Right),
        ("equarx us", Right),
        ("compute us", Right),
        ("speedup", Right),
        ("rel.err", Right),
        ("plan", Left),
    ]);
    for &bytes in &a.sizes {
        let (plan, p) = model_bf16(a.group_size, bytes, &o, &topology, own.as_ref())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let rotation = match plan.config.rotation {
            Rotation::Hadamard => " + hadamard",
            Rotation::None => "",
        };
        t.row(vec![
            human_bytes(bytes),
            format!("{:.1}", p.baseline_us),
            format!("{:.1}", p.equarx_us),
            format!("{:.1}", p.compute_us),
            format!("{:.2}x", p.speedup()),
            format!(
                "{:.2}%",
                100.0 * equarx::numerics::error::predicted_rel_rms(&plan, 7)
            ),
            format!(
                "{}{rotation}{}",
                plan.config.algorithm,
                match plan.config.kernels {
                    Kernels::Hlo => String::new(),
                    kind => format!(" ({kind})"),
                }
            ),
        ]);
    }
    say_raw!("{}", t.render());
    Ok(())
}

fn plot_speedups(a: &ModelArgs, options: &Options, path: &Path) -> Result<()> {
    let svg = charts::speedup_chart(&a.sizes, a.group_size, options).map_err(anyhow::Error::msg)?;
    charts::write_svg(path, &svg)
}

/// The plan the pass chooses for a bf16 all-reduce of `bytes` over `p`
/// ranks on topology `t` (the rewrite forced, so a plan comes back even
/// where it would not pay), and its predicted times: this command's rows.
/// With `own` (equarx's own kernels and the options that charge them,
/// [`charges`]), the kernels' plan where it is predicted faster.
pub fn model_bf16(
    p: usize,
    bytes: u64,
    options: &Options,
    t: &Topology,
    own: Option<&(Kernels, Options)>,
) -> Result<(Plan, Prediction), SkipReason> {
    let options = Options {
        topology: Some(t.clone()),
        ..options.clone()
    };
    let payload = Payload {
        collective: Collective::AllReduce,
        elements: (bytes / 2) as usize,
        row: None,
        bytes,
        mantissa_bits: 7,
    };
    let hlo = choose_plan(p, &payload, true, Data::Prior, &options);
    let choice = match own {
        Some((kind, m)) => faster(hlo, choose_plan(p, &payload, true, Data::Prior, m), *kind)?,
        None => hlo?,
    };
    let charged = match (choice.plan.config.kernels, own) {
        (Kernels::Hlo, _) | (_, None) => t,
        (_, Some((_, m))) => m.topology.as_ref().unwrap_or(t),
    };
    let prediction = predict(charged, &choice.plan, bytes, 2.0);
    Ok((choice.plan, prediction))
}
