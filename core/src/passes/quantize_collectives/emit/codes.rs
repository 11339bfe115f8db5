//! The code formats: blocks quantized into a [`Message`] (their codes and
//! their scales) and a message dequantized, for int8, fp8 (e4m3, e5m2) and
//! int4 (two codes to a byte). The arithmetic is the contract of
//! [`crate::numerics`], op for op.

use super::{Const, Emitter, Message, float_type};
use crate::ir::builder::Value;
use crate::ir::opcode::Opcode;
use crate::ir::shape;
use crate::numerics::{absmax_floor, hadamard_norm, inv_qmax, scale_mantissa_bits};
use crate::passes::Stage;
use crate::plan::ScaleType;
use crate::proto::PrimitiveType;
use crate::proto::precision_config::Precision;

impl Emitter<'_, '_, '_> {
    /// f32 `[nb, B]` blocks → their [`Message`].
    pub(super) fn quantize(&mut self, blocks: &Value) -> Message {
        let largest = self.largest(blocks);
        self.quantize_with(blocks, &largest)
    }

    /// The largest bits of |x| per block of f32 `[nb, B]` blocks, s32
    /// `[nb]`, from the floor: what [`Self::quantize_with`] makes the
    /// scale of.
    pub(super) fn largest(&mut self, blocks: &Value) -> Value {
        let (nb, bl) = (self.dim(blocks, 0), self.dim(blocks, 1));
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
        let mask = self.splat(Const::S32(0x7fff_ffff), &[nb, bl]);
        let magnitude = self.b.binary(Opcode::And, &bits, &mask);
        self.b.reduce(&magnitude, &floor, &[1], self.inputs.max_s32)
    }

    /// f32 `[nb, B]` blocks and their [`Self::largest`] bits → their
    /// [`Message`].
    pub(super) fn quantize_with(&mut self, blocks: &Value, largest: &Value) -> Message {
        let nb = self.dim(blocks, 0);
        let bl = self.plan().block() as i64;
        let format = self.plan().config.format;
        // The largest bits capped at +Inf's: the absmax.
        let inf = self.splat(Const::S32(f32::INFINITY.to_bits() as i32), &[nb]);
        let capped = self.b.binary(Opcode::Minimum, largest, &inf);
        let absmax = self.b.bitcast_convert(&capped, PrimitiveType::F32);
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
        // Bounds shaped like the ratio, never scalars: XLA:GPU's
        // ReshapeMover (jaxlib 0.10.2) sinks a reshape through a clamp by
        // reshaping every operand, and a scalar bound there is a CHECK
        // failure that aborts the user's process.
        // The lower bound is the upper one negated (exact): one constant and
        // one broadcast fewer, which keeps the worst rewrite within its
        // instruction budget (tests/pass_contract.rs).
        let hi = self.splat(Const::F32(format.qmax().to_bits()), &[nb, bl]);
        let lo = self.b.unary(Opcode::Negate, &hi);
        let codes = match float_type(format) {
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
        };
        Message {
            codes,
            scales: scale,
        }
    }

    /// A message as the one s8 array that travels, `[nb, code bytes +
    /// scale bytes]`: a block's codes, then its scale's bits, little-endian,
    /// in its own row. One collective per step carries it (a collective
    /// per array made 1.4× the thunks of XLA:CPU's entry computation, which
    /// it schedules pairwise). Only same-width
    /// bitcasts, shifts and truncating converts: backends compile no
    /// width-changing bitcast-convert this late.
    pub(super) fn wire(&mut self, message: &Message) -> Value {
        let nb = self.dim(&message.codes, 0);
        let width = self.plan().scale_type().bytes() as i64;
        let bits = self.b.bitcast_convert(&message.scales, PrimitiveType::S32);
        let spread = self.b.broadcast(&bits, &[nb, width], &[0]);
        let shifts = self.byte_shifts(nb, width);
        let shifted = self.b.binary(Opcode::ShiftRightLogical, &spread, &shifts);
        let bytes = self.b.convert(&shifted, PrimitiveType::S8);
        self.b.concatenate(&[message.codes.clone(), bytes], 1)
    }

    /// What a collective carries of a message's wire form (`[n, bytes]`): the
    /// array itself, or, past XLA's fusion ([`Stage::Fused`], XLA:CPU's
    /// hook), its flat bytes. XLA:CPU's code generator spends many times
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

    /// `wire` (`[rows, bytes]`) through the one collective `send`, which
    /// carries what [`Self::on_wire`] makes of it and brings `ranks` times
    /// as many bytes back: what arrived, `[ranks·rows, bytes]`.
    pub(super) fn carry(
        &mut self,
        wire: &Value,
        ranks: i64,
        send: impl FnOnce(&mut Self, &Value) -> Value,
    ) -> Value {
        let (rows, width) = (self.dim(wire, 0), self.dim(wire, 1));
        let sent = self.on_wire(wire);
        let arrived = send(self, &sent);
        self.b.reshape(&arrived, &[ranks * rows, width])
    }

    /// The inverse of [`Self::wire`]: each scale byte widened and shifted
    /// into place, then or-ed with the others.
    ///
    /// Before a backend's tiling the bytes' columns are or-ed elementwise,
    /// so that the scales stay an elementwise function of the wire, which
    /// XLA fuses into the dequantize that broadcasts them: a reduction
    /// there is a kernel of its own on XLA:GPU and XLA:CPU (neither fuses a
    /// reduce into a consumer that broadcasts it back), one more per
    /// dequantize. Past XLA:TPU's fusion every op is a kernel anyway, and a
    /// reduction over the few bytes (the `or` reducer the stage has,
    /// `Reducers::add_to`) is the fewest ops.
    pub(super) fn unwire(&mut self, wire: &Value) -> Message {
        let (nb, all) = (self.dim(wire, 0), self.dim(wire, 1));
        let width = self.plan().scale_type().bytes() as i64;
        let codes = self.b.slice(wire, &[0, 0], &[nb, all - width]);
        let bytes = self.b.slice(wire, &[0, all - width], &[nb, all]);
        // Bytes as u8, so that widening them fills with zeros.
        let bytes = self.b.bitcast_convert(&bytes, PrimitiveType::U8);
        let unsigned = self.b.convert(&bytes, PrimitiveType::S32);
        let shifts = self.byte_shifts(nb, width);
        let placed = self.b.binary(Opcode::ShiftLeft, &unsigned, &shifts);
        let bits = match self.inputs.or_s32 {
            Some(or) => {
                let zero = self.s32c(0);
                self.b.reduce(&placed, &zero, &[1], or)
            }
            None => {
                let columns: Vec<Value> = (0..width)
                    .map(|k| self.b.slice(&placed, &[0, k], &[nb, k + 1]))
                    .collect();
                let ored = columns[1..].iter().fold(columns[0].clone(), |acc, c| {
                    self.b.binary(Opcode::Or, &acc, c)
                });
                self.b.reshape(&ored, &[nb])
            }
        };
        let scales = self.b.bitcast_convert(&bits, PrimitiveType::F32);
        Message { codes, scales }
    }

    /// The right shifts that bring each wire byte of a scale's f32 bits to
    /// the bottom, `[nb, width]` s32: 0, 8, 16, 24 for f32 scales; 16, 24
    /// for bf16 ones (the high half of their f32 bits).
    fn byte_shifts(&mut self, nb: i64, width: i64) -> Value {
        if let Some(v) = self.shifts.get(&(nb, width)) {
            return v.clone();
        }
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
        let v = self.b.broadcast(&vector, &[nb, width], &[1]);
        self.shifts.insert((nb, width), v.clone());
        v
    }

    /// s8 `[nb, B]` codes in [-7, 7] → s8 `[nb, B/2]`, two to a byte: code
    /// 2k in the low nibble, code 2k+1 in the high one.
    pub(super) fn pack_int4(&mut self, codes: &Value) -> Value {
        let (nb, bl) = (self.dim(codes, 0), self.dim(codes, 1));
        let pairs = self.b.reshape(codes, &[nb, bl / 2, 2]);
        let low = self.b.slice(&pairs, &[0, 0, 0], &[nb, bl / 2, 1]);
        let high = self.b.slice(&pairs, &[0, 0, 1], &[nb, bl / 2, 2]);
        let mask = self.splat(Const::S8(0x0f), &[nb, bl / 2, 1]);
        let four = self.splat(Const::S8(4), &[nb, bl / 2, 1]);
        let low = self.b.binary(Opcode::And, &low, &mask);
        let high = self.b.binary(Opcode::ShiftLeft, &high, &four);
        let byte = self.b.binary(Opcode::Or, &low, &high);
        self.b.reshape(&byte, &[nb, bl / 2])
    }

    /// The inverse of [`Self::pack_int4`]: s8 `[nb, B/2]` → s8 `[nb, B]`,
    /// each nibble sign-extended by arithmetic shifts.
    pub(super) fn unpack_int4(&mut self, bytes: &Value) -> Value {
        let (nb, half) = (self.dim(bytes, 0), self.dim(bytes, 1));
        let four = self.splat(Const::S8(4), &[nb, half]);
        let up = self.b.binary(Opcode::ShiftLeft, bytes, &four);
        let low = self.b.binary(Opcode::ShiftRightArithmetic, &up, &four);
        let high = self.b.binary(Opcode::ShiftRightArithmetic, bytes, &four);
        let low = self.b.reshape(&low, &[nb, half, 1]);
        let high = self.b.reshape(&high, &[nb, half, 1]);
        let pairs = self.b.concatenate(&[low, high], 2);
        self.b.reshape(&pairs, &[nb, 2 * half])
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

    /// A message → f32 `[nb, B]` values.
    pub(super) fn dequantize(&mut self, message: &Message) -> Value {
        let (nb, bl) = (self.dim(&message.codes, 0), self.plan().block() as i64);
        let codes = self.code_values(&message.codes);
        let scale = self.b.broadcast(&message.scales, &[nb, bl], &[0]);
        self.b.multiply(&codes, &scale)
    }

    /// Messages of rotated blocks → the values rotated back:
    /// `(H·q)·(scale/√B)`; the integer sums `H·q` are exact in f32.
    pub(super) fn dequantize_rotated(&mut self, message: &Message) -> Value {
        let (nb, bl) = (self.dim(&message.codes, 0), self.plan().block() as i64);
        let codes = self.code_values(&message.codes);
        let scale = message.scales.clone();
        let h = self.hadamard();
        let turned = self.b.dot(&codes, &h, 1, 0, Precision::Default);
        // The norm scales the scale, or is in the matrix already.
        let scale = if self.norm_folded() {
            scale
        } else {
            let norm = self.splat(Const::F32(hadamard_norm(bl as usize).to_bits()), &[nb]);
            self.b.multiply(&scale, &norm)
        };
        let scale = self.b.broadcast(&scale, &[nb, bl], &[0]);
        self.b.multiply(&turned, &scale)
    }
}
