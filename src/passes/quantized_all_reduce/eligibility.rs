//! Which all-reduces the pass may rewrite, and why the others stay.
//!
//! Eligible: an `all-reduce` (or an `all-reduce-start` whose only user is
//! its `all-reduce-done`) outside fusion computations, whose `to_apply` adds
//! its two scalar parameters, with no control dependencies, static shapes,
//! at least one operand of an enabled floating-point type, groups that
//! collective-permute can express (see [`super::groups`]), and a payload of
//! at least the minimum size. The frontend attribute
//! [`FORCE_ATTRIBUTE`]` = "true"` waives the size threshold and the
//! enabled-type list (for floating-point operands); `"false"` opts out.

use super::groups::{Participants, participants};
use super::{Options, SkipReason};
use crate::ir::DeviceCounts;
use crate::ir::{CompId, Computation, InstrId, Module, shape};
use crate::proto::{HloInstructionProto, PrimitiveType, ShapeProto};

/// Frontend attribute that forces the rewrite on (`"true"`) or off
/// (`"false"`) for one all-reduce.
pub const FORCE_ATTRIBUTE: &str = "equarx.quantize";

/// An all-reduce the pass will rewrite.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub comp: CompId,
    /// The `all-reduce`, or the `all-reduce-start` of an async pair.
    pub instr: InstrId,
    /// The `all-reduce-done` of an async pair.
    pub done: Option<InstrId>,
    /// Per operand: its id, its shape, and whether it joins the pipeline.
    pub operands: Vec<(InstrId, ShapeProto, bool)>,
    pub participants: Participants,
    /// Bytes of the operands that join the pipeline, in their own types.
    pub payload_bytes: u64,
    pub forced: bool,
}

/// Decides whether `instr` (an all-reduce in `comp`) is rewritten.
pub fn examine(
    module: &Module,
    comp: &Computation,
    instr: &HloInstructionProto,
    options: &Options,
    counts: &DeviceCounts,
) -> Result<Candidate, SkipReason> {
    let forced = match instr
        .frontend_attributes
        .as_ref()
        .and_then(|f| f.map.get(FORCE_ATTRIBUTE))
        .map(String::as_str)
    {
        Some("false") => return Err(SkipReason::OptedOut),
        Some("true") => true,
        Some(other) => {
            return Err(SkipReason::BadAttribute(format!(
                "{FORCE_ATTRIBUTE}={other:?}: use \"true\" or \"false\""
            )));
        }
        None => false,
    };
    if comp.is_fusion() {
        return Err(SkipReason::InFusion);
    }
    let done = match instr.opcode.as_str() {
        "all-reduce" => None,
        "all-reduce-start" => Some(single_done(comp, instr)?),
        _ => return Err(SkipReason::NotAllReduce),
    };
    let has_control = !instr.control_predecessor_ids.is_empty()
        || comp.instructions().iter().any(|i| {
            i.control_predecessor_ids.contains(&instr.id)
                || done.is_some_and(|d| i.control_predecessor_ids.contains(&d.0))
        });
    if has_control {
        return Err(SkipReason::ControlDependencies);
    }
    check_sum(module, instr)?;

    let mut operands = Vec::new();
    let mut first_refusal = None;
    for &op in &instr.operand_ids {
        let shape = comp
            .get(InstrId(op))
            .and_then(|o| o.shape.clone())
            .ok_or_else(|| SkipReason::BadGroups(format!("operand {op} is missing")))?;
        let ok = operand_ok(&shape, options, forced);
        if let Err(reason) = &ok {
            first_refusal.get_or_insert_with(|| reason.clone());
        }
        operands.push((InstrId(op), shape, ok.is_ok()));
    }
    if !operands.iter().any(|o| o.2) {
        return Err(first_refusal.unwrap_or(SkipReason::NotAllReduce));
    }
    let participants = participants(instr, counts)?;
    let payload_bytes: u64 = operands
        .iter()
        .filter(|o| o.2)
        .map(|o| shape::byte_size(&o.1).unwrap_or(u64::MAX))
        .fold(0u64, u64::saturating_add);
    if let Some(min) = options
        .min_payload_bytes
        .filter(|&m| !forced && payload_bytes < m)
    {
        return Err(SkipReason::BelowThreshold {
            bytes: payload_bytes,
            min,
        });
    }
    Ok(Candidate {
        comp: comp.id(),
        instr: InstrId(instr.id),
        done,
        operands,
        participants,
        payload_bytes,
        forced,
    })
}

fn operand_ok(s: &ShapeProto, options: &Options, forced: bool) -> Result<(), SkipReason> {
    let ty = s.element_type;
    let name = shape::type_name(ty).unwrap_or("?").to_string();
    if !shape::is_array(s) {
        return Err(SkipReason::TypeNotEnabled(name));
    }
    if s.is_dynamic_dimension.iter().any(|&d| d) {
        return Err(SkipReason::DynamicShape);
    }
    if !shape::is_float(ty) {
        return Err(SkipReason::NotFloat(name));
    }
    let quantizable = [PrimitiveType::Bf16, PrimitiveType::F16, PrimitiveType::F32]
        .iter()
        .any(|t| *t as i32 == ty);
    let enabled = options.element_types.iter().any(|t| *t as i32 == ty);
    if !(enabled || forced && quantizable) {
        return Err(SkipReason::TypeNotEnabled(name));
    }
    if !quantizable {
        return Err(SkipReason::TypeNotEnabled(name));
    }
    Ok(())
}

/// The all-reduce-done that is the only user of an all-reduce-start.
fn single_done(comp: &Computation, start: &HloInstructionProto) -> Result<InstrId, SkipReason> {
    let users: Vec<&HloInstructionProto> = comp
        .instructions()
        .iter()
        .filter(|i| i.operand_ids.contains(&start.id))
        .collect();
    match users.as_slice() {
        [done] if done.opcode == "all-reduce-done" && comp.root_id().0 != start.id => {
            Ok(InstrId(done.id))
        }
        _ => Err(SkipReason::AsyncShape),
    }
}

/// The reduction must add its two scalar parameters: `to_apply` is
/// `ROOT add(p0, p1)` (either order) with scalar shapes.
fn check_sum(module: &Module, instr: &HloInstructionProto) -> Result<(), SkipReason> {
    let [callee] = instr.called_computation_ids.as_slice() else {
        return Err(SkipReason::NotSum("no single reduction computation".into()));
    };
    let c = module
        .computation(CompId(*callee))
        .ok_or_else(|| SkipReason::NotSum("the reduction computation is missing".into()))?;
    let root = c
        .get(c.root_id())
        .ok_or_else(|| SkipReason::NotSum("the reduction has no root".into()))?;
    if root.opcode != "add" {
        return Err(SkipReason::NotSum(format!("its root is {}", root.opcode)));
    }
    let params: Vec<i64> = root
        .operand_ids
        .iter()
        .filter_map(|&o| c.get(InstrId(o)))
        .filter(|p| p.opcode == "parameter")
        .map(|p| p.parameter_number)
        .collect();
    let scalar = root.shape.as_ref().is_some_and(|s| s.dimensions.is_empty());
    if params.len() != 2 || params[0] == params[1] || !scalar || c.instructions().len() != 3 {
        return Err(SkipReason::NotSum(
            "its add is not of its two scalar parameters".into(),
        ));
    }
    Ok(())
}
