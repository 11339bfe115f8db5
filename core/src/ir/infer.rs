//! Result shapes of the ops equarx knows, the one source of truth for both
//! the builder (which fills shapes in) and the verifier (which checks them).
//!
//! Where HLO does not determine a result from its operands (the target type of
//! `convert`, the dimensions of `broadcast` or `reshape`, …) the instruction's
//! declared shape supplies it, and what can be checked is checked.

use super::groups::ReplicaGroups;
use super::shape::{self, array, element_count, is_array, is_tuple, type_bits};
use crate::proto::{HloInstructionProto, PrimitiveType, ShapeProto};

const UNARY: &[&str] = &[
    "abs",
    "negate",
    "exponential",
    "exponential-minus-one",
    "log",
    "log-plus-one",
    "sqrt",
    "rsqrt",
    "cbrt",
    "tanh",
    "logistic",
    "floor",
    "ceil",
    "sign",
    "round-nearest-even",
    "round-nearest-afz",
    "not",
    "copy",
    "cosine",
    "sine",
    "tan",
    "popcnt",
    "count-leading-zeros",
    "erf",
];

const BINARY: &[&str] = &[
    "add",
    "subtract",
    "multiply",
    "divide",
    "maximum",
    "minimum",
    "remainder",
    "power",
    "and",
    "or",
    "xor",
    "atan2",
    "shift-left",
    "shift-right-arithmetic",
    "shift-right-logical",
];

/// The shape `instr` must have given its operands' shapes. `Ok(None)` means
/// equarx does not model the op's shape (nothing inconsistent was found).
pub fn expected_shape(
    instr: &HloInstructionProto,
    operands: &[&ShapeProto],
) -> Result<Option<ShapeProto>, String> {
    let op = instr.opcode.as_str();
    let declared = instr.shape.as_ref();
    let declared_type = || {
        declared
            .and_then(|s| PrimitiveType::try_from(s.element_type).ok())
            .ok_or_else(|| "no declared element type".to_string())
    };
    let arity = |n: usize| -> Result<(), String> {
        if operands.len() == n {
            Ok(())
        } else {
            Err(format!("{op} takes {n} operand(s), has {}", operands.len()))
        }
    };
    let array_operand = |i: usize| -> Result<&ShapeProto, String> {
        let s = *operands
            .get(i)
            .ok_or_else(|| format!("{op} needs operand {i}, has {}", operands.len()))?;
        if is_array(s) {
            Ok(s)
        } else {
            Err(format!(
                "operand {i} of {op} must be an array, is {}",
                shape::describe(s)
            ))
        }
    };
    let same = |a: &ShapeProto, b: &ShapeProto, what: &str| -> Result<(), String> {
        if shape::compatible(a, b) {
            Ok(())
        } else {
            Err(format!(
                "{op}: {what} {} and {} differ",
                shape::describe(a),
                shape::describe(b)
            ))
        }
    };

    let result = match op {
        _ if UNARY.contains(&op) => {
            arity(1)?;
            array_operand(0)?.clone()
        }
        "is-finite" => {
            arity(1)?;
            shape::with_type(array_operand(0)?, PrimitiveType::Pred)
        }
        _ if BINARY.contains(&op) => {
            arity(2)?;
            same(array_operand(0)?, array_operand(1)?, "operands")?;
            operands[0].clone()
        }
        "compare" => {
            arity(2)?;
            same(array_operand(0)?, array_operand(1)?, "operands")?;
            shape::with_type(operands[0], PrimitiveType::Pred)
        }
        "select" => {
            arity(3)?;
            let p = array_operand(0)?;
            if p.element_type != PrimitiveType::Pred as i32
                || p.dimensions != operands[1].dimensions
            {
                return Err(format!(
                    "select predicate {} does not match {}",
                    shape::describe(p),
                    shape::describe(operands[1])
                ));
            }
            same(array_operand(1)?, array_operand(2)?, "branches")?;
            operands[1].clone()
        }
        "clamp" => {
            arity(3)?;
            let x = array_operand(1)?;
            for (i, bound) in [(0, operands[0]), (2, operands[2])] {
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
        "convert" => {
            arity(1)?;
            array(declared_type()?, &array_operand(0)?.dimensions)
        }
        "bitcast-convert" => {
            arity(1)?;
            let x = array_operand(0)?;
            let to = declared_type()?;
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
        "broadcast" => {
            arity(1)?;
            let x = array_operand(0)?;
            let out = declared.ok_or("broadcast without a declared shape")?;
            if instr.dimensions.len() != x.dimensions.len() {
                return Err("broadcast dimensions do not match the operand rank".into());
            }
            for (i, &d) in instr.dimensions.iter().enumerate() {
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
            array(
                PrimitiveType::try_from(x.element_type).unwrap_or(PrimitiveType::Invalid),
                &out.dimensions,
            )
        }
        "reshape" => {
            arity(1)?;
            let x = array_operand(0)?;
            let out = declared.ok_or("reshape without a declared shape")?;
            if element_count(x) != element_count(out) {
                return Err(format!(
                    "reshape of {} to {} changes the element count",
                    shape::describe(x),
                    shape::describe(out)
                ));
            }
            shape::with_dims(x, &out.dimensions)
        }
        "transpose" => {
            arity(1)?;
            let x = array_operand(0)?;
            let dims = permuted(&x.dimensions, &instr.dimensions)?;
            shape::with_dims(x, &dims)
        }
        "iota" => {
            arity(0)?;
            let out = declared.ok_or("iota without a declared shape")?;
            let d = instr.dimensions.first().copied().unwrap_or(-1);
            if d < 0 || d as usize >= out.dimensions.len() {
                return Err(format!("iota dimension {d} out of range"));
            }
            out.clone()
        }
        "slice" => {
            arity(1)?;
            let x = array_operand(0)?;
            if instr.slice_dimensions.len() != x.dimensions.len() {
                return Err("slice needs one range per dimension".into());
            }
            let mut dims = Vec::new();
            for (s, &d) in instr.slice_dimensions.iter().zip(&x.dimensions) {
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
            shape::with_dims(x, &dims)
        }
        "dynamic-slice" => {
            let x = array_operand(0)?;
            scalar_indices(op, &operands[1..], x.dimensions.len())?;
            let sizes = &instr.dynamic_slice_sizes;
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
            shape::with_dims(x, sizes)
        }
        "dynamic-update-slice" => {
            if operands.len() < 2 {
                return Err("dynamic-update-slice needs an operand and an update".into());
            }
            let (x, u) = (array_operand(0)?, array_operand(1)?);
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
            scalar_indices(op, &operands[2..], x.dimensions.len())?;
            x.clone()
        }
        "concatenate" => {
            let first = array_operand(0).map_err(|_| "concatenate needs operands".to_string())?;
            let d = instr.dimensions.first().copied().unwrap_or(-1);
            if d < 0 || d as usize >= first.dimensions.len() {
                return Err(format!("concatenate dimension {d} out of range"));
            }
            let d = d as usize;
            let mut dims = first.dimensions.clone();
            dims[d] = 0;
            for (i, o) in operands.iter().enumerate() {
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
            shape::with_dims(first, &dims)
        }
        "pad" => {
            arity(2)?;
            let x = array_operand(0)?;
            let cfg = instr
                .padding_config
                .as_ref()
                .ok_or("pad without padding config")?;
            if cfg.dimensions.len() != x.dimensions.len() || !operands[1].dimensions.is_empty() {
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
            shape::with_dims(x, &dims)
        }
        "tuple" => shape::tuple(operands.iter().map(|s| (*s).clone()).collect()),
        "get-tuple-element" => {
            arity(1)?;
            let t = operands[0];
            if !is_tuple(t) {
                return Err("get-tuple-element of a non-tuple".into());
            }
            usize::try_from(instr.tuple_index)
                .ok()
                .and_then(|i| t.tuple_shapes.get(i))
                .cloned()
                .ok_or_else(|| format!("tuple index {} out of range", instr.tuple_index))?
        }
        "replica-id" | "partition-id" => {
            arity(0)?;
            shape::scalar(PrimitiveType::U32)
        }
        "collective-permute" if operands.len() == 1 => array_operand(0)?.clone(),
        "all-reduce" | "all-reduce-start" => {
            if operands.is_empty() {
                return Err(format!("{op} without operands"));
            }
            if operands.len() == 1 {
                operands[0].clone()
            } else {
                shape::tuple(operands.iter().map(|s| (*s).clone()).collect())
            }
        }
        "collective-permute-start" if operands.len() == 1 => {
            let out = declared.ok_or("collective-permute-start without a declared shape")?;
            let x = array_operand(0)?;
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
        "collective-permute-done" => {
            arity(1)?;
            let start = operands[0];
            if !is_tuple(start) || start.tuple_shapes.len() < 2 {
                return Err("collective-permute-done of a non-tuple".into());
            }
            start.tuple_shapes[1].clone()
        }
        "all-reduce-done" => {
            arity(1)?;
            operands[0].clone()
        }
        "all-gather" if operands.len() == 1 => {
            let x = array_operand(0)?;
            let groups = ReplicaGroups::of(instr)?;
            let Some(n) = groups.uniform_size() else {
                return Ok(None); // empty groups: the size depends on the config
            };
            let d = instr.dimensions.first().copied().unwrap_or(-1);
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
        "reduce-precision" => {
            arity(1)?;
            array_operand(0)?.clone()
        }
        "while" => {
            arity(1)?;
            operands[0].clone()
        }
        "all-to-all" if operands.len() == 1 && !instr.dimensions.is_empty() => {
            array_operand(0)?.clone()
        }
        "dot" => {
            arity(2)?;
            let (l, r) = (array_operand(0)?, array_operand(1)?);
            let Some(dn) = instr.dot_dimension_numbers.as_ref() else {
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
            let ty = declared
                .map(|d| d.element_type)
                .filter(|&t| t != PrimitiveType::Invalid as i32)
                .unwrap_or(l.element_type);
            let ty = PrimitiveType::try_from(ty).unwrap_or(PrimitiveType::F32);
            shape::array(ty, &dims)
        }
        "reduce" => {
            if operands.is_empty() || operands.len() % 2 != 0 {
                return Err("reduce takes inputs and as many init values".into());
            }
            let n = operands.len() / 2;
            let first = array_operand(0)?;
            let rank = first.dimensions.len();
            if instr
                .dimensions
                .iter()
                .any(|&d| d < 0 || d as usize >= rank)
            {
                return Err(format!(
                    "reduce dimensions {:?} out of range",
                    instr.dimensions
                ));
            }
            let kept: Vec<i64> = (0..rank)
                .filter(|d| !instr.dimensions.contains(&(*d as i64)))
                .map(|d| first.dimensions[d])
                .collect();
            let mut results = Vec::new();
            for i in 0..n {
                if operands[i].dimensions != first.dimensions {
                    return Err("reduce inputs differ in dimensions".into());
                }
                let init = operands[n + i];
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

fn scalar_indices(op: &str, idx: &[&ShapeProto], rank: usize) -> Result<(), String> {
    if idx.len() != rank {
        return Err(format!(
            "{op} needs {rank} start indices, has {}",
            idx.len()
        ));
    }
    for s in idx {
        if !s.dimensions.is_empty() || !shape::is_integer(s.element_type) {
            return Err(format!(
                "{op} start index {} is not an integer scalar",
                shape::describe(s)
            ));
        }
    }
    Ok(())
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
