//! Assembly: the module put together from what was read (computation
//! names resolved, computations ordered callees first, the module-level
//! fields filled).

use std::collections::HashMap;

use super::computation::CompText;
use super::{Failure, Res};
use crate::ir::DeviceCounts;
use crate::ir::opcode::Opcode;
use crate::proto::hlo_schedule_proto::InstructionSequence;
use crate::proto::{
    FrontendAttributes, HloBufferDonorProto, HloComputationProto, HloInputOutputAliasProto,
    HloModuleProto, HloScheduleProto, ProgramShapeProto, ShapeProto, StackFrameIndexProto,
};
use crate::text::ParsedText;

/// What the module header says: [`assemble`] fills the module-level
/// fields from it.
#[derive(Default)]
pub(super) struct Header {
    pub(super) name: String,
    pub(super) is_scheduled: bool,
    /// `entry_computation_layout`: parameter shapes and the result shape.
    pub(super) layout: Option<(Vec<ShapeProto>, ShapeProto)>,
    pub(super) counts: DeviceCounts,
    pub(super) input_output_alias: Option<HloInputOutputAliasProto>,
    pub(super) buffer_donor: Option<HloBufferDonorProto>,
    pub(super) frontend_attributes: Option<FrontendAttributes>,
}

/// Resolves computation names, orders computations callees first and fills
/// the module-level fields.
pub(super) fn assemble(
    header: Header,
    mut comps: Vec<CompText>,
    frames: Option<StackFrameIndexProto>,
) -> Res<ParsedText> {
    let mut by_name: HashMap<String, usize> = HashMap::new();
    for (k, c) in comps.iter().enumerate() {
        if by_name.insert(c.name.clone(), k).is_some() {
            return Err(Failure::new(
                c.name_at,
                format!("computation '{}' is already defined", c.name),
            ));
        }
    }
    let mut entry = None;
    for (k, c) in comps.iter().enumerate() {
        if c.is_entry {
            if entry.is_some() {
                return Err(Failure::new(c.entry_at, "more than one ENTRY computation"));
            }
            entry = Some(k);
        }
    }
    let entry = entry.unwrap_or(comps.len() - 1);

    // Called computations: names → ids; per computation, per instruction,
    // the callees (for the ordering below).
    let (callees, fusion_callee) = resolve_calls(&mut comps, &by_name)?;
    check_acyclic(&comps, &callees)?;
    let order = post_order(&callees);

    let mut module = HloModuleProto {
        name: header.name,
        entry_computation_name: comps[entry].name.clone(),
        entry_computation_id: comps[entry].id,
        input_output_alias: header.input_output_alias,
        buffer_donor: header.buffer_donor,
        frontend_attributes: header.frontend_attributes,
        stack_frame_index: frames,
        ..Default::default()
    };
    let mut schedule = HloScheduleProto::default();
    let mut protos: Vec<Option<HloComputationProto>> = Vec::with_capacity(comps.len());
    for (k, c) in comps.into_iter().enumerate() {
        let (root_id, program_shape) = program_shape(&c)?;
        if k == entry {
            let (parameters, result) = match &header.layout {
                Some((p, r)) => (p.clone(), Some(r.clone())),
                None => (
                    program_shape.parameters.clone(),
                    program_shape.result.clone(),
                ),
            };
            module.host_program_shape = Some(ProgramShapeProto {
                parameter_names: (0..parameters.len()).map(|n| format!("p{n}")).collect(),
                parameters,
                result,
            });
        }
        if header.is_scheduled && !fusion_callee[k] {
            schedule.sequences.insert(
                c.id,
                InstructionSequence {
                    instruction_ids: c.instrs.iter().map(|i| i.id).collect(),
                },
            );
        }
        protos.push(Some(HloComputationProto {
            name: c.name,
            instructions: c.instrs,
            program_shape: Some(program_shape),
            id: c.id,
            root_id,
            is_fusion_computation: fusion_callee[k],
            execution_thread: c.execution_thread,
        }));
    }
    module.computations = order
        .into_iter()
        .filter_map(|k| protos.get_mut(k).and_then(Option::take))
        .collect();
    if header.is_scheduled {
        module.schedule = Some(schedule);
    }
    // XLA prints a count only when it is not 1, and reads a missing one as
    // 1: so does equarx.
    Ok(ParsedText {
        proto: module,
        counts: DeviceCounts {
            replica_count: Some(header.counts.replica_count.unwrap_or(1)),
            num_partitions: Some(header.counts.num_partitions.unwrap_or(1)),
        },
    })
}

/// Per computation, per instruction, the callees: (computation index,
/// where its name is).
type Callees = Vec<Vec<Vec<(usize, usize)>>>;

/// Called computations by name → by id, into each instruction's
/// `called_computation_ids`; gives, per computation and instruction, the
/// callees with where each is named, and which computations a fusion calls.
fn resolve_calls(
    comps: &mut [CompText],
    by_name: &HashMap<String, usize>,
) -> Res<(Callees, Vec<bool>)> {
    let ids: Vec<i64> = comps.iter().map(|c| c.id).collect();
    let mut callees: Callees = Vec::with_capacity(comps.len());
    let mut fusion_callee = vec![false; comps.len()];
    for c in comps.iter_mut() {
        let mut per_instr = Vec::with_capacity(c.instrs.len());
        for (instr, calls) in c.instrs.iter_mut().zip(&c.calls) {
            let mut these = Vec::with_capacity(calls.len());
            for (name, at) in calls {
                let k = *by_name
                    .get(name)
                    .ok_or_else(|| Failure::new(*at, format!("undefined computation '{name}'")))?;
                instr.called_computation_ids.push(ids[k]);
                if Opcode::of(instr) == Some(Opcode::Fusion) {
                    fusion_callee[k] = true;
                }
                these.push((k, *at));
            }
            per_instr.push(these);
        }
        callees.push(per_instr);
    }
    Ok((callees, fusion_callee))
}

/// The computation's root id and program shape; its parameters must be
/// numbered 0 to n-1, each once.
fn program_shape(c: &CompText) -> Res<(i64, ProgramShapeProto)> {
    let root = c.root.and_then(|r| c.instrs.get(r)).ok_or_else(|| {
        Failure::new(
            c.name_at,
            format!("computation '{}' has no instructions", c.name),
        )
    })?;
    let root_id = root.id;
    let result = root.shape.clone();
    // Parameters: numbers 0..n-1, each once.
    let mut params: Vec<(i64, usize)> = c
        .instrs
        .iter()
        .enumerate()
        .filter(|(_, i)| Opcode::of(i) == Some(Opcode::Parameter))
        .map(|(j, i)| (i.parameter_number, j))
        .collect();
    params.sort();
    for (n, &(number, j)) in params.iter().enumerate() {
        if usize::try_from(number).ok() != Some(n) {
            let at = c.instr_at.get(j).copied().unwrap_or(c.name_at);
            return Err(Failure::new(
                at,
                format!(
                    "computation '{}' has {} parameters, numbered 0 to {} once each; found parameter({number})",
                    c.name,
                    params.len(),
                    params.len() - 1
                ),
            ));
        }
    }
    let program_shape = ProgramShapeProto {
        parameters: params
            .iter()
            .map(|&(_, j)| c.instrs[j].shape.clone().unwrap_or_default())
            .collect(),
        result,
        parameter_names: params
            .iter()
            .map(|&(_, j)| c.instrs[j].name.clone())
            .collect(),
    };
    Ok((root_id, program_shape))
}

/// A computation that (transitively) calls itself is an error.
fn check_acyclic(comps: &[CompText], callees: &[Vec<Vec<(usize, usize)>>]) -> Res<()> {
    // 0 = unvisited, 1 = on the stack, 2 = done.
    let mut state = vec![0u8; comps.len()];
    for start in 0..comps.len() {
        if state[start] != 0 {
            continue;
        }
        let edges = |k: usize| callees[k].iter().flatten().copied().collect::<Vec<_>>();
        let mut stack = vec![(start, edges(start), 0usize)];
        state[start] = 1;
        while let Some((k, out, next)) = stack.last_mut() {
            if let Some(&(callee, at)) = out.get(*next) {
                *next += 1;
                match state[callee] {
                    0 => {
                        state[callee] = 1;
                        let e = edges(callee);
                        stack.push((callee, e, 0));
                    }
                    1 => {
                        let message = if *k == callee {
                            format!("computation '{}' calls itself", comps[callee].name)
                        } else {
                            format!(
                                "computation '{}' calls '{}', which calls it back (recursion)",
                                comps[*k].name, comps[callee].name
                            )
                        };
                        return Err(Failure::new(at, message));
                    }
                    _ => {}
                }
            } else {
                state[*k] = 2;
                stack.pop();
            }
        }
    }
    Ok(())
}

/// Computations callees first, otherwise in text order: a depth-first post
/// order that visits the computations in text order and each one's callees
/// in call order. Text XLA can parse lists callees first already (it needs
/// a computation defined before its use), and then this is the text order,
/// which is also what XLA's parser gives.
fn post_order(callees: &[Vec<Vec<(usize, usize)>>]) -> Vec<usize> {
    let n = callees.len();
    let mut emitted = vec![false; n];
    let mut order = Vec::with_capacity(n);
    for start in 0..n {
        if emitted[start] {
            continue;
        }
        // (computation, its callees, next callee); cycles were rejected.
        let flat = |k: usize| callees[k].iter().flatten().map(|c| c.0).collect::<Vec<_>>();
        let mut stack = vec![(start, flat(start), 0usize)];
        let mut on_stack = vec![false; n];
        on_stack[start] = true;
        while let Some((k, out, next)) = stack.last_mut() {
            match out.get(*next).copied() {
                Some(c) => {
                    *next += 1;
                    if !emitted[c] && !on_stack[c] {
                        on_stack[c] = true;
                        let e = flat(c);
                        stack.push((c, e, 0));
                    }
                }
                None => {
                    let k = *k;
                    stack.pop();
                    emitted[k] = true;
                    order.push(k);
                }
            }
        }
    }
    order
}
