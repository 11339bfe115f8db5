//! Emits the [`Plan`] of one quantized collective (all-reduce,
//! reduce-scatter, all-gather, all-to-all): [`emit`] reads top to
//! bottom as the algorithm — flatten and pad, rotate, find the rank, run the
//! plan's phases, unpack.
//!
//! Every repeated step (a ring hop, a relay of the permute gather) is
//! written once, by one function, whether it lands in the body of a `while`
//! loop over the steps ([`Form::Loop`], the module does not grow with P) or
//! is written out P−1 times ([`Form::Unrolled`]); the step number is a loop
//! counter in one case and a constant in the other.
//!
//! The quantize and dequantize steps implement the contract in
//! [`crate::numerics`] op for op. A [`Message`] is the blocks' codes (s8,
//! a block to a row) and their scales. It travels as the plan's
//! [`crate::plan::Wire`] says: one s8 array, each block's row its codes
//! then its scale's bytes (`[nb, B + 2]` for bf16 scales), one collective
//! per step (XLA:CPU, XLA:GPU); or the codes and the scales' bits apart, a
//! collective each (XLA:TPU). Past XLA's fusion a collective carries an
//! array's flat elements instead ([`Emitter::on_wire`]).
//!
//! Every array the steps read and write keeps the blocks as its rows
//! (`[.., blocks, B]`; a chunk is a run of whole blocks): a backend that
//! tiles layouts (XLA:TPU) then moves no element between tiles from one
//! step to the next. Flat views of the payload, or views whose minor
//! dimension is a chunk, made XLA:TPU relayout between steps and compile
//! one 8 MiB psum 10–20× slower (BENCHMARKS.md).
//!
//! One file per part of the algorithm, each read top to bottom:
//!
//! | file | what it emits |
//! |---|---|
//! | `layout.rs` | the payload in (flatten, pad, rotate; rows for RS/AG/A2A) and the results out |
//! | `ranks.rs` | the device's rank, its coordinate on an axis, the slice a step reads |
//! | `codes.rs` | quantize and dequantize, for every code format (int8, fp8, int4) |
//! | `ring.rs` | the ring (also each axis of two-level) |
//! | `exchange.rs` | two-shot's exchange, and the all-to-all of rows |
//! | `gather.rs` | the gather: one all-gather, or relays round the ring |
//! | `mosaic.rs` | two-shot's steps as three Mosaic kernels for XLA:TPU (`kernels=mosaic`) |
//! | `triton.rs` | the same steps as three Triton kernels for XLA:GPU (`kernels=triton`) |
//! | this file | the driver, constants, and the `while` loop of repeated steps |

mod codes;
mod exchange;
mod gather;
mod layout;
pub(super) mod mosaic;
mod ranks;
mod ring;
pub(super) mod triton;

use rustc_hash::FxHashMap as HashMap;

use super::groups::{IdSpace, Participants};
use crate::ir::builder::{Builder, Value};
use crate::ir::opcode::Opcode;
use crate::ir::{CompId, InstrId};
use crate::passes::{Platform, Stage};
use crate::plan::{Axis, Collective, Kernels, Phase, Plan, QuantFormat};
use crate::proto::{LayoutProto, PrimitiveType, ShapeProto, TileProto};

/// What the emitted subgraph needs besides the plan.
#[derive(Clone, Copy)]
pub struct EmitInputs<'a> {
    pub plan: &'a Plan,
    pub participants: &'a Participants,
    /// The packed operands that join the pipeline.
    pub operands: &'a [Value],
    /// The result shape (with layout) each operand's sum must have.
    pub results: &'a [ShapeProto],
    /// Scalar s32 `maximum` and `or` computations: the blocks' absmax, on
    /// the bits of |x|, and, where the stage reduces them (past a
    /// backend's tiling), a scale's bytes put back together.
    pub max_s32: CompId,
    pub or_s32: Option<CompId>,
    /// Emit `collective-permute-start`/`-done` pairs (for an async pair).
    pub async_permutes: bool,
    /// Where in XLA's pipeline the module is: past its fusion, XLA will not
    /// decompose what the pass emits any more, so collectives take the
    /// forms its runtime runs directly.
    pub stage: Stage,
    /// The compiler the module is for.
    pub platform: Platform,
    /// The module carries XLA's schedule: a dump after XLA's whole
    /// pipeline, which goes back through XLA's fusion if it is compiled
    /// again (through StableHLO, which drops a custom fusion's backend
    /// config), where a module at a pre-scheduler hook goes on to the
    /// scheduler and code generation as it is.
    pub scheduled: bool,
    /// The caller said the module is before XLA's pipeline (`stage:
    /// pre-fusion` given, not detected): XLA's copy insertion runs after
    /// the pass, so it emits no `copy`.
    pub before_xla: bool,
    /// The collective's scatter, gather or split dimension (an array
    /// all-to-all's; none for the all-reduce and a tuple all-to-all).
    pub dimension: Option<i64>,
    /// `outline-fusions` will make loop fusions of what is emitted here
    /// (`fuse` not off, past XLA's fusion): forms that only pay as fusions
    /// (an exchange's parts each computed by its own) are emitted only then.
    pub outlined: bool,
}

/// The plan as [`emit`] wrote it: the values that replace the operands'
/// results, and the computations it added for them.
pub struct EmittedPlan {
    /// One value per operand, shaped like `results`.
    pub values: Vec<Value>,
    /// The computations it added (loop bodies and conditions).
    pub computations: Vec<CompId>,
}

/// Emits the plan; returns one value per operand.
pub fn emit(b: &mut Builder, inputs: &EmitInputs) -> EmittedPlan {
    let plan = inputs.plan;
    let mut computations = Vec::new();
    let mut e = Emitter::new(b, inputs, &mut computations);

    // The plan as equarx's own kernels, where the pass chose them
    // (`mosaic.rs`, `triton.rs`).
    if plan.config.kernels != Kernels::Hlo {
        let shapes: Vec<&ShapeProto> = inputs.operands.iter().map(|v| &v.shape).collect();
        let (stage, dimension) = (inputs.stage, inputs.dimension);
        let (kind, value) = match plan.config.kernels {
            Kernels::Triton => (
                "Triton",
                triton::fits(plan, &shapes, stage, dimension).map(|s| e.triton_kernels(s)),
            ),
            _ => (
                "Mosaic",
                mosaic::fits(plan, &shapes, stage, dimension).map(|s| e.mosaic_kernels(s)),
            ),
        };
        match value {
            Ok(v) => {
                return EmittedPlan {
                    values: vec![v],
                    computations,
                };
            }
            Err(why) => e.b.fail(format!(
                "{kind} kernels chosen for a plan they do not fit: {why}"
            )),
        }
    }

    // 1. The payload: every operand flattened (or cut into its P rows),
    //    zero-padded to P·c (each row to c), every block rotated when the
    //    plan rotates, seen as [axis sizes.., c/B, B] (outer axes first: rank
    //    r = Σ coordinate·stride).
    let mut axes: Vec<Axis> = plan.phases.iter().filter_map(Phase::axis).collect();
    axes.sort_by_key(|a| std::cmp::Reverse(a.stride));
    let mut held = match plan.row {
        None => e.payload(&axes),
        Some(_) => e.rows(&axes),
    };

    // 2. This device's rank r in its group, from its id through the table.
    let rank = e.rank();

    // 3. The reduce phases, each leaving the device with its slice of what
    //    it held, summed over the phase's axis; the gather makes every
    //    chunk everybody's, the scatter every row its rank's.
    //    A ring that the gather follows hands it the largest bits of the
    //    blocks it leaves (its last hop computed them).
    let mut values = None;
    let mut largest = None;
    for (k, phase) in plan.phases.iter().enumerate() {
        match *phase {
            Phase::Ring { axis } => {
                let gather_next = plan.phases.get(k + 1) == Some(&Phase::Gather);
                (held, largest) = e.ring(&held, &rank, &axes, axis, gather_next);
                axes.retain(|a| *a != axis);
            }
            Phase::Exchange { axis } => {
                held = e.exchange(&held, &axes, axis);
                axes.retain(|a| *a != axis);
            }
            Phase::Gather => {
                let from_parts = matches!(k.checked_sub(1).map(|j| &plan.phases[j]),
                    Some(Phase::Exchange { axis }) if e.sums_parts_apart(axis.size as i64));
                values = Some(e.gather(&held, largest.take(), &rank, from_parts));
            }
            Phase::Scatter => values = Some(e.scatter(&held)),
        }
    }

    // 4. Drop the padding and give each operand its result back in its own
    //    shape, type and layout.
    let out = match plan.collective {
        Collective::AllReduce => e.unpack_sum(&values.unwrap_or(held)),
        Collective::ReduceScatter => e.unpack_owned(&held),
        Collective::AllGather | Collective::AllToAll => e.unpack_rows(&values.unwrap_or(held)),
    };
    EmittedPlan {
        values: out,
        computations,
    }
}

/// Quantized blocks: their codes and their scales (they travel as
/// [`Emitter::wire`] makes them).
struct Message {
    /// s8 `[.., code bytes]` (code bytes: B, or B/2 for int4; fp8 codes
    /// bit-cast to s8).
    codes: Value,
    /// f32 `[..]`, one per block: the scales (bf16 values for bf16 scales).
    scales: Value,
    /// The scales as they travel apart from the codes
    /// ([`Emitter::wire`], [`Wire::Split`]), where they were made first.
    bits: Option<Value>,
    /// The message's rows as they arrived in one array, codes first and
    /// the scale's bytes after them, where `codes` is a slice of them.
    rows: Option<Value>,
}

/// A message's scales before its codes ([`Emitter::scales_of`]): f32
/// `[..]`, one per block.
struct Scales {
    /// The scales, as [`Message::scales`].
    scale: Value,
    /// Their bits as they travel apart, as [`Message::bits`].
    bits: Option<Value>,
    /// Their reciprocals, what the codes are multiplied by.
    recip: Value,
}

/// A scalar constant, by type and bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Const {
    F32(u32),
    S32(i32),
    S8(i8),
}

/// Emits into one computation, with its own constants: every scalar
/// constant and every broadcast of one is emitted once per computation.
struct Emitter<'b, 'm, 'i> {
    b: &'b mut Builder<'m>,
    inputs: &'i EmitInputs<'i>,
    computations: &'b mut Vec<CompId>,
    consts: HashMap<Const, Value>,
    splats: HashMap<(Const, Vec<i64>), Value>,
    /// (a − dir·k) mod Q, by (a, Q, dir, k), for constant k.
    indices: HashMap<(InstrId, i64, i64, i64), Value>,
    /// The axis coordinates of this device, by its rank's value and the
    /// axis (stride, size): everything a coordinate is computed from (the
    /// group size is the plan's, one per emitter).
    coordinates: HashMap<(InstrId, usize, usize), Value>,
    /// [`Self::byte_shifts`], by their dimensions, and the one vector of
    /// amounts they broadcast (the scale's width is the plan's).
    shifts: HashMap<Vec<i64>, Value>,
    shift_amounts: Option<Value>,
    /// [`Self::hadamard`], by element type: one matrix serves the
    /// rotation and its inverse.
    hadamard: HashMap<i32, Value>,
    /// Values whose buffers belong to the operands (a payload that is only
    /// a reshape of one): a loop must not take them over.
    borrowed: Vec<InstrId>,
}

impl<'b, 'm, 'i> Emitter<'b, 'm, 'i> {
    fn new(
        b: &'b mut Builder<'m>,
        inputs: &'i EmitInputs<'i>,
        computations: &'b mut Vec<CompId>,
    ) -> Self {
        Emitter {
            b,
            inputs,
            computations,
            consts: HashMap::default(),
            splats: HashMap::default(),
            indices: HashMap::default(),
            coordinates: HashMap::default(),
            shifts: HashMap::default(),
            shift_amounts: None,
            hadamard: HashMap::default(),
            borrowed: Vec::new(),
        }
    }

    fn plan(&self) -> &'i Plan {
        self.inputs.plan
    }

    /// A new collective's channel id: a fresh one where the groups name
    /// partitions, none where they name replicas.
    fn channel(&mut self) -> Option<i64> {
        match self.inputs.participants.space {
            IdSpace::Partition => Some(self.b.fresh_channel_id()),
            IdSpace::Replica => None,
        }
    }

    /// Dimension `k` of `v`. The emitter's values have the ranks it made
    /// them with; one without dimension `k` is an inconsistency the rewrite
    /// fails on (the builder reports the first), and 1 keeps the arithmetic
    /// going until it does.
    fn dim(&mut self, v: &Value, k: usize) -> i64 {
        match v.dims().get(k) {
            Some(&d) => d,
            None => {
                self.b.fail(format!(
                    "an emitted value of dimensions {:?} has no dimension {k}",
                    v.dims()
                ));
                1
            }
        }
    }

    fn f32(&mut self, x: &Value) -> Value {
        if x.element_type() == PrimitiveType::F32 as i32 {
            x.clone()
        } else {
            self.b.convert(x, PrimitiveType::F32)
        }
    }

    fn constant(&mut self, c: Const) -> Value {
        if let Some(v) = self.consts.get(&c) {
            return v.clone();
        }
        let v = match c {
            Const::F32(bits) => self.b.f32_scalar(f32::from_bits(bits)),
            Const::S32(v) => self.b.s32_scalar(v),
            Const::S8(v) => self.b.s8_scalar(v),
        };
        self.consts.insert(c, v.clone());
        v
    }

    /// An s32 vector constant. Past XLA:TPU's layout assignment it takes
    /// the layout libtpu gives its own (`s32[N]{0:T(128)}`, read from
    /// compiled probes): an untiled one gets a buffer of another size than
    /// its literal, which TPU code emission refuses (`data_emitter.cc`).
    fn s32_vector(&mut self, v: &[i32]) -> Value {
        match self.inputs.stage {
            Stage::Tiled => self.b.s32_array_laid_out(
                v,
                LayoutProto {
                    minor_to_major: vec![0],
                    tiles: vec![TileProto {
                        dimensions: vec![128],
                    }],
                    ..Default::default()
                },
            ),
            Stage::PreFusion | Stage::Fused => self.b.s32_array(v),
        }
    }

    fn s32c(&mut self, v: i64) -> Value {
        self.constant(Const::S32(v as i32))
    }

    /// A constant broadcast to `dims`.
    fn splat(&mut self, c: Const, dims: &[i64]) -> Value {
        let key = (c, dims.to_vec());
        if let Some(v) = self.splats.get(&key) {
            return v.clone();
        }
        let scalar = self.constant(c);
        let v = self.b.broadcast(&scalar, dims, &[]);
        self.splats.insert(key, v.clone());
        v
    }

    /// A copy of `v`, so that a loop or a collective never writes a buffer
    /// something else still reads. XLA's pre-scheduler hooks can come after
    /// its copy insertion even where the module shows no fusion (XLA:CPU's
    /// does: a loop counter's constant, shared by every device, then
    /// counted down on one device only and deadlocked the others), so the
    /// pass leaves the copy to XLA only when told the module is before
    /// XLA's pipeline ([`EmitInputs::before_xla`]: the door before XLA,
    /// whose StableHLO has no `copy`).
    fn copy_unless_before_xla(&mut self, v: &Value) -> Value {
        if self.inputs.before_xla {
            v.clone()
        } else {
            self.b.unary(Opcode::Copy, v)
        }
    }

    /// A `while` loop (computations `equarx_{name}_cond` and `_body`) that
    /// runs `body` `trips` times over `state`; the body gets its own
    /// emitter and the state's elements, and returns the next state's
    /// elements (what a step needs of its number, such as the index of
    /// the slice it reads, it carries in the state). Returns the final
    /// elements.
    fn repeat(
        &mut self,
        name: &str,
        trips: i64,
        state: &[Value],
        body: impl FnOnce(&mut Emitter<'_, '_, 'i>, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        // A while loop updates its state in place. At XLA's pre-scheduler
        // hook, copy insertion has already run, so the loop gets copies of
        // what it must not write to: the counter's constant (shared by
        // every device of the executable), scalars read after the loop, and
        // a payload that is the operands' own buffer.
        let counter = self.s32c(0);
        let init: Vec<Value> = std::iter::once(counter)
            .chain(state.iter().cloned())
            .map(|v| {
                if v.dims().is_empty() || self.borrowed.contains(&v.id) {
                    self.copy_unless_before_xla(&v)
                } else {
                    v
                }
            })
            .collect();
        let init = self.b.tuple(&init);
        let tuple = init.shape.clone();
        let inputs = self.inputs;
        let mut made = Vec::new();
        let cond = self.b.computation(
            &format!("equarx_{name}_cond"),
            std::slice::from_ref(&tuple),
            |b, params| {
                let s = b.get_tuple_element(&params[0], 0);
                let n = b.s32_scalar(trips as i32);
                b.compare(&s, &n, "LT")
            },
        );
        let body = self
            .b
            .computation(&format!("equarx_{name}_body"), &[tuple], |b, params| {
                // The body reads the counter once, to step it. The new
                // state overwrites the old in place, and at the
                // pre-scheduler hook no copy insertion follows to order a
                // late read of the old counter.
                let mut e = Emitter::new(b, inputs, &mut made);
                let count = e.b.get_tuple_element(&params[0], 0);
                let one = e.s32c(1);
                let stepped = e.b.add_op(&count, &one);
                let elements: Vec<Value> = (1..=state.len())
                    .map(|k| e.b.get_tuple_element(&params[0], k as i64))
                    .collect();
                let next = body(&mut e, &elements);
                let mut out = vec![stepped];
                out.extend(next);
                e.b.tuple(&out)
            });
        self.computations.extend(made);
        self.computations.extend([cond, body]);
        let done = self.b.while_loop(&init, cond, body);
        (1..=state.len())
            .map(|k| self.b.get_tuple_element(&done, k as i64))
            .collect()
    }
}

/// The XLA type of a float code format; `None` for integers.
fn float_type(format: QuantFormat) -> Option<PrimitiveType> {
    match format {
        QuantFormat::Fp8E4m3 => Some(PrimitiveType::F8e4m3fn),
        QuantFormat::Fp8E5m2 => Some(PrimitiveType::F8e5m2),
        QuantFormat::Int8 | QuantFormat::Int4 => None,
    }
}

/// Whether every operand holds bf16 values (bf16, or f32 that equarx reads
/// from a bf16 widening).
fn operands_are_bf16(operands: &[Value]) -> bool {
    operands
        .iter()
        .all(|x| x.element_type() == PrimitiveType::Bf16 as i32)
}
