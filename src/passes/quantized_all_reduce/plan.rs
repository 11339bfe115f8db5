//! The ring plan: sizes, lanes and message layout of one rewrite, decided
//! before any HLO is emitted, so the byte accounting in the report and the
//! emitted collectives come from the same numbers.
//!
//! The flattened payload (`n` f32 elements) is zero-padded to `P·c` and seen
//! as `[P chunks][L lanes][c/L elements]`. A lane is an independent chain of
//! ops over one sub-chunk of every chunk: `D` lanes per direction, twice
//! that with a bidirectional ring (the second half of the lanes travels the
//! other way). `c/L` is a multiple of the block size `B`, so blocks never
//! straddle lanes or chunks.
//!
//! One message per hop: the lane's s8 codes followed by its scales,
//! bit-cast to s8 (`c/L + (c/L/B)·scale_bytes` bytes).

use super::{Options, ScaleType, SkipReason, groups::Participants};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingPlan {
    /// Group size P.
    pub group_size: usize,
    /// Block size B.
    pub block: usize,
    /// Direction of each lane: +1 (to rank+1) or -1.
    pub lane_dirs: Vec<i64>,
    /// Payload elements (all packed operands).
    pub elements: usize,
    /// Elements per lane sub-chunk (`c/L`), a multiple of `block`.
    pub lane_len: usize,
    pub scale_type: ScaleType,
}

impl RingPlan {
    pub fn new(
        participants: &Participants,
        elements: usize,
        options: &Options,
    ) -> Result<Self, SkipReason> {
        let p = participants.group_size();
        let b = options.block_size;
        let lanes = options.pipeline_depth * if options.bidirectional { 2 } else { 1 };
        // c/L = ceil(n / (P·L·B)) · B, computed without overflow.
        let unit = p
            .checked_mul(lanes)
            .and_then(|x| x.checked_mul(b))
            .ok_or(SkipReason::TooLarge)?;
        let lane_len = elements
            .div_ceil(unit)
            .checked_mul(b)
            .ok_or(SkipReason::TooLarge)?;
        let plan = RingPlan {
            group_size: p,
            block: b,
            lane_dirs: (0..lanes)
                .map(|l| if l < options.pipeline_depth { 1 } else { -1 })
                .collect(),
            elements,
            lane_len,
            scale_type: options.scale_type,
        };
        plan.padded().ok_or(SkipReason::TooLarge)?;
        if i32::try_from(plan.padded().unwrap_or(usize::MAX)).is_err() {
            return Err(SkipReason::TooLarge);
        }
        Ok(plan)
    }

    pub fn lanes(&self) -> usize {
        self.lane_dirs.len()
    }

    /// Elements per rank chunk, `c`.
    pub fn chunk(&self) -> usize {
        self.lane_len * self.lanes()
    }

    /// `P·c`, the padded payload.
    pub fn padded(&self) -> Option<usize> {
        self.chunk().checked_mul(self.group_size)
    }

    pub fn blocks_per_lane(&self) -> usize {
        self.lane_len / self.block
    }

    /// Bytes of one hop's message (codes, then scales).
    pub fn message_len(&self) -> usize {
        self.lane_len + self.blocks_per_lane() * self.scale_type.bytes()
    }

    /// Bytes each device sends: P−1 reduce-scatter hops and the all-gather's
    /// P−1 messages, per lane.
    pub fn wire_bytes(&self) -> u64 {
        2 * (self.group_size as u64 - 1) * self.lanes() as u64 * self.message_len() as u64
    }
}

/// Bytes each device sends in a bandwidth-optimal ring all-reduce of
/// `payload_bytes`: 2·(P−1)/P of the payload.
pub fn ring_wire_bytes(group_size: usize, payload_bytes: u64) -> u64 {
    let p = group_size as u64;
    2 * (p - 1) * payload_bytes / p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::groups::{GroupEncoding, GroupMode};
    use crate::passes::quantized_all_reduce::groups::IdSpace;

    fn group(p: usize) -> Participants {
        Participants {
            mode: GroupMode::FlattenedId,
            encoding: GroupEncoding::List,
            space: IdSpace::Partition,
            groups: vec![(0..p as i64).collect()],
            id_count: p,
        }
    }

    #[test]
    fn chunks_are_padded_to_whole_blocks_per_lane() {
        let o = Options {
            block_size: 128,
            pipeline_depth: 2,
            bidirectional: true,
            ..Options::default()
        };
        let plan = RingPlan::new(&group(8), 1000, &o).unwrap();
        assert_eq!(plan.lanes(), 4);
        assert_eq!(plan.lane_len, 128);
        assert_eq!(plan.padded(), Some(8 * 4 * 128));
        assert_eq!(plan.lane_dirs, vec![1, 1, -1, -1]);
    }

    #[test]
    fn one_mib_of_bf16_halves_the_wire_bytes() {
        let o = Options {
            block_size: 128,
            pipeline_depth: 1,
            ..Options::default()
        };
        let n = 512 * 1024; // 1 MiB of bf16
        let plan = RingPlan::new(&group(8), n, &o).unwrap();
        let ratio = ring_wire_bytes(8, 2 * n as u64) as f64 / plan.wire_bytes() as f64;
        assert!(ratio >= 1.93 && ratio <= 1.94, "{ratio}");
    }
}
