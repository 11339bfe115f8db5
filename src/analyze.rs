//! `equarx analyze`: every collective of a module; with `--topology`,
//! what the pass would do to each and the models' predictions.

use anyhow::{Context, Result};
use clap::Args;

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
    let module = equarx::ir::Module::from_proto(loaded.module);
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
    say!(
        "model (not a measurement): {} ({})",
        options.pass.topology.name,
        options.pass.topology.source
    );
    use Align::{Left, Right};
    let mut t = Columns::new(&[
        ("collective", Left),
        ("op", Left),
        ("shape", Left),
        ("P", Right),
        ("bytes", Right),
        ("plan", Left),
        ("bf16 us", Right),
        ("equarx us", Right),
        ("speedup", Right),
        ("rel.err", Right),
        ("decision", Left),
    ]);
    for op in &r.report {
        let time = op.predicted_time.as_ref();
        let us = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        t.row(vec![
            op.name.clone(),
            op.opcode.clone(),
            op.shape.clone(),
            op.group_size.map_or("-".into(), |p| p.to_string()),
            op.payload_bytes.to_string(),
            op.plan.as_ref().map_or("-".into(), tables::plan_cell),
            us(time.map(|t| t.bf16_us)),
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

use equarx::ir::groups::{GroupMode, ReplicaGroups};
use equarx::ir::{InstrId, Module, shape};

/// One collective instruction.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Collective {
    pub name: String,
    pub computation: String,
    pub opcode: String,
    pub shape: String,
    pub element_types: Vec<String>,
    /// Devices per group (for collective-permute: the number of pairs).
    pub group_size: Option<usize>,
    pub groups: Option<usize>,
    pub mode: String,
    pub encoding: Option<String>,
    pub channel_id: Option<i64>,
    /// Bytes of the operands.
    pub payload_bytes: u64,
}

const COLLECTIVES: &[&str] = &[
    "all-reduce",
    "all-reduce-start",
    "all-gather",
    "all-gather-start",
    "reduce-scatter",
    "all-to-all",
    "ragged-all-to-all",
    "collective-permute",
    "collective-permute-start",
    "collective-broadcast",
];

/// Lists the collectives of `module` in module order.
pub fn collectives(module: &Module) -> Vec<Collective> {
    let mut out = Vec::new();
    for c in module.computations() {
        for i in c.instructions() {
            if !COLLECTIVES.contains(&i.opcode.as_str()) {
                continue;
            }
            let operands: Vec<_> = i
                .operand_ids
                .iter()
                .filter_map(|&o| c.get(InstrId(o)).and_then(|o| o.shape.as_ref()))
                .collect();
            let mut types: Vec<String> = operands
                .iter()
                .map(|s| shape::type_name(s.element_type).unwrap_or("?").to_string())
                .collect();
            types.dedup();
            let permute = i.opcode.starts_with("collective-permute");
            let groups = if permute {
                None
            } else {
                ReplicaGroups::of(i).ok()
            };
            out.push(Collective {
                name: i.name.clone(),
                computation: c.name().to_string(),
                opcode: i.opcode.clone(),
                shape: i.shape.as_ref().map(shape::describe).unwrap_or_default(),
                element_types: types,
                group_size: if permute {
                    Some(i.source_target_pairs.len())
                } else {
                    groups.as_ref().and_then(ReplicaGroups::uniform_size)
                },
                groups: groups.as_ref().map(|g| g.groups.len()),
                mode: GroupMode::of(i).as_str().to_string(),
                encoding: groups.map(|g| g.encoding.as_str().to_string()),
                channel_id: (i.channel_id > 0).then_some(i.channel_id),
                payload_bytes: operands.iter().filter_map(|s| shape::byte_size(s)).sum(),
            });
        }
    }
    out
}
