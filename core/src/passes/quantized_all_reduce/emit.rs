//! Emits the [`Plan`] of one quantized all-reduce: [`emit`] reads top to
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
//! [`crate::numerics`] op for op. A message holds, per block, its B codes
//! followed by its scale's bytes (`[blocks, B + scale_bytes]` s8), so codes
//! and scales are cut apart by two slices, with no reshaping.

use rustc_hash::FxHashMap as HashMap;

use super::groups::{IdSpace, Participants};
use crate::ir::builder::{Builder, Value};
use crate::ir::shape;
use crate::ir::{CompId, InstrId};
use crate::numerics::{absmax_floor, hadamard_norm, hadamard_sign, inv_qmax, scale_mantissa_bits};
use crate::plan::{
    Axis, Collective, Form, GatherForm, Lane, Phase, Plan, QuantFormat, Rotation, ScaleType,
};
use crate::proto::precision_config::Precision;
use crate::proto::{PrimitiveType, ShapeProto};

/// What the emitted subgraph needs besides the plan.
pub struct EmitInputs<'a> {
    pub plan: &'a Plan,
    pub participants: &'a Participants,
    /// The packed all-reduce operands.
    pub operands: &'a [Value],
    /// The result shape (with layout) each operand's sum must have.
    pub results: &'a [ShapeProto],
    /// Scalar f32 `maximum`, s32 `or` and f32 `add` computations.
    pub max_f32: CompId,
    pub or_s32: CompId,
    pub add_f32: CompId,
    /// Emit `collective-permute-start`/`-done` pairs (for async all-reduces).
    pub async_permutes: bool,
    /// The module is past XLA's optimizations (already fused): XLA will not
    /// decompose what it emits any more, so collectives take the forms its
    /// runtime runs directly.
    pub late: bool,
    /// The collective's scatter, gather or split dimension (an array
    /// all-to-all's; none for the all-reduce and a tuple all-to-all).
    pub dimension: Option<i64>,
}

/// What [`emit`] made.
pub struct Emitted {
    /// One value per operand, shaped like `results`.
    pub values: Vec<Value>,
    /// The computations it added (loop bodies and conditions).
    pub computations: Vec<CompId>,
}

/// Emits the plan; returns one value per operand.
pub fn emit(b: &mut Builder, inputs: &EmitInputs) -> Emitted {
    let plan = inputs.plan;
    let mut computations = Vec::new();
    let mut e = Emitter::new(b, inputs, &mut computations);

    // 1. The payload: every operand flattened (or cut into its P rows),
    //    zero-padded to P·c (each row to c), every block rotated when the
    //    plan rotates, seen as [axis sizes.., c] (outer axes first: rank
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
    let mut values = None;
    for phase in &plan.phases {
        match *phase {
            Phase::Ring { axis } => {
                held = e.ring(&held, &rank, &axes, axis);
                axes.retain(|a| *a != axis);
            }
            Phase::Exchange { axis } => {
                held = e.exchange(&held, &axes, axis);
                axes.retain(|a| *a != axis);
            }
            Phase::Gather => values = Some(e.gather(&held, &rank)),
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
    Emitted {
        values: out,
        computations,
    }
}

/// A scalar constant, by type and bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Const {
    F32(u32),
    S32(i32),
    S8(i8),
}

/// The step a repeated op belongs to: a constant when unrolled; in a loop
/// body, the counter after this step (s + 1, an s32 scalar).
#[derive(Clone)]
enum Step {
    At(i64),
    Next(Value),
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
    /// The axis coordinates of this device, by axis stride.
    coordinates: HashMap<usize, Value>,
    /// [`Self::byte_shifts`], by block count.
    shifts: HashMap<i64, Value>,
    /// [`Self::hadamard`]: one matrix serves the rotation and its inverse.
    hadamard: Option<Value>,
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
            hadamard: None,
            borrowed: Vec::new(),
        }
    }

    fn plan(&self) -> &'i Plan {
        self.inputs.plan
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

    fn f32c(&mut self, v: f32) -> Value {
        self.constant(Const::F32(v.to_bits()))
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

    // ---- the payload and the rank

    /// The operands flattened, concatenated, padded to P·c, rotated if the
    /// plan rotates, as `[axis sizes.., c]`. Kept in the operands' narrow
    /// type when they share one and nothing is rotated: each hop converts
    /// the part it reads.
    fn payload(&mut self, axes: &[Axis]) -> Value {
        let plan = self.plan();
        let operands = self.inputs.operands;
        let ty = operands[0].element_type();
        let same = operands.iter().all(|x| x.element_type() == ty);
        let rotated = plan.config.rotation == Rotation::Hadamard;
        let flat: Vec<Value> = operands
            .iter()
            .map(|x| {
                let n = shape::element_count(&x.shape).unwrap_or(0) as i64;
                let x = if same && !rotated {
                    x.clone()
                } else {
                    self.f32(x)
                };
                self.b.reshape(&x, &[n])
            })
            .collect();
        let mut payload = if flat.len() == 1 {
            flat[0].clone()
        } else {
            self.b.concatenate(&flat, 0)
        };
        let padded = plan.padded() as i64;
        if padded > plan.elements as i64 {
            let ty = PrimitiveType::try_from(payload.element_type()).unwrap_or(PrimitiveType::F32);
            let zero = self.b.zero(ty);
            payload = self
                .b
                .pad(&payload, &zero, &[(0, padded - plan.elements as i64)]);
        }
        if rotated {
            payload = self.rotate(&payload, operands_are_bf16(operands));
        }
        let mut dims: Vec<i64> = axes.iter().map(|a| a.size as i64).collect();
        dims.push(plan.chunk as i64);
        let view = self.b.reshape(&payload, &dims);
        if operands.iter().any(|x| x.id == payload.id) || flat.iter().any(|f| f.id == payload.id) {
            self.borrowed.push(view.id);
        }
        view
    }

    /// f32[n] → each block of B multiplied by `H_B`, then by `fl(1/√B)`.
    /// Inputs that are bf16 values multiply exactly at any dot precision;
    /// other f32 inputs ask for the highest.
    fn rotate(&mut self, x: &Value, bf16_valued: bool) -> Value {
        let bl = self.plan().block() as i64;
        let n = shape::element_count(&x.shape).unwrap_or(0) as i64;
        let blocks = self.b.reshape(x, &[n / bl, bl]);
        let h = self.hadamard();
        let precision = if bf16_valued {
            Precision::Default
        } else {
            Precision::Highest
        };
        // ±1 entries: every product is exact, so a backend's fused
        // multiply-adds change nothing; the norm is one multiply after.
        let summed = self.b.dot(&blocks, &h, 1, 0, precision);
        let norm = self.splat(
            Const::F32(hadamard_norm(bl as usize).to_bits()),
            &[n / bl, bl],
        );
        let rotated = self.b.multiply(&summed, &norm);
        self.b.reshape(&rotated, &[n])
    }

    /// The B×B Sylvester Hadamard matrix (±1) as f32, emitted once per
    /// computation: it is symmetric, so the inverse rotation reads it too.
    /// Its literal is s8 (a quarter of an f32 literal's bytes in the
    /// module; XLA folds the convert).
    fn hadamard(&mut self) -> Value {
        if let Some(h) = &self.hadamard {
            return h.clone();
        }
        let bl = self.plan().block();
        let entries: Vec<i8> = (0..bl * bl)
            .map(|i| hadamard_sign(i / bl, i % bl) as i8)
            .collect();
        let signs = self.b.s8_array(&entries, &[bl as i64, bl as i64]);
        let h = self.b.convert(&signs, PrimitiveType::F32);
        self.hadamard = Some(h.clone());
        h
    }

    /// The rank r (s32) of this device in its group.
    fn rank(&mut self) -> Value {
        let id = match self.inputs.participants.space {
            IdSpace::Partition => self.b.partition_id(),
            IdSpace::Replica => self.b.replica_id(),
        };
        let id = self.b.convert(&id, PrimitiveType::S32);
        match self.inputs.participants.rank_table() {
            None => id,
            Some(table) => {
                let table = self.b.s32_array(&table);
                let r = self.b.dynamic_slice(&table, &[id], &[1]);
                self.b.reshape(&r, &[])
            }
        }
    }

    /// This device's coordinate on `axis`: (r / stride) mod size.
    fn coordinate(&mut self, rank: &Value, axis: Axis) -> Value {
        if let Some(v) = self.coordinates.get(&axis.stride) {
            return v.clone();
        }
        let p = self.plan().group_size;
        let mut v = rank.clone();
        if axis.stride > 1 {
            let stride = self.s32c(axis.stride as i64);
            v = self.b.divide(&v, &stride);
        }
        if axis.stride * axis.size < p {
            let size = self.s32c(axis.size as i64);
            v = self.b.binary("remainder", &v, &size);
        }
        self.coordinates.insert(axis.stride, v.clone());
        v
    }

    /// (a − dir·k) mod Q as an s32 scalar, with k = `step` + `plus`.
    fn index(&mut self, a: &Value, q: i64, dir: i64, step: &Step, plus: i64) -> Value {
        match step {
            Step::At(s) => {
                let k = s + plus;
                let key = (a.id, q, dir, k);
                if let Some(v) = self.indices.get(&key) {
                    return v.clone();
                }
                let shift = (-dir * k).rem_euclid(q);
                let v = if shift == 0 {
                    a.clone()
                } else {
                    let s = self.s32c(shift);
                    let sum = self.b.add_op(a, &s);
                    let qv = self.s32c(q);
                    self.b.binary("remainder", &sum, &qv)
                };
                self.indices.insert(key, v.clone());
                v
            }
            // k = s + plus = next + plus − 1, with next in 1..Q−1 and plus
            // at most 2, so a − k + 2Q ≥ 0.
            Step::Next(next) => {
                let shifted = if dir > 0 {
                    let base = self.s32c(2 * q - plus + 1);
                    self.b.binary("subtract", &base, next)
                } else {
                    let plus = self.s32c(plus - 1);
                    self.b.add_op(next, &plus)
                };
                let sum = self.b.add_op(a, &shifted);
                let qv = self.s32c(q);
                self.b.binary("remainder", &sum, &qv)
            }
        }
    }

    // ---- quantize and dequantize

    /// f32 `[nb, B]` blocks → s8 `[nb, code bytes + scale bytes]`
    /// messages (code bytes: B, or B/2 for int4).
    fn quantize(&mut self, blocks: &Value) -> Value {
        let nb = dim(blocks, 0);
        let bl = self.plan().block() as i64;
        let format = self.plan().config.format;
        // The block absmax, +Inf for a block that holds a NaN or an Inf (the
        // numerics contract). A plain max of |x| runs vectorized, and such
        // forms may drop a NaN (XLA:CPU's do), so non-finite values are
        // found by a sum instead: x − x is 0 for finite x and NaN otherwise,
        // and a sum keeps every NaN. Both reductions vectorize; a reducer
        // that maps non-finite values itself runs element by element, 11x
        // slower on XLA:CPU.
        // The reduction starts from the floor (see `absmax_floor`).
        let floor = self.f32c(absmax_floor(format));
        let magnitude = self.b.unary("abs", blocks);
        let absmax = self.b.reduce(&magnitude, &floor, &[1], self.inputs.max_f32);
        let zero = self.f32c(0.0);
        let nought = self.b.binary("subtract", blocks, blocks);
        let finite = self.b.reduce(&nought, &zero, &[1], self.inputs.add_f32);
        let finite = self.b.unary("is-finite", &finite);
        let inf = self.splat(Const::F32(f32::INFINITY.to_bits()), &[nb]);
        let absmax = self.b.select(&finite, &absmax, &inf);
        let inv = self.splat(Const::F32(inv_qmax(format).to_bits()), &[nb]);
        let raw = self.b.multiply(&absmax, &inv);
        // The scale that travels, kept in f32: codes are computed against
        // it, so codes and scale agree (see crate::numerics).
        let mantissa = scale_mantissa_bits(self.plan().scale_type()) as i32;
        let scale = self.b.reduce_precision(&raw, mantissa);
        // One reciprocal per block, then multiplies: XLA rewrites a division
        // by a broadcast scalar into exactly this, so spelling it out keeps
        // every backend and block count on the same arithmetic.
        let ones = self.splat(Const::F32(1f32.to_bits()), &[nb]);
        let recip = self.b.divide(&ones, &scale);
        let recip = self.b.broadcast(&recip, &[nb, bl], &[0]);
        let ratio = self.b.multiply(blocks, &recip);
        let lo = self.f32c(-format.qmax());
        let hi = self.f32c(format.qmax());
        let codes = match float_type(format) {
            // Integers: round to nearest even, clamp, s8 (int4: two to a
            // byte).
            None => {
                let rounded = self.b.unary("round-nearest-even", &ratio);
                let clamped = self.b.clamp(&lo, &rounded, &hi);
                let codes = self.b.convert(&clamped, PrimitiveType::S8);
                if format == QuantFormat::Int4 {
                    self.pack_int4(&codes)
                } else {
                    codes
                }
            }
            // fp8: clamp (the format has no room above its largest value),
            // the convert's own rounding, the bits as s8.
            Some(ty) => {
                let clamped = self.b.clamp(&lo, &ratio, &hi);
                let codes = self.b.convert(&clamped, ty);
                self.b.bitcast_convert(&codes, PrimitiveType::S8)
            }
        };
        let scale_bytes = self.pack_scales(&scale, nb);
        self.b.concatenate(&[codes, scale_bytes], 1)
    }

    /// s8 `[nb, B]` codes in [-7, 7] → s8 `[nb, B/2]`, two to a byte: code
    /// 2k in the low nibble, code 2k+1 in the high one.
    fn pack_int4(&mut self, codes: &Value) -> Value {
        let (nb, bl) = (dim(codes, 0), dim(codes, 1));
        let pairs = self.b.reshape(codes, &[nb, bl / 2, 2]);
        let low = self.b.slice(&pairs, &[0, 0, 0], &[nb, bl / 2, 1]);
        let high = self.b.slice(&pairs, &[0, 0, 1], &[nb, bl / 2, 2]);
        let mask = self.splat(Const::S8(0x0f), &[nb, bl / 2, 1]);
        let four = self.splat(Const::S8(4), &[nb, bl / 2, 1]);
        let low = self.b.binary("and", &low, &mask);
        let high = self.b.binary("shift-left", &high, &four);
        let byte = self.b.binary("or", &low, &high);
        self.b.reshape(&byte, &[nb, bl / 2])
    }

    /// The inverse of [`Self::pack_int4`]: s8 `[nb, B/2]` → s8 `[nb, B]`,
    /// each nibble sign-extended by arithmetic shifts.
    fn unpack_int4(&mut self, bytes: &Value) -> Value {
        let (nb, half) = (dim(bytes, 0), dim(bytes, 1));
        let four = self.splat(Const::S8(4), &[nb, half]);
        let up = self.b.binary("shift-left", bytes, &four);
        let low = self.b.binary("shift-right-arithmetic", &up, &four);
        let high = self.b.binary("shift-right-arithmetic", bytes, &four);
        let low = self.b.reshape(&low, &[nb, half, 1]);
        let high = self.b.reshape(&high, &[nb, half, 1]);
        let pairs = self.b.concatenate(&[low, high], 2);
        self.b.reshape(&pairs, &[nb, 2 * half])
    }

    /// The codes of a message (s8 `[nb, code bytes]`) as the f32 values
    /// they stand for.
    fn code_values(&mut self, codes: &Value) -> Value {
        let format = self.plan().config.format;
        match float_type(format) {
            None if format == QuantFormat::Int4 => {
                let codes = self.unpack_int4(codes);
                self.b.convert(&codes, PrimitiveType::F32)
            }
            None => self.b.convert(codes, PrimitiveType::F32),
            Some(ty) => {
                let floats = self.b.bitcast_convert(codes, ty);
                self.b.convert(&floats, PrimitiveType::F32)
            }
        }
    }

    /// Right-shift amounts that bring each wire byte of a scale's f32 bits
    /// to the bottom: 0, 8, 16, 24 for f32 scales; 16, 24 for bf16 scales
    /// (the high half of their f32 bits), broadcast to `[nb, width]`.
    fn byte_shifts(&mut self, nb: i64) -> Value {
        let (first, width) = match self.plan().scale_type() {
            ScaleType::F32 => (0, 4),
            ScaleType::Bf16 => (16, 2),
        };
        if let Some(v) = self.shifts.get(&nb) {
            return v.clone();
        }
        let amounts: Vec<i32> = (0..width).map(|k| first + 8 * k).collect();
        let vector = self.b.s32_array(&amounts);
        let v = self.b.broadcast(&vector, &[nb, width as i64], &[1]);
        self.shifts.insert(nb, v.clone());
        v
    }

    /// f32 scales → s8 `[nb, width]`, their wire bytes little-endian. Only
    /// same-width bitcasts, shifts and truncating converts: backends compile
    /// no width-changing bitcast-convert this late (XLA expands those early
    /// in its pipeline).
    fn pack_scales(&mut self, scale: &Value, nb: i64) -> Value {
        let width = self.plan().scale_type().bytes() as i64;
        let bits = self.b.bitcast_convert(scale, PrimitiveType::S32);
        let spread = self.b.broadcast(&bits, &[nb, width], &[0]);
        let shifts = self.byte_shifts(nb);
        let shifted = self.b.binary("shift-right-logical", &spread, &shifts);
        self.b.convert(&shifted, PrimitiveType::S8)
    }

    /// The inverse of [`Self::pack_scales`]: s8 `[nb, width]` → f32 `[nb]`.
    fn unpack_scales(&mut self, scale_bytes: &Value) -> Value {
        let dims = scale_bytes.dims().to_vec();
        // Bytes as u8, so that widening them fills with zeros.
        let bytes = self.b.bitcast_convert(scale_bytes, PrimitiveType::U8);
        let unsigned = self.b.convert(&bytes, PrimitiveType::S32);
        let shifts = self.byte_shifts(dims[0]);
        let placed = self.b.binary("shift-left", &unsigned, &shifts);
        let zero = self.s32c(0);
        let bits = self.b.reduce(&placed, &zero, &[1], self.inputs.or_s32);
        self.b.bitcast_convert(&bits, PrimitiveType::F32)
    }

    /// s8 `[nb, code bytes + width]` messages → their codes as f32 values
    /// (`[nb, B]`) and scales (f32 `[nb]`).
    fn split(&mut self, message: &Value) -> (Value, Value) {
        let nb = dim(message, 0);
        let plan = self.plan();
        let code_bytes = (plan.block() * plan.config.format.bits() / 8) as i64;
        let width = plan.scale_type().bytes() as i64;
        let codes = self.b.slice(message, &[0, 0], &[nb, code_bytes]);
        let bytes = self
            .b
            .slice(message, &[0, code_bytes], &[nb, code_bytes + width]);
        let codes = self.code_values(&codes);
        (codes, self.unpack_scales(&bytes))
    }

    /// s8 messages → f32 `[nb, B]` values.
    fn dequantize(&mut self, message: &Value) -> Value {
        let (nb, bl) = (dim(message, 0), self.plan().block() as i64);
        let (codes, scale) = self.split(message);
        let scale = self.b.broadcast(&scale, &[nb, bl], &[0]);
        self.b.multiply(&codes, &scale)
    }

    /// Messages of rotated blocks → the values rotated back:
    /// `(H·q)·(scale/√B)`; the integer sums `H·q` are exact in f32.
    fn dequantize_rotated(&mut self, message: &Value) -> Value {
        let (nb, bl) = (dim(message, 0), self.plan().block() as i64);
        let (codes, scale) = self.split(message);
        let h = self.hadamard();
        let turned = self.b.dot(&codes, &h, 1, 0, Precision::Default);
        let norm = self.splat(Const::F32(hadamard_norm(bl as usize).to_bits()), &[nb]);
        let scale = self.b.multiply(&scale, &norm);
        let scale = self.b.broadcast(&scale, &[nb, bl], &[0]);
        self.b.multiply(&turned, &scale)
    }

    /// One hop on `dir`: every rank sends `message` to the rank one step
    /// along `axis`.
    fn permute(&mut self, message: &Value, axis: Axis, dir: i64) -> Value {
        let pairs = self.inputs.participants.axis_pairs(axis, dir);
        let channel = match self.inputs.participants.space {
            IdSpace::Partition => Some(self.b.fresh_channel_id()),
            IdSpace::Replica => None,
        };
        if self.inputs.async_permutes {
            let start = self.b.collective_permute_start(message, &pairs, channel);
            self.b.collective_permute_done(&start)
        } else {
            self.b.collective_permute(message, &pairs, channel)
        }
    }

    // ---- the phases

    /// This device's f32 part of `lane` of the slice with index `index` on
    /// the held axis `at`: `[rows·blocks, B]`.
    fn own_part(&mut self, held: &Value, at: usize, index: &Value, lane: &Lane) -> Value {
        let dims = held.dims().to_vec();
        let last = dims.len() - 1;
        let zero = self.s32c(0);
        let offset = self.s32c(lane.offset as i64);
        let mut starts = vec![zero; dims.len()];
        starts[at] = index.clone();
        starts[last] = offset;
        let mut sizes = dims.clone();
        sizes[at] = 1;
        sizes[last] = lane.len as i64;
        let part = self.b.dynamic_slice(held, &starts, &sizes);
        let rows: i64 = sizes[..last].iter().product();
        let bl = self.plan().block() as i64;
        let part = self.b.reshape(&part, &[rows * lane.len as i64 / bl, bl]);
        self.f32(&part)
    }

    /// One ring hop of every lane: send the partials on, add this device's
    /// part of the slice they now hold.
    fn ring_step(
        &mut self,
        partials: &[Value],
        held: &Value,
        at: usize,
        a: &Value,
        axis: Axis,
        step: &Step,
    ) -> Vec<Value> {
        let plan = self.plan();
        let q = axis.size as i64;
        plan.lanes
            .iter()
            .zip(partials)
            .map(|(lane, part)| {
                let message = self.quantize(part);
                let received = self.permute(&message, axis, lane.dir);
                let summed = self.dequantize(&received);
                let index = self.index(a, q, lane.dir, step, 2);
                let own = self.own_part(held, at, &index, lane);
                self.b.add_op(&summed, &own)
            })
            .collect()
    }

    /// Reduce-scatter over `axis` round its ring. At step s, the device
    /// with coordinate a sends its partial sum of slice (a − dir·(s+1))
    /// mod Q to a + dir, which adds its own part of that slice. After Q−1
    /// steps the device holds slice a, summed over the axis. Returns what
    /// the device now holds, f32 `[other axes.., c]`.
    fn ring(&mut self, held: &Value, rank: &Value, axes: &[Axis], axis: Axis) -> Value {
        let plan = self.plan();
        let at = axes.iter().position(|x| *x == axis).unwrap_or(0);
        let a = self.coordinate(rank, axis);
        let q = axis.size as i64;
        let first = Step::At(-1);
        let mut partials: Vec<Value> = plan
            .lanes
            .iter()
            .map(|lane| {
                let index = self.index(&a, q, lane.dir, &first, 2);
                self.own_part(held, at, &index, lane)
            })
            .collect();
        match plan.config.form {
            Form::Unrolled => {
                for s in 0..q - 1 {
                    partials = self.ring_step(&partials, held, at, &a, axis, &Step::At(s));
                }
            }
            Form::Loop => {
                // State: (step, partials.., held, coordinate).
                let mut state = partials.clone();
                state.push(held.clone());
                state.push(a.clone());
                let lanes = plan.lanes.len();
                let out = self.repeat(q - 1, &state, |e, s, state| {
                    let (held, a) = (&state[lanes], &state[lanes + 1]);
                    let mut next = e.ring_step(&state[..lanes], held, at, a, axis, &Step::Next(s));
                    next.extend([held.clone(), a.clone()]);
                    next
                });
                partials = out[..lanes].to_vec();
            }
        }
        // The lanes' partials side by side again: [rows, c]. With one row
        // the lanes' blocks simply follow each other.
        let rows: i64 = held.dims().iter().rev().skip(1).product::<i64>() / q;
        let bl = plan.block() as i64;
        let pieces: Vec<Value> = if rows == 1 {
            partials.clone()
        } else {
            plan.lanes
                .iter()
                .zip(&partials)
                .map(|(lane, p)| self.b.reshape(p, &[rows, lane.len as i64 / bl, bl]))
                .collect()
        };
        let joined = match pieces.len() {
            1 => pieces[0].clone(),
            _ => self.b.concatenate(&pieces, i64::from(rows != 1)),
        };
        let mut dims = held.dims().to_vec();
        dims.remove(at);
        self.b.reshape(&joined, &dims)
    }

    /// Reduce-scatter over the whole group by one all-to-all: every slice
    /// quantized once, the owner's sum of the dequantized slices in rank
    /// order. `held` is `[P, c]`; returns f32 `[c]`.
    fn exchange(&mut self, held: &Value, axes: &[Axis], axis: Axis) -> Value {
        let plan = self.plan();
        debug_assert!(axes.len() == 1 && axis.size == plan.group_size);
        let (p, c) = (plan.group_size as i64, plan.chunk as i64);
        let received = self.send_rows(held);
        let values = self.dequantize(&received);
        let values = self.b.reshape(&values, &[p, c]);
        let zero = self.f32c(0.0);
        self.b.reduce(&values, &zero, &[0], self.inputs.add_f32)
    }

    /// Every row of `held` (`[P, c]`) quantized once, row k sent to rank k;
    /// returns what arrives, row k from rank k: s8 `[P·blocks, B + width]`.
    fn send_rows(&mut self, held: &Value) -> Value {
        let plan = self.plan();
        let (p, c, bl) = (
            plan.group_size as i64,
            plan.chunk as i64,
            plan.block() as i64,
        );
        let nb = c / bl;

        let blocks = self.b.reshape(held, &[p * nb, bl]);
        let blocks = self.f32(&blocks);
        let message = self.quantize(&blocks);
        let width = dim(&message, 1);
        // Rank 2, split along the major dimension: the array form every
        // backend runs without decomposing it first (the pre-scheduler
        // hook comes after XLA's all-to-all decomposer).
        let message = self.b.reshape(&message, &[p, nb * width]);
        let parts = self.inputs.participants;
        let channel = match parts.space {
            IdSpace::Partition => Some(self.b.fresh_channel_id()),
            IdSpace::Replica => None,
        };
        let groups = parts.groups.clone();
        let received = if self.inputs.late {
            // XLA:CPU decomposes array all-to-alls into the tuple form early
            // in its pipeline and runs only that form; past that point the
            // pieces are sent as a tuple.
            let x = nb * width;
            let pieces: Vec<Value> = (0..p)
                .map(|k| self.b.slice(&message, &[k, 0], &[k + 1, x]))
                .collect();
            let sent = self.b.all_to_all_tuple(&pieces, &groups, channel);
            let got: Vec<Value> = (0..p).map(|k| self.b.get_tuple_element(&sent, k)).collect();
            self.b.concatenate(&got, 0)
        } else {
            self.b.all_to_all(&message, 0, &groups, channel)
        };
        self.b.reshape(&received, &[p * nb, width])
    }

    /// The all-to-all of the rows of `held` (`[P, c]`), dequantized (and
    /// rotated back): f32 `[P·c]`, row k from rank k.
    fn scatter(&mut self, held: &Value) -> Value {
        let plan = self.plan();
        let n = (plan.group_size * plan.chunk) as i64;
        let received = self.send_rows(held);
        let values = match plan.config.rotation {
            Rotation::Hadamard => self.dequantize_rotated(&received),
            Rotation::None => self.dequantize(&received),
        };
        self.b.reshape(&values, &[n])
    }

    // ---- collectives of rows

    /// The operand's geometry around the collective's dimension d:
    /// (elements before d, size of d, elements after d).
    fn around(&self, x: &Value) -> (i64, i64, i64) {
        let dims = x.dims();
        let d = self.inputs.dimension.unwrap_or(0) as usize;
        let before: i64 = dims[..d].iter().product();
        let after: i64 = dims[d + 1..].iter().product();
        (before, dims[d], after)
    }

    /// The payload of a collective of rows, `[P, c]` (all-gather: `[c]`,
    /// its one row): a reduce-scatter's or an array all-to-all's operand
    /// cut along d into P rows (a transpose brings d to the front when
    /// dimensions come before it), a tuple all-to-all's operands stacked,
    /// each row padded to c, rotated when the plan rotates.
    fn rows(&mut self, axes: &[Axis]) -> Value {
        let plan = self.plan();
        let (p, c) = (plan.group_size as i64, plan.chunk as i64);
        let m = plan.row.unwrap_or(plan.chunk) as i64;
        let operands = self.inputs.operands;
        let x = &operands[0];
        let rotated = plan.config.rotation == Rotation::Hadamard;
        let (rows, stacked) = match (plan.collective, self.inputs.dimension) {
            (Collective::AllGather, _) => (1, self.b.reshape(x, &[1, m])),
            (_, None) => {
                let flat: Vec<Value> = operands
                    .iter()
                    .map(|o| self.b.reshape(o, &[1, m]))
                    .collect();
                (p, self.b.concatenate(&flat, 0))
            }
            (_, Some(_)) => {
                let (before, size, after) = self.around(x);
                let cut = if before == 1 {
                    x.clone()
                } else {
                    let v = self.b.reshape(x, &[before, p, size / p, after]);
                    self.b.transpose(&v, &[1, 0, 2, 3])
                };
                (p, self.b.reshape(&cut, &[p, m]))
            }
        };
        let mut payload = if rotated { self.f32(&stacked) } else { stacked };
        if c > m {
            let ty = PrimitiveType::try_from(payload.element_type()).unwrap_or(PrimitiveType::F32);
            let zero = self.b.zero(ty);
            payload = self.b.pad(&payload, &zero, &[(0, 0), (0, c - m)]);
        }
        if rotated {
            let flat = self.b.reshape(&payload, &[rows * c]);
            payload = self.rotate(&flat, operands_are_bf16(operands));
        }
        if plan.collective != Collective::ReduceScatter {
            let dims: &[i64] = if rows == 1 { &[c] } else { &[rows, c] };
            return self.b.reshape(&payload, dims);
        }
        let mut dims: Vec<i64> = axes.iter().map(|a| a.size as i64).collect();
        dims.push(c);
        self.b.reshape(&payload, &dims)
    }

    /// The all-reduce's sum (f32 `[P·c]`) → each operand's part, in its
    /// shape, type and layout.
    fn unpack_sum(&mut self, whole: &Value) -> Vec<Value> {
        let padded = self.plan().padded() as i64;
        let mut offset = 0i64;
        let mut out = Vec::new();
        for (x, result) in self.inputs.operands.iter().zip(self.inputs.results) {
            let n = shape::element_count(&x.shape).unwrap_or(0) as i64;
            let part = if n == padded {
                whole.clone()
            } else {
                self.b.slice(whole, &[offset], &[offset + n])
            };
            offset += n;
            out.push(self.as_result(&part, result));
        }
        out
    }

    /// A reduce-scatter's owned sum (f32 `[c]`, unquantized; rotated back
    /// when the plan rotates) → the result.
    fn unpack_owned(&mut self, owned: &Value) -> Vec<Value> {
        let plan = self.plan();
        let (c, m) = (plan.chunk as i64, plan.row.unwrap_or(plan.chunk) as i64);
        let mut sum = self.b.reshape(owned, &[c]);
        if plan.config.rotation == Rotation::Hadamard {
            sum = self.rotate(&sum, false);
        }
        if c > m {
            sum = self.b.slice(&sum, &[0], &[m]);
        }
        let result = &self.inputs.results[0];
        vec![self.as_result(&sum, result)]
    }

    /// An all-gather's or all-to-all's rows (f32 `[P·c]`, row k from rank
    /// k) → the result: rows laid side by side along d (an array form),
    /// or one row per tuple element.
    fn unpack_rows(&mut self, values: &Value) -> Vec<Value> {
        let plan = self.plan();
        let (p, c) = (plan.group_size as i64, plan.chunk as i64);
        let m = plan.row.unwrap_or(plan.chunk) as i64;
        let mut rows = self.b.reshape(values, &[p, c]);
        if c > m {
            rows = self.b.slice(&rows, &[0, 0], &[p, m]);
        }
        let results = self.inputs.results;
        if self.inputs.dimension.is_none() && plan.collective == Collective::AllToAll {
            return (0..p)
                .zip(results)
                .map(|(k, result)| {
                    let row = self.b.slice(&rows, &[k, 0], &[k + 1, m]);
                    self.as_result(&row, result)
                })
                .collect();
        }
        // Row k holds rank k's piece, [before, size/P, after] (an
        // all-gather's whole operand): side by side along d.
        let (before, size, after) = self.around(&self.inputs.operands[0]);
        let piece = match plan.collective {
            Collective::AllGather => size,
            _ => size / p,
        };
        let placed = if before == 1 {
            rows
        } else {
            let v = self.b.reshape(&rows, &[p, before, piece, after]);
            self.b.transpose(&v, &[1, 0, 2, 3])
        };
        vec![self.as_result(&placed, &results[0])]
    }

    /// f32 values → `result` (its dimensions, type and layout).
    fn as_result(&mut self, v: &Value, result: &ShapeProto) -> Value {
        let ty = PrimitiveType::try_from(result.element_type).unwrap_or(PrimitiveType::F32);
        if ty == PrimitiveType::F32 {
            self.b.reshape_to(v, result)
        } else {
            let v = self.b.reshape(v, &result.dimensions);
            self.b.convert_to(&v, result)
        }
    }

    /// The owned chunk (f32 `[c]`) quantized once; every rank, the owner
    /// included, dequantizes all P chunks from the same codes, so every
    /// participant ends with bit-identical results. Returns f32 `[P·c]`.
    fn gather(&mut self, owned: &Value, rank: &Value) -> Value {
        let plan = self.plan();
        let (p, bl) = (plan.group_size as i64, plan.block() as i64);
        let nb = plan.chunk as i64 / bl;
        let blocks = self.b.reshape(owned, &[nb, bl]);
        let blocks = self.f32(&blocks);
        let message = self.quantize(&blocks);
        let width = dim(&message, 1);
        let all = match plan.config.gather {
            GatherForm::AllGather => {
                let row = self.b.reshape(&message, &[1, nb * width]);
                let parts = self.inputs.participants;
                let (channel, global) = match parts.space {
                    IdSpace::Partition => (Some(self.b.fresh_channel_id()), true),
                    IdSpace::Replica => (None, false),
                };
                let groups = parts.groups.clone();
                self.b.all_gather(&row, 0, &groups, channel, global)
            }
            GatherForm::Permute => self.relay(&message, rank),
        };
        let all = self.b.reshape(&all, &[p * nb, width]);
        let values = match plan.config.rotation {
            Rotation::Hadamard => self.dequantize_rotated(&all),
            Rotation::None => self.dequantize(&all),
        };
        self.b.reshape(&values, &[p * nb * bl])
    }

    /// Every rank's message, stacked in rank order (`s8[P, bytes]`), by
    /// P−1 relays round the ring; with two directions, the first half of
    /// the message's bytes travels one way and the rest the other.
    fn relay(&mut self, message: &Value, rank: &Value) -> Value {
        let plan = self.plan();
        let p = plan.group_size as i64;
        let bytes = shape::element_count(&message.shape).unwrap_or(0) as i64;
        let flat = self.b.reshape(message, &[bytes]);
        let dirs = plan.directions();
        let cut = if dirs.len() == 2 { bytes / 2 } else { bytes };
        let bounds: Vec<(i64, i64, i64)> = dirs
            .iter()
            .enumerate()
            .map(|(k, &d)| if k == 0 { (d, 0, cut) } else { (d, cut, bytes) })
            .collect();
        // Per direction: the message travelling, and the rows so far.
        let mut state = Vec::new();
        for &(_, lo, hi) in &bounds {
            let part = self.b.slice(&flat, &[lo], &[hi]);
            let row = self.b.reshape(&part, &[1, hi - lo]);
            let zero8 = self.b.zero(PrimitiveType::S8);
            let empty = self.b.broadcast(&zero8, &[p, hi - lo], &[]);
            let col = self.s32c(0);
            let rows = self
                .b
                .dynamic_update_slice(&empty, &row, &[rank.clone(), col]);
            state.push(part);
            state.push(rows);
        }
        let out = match plan.config.form {
            Form::Unrolled => {
                for s in 0..p - 1 {
                    state = self.relay_step(&bounds, &Step::At(s), &state, rank);
                }
                state
            }
            Form::Loop => {
                let n = state.len();
                state.push(rank.clone());
                let mut out = self.repeat(p - 1, &state, |e, s, state| {
                    let mut next = e.relay_step(&bounds, &Step::Next(s), &state[..n], &state[n]);
                    next.push(state[n].clone());
                    next
                });
                out.truncate(n);
                out
            }
        };
        let rows: Vec<Value> = out.iter().skip(1).step_by(2).cloned().collect();
        if rows.len() == 1 {
            rows[0].clone()
        } else {
            self.b.concatenate(&rows, 1)
        }
    }

    /// One relay of every direction: pass the travelling part on, and file
    /// the one that arrives in its row. The part that arrives at relay
    /// h = s+1 comes from rank (r − dir·h) mod P.
    fn relay_step(
        &mut self,
        bounds: &[(i64, i64, i64)],
        s: &Step,
        state: &[Value],
        rank: &Value,
    ) -> Vec<Value> {
        let p = self.plan().group_size as i64;
        let whole = Axis {
            size: self.plan().group_size,
            stride: 1,
        };
        let mut next = Vec::new();
        for (k, &(dir, lo, hi)) in bounds.iter().enumerate() {
            // The received part goes into the state in place of the one
            // sent: a copy, so the collective never writes the buffer it
            // reads (no copy insertion follows the pre-scheduler hook).
            let travelling = self.permute(&state[2 * k], whole, dir);
            let travelling = match s {
                Step::Next(_) => self.b.unary("copy", &travelling),
                Step::At(_) => travelling,
            };
            let from = self.index(rank, p, dir, s, 1);
            let row = self.b.reshape(&travelling, &[1, hi - lo]);
            let col = self.s32c(0);
            let rows = self
                .b
                .dynamic_update_slice(&state[2 * k + 1], &row, &[from, col]);
            next.extend([travelling, rows]);
        }
        next
    }

    /// A `while` loop that runs `body` `trips` times over `state`; the body
    /// gets its own emitter, the counter after the step (s + 1) and the
    /// state's elements, and returns the next state's elements. Returns the
    /// final elements.
    fn repeat(
        &mut self,
        trips: i64,
        state: &[Value],
        body: impl FnOnce(&mut Emitter<'_, '_, 'i>, Value, &[Value]) -> Vec<Value>,
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
                    self.b.unary("copy", &v)
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
            "equarx_ring_cond",
            std::slice::from_ref(&tuple),
            |b, params| {
                let s = b.get_tuple_element(&params[0], 0);
                let n = b.s32_scalar(trips as i32);
                b.compare(&s, &n, "LT")
            },
        );
        let body = self
            .b
            .computation("equarx_ring_body", &[tuple], |b, params| {
                // The body reads the counter once, to step it; everything
                // else reads the stepped value. The new state overwrites the
                // old in place, and at the pre-scheduler hook no copy
                // insertion follows to order a late read of the old counter.
                let mut e = Emitter::new(b, inputs, &mut made);
                let count = e.b.get_tuple_element(&params[0], 0);
                let one = e.s32c(1);
                let stepped = e.b.add_op(&count, &one);
                let elements: Vec<Value> = (1..=state.len())
                    .map(|k| e.b.get_tuple_element(&params[0], k as i64))
                    .collect();
                let next = body(&mut e, stepped.clone(), &elements);
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

/// Dimension `k` of `v`, or 0 if it has none: a value of a builder that
/// met an inconsistency has no dimensions, and the builder reports the
/// inconsistency when it finishes.
fn dim(v: &Value, k: usize) -> i64 {
    v.dims().get(k).copied().unwrap_or(0)
}

/// Whether every operand holds bf16 values (bf16, or f32 that equarx reads
/// from a bf16 widening).
fn operands_are_bf16(operands: &[Value]) -> bool {
    operands
        .iter()
        .all(|x| x.element_type() == PrimitiveType::Bf16 as i32)
}
