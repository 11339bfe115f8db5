//! Emits the quantized ring for one all-reduce: [`emit_ring`] reads top to
//! bottom as the algorithm — flatten and pad, find the rank, reduce-scatter
//! round the ring, all-gather, unpack.
//!
//! The quantize and dequantize steps implement the contract in
//! [`crate::numerics`] op for op.

use rustc_hash::FxHashMap as HashMap;

use super::groups::{IdSpace, Participants};
use super::plan::{Lane, RingPlan};
use super::{GatherForm, ScaleType};
use crate::ir::CompId;
use crate::ir::builder::{Builder, Value};
use crate::ir::shape;
use crate::numerics::{INV_QMAX, QMAX, SCALE_MASK};
use crate::proto::{PrimitiveType, ShapeProto};

/// What the emitted subgraph needs besides the plan.
pub struct RingInputs<'a> {
    pub plan: &'a RingPlan,
    pub participants: &'a Participants,
    /// The packed all-reduce operands.
    pub operands: &'a [Value],
    /// The result shape (with layout) each operand's sum must have.
    pub results: &'a [ShapeProto],
    /// A scalar f32 `maximum` computation for the block absmax.
    pub max_f32: CompId,
    /// A scalar s32 `or` computation for reassembling scale bytes.
    pub or_s32: CompId,
    pub gather: GatherForm,
    /// Emit `collective-permute-start`/`-done` pairs (for async all-reduces).
    pub async_permutes: bool,
}

/// Emits the ring; returns one value per operand, shaped like `results`.
pub fn emit_ring(b: &mut Builder, inputs: &RingInputs) -> Vec<Value> {
    let plan = inputs.plan;
    let p = plan.group_size as i64;
    let mut e = Emitter::new(b, inputs);

    // 1. Flatten every operand to f32, concatenate, zero-pad to P·c, and view
    //    the payload as [P chunks, c].
    let flat: Vec<Value> = inputs
        .operands
        .iter()
        .map(|x| {
            let n = shape::element_count(&x.shape).unwrap_or(0) as i64;
            let x = e.as_f32(x);
            e.b.reshape(&x, &[n])
        })
        .collect();
    let mut payload = if flat.len() == 1 {
        flat[0].clone()
    } else {
        e.b.concatenate(&flat, 0)
    };
    let padded = plan.padded() as i64;
    if padded > plan.elements as i64 {
        let zero = e.b.zero(PrimitiveType::F32);
        payload =
            e.b.pad(&payload, &zero, &[(0, padded - plan.elements as i64)]);
    }
    let chunks = e.b.reshape(&payload, &[p, plan.chunk as i64]);

    // 2. This device's rank r in its group, from its id through the table.
    let rank = e.rank();

    // 3. Reduce-scatter. At step s, rank r sends its partial sum of chunk
    //    (r − dir·(s+1)) mod P to rank r + dir, which adds its own part of
    //    that chunk. After P−1 steps rank r holds chunk r, fully summed.
    //    Step-major order interleaves the lanes, so each lane's hop can
    //    overlap another lane's quantize and add.
    let mut partial: Vec<Value> = plan
        .lanes
        .iter()
        .map(|lane| e.own_part(&chunks, &rank, lane, 0))
        .collect();
    for step in 0..p - 1 {
        for (lane, part) in plan.lanes.iter().zip(partial.iter_mut()) {
            let message = e.quantize(part, lane);
            let received = e.permute(&message, lane.dir);
            let summed = e.dequantize(&received, lane, None);
            let own = e.own_part(&chunks, &rank, lane, step + 1);
            *part = e.b.add_op(&summed, &own);
        }
    }

    // 4. All-gather: the owner quantizes its chunk once; every rank, the
    //    owner included, dequantizes all P chunks from the same int8 codes,
    //    so every participant ends with bit-identical results.
    let gathered: Vec<Value> = plan
        .lanes
        .iter()
        .zip(&partial)
        .map(|(lane, part)| {
            let message = e.quantize(part, lane);
            let all = e.gather(&message, &rank, lane);
            e.dequantize(&all, lane, Some(p))
        })
        .collect();

    // 5. Reassemble [P, c] from the lanes, drop the padding, and give each
    //    operand its sum back in its own shape, type and layout.
    let whole = if gathered.len() == 1 {
        gathered[0].clone()
    } else {
        e.b.concatenate(&gathered, 1)
    };
    let whole = e.b.reshape(&whole, &[padded]);
    let mut offset = 0i64;
    let mut out = Vec::new();
    for (x, result) in inputs.operands.iter().zip(inputs.results) {
        let n = shape::element_count(&x.shape).unwrap_or(0) as i64;
        let part = if n == padded {
            whole.clone()
        } else {
            e.b.slice(&whole, &[offset], &[offset + n])
        };
        offset += n;
        let ty = PrimitiveType::try_from(result.element_type).unwrap_or(PrimitiveType::F32);
        out.push(if ty == PrimitiveType::F32 {
            e.b.reshape_to(&part, result)
        } else {
            let part = e.b.reshape(&part, &result.dimensions);
            e.b.convert_to(&part, result)
        });
    }
    out
}

/// A scalar constant, by type and bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Const {
    F32(u32),
    S32(i32),
}

/// Shared constants and caches for one ring: every scalar constant and
/// every broadcast of one is emitted once.
struct Emitter<'b, 'm, 'i> {
    b: &'b mut Builder<'m>,
    inputs: &'i RingInputs<'i>,
    /// Chunk index (r − dir·k) mod P, by (dir, k).
    chunk_index: HashMap<(i64, i64), Value>,
    consts: HashMap<Const, Value>,
    splats: HashMap<(Const, Vec<i64>), Value>,
    /// The shifts that place a scale's bytes, broadcast to a shape.
    shifts: HashMap<(Vec<i64>, i64), Value>,
}

impl<'b, 'm, 'i> Emitter<'b, 'm, 'i> {
    fn new(b: &'b mut Builder<'m>, inputs: &'i RingInputs<'i>) -> Self {
        Emitter {
            b,
            inputs,
            chunk_index: HashMap::default(),
            consts: HashMap::default(),
            splats: HashMap::default(),
            shifts: HashMap::default(),
        }
    }

    fn plan(&self) -> &RingPlan {
        self.inputs.plan
    }

    fn as_f32(&mut self, x: &Value) -> Value {
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

    /// (r − dir·k) mod P as an s32 scalar.
    fn chunk_of(&mut self, rank: &Value, dir: i64, k: i64) -> Value {
        let p = self.plan().group_size as i64;
        if let Some(v) = self.chunk_index.get(&(dir, k)) {
            return v.clone();
        }
        let shift = (-dir * k).rem_euclid(p);
        let v = if shift == 0 {
            rank.clone()
        } else {
            let s = self.s32c(shift);
            let sum = self.b.add_op(rank, &s);
            let pv = self.s32c(p);
            self.b.binary("remainder", &sum, &pv)
        };
        self.chunk_index.insert((dir, k), v.clone());
        v
    }

    /// This device's own f32 contribution to `lane` of the chunk it sends at
    /// step `k` (k = 0: the chunk it starts with), which is the chunk it
    /// received at step k − 1.
    fn own_part(&mut self, chunks: &Value, rank: &Value, lane: &Lane, k: i64) -> Value {
        let chunk = self.chunk_of(rank, lane.dir, k + 1);
        let offset = self.s32c(lane.offset as i64);
        let len = lane.len as i64;
        let part = self.b.dynamic_slice(chunks, &[chunk, offset], &[1, len]);
        self.b.reshape(&part, &[len])
    }

    /// f32[len] → one s8 message: codes, then the scales' bytes.
    fn quantize(&mut self, v: &Value, lane: &Lane) -> Value {
        let bl = self.plan().block as i64;
        let nb = lane.len as i64 / bl;
        let blocks = self.b.reshape(v, &[nb, bl]);
        let magnitude = self.b.unary("abs", &blocks);
        let zero = self.f32c(0.0);
        let absmax = self.b.reduce(&magnitude, &zero, &[1], self.inputs.max_f32);
        let inv = self.splat(Const::F32(INV_QMAX.to_bits()), &[nb]);
        let raw = self.b.multiply(&absmax, &inv);
        let scale = match self.plan().scale_type {
            // A scale with at most 17 significant bits makes every
            // code·scale product exact, so a hop's dequantize-and-add gives
            // the same bits whether or not the backend fuses it into one
            // multiply-add.
            ScaleType::F32 => {
                let bits = self.b.bitcast_convert(&raw, PrimitiveType::S32);
                let mask = self.splat(Const::S32(SCALE_MASK as i32), &[nb]);
                let bits = self.b.binary("and", &bits, &mask);
                self.b.bitcast_convert(&bits, PrimitiveType::F32)
            }
            // bf16 has 8 significant bits; codes are computed against the
            // scale that travels, so codes and scale agree. The way back to
            // f32 goes through the bits (bf16 → u16 → high half of an s32):
            // a plain convert round trip f32 → bf16 → f32 is what XLA
            // deletes under xla_allow_excess_precision (its default), which
            // would leave the codes computed against the unrounded scale.
            ScaleType::Bf16 => {
                let wire = self.b.convert(&raw, PrimitiveType::Bf16);
                let half = self.b.bitcast_convert(&wire, PrimitiveType::U16);
                let wide = self.b.convert(&half, PrimitiveType::S32);
                let sixteen = self.splat(Const::S32(16), &[nb]);
                let bits = self.b.binary("shift-left", &wide, &sixteen);
                self.b.bitcast_convert(&bits, PrimitiveType::F32)
            }
        };
        // One reciprocal per block, then multiplies: XLA rewrites a division
        // by a broadcast scalar into exactly this, so spelling it out keeps
        // every backend and block count on the same arithmetic. An all-zero
        // block (scale 0) gets reciprocal 0, hence codes 0.
        let ones = self.splat(Const::F32(1f32.to_bits()), &[nb]);
        let recip = self.b.divide(&ones, &scale);
        let zeros = self.splat(Const::F32(0), &[nb]);
        let is_zero = self.b.compare(&scale, &zeros, "EQ");
        let recip = self.b.select(&is_zero, &zeros, &recip);
        let recip = self.b.broadcast(&recip, &[nb, bl], &[0]);
        let ratio = self.b.multiply(&blocks, &recip);
        let rounded = self.b.unary("round-nearest-even", &ratio);
        let lo = self.f32c(-QMAX);
        let hi = self.f32c(QMAX);
        let clamped = self.b.clamp(&lo, &rounded, &hi);
        let codes = self.b.convert(&clamped, PrimitiveType::S8);
        let codes = self.b.reshape(&codes, &[nb * bl]);
        let scale_bytes = self.pack_scales(&scale, nb);
        self.b.concatenate(&[codes, scale_bytes], 0)
    }

    /// Right-shift amounts that bring each wire byte of a scale to the
    /// bottom, broadcast to `dims` along dimension `along`: 0, 8, 16, 24 for
    /// f32 scales; 16, 24 for bf16 scales (the high half of their f32 bits).
    fn byte_shifts(&mut self, dims: &[i64], along: i64) -> Value {
        let key = (dims.to_vec(), along);
        if let Some(v) = self.shifts.get(&key) {
            return v.clone();
        }
        let first = match self.plan().scale_type {
            ScaleType::F32 => 0,
            ScaleType::Bf16 => 16,
        };
        let width = self.plan().scale_type.bytes() as i32;
        let amounts: Vec<i32> = (0..width).map(|k| first + 8 * k).collect();
        let vector = self.b.s32_array(&amounts);
        let v = self.b.broadcast(&vector, dims, &[along]);
        self.shifts.insert(key, v.clone());
        v
    }

    /// f32 scales → s8[nb·width], their wire bytes little-endian. Only
    /// same-width bitcasts, shifts and truncating converts: backends compile
    /// no width-changing bitcast-convert this late (XLA expands those early
    /// in its pipeline).
    fn pack_scales(&mut self, scale: &Value, nb: i64) -> Value {
        let width = self.plan().scale_type.bytes() as i64;
        let bits = self.b.bitcast_convert(scale, PrimitiveType::S32);
        let spread = self.b.broadcast(&bits, &[nb, width], &[0]);
        let shifts = self.byte_shifts(&[nb, width], 1);
        let shifted = self.b.binary("shift-right-logical", &spread, &shifts);
        let bytes = self.b.convert(&shifted, PrimitiveType::S8);
        self.b.reshape(&bytes, &[nb * width])
    }

    /// The inverse of [`Self::pack_scales`]: `[.., nb, width]` bytes → f32[.., nb].
    fn unpack_scales(&mut self, scale_bytes: &Value, dims: &[i64]) -> Value {
        let width = self.plan().scale_type.bytes() as i64;
        let mut full = dims.to_vec();
        full.push(width);
        let wide = self.b.convert(scale_bytes, PrimitiveType::S32);
        let mask = self.splat(Const::S32(0xff), &full);
        let unsigned = self.b.binary("and", &wide, &mask);
        let shifts = self.byte_shifts(&full, dims.len() as i64);
        let placed = self.b.binary("shift-left", &unsigned, &shifts);
        let zero = self.s32c(0);
        let bits = self
            .b
            .reduce(&placed, &zero, &[dims.len() as i64], self.inputs.or_s32);
        self.b.bitcast_convert(&bits, PrimitiveType::F32)
    }

    /// One s8 message (or `[P, message]` with `lead = Some(P)`) → f32 values.
    fn dequantize(&mut self, message: &Value, lane: &Lane, lead: Option<i64>) -> Value {
        let bl = self.plan().block as i64;
        let (len, msg) = (lane.len as i64, self.plan().message_len(lane) as i64);
        let nb = len / bl;
        let width = self.plan().scale_type.bytes() as i64;
        let lead_dims: Vec<i64> = lead.into_iter().collect();
        let with_lead =
            |tail: &[i64]| -> Vec<i64> { lead_dims.iter().chain(tail).copied().collect() };
        let zeros: Vec<i64> = vec![0; lead_dims.len() + 1];
        let codes = self.b.slice(message, &zeros, &with_lead(&[len]));
        let mut start = zeros.clone();
        *start.last_mut().unwrap_or(&mut 0) = len;
        let scale_bytes = self.b.slice(message, &start, &with_lead(&[msg]));
        let scale_bytes = self.b.reshape(&scale_bytes, &with_lead(&[nb, width]));
        let scale = self.unpack_scales(&scale_bytes, &with_lead(&[nb]));
        let codes = self.b.reshape(&codes, &with_lead(&[nb, bl]));
        let codes = self.b.convert(&codes, PrimitiveType::F32);
        let dims = with_lead(&[nb, bl]);
        let map: Vec<i64> = (0..dims.len() as i64 - 1).collect();
        let scale_b = self.b.broadcast(&scale, &dims, &map);
        let values = self.b.multiply(&codes, &scale_b);
        self.b.reshape(&values, &with_lead(&[len]))
    }

    /// One hop: every rank sends `message` to rank + `dir`.
    fn permute(&mut self, message: &Value, dir: i64) -> Value {
        let pairs = self.inputs.participants.ring_pairs(dir);
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

    /// Every rank's message, stacked in rank order: `s8[P, message]`.
    fn gather(&mut self, message: &Value, rank: &Value, lane: &Lane) -> Value {
        let (p, dir) = (self.plan().group_size as i64, lane.dir);
        let msg = self.plan().message_len(lane) as i64;
        let row = self.b.reshape(message, &[1, msg]);
        match self.inputs.gather {
            GatherForm::AllGather => {
                let parts = self.inputs.participants;
                let (channel, global) = match parts.space {
                    IdSpace::Partition => (Some(self.b.fresh_channel_id()), true),
                    IdSpace::Replica => (None, false),
                };
                let groups = parts.groups.clone();
                self.b.all_gather(&row, 0, &groups, channel, global)
            }
            GatherForm::Permute => {
                // P−1 hops forward the messages round the ring; the one that
                // arrives at hop h comes from rank (r − dir·h) mod P.
                let zero8 = self.b.zero(PrimitiveType::S8);
                let empty = self.b.broadcast(&zero8, &[p, msg], &[]);
                let col = self.s32c(0);
                let mut all =
                    self.b
                        .dynamic_update_slice(&empty, &row, &[rank.clone(), col.clone()]);
                let mut travelling = message.clone();
                for hop in 1..p {
                    travelling = self.permute(&travelling, dir);
                    let from = self.chunk_of(rank, dir, hop);
                    let row = self.b.reshape(&travelling, &[1, msg]);
                    all = self
                        .b
                        .dynamic_update_slice(&all, &row, &[from, col.clone()]);
                }
                all
            }
        }
    }
}
