//! The ring (the paper's algorithm, and each axis of two-level): P−1 hops,
//! each quantizing a partial sum, sending it one step round the ring and
//! adding the device's own part of the slice it now holds.

use super::Emitter;
use crate::ir::builder::Value;
use crate::plan::{Axis, Form, Lane};

impl Emitter<'_, '_, '_> {
    /// One hop on `dir`: every rank sends `array` to the rank one step
    /// along `axis`.
    pub(super) fn permute(&mut self, array: &Value, axis: Axis, dir: i64) -> Value {
        let pairs = self.inputs.participants.axis_pairs(axis, dir);
        let channel = self.channel();
        if self.inputs.async_permutes {
            let start = self.b.collective_permute_start(array, &pairs, channel);
            self.b.collective_permute_done(&start)
        } else {
            self.b.collective_permute(array, &pairs, channel)
        }
    }

    /// This device's f32 part of `lane` of the slice with index `index` on
    /// the held axis `at` (`held`: `[axes.., c/B, B]`): `[rows·blocks, B]`.
    pub(super) fn own_part(
        &mut self,
        held: &Value,
        at: usize,
        index: &Value,
        lane: &Lane,
    ) -> Value {
        let bl = self.plan().block() as i64;
        let dims = held.dims().to_vec();
        let blocks_dim = dims.len() - 2;
        let zero = self.s32c(0);
        let offset = self.s32c(lane.offset as i64 / bl);
        let mut starts = vec![zero; dims.len()];
        starts[at] = index.clone();
        starts[blocks_dim] = offset;
        let mut sizes = dims.clone();
        sizes[at] = 1;
        sizes[blocks_dim] = lane.len as i64 / bl;
        let part = self.b.dynamic_slice(held, &starts, &sizes);
        let part = self.blocks(&part);
        self.f32(&part)
    }

    /// One ring hop of every lane: send the partials on, each quantized
    /// against its blocks' [`Self::largest`] bits (`lanes`: per lane, the
    /// partial and its bits), and add this device's part of the slice they
    /// now hold (`indices`: per lane, that slice's index on the held axis
    /// `at`).
    pub(super) fn ring_step(
        &mut self,
        lanes: &[(&Value, &Value)],
        held: &Value,
        at: usize,
        indices: &[Value],
        axis: Axis,
    ) -> Vec<Value> {
        let plan = self.plan();
        plan.lanes
            .iter()
            .zip(lanes)
            .zip(indices)
            .map(|((lane, &(part, top)), index)| {
                let message = self.quantize_with(part, top);
                let wire = self.wire(&message);
                let arrived = self.carry(&wire, 1, |e, sent| e.permute(sent, axis, lane.dir));
                let received = self.unwire(&arrived);
                let summed = self.dequantize(&received);
                let own = self.own_part(held, at, index, lane);
                self.b.add_op(&summed, &own)
            })
            .collect()
    }

    /// The [`Self::largest`] bits of each partial.
    fn largest_of(&mut self, partials: &[Value]) -> Vec<Value> {
        partials.iter().map(|p| self.largest(p)).collect()
    }

    /// Reduce-scatter over `axis` round its ring. At step s, the device
    /// with coordinate a sends its partial sum of slice (a − dir·(s+1))
    /// mod Q to a + dir, which adds its own part of that slice. After Q−1
    /// steps the device holds slice a, summed over the axis. Returns what
    /// the device now holds, f32 `[other axes.., c/B, B]`, and, where
    /// `keep_largest`, its blocks' [`Self::largest`] bits, s32 `[blocks]`
    /// in the same order (the last hop made them; the gather that follows
    /// quantizes against them).
    pub(super) fn ring(
        &mut self,
        held: &Value,
        rank: &Value,
        axes: &[Axis],
        axis: Axis,
        keep_largest: bool,
    ) -> (Value, Option<Value>) {
        let plan = self.plan();
        let Some(at) = axes.iter().position(|x| *x == axis) else {
            // Every ring phase's axis is one of the plan's, held until it
            // is reduced.
            self.b
                .fail(format!("the ring's axis {axis:?} is not among those held"));
            return (held.clone(), None);
        };
        let a = self.coordinate(rank, axis);
        let q = axis.size as i64;
        // Lane dir's first partial is its part of slice (a − dir) mod Q;
        // at step s it adds its part of slice (a − dir·(s+2)) mod Q.
        let firsts: Vec<Value> = plan
            .lanes
            .iter()
            .map(|lane| self.index(&a, q, lane.dir, 1))
            .collect();
        let mut partials: Vec<Value> = plan
            .lanes
            .iter()
            .zip(&firsts)
            .map(|(lane, index)| self.own_part(held, at, index, lane))
            .collect();
        // Each hop's partials get their largest bits as soon as they are
        // summed, where the next hop's quantize would otherwise reduce them
        // again: in a loop that puts the reduction beside the add, which
        // a compiler fuses into one kernel (XLA:GPU's multi-output fusion),
        // instead of at the top of the next iteration.
        let mut largest = self.largest_of(&partials);
        match plan.config.form {
            Form::Unrolled => {
                for s in 0..q - 1 {
                    let pairs: Vec<_> = partials.iter().zip(&largest).collect();
                    let indices: Vec<Value> = (plan.lanes.iter())
                        .map(|lane| self.index(&a, q, lane.dir, s + 2))
                        .collect();
                    partials = self.ring_step(&pairs, held, at, &indices, axis);
                    if s + 1 < q - 1 || keep_largest {
                        largest = self.largest_of(&partials);
                    }
                }
            }
            Form::Loop => {
                // State: (step, partials.., their largest bits.., the
                // indices of the slices the step before added.., held).
                let lanes = plan.lanes.len();
                let mut state = partials.clone();
                state.extend(largest.iter().cloned());
                state.extend(firsts);
                state.push(held.clone());
                let out = self.repeat("ring", q - 1, &state, |e, state| {
                    let held = &state[3 * lanes];
                    let (parts, rest) = state[..3 * lanes].split_at(lanes);
                    let (tops, before) = rest.split_at(lanes);
                    let indices: Vec<Value> = (before.iter().zip(&e.plan().lanes))
                        .map(|(index, lane)| e.next_index(index, q, lane.dir))
                        .collect();
                    let pairs: Vec<_> = parts.iter().zip(tops).collect();
                    let mut next = e.ring_step(&pairs, held, at, &indices, axis);
                    let tops = e.largest_of(&next);
                    next.extend(tops);
                    next.extend(indices);
                    next.push(held.clone());
                    next
                });
                partials = out[..lanes].to_vec();
                largest = out[lanes..2 * lanes].to_vec();
            }
        }
        // The lanes' partials side by side again: [rows, c/B, B]. With one
        // row the lanes' blocks simply follow each other. Their largest bits
        // join the same way, one per block.
        let rows: i64 = held.dims().iter().rev().skip(2).product::<i64>() / q;
        let joined = self.join_lanes(&partials, rows);
        let mut dims = held.dims().to_vec();
        dims.remove(at);
        let sum = self.b.reshape(&joined, &dims);
        let largest = keep_largest.then(|| {
            let joined = self.join_lanes(&largest, rows);
            let blocks: i64 = dims[..dims.len() - 1].iter().product();
            self.b.reshape(&joined, &[blocks])
        });
        (sum, largest)
    }

    /// One value per lane (`[rows·blocks, ..]` each), joined lane after
    /// lane within each of the `rows`: `[rows, Σ blocks, ..]`, or the
    /// values one after the other where there is one row.
    fn join_lanes(&mut self, parts: &[Value], rows: i64) -> Value {
        let pieces: Vec<Value> = if rows == 1 {
            parts.to_vec()
        } else {
            parts
                .iter()
                .map(|p| {
                    let mut dims = p.dims().to_vec();
                    dims[0] /= rows;
                    dims.insert(0, rows);
                    self.b.reshape(p, &dims)
                })
                .collect()
        };
        match pieces.len() {
            1 => pieces[0].clone(),
            _ => self.b.concatenate(&pieces, i64::from(rows != 1)),
        }
    }
}
