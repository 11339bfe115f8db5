//! The gather: the owned chunk quantized once and brought to every rank,
//! by one all-gather or by P−1 relays round the ring; every rank, the owner
//! included, dequantizes the same codes.

use super::Emitter;
use crate::ir::builder::Value;
use crate::passes::quantize_collectives::groups::IdSpace;
use crate::plan::{Axis, Form, GatherForm, Rotation};
use crate::proto::PrimitiveType;

impl Emitter<'_, '_, '_> {
    /// The owned chunk (f32 `[c/B, B]`) quantized once; every rank, the
    /// owner included, dequantizes all P chunks from the same codes, so
    /// every participant ends with bit-identical results. Returns f32
    /// `[P·c/B, B]`. `largest`: the owned blocks' [`Self::largest`] bits,
    /// where the phase before made them.
    ///
    /// `from_parts`: the owned chunk is the sum of an exchange that summed
    /// each rank's part apart ([`Self::sums_parts_apart`]).
    pub(super) fn gather(
        &mut self,
        owned: &Value,
        largest: Option<Value>,
        rank: &Value,
        from_parts: bool,
    ) -> Value {
        let plan = self.plan();
        let p = plan.group_size as i64;
        let blocks = self.blocks(owned);
        let [nb, bl] = [blocks.dims()[0], blocks.dims()[1]];
        // After an exchange that summed its parts apart, an all-gather's
        // blocks are viewed `[nb/128, 128, B]`, the view that sum comes
        // from: the owned blocks then need no relayout to `[nb, B]`
        // (BENCHMARKS.md, "The gather's blocks in rows of 128 on XLA:TPU").
        // After a ring the view would cost relayouts instead. Past XLA:TPU's
        // tiling the view is a bitcast of the owned blocks, and the scales
        // as rows of 128 spread along their blocks inside the codes' and
        // the dequantize's fusions, where a vector's spread is a kernel of
        // its own (`outline_fusions`).
        let tiled = self.b.tiled_for_tpu();
        let view =
            ((from_parts || tiled) && nb % 128 == 0 && plan.config.gather == GatherForm::AllGather)
                .then_some([nb / 128, 128]);
        let blocks = match view {
            Some([rows, lanes]) => self.b.reshape(&blocks, &[rows, lanes, bl]),
            None => blocks,
        };
        let blocks = self.f32(&blocks);
        let message = match largest {
            Some(largest) => {
                let largest = match view {
                    Some(lead) => self.b.reshape(&largest, &lead),
                    None => largest,
                };
                self.quantize_with(&blocks, &largest)
            }
            None => self.quantize(&blocks),
        };
        let wire = self.wire(&message);
        let all = match plan.config.gather {
            // Gathered along its blocks: `[P·nb, ..]` in rank order.
            GatherForm::AllGather => {
                let parts = self.inputs.participants;
                let groups = parts.groups.clone();
                let partitions = parts.space == IdSpace::Partition;
                self.carry(&wire, p, |e, sent| {
                    let channel = e.channel();
                    e.b.all_gather(sent, 0, &groups, channel, partitions)
                })
            }
            GatherForm::Permute => self.relay(&wire, rank),
        };
        let all = self.unwire(&all);
        let all = match plan.config.rotation {
            Rotation::Hadamard => self.dequantize_rotated(&all),
            Rotation::None => self.dequantize(&all),
        };
        self.b.reshape(&all, &[p * nb, bl])
    }

    /// Every rank's message (each array `[nb, ..]`), stacked in rank order
    /// (`[P·nb, ..]`), by P−1 relays round the ring; with two
    /// directions, the first half of the blocks travels one way and the rest
    /// the other.
    fn relay(&mut self, wire: &[Value], rank: &Value) -> Vec<Value> {
        let plan = self.plan();
        let p = plan.group_size as i64;
        let nb = self.dim(&wire[0], 0);
        let halves: Vec<(i64, i64, i64)> = match plan.relay_directions()[..] {
            [first, second] => vec![(first, 0, nb / 2), (second, nb / 2, nb)],
            [first, ..] => vec![(first, 0, nb)],
            [] => vec![(1, 0, nb)],
        };
        // A stream per direction and array: its direction, its half and the
        // shape of its part as it travels ([`Self::on_wire`]: rows of
        // blocks, or flat bytes); in the state, the part travelling and the
        // rows so far (`[P, part..]`), stream after stream.
        let mut streams = Vec::new();
        let mut state = Vec::new();
        for (half, &(dir, lo, hi)) in halves.iter().enumerate() {
            for array in wire {
                let part = self.major_rows(array, lo, hi);
                let part = self.on_wire(&part);
                let mut dims = part.dims().to_vec();
                dims.insert(0, 1);
                let row = self.b.reshape(&part, &dims);
                let ty = PrimitiveType::try_from(part.element_type()).unwrap_or(PrimitiveType::S8);
                let zero = self.b.zero(ty);
                dims[0] = p;
                let empty = self.b.broadcast(&zero, &dims, &[]);
                let mut at = vec![self.s32c(0); dims.len()];
                at[0] = rank.clone();
                let rows = self.b.dynamic_update_slice(&empty, &row, &at);
                streams.push(Stream {
                    dir,
                    half,
                    part: part.dims().to_vec(),
                });
                state.extend([part, rows]);
            }
        }
        // The part that arrives at relay h = s+1 comes from rank
        // (r − dir·h) mod P.
        let out = match plan.config.form {
            Form::Unrolled => {
                for s in 0..p - 1 {
                    let from: Vec<Value> = (halves.iter())
                        .map(|&(dir, ..)| self.index(rank, p, dir, s + 1))
                        .collect();
                    state = self.relay_step(&streams, &from, false, &state);
                }
                state
            }
            Form::Loop => {
                // State: the streams' (part, rows).., each half's index of
                // the rank the relay before heard from (the device's own
                // rank before the first).
                let n = state.len();
                state.extend(halves.iter().map(|_| rank.clone()));
                let mut out = self.repeat("relay", p - 1, &state, |e, state| {
                    let from: Vec<Value> = (state[n..].iter().zip(&halves))
                        .map(|(index, &(dir, ..))| e.next_index(index, p, dir))
                        .collect();
                    let mut next = e.relay_step(&streams, &from, true, &state[..n]);
                    next.extend(from);
                    next
                });
                out.truncate(n);
                out
            }
        };
        // Per array, the directions' rows side by side (each rank's blocks
        // in order), then rank after rank.
        let rows: Vec<Value> = out.iter().skip(1).step_by(2).cloned().collect();
        wire.iter()
            .enumerate()
            .map(|(k, array)| {
                let mine: Vec<Value> = rows.iter().skip(k).step_by(wire.len()).cloned().collect();
                let all = match &mine[..] {
                    [one] => one.clone(),
                    _ => self.b.concatenate(&mine, 1),
                };
                let mut dims = array.dims().to_vec();
                dims[0] *= p;
                self.b.reshape(&all, &dims)
            })
            .collect()
    }

    /// One relay of every stream: pass the travelling part on, and file
    /// the one that arrives in its row, that of the rank its half's `from`
    /// names. In a loop (`in_loop`) the received part is copied.
    fn relay_step(
        &mut self,
        streams: &[Stream],
        from: &[Value],
        in_loop: bool,
        state: &[Value],
    ) -> Vec<Value> {
        let whole = Axis {
            size: self.plan().group_size,
            stride: 1,
        };
        let mut next = Vec::new();
        for (k, stream) in streams.iter().enumerate() {
            // The received part goes into the state in place of the one
            // sent: a copy, so the collective never writes the buffer it
            // reads.
            let travelling = self.permute(&state[2 * k], whole, stream.dir);
            let travelling = if in_loop {
                self.copy_unless_before_xla(&travelling)
            } else {
                travelling
            };
            let mut dims = stream.part.clone();
            dims.insert(0, 1);
            let row = self.b.reshape(&travelling, &dims);
            let mut at = vec![self.s32c(0); dims.len()];
            at[0] = from[stream.half].clone();
            let rows = self.b.dynamic_update_slice(&state[2 * k + 1], &row, &at);
            next.extend([travelling, rows]);
        }
        next
    }
}

/// One array of a message on its way round the relay: the direction it
/// travels, the half of the blocks it carries, its part's shape.
struct Stream {
    dir: i64,
    half: usize,
    part: Vec<i64>,
}
