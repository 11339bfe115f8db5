//! `outline-fusions`: loop fusions for what equarx emitted into a module
//! that is already fused.
//!
//! A compiler that runs the pass late (XLA's pre-scheduler hook, where the
//! JAX door sits; [`Stage::Fused`]) has done its fusion: every new
//! elementwise op would run as a kernel of its own, one trip through memory
//! each. Here the quantize and dequantize-add chains are outlined into
//! `kLoop` fusions the way XLA's own instruction fusion would make them:
//!
//! - consumers first, a producer joins its consumer's fusion when every
//!   user of the producer is in that fusion (nothing is computed twice and
//!   no cycle can form: only a fusion's root is used outside it);
//! - a `reduce` (the blocks' absolute maximum, the scales' byte merge) is
//!   never fused into a consumer that spreads it back over its block: it
//!   would be recomputed for every element of the block. For XLA:CPU a
//!   fusion of elementwise ops over the reduce's result that reads nothing
//!   else (a block's reciprocal scale from its largest bits) joins the
//!   reduce's fusion as its epilogue, the reduce staying a root where
//!   anything else reads it (one multi-output kernel where there were two;
//!   the epilogue runs once per reduced element);
//! - constants, iotas and broadcasts of constants are copied into every
//!   fusion that uses them rather than passed in;
//! - a reshape that ends a chain and only sees row-major bytes anew stays
//!   outside as a `bitcast` (as a fusion's root XLA:CPU would compute each
//!   element's index through it);
//! - for XLA:CPU an expensive op (a divide: a block's reciprocal scale)
//!   that a broadcast spreads is not fused into it, as XLA:CPU's own fusion
//!   leaves it ("not profitable"): its loop emitter would compute it again
//!   for every element of its block;
//! - a cheap elementwise op that several fusions read (a block's scale
//!   chain, read by its reciprocal and by its wire bytes) is copied into
//!   each of them, as XLA's own fusion recomputes a cheap producer;
//! - a constant that only says where dynamic slices start stays outside,
//!   an operand of their fusions: fusions that differ only in where they
//!   slice (a two-shot exchange's P parts) are then alike, and XLA:CPU
//!   compiles one kernel for all the fusions alike in a module;
//! - fusions of elementwise ops over one shape that read the same operands
//!   (the ring's rank lookups) are one multi-output fusion, unless their
//!   roots are concatenates (XLA:CPU emits a concatenate root with a
//!   kernel of its own kind, one of several roots with its generic loop);
//! - collectives, parameters, tuples and the rank lookup stay outside.
//!
//! Past XLA:TPU's layout assignment ([`Stage::Tiled`], its pre-scheduler
//! hook) libtpu's fusion emitter takes less, and aborts the process on
//! what it does not take (`fusion_util.cc`: "TransformWindow: Loop will not
//! make progress" for a reshape, a broadcast along new dimensions other
//! than one new minor one, or ops over two shapes inside a fusion of tiled
//! arrays; a refusal for a concatenate or a constant array). There a
//! fusion holds only elementwise ops over arrays of one shape, scalars and
//! their broadcasts, a block's scale spread along its block and a run of
//! rows of the major dimension, each from a parameter, and a reduce as its
//! root ([`Rules::Tiled`]); everything else stays an op of its own. Three
//! things make up for that there: cheap elementwise ops are copied into
//! each fusion that reads them, as past any fusion (the input's widening
//! too); two fusions of elementwise ops over one shape that read the same
//! operands (a block's reciprocal scale and its wire bits) are one
//! multi-output fusion; and a reshape that only regroups whole tile rows
//! is a `bitcast`.
//!
//! Only instructions equarx emitted are touched: those whose metadata
//! names the collective they came from (`op_name` `equarx[...]`, which
//! every emitted instruction carries, loop bodies included).
//!
//! Why it is sound: an outlined fusion computes what its members computed,
//! from the same operands; only a fusion's root is used outside it, and an
//! op copied into several computes the same value in each.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::quantize_collectives::splice::EMITTED_OP_NAME_PREFIX;
use super::{Pass, PassError, Platform, Stage};
use crate::ir::opcode::{Class, Opcode};
use crate::ir::{CompId, Edits, InstrId, Module, shape};
use crate::options::FuseMode;
use crate::proto::{HloComputationProto, HloInstructionProto, ProgramShapeProto, ShapeProto};

/// The pass: outlines equarx's emitted chains when `fuse` says so (`auto`:
/// in a fused module).
pub struct OutlineFusions {
    pub fuse: FuseMode,
    pub stage: Stage,
    /// The compiler that gets the module: XLA:CPU's loop emitter computes
    /// a fused operand of a broadcast again for every element it spreads to.
    pub platform: Platform,
    /// How many tasks a loop fusion may run as: XLA:CPU runs one as several
    /// where its backend config says so, and gave its own theirs before
    /// its pre-scheduler hook; equarx's get theirs by the same rule, or
    /// each would run on one thread while XLA's beside it use them all.
    /// [`module_tasks`] of the module as it came, for XLA:CPU past its
    /// fusion; 1 elsewhere.
    pub tasks: i64,
}

impl Pass for OutlineFusions {
    fn name(&self) -> &'static str {
        "outline-fusions"
    }

    fn run(&mut self, module: &mut Module) -> Result<bool, PassError> {
        if !outlines(self.fuse, self.stage) {
            return Ok(false);
        }
        let rules = match self.stage {
            Stage::Tiled => Rules::Tiled,
            Stage::Fused | Stage::PreFusion => Rules::Fused,
        };
        let before = module.computations().len();
        let comps: Vec<CompId> = module
            .computations()
            .iter()
            .filter(|c| !c.is_fusion())
            .map(|c| c.id())
            .collect();
        let mut changed = false;
        for comp in comps {
            let emitted: HashSet<i64> =
                module.computation(comp).map_or_else(HashSet::default, |c| {
                    c.instructions()
                        .iter()
                        .filter(|i| emitted_by_equarx(i))
                        .map(|i| i.id)
                        .collect()
                });
            if !emitted.is_empty() {
                changed |= fuse_emitted(module, comp, &emitted, rules, self.platform, self.tasks)?;
            }
        }
        Ok(changed || module.computations().len() != before)
    }
}

/// Whether the pass outlines what equarx emitted into fusions: `fuse` not
/// off, and the module past XLA's fusion.
pub fn outlines(fuse: FuseMode, stage: Stage) -> bool {
    fuse != FuseMode::Off && stage != Stage::PreFusion
}

/// Whether equarx emitted `i` (its metadata names a collective equarx
/// rewrote).
pub fn emitted_by_equarx(i: &HloInstructionProto) -> bool {
    i.metadata
        .as_ref()
        .is_some_and(|m| m.op_name.starts_with(EMITTED_OP_NAME_PREFIX))
}

/// What a loop fusion may hold, by the compiler that gets it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Rules {
    /// Past XLA's fusion (XLA:CPU's and XLA:GPU's hooks): elementwise ops,
    /// the data movement a rewrite emits, reductions as roots; siblings
    /// merged into multi-output fusions.
    Fused,
    /// Past XLA:TPU's layout assignment: elementwise ops over arrays of one
    /// shape, scalars and their broadcasts, a scale's spread and a
    /// parameter's major rows, reductions as roots; siblings merged into
    /// multi-output fusions.
    Tiled,
}

/// An array of one element (a scalar, or every dimension 1).
fn effectively_scalar(i: &HloInstructionProto) -> bool {
    i.shape
        .as_ref()
        .is_some_and(|s| s.tuple_shapes.is_empty() && s.dimensions.iter().all(|&d| d == 1))
}

/// Whether `i` may join a loop fusion under `rules`.
fn fusible(
    i: &HloInstructionProto,
    by_id: &HashMap<i64, &HloInstructionProto>,
    rules: Rules,
) -> bool {
    match rules {
        Rules::Fused => fusible_past_fusion(i),
        Rules::Tiled => fusible_tiled(i, by_id),
    }
}

/// The dimensions of `i`'s shape (none for a shapeless instruction).
fn dims(i: &HloInstructionProto) -> &[i64] {
    i.shape.as_ref().map_or(&[], |s| &s.dimensions)
}

/// [`Rules::Tiled`]: what libtpu's fusion emitter takes (module doc),
/// over arrays that are scalars or carry tiles (an op whose tiles libtpu
/// is not known to take is emitted untiled: `splice::tiles_known`).
fn fusible_tiled(i: &HloInstructionProto, by_id: &HashMap<i64, &HloInstructionProto>) -> bool {
    let tiled_or_scalar = |i: &HloInstructionProto| {
        i.shape.as_ref().is_some_and(|s| {
            s.tuple_shapes.is_empty()
                && (s.dimensions.is_empty()
                    || s.layout.as_ref().is_some_and(|l| !l.tiles.is_empty()))
        })
    };
    if !tiled_or_scalar(i)
        || !i
            .operand_ids
            .iter()
            .all(|o| by_id.get(o).is_some_and(|o| tiled_or_scalar(o)))
    {
        return false;
    }
    let operand_dims = || {
        i.operand_ids
            .iter()
            .map(|o| by_id.get(o).map_or(&[][..], |o| dims(o)))
    };
    match Opcode::of(i) {
        Some(Opcode::Reduce) => true,
        Some(Opcode::Constant | Opcode::Iota) => effectively_scalar(i),
        Some(Opcode::Broadcast) => {
            operand_dims().all(|d| d.is_empty()) || spreads_along_a_new_minor_dimension(i, by_id)
        }
        Some(Opcode::Slice) => takes_major_rows(i, by_id),
        Some(op) if op.is_elementwise() && op.class() != Class::Collective => {
            operand_dims().all(|d| d.is_empty() || d == dims(i))
        }
        _ => false,
    }
}

/// A broadcast of a tiled array of rank 2 or more along one new minor
/// dimension, its own dimensions kept in order: a block's scale spread
/// over its block (`f32[4,128]` to `f32[4,128,64]`), which libtpu's own
/// quantize fuses. libtpu's emitter aborts on a fusion that also holds ops
/// over the smaller shape ("TransformWindow: Loop will not make
/// progress"), so the broadcast reads a fusion parameter
/// ([`fusion_groups`]). A vector's (`f32[n]{0:T(1024)}` to `f32[n,64]`)
/// compiles, but slower than the kernel it saves (an 8 MiB psum 1.3 s
/// against 1.1 s), and stays outside.
fn spreads_along_a_new_minor_dimension(
    i: &HloInstructionProto,
    by_id: &HashMap<i64, &HloInstructionProto>,
) -> bool {
    let rank = i
        .operand_ids
        .first()
        .and_then(|o| by_id.get(o))
        .and_then(|o| {
            o.shape
                .as_ref()
                .filter(|s| s.layout.as_ref().is_some_and(|l| !l.tiles.is_empty()))
                .map(|s| s.dimensions.len())
        });
    rank.is_some_and(|r| {
        r >= 2 && dims(i).len() == r + 1 && i.dimensions.iter().copied().eq(0..r as i64)
    })
}

/// A slice of a run of a tiled array's major dimension, every other
/// dimension whole: the halves an exchange adds, which libtpu's own fusion
/// reads from the array it slices (a window along an untiled dimension).
/// It reads a fusion parameter: the array sliced is of another shape
/// ([`fusion_groups`]).
fn takes_major_rows(i: &HloInstructionProto, by_id: &HashMap<i64, &HloInstructionProto>) -> bool {
    let Some(from) = i.operand_ids.first().and_then(|o| by_id.get(o)) else {
        return false;
    };
    let whole = dims(from);
    whole.len() >= 2
        && i.slice_dimensions.len() == whole.len()
        && i.slice_dimensions.iter().all(|s| s.stride == 1)
        && i.slice_dimensions[1..]
            .iter()
            .zip(&whole[1..])
            .all(|(s, &d)| s.start == 0 && s.limit == d)
}

/// [`Rules::Fused`]: elementwise ops, the data movement a rewrite emits,
/// and reductions (only as a fusion's root).
fn fusible_past_fusion(i: &HloInstructionProto) -> bool {
    Opcode::of(i).is_some_and(|op| {
        op.is_elementwise()
            || matches!(
                op,
                Opcode::Broadcast
                    | Opcode::Concatenate
                    | Opcode::Constant
                    | Opcode::DynamicSlice
                    | Opcode::Iota
                    | Opcode::Pad
                    | Opcode::Reduce
                    | Opcode::Reshape
                    | Opcode::Slice
            )
    }) && Opcode::of(i).map(Opcode::class) != Some(Class::Collective)
}

fn is(i: &HloInstructionProto, op: Opcode) -> bool {
    Opcode::of(i) == Some(op)
}

/// The emitted ops that are cheap to recompute wherever they are read, and
/// so are copied into each fusion that reads them instead of being made
/// once into a buffer: constants, iotas, broadcasts of constants, the
/// reshaping (convert, reshape, pad, concatenate) of the ring's inputs,
/// which every hop reads a different slice of, and the concatenation of the
/// lanes' results.
///
/// Under [`Rules::Tiled`] only scalar constants and their broadcasts (a
/// constant array inside a fusion is refused there). Under both rules the
/// shared cheap elementwise ops ([`shared_cheap_ops`]) are copied as well;
/// [`fuse_emitted`] adds them.
fn copied_ops(
    c: &crate::ir::Computation,
    emitted: &HashSet<i64>,
    by_id: &HashMap<i64, &HloInstructionProto>,
    users: &HashMap<InstrId, Vec<InstrId>>,
    rules: Rules,
) -> HashSet<i64> {
    let mut copied: HashSet<i64> = HashSet::default();
    for i in c.instructions() {
        if !emitted.contains(&i.id)
            || !i.control_predecessor_ids.is_empty()
            || slice_start(i, by_id, users)
        {
            continue;
        }
        let fused = rules == Rules::Fused;
        let yes = match Opcode::of(i) {
            // Under `Rules::Tiled` a constant array is refused in a fusion.
            Some(Opcode::Constant) => fused || effectively_scalar(i),
            Some(Opcode::Iota) => fused,
            Some(Opcode::Broadcast) => i
                .operand_ids
                .first()
                .and_then(|o| by_id.get(o))
                .is_some_and(|o| is(o, Opcode::Constant) && (fused || effectively_scalar(o))),
            _ if !fused => false,
            // Reads only the inputs (from outside the ring) and constants.
            Some(Opcode::Convert | Opcode::Reshape | Opcode::Pad) => i
                .operand_ids
                .iter()
                .all(|o| !emitted.contains(o) || copied.contains(o)),
            // The same, or the lanes' sums out of the ring's loop: the
            // gather's quantize reads them in place instead of from a
            // concatenated f32 copy.
            Some(Opcode::Concatenate) => i.operand_ids.iter().all(|o| {
                !emitted.contains(o)
                    || copied.contains(o)
                    || by_id.get(o).is_some_and(|o| is(o, Opcode::GetTupleElement))
            }),
            _ => false,
        };
        if yes {
            copied.insert(i.id);
        }
    }
    copied
}

/// The cheap elementwise ops (no divide, power or transcendental: XLA's
/// own fusion does not recompute those either) whose every user is a
/// fusible op over the same shape or one of these: copied into each fusion
/// that reads them, as XLA's own fusion recomputes a cheap producer in
/// each consumer. A block's scale chain, say, goes into both the codes
/// (its wire bytes) and the reciprocal scale: it is not a kernel of its
/// own that writes the scales for both to read back (past libtpu's fusion,
/// and XLA:CPU's: two kernels fewer a two-shot op there). Walked from the
/// last instruction back, so every user is judged before what it reads; an
/// op read once is only taken when its user is one of these.
fn shared_cheap_ops(
    c: &crate::ir::Computation,
    emitted: &HashSet<i64>,
    by_id: &HashMap<i64, &HloInstructionProto>,
    users: &HashMap<InstrId, Vec<InstrId>>,
    rules: Rules,
) -> HashSet<i64> {
    let fusible = |i: &HloInstructionProto| eligible(i, emitted, by_id, users, rules);
    let cheap = |i: &HloInstructionProto| {
        Opcode::of(i).is_some_and(|op| {
            op.is_elementwise() && op.class() != Class::Collective && !expensive(op)
        })
    };
    let mut shared: HashSet<i64> = HashSet::default();
    for i in c.instructions().iter().rev() {
        let Some(us) = users.get(&InstrId(i.id)) else {
            continue;
        };
        let taken = cheap(i)
            && fusible(i)
            && (us.len() > 1 || us.iter().any(|u| shared.contains(&u.0)))
            && us.iter().all(|u| {
                shared.contains(&u.0)
                    || by_id
                        .get(&u.0)
                        .is_some_and(|u| fusible(u) && dims(u) == dims(i))
            });
        if taken {
            shared.insert(i.id);
        }
    }
    shared
}

/// An elementwise op XLA's own fusion does not recompute: a divide, a
/// power, a transcendental.
fn expensive(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::Divide
            | Opcode::Remainder
            | Opcode::Power
            | Opcode::Exponential
            | Opcode::ExponentialMinusOne
            | Opcode::Log
            | Opcode::LogPlusOne
            | Opcode::Sqrt
            | Opcode::Rsqrt
            | Opcode::Cbrt
            | Opcode::Tanh
            | Opcode::Logistic
    )
}

/// Outlines the fusible instructions among `emitted` (ids in computation
/// `comp`) into loop fusions; whether anything changed.
fn fuse_emitted(
    module: &mut Module,
    comp: CompId,
    emitted: &HashSet<i64>,
    rules: Rules,
    platform: Platform,
    tasks: i64,
) -> Result<bool, PassError> {
    let Some(c) = module.computation(comp) else {
        return Ok(false);
    };
    let by_id: HashMap<i64, &HloInstructionProto> =
        c.instructions().iter().map(|i| (i.id, i)).collect();
    let users = c.users();
    let shared = shared_cheap_ops(c, emitted, &by_id, &users, rules);
    let mut copied = copied_ops(c, emitted, &by_id, &users, rules);
    copied.extend(&shared);
    let group = fusion_groups(c, emitted, &by_id, &copied, &users, rules, platform);
    let members = members_by_root(c, &group);
    let roots = fusion_roots(c, &members, &by_id, &copied, &shared);
    let bitcasts = reshapes_to_bitcast(c, emitted, &group, &members, &by_id, rules);
    let root_of_comp = c.root_id().0;

    let mut outlined = Vec::with_capacity(roots.len());
    for root in roots {
        outlined.push(outline(&by_id, &copied, &members[&root], &[root])?);
    }
    outlined = merge_siblings(c, outlined, &by_id, &copied, rules)?;
    if rules == Rules::Fused && platform == Platform::Cpu {
        outlined = merge_epilogues(c, outlined, &by_id, &copied, &users)?;
    }
    if tasks > 1 {
        let bytes = |ids: &[i64]| -> u64 {
            ids.iter()
                .filter_map(|p| by_id.get(p)?.shape.as_ref())
                .filter_map(shape::byte_size)
                .sum()
        };
        for o in outlined.iter_mut() {
            // A multi-output fusion's roots share one shape: its tasks
            // split that shape, each writing its part of every root.
            let accessed = bytes(&o.params) + bytes(&o.roots[1..]);
            if let Some(result) = by_id[&o.roots[0]].shape.as_ref() {
                o.partitions = partitions_for(result, accessed, tasks);
            }
        }
    }
    let changed = !outlined.is_empty() || !bitcasts.is_empty();
    if let Some(c) = module.computation_mut(comp) {
        for id in bitcasts {
            if let Some(i) = c.get_mut(InstrId(id)) {
                i.opcode = Opcode::Bitcast.as_str().into();
            }
        }
    }
    replace_with_fusions(module, comp, outlined);
    remove_dead_copies(module, comp, &copied, root_of_comp);
    Ok(changed)
}

/// Group membership: instruction id → the id of its fusion's root. Walking
/// back from each eligible instruction, an operand joins its group when
/// every user of it is already inside; reduces, copied ops and the
/// computation's root start groups of their own.
fn fusion_groups(
    c: &crate::ir::Computation,
    emitted: &HashSet<i64>,
    by_id: &HashMap<i64, &HloInstructionProto>,
    copied: &HashSet<i64>,
    users: &HashMap<InstrId, Vec<InstrId>>,
    rules: Rules,
    platform: Platform,
) -> HashMap<i64, i64> {
    let root_of_comp = c.root_id().0;
    let eligible = |id: i64| {
        by_id
            .get(&id)
            .is_some_and(|i| eligible(i, emitted, by_id, users, rules))
    };
    let mut group: HashMap<i64, i64> = HashMap::default();
    for instr in c.instructions().iter().rev() {
        if !eligible(instr.id)
            || copied.contains(&instr.id)
            || (rules == Rules::Fused
                && !group.contains_key(&instr.id)
                && bitcast_view(instr, by_id, rules))
        {
            continue;
        }
        let root = *group.entry(instr.id).or_insert(instr.id);
        for &op in &instr.operand_ids {
            let Some(p) = by_id.get(&op) else { continue };
            if group.contains_key(&op)
                || !eligible(op)
                || copied.contains(&op)
                || is(p, Opcode::Reduce)
                || op == root_of_comp
                // For XLA:CPU an expensive op spread by a broadcast (a
                // block's reciprocal scale over its block) is made once
                // into a buffer, as XLA:CPU's own fusion leaves it: fused,
                // its loop emitter would compute it again for every
                // element (XLA:GPU's fusion takes it).
                || (rules == Rules::Fused
                    && platform == Platform::Cpu
                    && is(instr, Opcode::Broadcast)
                    && !effectively_scalar(p)
                    && Opcode::of(p).is_some_and(expensive))
                // Past XLA:TPU's tiling a fusion computes over one shape
                // but for its scalars and a reduce's input (module doc).
                || (rules == Rules::Tiled
                    && !is(instr, Opcode::Reduce)
                    && !effectively_scalar(p)
                    && dims(p) != dims(instr))
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
    group
}

/// Whether `i` is a reshape that sees its operand's bytes anew under
/// `rules`: both sides row-major past XLA's fusion; past XLA:TPU's tiling,
/// whole tile rows regrouped ([`shape::tiled_reshape_is_bitcast`]: the
/// tiles pad any other reshape's two sides differently). Past XLA's fusion
/// such a reshape that ends a chain stays out of its fusion as a `bitcast`
/// ([`reshapes_to_bitcast`]): as a fusion's root XLA:CPU computes every
/// element's index into the operand through the reshape, the dequantize's
/// `[n/64, 64]` to the op's `[4,512,640]`, say, about twice the kernel's
/// time without it.
fn bitcast_view(
    i: &HloInstructionProto,
    by_id: &HashMap<i64, &HloInstructionProto>,
    rules: Rules,
) -> bool {
    let Some(from) = i.operand_ids.first().and_then(|o| by_id.get(o)) else {
        return false;
    };
    is(i, Opcode::Reshape)
        && match rules {
            Rules::Fused => row_major(from) && row_major(i),
            Rules::Tiled => from
                .shape
                .as_ref()
                .zip(i.shape.as_ref())
                .is_some_and(|(f, t)| shape::tiled_reshape_is_bitcast(f, t)),
        }
}

/// Whether `i`, an instruction equarx emitted, may join a fusion under
/// `rules`: fusible, with no control predecessor, and past XLA:TPU's
/// tiling not next to a copy.
fn eligible(
    i: &HloInstructionProto,
    emitted: &HashSet<i64>,
    by_id: &HashMap<i64, &HloInstructionProto>,
    users: &HashMap<InstrId, Vec<InstrId>>,
    rules: Rules,
) -> bool {
    emitted.contains(&i.id)
        && fusible(i, by_id, rules)
        && i.control_predecessor_ids.is_empty()
        && !(rules == Rules::Tiled && next_to_copy(i, by_id, users))
        && !slice_start(i, by_id, users)
}

/// Whether `i` is a constant that only says where dynamic slices start.
/// It stays outside as an operand of their fusions, so that fusions that
/// differ only in where they slice (a two-shot exchange's parts) are alike:
/// XLA:CPU compiles one kernel for every fusion alike in a module.
fn slice_start(
    i: &HloInstructionProto,
    by_id: &HashMap<i64, &HloInstructionProto>,
    users: &HashMap<InstrId, Vec<InstrId>>,
) -> bool {
    is(i, Opcode::Constant)
        && users.get(&InstrId(i.id)).is_some_and(|us| {
            !us.is_empty()
                && us.iter().all(|u| {
                    by_id.get(&u.0).is_some_and(|u| {
                        is(u, Opcode::DynamicSlice) && u.operand_ids.first() != Some(&i.id)
                    })
                })
        })
}

/// Whether `i` reads or feeds a `copy`. libtpu folds a layout-changing
/// copy into the fusion beside it, and its emitter aborts on the fusion
/// that makes ("TransformWindow: Loop will not make progress"): past its
/// tiling nothing next to a copy is fused.
fn next_to_copy(
    i: &HloInstructionProto,
    by_id: &HashMap<i64, &HloInstructionProto>,
    users: &HashMap<InstrId, Vec<InstrId>>,
) -> bool {
    i.operand_ids
        .iter()
        .any(|o| by_id.get(o).is_some_and(|o| is(o, Opcode::Copy)))
        || users.get(&InstrId(i.id)).is_some_and(|us| {
            us.iter()
                .any(|u| by_id.get(&u.0).is_some_and(|u| is(u, Opcode::Copy)))
        })
}

/// Each group's members, in instruction order, by the group's root.
fn members_by_root(
    c: &crate::ir::Computation,
    group: &HashMap<i64, i64>,
) -> HashMap<i64, Vec<i64>> {
    let mut members: HashMap<i64, Vec<i64>> = HashMap::default();
    for instr in c.instructions() {
        if let Some(&root) = group.get(&instr.id) {
            members.entry(root).or_default().push(instr.id);
        }
    }
    members
}

/// A group of nothing but reshapes: it moves no data, and as a fusion it
/// would become a copy.
fn only_reshapes(members: &[i64], by_id: &HashMap<i64, &HloInstructionProto>) -> bool {
    members
        .iter()
        .all(|id| by_id.get(id).is_some_and(|i| is(i, Opcode::Reshape)))
}

/// The roots of the groups that become fusions, in instruction order. A
/// single op stays as it is, unless it reads a broadcast that would
/// otherwise be made into a buffer of its own (a constant spread over the
/// op's shape) or a shared cheap op ([`shared_cheap_ops`]): fused, what it
/// reads is copied in and never written out. Groups of reshapes alone stay
/// out, and become bitcasts.
fn fusion_roots(
    c: &crate::ir::Computation,
    members: &HashMap<i64, Vec<i64>>,
    by_id: &HashMap<i64, &HloInstructionProto>,
    copied: &HashSet<i64>,
    shared: &HashSet<i64>,
) -> Vec<i64> {
    let reads_copied_work = |m: &[i64]| {
        m.iter().any(|id| {
            by_id[id].operand_ids.iter().any(|o| {
                shared.contains(o)
                    || (copied.contains(o)
                        && by_id.get(o).is_some_and(|i| is(i, Opcode::Broadcast)))
            })
        })
    };
    let mut roots: Vec<i64> = members
        .iter()
        .filter(|(_, m)| (m.len() > 1 || reads_copied_work(m)) && !only_reshapes(m, by_id))
        .map(|(&r, _)| r)
        .collect();
    roots.sort_unstable_by_key(|r| c.position(InstrId(*r)));
    roots
}

/// Reshapes left outside every fusion whose layouts make them a
/// reinterpretation of the same bytes: `bitcast`, as XLA's own simplifier
/// has made every such reshape by this stage (a reshape left as it is runs
/// as a copy): [`bitcast_view`].
fn reshapes_to_bitcast(
    c: &crate::ir::Computation,
    emitted: &HashSet<i64>,
    group: &HashMap<i64, i64>,
    members: &HashMap<i64, Vec<i64>>,
    by_id: &HashMap<i64, &HloInstructionProto>,
    rules: Rules,
) -> Vec<i64> {
    c.instructions()
        .iter()
        .filter(|i| {
            emitted.contains(&i.id)
                && members
                    .get(group.get(&i.id).unwrap_or(&i.id))
                    .is_none_or(|m| m.len() == 1 || only_reshapes(m, by_id))
                && bitcast_view(i, by_id, rules)
        })
        .map(|i| i.id)
        .collect()
}

/// Each outlined group's root becomes its fusion, and the other members
/// go.
fn replace_with_fusions(module: &mut Module, comp: CompId, outlined: Vec<Outline>) {
    let mut edits = Edits::default();
    for o in outlined {
        let Outline {
            roots,
            members,
            params,
            body,
            partitions,
        } = o;
        let result = body.program_shape.as_ref().and_then(|p| p.result.clone());
        let fused = module.add_computation(body, true, Some(comp));
        let name = module.fresh_name("equarx_fusion");
        if roots.len() > 1 {
            let fusion = HloInstructionProto {
                name,
                opcode: Opcode::Fusion.as_str().into(),
                shape: result,
                backend_config: backend_config(&partitions),
                fusion_kind: "kLoop".into(),
                operand_ids: params,
                called_computation_ids: vec![fused.0],
                ..Default::default()
            };
            multi_output(module, comp, &mut edits, fusion, &roots, members);
            continue;
        }
        let Some(c) = module.computation_mut(comp) else {
            break;
        };
        let Some(root) = c.get_mut(InstrId(roots[0])) else {
            continue;
        };
        // The fusion takes the root's id and place: its users need no edit,
        // and every operand it reads precedes the root already.
        *root = HloInstructionProto {
            id: root.id,
            backend_config: backend_config(&partitions),
            name,
            opcode: Opcode::Fusion.as_str().into(),
            shape: root.shape.take(),
            metadata: root.metadata.take(),
            fusion_kind: "kLoop".into(),
            operand_ids: params,
            called_computation_ids: vec![fused.0],
            ..Default::default()
        };
        edits
            .remove
            .extend(members.into_iter().filter(|&m| m != roots[0]).map(InstrId));
    }
    module.apply(comp, edits);
}

/// `fusion` (a multi-output fusion of `roots`, in instruction order, its
/// id still to give) and a `get-tuple-element` for each root go in before
/// the first root, every use of a root becomes one of its element, and the
/// `members` go. Every operand the fusion reads precedes the first
/// root ([`merge_siblings`] merges groups that read the same ones).
fn multi_output(
    module: &mut Module,
    comp: CompId,
    edits: &mut Edits,
    mut fusion: HloInstructionProto,
    roots: &[i64],
    members: Vec<i64>,
) {
    let Some(c) = module.computation(comp) else {
        return;
    };
    let roots: Vec<HloInstructionProto> = roots
        .iter()
        .filter_map(|&r| c.get(InstrId(r)).cloned())
        .collect();
    let id = module.fresh_instr_id(comp);
    fusion.id = id.0;
    fusion.metadata = roots[0].metadata.clone();
    let mut batch = vec![fusion];
    for (k, r) in roots.iter().enumerate() {
        let element = module.fresh_instr_id(comp);
        batch.push(HloInstructionProto {
            id: element.0,
            name: module.fresh_name("get-tuple-element"),
            opcode: Opcode::GetTupleElement.as_str().into(),
            shape: r.shape.clone(),
            metadata: r.metadata.clone(),
            tuple_index: k as i64,
            operand_ids: vec![id.0],
            ..Default::default()
        });
        edits.replace.insert(InstrId(r.id), element);
    }
    edits.insert_before.insert(InstrId(roots[0].id), batch);
    edits.remove.extend(members.into_iter().map(InstrId));
}

/// Fusions of elementwise ops over one shape that read the same operands,
/// merged into one multi-output fusion: each was a kernel of its own that
/// read the same buffers. Under [`Rules::Tiled`] they come in pairs, a
/// block's reciprocal scale and its wire bits, both of the block maxima;
/// under [`Rules::Fused`] the ring's rank lookups, scalars of the
/// partition id.
fn merge_siblings(
    c: &crate::ir::Computation,
    outlined: Vec<Outline>,
    by_id: &HashMap<i64, &HloInstructionProto>,
    copied: &HashSet<i64>,
    rules: Rules,
) -> Result<Vec<Outline>, PassError> {
    let key = |o: &Outline| {
        let mut params = o.params.clone();
        params.sort_unstable();
        params.dedup();
        let elementwise = o
            .members
            .iter()
            .all(|m| by_id.get(m).is_some_and(|i| !is(i, Opcode::Reduce)));
        // XLA:CPU emits a fusion whose root is a concatenate with a kernel
        // of its own kind; as one root of several it goes to the generic
        // loop kernel (a two-shot's P parts, merged, added 2.2x the
        // compute they add apart: `bench/micro/op_cost.py`).
        let concatenated = rules == Rules::Fused && is(by_id[&o.roots[0]], Opcode::Concatenate);
        (elementwise && !concatenated && !params.is_empty())
            .then(|| (params, dims(by_id[&o.roots[0]]).to_vec()))
    };
    // Each group in the slot of its first outline, the others after it.
    let mut slot: HashMap<(Vec<i64>, Vec<i64>), usize> = HashMap::default();
    let mut groups: Vec<Vec<Outline>> = Vec::with_capacity(outlined.len());
    for o in outlined {
        match key(&o) {
            Some(k) => match slot.get(&k) {
                Some(&at) => groups[at].push(o),
                None => {
                    slot.insert(k, groups.len());
                    groups.push(vec![o]);
                }
            },
            None => groups.push(vec![o]),
        }
    }
    let mut merged = Vec::with_capacity(groups.len());
    for mut group in groups {
        if group.len() == 1 {
            merged.extend(group.pop());
            continue;
        }
        group.sort_by_key(|o| c.position(InstrId(o.roots[0])));
        let roots: Vec<i64> = group.iter().map(|o| o.roots[0]).collect();
        let mut members: Vec<i64> = group.into_iter().flat_map(|o| o.members).collect();
        members.sort_by_key(|&m| c.position(InstrId(m)));
        merged.push(outline(by_id, copied, &members, &roots)?);
    }
    Ok(merged)
}

/// For XLA:CPU, a fusion of elementwise ops over a reduce's result that
/// reads nothing else (a block's reciprocal scale from its largest bits)
/// joins the reduce's fusion as its epilogue: one kernel where there were
/// two, the same values (XLA:CPU's loop emitter computes the epilogue once
/// per reduced element). The reduce stays a root where anything else reads
/// it (the wire's scale bytes), the fusion then multi-output.
fn merge_epilogues(
    c: &crate::ir::Computation,
    outlined: Vec<Outline>,
    by_id: &HashMap<i64, &HloInstructionProto>,
    copied: &HashSet<i64>,
    users: &HashMap<InstrId, Vec<InstrId>>,
) -> Result<Vec<Outline>, PassError> {
    let reduce_at: HashMap<i64, usize> = outlined
        .iter()
        .enumerate()
        .filter(|(_, o)| o.roots.len() == 1 && is(by_id[&o.roots[0]], Opcode::Reduce))
        .map(|(k, o)| (o.roots[0], k))
        .collect();
    // A reduce's outline index → its epilogue's (the first that reads it).
    let mut epilogue_of: HashMap<usize, usize> = HashMap::default();
    for (k, o) in outlined.iter().enumerate() {
        let [read] = o.params[..] else { continue };
        let Some(&r) = reduce_at.get(&read) else {
            continue;
        };
        let over_reduced = o.members.iter().all(|m| {
            by_id
                .get(m)
                .is_some_and(|i| !is(i, Opcode::Reduce) && dims(i) == dims(by_id[&read]))
        });
        if over_reduced && o.roots.len() == 1 {
            epilogue_of.entry(r).or_insert(k);
        }
    }
    if epilogue_of.is_empty() {
        return Ok(outlined);
    }
    let epilogues: HashSet<usize> = epilogue_of.values().copied().collect();
    let mut parts: Vec<Option<Outline>> = outlined.into_iter().map(Some).collect();
    let mut merged = Vec::with_capacity(parts.len() - epilogues.len());
    for k in 0..parts.len() {
        if epilogues.contains(&k) {
            continue;
        }
        let Some(o) = parts[k].take() else { continue };
        let Some(&e) = epilogue_of.get(&k) else {
            merged.push(o);
            continue;
        };
        // An epilogue reads one reduce, so it joins one.
        let epilogue = parts[e]
            .take()
            .ok_or_else(|| PassError::Failed("an epilogue joined two reduces".into()))?;
        let reduce = o.roots[0];
        let inside: HashSet<i64> = epilogue.members.iter().copied().collect();
        // The reduce stays a root where anything else reads it; the copied
        // ops the epilogue read it through count as inside.
        let read_elsewhere = users.get(&InstrId(reduce)).is_some_and(|us| {
            us.iter()
                .any(|u| !inside.contains(&u.0) && !copied_only_into(u.0, &inside, copied, users))
        });
        let mut roots = Vec::with_capacity(2);
        if read_elsewhere {
            roots.push(reduce);
        }
        roots.push(epilogue.roots[0]);
        let mut members: Vec<i64> = o.members.into_iter().chain(epilogue.members).collect();
        members.sort_by_key(|&m| c.position(InstrId(m)));
        merged.push(outline(by_id, copied, &members, &roots)?);
    }
    Ok(merged)
}

/// Whether `id`, a copied op, is read only by `inside` (directly or
/// through other copied ops).
fn copied_only_into(
    id: i64,
    inside: &HashSet<i64>,
    copied: &HashSet<i64>,
    users: &HashMap<InstrId, Vec<InstrId>>,
) -> bool {
    copied.contains(&id)
        && users.get(&InstrId(id)).is_some_and(|us| {
            !us.is_empty()
                && us
                    .iter()
                    .all(|u| inside.contains(&u.0) || copied_only_into(u.0, inside, copied, users))
        })
}

/// What the fusions copied in may be dead now, chains of it included: one
/// sweep from the last instruction back, so every user is judged before
/// what it reads.
fn remove_dead_copies(module: &mut Module, comp: CompId, copied: &HashSet<i64>, root_of_comp: i64) {
    let Some(c) = module.computation(comp) else {
        return;
    };
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
    /// The roots (more than one for a multi-output fusion), in
    /// instruction order.
    roots: Vec<i64>,
    members: Vec<i64>,
    params: Vec<i64>,
    body: HloComputationProto,
    /// How many parts XLA:CPU splits each outer dimension of the result
    /// into, major first, each part a task of its own (none: one task).
    partitions: Vec<i64>,
}

fn outline(
    by_id: &HashMap<i64, &HloInstructionProto>,
    copied: &HashSet<i64>,
    members: &[i64],
    roots: &[i64],
) -> Result<Outline, PassError> {
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
        /// reads) if it is a copied op, else a parameter. Every operand of
        /// a verified module's instruction is in its computation, so one
        /// that is not is a bug, reported as such.
        fn operand(&mut self, op: i64) -> Result<i64, PassError> {
            if let Some(&l) = self.local.get(&op) {
                return Ok(l);
            }
            let by_id = self.by_id;
            let p = by_id.get(&op).ok_or_else(|| {
                PassError::Failed(format!(
                    "a fused instruction reads {op}, which is not in its computation"
                ))
            })?;
            if self.copied.contains(&op) {
                let mut i = (*p).clone();
                i.operand_ids = i
                    .operand_ids
                    .iter()
                    .map(|&o| self.operand(o))
                    .collect::<Result<_, _>>()?;
                return Ok(self.push(op, i));
            }
            let n = self.params.len();
            self.params.push(op);
            self.param_shapes.push(p.shape.clone().unwrap_or_default());
            let param = HloInstructionProto {
                name: format!("param_{n}"),
                opcode: Opcode::Parameter.as_str().into(),
                shape: p.shape.clone(),
                parameter_number: n as i64,
                ..Default::default()
            };
            Ok(self.push(op, param))
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
            .collect::<Result<_, _>>()?;
        body.push(m, i);
    }
    let (root_id, result) = match roots {
        [root] => (body.local[root], by_id[root].shape.clone()),
        _ => {
            let result = shape::tuple(
                roots
                    .iter()
                    .filter_map(|r| by_id[r].shape.clone())
                    .collect(),
            );
            let id = body.instrs.len() as i64;
            body.instrs.push(HloInstructionProto {
                id,
                name: "tuple".into(),
                opcode: Opcode::Tuple.as_str().into(),
                shape: Some(result.clone()),
                operand_ids: roots.iter().map(|r| body.local[r]).collect(),
                ..Default::default()
            });
            (id, Some(result))
        }
    };
    let Body {
        instrs: body,
        params,
        param_shapes,
        ..
    } = body;
    Ok(Outline {
        roots: roots.to_vec(),
        members: members.to_vec(),
        params,
        body: HloComputationProto {
            name: "equarx_fused".into(),
            root_id,
            program_shape: Some(ProgramShapeProto {
                parameters: param_shapes,
                result,
                parameter_names: vec![],
            }),
            instructions: body,
            ..Default::default()
        },
        partitions: Vec::new(),
    })
}

/// What XLA:CPU's backend config of a loop fusion says of its tasks: how
/// many parts each outer dimension is split into, major first, as strings
/// (XLA's JSON form of an int64 list). Read from XLA's own fusions,
/// written on equarx's.
#[derive(serde::Serialize, serde::Deserialize)]
struct TaskConfig {
    #[serde(default)]
    outer_dimension_partitions: Vec<String>,
}

/// XLA:CPU's backend config for a loop fusion run as `partitions` tasks
/// ([`TaskConfig`]); empty for one task.
fn backend_config(partitions: &[i64]) -> Vec<u8> {
    if partitions.is_empty() {
        return Vec::new();
    }
    let config = TaskConfig {
        outer_dimension_partitions: partitions.iter().map(i64::to_string).collect(),
    };
    serde_json::to_vec(&config).unwrap_or_default()
}

/// The most tasks XLA:CPU splits any one of the module's own instructions
/// into (the product of its `outer_dimension_partitions`): its parallel
/// task assignment runs before the pre-scheduler hook and sizes them by
/// its intra-op threads, so this is how many the module may use. 1 where
/// it split none.
pub fn module_tasks(module: &Module) -> i64 {
    module
        .computations()
        .iter()
        .flat_map(|c| c.instructions())
        .filter(|i| !i.backend_config.is_empty() && !emitted_by_equarx(i))
        .filter_map(|i| serde_json::from_slice::<TaskConfig>(&i.backend_config).ok())
        .map(|c| {
            c.outer_dimension_partitions
                .iter()
                .filter_map(|p| p.parse::<i64>().ok())
                .product::<i64>()
        })
        .max()
        .unwrap_or(1)
        .max(1)
}

/// The bytes XLA:CPU gives one task of a loop fusion that reads and
/// writes little per byte (its parallel task assignment's "L2 cache
/// size").
const BYTES_PER_TASK: u64 = 256 << 10;

/// How XLA:CPU's parallel task assignment would split a loop fusion that
/// accesses `read` bytes besides `result` (row-major): one task per
/// [`BYTES_PER_TASK`] of bytes accessed, at most `tasks`, spread over the
/// outer dimensions major first. Empty for one task.
fn partitions_for(result: &ShapeProto, read: u64, tasks: i64) -> Vec<i64> {
    let accessed = read + shape::byte_size(result).unwrap_or(0);
    let row_major = result.layout.as_ref().is_none_or(|l| {
        l.minor_to_major
            .iter()
            .copied()
            .eq((0..result.dimensions.len() as i64).rev())
    });
    let mut left = tasks.min((accessed / BYTES_PER_TASK) as i64);
    if left <= 1 || !row_major || !shape::is_array(result) {
        return Vec::new();
    }
    let mut parts = Vec::new();
    for &d in &result.dimensions {
        let take = d.min(left).max(1);
        parts.push(take);
        left = (left + take - 1) / take;
        if left <= 1 {
            break;
        }
    }
    if parts.iter().product::<i64>() <= 1 {
        return Vec::new();
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::PrimitiveType;

    #[test]
    fn a_fusion_is_split_as_xla_cpu_splits_one() {
        let f32_array = |dims: &[i64]| shape::array(PrimitiveType::F32, dims);
        // 4 MiB read, 4 MiB written: 32 tasks' worth, at most 2.
        let big = f32_array(&[1024, 1024]);
        assert_eq!(partitions_for(&big, 4 << 20, 2), vec![2]);
        assert_eq!(partitions_for(&big, 4 << 20, 8), vec![8]);
        // A major dimension of 1 takes one part; the next one the rest.
        assert_eq!(
            partitions_for(&f32_array(&[1, 5120, 64]), 1 << 20, 2),
            vec![1, 2]
        );
        // More tasks than the major dimension: the next one splits too.
        assert_eq!(
            partitions_for(&f32_array(&[2, 4096, 64]), 8 << 20, 8),
            vec![2, 4]
        );
        // Under two tasks' bytes, or one task allowed: not split.
        assert!(partitions_for(&f32_array(&[64, 64]), 16 << 10, 8).is_empty());
        assert!(partitions_for(&big, 4 << 20, 1).is_empty());
        // Not row-major: its outer dimensions are not its first ones.
        let mut column_major = big.clone();
        column_major.layout = Some(Box::new(crate::proto::LayoutProto {
            minor_to_major: vec![0, 1],
            ..Default::default()
        }));
        assert!(partitions_for(&column_major, 4 << 20, 2).is_empty());
        assert_eq!(
            String::from_utf8(backend_config(&[1, 2])).unwrap(),
            r#"{"outer_dimension_partitions":["1","2"]}"#
        );
        assert!(backend_config(&[]).is_empty());
    }

    #[test]
    fn the_module_says_how_many_tasks_xla_cpu_uses() {
        let module = |config: &str| {
            let text = format!(
                "HloModule m\n\nENTRY e {{\n  p = bf16[512,640] parameter(0)\n  \
                 ROOT c = f32[512,640] convert(p), backend_config={config}\n}}\n"
            );
            Module::from_proto(crate::text::parse(&text).unwrap().proto)
        };
        let tasks = |config: &str| module_tasks(&module(config));
        assert_eq!(tasks(r#"{"outer_dimension_partitions":["2","3"]}"#), 6);
        assert_eq!(tasks(r#"{"outer_dimension_partitions":[]}"#), 1);
        assert_eq!(tasks(r#"{"fusion_config":{"kind":"__ynn_fusion"}}"#), 1);
    }
}
