//! Where a device is: its rank in its group, its coordinate on an axis,
//! and the index of the slice a step of a ring reads.

use super::{Emitter, Step};
use crate::ir::builder::Value;
use crate::ir::opcode::Opcode;
use crate::passes::quantize_collectives::groups::IdSpace;
use crate::plan::Axis;
use crate::proto::PrimitiveType;

impl Emitter<'_, '_, '_> {
    /// The rank r (s32) of this device in its group.
    pub(super) fn rank(&mut self) -> Value {
        let id = match self.inputs.participants.space {
            IdSpace::Partition => self.b.partition_id(),
            IdSpace::Replica => self.b.replica_id(),
        };
        let id = self.b.convert(&id, PrimitiveType::S32);
        match self.inputs.participants.rank_table() {
            None => id,
            Some(table) => {
                let table = self.s32_vector(&table);
                let r = self.b.dynamic_slice(&table, &[id], &[1]);
                self.b.reshape(&r, &[])
            }
        }
    }

    /// This device's coordinate on `axis`: (r / stride) mod size.
    pub(super) fn coordinate(&mut self, rank: &Value, axis: Axis) -> Value {
        if let Some(v) = self.coordinates.get(&(rank.id, axis.stride, axis.size)) {
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
            v = self.b.binary(Opcode::Remainder, &v, &size);
        }
        self.coordinates
            .insert((rank.id, axis.stride, axis.size), v.clone());
        v
    }

    /// (a − dir·k) mod Q as an s32 scalar, with k = `step` + `plus`.
    pub(super) fn index(&mut self, a: &Value, q: i64, dir: i64, step: &Step, plus: i64) -> Value {
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
                    self.b.binary(Opcode::Remainder, &sum, &qv)
                };
                self.indices.insert(key, v.clone());
                v
            }
            // k = s + plus = next + plus − 1, with next in 1..Q−1 and plus
            // at most 2, so a − k + 2Q ≥ 0.
            Step::Next(next) => {
                if !(0..=2).contains(&plus) {
                    self.b.fail(format!(
                        "a loop step's index takes a step offset of 0..=2, not {plus}"
                    ));
                }
                let shifted = if dir > 0 {
                    let base = self.s32c(2 * q - plus + 1);
                    self.b.binary(Opcode::Subtract, &base, next)
                } else {
                    let plus = self.s32c(plus - 1);
                    self.b.add_op(next, &plus)
                };
                let sum = self.b.add_op(a, &shifted);
                let qv = self.s32c(q);
                self.b.binary(Opcode::Remainder, &sum, &qv)
            }
        }
    }
}
