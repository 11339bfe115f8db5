//! The gather: the owned chunk quantized once and brought to every rank,
//! by one all-gather or by P−1 relays round the ring; every rank, the owner
//! included, dequantizes the same codes.

use super::{Emitter, Message, Step};
use crate::ir::builder::Value;
use crate::passes::quantize_collectives::groups::IdSpace;
use crate::plan::{Axis, Form, GatherForm, Rotation};
use crate::proto::PrimitiveType;

impl Emitter<'_, '_, '_> {
    /// The owned chunk (f32 `[c/B, B]`) quantized once; every rank, the
    /// owner included, dequantizes all P chunks from the same codes, so
    /// every participant ends with bit-identical results. Returns f32
    /// `[P·c/B, B]`.
    pub(super) fn gather(&mut self, owned: &Value, rank: &Value) -> Value {
        let plan = self.plan();
        let blocks = self.blocks(owned);
        let blocks = self.f32(&blocks);
        let message = self.quantize(&blocks);
        let all = match plan.config.gather {
            // Each array gathered along its blocks: `[P·nb, ..]` in rank
            // order.
            GatherForm::AllGather => {
                let parts = self.inputs.participants;
                let groups = parts.groups.clone();
                message.map(|array| {
                    let (channel, global) = match parts.space {
                        IdSpace::Partition => (Some(self.b.fresh_channel_id()), true),
                        IdSpace::Replica => (None, false),
                    };
                    self.b.all_gather(array, 0, &groups, channel, global)
                })
            }
            GatherForm::Permute => self.relay(&message, rank),
        };
        match plan.config.rotation {
            Rotation::Hadamard => self.dequantize_rotated(&all),
            Rotation::None => self.dequantize(&all),
        }
    }

    /// Every rank's message, stacked in rank order (each array `[P·nb,
    /// ..]`), by P−1 relays round the ring; with two directions, the first
    /// half of the blocks travels one way and the rest the other.
    fn relay(&mut self, message: &Message, rank: &Value) -> Message {
        let plan = self.plan();
        let p = plan.group_size as i64;
        let nb = self.dim(&message.codes, 0);
        let halves: Vec<(i64, i64, i64)> = match plan.relay_directions()[..] {
            [first, second] => vec![(first, 0, nb / 2), (second, nb / 2, nb)],
            [first, ..] => vec![(first, 0, nb)],
            [] => vec![(1, 0, nb)],
        };
        // A stream per array and direction: its direction and the shape of
        // its part (blocks lo..hi of the array); in the state, the part
        // travelling and the rows so far (`[P, part..]`), stream after
        // stream.
        let mut streams = Vec::new();
        let mut state = Vec::new();
        for array in message.arrays() {
            let ty = PrimitiveType::try_from(array.element_type()).unwrap_or(PrimitiveType::S8);
            let dims = array.dims().to_vec();
            for &(dir, lo, hi) in &halves {
                let (mut starts, mut limits) = (vec![0; dims.len()], dims.clone());
                (starts[0], limits[0]) = (lo, hi);
                let part = self.b.slice(array, &starts, &limits);
                let mut row_dims = part.dims().to_vec();
                row_dims.insert(0, 1);
                let row = self.b.reshape(&part, &row_dims);
                let zero = self.b.zero(ty);
                row_dims[0] = p;
                let empty = self.b.broadcast(&zero, &row_dims, &[]);
                let mut at = vec![self.s32c(0); row_dims.len()];
                at[0] = rank.clone();
                let rows = self.b.dynamic_update_slice(&empty, &row, &at);
                streams.push((dir, part.dims().to_vec()));
                state.extend([part, rows]);
            }
        }
        let out = match plan.config.form {
            Form::Unrolled => {
                for s in 0..p - 1 {
                    state = self.relay_step(&streams, &Step::At(s), &state, rank);
                }
                state
            }
            Form::Loop => {
                let n = state.len();
                state.push(rank.clone());
                let mut out = self.repeat("relay", p - 1, &state, |e, s, state| {
                    let mut next = e.relay_step(&streams, &Step::Next(s), &state[..n], &state[n]);
                    next.push(state[n].clone());
                    next
                });
                out.truncate(n);
                out
            }
        };
        // Each array's rows: its directions' rows side by side, `[P, nb,
        // ..]`, then rank after rank.
        let rows: Vec<Value> = out.iter().skip(1).step_by(2).cloned().collect();
        let mut joined = message
            .arrays()
            .into_iter()
            .zip(rows.chunks(halves.len()))
            .map(|(array, rows)| {
                let all = if rows.len() == 1 {
                    rows[0].clone()
                } else {
                    self.b.concatenate(rows, 1)
                };
                let mut dims = array.dims().to_vec();
                dims[0] *= p;
                self.b.reshape(&all, &dims)
            });
        match (joined.next(), joined.next()) {
            (Some(codes), Some(scales)) => Message { codes, scales },
            _ => message.clone(),
        }
    }

    /// One relay of every stream: pass the travelling part on, and file
    /// the one that arrives in its row. The part that arrives at relay
    /// h = s+1 comes from rank (r − dir·h) mod P.
    fn relay_step(
        &mut self,
        streams: &[(i64, Vec<i64>)],
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
        // The rank a part comes from, once per direction.
        let mut sources: Vec<(i64, Value)> = Vec::new();
        for (k, (dir, part)) in streams.iter().enumerate() {
            let dir = *dir;
            // The received part goes into the state in place of the one
            // sent: a copy, so the collective never writes the buffer it
            // reads.
            let travelling = self.permute(&state[2 * k], whole, dir);
            let travelling = match s {
                Step::Next(_) => self.copy_unless_before_xla(&travelling),
                Step::At(_) => travelling,
            };
            let from = match sources.iter().find(|(d, _)| *d == dir) {
                Some((_, from)) => from.clone(),
                None => {
                    let from = self.index(rank, p, dir, s, 1);
                    sources.push((dir, from.clone()));
                    from
                }
            };
            let mut row_dims = part.clone();
            row_dims.insert(0, 1);
            let row = self.b.reshape(&travelling, &row_dims);
            let mut at = vec![self.s32c(0); row_dims.len()];
            at[0] = from;
            let rows = self.b.dynamic_update_slice(&state[2 * k + 1], &row, &at);
            next.extend([travelling, rows]);
        }
        next
    }
}
