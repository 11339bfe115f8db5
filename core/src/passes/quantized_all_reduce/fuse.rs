//! Loop fusions for a module that is already fused.
//!
//! A compiler that runs the pass late (XLA's pre-scheduler hook, where the
//! JAX door sits) has done its fusion: every new elementwise op would run
//! as a kernel of its own, one trip through memory each. Here the ring's
//! quantize and dequantize-add chains are outlined into `kLoop` fusions the
//! way XLA's own instruction fusion would make them:
//!
//! - consumers first, a producer joins its consumer's fusion when every
//!   user of the producer is in that fusion (nothing is computed twice and
//!   no cycle can form: only a fusion's root is used outside it);
//! - a `reduce` (the blocks' absolute maximum, the scales' byte merge) is
//!   only ever a fusion's root: fused into an elementwise consumer it would
//!   be recomputed for every element of its block;
//! - constants, iotas and broadcasts of constants are copied into every
//!   fusion that uses them rather than passed in;
//! - collectives, parameters, tuples and the rank lookup stay outside.
//!
//! Only instructions the pass emitted are touched.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::ir::{CompId, Edits, InstrId, Module};
use crate::proto::{HloComputationProto, HloInstructionProto, ProgramShapeProto};

/// Ops a loop fusion may hold.
fn fusible(i: &HloInstructionProto) -> bool {
    matches!(
        i.opcode.as_str(),
        "abs"
            | "add"
            | "and"
            | "bitcast-convert"
            | "broadcast"
            | "clamp"
            | "compare"
            | "concatenate"
            | "constant"
            | "convert"
            | "divide"
            | "dynamic-slice"
            | "iota"
            | "is-finite"
            | "maximum"
            | "minimum"
            | "multiply"
            | "negate"
            | "or"
            | "pad"
            | "reduce"
            | "reduce-precision"
            | "remainder"
            | "reshape"
            | "round-nearest-even"
            | "select"
            | "shift-left"
            | "shift-right-arithmetic"
            | "shift-right-logical"
            | "slice"
            | "subtract"
    )
}

/// The emitted ops that are cheap to recompute wherever they are read, and
/// so are copied into each fusion that reads them instead of being made
/// once into a buffer: constants, iotas, broadcasts of constants, the
/// reshaping (convert, reshape, pad, concatenate) of the ring's inputs,
/// which every hop reads a different slice of, and the concatenation of the
/// lanes' results.
fn copied_ops(
    c: &crate::ir::Computation,
    emitted: &HashSet<i64>,
    by_id: &HashMap<i64, &HloInstructionProto>,
) -> HashSet<i64> {
    let mut copied: HashSet<i64> = HashSet::default();
    for i in c.instructions() {
        if !emitted.contains(&i.id) || !i.control_predecessor_ids.is_empty() {
            continue;
        }
        let yes = match i.opcode.as_str() {
            "constant" | "iota" => true,
            "broadcast" => i
                .operand_ids
                .first()
                .and_then(|o| by_id.get(o))
                .is_some_and(|o| o.opcode == "constant"),
            // Reads only the inputs (from outside the ring) and constants.
            "convert" | "reshape" | "pad" => i
                .operand_ids
                .iter()
                .all(|o| !emitted.contains(o) || copied.contains(o)),
            // The same, or the lanes' sums out of the ring's loop: the
            // gather's quantize reads them in place instead of from a
            // concatenated f32 copy.
            "concatenate" => i.operand_ids.iter().all(|o| {
                !emitted.contains(o)
                    || copied.contains(o)
                    || by_id
                        .get(o)
                        .is_some_and(|o| o.opcode == "get-tuple-element")
            }),
            _ => false,
        };
        if yes {
            copied.insert(i.id);
        }
    }
    copied
}

/// Outlines the fusible instructions among `emitted` (ids in computation
/// `comp`) into loop fusions.
pub fn fuse_emitted(module: &mut Module, comp: CompId, emitted: &HashSet<i64>) {
    let Some(c) = module.computation(comp) else {
        return;
    };
    let root_of_comp = c.root_id().0;
    let users = c.users();
    let by_id: HashMap<i64, &HloInstructionProto> =
        c.instructions().iter().map(|i| (i.id, i)).collect();
    let copied = copied_ops(c, emitted, &by_id);
    let eligible = |id: i64| {
        emitted.contains(&id)
            && by_id
                .get(&id)
                .is_some_and(|i| fusible(i) && i.control_predecessor_ids.is_empty())
    };

    // Group membership: instruction id → the id of its fusion's root.
    let mut group: HashMap<i64, i64> = HashMap::default();
    for instr in c.instructions().iter().rev() {
        if !eligible(instr.id) || copied.contains(&instr.id) {
            continue;
        }
        let root = *group.entry(instr.id).or_insert(instr.id);
        for &op in &instr.operand_ids {
            let Some(p) = by_id.get(&op) else { continue };
            if group.contains_key(&op)
                || !eligible(op)
                || copied.contains(&op)
                || p.opcode == "reduce"
                || op == root_of_comp
            {
                continue;
            }
            let all_inside = users.get(&InstrId(op)).is_some_and(|us| {
                !us.is_empty() && us.iter().all(|u| group.get(&u.0) == Some(&root))
            });
            if all_inside {
                group.insert(op, root);
            }
        }
    }

    // Members per root, in instruction order; single ops stay as they are.
    let mut members: HashMap<i64, Vec<i64>> = HashMap::default();
    for instr in c.instructions() {
        if let Some(&root) = group.get(&instr.id) {
            members.entry(root).or_default().push(instr.id);
        }
    }
    // A group of nothing but reshapes moves no data: as a fusion it would
    // become a copy. Those stay out, and become bitcasts below.
    let only_reshapes = |m: &[i64]| {
        m.iter()
            .all(|id| by_id.get(id).is_some_and(|i| i.opcode == "reshape"))
    };
    let mut roots: Vec<i64> = members
        .iter()
        .filter(|(_, m)| m.len() > 1 && !only_reshapes(m))
        .map(|(&r, _)| r)
        .collect();
    roots.sort_unstable_by_key(|r| c.position(InstrId(*r)));
    // Reshapes left outside every fusion whose layouts make them a
    // reinterpretation of the same bytes: `bitcast`, as XLA's own
    // simplifier has made every such reshape by this stage (a reshape
    // left as it is runs as a copy).
    let bitcasts: Vec<i64> = c
        .instructions()
        .iter()
        .filter(|i| {
            i.opcode == "reshape"
                && emitted.contains(&i.id)
                && members
                    .get(group.get(&i.id).unwrap_or(&i.id))
                    .is_none_or(|m| m.len() == 1 || only_reshapes(m))
                && i.operand_ids
                    .first()
                    .and_then(|o| by_id.get(o))
                    .is_some_and(|o| row_major(o) && row_major(i))
        })
        .map(|i| i.id)
        .collect();

    let mut outlined = Vec::with_capacity(roots.len());
    for root in roots {
        let ids = &members[&root];
        outlined.push(outline(&by_id, &copied, ids, root));
    }

    if let Some(c) = module.computation_mut(comp) {
        for id in bitcasts {
            if let Some(i) = c.get_mut(InstrId(id)) {
                i.opcode = "bitcast".into();
            }
        }
    }
    let mut edits = Edits::default();
    for o in outlined {
        let fused = module.add_computation(o.body, true, Some(comp));
        let name = module.fresh_name("equarx_fusion");
        let Some(c) = module.computation_mut(comp) else {
            break;
        };
        let Some(root) = c.get_mut(InstrId(o.root)) else {
            continue;
        };
        // The fusion takes the root's id and place: its users need no edit,
        // and every operand it reads precedes the root already.
        *root = HloInstructionProto {
            id: root.id,
            name,
            opcode: "fusion".into(),
            shape: root.shape.take(),
            metadata: root.metadata.take(),
            fusion_kind: "kLoop".into(),
            operand_ids: o.params,
            called_computation_ids: vec![fused.0],
            ..Default::default()
        };
        edits
            .remove
            .extend(o.members.into_iter().filter(|&m| m != o.root).map(InstrId));
    }
    module.apply(comp, edits);
    // What the fusions copied in may be dead now, chains of it included:
    // one sweep from the last instruction back, so every user is judged
    // before what it reads.
    if let Some(c) = module.computation(comp) {
        let mut used: HashSet<i64> = HashSet::default();
        let mut dead = Edits::default();
        for i in c.instructions().iter().rev() {
            if copied.contains(&i.id) && !used.contains(&i.id) && i.id != root_of_comp {
                dead.remove.insert(InstrId(i.id));
            } else {
                used.extend(i.operand_ids.iter().copied());
            }
        }
        module.apply(comp, dead);
    }
}

/// An array laid out row-major (dimension 0 most major), the layout
/// whose bytes a reshape keeps in order.
fn row_major(i: &HloInstructionProto) -> bool {
    i.shape.as_ref().is_some_and(|s| {
        let rank = s.dimensions.len() as i64;
        s.tuple_shapes.is_empty()
            && s.layout.as_ref().is_some_and(|l| {
                l.minor_to_major.iter().copied().eq((0..rank).rev())
                    && l.tiles.is_empty()
                    && l.memory_space == 0
            })
    })
}

/// One fusion to make: the fused computation (ids still to be assigned by
/// [`Module::add_computation`]) and what the fusion instruction reads.
struct Outline {
    root: i64,
    members: Vec<i64>,
    params: Vec<i64>,
    body: HloComputationProto,
}

fn outline(
    by_id: &HashMap<i64, &HloInstructionProto>,
    copied: &HashSet<i64>,
    members: &[i64],
    root: i64,
) -> Outline {
    /// The fused computation under construction.
    struct Body<'a> {
        by_id: &'a HashMap<i64, &'a HloInstructionProto>,
        copied: &'a HashSet<i64>,
        /// Old id → index in `instrs` (ids are given later; the index
        /// stands in).
        local: HashMap<i64, i64>,
        instrs: Vec<HloInstructionProto>,
        params: Vec<i64>,
        param_shapes: Vec<crate::proto::ShapeProto>,
    }
    impl Body<'_> {
        fn push(&mut self, old: i64, mut i: HloInstructionProto) -> i64 {
            let l = self.instrs.len() as i64;
            i.id = l;
            self.instrs.push(i);
            self.local.insert(old, l);
            l
        }
        /// The local id of `op` read from inside: copied in (with what it
        /// reads) if it is a copied op, else a parameter.
        fn operand(&mut self, op: i64) -> i64 {
            if let Some(&l) = self.local.get(&op) {
                return l;
            }
            let by_id = self.by_id;
            let Some(p) = by_id.get(&op) else {
                return -1;
            };
            if self.copied.contains(&op) {
                let mut i = (*p).clone();
                i.operand_ids = i.operand_ids.iter().map(|&o| self.operand(o)).collect();
                return self.push(op, i);
            }
            let n = self.params.len();
            self.params.push(op);
            self.param_shapes.push(p.shape.clone().unwrap_or_default());
            let param = HloInstructionProto {
                name: format!("param_{n}"),
                opcode: "parameter".into(),
                shape: p.shape.clone(),
                parameter_number: n as i64,
                ..Default::default()
            };
            self.push(op, param)
        }
    }

    let mut body = Body {
        by_id,
        copied,
        local: HashMap::default(),
        instrs: Vec::new(),
        params: Vec::new(),
        param_shapes: Vec::new(),
    };
    for &m in members {
        let instr = by_id[&m];
        let mut i = instr.clone();
        // Members come in instruction order: a member read here is in
        // `local` already; anything else becomes a copy or a parameter.
        i.operand_ids = instr
            .operand_ids
            .iter()
            .map(|&op| body.operand(op))
            .collect();
        body.push(m, i);
    }
    let Body {
        local,
        instrs: body,
        params,
        param_shapes,
        ..
    } = body;
    let result = by_id[&root].shape.clone();
    Outline {
        root,
        members: members.to_vec(),
        params,
        body: HloComputationProto {
            name: "equarx_fused".into(),
            root_id: local[&root],
            program_shape: Some(ProgramShapeProto {
                parameters: param_shapes,
                result,
                parameter_names: vec![],
            }),
            instructions: body,
            ..Default::default()
        },
    }
}
