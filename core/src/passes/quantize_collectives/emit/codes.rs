//! The code formats: blocks quantized into a [`Message`] (their codes and
//! their scales) and a message dequantized, for int8, fp8 (e4m3, e5m2) and
//! int4 (two codes to a byte). The arithmetic is the contract of
//! [`crate::numerics`], op for op.

use super::{Const, Emitter, Message, Scales, float_type};
use crate::ir::builder::Value;
use crate::ir::opcode::Opcode;
use crate::ir::shape;
use crate::numerics::{absmax_floor, hadamard_norm, inv_qmax, scale_mantissa_bits};
use crate::passes::Stage;
use crate::plan::{ScaleType, Wire};
use crate::proto::PrimitiveType;
use crate::proto::precision_config::Precision;

impl Emitter<'_, '_, '_> {
    /// f32 blocks `[.., B]` (a block to a row of the last dimension) →
    /// their [`Message`].
    pub(super) fn quantize(&mut self, blocks: &Value) -> Message {
        let largest = self.largest(blocks);
        self.quantize_with(blocks, &largest)
    }

    /// The largest bits of |x| per block of f32 blocks `[.., B]`, s32
    /// `[..]`, from the floor: what [`Self::quantize_with`] makes the scale
    /// of.
    pub(super) fn largest(&mut self, blocks: &Value) -> Value {
        let dims = blocks.dims().to_vec();
        let format = self.plan().config.format;
        // One integer reduction: the bits of |x| (the sign bit cleared)
        // order as the magnitudes do, and every NaN's bits lie above +Inf's,
        // so the largest bits, capped at +Inf's ([`Self::quantize_with`]),
        // are the absmax's, +Inf for a block that holds a NaN or an Inf
        // (the numerics contract). A float max may drop a NaN (XLA:CPU's
        // vectorized one does), an integer max cannot, and it is exact in
        // any order. The reduction starts from the floor (see
        // `absmax_floor`).
        let floor = self.s32c(i64::from(absmax_floor(format).to_bits()));
        let bits = self.b.bitcast_convert(blocks, PrimitiveType::S32);
        let mask = self.splat(Const::S32(0x7fff_ffff), &dims);
        let magnitude = self.b.binary(Opcode::And, &bits, &mask);
        let last = dims.len() as i64 - 1;
        self.b
            .reduce(&magnitude, &floor, &[last], self.inputs.max_s32)
    }

    /// f32 blocks `[.., B]` and their [`Self::largest`] bits `[..]` →
    /// their [`Message`].
    pub(super) fn quantize_with(&mut self, blocks: &Value, largest: &Value) -> Message {
        let scales = self.scales_of(largest);
        let codes = self.codes_of(blocks, &scales.recip);
        Message {
            codes,
            scales: scales.scale,
            bits: scales.bits,
            rows: None,
        }
    }

    /// The scales of blocks whose [`Self::largest`] bits are `largest`
    /// (`[..]`), and their reciprocals.
    pub(super) fn scales_of(&mut self, largest: &Value) -> Scales {
        let lead = largest.dims().to_vec();
        let scale = self.scale_of(largest);
        // Scales apart on the wire and the module not yet fused (XLA:TPU,
        // the door before XLA), the reciprocal is taken of the scale as it
        // travels, decoded from its wire bits (the same value): bits and
        // reciprocal are then a chain, which libtpu fuses into one
        // multi-output kernel, where two users of the scale were a kernel
        // each (one an op's quantize; BENCHMARKS.md, "The reciprocal from
        // the wire's scale on XLA:TPU"). Past the fusion every op is a
        // kernel, and the decode would be two more.
        let (scale, bits) = if self.split_before_fusion() {
            let bits = self.scale_bits(&scale);
            (self.scale_of_bits(&bits), Some(bits))
        } else {
            (scale, None)
        };
        // One reciprocal per block, then multiplies: XLA rewrites a division
        // by a broadcast scalar into exactly this, so spelling it out keeps
        // every backend and block count on the same arithmetic.
        let ones = self.splat(Const::F32(1f32.to_bits()), &lead);
        let recip = self.b.divide(&ones, &scale);
        Scales { scale, bits, recip }
    }

    /// The scales of blocks whose [`Self::largest`] bits are `largest`
    /// (`[..]`): what travels, in f32.
    pub(super) fn scale_of(&mut self, largest: &Value) -> Value {
        let lead = largest.dims().to_vec();
        let format = self.plan().config.format;
        // The largest bits capped at +Inf's: the absmax.
        let inf = self.splat(Const::S32(f32::INFINITY.to_bits() as i32), &lead);
        let capped = self.b.binary(Opcode::Minimum, largest, &inf);
        let absmax = self.b.bitcast_convert(&capped, PrimitiveType::F32);
        let inv = self.splat(Const::F32(inv_qmax(format).to_bits()), &lead);
        let raw = self.b.multiply(&absmax, &inv);
        // The scale that travels, kept in f32: codes are computed against
        // it, so codes and scale agree (see crate::numerics).
        let mantissa = scale_mantissa_bits(self.plan().scale_type()) as i32;
        self.b.reduce_precision(&raw, mantissa)
    }

    /// The codes of f32 blocks `[.., B]` given their scales' reciprocals
    /// `[..]` ([`Self::scales_of`]).
    pub(super) fn codes_of(&mut self, blocks: &Value, recip: &Value) -> Value {
        let dims = blocks.dims().to_vec();
        let format = self.plan().config.format;
        let recip = self.b.broadcast(recip, &dims, &lead_dims(&dims));
        let ratio = self.b.multiply(blocks, &recip);
        // Bounds shaped like the ratio, never scalars: XLA:GPU's
        // ReshapeMover (jaxlib 0.10.2) sinks a reshape through a clamp by
        // reshaping every operand, and a scalar bound there is a CHECK
        // failure that aborts the user's process.
        // The lower bound is the upper one negated (exact): one constant and
        // one broadcast fewer, which keeps the worst rewrite within its
        // instruction budget (tests/pass_contract.rs).
        let hi = self.splat(Const::F32(format.qmax().to_bits()), &dims);
        let lo = self.b.unary(Opcode::Negate, &hi);
        match float_type(format) {
            // Integers: round to nearest even, clamp, s8 (int4: two to a
            // byte).
            None => {
                let rounded = self.b.unary(Opcode::RoundNearestEven, &ratio);
                let clamped = self.b.clamp(&lo, &rounded, &hi);
                let codes = self.b.convert(&clamped, PrimitiveType::S8);
                if format.packs_two_per_byte() {
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
        }
    }

    /// A message as the arrays that travel ([`Wire`]): packed, one s8
    /// array `[.., code bytes + scale bytes]` (a block's codes, then its
    /// scale's bits, little-endian, in its own row); split, the codes
    /// `[.., code bytes]` and the scales' bits `[..]` (u16 for bf16
    /// scales, s32 for f32). Only same-width bitcasts, shifts and
    /// truncating converts: backends compile no width-changing
    /// bitcast-convert this late.
    pub(super) fn wire(&mut self, message: &Message) -> Vec<Value> {
        if self.plan().config.wire == Wire::Split {
            let bits = match &message.bits {
                Some(bits) => bits.clone(),
                None => self.scale_bits(&message.scales),
            };
            return vec![message.codes.clone(), bits];
        }
        let lead = message.scales.dims().to_vec();
        let bits = self.b.bitcast_convert(&message.scales, PrimitiveType::S32);
        let width = self.plan().scale_type().bytes() as i64;
        let mut row = lead.clone();
        row.push(width);
        let spread = self.b.broadcast(&bits, &row, &lead_dims(&row));
        let shifts = self.byte_shifts(&row);
        let shifted = self.b.binary(Opcode::ShiftRightLogical, &spread, &shifts);
        let bytes = self.b.convert(&shifted, PrimitiveType::S8);
        vec![
            self.b
                .concatenate(&[message.codes.clone(), bytes], lead.len() as i64),
        ]
    }

    /// What a collective carries of an array of a message's wire form: the
    /// array itself, or, past XLA's fusion ([`Stage::Fused`], XLA:CPU's
    /// hook), its flat elements. XLA:CPU's code generator spends many times
    /// longer on a fused kernel whose minor dimension is a message's row
    /// (B + 2 bytes) than on one over flat bytes (36 two-shot psums: 3.1 s
    /// of compile against 1.2 s); XLA:TPU, which sees the module before its
    /// own fusion, wants the rows (flat views cost it relayouts).
    pub(super) fn on_wire(&mut self, wire: &Value) -> Value {
        match self.inputs.stage {
            Stage::Fused => {
                let n = shape::element_count(&wire.shape).unwrap_or(0) as i64;
                self.b.reshape(wire, &[n])
            }
            Stage::PreFusion | Stage::Tiled => wire.clone(),
        }
    }

    /// Each array of `wire` through a collective of its own, `send`, which
    /// carries what [`Self::on_wire`] makes of it and brings `ranks` times
    /// as many bytes back: what arrived, each array's first dimension
    /// `ranks` times as long.
    pub(super) fn carry(
        &mut self,
        wire: &[Value],
        ranks: i64,
        mut send: impl FnMut(&mut Self, &Value) -> Value,
    ) -> Vec<Value> {
        wire.iter()
            .map(|array| {
                let mut dims = array.dims().to_vec();
                dims[0] *= ranks;
                let sent = self.on_wire(array);
                let arrived = send(self, &sent);
                self.b.reshape(&arrived, &dims)
            })
            .collect()
    }

    /// The inverse of [`Self::wire`]. Packed, each scale byte widened and
    /// shifted into place, then or-ed with the others.
    ///
    /// Before a backend's tiling the bytes' columns are or-ed elementwise,
    /// so that the scales stay an elementwise function of the wire, which
    /// XLA fuses into the dequantize that broadcasts them: a reduction
    /// there is a kernel of its own on XLA:GPU and XLA:CPU (neither fuses a
    /// reduce into a consumer that broadcasts it back), one more per
    /// dequantize. Past XLA:TPU's fusion every op is a kernel anyway, and a
    /// reduction over the few bytes (the `or` reducer the stage has,
    /// `Reducers::add_to`) is the fewest ops.
    pub(super) fn unwire(&mut self, wire: &[Value]) -> Message {
        if let [codes, bits] = wire {
            return Message {
                codes: codes.clone(),
                scales: self.scale_of_bits(bits),
                bits: Some(bits.clone()),
                rows: None,
            };
        }
        let wire = &wire[0];
        let dims = wire.dims().to_vec();
        let k = dims.len() - 1;
        let width = self.plan().scale_type().bytes() as i64;
        let (mut codes_end, mut bytes_start) = (dims.clone(), vec![0; dims.len()]);
        (codes_end[k], bytes_start[k]) = (dims[k] - width, dims[k] - width);
        let codes = self.b.slice(wire, &vec![0; dims.len()], &codes_end);
        let bytes = self.b.slice(wire, &bytes_start, &dims);
        // Bytes as u8, so that widening them fills with zeros.
        let bytes = self.b.bitcast_convert(&bytes, PrimitiveType::U8);
        let unsigned = self.b.convert(&bytes, PrimitiveType::S32);
        let row = bytes.dims().to_vec();
        let shifts = self.byte_shifts(&row);
        let placed = self.b.binary(Opcode::ShiftLeft, &unsigned, &shifts);
        let lead = &dims[..k];
        let bits = match self.inputs.or_s32 {
            Some(or) => {
                let zero = self.s32c(0);
                self.b.reduce(&placed, &zero, &[k as i64], or)
            }
            None => {
                let columns: Vec<Value> = (0..width)
                    .map(|c| {
                        let (mut start, mut end) = (vec![0; row.len()], row.clone());
                        (start[k], end[k]) = (c, c + 1);
                        self.b.slice(&placed, &start, &end)
                    })
                    .collect();
                let ored = columns[1..].iter().fold(columns[0].clone(), |acc, c| {
                    self.b.binary(Opcode::Or, &acc, c)
                });
                self.b.reshape(&ored, lead)
            }
        };
        let scales = self.b.bitcast_convert(&bits, PrimitiveType::F32);
        Message {
            codes,
            scales,
            bits: None,
            rows: Some(wire.clone()),
        }
    }

    /// Whether the scales travel apart from their codes ([`Wire::Split`],
    /// XLA:TPU's form) into a module the compiler is still to fuse
    /// ([`Stage::PreFusion`]): there the forms that let libtpu fuse more
    /// are emitted, which past its fusion would be ops of their own.
    pub(super) fn split_before_fusion(&self) -> bool {
        self.plan().config.wire == Wire::Split && matches!(self.inputs.stage, Stage::PreFusion)
    }

    /// Scales (f32 `[..]`) as they travel apart from their codes: u16,
    /// the high half of their f32 bits, for bf16 scales; s32, all of
    /// them, for f32 ones.
    fn scale_bits(&mut self, scales: &Value) -> Value {
        let bits = self.b.bitcast_convert(scales, PrimitiveType::S32);
        match self.plan().scale_type() {
            ScaleType::F32 => bits,
            ScaleType::Bf16 => {
                let sixteen = self.splat(Const::S32(16), scales.dims());
                let high = self.b.binary(Opcode::ShiftRightLogical, &bits, &sixteen);
                self.b.convert(&high, PrimitiveType::U16)
            }
        }
    }

    /// The inverse of [`Self::scale_bits`].
    fn scale_of_bits(&mut self, bits: &Value) -> Value {
        let bits = match self.plan().scale_type() {
            ScaleType::F32 => bits.clone(),
            ScaleType::Bf16 => {
                let wide = self.b.convert(bits, PrimitiveType::S32);
                let sixteen = self.splat(Const::S32(16), bits.dims());
                self.b.binary(Opcode::ShiftLeft, &wide, &sixteen)
            }
        };
        self.b.bitcast_convert(&bits, PrimitiveType::F32)
    }

    /// The right shifts that bring each wire byte of a scale's f32 bits to
    /// the bottom, shaped `row` (`[.., width]`, s32): 0, 8, 16, 24 for f32
    /// scales; 16, 24 for bf16 ones (the high half of their f32 bits).
    fn byte_shifts(&mut self, row: &[i64]) -> Value {
        if let Some(v) = self.shifts.get(row) {
            return v.clone();
        }
        let width = row[row.len() - 1];
        let first = match self.plan().scale_type() {
            ScaleType::F32 => 0,
            ScaleType::Bf16 => 16,
        };
        let vector = match &self.shift_amounts {
            Some(v) => v.clone(),
            None => {
                let amounts: Vec<i32> = (0..width).map(|k| (first + 8 * k) as i32).collect();
                let v = self.s32_vector(&amounts);
                self.shift_amounts = Some(v.clone());
                v
            }
        };
        let v = self.b.broadcast(&vector, row, &[row.len() as i64 - 1]);
        self.shifts.insert(row.to_vec(), v.clone());
        v
    }

    /// s8 codes `[.., B]` in [-7, 7] → s8 `[.., B/2]`, two to a byte: code
    /// 2k in the low nibble, code 2k+1 in the high one.
    pub(super) fn pack_int4(&mut self, codes: &Value) -> Value {
        let mut half = codes.dims().to_vec();
        if let Some(last) = half.last_mut() {
            *last /= 2;
        }
        let mut pairs = half.clone();
        pairs.push(2);
        let view = self.b.reshape(codes, &pairs);
        let k = pairs.len() - 1;
        let (mut low_end, mut high_start) = (pairs.clone(), vec![0; pairs.len()]);
        (low_end[k], high_start[k]) = (1, 1);
        let low = self.b.slice(&view, &vec![0; pairs.len()], &low_end);
        let high = self.b.slice(&view, &high_start, &pairs);
        let mask = self.splat(Const::S8(0x0f), &low_end);
        let four = self.splat(Const::S8(4), &low_end);
        let low = self.b.binary(Opcode::And, &low, &mask);
        let high = self.b.binary(Opcode::ShiftLeft, &high, &four);
        let byte = self.b.binary(Opcode::Or, &low, &high);
        self.b.reshape(&byte, &half)
    }

    /// The inverse of [`Self::pack_int4`]: s8 `[.., B/2]` → s8 `[.., B]`,
    /// each nibble sign-extended by arithmetic shifts.
    pub(super) fn unpack_int4(&mut self, bytes: &Value) -> Value {
        let dims = bytes.dims().to_vec();
        let four = self.splat(Const::S8(4), &dims);
        let up = self.b.binary(Opcode::ShiftLeft, bytes, &four);
        let low = self.b.binary(Opcode::ShiftRightArithmetic, &up, &four);
        let high = self.b.binary(Opcode::ShiftRightArithmetic, bytes, &four);
        let mut pair = dims.clone();
        pair.push(1);
        let low = self.b.reshape(&low, &pair);
        let high = self.b.reshape(&high, &pair);
        let pairs = self.b.concatenate(&[low, high], dims.len() as i64);
        let mut whole = dims;
        if let Some(last) = whole.last_mut() {
            *last *= 2;
        }
        self.b.reshape(&pairs, &whole)
    }

    /// The codes of a message (s8 `[nb, code bytes]`) as the f32 values
    /// they stand for.
    pub(super) fn code_values(&mut self, codes: &Value) -> Value {
        let format = self.plan().config.format;
        match float_type(format) {
            None if format.packs_two_per_byte() => {
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

    /// A message (codes `[.., code bytes]`, scales `[..]`) → f32 `[.., B]`
    /// values.
    pub(super) fn dequantize(&mut self, message: &Message) -> Value {
        let codes = self.code_values(&message.codes);
        let dims = codes.dims().to_vec();
        let scale = self.spread_scales(message, &dims);
        self.b.multiply(&codes, &scale)
    }

    /// A message's scales spread over its blocks (f32 `dims`, `[.., B]`).
    /// Past XLA:TPU's fusion with the scales apart on the wire, their bits
    /// are spread and decoded there, elementwise at the blocks' shape: the
    /// decode then joins the dequantize's fusion (the spread reads a
    /// fusion parameter, `outline-fusions`), where decoded before the
    /// spread it was a kernel of its own, one a dequantize. The same
    /// values either way.
    fn spread_scales(&mut self, message: &Message, dims: &[i64]) -> Value {
        match &message.bits {
            Some(bits) if self.b.tiled_for_tpu() => {
                let spread = self.b.broadcast(bits, dims, &lead_dims(dims));
                self.scale_of_bits(&spread)
            }
            _ => self.b.broadcast(&message.scales, dims, &lead_dims(dims)),
        }
    }

    /// Messages of rotated blocks → the values rotated back:
    /// `(H·q)·(scale/√B)`; the integer sums `H·q` are exact in f32, and in
    /// s32, where int8 codes go into the product as they are
    /// ([`Self::sums_codes_narrow`]; their widening is then of the sums, in
    /// the dequantize's fusion, and the norm a multiply by a power of two,
    /// exact).
    pub(super) fn dequantize_rotated(&mut self, message: &Message) -> Value {
        let format = self.plan().config.format;
        let integer_codes = float_type(format).is_none() && !format.packs_two_per_byte();
        let narrow = self.sums_codes_narrow() && integer_codes;
        let codes = if narrow {
            message.codes.clone()
        } else {
            self.code_values(&message.codes)
        };
        let dims = codes.dims().to_vec();
        let lead = dims[..dims.len() - 1].to_vec();
        let bl = self.plan().block();
        let ty = PrimitiveType::try_from(codes.element_type()).unwrap_or(PrimitiveType::F32);
        // The product over the blocks as rows of a matrix: XLA:GPU's dot
        // emitter takes one non-contracting dimension a side. Past
        // XLA:CPU's fusion the product reads the message's rows whole and
        // slices the codes inside its YNNPACK fusion, which reads them in
        // place: sliced outside, they were a copy of their own; read whole
        // against zero rows for the scale's bytes, YNNPACK's int8 kernels
        // ran over B + 2 columns instead of B.
        let row_bytes = bl as i64 + self.plan().scale_type().bytes() as i64;
        let whole = message.rows.as_ref().filter(|wire| {
            narrow
                && self.ynn_products()
                && dims.last() == Some(&(bl as i64))
                && wire.dims().last() == Some(&row_bytes)
        });
        let (rows, h) = match whole {
            Some(wire) => {
                let n = shape::element_count(&wire.shape).unwrap_or(0) as i64;
                let rows = self.b.reshape(wire, &[n / row_bytes, row_bytes]);
                (rows, self.hadamard(PrimitiveType::S8))
            }
            None => (self.blocks(&codes), self.hadamard(ty)),
        };
        let turned = self.product(&rows, &h, Precision::Default);
        let mut turned = self.b.reshape(&turned, &dims);
        if narrow {
            turned = self.b.convert(&turned, PrimitiveType::F32);
            if self.norm_folded() {
                let norm = self.splat(Const::F32(hadamard_norm(bl).to_bits()), &dims);
                turned = self.b.multiply(&turned, &norm);
            }
        }
        // The norm scales the scale, or is in the matrix (or the sums)
        // already.
        let scale = if self.norm_folded() {
            self.spread_scales(message, &dims)
        } else {
            let norm = self.splat(Const::F32(hadamard_norm(bl).to_bits()), &lead);
            let scale = self.b.multiply(&message.scales, &norm);
            self.b.broadcast(&scale, &dims, &lead_dims(&dims))
        };
        self.b.multiply(&turned, &scale)
    }
}

/// The dimensions of `dims` but its last, in order: how a value per block
/// broadcasts over its block.
fn lead_dims(dims: &[i64]) -> Vec<i64> {
    (0..dims.len() as i64 - 1).collect()
}
