//! Two-shot's exchange and the all-to-all of rows: every row quantized
//! once and sent to the rank it belongs to by one all-to-all; the
//! exchange's owner sums what arrives in f32.

use super::{Emitter, Message, Scales};
use crate::ir::builder::Value;
use crate::ir::opcode::Opcode;
use crate::passes::Stage;
use crate::plan::{Axis, Rotation, Wire};

/// The most ranks whose parts an exchange dequantizes one by one before
/// XLA:TPU's fusion ([`Emitter::exchange`]): a host's chips (v5e:2x4), and
/// a rewrite within its instruction budget at any group size
/// (`tests/pass_contract.rs`).
const MAX_PARTS_APART: i64 = 8;

impl Emitter<'_, '_, '_> {
    /// Reduce-scatter over the whole group by one all-to-all: every slice
    /// quantized once, the owner's sum of the dequantized slices. `held` is
    /// `[P, c/B, B]`; returns f32 `[c/B, B]`.
    ///
    /// The sum is adds of halves (`numerics::simulate::pairwise_sum`), not
    /// a `reduce`: a reduce's order is the backend's (XLA:CPU hands large
    /// ones to YNNPACK, which reassociates), and where the codes' sums are
    /// not exact (fp8's, f32 scales') the result would then hang on it; the
    /// adds fix the order the simulator follows on every backend.
    ///
    /// Where the compiler fuses what follows and the scales travel apart
    /// (XLA:TPU before its fusion, [`Self::split_before_fusion`]), each
    /// rank's part is unwired and dequantized from its own rows of what
    /// arrived, so the sum is an elementwise function of the wire, and
    /// libtpu fuses the dequantize, every add and the next quantize's
    /// block maxima into one kernel, where the dequantized message was a
    /// kernel and its view for the adds a relayout (BENCHMARKS.md, "The
    /// exchange's sum from the wire's rows on XLA:TPU"). That costs about
    /// 9 instructions a rank, so it is done up to [`MAX_PARTS_APART`]
    /// ranks. Elsewhere the halves are slices of the one dequantized
    /// message: about 3·log₂P instructions, where every op is a kernel
    /// past fusion.
    pub(super) fn exchange(&mut self, held: &Value, axes: &[Axis], axis: Axis) -> Value {
        debug_assert!(axes.len() == 1 && axis.size == self.plan().group_size);
        let [p, nb, bl] = self.rows_dims();
        if self.sums_parts_apart(p) {
            let arrived = self.send_rows_wire(held);
            let mut parts: Vec<Value> = (0..p)
                .map(|k| {
                    let rows: Vec<Value> = arrived
                        .iter()
                        .map(|array| self.major_rows(array, k, k + 1))
                        .collect();
                    let message = self.unwire(&rows);
                    self.dequantize(&message)
                })
                .collect();
            // Halves added, the odd one out carried: the order below.
            while parts.len() > 1 {
                let h = parts.len() / 2;
                let mut sums: Vec<Value> = (0..h)
                    .map(|k| self.b.binary(Opcode::Add, &parts[k], &parts[k + h]))
                    .collect();
                sums.extend(parts.get(2 * h).cloned());
                parts = sums;
            }
            return self.b.reshape(&parts[0], &[nb, bl]);
        }
        let received = self.send_rows(held);
        // Rank k's part is [k] of [P, nb, B]: the halves are runs along the
        // major dimension, which no backend's tiling splits.
        let rows = self.dequantize(&received);
        let mut rows = self.b.reshape(&rows, &[p, nb, bl]);
        let mut n = p;
        while n > 1 {
            let h = n / 2;
            let left = self.major_rows(&rows, 0, h);
            let right = self.major_rows(&rows, h, 2 * h);
            let mut sum = self.b.binary(Opcode::Add, &left, &right);
            if n % 2 == 1 {
                let carry = self.major_rows(&rows, 2 * h, n);
                sum = self.b.concatenate(&[sum, carry], 0);
            }
            rows = sum;
            n = h + n % 2;
        }
        self.b.reshape(&rows, &[nb, bl])
    }

    /// Whether an exchange over `p` ranks sums each rank's part from its
    /// own rows of the wire ([`Self::exchange`]).
    pub(super) fn sums_parts_apart(&self, p: i64) -> bool {
        self.split_before_fusion() && p <= MAX_PARTS_APART
    }

    /// Rows `from..to` of `array` along its major dimension.
    pub(super) fn major_rows(&mut self, array: &Value, from: i64, to: i64) -> Value {
        let dims = array.dims().to_vec();
        let (mut starts, mut limits) = (vec![0; dims.len()], dims);
        (starts[0], limits[0]) = (from, to);
        self.b.slice(array, &starts, &limits)
    }

    /// The dimensions of the rows an all-to-all of blocks moves: `[P,
    /// c/B, B]`, part k for rank k.
    fn rows_dims(&self) -> [i64; 3] {
        let plan = self.plan();
        let bl = plan.block() as i64;
        [plan.group_size as i64, plan.chunk as i64 / bl, bl]
    }

    /// Every row of `held` (`[P, c/B, B]`) quantized once, row k sent to
    /// rank k; returns what arrives, row k from rank k: the message of
    /// `[P, c/B]` blocks.
    pub(super) fn send_rows(&mut self, held: &Value) -> Message {
        let arrived = self.send_rows_wire(held);
        self.unwire(&arrived)
    }

    /// [`Self::send_rows`]'s arrays as they arrive, before they are
    /// unwired: each `[P, ..]`, part k from rank k.
    fn send_rows_wire(&mut self, held: &Value) -> Vec<Value> {
        let [p, nb, bl] = self.rows_dims();
        // Codes and scales apart (XLA:TPU), the blocks are viewed `[P,
        // nb/128, 128, B]`: the scales come out of their reduce as `[P,
        // nb/128, 128]`, the rank over 2 libtpu's all-to-all takes, in the
        // layout the reduce gave them, where a reshape of `[P, nb]` to it
        // was a relayout kernel (one an op; BENCHMARKS.md, "The exchange's
        // blocks in rows of 128 on XLA:TPU").
        let view = if self.plan().config.wire == Wire::Split && nb % 128 == 0 {
            vec![p, nb / 128, 128, bl]
        } else {
            vec![p, nb, bl]
        };
        let blocks = self.b.reshape(held, &view);
        let blocks = self.f32(&blocks);
        if self.inputs.stage == Stage::Fused && self.inputs.outlined {
            return self.send_parts(&blocks, p);
        }
        let message = self.quantize(&blocks);
        let wire = self.wire(&message);
        self.carry(&wire, 1, |e, sent| e.all_to_all_rows(sent, p))
    }

    /// Past XLA's fusion (XLA:CPU's hook), equarx's ops outlined into
    /// fusions: `blocks` (`[P, ..]`) quantized part by part, part k sent
    /// to rank k as the tuple all-to-all XLA:CPU runs, each part's wire
    /// flat; what arrives, as [`Self::send_rows_wire`].
    /// The blocks' largest bits and the scales' reciprocals are made once
    /// for every part; each part's codes and wire are computed from its
    /// run of the blocks, of the reciprocals and of the largest bits (its
    /// scales' cheap chain again), so that `outline-fusions` makes each
    /// part a fusion of its own, where the message was written whole and
    /// each part then copied out by a slice. A bare slice is an op XLA:CPU
    /// compiles anew for every rewritten op, where it compiles a fusion
    /// once for all the fusions like it in a module; the parts' fusions
    /// are alike, their runs dynamic slices at a row passed in (Gemma 3
    /// 270M's 36 two-shot psums: 83 kernels to compile where there were
    /// 227, the original's own 75 among them).
    fn send_parts(&mut self, blocks: &Value, p: i64) -> Vec<Value> {
        let largest = self.largest(blocks);
        let Scales { recip, bits, .. } = self.scales_of(&largest);
        let zero = self.b.s32_scalar(0);
        let parts: Vec<Vec<Value>> = (0..p)
            .map(|k| {
                // Dynamic slices at a constant row, which `outline-fusions`
                // passes in: the P parts' fusions are alike, one kernel for
                // XLA:CPU to compile, where static slices made P. The rows
                // are constants of their own, not the emitter's shared ones
                // (`s32c`): a shared one that anything else reads would be
                // copied into the fusion, and the parts would differ again.
                let at = self.b.s32_scalar(k as i32);
                let mut row = |x: &Value| {
                    let mut sizes = x.dims().to_vec();
                    sizes[0] = 1;
                    let mut starts = vec![zero.clone(); sizes.len()];
                    starts[0] = at.clone();
                    self.b.dynamic_slice(x, &starts, &sizes)
                };
                let blocks = row(blocks);
                let recip = row(&recip);
                let largest = row(&largest);
                let bits = bits.as_ref().map(&mut row);
                let message = Message {
                    codes: self.codes_of(&blocks, &recip),
                    scales: self.scale_of(&largest),
                    bits,
                    rows: None,
                };
                self.wire(&message)
            })
            .collect();
        (0..parts[0].len())
            .map(|j| {
                let mut dims = parts[0][j].dims().to_vec();
                dims[0] *= p;
                let pieces: Vec<Value> = parts.iter().map(|w| self.on_wire(&w[j])).collect();
                let got = self.all_to_all_pieces(&pieces);
                self.b.reshape(&got, &dims)
            })
            .collect()
    }

    /// `pieces[k]` sent to group member k as one tuple all-to-all: what
    /// arrives, piece k from rank k, concatenated along the first
    /// dimension.
    fn all_to_all_pieces(&mut self, pieces: &[Value]) -> Value {
        let channel = self.channel();
        let groups = self.inputs.participants.groups.clone();
        let sent = self.b.all_to_all_tuple(pieces, &groups, channel);
        let got: Vec<Value> = (0..pieces.len())
            .map(|k| self.b.get_tuple_element(&sent, k as i64))
            .collect();
        self.b.concatenate(&got, 0)
    }

    /// `array`'s P equal parts along its first dimension (`[P, ..]`, or
    /// flat), part k sent to rank k: what arrives, in `array`'s shape, part
    /// k from rank k.
    fn all_to_all_rows(&mut self, array: &Value, p: i64) -> Value {
        let dims = array.dims().to_vec();
        let rows = dims[0] / p;
        // Tiled for XLA:TPU, an array of rank over 2 goes as it is, split
        // along its major dimension: libtpu's own form, with no slices to
        // send and no concatenate to receive (untiled, the emission that
        // falls back from tiles libtpu is not known to take, its emitter
        // refuses it: `all_to_all_emitter.cc`).
        let array_form = self.b.tiled_for_tpu() && dims.len() >= 3;
        if !array_form && matches!(self.inputs.stage, Stage::Fused | Stage::Tiled) {
            // XLA:CPU decomposes array all-to-alls into the tuple form early
            // in its pipeline and runs only that form; past that point the
            // parts are sent as a tuple, each a run of the array's rows. So
            // does XLA:TPU's emission where it is untiled, or of rank 2.
            let pieces: Vec<Value> = (0..p)
                .map(|k| self.major_rows(array, k * rows, (k + 1) * rows))
                .collect();
            return self.all_to_all_pieces(&pieces);
        }
        let channel = self.channel();
        let groups = self.inputs.participants.groups.clone();
        if array_form {
            return self.b.all_to_all(array, 0, &groups, channel);
        }
        // Before fusion (XLA:GPU's hook, the door before XLA): the array
        // form, split along the major dimension, which XLA lays out and
        // runs without decomposing it first (the hook comes after XLA's
        // all-to-all decomposer), the blocks' rows kept. XLA:TPU runs no
        // array all-to-all of rank 2: a message's scales (`[P, n]`) travel
        // as `[P, n/128, 128]`, rows of its lanes, or as `[P, 1, n]`.
        let view = match dims[..] {
            [_, n] if n % 128 == 0 => vec![p, n / 128, 128],
            [_, n] => vec![p, 1, n],
            _ => dims.clone(),
        };
        let view = self.b.reshape(array, &view);
        let got = self.b.all_to_all(&view, 0, &groups, channel);
        self.b.reshape(&got, &dims)
    }

    /// The all-to-all of the rows of `held` (`[P, c/B, B]`), dequantized
    /// (and rotated back): f32 `[P·c/B, B]`, row k from rank k.
    pub(super) fn scatter(&mut self, held: &Value) -> Value {
        let received = self.send_rows(held);
        let rows = match self.plan().config.rotation {
            Rotation::Hadamard => self.dequantize_rotated(&received),
            Rotation::None => self.dequantize(&received),
        };
        self.b.reshape(&rows, &self.rows_dims())
    }
}
