//! Replacing one collective by its emitted plan: the operands that join
//! the pipeline are read (a widened one at its narrow source), the rest
//! keep a plain collective of their own, and every use of the old result,
//! element by element for a tuple, is pointed at the new values.

use super::eligibility::{Candidate, Operand};
use super::emit::{EmitInputs, EmittedPlan, emit};
use super::report::EmittedCounts;
use crate::ir::builder::{Builder, Value};
use crate::ir::opcode::Opcode;
use crate::ir::{CompId, Computation, Edits, InstrId, Module, shape};
use crate::passes::{PassError, Platform, Stage};
use crate::plan::Plan;
use crate::proto::{HloInstructionProto, OpMetadata, PrimitiveType, ShapeProto};

/// The scalar computations the emitted reductions call.
#[derive(Clone, Copy)]
pub struct Reducers {
    /// The maximum of s32 values: the blocks' absmax, on the bits of |x|.
    pub max_s32: CompId,
    /// The or of s32 values: a scale's bytes put back together, past a
    /// backend's tiling only (see `Emitter::unwire`); before it they are
    /// or-ed elementwise, which XLA fuses into the dequantize.
    pub or_s32: Option<CompId>,
}

impl Reducers {
    /// Adds the module's scalar reducers that `stage`'s emission calls
    /// (once per module).
    pub fn add_to(module: &mut Module, stage: Stage) -> Self {
        Reducers {
            max_s32: module.add_scalar_reducer(
                "equarx_max_s32",
                Opcode::Maximum,
                PrimitiveType::S32,
            ),
            or_s32: (stage == Stage::Tiled).then(|| {
                module.add_scalar_reducer("equarx_or_s32", Opcode::Or, PrimitiveType::S32)
            }),
        }
    }
}

fn fail(message: impl Into<String>) -> PassError {
    PassError::Failed(message.into())
}

/// How the `op_name` of every instruction a rewrite emits begins: it is
/// `equarx[<the collective's name>]`, which is how the later passes
/// ([`crate::passes::outline_fusions::emitted_by_equarx`]) tell equarx's
/// instructions from the module's own.
pub const EMITTED_OP_NAME_PREFIX: &str = "equarx[";

fn metadata_for(instr: &HloInstructionProto) -> OpMetadata {
    // Short on purpose: every emitted instruction (about a hundred per
    // collective) carries this. The stack frame and source line still lead to
    // the program line that made the all-reduce.
    let source = instr.metadata.clone().unwrap_or_default();
    OpMetadata {
        op_name: format!("{EMITTED_OP_NAME_PREFIX}{}]", instr.name),
        source_file: source.source_file,
        source_line: source.source_line,
        stack_frame_id: source.stack_frame_id,
        ..Default::default()
    }
}

/// What [`splice`] made: the counts the report shows, and the loop
/// computations the emitter added.
pub struct Spliced {
    pub emitted: EmittedCounts,
    pub computations: Vec<CompId>,
    /// The computation of a narrowing the rewrite took in (XLA's wrapped
    /// convert), called by nothing once the edits are applied.
    pub dead: Option<CompId>,
}

/// Where a rewrite lands: the module's stage, the compiler it is for, and
/// whether it is rewritten before XLA saw it (the door that cannot take a
/// `copy`).
#[derive(Clone, Copy)]
pub struct Site {
    pub stage: Stage,
    pub platform: Platform,
    pub before_xla: bool,
    /// `outline-fusions` runs after the pass ([`EmitInputs::outlined`]).
    pub outlined: bool,
}

/// Emits `plan` for candidate `c` and records, in `edits`, how it replaces
/// the collective (applied for the whole computation at once).
pub fn splice(
    module: &mut Module,
    c: &Candidate,
    plan: &Plan,
    site: Site,
    reducers: Reducers,
    edits: &mut Edits,
) -> Result<Spliced, PassError> {
    let Site {
        stage,
        platform,
        before_xla,
        outlined,
    } = site;
    let comp = module
        .computation(c.comp)
        .ok_or_else(|| fail("computation vanished"))?;
    let get = |id: InstrId| {
        comp.get(id)
            .cloned()
            .ok_or_else(|| fail("instruction vanished"))
    };
    let instr = get(c.instr)?;
    let done = c.done.map(get).transpose()?;
    let target = c.done.unwrap_or(c.instr);
    let result = done
        .as_ref()
        .unwrap_or(&instr)
        .shape
        .clone()
        .unwrap_or_default();
    let tuple = shape::is_tuple(&result);
    let element_shapes: Vec<ShapeProto> = if tuple {
        result.tuple_shapes.clone()
    } else {
        vec![result.clone()]
    };
    let readers = Readers::of(comp, target, tuple);
    // An f32 operand that is only a widening of bf16 / f16 (XLA:CPU
    // promotes bf16 all-reduces so before its pre-scheduler stage) is read
    // in its narrow type: the chain converts it to f32 where it reads it,
    // with the same values, and the widened copy is never made (the pass
    // remove-dead-widenings drops it once nothing reads it).
    let packed: Vec<Value> = c
        .quantized()
        .map(|o| narrow_source(module, comp, o.id, c.instr).unwrap_or_else(|| value(o)))
        .collect();

    // The other half of XLA:CPU's promotion: the f32 result read only by
    // its narrowing back to the type the operand was read in. The emission
    // then ends in that type itself: the same values (its own f32 sum,
    // rounded once), where XLA's convert was a pass of its own over the
    // f32 result.
    let narrowed = match packed.as_slice() {
        [read] if !tuple => narrowing_reader(module, comp, target)
            .filter(|n| n.shape.element_type == read.element_type()),
        _ => None,
    };
    let mut results: Vec<ShapeProto> = shapes_of(c, &element_shapes, true);
    if let (Some(n), [r]) = (&narrowed, results.as_mut_slice()) {
        *r = n.shape.clone();
    }
    let laid_out: Vec<ShapeProto> = results
        .iter()
        .map(|r| relaid(stage, r).unwrap_or_else(|| r.clone()))
        .collect();
    let inputs = EmitInputs {
        plan,
        participants: &c.participants,
        operands: &[],
        results: &laid_out,
        max_s32: reducers.max_s32,
        or_s32: reducers.or_s32,
        async_permutes: c.done.is_some(),
        stage,
        platform,
        before_xla,
        scheduled: module.schedule().is_some_and(|s| !s.is_empty()),
        dimension: c.dimension,
        outlined,
    };
    let metadata = metadata_for(&instr);
    // Past XLA:TPU's layout assignment the emission carries libtpu's tiles:
    // the loop fusions equarx outlines there (`outline-fusions`) reach
    // libtpu's fusion emitter, which aborts on an untiled array. An op
    // whose emission holds an array whose tiles libtpu is not known to
    // take is emitted again untiled, and libtpu tiles it itself.
    // A new computation's id is above every other's (`add_computation`).
    let newest = module.computations().iter().map(|c| c.id()).max();
    let (b, emitted) = emit_relaid(module, c.comp, &metadata, &packed, inputs, true);
    let tiled = stage == Stage::Tiled && tiles_known(&b, newest);
    let (mut b, mut emitted) = if stage == Stage::Tiled && !tiled {
        drop(b);
        let added: Vec<CompId> = module
            .computations()
            .iter()
            .map(|c| c.id())
            .filter(|&id| Some(id) > newest)
            .collect();
        for id in added {
            module.remove_computation(id);
        }
        emit_relaid(module, c.comp, &metadata, &packed, inputs, false)
    } else {
        (b, emitted)
    };
    // Each result laid out as the op's own (past XLA:TPU's layout
    // assignment, tiles included).
    b.tile_for_tpu(false);
    for ((v, result), written) in emitted.values.iter_mut().zip(&results).zip(&laid_out) {
        // Untiled, the emission's arrays are libtpu's to tile, the result
        // included.
        let differs = if tiled {
            !shape::same_array(&v.shape, result)
        } else {
            written != result
        };
        if differs {
            *v = b.copy_to(v, result);
        }
    }
    // Mosaic kernels' results too: a custom call's result is no boundary
    // for its consumers, which libtpu otherwise fuses across layers.
    if site.platform.fences_results(stage) {
        emitted.values = b.opt_barrier(&emitted.values);
    }
    let parts = parts(
        &mut b,
        c,
        &instr,
        done.as_ref(),
        &element_shapes,
        emitted.values,
    )?;
    let whole = if !tuple {
        Some(parts[0].clone())
    } else if readers.others {
        Some(b.tuple(&parts))
    } else {
        None
    };
    let mut keep: Vec<InstrId> = parts.iter().map(|p| p.id).collect();
    keep.extend(whole.iter().map(|w| w.id));
    let instrs = b.finish_keeping(&keep).map_err(fail)?;
    let computations = emitted.computations;
    let in_loops = || {
        computations
            .iter()
            .filter_map(|&id| module.computation(id))
            .flat_map(|c| c.instructions())
    };
    let emitted = EmittedCounts {
        collectives: instrs.iter().chain(in_loops()).filter(|i| sends(i)).count(),
        instructions: instrs.len() + in_loops().count(),
    };

    edits.insert_before.insert(c.instr, instrs);
    if let Some(whole) = whole {
        match &narrowed {
            Some(n) => {
                edits.replace.insert(n.id, whole.id);
                edits.remove.insert(n.id);
            }
            None => {
                edits.replace.insert(target, whole.id);
            }
        }
    }
    for (g, index) in readers.elements {
        let part = usize::try_from(index).ok().and_then(|i| parts.get(i));
        let part = part.ok_or_else(|| fail("get-tuple-element index out of range"))?;
        edits.replace.insert(g, part.id);
        edits.remove.insert(g);
    }
    edits.remove.insert(c.instr);
    edits.remove.extend(c.done);
    Ok(Spliced {
        emitted,
        computations,
        dead: narrowed.and_then(|n| n.wrapped),
    })
}

/// The one reader of a collective's result that narrows it: a convert
/// from f32 to bf16 / f16 of the same dimensions, or XLA's wrapped form.
struct Narrowing {
    id: InstrId,
    shape: ShapeProto,
    wrapped: Option<CompId>,
}

/// `target`'s [`Narrowing`], where it is `target`'s only reader, nothing
/// is ordered after `target` or the narrowing, and the narrowing's
/// computation (if wrapped) is called by it alone.
fn narrowing_reader(module: &Module, comp: &Computation, target: InstrId) -> Option<Narrowing> {
    let [reader] = comp.users_of(target)[..] else {
        return None;
    };
    let source = comp.get(target)?;
    let shape = reader.shape.clone()?;
    let narrows = source.shape.as_ref().is_some_and(|s| {
        s.element_type == PrimitiveType::F32 as i32 && s.dimensions == shape.dimensions
    }) && is_narrow_float(shape.element_type);
    if !narrows
        || comp.root_id() == target
        || orders_others(comp, target.0)
        || orders_others(comp, reader.id)
        || !reader.control_predecessor_ids.is_empty()
    {
        return None;
    }
    let wrapped = conversion(module, reader)?;
    if let Some(called) = wrapped
        && callers(module, called) != 1
    {
        return None;
    }
    Some(Narrowing {
        id: InstrId(reader.id),
        shape,
        wrapped,
    })
}

/// Whether `t` is a float type XLA:CPU promotes to f32 (bf16, f16).
fn is_narrow_float(t: i32) -> bool {
    t == PrimitiveType::Bf16 as i32 || t == PrimitiveType::F16 as i32
}

/// Whether an instruction of `comp` is ordered after instruction `id`
/// (a control predecessor of it).
fn orders_others(comp: &Computation, id: i64) -> bool {
    comp.instructions()
        .iter()
        .any(|i| i.control_predecessor_ids.contains(&id))
}

/// How many instructions of `module` call computation `called`.
fn callers(module: &Module, called: CompId) -> usize {
    module
        .computations()
        .iter()
        .flat_map(|c| c.instructions())
        .filter(|i| i.called_computation_ids.contains(&called.0))
        .count()
}

/// Whether `convert` is one element-type conversion of its one operand:
/// `Some(None)` for a `convert`, `Some(Some(c))` for a kLoop fusion of one
/// convert of its parameter (XLA's wrapped form, computation `c`), `None`
/// otherwise.
fn conversion(module: &Module, convert: &HloInstructionProto) -> Option<Option<CompId>> {
    if convert.operand_ids.len() != 1 {
        return None;
    }
    match Opcode::of(convert)? {
        Opcode::Convert => Some(None),
        Opcode::Fusion if convert.fusion_kind == "kLoop" => {
            let called = CompId(*convert.called_computation_ids.first()?);
            let body = module.computation(called)?;
            let root = body.get(body.root_id())?;
            let param = body.get(InstrId(*root.operand_ids.first()?))?;
            let only_convert = body.instructions().len() == 2
                && Opcode::of(root) == Some(Opcode::Convert)
                && Opcode::of(param) == Some(Opcode::Parameter);
            only_convert.then_some(Some(called))
        }
        _ => None,
    }
}

/// Past XLA:TPU's layout assignment an operand or result may order its
/// dimensions otherwise than row-major (`{0,1:T(8,128)}`); a reshape
/// between that and a row-major array moves elements, which TPU lowering
/// refuses ("Reshape should have supported layout"). The plan then reads
/// and writes row-major arrays, through layout-changing copies, as
/// libtpu's own layout assignment would have inserted: `s` row-major
/// where it is not.
fn relaid(stage: Stage, s: &ShapeProto) -> Option<ShapeProto> {
    match stage {
        Stage::Tiled => shape::row_major(s),
        Stage::PreFusion | Stage::Fused => None,
    }
}

/// A builder for computation `comp` holding `inputs.plan` emitted for the
/// `packed` operands (brought row-major first, [`relaid`]), every array
/// of rank 2 or more tiled for XLA:TPU if `tiled` and the stage is
/// [`Stage::Tiled`].
fn emit_relaid<'m>(
    module: &'m mut Module,
    comp: CompId,
    metadata: &OpMetadata,
    packed: &[Value],
    inputs: EmitInputs,
    tiled: bool,
) -> (Builder<'m>, EmittedPlan) {
    let mut b = Builder::new(module, comp, Some(metadata.clone()));
    b.tile_for_tpu(tiled && inputs.stage == Stage::Tiled);
    let operands: Vec<Value> = packed
        .iter()
        .map(|x| match relaid(inputs.stage, &x.shape) {
            Some(s) => b.copy_to(x, &s),
            None => x.clone(),
        })
        .collect();
    let emitted = emit(
        &mut b,
        &EmitInputs {
            operands: &operands,
            ..inputs
        },
    );
    (b, emitted)
}

/// Whether libtpu is known to take the tiles of every array `b` made and
/// of the computations added after `newest`: rows of 8, or an array of
/// rank 2 (`bf16[4,4096]{1,0:T(4,128)(2,1)}` and `s8[2,64]{1,0:T(4,128)(4,1)}`
/// are libtpu's own). Fewer rows in a higher rank are not: libtpu's
/// emitter aborted on a `dynamic-slice` of `bf16[2,4,2,64]{3,2,1,0:T(2,128)(2,1)}`
/// (`pipeline_emitter.cc`, "span_size % compact_2nd_minor_ratio").
fn tiles_known(b: &Builder, newest: Option<CompId>) -> bool {
    fn known(s: &ShapeProto) -> bool {
        s.tuple_shapes.iter().all(known)
            && (s.dimensions.len() <= 2
                || s.layout.as_ref().is_none_or(|l| {
                    l.tiles
                        .first()
                        .is_none_or(|t| t.dimensions.first().is_none_or(|&rows| rows >= 8))
                }))
    }
    let added = b
        .module()
        .computations()
        .iter()
        .filter(|c| Some(c.id()) > newest)
        .flat_map(|c| c.instructions());
    b.instructions()
        .iter()
        .chain(added)
        .all(|i| i.shape.as_ref().is_none_or(known))
}

fn value(o: &Operand) -> Value {
    Value {
        id: o.id,
        shape: o.shape.clone(),
    }
}

/// The result shapes of the operands that are (or are not) quantized.
fn shapes_of(c: &Candidate, element_shapes: &[ShapeProto], quantized: bool) -> Vec<ShapeProto> {
    c.operands
        .iter()
        .zip(element_shapes)
        .filter(|(o, _)| o.quantized == quantized)
        .map(|(_, s)| s.clone())
        .collect()
}

/// Who reads a collective's result: a tuple result is taken apart by
/// get-tuple-elements, which are forwarded to the parts; the tuple itself
/// is built only if something else reads it.
struct Readers {
    /// The get-tuple-elements, with their indices.
    elements: Vec<(InstrId, i64)>,
    /// Whether anything else reads the whole result (the root counts).
    others: bool,
}

impl Readers {
    fn of(comp: &Computation, target: InstrId, tuple: bool) -> Readers {
        let mut readers = Readers {
            elements: Vec::new(),
            others: false,
        };
        if !tuple {
            return readers;
        }
        readers.others = comp.root_id() == target;
        for i in comp.users_of(target) {
            if Opcode::of(i) == Some(Opcode::GetTupleElement) && i.operand_ids.len() == 1 {
                readers.elements.push((InstrId(i.id), i.tuple_index));
            } else {
                readers.others = true;
            }
        }
        readers
    }
}

/// The new value of every operand's result, in operand order: the
/// quantized ones from `sums`; the others from a plain collective of their
/// own, a copy of the original (`instr`, and its `done`).
fn parts(
    b: &mut Builder,
    c: &Candidate,
    instr: &HloInstructionProto,
    done: Option<&HloInstructionProto>,
    element_shapes: &[ShapeProto],
    sums: Vec<Value>,
) -> Result<Vec<Value>, PassError> {
    let rest: Vec<Value> = c
        .operands
        .iter()
        .filter(|o| !o.quantized)
        .map(value)
        .collect();
    let residual = if rest.is_empty() {
        None
    } else {
        let mut rest_shapes = shapes_of(c, element_shapes, false);
        let s = if rest.len() == 1 {
            rest_shapes.remove(0)
        } else {
            shape::tuple(rest_shapes)
        };
        let refs: Vec<&Value> = rest.iter().collect();
        let start = b.clone_with(instr, &refs, s.clone());
        Some(match done {
            Some(d) => b.clone_with(d, &[&start], s),
            None => start,
        })
    };
    let mut parts = Vec::new();
    let (mut quantized, mut r) = (sums.into_iter(), 0i64);
    for o in &c.operands {
        if o.quantized {
            parts.push(
                quantized
                    .next()
                    .ok_or_else(|| fail("the plan gave too few values"))?,
            );
        } else {
            let res = residual
                .as_ref()
                .ok_or_else(|| fail("the residual collective is missing"))?;
            parts.push(if rest.len() == 1 {
                res.clone()
            } else {
                b.get_tuple_element(res, r)
            });
            r += 1;
        }
    }
    Ok(parts)
}

/// The narrow value `operand` only widens: `operand` = convert(x) from
/// bf16 / f16 to f32, or XLA's wrapped form (a kLoop fusion of that one
/// convert), used by `user` alone. Reading x instead leaves the widening
/// unused.
pub fn narrow_source(
    module: &Module,
    comp: &Computation,
    operand: InstrId,
    user: InstrId,
) -> Option<Value> {
    let convert = comp.get(operand)?;
    let source = comp.get(InstrId(*convert.operand_ids.first()?))?;
    let wrapped = widening(module, convert, source)?;
    let read_elsewhere = comp.users_of(operand).iter().any(|u| u.id != user.0);
    let used_elsewhere = read_elsewhere || orders_others(comp, operand.0);
    if comp.root_id() == operand || !convert.control_predecessor_ids.is_empty() || used_elsewhere {
        return None;
    }
    // The wrapped computation must be this fusion's alone.
    if let Some(called) = wrapped
        && callers(module, called) != 1
    {
        return None;
    }
    Some(Value {
        id: InstrId(source.id),
        shape: source.shape.clone()?,
    })
}

/// Whether `convert` (reading `source`) widens bf16 / f16 to f32 without
/// changing dimensions: `Some(None)` for a convert, `Some(Some(c))` for a
/// kLoop fusion of one convert (computation `c`), `None` otherwise.
pub fn widening(
    module: &Module,
    convert: &HloInstructionProto,
    source: &HloInstructionProto,
) -> Option<Option<CompId>> {
    let ty = |i: &HloInstructionProto| i.shape.as_ref().map(|s| s.element_type);
    let widens = source.shape.as_ref().map(|s| &s.dimensions)
        == convert.shape.as_ref().map(|s| &s.dimensions)
        && ty(source).is_some_and(is_narrow_float)
        && ty(convert) == Some(PrimitiveType::F32 as i32)
        && convert.operand_ids.len() == 1;
    if !widens {
        return None;
    }
    conversion(module, convert)
}

/// Whether an emitted instruction sends data (an async pair counts once).
fn sends(i: &HloInstructionProto) -> bool {
    matches!(
        Opcode::of(i),
        Some(
            Opcode::CollectivePermute
                | Opcode::CollectivePermuteStart
                | Opcode::AllGather
                | Opcode::AllToAll
        )
    )
}
