//! `equarx analyze`: every collective of a module; with `--topology`,
//! what the pass would do to each and the models' predictions.

use anyhow::{Context, Result};
use clap::Args;
use equarx::ir::Module;
use equarx::passes::quantize_collectives::report::{CollectiveOp, describe};

use crate::args::{InputArgs, PassArgs};
use crate::tables::{self, Align, Columns};
use crate::{say, say_raw};

#[derive(Args)]
pub struct AnalyzeArgs {
    #[command(flatten)]
    input: InputArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// With --topology: predict each all-reduce's time, bf16 ring vs
    /// equarx, and its error, under these pass options.
    #[command(flatten)]
    pass: PassArgs,
}

pub fn run(a: AnalyzeArgs) -> Result<()> {
    if a.pass.given("topology") {
        return analyze_predicted(&a);
    }
    let loaded = a.input.load()?;
    let module = Module::from_proto(loaded.module);
    equarx::verify::verify(&module).with_context(|| a.input.input.display().to_string())?;
    let list = collectives(&module);
    if a.json {
        say!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    use Align::{Left, Right};
    let mut t = Columns::new(&[
        ("name", Left),
        ("opcode", Left),
        ("shape", Left),
        ("group", Right),
        ("groups", Right),
        ("mode", Left),
        ("encoding", Left),
        ("bytes", Right),
    ]);
    for c in &list {
        t.row(vec![
            c.name.clone(),
            c.opcode.clone(),
            c.shape.clone(),
            c.group_size.map_or("-".into(), |g| g.to_string()),
            c.groups.map_or("-".into(), |g| g.to_string()),
            c.mode.clone(),
            c.encoding.clone().unwrap_or_else(|| "-".into()),
            c.payload_bytes.to_string(),
        ]);
    }
    say_raw!("{}", t.render());
    say!("{} collectives", list.len());
    Ok(())
}

/// Every collective of `module`, in module order, described as the pass's
/// report describes it.
fn collectives(module: &Module) -> Vec<CollectiveOp> {
    module
        .computations()
        .iter()
        .flat_map(|c| {
            c.instructions()
                .iter()
                .filter(|i| equarx::ir::opcode::is_collective(&i.opcode))
                .map(move |i| describe(c, i))
        })
        .collect()
}

/// `analyze --topology`: what the pass would do to each collective, with
/// the cost model's times and the predicted error.
fn analyze_predicted(a: &AnalyzeArgs) -> Result<()> {
    let options = a.pass.options()?;
    let loaded = a.input.load()?;
    let name = a.input.input.display().to_string();
    let r = equarx::rewrite(loaded.module, loaded.counts, &options).with_context(|| name)?;
    if a.json {
        say!("{}", serde_json::to_string_pretty(&r.report)?);
        return Ok(());
    }
    // Given (`--topology` is what asked for the prediction), so the one the
    // pass charged.
    let topology = options.pass.stated_topology();
    say!(
        "model (not a measurement): {} ({})",
        topology.name,
        topology.source
    );
    use Align::{Left, Right};
    let mut t = Columns::new(&[
        ("collective", Left),
        ("op", Left),
        ("shape", Left),
        ("P", Right),
        ("bytes", Right),
        ("plan", Left),
        ("baseline us", Right),
        ("equarx us", Right),
        ("speedup", Right),
        ("rel.err", Right),
        ("decision", Left),
    ]);
    for op in &r.report {
        let time = op.predicted_time.as_ref();
        let us = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        t.row(vec![
            op.op.name.clone(),
            op.op.opcode.clone(),
            op.op.shape.clone(),
            op.op.group_size.map_or("-".into(), |p| p.to_string()),
            op.op.payload_bytes.to_string(),
            op.plan.as_ref().map_or("-".into(), tables::plan_cell),
            us(time.map(|t| t.baseline_us)),
            us(time.map(|t| t.equarx_us)),
            time.map_or("-".into(), |t| format!("{:.2}x", t.speedup)),
            op.predicted_rel_rms
                .map_or("-".into(), |e| format!("{:.2}%", e * 100.0)),
            if op.rewritten {
                "rewrite".to_string()
            } else {
                format!("skip: {}", op.reason.as_deref().unwrap_or(""))
            },
        ]);
    }
    say_raw!("{}", t.render());
    Ok(())
}
