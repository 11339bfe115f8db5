//! `equarx calibrate`: a calibration profile from collectives' inputs saved
//! to a `.npz` file, for `--profile` (what `equarx.jax.calibrate` does for
//! a JAX program as it runs).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;

use equarx::calibrate::{Measured, Measurements, Site, site_stats};
use equarx::numerics::profile::UnmeasuredOp;

use crate::args::InputArgs;
use crate::tables::{Align, Columns};
use crate::{say, say_raw};

const EXAMPLES: &str = "\
Examples:
  # Which arrays would a profile of this module need?
  equarx calibrate module.pb --list

  # The profile of saved inputs, then a rewrite that chooses with it:
  equarx calibrate module.pb --inputs inputs.npz -o module.profile.json
  equarx rewrite module.pb -o module.eqx.pb --profile module.profile.json --report

The .npz holds one array per collective, named as the collective's
instruction (`--list` prints the names and shapes): every device's operand,
devices in id order (the group's ids: partition ids for SPMD programs),
as [ids, elements...], or [runs, ids, elements...] for an op that ran
several times (a loop body's). Any float type numpy saves (f16, f32, f64);
save bf16 as f32, which holds it exactly.";

#[derive(Args)]
#[command(after_help = EXAMPLES)]
pub struct CalibrateArgs {
    #[command(flatten)]
    input: InputArgs,
    /// The saved inputs (.npz): one array per collective, named as its
    /// instruction.
    #[arg(long, value_name = "FILE.npz", required_unless_present = "list")]
    inputs: Option<PathBuf>,
    /// Where to write the profile (JSON; `-` for stdout). Written through a
    /// temporary file and a rename.
    #[arg(short, long, value_name = "FILE", required_unless_present = "list")]
    output: Option<PathBuf>,
    /// List the module's collectives and the array each needs, then stop.
    #[arg(long)]
    list: bool,
    /// What the inputs are (the program, the data), kept in the profile.
    #[arg(long, value_name = "TEXT")]
    source: Option<String>,
    /// The module's replica count, if it does not say.
    #[arg(long, value_name = "N")]
    replica_count: Option<i64>,
    /// The module's partition count, if it does not say.
    #[arg(long, value_name = "N")]
    num_partitions: Option<i64>,
}

pub fn run(a: CalibrateArgs) -> Result<()> {
    let loaded = a.input.load()?;
    let counts = loaded.counts.overridden_by(equarx::DeviceCounts {
        replica_count: a.replica_count,
        num_partitions: a.num_partitions,
    });
    let module = equarx::ir::Module::from_proto(loaded.module);
    let sites = equarx::calibrate::sites(&module, &counts);
    if sites.is_empty() {
        bail!(
            "{} has no collective equarx looks at: nothing to calibrate",
            a.input.input.display()
        );
    }
    if a.list {
        return list(&sites);
    }
    let (Some(inputs), Some(output)) = (&a.inputs, &a.output) else {
        bail!("--inputs and -o are required (or --list)");
    };
    let mut arrays = crate::npz::read(inputs)?;
    let source = a
        .source
        .clone()
        .unwrap_or_else(|| format!("{} on {}", a.input.input.display(), inputs.display()));
    let mut m = Measurements {
        source: source.clone(),
        ops: Vec::new(),
        unmeasured: Vec::new(),
    };
    for site in &sites {
        let Some((shape, values)) = arrays.remove(&site.instruction) else {
            m.unmeasured.push(UnmeasuredOp {
                key: site.key.clone(),
                reason: format!("{} has no array {}", inputs.display(), site.instruction),
            });
            continue;
        };
        let what = || format!("{}: array {} {shape:?}", inputs.display(), site.instruction);
        m.ops
            .push(measure(site, &values, &source).with_context(what)?);
    }
    if !arrays.is_empty() {
        let mut extra: Vec<&String> = arrays.keys().collect();
        extra.sort();
        bail!(
            "{}: arrays {extra:?} name no collective of {} (see --list); refusing to guess",
            inputs.display(),
            a.input.input.display()
        );
    }
    if m.ops.is_empty() {
        bail!(
            "{}: no array names a collective of the module (see --list)",
            inputs.display()
        );
    }
    let (measured, missing) = (m.ops.len(), m.unmeasured.len());
    let profile = equarx::calibrate::build(m).map_err(anyhow::Error::msg)?;
    let json = serde_json::to_string_pretty(&profile)? + "\n";
    equarx::io::write_atomic(output, json.as_bytes())
        .with_context(|| format!("cannot write {}", output.display()))?;
    if output.as_os_str() != "-" {
        say!(
            "wrote {}: {measured} collectives measured, {missing} not (listed in the profile's \"unmeasured\")",
            output.display()
        );
    }
    Ok(())
}

/// One site's statistics over every run `values` holds.
fn measure(site: &Site, values: &[f32], source: &str) -> Result<Measured> {
    let groups = site
        .groups
        .as_ref()
        .map_err(|e| anyhow::anyhow!("its groups cannot be known: {e}"))?;
    let (ids, n) = (groups.ids, site.elements as usize);
    let per_run = ids
        .checked_mul(n)
        .filter(|&k| k > 0)
        .context("the collective moves no elements")?;
    if values.len() % per_run != 0 {
        bail!(
            "{} values, not a whole number of runs of {ids} ids × {n} elements",
            values.len()
        );
    }
    let mut stats = Vec::new();
    for run in values.chunks_exact(per_run) {
        let per_id: Vec<Vec<f32>> = run.chunks_exact(n).map(<[f32]>::to_vec).collect();
        stats.push(site_stats(site, &per_id, source).map_err(anyhow::Error::msg)?);
    }
    let bad = values.iter().filter(|v| !v.is_finite()).count();
    Ok(Measured {
        key: site.key.clone(),
        stats,
        nonfinite_fraction: bad as f64 / values.len() as f64,
    })
}

fn list(sites: &[Site]) -> Result<()> {
    use Align::{Left, Right};
    let mut t = Columns::new(&[
        ("array", Left),
        ("collective", Left),
        ("shape", Left),
        ("ids", Right),
        ("elements", Right),
        ("computation", Left),
        ("source", Left),
    ]);
    for s in sites {
        let ids = s
            .groups
            .as_ref()
            .map_or("?".to_string(), |g| g.ids.to_string());
        let at = if s.key.source_file.is_empty() {
            "-".to_string()
        } else {
            format!("{}:{}", s.key.source_file, s.key.source_line)
        };
        t.row(vec![
            s.instruction.clone(),
            s.collective.clone(),
            s.key.operands.join(", "),
            ids,
            s.elements.to_string(),
            s.computation.clone(),
            at,
        ]);
    }
    say_raw!("{}", t.render());
    say!(
        "{} collectives; each array is [ids, elements...] of every device's operand, or \
         [runs, ids, elements...]",
        sites.len()
    );
    Ok(())
}
