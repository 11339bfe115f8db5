//! Structural comparison of two modules whose ids differ: every id becomes
//! the name it stands for, so "the same module" means the same computations
//! and instructions by name, with every field equal.

use std::collections::{BTreeMap, HashMap};

use equarx::proto::{HloInstructionProto, HloModuleProto};

/// One instruction with its references spelled as names.
#[derive(Debug, PartialEq)]
pub struct Instr {
    pub proto: HloInstructionProto,
    pub operands: Vec<String>,
    pub control_predecessors: Vec<String>,
    pub callees: Vec<String>,
    /// The metadata's stack frame, resolved to (file, function, line,
    /// end line, column, end column) from innermost to outermost: frame
    /// ids are renumbered by XLA's parser.
    pub stack: Vec<(String, String, i32, i32, i32, i32)>,
}

/// A module keyed by names: computation → (is root?, instruction → Instr).
#[derive(Debug, PartialEq)]
pub struct Normalized {
    pub entry: String,
    pub computations: BTreeMap<String, (String, BTreeMap<String, Instr>)>,
    /// Schedule as names, per computation.
    pub schedule: BTreeMap<String, Vec<String>>,
    pub header: HloModuleProto,
}

fn resolve(m: &HloModuleProto, mut frame: i32) -> Vec<(String, String, i32, i32, i32, i32)> {
    let Some(index) = &m.stack_frame_index else {
        return vec![];
    };
    let name = |v: &[String], id: i32| v.get((id - 1) as usize).cloned().unwrap_or_default();
    let mut chain = Vec::new();
    while frame > 0 && chain.len() < 1000 {
        let Some(f) = index.stack_frames.get((frame - 1) as usize) else {
            break;
        };
        if let Some(l) = index.file_locations.get((f.file_location_id - 1) as usize) {
            chain.push((
                name(&index.file_names, l.file_name_id),
                name(&index.function_names, l.function_name_id),
                l.line,
                l.end_line,
                l.column,
                l.end_column,
            ));
        }
        frame = f.parent_frame_id;
    }
    chain
}

pub fn normalize(m: &HloModuleProto) -> Normalized {
    let comp_names: HashMap<i64, String> = m
        .computations
        .iter()
        .map(|c| (c.id, c.name.clone()))
        .collect();
    let mut computations = BTreeMap::new();
    let mut schedule = BTreeMap::new();
    for c in &m.computations {
        let names: HashMap<i64, String> = c
            .instructions
            .iter()
            .map(|i| (i.id, i.name.clone()))
            .collect();
        let name_of = |ids: &[i64]| -> Vec<String> {
            ids.iter()
                .map(|i| names.get(i).cloned().unwrap_or_else(|| format!("?{i}")))
                .collect()
        };
        let mut instrs = BTreeMap::new();
        for i in &c.instructions {
            let mut proto = i.clone();
            proto.id = 0;
            proto.operand_ids.clear();
            proto.control_predecessor_ids.clear();
            proto.called_computation_ids.clear();
            let stack = match proto.metadata.as_mut() {
                Some(md) => resolve(m, std::mem::take(&mut md.stack_frame_id)),
                None => vec![],
            };
            instrs.insert(
                i.name.clone(),
                Instr {
                    proto,
                    operands: name_of(&i.operand_ids),
                    control_predecessors: name_of(&i.control_predecessor_ids),
                    callees: i
                        .called_computation_ids
                        .iter()
                        .map(|c| comp_names.get(c).cloned().unwrap_or_default())
                        .collect(),
                    stack,
                },
            );
        }
        let root = names.get(&c.root_id).cloned().unwrap_or_default();
        if let Some(seq) = m.schedule.as_ref().and_then(|s| s.sequences.get(&c.id)) {
            schedule.insert(c.name.clone(), name_of(&seq.instruction_ids));
        }
        computations.insert(c.name.clone(), (root, instrs));
    }
    let mut header = m.clone();
    header.computations.clear();
    header.schedule = None;
    header.entry_computation_id = 0;
    header.id = 0;
    // Compared through the instructions' resolved frames.
    header.stack_frame_index = None;
    Normalized {
        entry: comp_names
            .get(&m.entry_computation_id)
            .cloned()
            .unwrap_or_default(),
        computations,
        schedule,
        header,
    }
}

/// The differences between two normalized modules, one line each (empty:
/// the same module).
pub fn differences(a: &Normalized, b: &Normalized) -> Vec<String> {
    let mut out = Vec::new();
    if a.entry != b.entry {
        out.push(format!("entry {} vs {}", a.entry, b.entry));
    }
    for (name, (root, instrs)) in &a.computations {
        let Some((root_b, instrs_b)) = b.computations.get(name) else {
            out.push(format!("computation {name} missing"));
            continue;
        };
        if root != root_b {
            out.push(format!("{name}: root {root} vs {root_b}"));
        }
        for (iname, i) in instrs {
            match instrs_b.get(iname) {
                None => out.push(format!("{name}/{iname} missing")),
                Some(j) if i != j => out.push(format!(
                    "{name}/{iname}: {}",
                    line_diff(&format!("{i:#?}"), &format!("{j:#?}"))
                )),
                _ => {}
            }
        }
        for iname in instrs_b.keys().filter(|k| !instrs.contains_key(*k)) {
            out.push(format!("{name}/{iname} extra"));
        }
    }
    for name in b
        .computations
        .keys()
        .filter(|k| !a.computations.contains_key(*k))
    {
        out.push(format!("computation {name} extra"));
    }
    if a.schedule != b.schedule {
        out.push(format!(
            "schedules differ: {:?} vs {:?}",
            a.schedule.keys(),
            b.schedule.keys()
        ));
    }
    if a.header != b.header {
        out.push(format!(
            "module fields differ:\n  {:?}\n  {:?}",
            a.header, b.header
        ));
    }
    out
}

/// The lines of pretty-printed values that differ, `-ours +theirs`.
fn line_diff(a: &str, b: &str) -> String {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let mut out = String::new();
    for k in 0..la.len().max(lb.len()) {
        let (x, y) = (
            la.get(k).copied().unwrap_or(""),
            lb.get(k).copied().unwrap_or(""),
        );
        if x != y {
            out.push_str(&format!("\n    - {}\n    + {}", x.trim(), y.trim()));
            if out.len() > 600 {
                break;
            }
        }
    }
    out
}
