//! Elementwise ops: the result has the operands' dimensions; its type
//! is theirs, `pred` for comparisons, or the declared one for conversions.

use super::Op;
use crate::ir::opcode::{Class, Opcode};
use crate::ir::shape::{self, array, type_bits};
use crate::proto::{PrimitiveType, ShapeProto};

pub(super) fn infer(op: &Op) -> Result<Option<ShapeProto>, String> {
    match op.opcode.class() {
        Class::Unary => return Ok(Some(op.array_operand(0)?.clone())),
        Class::Binary => {
            op.same(op.array_operand(0)?, op.array_operand(1)?, "operands")?;
            return Ok(Some(op.operands[0].clone()));
        }
        _ => {}
    }
    let result = match op.opcode {
        Opcode::IsFinite => shape::with_type(op.array_operand(0)?, PrimitiveType::Pred),
        Opcode::Compare => {
            op.same(op.array_operand(0)?, op.array_operand(1)?, "operands")?;
            shape::with_type(op.operands[0], PrimitiveType::Pred)
        }
        Opcode::Select => {
            let p = op.array_operand(0)?;
            if p.element_type != PrimitiveType::Pred as i32
                || p.dimensions != op.operands[1].dimensions
            {
                return Err(format!(
                    "select predicate {} does not match {}",
                    shape::describe(p),
                    shape::describe(op.operands[1])
                ));
            }
            op.same(op.array_operand(1)?, op.array_operand(2)?, "branches")?;
            op.operands[1].clone()
        }
        Opcode::Clamp => {
            let x = op.array_operand(1)?;
            for (i, bound) in [(0, op.operands[0]), (2, op.operands[2])] {
                let scalar_ok = bound.dimensions.is_empty() && bound.element_type == x.element_type;
                if !scalar_ok && !shape::compatible(bound, x) {
                    return Err(format!(
                        "clamp bound {i} {} fits neither a scalar nor {}",
                        shape::describe(bound),
                        shape::describe(x)
                    ));
                }
            }
            x.clone()
        }
        Opcode::Convert => array(op.declared_type()?, &op.array_operand(0)?.dimensions),
        Opcode::BitcastConvert => {
            let x = op.array_operand(0)?;
            let to = op.declared_type()?;
            let (from_bits, to_bits) = (
                type_bits(x.element_type).unwrap_or(0),
                type_bits(to as i32).unwrap_or(0),
            );
            let mut dims = x.dimensions.clone();
            if from_bits == 0 || to_bits == 0 {
                return Err("bitcast-convert between non-array types".into());
            }
            if to_bits < from_bits {
                dims.push(i64::from(from_bits / to_bits));
            } else if to_bits > from_bits {
                let ratio = i64::from(to_bits / from_bits);
                if dims.last() != Some(&ratio) {
                    return Err(format!(
                        "bitcast-convert to a wider type needs a last dimension of {ratio}"
                    ));
                }
                dims.pop();
            }
            array(to, &dims)
        }
        Opcode::ReducePrecision => op.array_operand(0)?.clone(),
        _ => return Ok(None),
    };
    Ok(Some(result))
}
