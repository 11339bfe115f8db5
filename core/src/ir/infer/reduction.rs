//! Reductions and contractions: `reduce` (one result per input, the
//! reduced dimensions dropped) and `dot` (batch, then free dimensions).

use super::Op;
use crate::ir::opcode::Opcode;
use crate::ir::shape::{self};
use crate::proto::{PrimitiveType, ShapeProto};

pub(super) fn infer(op: &Op) -> Result<Option<ShapeProto>, String> {
    let result = match op.opcode {
        Opcode::Dot => {
            let (l, r) = (op.array_operand(0)?, op.array_operand(1)?);
            let Some(dn) = op.instr.dot_dimension_numbers.as_ref() else {
                return Err("dot without dimension numbers".into());
            };
            let valid =
                |dims: &[i64], rank: usize| dims.iter().all(|&d| d >= 0 && (d as usize) < rank);
            if !valid(&dn.lhs_contracting_dimensions, l.dimensions.len())
                || !valid(&dn.lhs_batch_dimensions, l.dimensions.len())
                || !valid(&dn.rhs_contracting_dimensions, r.dimensions.len())
                || !valid(&dn.rhs_batch_dimensions, r.dimensions.len())
            {
                return Err("dot dimension out of range".into());
            }
            let size = |s: &ShapeProto, ds: &[i64]| -> Vec<i64> {
                ds.iter().map(|&d| s.dimensions[d as usize]).collect()
            };
            if size(l, &dn.lhs_contracting_dimensions) != size(r, &dn.rhs_contracting_dimensions)
                || size(l, &dn.lhs_batch_dimensions) != size(r, &dn.rhs_batch_dimensions)
            {
                return Err("dot contracting or batch dimensions differ in size".into());
            }
            let free = |s: &ShapeProto, used: [&[i64]; 2]| -> Vec<i64> {
                (0..s.dimensions.len() as i64)
                    .filter(|d| !used[0].contains(d) && !used[1].contains(d))
                    .map(|d| s.dimensions[d as usize])
                    .collect()
            };
            let mut dims = size(l, &dn.lhs_batch_dimensions);
            dims.extend(free(
                l,
                [&dn.lhs_batch_dimensions, &dn.lhs_contracting_dimensions],
            ));
            dims.extend(free(
                r,
                [&dn.rhs_batch_dimensions, &dn.rhs_contracting_dimensions],
            ));
            // The result type may differ from the operands' (a preferred
            // element type): the declared one counts.
            let ty = op
                .declared()
                .map(|d| d.element_type)
                .filter(|&t| t != PrimitiveType::Invalid as i32)
                .unwrap_or(l.element_type);
            let ty = PrimitiveType::try_from(ty).unwrap_or(PrimitiveType::F32);
            shape::array(ty, &dims)
        }
        Opcode::Reduce => {
            if op.operands.is_empty() || op.operands.len() % 2 != 0 {
                return Err("reduce takes inputs and as many init values".into());
            }
            let n = op.operands.len() / 2;
            let first = op.array_operand(0)?;
            let rank = first.dimensions.len();
            if op
                .instr
                .dimensions
                .iter()
                .any(|&d| d < 0 || d as usize >= rank)
            {
                return Err(format!(
                    "reduce dimensions {:?} out of range",
                    op.instr.dimensions
                ));
            }
            let kept: Vec<i64> = (0..rank)
                .filter(|d| !op.instr.dimensions.contains(&(*d as i64)))
                .map(|d| first.dimensions[d])
                .collect();
            let mut results = Vec::new();
            for i in 0..n {
                if op.operands[i].dimensions != first.dimensions {
                    return Err("reduce inputs differ in dimensions".into());
                }
                let init = op.operands[n + i];
                if !init.dimensions.is_empty() {
                    return Err("reduce init values must be scalars".into());
                }
                results.push(shape::with_dims(init, &kept));
            }
            if n == 1 {
                results.pop().unwrap_or_default()
            } else {
                shape::tuple(results)
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(result))
}
