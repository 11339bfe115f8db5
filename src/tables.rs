//! The CLI's tables: plain columns (no borders), aligned by comfy-table,
//! one per command that lists things: the rewrite report, `analyze`,
//! `simulate` and `model`.

use comfy_table::{CellAlignment, ContentArrangement, Table, presets};

use equarx::passes::quantize_collectives::report::PlanSummary;
use equarx::plan::{Form, Kernels, Rotation};
use equarx::{OpReport, Platform, Stage};

/// How a column's cells line up.
#[derive(Clone, Copy)]
pub enum Align {
    Left,
    Right,
}

/// A table with these columns; add rows, then [`Columns::render`].
pub struct Columns(Table);

impl Columns {
    pub fn new(columns: &[(&str, Align)]) -> Self {
        let mut t = Table::new();
        t.load_preset(presets::NOTHING)
            .set_content_arrangement(ContentArrangement::Disabled)
            .set_header(columns.iter().map(|(name, _)| *name));
        for (k, (_, align)) in columns.iter().enumerate() {
            if let Some(c) = t.column_mut(k) {
                c.set_padding((0, 1)).set_cell_alignment(match align {
                    Align::Left => CellAlignment::Left,
                    Align::Right => CellAlignment::Right,
                });
            }
        }
        Columns(t)
    }

    pub fn row(&mut self, cells: Vec<String>) -> &mut Self {
        self.0.add_row(cells);
        self
    }

    /// The table's lines, each ending in a newline, without trailing spaces.
    pub fn render(&self) -> String {
        self.0
            .lines()
            .map(|l| format!("{}\n", l.trim_end()))
            .collect()
    }
}

/// `--report`: every collective's decision, plan, bytes and predictions,
/// the pipeline stage the module was taken to be at and the backend the
/// rewrite was emitted for.
pub fn report(report: &[OpReport], stage: Stage, platform: Platform) -> String {
    use Align::{Left, Right};
    let mut t = Columns::new(&[
        ("collective", Left),
        ("op", Left),
        ("shape", Left),
        ("P", Right),
        ("mode", Left),
        ("plan", Left),
        ("decision", Left),
        ("wire before", Right),
        ("wire after", Right),
        ("ratio", Right),
        ("rel.err", Right),
        ("data", Left),
        ("model", Right),
        ("reason", Left),
    ]);
    for r in report {
        let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        t.row(vec![
            r.op.name.clone(),
            r.op.opcode.clone(),
            r.op.shape.clone(),
            r.op.group_size.map_or("-".into(), |p| p.to_string()),
            r.op.mode.clone(),
            r.plan.as_ref().map_or("-".into(), plan_cell),
            if r.rewritten { "rewritten" } else { "skipped" }.into(),
            opt(r.wire_bytes_before),
            opt(r.wire_bytes_after),
            r.wire_ratio().map_or("-".into(), |x| format!("{x:.3}")),
            r.predicted_rel_rms
                .map_or("-".into(), |e| format!("{:.2}%", e * 100.0)),
            r.basis.map_or("-".into(), |b| b.word().to_string()),
            r.predicted_time
                .as_ref()
                .map_or("-".into(), |t| format!("{:.2}x", t.speedup)),
            r.reason.clone().unwrap_or_default(),
        ]);
    }
    let rewritten = report.iter().filter(|r| r.rewritten).count();
    format!(
        "{}{rewritten} of {} collectives rewritten, the module taken to be {stage} (--stage), \
         emitted for {platform} (--platform); \
         rel.err: predicted on the data column's basis (prior: fitted to a real LLM's \
         all-reduce inputs; profile: this op's own, --profile; prior*: the profile holds \
         nothing for it, --report-json says why); model: the time model's \
         speedup on --topology, a model, not a measurement\n",
        t.render(),
        report.len()
    )
}

/// `ring+hadamard/loop`: a plan's algorithm, rotation and form (when it
/// repeats steps); `/mosaic` when its steps are equarx's own kernels.
pub fn plan_cell(p: &PlanSummary) -> String {
    let rotation = match p.rotation {
        Rotation::Hadamard => "+hadamard",
        Rotation::None => "",
    };
    let form = match p.form {
        Some(Form::Loop) => "/loop",
        Some(Form::Unrolled) => "/unrolled",
        None => "",
    };
    let kernels = match p.config.kernels {
        Kernels::Mosaic => "/mosaic",
        Kernels::Triton => "/triton",
        Kernels::Hlo => "",
    };
    format!("{}{rotation}{form}{kernels}", p.algorithm)
}

/// `64KiB`, `1MiB`, or bytes.
pub fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}KiB", b >> 10),
        b => format!("{b}B"),
    }
}
