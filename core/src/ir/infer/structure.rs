//! Structure: tuples and their elements, loops, and the device ids.

use super::Op;
use crate::ir::opcode::Opcode;
use crate::ir::shape::{self, is_tuple};
use crate::proto::{PrimitiveType, ShapeProto};

pub(super) fn infer(op: &Op) -> Result<Option<ShapeProto>, String> {
    let result = match op.opcode {
        Opcode::Tuple => shape::tuple(op.operands.iter().map(|s| (*s).clone()).collect()),
        Opcode::GetTupleElement => {
            let t = op.operands[0];
            if !is_tuple(t) {
                return Err("get-tuple-element of a non-tuple".into());
            }
            usize::try_from(op.instr.tuple_index)
                .ok()
                .and_then(|i| t.tuple_shapes.get(i))
                .cloned()
                .ok_or_else(|| format!("tuple index {} out of range", op.instr.tuple_index))?
        }
        Opcode::ReplicaId | Opcode::PartitionId => shape::scalar(PrimitiveType::U32),
        Opcode::While => op.operands[0].clone(),
        _ => return Ok(None),
    };
    Ok(Some(result))
}
