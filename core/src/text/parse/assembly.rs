//! Assembly: the module header, the stack-frame table, computations and
//! instructions as read, and the module put together from them (names
//! resolved, computations ordered callees first).

use std::collections::{HashMap, HashSet};

use super::lexer::Tok;
use super::{Failure, Parser, Res};
use crate::ir::DeviceCounts;
use crate::ir::shape::{self, type_from_name};
use crate::proto::hlo_buffer_donor_proto::BufferDonorEntryProto;
use crate::proto::hlo_input_output_alias_proto::AliasEntryProto;
use crate::proto::hlo_schedule_proto::InstructionSequence;
use crate::proto::stack_frame_index_proto::{FileLocation, StackFrame};
use crate::proto::{
    DotDimensionNumbers, FrontendAttributes, HloBufferDonorProto, HloComputationProto,
    HloInputOutputAliasProto, HloInstructionProto, HloModuleProto, HloScheduleProto, OpSharding,
    PrecisionConfig, PrimitiveType, ProgramShapeProto, ShapeProto, StackFrameIndexProto,
    op_sharding,
};
use crate::text::ParsedText;

/// What the module header says.
#[derive(Default)]
struct Header {
    name: String,
    is_scheduled: bool,
    /// `entry_computation_layout`: parameter shapes and the result shape.
    layout: Option<(Vec<ShapeProto>, ShapeProto)>,
    counts: DeviceCounts,
    input_output_alias: Option<HloInputOutputAliasProto>,
    buffer_donor: Option<HloBufferDonorProto>,
    frontend_attributes: Option<FrontendAttributes>,
}

/// A computation as read, before computation names are resolved.
pub(super) struct CompText {
    name: String,
    name_at: usize,
    id: i64,
    is_entry: bool,
    entry_at: usize,
    pub(super) instrs: Vec<HloInstructionProto>,
    /// Where each instruction's name is, for later errors.
    instr_at: Vec<usize>,
    /// Each instruction's called computations, by name, in proto order.
    calls: Vec<Vec<(String, usize)>>,
    pub(super) by_name: HashMap<String, usize>,
    root: Option<usize>,
    execution_thread: String,
}

impl<'a> Parser<'a> {
    pub(super) fn module(&mut self) -> Res<ParsedText> {
        if !self.eat_ident("HloModule")? {
            return Err(self.expected("'HloModule' at the start of the module"));
        }
        let (name, _) = self.name("the module name")?;
        let mut header = Header {
            name,
            ..Header::default()
        };
        let mut seen = HashSet::new();
        while self.eat_sym(',')? {
            self.header_attribute(&mut header, &mut seen)?;
        }
        let frames = self.stack_frames()?;
        let mut comps = Vec::new();
        while *self.peek()? != Tok::Eof {
            let id = i64::try_from(comps.len() + 1).unwrap_or(i64::MAX);
            comps.push(self.computation(id)?);
        }
        if comps.is_empty() {
            return Err(self.expected("a computation"));
        }
        assemble(header, comps, frames)
    }

    fn header_attribute(&mut self, h: &mut Header, seen: &mut HashSet<String>) -> Res<()> {
        let (key, at) = self.ident("a module attribute")?;
        self.expect_sym('=', &format!("after '{key}'"))?;
        if !seen.insert(key.clone()) {
            return Err(Failure::new(
                at,
                format!("duplicate module attribute '{key}'"),
            ));
        }
        match key.as_str() {
            "is_scheduled" => h.is_scheduled = self.bool(&key)?,
            "replica_count" => h.counts.replica_count = Some(self.count(&key)?),
            "num_partitions" => h.counts.num_partitions = Some(self.count(&key)?),
            "entry_computation_layout" => {
                self.expect_sym('{', "to start the entry computation layout")?;
                let params = self.list('(', ')', "the parameter shapes", |p| p.shape())?;
                if *self.peek()? != Tok::Arrow {
                    return Err(self.expected("'->' before the result shape"));
                }
                self.bump()?;
                let result = self.shape()?;
                self.expect_sym('}', "to end the entry computation layout")?;
                h.layout = Some((params, result));
            }
            "input_output_alias" => {
                let entries = self.list('{', '}', "input_output_alias", |p| {
                    let output_shape_index = p.int_list("an output shape index")?;
                    p.expect_sym(':', "after the output shape index")?;
                    p.expect_sym('(', "before the aliased parameter")?;
                    let parameter_number = p.count("a parameter number")?;
                    p.expect_sym(',', "after the parameter number")?;
                    let parameter_shape_index = p.int_list("a parameter shape index")?;
                    let mut kind = 1; // XLA's default: may-alias
                    if p.eat_sym(',')? {
                        let (k, at) = p.ident("may-alias or must-alias")?;
                        kind = match k.as_str() {
                            "may-alias" => 1,
                            "must-alias" => 2,
                            _ => {
                                return Err(Failure::new(
                                    at,
                                    format!("expected may-alias or must-alias, found '{k}'"),
                                ));
                            }
                        };
                    }
                    p.expect_sym(')', "after the aliased parameter")?;
                    Ok(AliasEntryProto {
                        output_shape_index,
                        parameter_number,
                        parameter_shape_index,
                        kind,
                    })
                })?;
                h.input_output_alias = Some(HloInputOutputAliasProto { entries });
            }
            "buffer_donor" => {
                let entries = self.list('{', '}', "buffer_donor", |p| {
                    p.expect_sym('(', "before a buffer donor")?;
                    let parameter_number = p.count("a parameter number")?;
                    p.expect_sym(',', "after the parameter number")?;
                    let parameter_shape_index = p.int_list("a parameter shape index")?;
                    p.expect_sym(')', "after the buffer donor")?;
                    Ok(BufferDonorEntryProto {
                        parameter_number,
                        parameter_shape_index,
                    })
                })?;
                h.buffer_donor = Some(HloBufferDonorProto { entries });
            }
            "frontend_attributes" => h.frontend_attributes = Some(self.frontend_attributes()?),
            // Module config, not part of an HloModuleProto (XLA's parser puts
            // them into the HloModuleConfig): read and dropped.
            "alias_passthrough_params" => {
                self.bool(&key)?;
            }
            "allow_spmd_sharding_propagation_to_parameters"
            | "allow_spmd_sharding_propagation_to_output" => {
                if self.is_sym('{')? {
                    self.list('{', '}', &key, |p| p.bool("a list entry"))?;
                } else {
                    self.bool(&key)?;
                }
            }
            "origin_recovery_table" => {
                return Err(Failure::new(
                    at,
                    "module attribute 'origin_recovery_table' is not supported",
                ));
            }
            _ => {
                return Err(Failure::new(
                    at,
                    format!("unknown module attribute '{key}'"),
                ));
            }
        }
        Ok(())
    }

    /// The `FileNames` ... `StackFrames` tables, if present.
    fn stack_frames(&mut self) -> Res<Option<StackFrameIndexProto>> {
        if !self.eat_ident("FileNames")? {
            return Ok(None);
        }
        let mut index = StackFrameIndexProto::default();
        while matches!(self.peek()?, Tok::Number(_)) {
            self.table_index(index.file_names.len())?;
            index.file_names.push(self.string("a file name")?);
        }
        if !self.eat_ident("FunctionNames")? {
            return Err(self.expected("'FunctionNames'"));
        }
        while matches!(self.peek()?, Tok::Number(_)) {
            self.table_index(index.function_names.len())?;
            index.function_names.push(self.string("a function name")?);
        }
        if !self.eat_ident("FileLocations")? {
            return Err(self.expected("'FileLocations'"));
        }
        while matches!(self.peek()?, Tok::Number(_)) {
            self.table_index(index.file_locations.len())?;
            let at = self.here()?;
            let mut l = FileLocation::default();
            let mut seen = HashSet::new();
            self.sub_attributes("a file location", |p, key, at| {
                let v = p.int32(key)?;
                match key {
                    "file_name_id" => l.file_name_id = v,
                    "function_name_id" => l.function_name_id = v,
                    "line" => l.line = v,
                    "end_line" => l.end_line = v,
                    "column" => l.column = v,
                    "end_column" => l.end_column = v,
                    _ => {
                        return Err(Failure::new(
                            at,
                            format!("unknown file location field '{key}'"),
                        ));
                    }
                }
                seen.insert(key.to_string());
                Ok(())
            })?;
            require(
                &seen,
                &[
                    "file_name_id",
                    "function_name_id",
                    "line",
                    "end_line",
                    "column",
                    "end_column",
                ],
                at,
            )?;
            index.file_locations.push(l);
        }
        if !self.eat_ident("StackFrames")? {
            return Err(self.expected("'StackFrames'"));
        }
        while matches!(self.peek()?, Tok::Number(_)) {
            self.table_index(index.stack_frames.len())?;
            let at = self.here()?;
            let mut f = StackFrame::default();
            let mut seen = HashSet::new();
            self.sub_attributes("a stack frame", |p, key, at| {
                let v = p.int32(key)?;
                match key {
                    "file_location_id" => f.file_location_id = v,
                    // XLA prints parent ids one up (0, "no parent", prints as 1).
                    "parent_frame_id" => f.parent_frame_id = v.saturating_sub(1),
                    _ => {
                        return Err(Failure::new(
                            at,
                            format!("unknown stack frame field '{key}'"),
                        ));
                    }
                }
                seen.insert(key.to_string());
                Ok(())
            })?;
            require(&seen, &["file_location_id", "parent_frame_id"], at)?;
            index.stack_frames.push(f);
        }
        Ok(Some(index))
    }

    /// The 1-based row number in front of each stack-frame table row.
    fn table_index(&mut self, rows_so_far: usize) -> Res<()> {
        let at = self.here()?;
        let n = self.int("a table row number")?;
        if usize::try_from(n).ok() != Some(rows_so_far + 1) {
            return Err(Failure::new(
                at,
                format!("expected row number {}, found {n}", rows_so_far + 1),
            ));
        }
        Ok(())
    }

    /// `{ key=value ... }` with optional commas between entries; `f` reads
    /// each value. Duplicate keys are errors.
    pub(super) fn sub_attributes(
        &mut self,
        what: &str,
        mut f: impl FnMut(&mut Self, &str, usize) -> Res<()>,
    ) -> Res<()> {
        self.expect_sym('{', &format!("to start {what}"))?;
        let mut seen = HashSet::new();
        loop {
            self.eat_sym(',')?;
            if self.eat_sym('}')? {
                return Ok(());
            }
            let (key, at) = self.ident(&format!("a field of {what} or '}}'"))?;
            self.expect_sym('=', &format!("after '{key}'"))?;
            if !seen.insert(key.clone()) {
                return Err(Failure::new(
                    at,
                    format!("duplicate field '{key}' in {what}"),
                ));
            }
            f(self, &key, at)?;
        }
    }

    fn computation(&mut self, id: i64) -> Res<CompText> {
        let entry_at = self.here()?;
        let is_entry = self.eat_ident("ENTRY")?;
        let (name, name_at) = self.name("a computation name")?;
        let mut declared_result = None;
        if self.is_sym('(')? {
            self.list('(', ')', "the parameter list", |p| {
                p.name("a parameter name")?;
                p.expect_sym(':', "after the parameter name")?;
                p.shape()
            })?;
            if *self.peek()? != Tok::Arrow {
                return Err(self.expected("'->' after the parameter list"));
            }
            self.bump()?;
            let at = self.here()?;
            declared_result = Some((self.shape()?, at));
        }
        self.expect_sym('{', &format!("to start the body of computation '{name}'"))?;
        let mut comp = CompText {
            name,
            name_at,
            id,
            is_entry,
            entry_at,
            instrs: Vec::new(),
            instr_at: Vec::new(),
            calls: Vec::new(),
            by_name: HashMap::new(),
            root: None,
            execution_thread: String::new(),
        };
        if self.is_sym('}')? {
            return Err(self.expected("an instruction"));
        }
        while !self.eat_sym('}')? {
            if *self.peek()? == Tok::Eof {
                return Err(self.expected(&format!("'}}' to end computation '{}'", comp.name)));
            }
            self.instruction(&mut comp)?;
        }
        let mut seen = HashSet::new();
        while self.eat_sym(',')? {
            let (key, at) = self.ident("a computation attribute")?;
            self.expect_sym('=', &format!("after '{key}'"))?;
            if !seen.insert(key.clone()) {
                return Err(Failure::new(at, format!("duplicate attribute '{key}'")));
            }
            match key.as_str() {
                // XLA writes the main thread as "" in protos.
                "execution_thread" => {
                    let t = self.string("an execution thread")?;
                    comp.execution_thread = if t == "main" { String::new() } else { t };
                }
                _ => {
                    return Err(Failure::new(
                        at,
                        format!("unknown computation attribute '{key}'"),
                    ));
                }
            }
        }
        let root = comp.root.unwrap_or(comp.instrs.len().saturating_sub(1));
        comp.root = Some(root);
        if let (Some((declared, at)), Some(root)) = (declared_result, comp.instrs.get(root)) {
            let actual = root.shape.clone().unwrap_or_default();
            if !shape::compatible(&declared, &actual) {
                return Err(Failure::new(
                    at,
                    format!(
                        "computation '{}' declares result {}, but its root '{}' is {}",
                        comp.name,
                        shape::describe(&declared),
                        root.name,
                        shape::describe(&actual)
                    ),
                ));
            }
        }
        Ok(comp)
    }
}

fn require(seen: &HashSet<String>, keys: &[&str], at: usize) -> Res<()> {
    for k in keys {
        if !seen.contains(*k) {
            return Err(Failure::new(at, format!("missing field '{k}'")));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Instructions

/// An instruction being read.
pub(super) struct Instr {
    pub(super) proto: HloInstructionProto,
    operand_shapes: Vec<ShapeProto>,
    /// Attribute names seen so far.
    pub(super) seen: HashSet<String>,
    /// Computation-valued attributes in text order: (attribute, names).
    pub(super) calls: Vec<(String, Vec<(String, usize)>)>,
    pub(super) operand_precision: Option<Vec<i32>>,
    pub(super) algorithm: Option<i32>,
}

/// The real opcodes ending in `-start`/`-update`/`-done`. Any other
/// `X-start` (and so on) with `X` an opcode is XLA's async syntax sugar for
/// an `async-start` wrapping `X`.
const REAL_ASYNC_OPCODES: &[&str] = &[
    "all-gather-start",
    "all-gather-done",
    "all-reduce-start",
    "all-reduce-done",
    "collective-permute-start",
    "collective-permute-done",
    "copy-start",
    "copy-done",
    "async-start",
    "async-update",
    "async-done",
    "send-done",
    "recv-done",
];

impl<'a> Parser<'a> {
    fn instruction(&mut self, comp: &mut CompText) -> Res<()> {
        let root_at = self.here()?;
        let is_root = self.eat_ident("ROOT")?;
        let (name, name_at) = self.name("an instruction name")?;
        if comp.by_name.contains_key(&name) {
            return Err(Failure::new(
                name_at,
                format!(
                    "instruction '{name}' is already defined in computation '{}'",
                    comp.name
                ),
            ));
        }
        self.expect_sym('=', &format!("after instruction name '{name}'"))?;
        let typed = matches!(self.peek()?, Tok::Ident(_)) && self.peek2()? == Tok::Sym('[');
        if !typed && !self.can_be_shape()? {
            return Err(self.expected(&format!("the shape of '{name}'")));
        }
        let shape = self.shape()?;
        let (opcode, op_at) = self.ident("an opcode")?;
        for suffix in ["-start", "-update", "-done"] {
            if let Some(wrapped) = opcode.strip_suffix(suffix) {
                if !REAL_ASYNC_OPCODES.contains(&opcode.as_str()) && is_known_opcode(wrapped) {
                    return Err(Failure::new(
                        op_at,
                        format!(
                            "'{opcode}' is XLA's async syntax sugar, which is not supported; \
                             print the module with syntax_sugar_async_ops=false"
                        ),
                    ));
                }
            }
        }
        let local = i64::try_from(comp.instrs.len() + 1).unwrap_or(i64::MAX);
        let mut ins = Instr {
            proto: HloInstructionProto {
                name: name.clone(),
                opcode: opcode.clone(),
                shape: Some(shape),
                id: (comp.id << 32) | local,
                ..Default::default()
            },
            operand_shapes: Vec::new(),
            seen: HashSet::new(),
            calls: Vec::new(),
            operand_precision: None,
            algorithm: None,
        };
        match opcode.as_str() {
            "parameter" => {
                self.expect_sym('(', "before the parameter number")?;
                ins.proto.parameter_number = self.count("a parameter number")?;
                self.expect_sym(')', "after the parameter number")?;
            }
            "constant" => {
                self.expect_sym('(', "before the constant's value")?;
                let shape = ins.proto.shape.clone().unwrap_or_default();
                ins.proto.literal = Some(Box::new(self.literal(&shape)?));
                self.expect_sym(')', "after the constant's value")?;
            }
            _ => self.operands(&mut ins, comp)?,
        }
        while self.eat_sym(',')? {
            self.attribute(&mut ins, comp)?;
        }
        let calls = Self::finish_instruction(&mut ins);
        let idx = comp.instrs.len();
        if is_root {
            if comp.root.is_some() {
                return Err(Failure::new(
                    root_at,
                    format!("computation '{}' has more than one ROOT", comp.name),
                ));
            }
            comp.root = Some(idx);
        }
        comp.by_name.insert(name, idx);
        comp.instrs.push(ins.proto);
        comp.instr_at.push(name_at);
        comp.calls.push(calls);
        Ok(())
    }

    /// `(` (shape? name),* `)`: operands must already be defined.
    fn operands(&mut self, ins: &mut Instr, comp: &CompText) -> Res<()> {
        self.expect_sym('(', "after the opcode")?;
        if self.eat_sym(')')? {
            return Ok(());
        }
        loop {
            let declared = if self.can_be_shape()? {
                Some(self.shape()?)
            } else {
                None
            };
            let (name, at) = self.name("an operand name")?;
            let operand = comp
                .by_name
                .get(&name)
                .and_then(|&k| comp.instrs.get(k))
                .ok_or_else(|| {
                    Failure::new(
                        at,
                        format!(
                            "undefined instruction '{name}' (operands must be defined before use)"
                        ),
                    )
                })?;
            let actual = operand.shape.clone().unwrap_or_default();
            if let Some(declared) = declared {
                if !shape::compatible(&declared, &actual) {
                    return Err(Failure::new(
                        at,
                        format!(
                            "operand '{name}' is {}, not {} as written",
                            shape::describe(&actual),
                            shape::describe(&declared)
                        ),
                    ));
                }
            }
            ins.proto.operand_ids.push(operand.id);
            ins.operand_shapes.push(actual);
            if self.eat_sym(',')? {
                continue;
            }
            self.expect_sym(')', "after the operands")?;
            return Ok(());
        }
    }

    /// Whether the next tokens start a shape (`(` or `type[`).
    fn can_be_shape(&mut self) -> Res<bool> {
        match self.peek()?.clone() {
            Tok::Sym('(') => Ok(true),
            Tok::Ident(t) => Ok(
                type_from_name(&t).is_some_and(|ty| ty != PrimitiveType::Tuple)
                    && self.peek2()? == Tok::Sym('['),
            ),
            _ => Ok(false),
        }
    }

    /// Fills what XLA's parser fills when the text leaves it out, and orders
    /// the called computations the way XLA stores them.
    fn finish_instruction(ins: &mut Instr) -> Vec<(String, usize)> {
        let n = ins.operand_shapes.len();
        let p = &mut ins.proto;
        let seen = |k: &str| ins.seen.contains(k);
        let precision = |n: usize, ins_prec: &Option<Vec<i32>>, alg: Option<i32>| PrecisionConfig {
            operand_precision: ins_prec.clone().unwrap_or_else(|| vec![0; n]),
            algorithm: alg.unwrap_or(0),
        };
        match p.opcode.as_str() {
            "dot" => {
                p.dot_dimension_numbers.get_or_insert_with(Box::default);
                p.precision_config = Some(Box::new(precision(
                    n,
                    &ins.operand_precision,
                    ins.algorithm,
                )));
            }
            "ragged-dot" => {
                let r = p
                    .ragged_dot_dimension_numbers
                    .get_or_insert_with(Box::default);
                r.dot_dimension_numbers
                    .get_or_insert_with(DotDimensionNumbers::default);
                p.precision_config = Some(Box::new(precision(
                    2,
                    &ins.operand_precision,
                    ins.algorithm,
                )));
            }
            "scaled-dot" => {
                p.dot_dimension_numbers.get_or_insert_with(Box::default);
                p.precision_config = Some(Box::new(precision(
                    2,
                    &ins.operand_precision,
                    ins.algorithm,
                )));
            }
            "convolution" => {
                p.window.get_or_insert_with(Box::default);
                // XLA's convolutions always carry a (here empty) sparsity config.
                p.sparsity_config.get_or_insert_with(Box::default);
                if !seen("feature_group_count") {
                    p.feature_group_count = 1;
                }
                if !seen("batch_group_count") {
                    p.batch_group_count = 1;
                }
                p.precision_config = Some(Box::new(precision(
                    n,
                    &ins.operand_precision,
                    ins.algorithm,
                )));
            }
            "custom-call" => {
                if !seen("feature_group_count") {
                    p.feature_group_count = 1;
                }
                if !seen("batch_group_count") {
                    p.batch_group_count = 1;
                }
                if !seen("api_version") {
                    p.custom_call_api_version = 1; // API_VERSION_ORIGINAL
                }
                p.precision_config = Some(Box::new(precision(
                    n,
                    &ins.operand_precision,
                    ins.algorithm,
                )));
            }
            "reduce-window" | "select-and-scatter" => {
                p.window.get_or_insert_with(Box::default);
            }
            "compare" if !seen("type") => {
                let ty = ins.operand_shapes.first().map_or(0, |s| s.element_type);
                p.comparison_type = default_comparison_type(ty).to_string();
            }
            "topk" if !seen("largest") => p.largest = true,
            // XLA keeps the thread on the start only, and "main" as "".
            "async-start" if p.async_execution_thread == "main" => {
                p.async_execution_thread.clear();
            }
            // XLA derives these from their start op: the proto of an
            // async-update/-done carries neither thread nor computation.
            "async-update" | "async-done" => {
                p.async_execution_thread.clear();
                ins.calls.clear();
            }
            _ => {}
        }
        if p.sharding.is_some() {
            if let (Some(s), Some(sh)) = (p.sharding.take(), p.shape.as_ref()) {
                p.sharding = Some(Box::new(normalize_tuple_sharding(*s, sh)));
            }
        }
        let take = |calls: &mut Vec<(String, Vec<(String, usize)>)>, key: &str| {
            calls
                .iter()
                .position(|(k, _)| k == key)
                .map(|i| calls.remove(i).1)
                .unwrap_or_default()
        };
        let calls = &mut ins.calls;
        let mut ordered = match p.opcode.as_str() {
            "while" => {
                let mut v = take(calls, "body");
                v.extend(take(calls, "condition"));
                v
            }
            "select-and-scatter" => {
                let mut v = take(calls, "select");
                v.extend(take(calls, "scatter"));
                v
            }
            "conditional" => {
                let mut v = take(calls, "true_computation");
                v.extend(take(calls, "false_computation"));
                v
            }
            _ => Vec::new(),
        };
        for (_, names) in calls.drain(..) {
            ordered.extend(names);
        }
        ordered
    }
}

/// XLA's `Comparison::DefaultComparisonType`.
fn default_comparison_type(element_type: i32) -> &'static str {
    let name = shape::type_name(element_type).unwrap_or("");
    if shape::is_float(element_type) || name.starts_with('c') {
        "FLOAT"
    } else if name.starts_with('s') {
        "SIGNED"
    } else {
        "UNSIGNED"
    }
}

/// A single sharding on a tuple-shaped instruction applies to every leaf
/// (XLA's `NormalizeTupleSharding`).
fn normalize_tuple_sharding(s: OpSharding, sh: &ShapeProto) -> OpSharding {
    if !shape::is_tuple(sh) || s.r#type == op_sharding::Type::Tuple as i32 {
        return s;
    }
    fn leaves(s: &ShapeProto) -> usize {
        if shape::is_tuple(s) {
            s.tuple_shapes.iter().map(leaves).sum()
        } else {
            1
        }
    }
    OpSharding {
        r#type: op_sharding::Type::Tuple as i32,
        tuple_shardings: vec![s; leaves(sh)],
        ..Default::default()
    }
}

/// Every opcode XLA's `StringToHloOpcode` knows.
fn is_known_opcode(op: &str) -> bool {
    #[rustfmt::skip]
    const OPCODES: &[&str] = &[
        "abs", "acos", "acosh", "add", "add-dependency", "after-all", "all-gather",
        "all-gather-done", "all-gather-start", "all-reduce", "all-reduce-done", "all-reduce-start",
        "all-to-all", "and", "asin", "asinh", "async-done", "async-start", "async-update", "atan2",
        "atanh", "batch-norm-grad", "batch-norm-inference", "batch-norm-training", "bitcast",
        "bitcast-convert", "broadcast", "call", "cbrt", "ceil", "cholesky", "clamp",
        "collective-broadcast", "collective-permute", "collective-permute-done",
        "collective-permute-start", "count-leading-zeros", "compare", "complex", "concatenate",
        "conditional", "constant", "convert", "convolution", "copy", "copy-done", "copy-start",
        "cosine", "cosh", "custom-call", "divide", "domain", "dot", "dynamic-reshape",
        "dynamic-slice", "dynamic-update-slice", "erf", "exponential", "exponential-minus-one",
        "fft", "floor", "fusion", "gather", "get-dimension-size", "get-tuple-element", "imag",
        "infeed", "iota", "is-finite", "log", "log-plus-one", "logistic", "map", "maximum",
        "minimum", "multiply", "negate", "not", "opt-barrier", "optimization-barrier", "or",
        "outfeed", "pad", "parameter", "partition-id", "popcnt", "power", "ragged-all-to-all",
        "ragged-dot", "real", "recv", "recv-done", "reduce", "reduce-precision", "reduce-scatter",
        "reduce-window", "remainder", "replica-id", "reshape", "reverse", "rng",
        "rng-bit-generator", "rng-get-and-update-state", "round-nearest-afz", "round-nearest-even",
        "rsqrt", "scan", "scaled-dot", "scatter", "select", "select-and-scatter", "send",
        "send-done", "set-dimension-size", "shift-left", "shift-right-arithmetic",
        "shift-right-logical", "sign", "sine", "sinh", "slice", "sort", "sqrt",
        "stochastic-convert", "subtract", "tan", "tanh", "topk", "transpose", "triangular-solve",
        "tuple", "while", "xor",
    ];
    OPCODES.contains(&op)
}

// ---------------------------------------------------------------------------
// Assembling the module

/// Resolves computation names, orders computations callees first and fills
/// the module-level fields.
fn assemble(
    header: Header,
    mut comps: Vec<CompText>,
    frames: Option<StackFrameIndexProto>,
) -> Res<ParsedText> {
    let mut by_name: HashMap<String, usize> = HashMap::new();
    for (k, c) in comps.iter().enumerate() {
        if by_name.insert(c.name.clone(), k).is_some() {
            return Err(Failure::new(
                c.name_at,
                format!("computation '{}' is already defined", c.name),
            ));
        }
    }
    let mut entry = None;
    for (k, c) in comps.iter().enumerate() {
        if c.is_entry {
            if entry.is_some() {
                return Err(Failure::new(c.entry_at, "more than one ENTRY computation"));
            }
            entry = Some(k);
        }
    }
    let entry = entry.unwrap_or(comps.len() - 1);

    // Called computations: names → ids; per computation, per instruction,
    // the callees (for the ordering below).
    let ids: Vec<i64> = comps.iter().map(|c| c.id).collect();
    let mut callees: Vec<Vec<Vec<(usize, usize)>>> = Vec::with_capacity(comps.len());
    let mut fusion_callee = vec![false; comps.len()];
    for c in &mut comps {
        let mut per_instr = Vec::with_capacity(c.instrs.len());
        for (instr, calls) in c.instrs.iter_mut().zip(&c.calls) {
            let mut these = Vec::with_capacity(calls.len());
            for (name, at) in calls {
                let k = *by_name
                    .get(name)
                    .ok_or_else(|| Failure::new(*at, format!("undefined computation '{name}'")))?;
                instr.called_computation_ids.push(ids[k]);
                if instr.opcode == "fusion" {
                    fusion_callee[k] = true;
                }
                these.push((k, *at));
            }
            per_instr.push(these);
        }
        callees.push(per_instr);
    }
    check_acyclic(&comps, &callees)?;
    let order = post_order(&callees);

    let mut module = HloModuleProto {
        name: header.name,
        entry_computation_name: comps[entry].name.clone(),
        entry_computation_id: comps[entry].id,
        input_output_alias: header.input_output_alias,
        buffer_donor: header.buffer_donor,
        frontend_attributes: header.frontend_attributes,
        stack_frame_index: frames,
        ..Default::default()
    };
    let mut schedule = HloScheduleProto::default();
    let mut protos: Vec<Option<HloComputationProto>> = Vec::with_capacity(comps.len());
    for (k, c) in comps.into_iter().enumerate() {
        let root = c.root.and_then(|r| c.instrs.get(r)).ok_or_else(|| {
            Failure::new(
                c.name_at,
                format!("computation '{}' has no instructions", c.name),
            )
        })?;
        let root_id = root.id;
        let result = root.shape.clone();
        // Parameters: numbers 0..n-1, each once.
        let mut params: Vec<(i64, usize)> = c
            .instrs
            .iter()
            .enumerate()
            .filter(|(_, i)| i.opcode == "parameter")
            .map(|(j, i)| (i.parameter_number, j))
            .collect();
        params.sort();
        for (n, &(number, j)) in params.iter().enumerate() {
            if usize::try_from(number).ok() != Some(n) {
                let at = c.instr_at.get(j).copied().unwrap_or(c.name_at);
                return Err(Failure::new(
                    at,
                    format!(
                        "computation '{}' has {} parameters, numbered 0 to {} once each; found parameter({number})",
                        c.name,
                        params.len(),
                        params.len() - 1
                    ),
                ));
            }
        }
        let program_shape = ProgramShapeProto {
            parameters: params
                .iter()
                .map(|&(_, j)| c.instrs[j].shape.clone().unwrap_or_default())
                .collect(),
            result,
            parameter_names: params
                .iter()
                .map(|&(_, j)| c.instrs[j].name.clone())
                .collect(),
        };
        if k == entry {
            let (parameters, result) = match &header.layout {
                Some((p, r)) => (p.clone(), Some(r.clone())),
                None => (
                    program_shape.parameters.clone(),
                    program_shape.result.clone(),
                ),
            };
            module.host_program_shape = Some(ProgramShapeProto {
                parameter_names: (0..parameters.len()).map(|n| format!("p{n}")).collect(),
                parameters,
                result,
            });
        }
        if header.is_scheduled && !fusion_callee[k] {
            schedule.sequences.insert(
                c.id,
                InstructionSequence {
                    instruction_ids: c.instrs.iter().map(|i| i.id).collect(),
                },
            );
        }
        protos.push(Some(HloComputationProto {
            name: c.name,
            instructions: c.instrs,
            program_shape: Some(program_shape),
            id: c.id,
            root_id,
            is_fusion_computation: fusion_callee[k],
            execution_thread: c.execution_thread,
        }));
    }
    module.computations = order
        .into_iter()
        .filter_map(|k| protos.get_mut(k).and_then(Option::take))
        .collect();
    if header.is_scheduled {
        module.schedule = Some(schedule);
    }
    // XLA prints a count only when it is not 1, and reads a missing one as
    // 1: so does equarx.
    Ok(ParsedText {
        proto: module,
        counts: DeviceCounts {
            replica_count: Some(header.counts.replica_count.unwrap_or(1)),
            num_partitions: Some(header.counts.num_partitions.unwrap_or(1)),
        },
    })
}

/// A computation that (transitively) calls itself is an error.
fn check_acyclic(comps: &[CompText], callees: &[Vec<Vec<(usize, usize)>>]) -> Res<()> {
    // 0 = unvisited, 1 = on the stack, 2 = done.
    let mut state = vec![0u8; comps.len()];
    for start in 0..comps.len() {
        if state[start] != 0 {
            continue;
        }
        let edges = |k: usize| callees[k].iter().flatten().copied().collect::<Vec<_>>();
        let mut stack = vec![(start, edges(start), 0usize)];
        state[start] = 1;
        while let Some((k, out, next)) = stack.last_mut() {
            if let Some(&(callee, at)) = out.get(*next) {
                *next += 1;
                match state[callee] {
                    0 => {
                        state[callee] = 1;
                        let e = edges(callee);
                        stack.push((callee, e, 0));
                    }
                    1 => {
                        let message = if *k == callee {
                            format!("computation '{}' calls itself", comps[callee].name)
                        } else {
                            format!(
                                "computation '{}' calls '{}', which calls it back (recursion)",
                                comps[*k].name, comps[callee].name
                            )
                        };
                        return Err(Failure::new(at, message));
                    }
                    _ => {}
                }
            } else {
                state[*k] = 2;
                stack.pop();
            }
        }
    }
    Ok(())
}

/// Computations callees first, otherwise in text order: a depth-first post
/// order that visits the computations in text order and each one's callees
/// in call order. Text XLA can parse lists callees first already (it needs
/// a computation defined before its use), and then this is the text order,
/// which is also what XLA's parser gives.
fn post_order(callees: &[Vec<Vec<(usize, usize)>>]) -> Vec<usize> {
    let n = callees.len();
    let mut emitted = vec![false; n];
    let mut order = Vec::with_capacity(n);
    for start in 0..n {
        if emitted[start] {
            continue;
        }
        // (computation, its callees, next callee); cycles were rejected.
        let flat = |k: usize| callees[k].iter().flatten().map(|c| c.0).collect::<Vec<_>>();
        let mut stack = vec![(start, flat(start), 0usize)];
        let mut on_stack = vec![false; n];
        on_stack[start] = true;
        while let Some((k, out, next)) = stack.last_mut() {
            match out.get(*next).copied() {
                Some(c) => {
                    *next += 1;
                    if !emitted[c] && !on_stack[c] {
                        on_stack[c] = true;
                        let e = flat(c);
                        stack.push((c, e, 0));
                    }
                }
                None => {
                    let k = *k;
                    stack.pop();
                    emitted[k] = true;
                    order.push(k);
                }
            }
        }
    }
    order
}
