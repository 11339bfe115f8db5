//! The one source of well-formedness for modules equarx reads and writes.
//!
//! Runs on every input before a pass touches it and after every pass that
//! changed it (see [`crate::passes`]). It checks what a pass could break
//! and what would make XLA reject or misread a module: unique ids and
//! names, references that resolve, operands before users, a root per
//! computation, an acyclic call graph, shapes of the ops equarx models (see
//! [`crate::ir::infer`]), groups listed where ids are flattened, and a
//! schedule that orders exactly each computation's instructions.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::ir::groups::{GroupEncoding, GroupMode, ReplicaGroups};
use crate::ir::opcode::Opcode;
use crate::ir::{Computation, Module, infer, shape};
use crate::proto::{HloInstructionProto, LiteralProto, ShapeProto};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    #[error("the module has no computations")]
    NoComputations,
    #[error("entry computation id {0} does not exist")]
    MissingEntry(i64),
    #[error("computation id {id} is used by both {first} and {second}")]
    DuplicateComputationId {
        id: i64,
        first: String,
        second: String,
    },
    #[error("instruction id {id} is used by both {first} and {second}")]
    DuplicateInstructionId {
        id: i64,
        first: String,
        second: String,
    },
    #[error("instruction name {0} is used twice")]
    DuplicateName(String),
    #[error("{comp}: root id {root} is not an instruction of the computation")]
    MissingRoot { comp: String, root: i64 },
    #[error(
        "{comp}/{instr}: operand id {operand} is not an earlier instruction of the computation"
    )]
    BadOperand {
        comp: String,
        instr: String,
        operand: i64,
    },
    #[error(
        "{comp}/{instr}: control predecessor id {pred} is not an earlier instruction of the computation"
    )]
    BadControlPredecessor {
        comp: String,
        instr: String,
        pred: i64,
    },
    #[error("{comp}/{instr}: called computation id {callee} does not exist")]
    MissingCallee {
        comp: String,
        instr: String,
        callee: i64,
    },
    #[error("computation {0} calls itself, directly or through others")]
    CallCycle(String),
    #[error("{comp}/{instr}: no shape")]
    NoShape { comp: String, instr: String },
    #[error("{comp}/{instr}: {message}")]
    BadShape {
        comp: String,
        instr: String,
        message: String,
    },
    #[error("{comp}/{instr}: {what} nested more than {MAX_NESTING} levels deep")]
    TooDeep {
        comp: String,
        instr: String,
        what: &'static str,
    },
    #[error("{comp}/{instr}: {message}")]
    BadGroups {
        comp: String,
        instr: String,
        message: String,
    },
    #[error("schedule names computation id {0}, which does not exist")]
    ScheduleUnknownComputation(i64),
    #[error("schedule of {comp}: {message}")]
    BadSchedule { comp: String, message: String },
}

/// Deepest nesting of tuple shapes and tuple literals a module may have:
/// far beyond real programs (the proto decoder stops at 100 message levels
/// in all), and shallow enough that equarx's recursive shape and literal
/// helpers never exhaust a thread's stack, whoever built the module.
pub const MAX_NESTING: usize = 100;

/// Checks `module`; the first problem found is the error.
pub fn verify(module: &Module) -> Result<(), VerifyError> {
    let comps = module.computations();
    if comps.is_empty() {
        return Err(VerifyError::NoComputations);
    }
    // First, before any recursive helper sees a shape.
    verify_nesting(module)?;
    let mut comp_names: HashMap<i64, &str> = HashMap::default();
    for c in comps {
        if let Some(first) = comp_names.insert(c.id().0, c.name()) {
            return Err(VerifyError::DuplicateComputationId {
                id: c.id().0,
                first: first.to_string(),
                second: c.name().to_string(),
            });
        }
    }
    if !comp_names.contains_key(&module.entry_id().0) {
        return Err(VerifyError::MissingEntry(module.entry_id().0));
    }

    let count: usize = comps.iter().map(|c| c.instructions().len()).sum();
    let mut ids: HashMap<i64, &str> = HashMap::default();
    let mut names: HashSet<&str> = HashSet::default();
    ids.reserve(count);
    names.reserve(count);
    for c in comps {
        for i in c.instructions() {
            if let Some(first) = ids.insert(i.id, &i.name) {
                return Err(VerifyError::DuplicateInstructionId {
                    id: i.id,
                    first: first.to_string(),
                    second: i.name.clone(),
                });
            }
            if !names.insert(&i.name) {
                return Err(VerifyError::DuplicateName(i.name.clone()));
            }
        }
    }

    for c in comps {
        verify_computation(c, &comp_names)?;
    }
    verify_call_graph(module)?;
    verify_schedule(module)
}

/// Every shape and literal is at most [`MAX_NESTING`] levels deep (checked
/// without recursion).
fn verify_nesting(module: &Module) -> Result<(), VerifyError> {
    fn shape_ok(s: &ShapeProto) -> bool {
        let mut stack = vec![(s, 0usize)];
        while let Some((s, depth)) = stack.pop() {
            if depth > MAX_NESTING {
                return false;
            }
            stack.extend(s.tuple_shapes.iter().map(|t| (t, depth + 1)));
        }
        true
    }
    fn literal_ok(l: &LiteralProto) -> bool {
        let mut stack = vec![(l, 0usize)];
        while let Some((l, depth)) = stack.pop() {
            if depth > MAX_NESTING || !l.shape.as_ref().is_none_or(shape_ok) {
                return false;
            }
            stack.extend(l.tuple_literals.iter().map(|t| (t, depth + 1)));
        }
        true
    }
    let too_deep = |comp: &str, instr: &str, what| VerifyError::TooDeep {
        comp: comp.to_string(),
        instr: instr.to_string(),
        what,
    };
    let header = module.header();
    let host = header.host_program_shape.as_ref();
    if host.is_some_and(|p| !p.parameters.iter().chain(&p.result).all(shape_ok)) {
        return Err(too_deep("module", "host_program_shape", "a shape"));
    }
    for c in module.computations() {
        let program = c.header().program_shape.as_ref();
        if program.is_some_and(|p| !p.parameters.iter().chain(&p.result).all(shape_ok)) {
            return Err(too_deep(c.name(), "program_shape", "a shape"));
        }
        for i in c.instructions() {
            if !i.shape.as_ref().is_none_or(shape_ok) {
                return Err(too_deep(c.name(), &i.name, "its shape"));
            }
            if !i.literal.as_ref().is_none_or(|l| literal_ok(l)) {
                return Err(too_deep(c.name(), &i.name, "its literal"));
            }
        }
    }
    Ok(())
}

fn verify_computation(c: &Computation, comps: &HashMap<i64, &str>) -> Result<(), VerifyError> {
    let comp = || c.name().to_string();
    if !c.contains(c.root_id()) {
        return Err(VerifyError::MissingRoot {
            comp: comp(),
            root: c.root_id().0,
        });
    }
    let mut seen: HashMap<i64, &HloInstructionProto> = HashMap::default();
    seen.reserve(c.instructions().len());
    for instr in c.instructions() {
        let at = || (comp(), instr.name.clone());
        for &op in &instr.operand_ids {
            if !seen.contains_key(&op) {
                let (comp, instr) = at();
                return Err(VerifyError::BadOperand {
                    comp,
                    instr,
                    operand: op,
                });
            }
        }
        for &pred in &instr.control_predecessor_ids {
            if !seen.contains_key(&pred) {
                let (comp, instr) = at();
                return Err(VerifyError::BadControlPredecessor { comp, instr, pred });
            }
        }
        for &callee in &instr.called_computation_ids {
            if !comps.contains_key(&callee) {
                let (comp, instr) = at();
                return Err(VerifyError::MissingCallee {
                    comp,
                    instr,
                    callee,
                });
            }
        }
        let Some(declared) = &instr.shape else {
            let (comp, instr) = at();
            return Err(VerifyError::NoShape { comp, instr });
        };
        let operands: Vec<_> = instr
            .operand_ids
            .iter()
            .map(|op| seen[op].shape.as_ref().unwrap_or(declared))
            .collect();
        let bad = |message: String| {
            let (comp, instr) = at();
            VerifyError::BadShape {
                comp,
                instr,
                message,
            }
        };
        check_layout(declared).map_err(&bad)?;
        match infer::expected_shape(instr, &operands) {
            Ok(Some(expected)) if !shape::compatible(&expected, declared) => {
                return Err(bad(format!(
                    "shape is {}, its operands make it {}",
                    shape::describe(declared),
                    shape::describe(&expected)
                )));
            }
            Ok(_) => {}
            Err(message) => return Err(bad(message)),
        }
        check_groups(instr).map_err(|message| {
            let (comp, instr) = at();
            VerifyError::BadGroups {
                comp,
                instr,
                message,
            }
        })?;
        if Opcode::of(instr) == Some(Opcode::Parameter) {
            let params = c.header().program_shape.as_ref().map(|p| &p.parameters);
            let n = instr.parameter_number;
            if let Some(expected) =
                params.and_then(|p| usize::try_from(n).ok().and_then(|n| p.get(n)))
            {
                if !shape::compatible(expected, declared) {
                    return Err(bad(format!(
                        "parameter {n} is {}, the computation declares {}",
                        shape::describe(declared),
                        shape::describe(expected)
                    )));
                }
            }
        }
        seen.insert(instr.id, instr);
    }
    Ok(())
}

/// A collective in flattened-id mode lists its groups: XLA's verifier
/// rejects an empty list there ("Replica groups must be specified in
/// flattened-id mode"), since no count says whose ids "everyone" means.
/// Groups equarx cannot read are the pass's to report, per op.
fn check_groups(instr: &HloInstructionProto) -> Result<(), String> {
    if GroupMode::of(instr) != GroupMode::FlattenedId {
        return Ok(());
    }
    match ReplicaGroups::of(instr) {
        Ok(groups) if groups.encoding == GroupEncoding::Empty => Err(
            "use_global_device_ids=true needs its replica groups listed (flattened ids); \
             XLA's verifier rejects replica_groups={}"
                .into(),
        ),
        _ => Ok(()),
    }
}

/// Every array shape's layout, when present, names each dimension once.
fn check_layout(s: &crate::proto::ShapeProto) -> Result<(), String> {
    if shape::is_tuple(s) {
        return s.tuple_shapes.iter().try_for_each(check_layout);
    }
    if let Some(layout) = &s.layout {
        let rank = s.dimensions.len();
        let m2m = &layout.minor_to_major;
        // A permutation of 0..rank: each in range, none twice (a bit set).
        let mut seen = vec![0u64; rank.div_ceil(64)];
        let valid = m2m.len() == rank
            && m2m.iter().all(|&d| {
                usize::try_from(d)
                    .ok()
                    .filter(|&d| d < rank && seen[d / 64] & (1 << (d % 64)) == 0)
                    .map(|d| seen[d / 64] |= 1 << (d % 64))
                    .is_some()
            });
        // Non-array shapes may omit the layout entirely.
        if !valid && (!m2m.is_empty() || shape::is_array(s)) {
            return Err(format!(
                "layout {{{m2m:?}}} is not a permutation of {rank} dimensions of {}",
                shape::describe(s)
            ));
        }
    }
    Ok(())
}

fn verify_call_graph(module: &Module) -> Result<(), VerifyError> {
    // Iterative DFS with three colours; a grey callee is a cycle.
    #[derive(Clone, Copy, PartialEq)]
    enum Colour {
        White,
        Grey,
        Black,
    }
    let callees = |c: &Computation| -> Vec<i64> {
        let mut v: Vec<i64> = c
            .instructions()
            .iter()
            .flat_map(|i| i.called_computation_ids.iter().copied())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let mut colour: HashMap<i64, Colour> = module
        .computations()
        .iter()
        .map(|c| (c.id().0, Colour::White))
        .collect();
    for start in module.computations() {
        if colour[&start.id().0] != Colour::White {
            continue;
        }
        let mut stack = vec![(start.id().0, callees(start), 0usize)];
        colour.insert(start.id().0, Colour::Grey);
        while let Some((id, next, at)) = stack.last_mut() {
            if let Some(&callee) = next.get(*at) {
                *at += 1;
                match colour.get(&callee) {
                    Some(Colour::Grey) => {
                        let name = module
                            .computation(crate::ir::CompId(callee))
                            .map(|c| c.name().to_string())
                            .unwrap_or_default();
                        return Err(VerifyError::CallCycle(name));
                    }
                    Some(Colour::White) => {
                        colour.insert(callee, Colour::Grey);
                        let c = module.computation(crate::ir::CompId(callee));
                        stack.push((callee, c.map(callees).unwrap_or_default(), 0));
                    }
                    _ => {}
                }
            } else {
                colour.insert(*id, Colour::Black);
                stack.pop();
            }
        }
    }
    Ok(())
}

fn verify_schedule(module: &Module) -> Result<(), VerifyError> {
    let Some(schedule) = module.schedule() else {
        return Ok(());
    };
    for (comp_id, seq) in schedule {
        let c = module
            .computation(crate::ir::CompId(comp_id))
            .ok_or(VerifyError::ScheduleUnknownComputation(comp_id))?;
        let bad = |message: String| VerifyError::BadSchedule {
            comp: c.name().to_string(),
            message,
        };
        if seq.len() != c.instructions().len() {
            return Err(bad(format!(
                "{} entries for {} instructions",
                seq.len(),
                c.instructions().len()
            )));
        }
        let mut done: HashSet<i64> = HashSet::default();
        for &id in seq {
            let instr = c
                .get(crate::ir::InstrId(id))
                .ok_or_else(|| bad(format!("id {id} is not an instruction of the computation")))?;
            if done.contains(&id) {
                return Err(bad(format!("{} is scheduled twice", instr.name)));
            }
            let early = instr
                .operand_ids
                .iter()
                .chain(&instr.control_predecessor_ids)
                .find(|p| !done.contains(p));
            if let Some(p) = early {
                let name = c
                    .get(crate::ir::InstrId(*p))
                    .map(|i| i.name.clone())
                    .unwrap_or_default();
                return Err(bad(format!(
                    "{} is scheduled before its input {name}",
                    instr.name
                )));
            }
            done.insert(id);
        }
    }
    Ok(())
}
