//! The HLO text printer.
//!
//! Output follows `HloModule::ToString` of current XLA with operand shapes
//! off and large constants on: one instruction per line,
//! `[ROOT ]%name = shape opcode(operands), attr=value, ...`, the op's own
//! attributes first, then called computations, sharding, frontend
//! attributes, control predecessors, metadata and backend config.
//!
//! The files follow the line: this one holds the entry points, the module
//! header, the computation layout, the stack-frame table and the small text
//! pieces every part shares (lists, C-escaped strings); [`instruction`]
//! prints one instruction line, [`attributes`] the attributes after its
//! operands (one file per attribute family), [`shapes`] and [`literals`]
//! what their names say.

mod attributes;
mod instruction;
mod literals;
mod shapes;

use std::collections::HashMap;
use std::fmt::Write;

use crate::ir::DeviceCounts;
use crate::ir::opcode::Opcode;
use crate::proto::{
    HloComputationProto, HloInstructionProto, HloModuleProto, ShapeProto, StackFrameIndexProto,
};
use attributes::frontend_attributes;
pub(crate) use shapes::print_shape;
use shapes::shape_without_layout;

#[derive(Debug, thiserror::Error)]
pub enum PrintError {
    #[error("{instr}: {message}")]
    Instruction { instr: String, message: String },
    #[error("{0}")]
    Module(String),
}

/// How to print.
#[derive(Clone, Copy, Debug, Default)]
pub struct PrintOptions {
    /// Rename every instruction `base.N` with N counting up in print order
    /// per base, so that snapshots do not churn when ids shift.
    pub canonical_names: bool,
}

/// Prints `module` the way XLA does, with constants in full.
pub fn print_module(module: &HloModuleProto, counts: &DeviceCounts) -> Result<String, PrintError> {
    print_module_with(module, counts, PrintOptions::default())
}

pub fn print_module_with(
    module: &HloModuleProto,
    counts: &DeviceCounts,
    options: PrintOptions,
) -> Result<String, PrintError> {
    let p = Printer::new(module, options);
    p.module(counts)
}

struct Printer<'a> {
    module: &'a HloModuleProto,
    /// Instruction id → printed name.
    names: HashMap<i64, String>,
    /// Instruction id → shape (for defaults that depend on operand types).
    shapes: HashMap<i64, &'a ShapeProto>,
    comp_names: HashMap<i64, &'a str>,
}

impl<'a> Printer<'a> {
    fn new(module: &'a HloModuleProto, options: PrintOptions) -> Self {
        let mut names = HashMap::new();
        let mut shapes = HashMap::new();
        let mut counters: HashMap<String, usize> = HashMap::new();
        for c in &module.computations {
            for i in ordered(module, c) {
                let name = if options.canonical_names {
                    let base = canonical_base(&i.name).to_string();
                    let n = counters.entry(base.clone()).or_insert(0);
                    let name = format!("{base}.{n}");
                    *n += 1;
                    name
                } else {
                    i.name.clone()
                };
                names.insert(i.id, name);
                if let Some(s) = &i.shape {
                    shapes.insert(i.id, s);
                }
            }
        }
        let comp_names = module
            .computations
            .iter()
            .map(|c| (c.id, c.name.as_str()))
            .collect();
        Printer {
            module,
            names,
            shapes,
            comp_names,
        }
    }

    fn module(&self, counts: &DeviceCounts) -> Result<String, PrintError> {
        let m = self.module;
        let mut out = format!("HloModule {}", m.name);
        let scheduled = m.schedule.as_ref().is_some_and(|s| !s.sequences.is_empty());
        if scheduled {
            out.push_str(", is_scheduled=true");
        }
        if let Some(alias) = &m.input_output_alias {
            if !alias.entries.is_empty() {
                let entries: Vec<String> = alias
                    .entries
                    .iter()
                    .map(|e| {
                        let kind = match e.kind {
                            2 => ", must-alias",
                            1 => ", may-alias",
                            _ => "",
                        };
                        format!(
                            "{}: ({}, {}{kind})",
                            index_list(&e.output_shape_index),
                            e.parameter_number,
                            index_list(&e.parameter_shape_index)
                        )
                    })
                    .collect();
                let _ = write!(out, ", input_output_alias={{ {} }}", entries.join(", "));
            }
        }
        if let Some(donor) = &m.buffer_donor {
            if !donor.entries.is_empty() {
                let entries: Vec<String> = donor
                    .entries
                    .iter()
                    .map(|e| {
                        format!(
                            "({}, {})",
                            e.parameter_number,
                            index_list(&e.parameter_shape_index)
                        )
                    })
                    .collect();
                let _ = write!(out, ", buffer_donor={{ {} }}", entries.join(", "));
            }
        }
        if let Some(ps) = &m.host_program_shape {
            let params: Vec<String> = ps.parameters.iter().map(print_shape).collect();
            let result = ps
                .result
                .as_ref()
                .map(print_shape)
                .unwrap_or_else(|| "()".into());
            let _ = write!(
                out,
                ", entry_computation_layout={{({})->{}}}",
                params.join(", "),
                result
            );
        }
        if let Some(r) = counts.replica_count.filter(|&r| r != 1) {
            let _ = write!(out, ", replica_count={r}");
        }
        if let Some(p) = counts.num_partitions.filter(|&p| p != 1) {
            let _ = write!(out, ", num_partitions={p}");
        }
        if let Some(fa) = m.frontend_attributes.as_ref().filter(|f| !f.map.is_empty()) {
            let _ = write!(out, ", frontend_attributes={}", frontend_attributes(fa));
        }
        out.push_str("\n\n");
        if let Some(index) = &m.stack_frame_index {
            stack_frames(&mut out, index);
        }
        for c in &m.computations {
            self.computation(&mut out, c)?;
            out.push('\n');
        }
        // XLA ends the module with the last computation's closing brace line.
        while out.ends_with("\n\n") {
            out.pop();
        }
        Ok(out)
    }

    fn computation(&self, out: &mut String, c: &HloComputationProto) -> Result<(), PrintError> {
        let instrs = ordered(self.module, c);
        let mut params: Vec<&HloInstructionProto> = instrs
            .iter()
            .copied()
            .filter(|i| Opcode::of(i) == Some(Opcode::Parameter))
            .collect();
        params.sort_by_key(|i| i.parameter_number);
        let params: Vec<String> = params
            .iter()
            .map(|p| {
                format!(
                    "{}: {}",
                    self.name(p.id),
                    p.shape
                        .as_ref()
                        .map(shape_without_layout)
                        .unwrap_or_default()
                )
            })
            .collect();
        let root = instrs.iter().find(|i| i.id == c.root_id);
        let result = root
            .and_then(|r| r.shape.as_ref())
            .map(shape_without_layout)
            .unwrap_or_default();
        if c.id == self.module.entry_computation_id {
            out.push_str("ENTRY ");
        }
        let _ = write!(out, "%{} ({}) -> {}", c.name, params.join(", "), result);
        out.push_str(" {\n");
        for i in instrs {
            out.push_str("  ");
            if i.id == c.root_id {
                out.push_str("ROOT ");
            }
            self.instruction(out, i)
                .map_err(|message| PrintError::Instruction {
                    instr: i.name.clone(),
                    message,
                })?;
            out.push('\n');
        }
        out.push('}');
        // XLA's parser reads the thread after the body.
        if !c.execution_thread.is_empty() && c.execution_thread != "main" {
            let _ = write!(out, ", execution_thread={}", quoted(&c.execution_thread));
        }
        out.push('\n');
        Ok(())
    }

    fn name(&self, id: i64) -> String {
        self.names
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("unknown_id_{id}"))
    }

    fn comp(&self, id: i64) -> String {
        format!(
            "%{}",
            self.comp_names
                .get(&id)
                .copied()
                .unwrap_or("unknown_computation")
        )
    }
}

/// A computation's instructions in print order: the schedule's order when the
/// module is scheduled (XLA's parser takes the schedule from the text order),
/// else proto order.
fn ordered<'a>(
    module: &'a HloModuleProto,
    c: &'a HloComputationProto,
) -> Vec<&'a HloInstructionProto> {
    let seq = module
        .schedule
        .as_ref()
        .and_then(|s| s.sequences.get(&c.id))
        .filter(|s| s.instruction_ids.len() == c.instructions.len());
    match seq {
        Some(seq) => {
            let by_id: HashMap<i64, &HloInstructionProto> =
                c.instructions.iter().map(|i| (i.id, i)).collect();
            let v: Vec<_> = seq
                .instruction_ids
                .iter()
                .filter_map(|id| by_id.get(id).copied())
                .collect();
            if v.len() == c.instructions.len() {
                v
            } else {
                c.instructions.iter().collect()
            }
        }
        None => c.instructions.iter().collect(),
    }
}

/// `add.12` → `add`; names without a numeric suffix stay as they are.
fn canonical_base(name: &str) -> &str {
    match name.rsplit_once('.') {
        Some((base, n))
            if !base.is_empty() && n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty() =>
        {
            base
        }
        _ => name,
    }
}

/// The table exactly as stored: every row, in order, unreferenced ones too
/// (XLA's parser drops those when it reads the text; equarx's keeps them).
fn stack_frames(out: &mut String, s: &StackFrameIndexProto) {
    if s.file_names.is_empty()
        && s.function_names.is_empty()
        && s.file_locations.is_empty()
        && s.stack_frames.is_empty()
    {
        return;
    }
    out.push_str("FileNames\n");
    for (k, f) in s.file_names.iter().enumerate() {
        let _ = writeln!(out, "{} {}", k + 1, quoted(f));
    }
    out.push_str("\nFunctionNames\n");
    for (k, f) in s.function_names.iter().enumerate() {
        let _ = writeln!(out, "{} {}", k + 1, quoted(f));
    }
    out.push_str("\nFileLocations\n");
    for (k, l) in s.file_locations.iter().enumerate() {
        let _ = writeln!(
            out,
            "{} {{file_name_id={} function_name_id={} line={} end_line={} column={} end_column={}}}",
            k + 1,
            l.file_name_id,
            l.function_name_id,
            l.line,
            l.end_line,
            l.column,
            l.end_column
        );
    }
    out.push_str("\nStackFrames\n");
    // XLA prints parent ids one up (its parser takes one off again).
    for (k, f) in s.stack_frames.iter().enumerate() {
        let _ = writeln!(
            out,
            "{} {{file_location_id={} parent_frame_id={}}}",
            k + 1,
            f.file_location_id,
            i64::from(f.parent_frame_id) + 1
        );
    }
    out.push_str("\n\n");
}

// ---------------------------------------------------------------------------
// Text pieces every part shares

fn int_list<T: ToString>(v: &[T]) -> String {
    format!("{{{}}}", join(v, ","))
}

fn int_list_tight<T: ToString>(v: &[T]) -> String {
    format!("{{{}}}", join(v, ","))
}

fn index_list(v: &[i64]) -> String {
    format!("{{{}}}", join(v, ","))
}

fn join<T: ToString>(v: &[T], sep: &str) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(sep)
}

/// A double-quoted string, escaped as XLA's printer escapes (absl::CEscape):
/// quotes, backslash, `\n` `\r` `\t` by name, every other byte outside
/// printable ASCII in octal, so non-ASCII names read `"ma\303\237stab"` as
/// in XLA's dumps.
fn quoted(s: &str) -> String {
    quoted_bytes(s.as_bytes())
}

fn quoted_bytes(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len() + 2);
    out.push('"');
    for &c in b {
        match c {
            b'"' => out.push_str("\\\""),
            b'\'' => out.push_str("\\'"),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x20..=0x7e => out.push(char::from(c)),
            _ => {
                let _ = write!(out, "\\{c:03o}");
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_base_strips_numeric_suffix_only() {
        assert_eq!(canonical_base("add.12"), "add");
        assert_eq!(canonical_base("param"), "param");
        assert_eq!(canonical_base("main.0_spmd"), "main.0_spmd");
    }

    #[test]
    fn strings_are_escaped_like_xla() {
        // As in XLA's dump of tests/fixtures/frames: octal UTF-8 bytes, \'.
        assert_eq!(quoted("ma\u{df}stab"), r#""ma\303\237stab""#);
        assert_eq!(quoted("na\u{ef}ve's"), r#""na\303\257ve\'s""#);
        assert_eq!(
            quoted("a\"b\\c\n\t\r\u{7f}\u{1}"),
            r#""a\"b\\c\n\t\r\177\001""#
        );
    }
}
