//! Where a device is: its rank in its group, its coordinate on an axis,
//! and the index of the slice a step of a ring reads.

use super::Emitter;
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

    /// (a − dir·k) mod Q as an s32 scalar, for a constant k.
    pub(super) fn index(&mut self, a: &Value, q: i64, dir: i64, k: i64) -> Value {
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

    /// The index a loop's next step reads, from the one this step read:
    /// (index − dir) mod Q, for an index in 0..Q. A compare, an add and a
    /// select: a loop carries its indices from step to step instead of
    /// deriving them from the counter by a remainder, which XLA:TPU
    /// expands into six scalar ops (each a kernel of its own there) and
    /// XLA:GPU and XLA:CPU into several.
    pub(super) fn next_index(&mut self, index: &Value, q: i64, dir: i64) -> Value {
        if dir.abs() != 1 {
            self.b
                .fail(format!("a ring steps one rank at a time, not {dir}"));
        }
        let (edge, wrapped) = if dir > 0 { (0, q - 1) } else { (q - 1, 0) };
        let edge = self.s32c(edge);
        let at_edge = self.b.compare(index, &edge, "EQ");
        // One, not minus one: the loop's counter steps by the same constant.
        let one = self.s32c(1);
        let moved = if dir > 0 {
            self.b.binary(Opcode::Subtract, index, &one)
        } else {
            self.b.add_op(index, &one)
        };
        let wrapped = self.s32c(wrapped);
        self.b.select(&at_edge, &wrapped, &moved)
    }
}
