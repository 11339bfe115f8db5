//! Which collectives the pass may rewrite, and why the others stay.
//!
//! Eligible: an `all-reduce` (or an `all-reduce-start` whose only user is
//! its `all-reduce-done`), a `reduce-scatter`, an `all-gather` (or an
//! `all-gather-start` / `-done` pair) or an `all-to-all` (array or tuple
//! form), outside fusion computations, with no control dependencies,
//! static shapes, floating-point operands of an enabled type (the
//! all-reduce needs one; the others, each of theirs), groups that
//! collective-permute can express (see [`super::groups`]), and a payload of
//! at least the minimum size. The reducing ones must add: `to_apply` adds
//! its two scalar parameters. The frontend attribute
//! [`FORCE_ATTRIBUTE`]` = "true"` waives the size threshold and the
//! enabled-type list (for floating-point operands); `"false"` opts out.

use super::groups::{Participants, participants};
use super::skip::{FORCE_ATTRIBUTE, SkipReason};
use crate::ir::DeviceCounts;
use crate::ir::opcode::Opcode;
use crate::ir::{CompId, Computation, InstrId, Module, shape};
use crate::numerics::QUANTIZABLE;
use crate::options::Options;
use crate::plan::Collective;
use crate::proto::{HloInstructionProto, ShapeProto};

/// A collective the pass will rewrite.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub collective: Collective,
    /// The scatter, gather or split dimension (all-reduce and tuple
    /// all-to-all: none).
    pub dimension: Option<i64>,
    pub comp: CompId,
    /// The collective, or the `-start` of an async pair.
    pub instr: InstrId,
    /// The `-done` of an async pair.
    pub done: Option<InstrId>,
    /// Every operand, in order.
    pub operands: Vec<Operand>,
    pub participants: Participants,
    /// Bytes of the operands that join the pipeline, in their own types.
    pub payload_bytes: u64,
    pub forced: bool,
}

/// One operand of a candidate.
#[derive(Clone, Debug)]
pub struct Operand {
    pub id: InstrId,
    pub shape: ShapeProto,
    /// Whether it joins the quantized pipeline (an all-reduce may leave
    /// some operands to a plain all-reduce of their own).
    pub quantized: bool,
}

impl Candidate {
    /// The operands that join the pipeline.
    pub fn quantized(&self) -> impl Iterator<Item = &Operand> {
        self.operands.iter().filter(|o| o.quantized)
    }

    /// Explicit mantissa bits of the narrowest quantized operand type: the
    /// precision the result is rounded to.
    pub fn mantissa_bits(&self) -> u32 {
        self.quantized()
            .map(|o| crate::numerics::mantissa_bits(o.shape.element_type))
            .min()
            .unwrap_or(23)
    }
}

/// The collective an opcode is rewritten as, for the opcodes [`examine`]
/// looks at (the `-done` halves come with their starts), with whether it
/// is the `-start` of an async pair and, if so, its `-done`.
pub fn rewritable(op: Opcode) -> Option<(Collective, Option<Opcode>)> {
    Some(match op {
        Opcode::AllReduce => (Collective::AllReduce, None),
        Opcode::AllReduceStart => (Collective::AllReduce, Some(Opcode::AllReduceDone)),
        Opcode::ReduceScatter => (Collective::ReduceScatter, None),
        Opcode::AllGather => (Collective::AllGather, None),
        Opcode::AllGatherStart => (Collective::AllGather, Some(Opcode::AllGatherDone)),
        Opcode::AllToAll => (Collective::AllToAll, None),
        _ => return None,
    })
}

/// Decides whether `instr` (a collective in `comp`) is rewritten.
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
    let (collective, done) = match Opcode::of(instr).and_then(rewritable) {
        Some((collective, None)) => (collective, None),
        Some((collective, Some(done))) => (collective, Some(single_done(comp, instr, done)?)),
        None => return Err(SkipReason::NotRewritable),
    };
    let has_control = !instr.control_predecessor_ids.is_empty()
        || comp.instructions().iter().any(|i| {
            i.control_predecessor_ids.contains(&instr.id)
                || done.is_some_and(|d| i.control_predecessor_ids.contains(&d.0))
        });
    if has_control {
        return Err(SkipReason::ControlDependencies);
    }
    match collective {
        Collective::AllReduce | Collective::ReduceScatter => check_sum(module, instr)?,
        Collective::AllGather | Collective::AllToAll => {}
    }

    let mut operands = Vec::new();
    let mut first_refusal = None;
    for &op in &instr.operand_ids {
        let shape = comp
            .get(InstrId(op))
            .and_then(|o| o.shape.clone())
            .ok_or(SkipReason::MissingOperand(op))?;
        let ok = operand_ok(op, &shape, options, forced);
        if let Err(reason) = &ok {
            first_refusal.get_or_insert_with(|| reason.clone());
        }
        operands.push(Operand {
            id: InstrId(op),
            shape,
            quantized: ok.is_ok(),
        });
    }
    if !operands.iter().any(|o| o.quantized) {
        return Err(first_refusal.unwrap_or(SkipReason::NoOperands));
    }
    // Only the all-reduce packs some operands and leaves others: the other
    // collectives move all of theirs, or none.
    match collective {
        Collective::AllReduce => {}
        Collective::ReduceScatter | Collective::AllGather | Collective::AllToAll => {
            if let Some(reason) = first_refusal {
                return Err(reason);
            }
        }
    }
    let participants = participants(instr, counts)?;
    let dimension = shape_rules(collective, instr, &operands, participants.group_size())?;
    let payload_bytes: u64 = operands
        .iter()
        .filter(|o| o.quantized)
        .map(|o| shape::byte_size(&o.shape).unwrap_or(u64::MAX))
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
        collective,
        dimension,
        comp: comp.id(),
        instr: InstrId(instr.id),
        done,
        operands,
        participants,
        payload_bytes,
        forced,
    })
}

fn operand_ok(id: i64, s: &ShapeProto, options: &Options, forced: bool) -> Result<(), SkipReason> {
    let ty = s.element_type;
    let name = shape::type_name(ty).unwrap_or("?").to_string();
    if !shape::is_array(s) {
        return Err(SkipReason::TupleOperand(id));
    }
    if s.is_dynamic_dimension.iter().any(|&d| d) {
        return Err(SkipReason::DynamicShape);
    }
    if !shape::is_float(ty) {
        return Err(SkipReason::NotFloat(name));
    }
    if !QUANTIZABLE.iter().any(|&t| t as i32 == ty) {
        return Err(SkipReason::NotQuantizable(name));
    }
    // A forced op quantizes any quantizable type, enabled or not.
    if !forced && !options.element_types.iter().any(|&t| t as i32 == ty) {
        return Err(SkipReason::TypeNotEnabled(name));
    }
    Ok(())
}

/// The shapes each collective's rewrite handles: one operand (or, for an
/// all-to-all, one per rank of the same shape), a dimension in range, and
/// for the splitting ones a dimension the group divides. Returns the
/// dimension.
fn shape_rules(
    collective: Collective,
    instr: &HloInstructionProto,
    operands: &[Operand],
    p: usize,
) -> Result<Option<i64>, SkipReason> {
    let unsupported = |why: String| Err(SkipReason::Unsupported(why));
    let (splits, tuple_form) = match collective {
        Collective::AllReduce => return Ok(None),
        Collective::ReduceScatter => (true, false),
        Collective::AllGather => (false, false),
        Collective::AllToAll => (true, instr.dimensions.is_empty()),
    };
    let op = collective.opcode();
    if tuple_form {
        let first = &operands[0].shape;
        if operands.len() != p || operands.iter().any(|o| !shape::compatible(&o.shape, first)) {
            return unsupported(format!(
                "a tuple all-to-all needs one operand per rank ({p}), all of one shape"
            ));
        }
        return Ok(None);
    }
    if operands.len() != 1 {
        return unsupported(format!("{op} of {} operands (a tuple)", operands.len()));
    }
    let dims = &operands[0].shape.dimensions;
    let Some(&d) = instr.dimensions.first() else {
        return unsupported(format!("{op} without a dimension"));
    };
    if d < 0 || d as usize >= dims.len() {
        return unsupported(format!("{op} dimension {d} out of range"));
    }
    if splits && dims[d as usize] % p as i64 != 0 {
        return unsupported(format!(
            "{op} dimension {d} of size {} is not a multiple of the group size {p}",
            dims[d as usize]
        ));
    }
    // The result must be what the groups make of the operand: the group
    // size decides it, and the verifier cannot check that for every group
    // mode and device count (a cross-replica-and-partition group spans the
    // partitions too). A result of another size is not one this rewrite
    // can produce; XLA would refuse the module.
    let mut want = dims.to_vec();
    match collective {
        Collective::ReduceScatter => want[d as usize] /= p as i64,
        Collective::AllGather => want[d as usize] *= p as i64,
        Collective::AllReduce | Collective::AllToAll => {}
    }
    let result = instr.shape.as_ref().and_then(|s| {
        if s.tuple_shapes.is_empty() {
            Some(s)
        } else {
            // all-gather-start: (operand, result).
            s.tuple_shapes.get(1)
        }
    });
    let got = result.map(|s| s.dimensions.to_vec()).unwrap_or_default();
    if got != want {
        return unsupported(format!(
            "{op} result dimensions {got:?} are not {want:?}, what a group of {p} makes of \
             its operand {dims:?}"
        ));
    }
    Ok(Some(d))
}

/// The `-done` that is the only user of an async `-start`.
fn single_done(
    comp: &Computation,
    start: &HloInstructionProto,
    done_opcode: Opcode,
) -> Result<InstrId, SkipReason> {
    let only_user = match comp.users_of(InstrId(start.id)).as_slice() {
        &[done] => Some(done),
        _ => None,
    };
    match only_user {
        Some(done) if Opcode::of(done) == Some(done_opcode) && comp.root_id().0 != start.id => {
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
    if Opcode::of(root) != Some(Opcode::Add) {
        return Err(SkipReason::NotSum(format!("its root is {}", root.opcode)));
    }
    let params: Vec<i64> = root
        .operand_ids
        .iter()
        .filter_map(|&o| c.get(InstrId(o)))
        .filter(|p| Opcode::of(p) == Some(Opcode::Parameter))
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
