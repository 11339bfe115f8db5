//! The gather: the owned chunk quantized once and brought to every rank,
//! by one all-gather or by P−1 relays round the ring; every rank, the owner
//! included, dequantizes the same codes.

use super::{Emitter, Step};
use crate::ir::builder::Value;
use crate::ir::shape;
use crate::passes::quantize_collectives::groups::IdSpace;
use crate::plan::{Axis, Form, GatherForm, Rotation};
use crate::proto::PrimitiveType;

impl Emitter<'_, '_, '_> {
    /// The owned chunk (f32 `[c]`) quantized once; every rank, the owner
    /// included, dequantizes all P chunks from the same codes, so every
    /// participant ends with bit-identical results. Returns f32 `[P·c]`.
    pub(super) fn gather(&mut self, owned: &Value, rank: &Value) -> Value {
        let plan = self.plan();
        let (p, bl) = (plan.group_size as i64, plan.block() as i64);
        let nb = plan.chunk as i64 / bl;
        let blocks = self.b.reshape(owned, &[nb, bl]);
        let blocks = self.f32(&blocks);
        let message = self.quantize(&blocks);
        let width = self.dim(&message, 1);
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
    pub(super) fn relay(&mut self, message: &Value, rank: &Value) -> Value {
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
                let mut out = self.repeat("relay", p - 1, &state, |e, s, state| {
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
    pub(super) fn relay_step(
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
            // reads.
            let travelling = self.permute(&state[2 * k], whole, dir);
            let travelling = match s {
                Step::Next(_) => self.copy_unless_before_xla(&travelling),
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
}
