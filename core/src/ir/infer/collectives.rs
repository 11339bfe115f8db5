//! Collectives: the forms equarx emits and reads (an all-reduce and its
//! async pair, collective-permutes, the array all-gather and all-to-all).
//! Other forms are not modelled.

use super::Op;
use crate::ir::groups::{GroupMode, ReplicaGroups};
use crate::ir::opcode::Opcode;
use crate::ir::shape::{self, is_tuple};
use crate::proto::ShapeProto;

pub(super) fn infer(op: &Op) -> Result<Option<ShapeProto>, String> {
    let result = match op.opcode {
        Opcode::CollectivePermute if op.operands.len() == 1 => op.array_operand(0)?.clone(),
        Opcode::AllReduce | Opcode::AllReduceStart => {
            if op.operands.is_empty() {
                return Err(format!("{op} without operands"));
            }
            if op.operands.len() == 1 {
                op.operands[0].clone()
            } else {
                shape::tuple(op.operands.iter().map(|s| (*s).clone()).collect())
            }
        }
        Opcode::CollectivePermuteStart if op.operands.len() == 1 => {
            let out = op
                .declared()
                .ok_or("collective-permute-start without a declared shape")?;
            let x = op.array_operand(0)?;
            let fits = is_tuple(out)
                && out.tuple_shapes.len() >= 2
                && out.tuple_shapes[..2]
                    .iter()
                    .all(|s| shape::compatible(s, x));
            if !fits {
                return Err(format!(
                    "collective-permute-start of {} must be (input, output, ...), is {}",
                    shape::describe(x),
                    shape::describe(out)
                ));
            }
            out.clone()
        }
        Opcode::CollectivePermuteDone => {
            let start = op.operands[0];
            if !is_tuple(start) || start.tuple_shapes.len() < 2 {
                return Err("collective-permute-done of a non-tuple".into());
            }
            start.tuple_shapes[1].clone()
        }
        Opcode::AllReduceDone => op.operands[0].clone(),
        Opcode::AllGather if op.operands.len() == 1 => {
            let x = op.array_operand(0)?;
            let groups = ReplicaGroups::of(op.instr)?;
            let Some(n) = groups.uniform_size() else {
                return Ok(None); // empty groups: the size depends on the config
            };
            if GroupMode::of(op.instr) == GroupMode::CrossReplicaAndPartition {
                // A group of replicas spans all their partitions: the size
                // is n times the partition count, which the module's
                // config holds, not the op (XLA's verifier multiplies).
                return Ok(None);
            }
            let d = op.instr.dimensions.first().copied().unwrap_or(-1);
            if d < 0 || d as usize >= x.dimensions.len() {
                return Err(format!("all-gather dimension {d} out of range"));
            }
            let mut dims = x.dimensions.clone();
            dims[d as usize] = i64::try_from(n)
                .ok()
                .and_then(|n| dims[d as usize].checked_mul(n))
                .ok_or("all-gather result dimension overflows")?;
            shape::with_dims(x, &dims)
        }
        Opcode::AllToAll if op.operands.len() == 1 && !op.instr.dimensions.is_empty() => {
            op.array_operand(0)?.clone()
        }
        _ => return Ok(None),
    };
    Ok(Some(result))
}
