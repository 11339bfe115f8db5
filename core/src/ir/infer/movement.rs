//! Data movement: ops that move or repeat elements without computing on
//! them. Their result dimensions come from their attributes (or, for
//! `broadcast`, `reshape` and `iota`, from the declared shape).

use super::Op;
use crate::ir::opcode::Opcode;
use crate::ir::shape::{self, array, element_count};
use crate::proto::{PrimitiveType, ShapeProto};

pub(super) fn infer(op: &Op) -> Result<Option<ShapeProto>, String> {
    let result = match op.opcode {
        Opcode::Broadcast => broadcast(op)?,
        Opcode::Reshape => reshape(op)?,
        Opcode::Transpose => transpose(op)?,
        Opcode::Iota => iota(op)?,
        Opcode::Slice => slice(op)?,
        Opcode::DynamicSlice => dynamic_slice(op)?,
        Opcode::DynamicUpdateSlice => dynamic_update_slice(op)?,
        Opcode::Concatenate => concatenate(op)?,
        Opcode::Pad => pad(op)?,
        _ => return Ok(None),
    };
    Ok(Some(result))
}

fn broadcast(op: &Op) -> Result<ShapeProto, String> {
    let x = op.array_operand(0)?;
    let out = op.declared().ok_or("broadcast without a declared shape")?;
    if op.instr.dimensions.len() != x.dimensions.len() {
        return Err("broadcast dimensions do not match the operand rank".into());
    }
    for (i, &d) in op.instr.dimensions.iter().enumerate() {
        let ok = usize::try_from(d)
            .ok()
            .and_then(|d| out.dimensions.get(d))
            .is_some_and(|&od| od == x.dimensions[i]);
        if !ok {
            return Err(format!(
                "broadcast maps operand dim {i} to bad output dim {d}"
            ));
        }
    }
    Ok(array(
        PrimitiveType::try_from(x.element_type).unwrap_or(PrimitiveType::Invalid),
        &out.dimensions,
    ))
}

fn reshape(op: &Op) -> Result<ShapeProto, String> {
    let x = op.array_operand(0)?;
    let out = op.declared().ok_or("reshape without a declared shape")?;
    if element_count(x) != element_count(out) {
        return Err(format!(
            "reshape of {} to {} changes the element count",
            shape::describe(x),
            shape::describe(out)
        ));
    }
    Ok(shape::with_dims(x, &out.dimensions))
}

fn transpose(op: &Op) -> Result<ShapeProto, String> {
    let x = op.array_operand(0)?;
    let dims = permuted(&x.dimensions, &op.instr.dimensions)?;
    Ok(shape::with_dims(x, &dims))
}

fn iota(op: &Op) -> Result<ShapeProto, String> {
    let out = op.declared().ok_or("iota without a declared shape")?;
    let d = op.instr.dimensions.first().copied().unwrap_or(-1);
    if d < 0 || d as usize >= out.dimensions.len() {
        return Err(format!("iota dimension {d} out of range"));
    }
    Ok(out.clone())
}

fn slice(op: &Op) -> Result<ShapeProto, String> {
    let x = op.array_operand(0)?;
    if op.instr.slice_dimensions.len() != x.dimensions.len() {
        return Err("slice needs one range per dimension".into());
    }
    let mut dims = Vec::new();
    for (s, &d) in op.instr.slice_dimensions.iter().zip(&x.dimensions) {
        if s.start < 0 || s.start > s.limit || s.limit > d || s.stride <= 0 {
            return Err(format!(
                "slice [{}:{}:{}] does not fit dimension {d}",
                s.start, s.limit, s.stride
            ));
        }
        // (limit - start) / stride, rounded up, without overflow.
        let span = s.limit - s.start;
        dims.push(span / s.stride + i64::from(span % s.stride != 0));
    }
    Ok(shape::with_dims(x, &dims))
}

fn dynamic_slice(op: &Op) -> Result<ShapeProto, String> {
    let x = op.array_operand(0)?;
    op.scalar_indices(1, x.dimensions.len())?;
    let sizes = &op.instr.dynamic_slice_sizes;
    if sizes.len() != x.dimensions.len()
        || sizes
            .iter()
            .zip(&x.dimensions)
            .any(|(&s, &d)| s < 0 || s > d)
    {
        return Err(format!(
            "dynamic_slice_sizes {sizes:?} do not fit {}",
            shape::describe(x)
        ));
    }
    Ok(shape::with_dims(x, sizes))
}

fn dynamic_update_slice(op: &Op) -> Result<ShapeProto, String> {
    if op.operands.len() < 2 {
        return Err("dynamic-update-slice needs an operand and an update".into());
    }
    let (x, u) = (op.array_operand(0)?, op.array_operand(1)?);
    if x.element_type != u.element_type
        || x.dimensions.len() != u.dimensions.len()
        || u.dimensions.iter().zip(&x.dimensions).any(|(a, b)| a > b)
    {
        return Err(format!(
            "update {} does not fit {}",
            shape::describe(u),
            shape::describe(x)
        ));
    }
    op.scalar_indices(2, x.dimensions.len())?;
    Ok(x.clone())
}

fn concatenate(op: &Op) -> Result<ShapeProto, String> {
    let first = op
        .array_operand(0)
        .map_err(|_| "concatenate needs operands".to_string())?;
    let d = op.instr.dimensions.first().copied().unwrap_or(-1);
    if d < 0 || d as usize >= first.dimensions.len() {
        return Err(format!("concatenate dimension {d} out of range"));
    }
    let d = d as usize;
    let mut dims = first.dimensions.clone();
    dims[d] = 0;
    for (i, o) in op.operands.iter().enumerate() {
        let fits = o.element_type == first.element_type
            && o.dimensions.len() == dims.len()
            && o.dimensions
                .iter()
                .enumerate()
                .all(|(k, &v)| k == d || v == first.dimensions[k]);
        if !fits {
            return Err(format!(
                "concatenate operand {i} {} does not fit",
                shape::describe(o)
            ));
        }
        dims[d] = dims[d]
            .checked_add(o.dimensions[d])
            .ok_or("concatenate result dimension overflows")?;
    }
    Ok(shape::with_dims(first, &dims))
}

fn pad(op: &Op) -> Result<ShapeProto, String> {
    let x = op.array_operand(0)?;
    let cfg = op
        .instr
        .padding_config
        .as_ref()
        .ok_or("pad without padding config")?;
    if cfg.dimensions.len() != x.dimensions.len() || !op.operands[1].dimensions.is_empty() {
        return Err("pad needs one padding per dimension and a scalar value".into());
    }
    let mut dims = Vec::new();
    for (p, &d) in cfg.dimensions.iter().zip(&x.dimensions) {
        let interior = if d > 0 {
            (d - 1).checked_mul(p.interior_padding)
        } else {
            Some(0)
        };
        let n = interior
            .and_then(|i| d.checked_add(i))
            .and_then(|n| n.checked_add(p.edge_padding_low))
            .and_then(|n| n.checked_add(p.edge_padding_high))
            .ok_or("pad result dimension overflows")?;
        if p.interior_padding < 0 || n < 0 {
            return Err("pad gives a negative dimension".into());
        }
        dims.push(n);
    }
    Ok(shape::with_dims(x, &dims))
}

fn permuted(dims: &[i64], perm: &[i64]) -> Result<Vec<i64>, String> {
    let mut seen = vec![false; dims.len()];
    let mut out = Vec::new();
    if perm.len() != dims.len() {
        return Err(format!(
            "{perm:?} is not a permutation of {} dimensions",
            dims.len()
        ));
    }
    for &p in perm {
        let p = usize::try_from(p)
            .ok()
            .filter(|&p| p < dims.len() && !seen[p]);
        let p = p.ok_or_else(|| format!("{perm:?} is not a permutation"))?;
        seen[p] = true;
        out.push(dims[p]);
    }
    Ok(out)
}
