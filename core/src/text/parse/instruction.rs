//! An instruction: `ROOT? name = shape opcode(operands), attributes`, read
//! into the proto XLA's parser would make, with the defaults XLA fills in
//! when the text leaves them out.

use std::collections::HashSet;

use super::computation::CompText;
use super::lexer::Tok;
use super::{Failure, Parser, Res};
use crate::ir::opcode::Opcode;
use crate::ir::shape::{self, type_from_name};
use crate::proto::{
    DotDimensionNumbers, HloInstructionProto, OpSharding, PrecisionConfig, PrimitiveType,
    ShapeProto, op_sharding,
};

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

impl<'a> Parser<'a> {
    pub(super) fn instruction(&mut self, comp: &mut CompText) -> Res<()> {
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
        // An `X-start` (`-update`, `-done`) that is no opcode itself, with
        // `X` an opcode, is XLA's async syntax sugar for an `async-start`
        // wrapping `X`; the real ones (`all-gather-start`, ...) are in the
        // opcode table.
        for suffix in ["-start", "-update", "-done"] {
            if let Some(wrapped) = opcode.strip_suffix(suffix) {
                if Opcode::parse(&opcode).is_none() && Opcode::parse(wrapped).is_some() {
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
        match Opcode::parse(&opcode) {
            Some(Opcode::Parameter) => {
                self.expect_sym('(', "before the parameter number")?;
                ins.proto.parameter_number = self.count("a parameter number")?;
                self.expect_sym(')', "after the parameter number")?;
            }
            Some(Opcode::Constant) => {
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
        match Opcode::parse(&p.opcode) {
            Some(Opcode::Dot) => {
                p.dot_dimension_numbers.get_or_insert_with(Box::default);
                p.precision_config = Some(Box::new(precision(
                    n,
                    &ins.operand_precision,
                    ins.algorithm,
                )));
            }
            Some(Opcode::RaggedDot) => {
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
            Some(Opcode::ScaledDot) => {
                p.dot_dimension_numbers.get_or_insert_with(Box::default);
                p.precision_config = Some(Box::new(precision(
                    2,
                    &ins.operand_precision,
                    ins.algorithm,
                )));
            }
            Some(Opcode::Convolution) => {
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
            Some(Opcode::CustomCall) => {
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
            Some(Opcode::ReduceWindow | Opcode::SelectAndScatter) => {
                p.window.get_or_insert_with(Box::default);
            }
            Some(Opcode::Compare) if !seen("type") => {
                let ty = ins.operand_shapes.first().map_or(0, |s| s.element_type);
                p.comparison_type = default_comparison_type(ty).to_string();
            }
            Some(Opcode::Topk) if !seen("largest") => p.largest = true,
            // XLA keeps the thread on the start only, and "main" as "".
            Some(Opcode::AsyncStart) if p.async_execution_thread == "main" => {
                p.async_execution_thread.clear();
            }
            // XLA derives these from their start op: the proto of an
            // async-update/-done carries neither thread nor computation.
            Some(Opcode::AsyncUpdate | Opcode::AsyncDone) => {
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
        let mut ordered = match Opcode::parse(&p.opcode) {
            Some(Opcode::While) => {
                let mut v = take(calls, "body");
                v.extend(take(calls, "condition"));
                v
            }
            Some(Opcode::SelectAndScatter) => {
                let mut v = take(calls, "select");
                v.extend(take(calls, "scatter"));
                v
            }
            Some(Opcode::Conditional) => {
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
