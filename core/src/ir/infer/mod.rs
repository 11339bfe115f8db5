//! Result shapes of the ops equarx knows, the one source of truth for both
//! the builder (which fills shapes in) and the verifier (which checks them).
//!
//! Where HLO does not determine a result from its operands (the target type of
//! `convert`, the dimensions of `broadcast` or `reshape`, …) the instruction's
//! declared shape supplies it, and what can be checked is checked.
//!
//! One file per [`Class`] of opcode: [`elementwise`], [`movement`] (data
//! movement), [`reduction`], [`collectives`], and [`structure`] (tuples,
//! loops, device ids). [`Class::Unmodelled`] opcodes, and opcodes the
//! table does not know, are not modelled (`Ok(None)`).

mod collectives;
mod elementwise;
mod movement;
mod reduction;
mod structure;

use super::opcode::{Arity, Class, Opcode};
use super::shape::{self, is_array};
use crate::proto::{HloInstructionProto, PrimitiveType, ShapeProto};

/// The shape `instr` must have given its operands' shapes. `Ok(None)` means
/// equarx does not model the op's shape (nothing inconsistent was found).
pub fn expected_shape(
    instr: &HloInstructionProto,
    operands: &[&ShapeProto],
) -> Result<Option<ShapeProto>, String> {
    let Some(opcode) = Opcode::of(instr) else {
        return Ok(None);
    };
    let op = Op {
        instr,
        opcode,
        operands,
    };
    if let Arity::Exactly(n) = opcode.arity() {
        op.arity(n)?;
    }
    match opcode.class() {
        Class::Unary | Class::Binary | Class::Elementwise => elementwise::infer(&op),
        Class::DataMovement => movement::infer(&op),
        Class::Reduction => reduction::infer(&op),
        Class::Collective => collectives::infer(&op),
        Class::Tuple | Class::DeviceId | Class::Control => structure::infer(&op),
        Class::Unmodelled => Ok(None),
    }
}

/// One instruction and its operands' shapes, with the checks every rule
/// uses.
struct Op<'a> {
    instr: &'a HloInstructionProto,
    opcode: Opcode,
    operands: &'a [&'a ShapeProto],
}

impl<'a> Op<'a> {
    fn declared(&self) -> Option<&'a ShapeProto> {
        self.instr.shape.as_ref()
    }

    fn declared_type(&self) -> Result<PrimitiveType, String> {
        self.declared()
            .and_then(|s| PrimitiveType::try_from(s.element_type).ok())
            .ok_or_else(|| "no declared element type".to_string())
    }

    fn arity(&self, n: usize) -> Result<(), String> {
        if self.operands.len() == n {
            Ok(())
        } else {
            Err(format!(
                "{} takes {n} operand(s), has {}",
                self.opcode,
                self.operands.len()
            ))
        }
    }

    fn array_operand(&self, i: usize) -> Result<&'a ShapeProto, String> {
        let s = *self.operands.get(i).ok_or_else(|| {
            format!(
                "{} needs operand {i}, has {}",
                self.opcode,
                self.operands.len()
            )
        })?;
        if is_array(s) {
            Ok(s)
        } else {
            Err(format!(
                "operand {i} of {} must be an array, is {}",
                self.opcode,
                shape::describe(s)
            ))
        }
    }

    fn same(&self, a: &ShapeProto, b: &ShapeProto, what: &str) -> Result<(), String> {
        if shape::compatible(a, b) {
            Ok(())
        } else {
            Err(format!(
                "{}: {what} {} and {} differ",
                self.opcode,
                shape::describe(a),
                shape::describe(b)
            ))
        }
    }

    /// Operands from `from` on are `rank` integer scalars (start indices).
    fn scalar_indices(&self, from: usize, rank: usize) -> Result<(), String> {
        let idx = &self.operands[from.min(self.operands.len())..];
        if idx.len() != rank {
            return Err(format!(
                "{} needs {rank} start indices, has {}",
                self.opcode,
                idx.len()
            ));
        }
        for s in idx {
            if !s.dimensions.is_empty() || !shape::is_integer(s.element_type) {
                return Err(format!(
                    "{} start index {} is not an integer scalar",
                    self.opcode,
                    shape::describe(s)
                ));
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for Op<'_> {
    /// The op's opcode: messages name the op they are about.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.opcode.as_str())
    }
}
