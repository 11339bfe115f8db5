//! The ring plan: sizes, lanes and message layout of one rewrite, decided
//! before any HLO is emitted, so the byte accounting in the report and the
//! emitted collectives come from the same numbers.
//!
//! The flattened payload (`n` f32 elements) is zero-padded to `P·c`, with
//! the per-rank chunk `c` the smallest multiple of the block size `B` that
//! holds `n/P` (so the padding is below `P·B` elements), and seen as
//! `[P chunks, c]`. A lane is an independent chain of ops over one
//! contiguous sub-chunk of every chunk: `D` lanes per direction, twice that
//! with a bidirectional ring (the second half of the lanes travels the other
//! way). Lanes hold whole blocks, as evenly as possible (they differ by at
//! most one block), so blocks never straddle lanes or chunks.
//!
//! One message per hop: the lane's s8 codes followed by its scales,
//! bit-cast to s8 (`len + (len/B)·scale_bytes` bytes).

use super::{Options, ScaleType, SkipReason};

/// Most collective hops (lanes × 2·(P−1)) one rewrite may emit: P = 8 with
/// 512 lanes needs 7 168; a group of thousands of devices would otherwise
/// grow one all-reduce into millions of instructions.
pub const MAX_RING_HOPS: u64 = 1 << 14;

/// One independent chain of the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lane {
    /// +1: every rank sends to rank + 1; −1: to rank − 1.
    pub dir: i64,
    /// Where the lane's sub-chunk starts inside a chunk.
    pub offset: usize,
    /// Elements of the sub-chunk, a multiple of the block size.
    pub len: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingPlan {
    /// Group size P.
    pub group_size: usize,
    /// Block size B.
    pub block: usize,
    pub lanes: Vec<Lane>,
    /// Payload elements (all packed operands).
    pub elements: usize,
    /// Elements per rank chunk, `c`: a multiple of `block`.
    pub chunk: usize,
    pub scale_type: ScaleType,
}

impl RingPlan {
    /// The plan for `elements` payload elements over groups of `p` ranks.
    pub fn new(p: usize, elements: usize, options: &Options) -> Result<Self, SkipReason> {
        if p < 2 {
            return Err(SkipReason::GroupOfOne);
        }
        let b = options.block_size.max(1);
        let per_rank_blocks = elements
            .div_ceil(p.checked_mul(b).ok_or(SkipReason::TooLarge)?)
            .max(1);
        let chunk = per_rank_blocks.checked_mul(b).ok_or(SkipReason::TooLarge)?;
        let padded = chunk.checked_mul(p).ok_or(SkipReason::TooLarge)?;
        if i32::try_from(padded).is_err() {
            return Err(SkipReason::TooLarge);
        }
        // D lanes per direction, never more lanes than blocks.
        let directions: &[i64] = if options.bidirectional && per_rank_blocks >= 2 {
            &[1, -1]
        } else {
            &[1]
        };
        let count = (options.pipeline_depth.max(1))
            .saturating_mul(directions.len())
            .min(per_rank_blocks);
        // Every lane sends P−1 reduce-scatter and P−1 gather messages, each
        // a chain of HLO ops: bound what one all-reduce may grow into.
        let hops = (count as u64).saturating_mul(2 * (p as u64 - 1));
        if hops > MAX_RING_HOPS {
            return Err(SkipReason::TooManyHops {
                hops,
                limit: MAX_RING_HOPS,
            });
        }
        let per_dir = count / directions.len();
        let mut lanes = Vec::with_capacity(count);
        let mut offset = 0;
        for l in 0..count {
            let blocks = per_rank_blocks / count + usize::from(l < per_rank_blocks % count);
            let dir = directions[(l / per_dir).min(directions.len() - 1)];
            lanes.push(Lane {
                dir,
                offset,
                len: blocks * b,
            });
            offset += blocks * b;
        }
        Ok(RingPlan {
            group_size: p,
            block: b,
            lanes,
            elements,
            chunk,
            scale_type: options.scale_type,
        })
    }

    /// `P·c`, the padded payload.
    pub fn padded(&self) -> usize {
        self.chunk * self.group_size
    }

    /// Bytes of one hop's message on `lane` (codes, then scales).
    pub fn message_len(&self, lane: &Lane) -> usize {
        lane.len + lane.len / self.block * self.scale_type.bytes()
    }

    /// Bytes each device sends: P−1 reduce-scatter hops and the all-gather's
    /// P−1 messages, on every lane.
    pub fn wire_bytes(&self) -> u64 {
        let per_hop: usize = self.lanes.iter().map(|l| self.message_len(l)).sum();
        2 * (self.group_size as u64 - 1) * per_hop as u64
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

    #[test]
    fn chunks_hold_whole_blocks_and_lanes_split_them_evenly() {
        let o = Options {
            block_size: 128,
            pipeline_depth: 2,
            bidirectional: true,
            ..Options::default()
        };
        // 10 000 elements over 8 ranks: 1250 each → 10 blocks of 128.
        let plan = RingPlan::new(8, 10_000, &o).unwrap();
        assert_eq!(plan.chunk, 1280);
        assert_eq!(plan.padded(), 10_240);
        let lens: Vec<usize> = plan.lanes.iter().map(|l| l.len).collect();
        assert_eq!(lens, vec![384, 384, 256, 256]);
        let dirs: Vec<i64> = plan.lanes.iter().map(|l| l.dir).collect();
        assert_eq!(dirs, vec![1, 1, -1, -1]);
        assert_eq!(plan.lanes[3].offset + plan.lanes[3].len, plan.chunk);
    }

    #[test]
    fn lanes_never_outnumber_blocks() {
        let o = Options {
            block_size: 128,
            pipeline_depth: 64,
            ..Options::default()
        };
        let plan = RingPlan::new(8, 2048, &o).unwrap();
        assert_eq!(plan.lanes.len(), 2);
        assert_eq!(plan.padded(), 2048);
    }

    #[test]
    fn a_mib_of_bf16_or_more_halves_the_wire_bytes_whatever_the_lanes() {
        for n in [512 * 1024, 1_000_000, 524_289, 3 * 1024 * 1024 + 17] {
            for (depth, bidirectional) in [(1, false), (4, true), (16, true)] {
                // B = 128 with f32 scales, and the default B = 64 with bf16.
                for (block_size, scale_type) in [(128, ScaleType::F32), (64, ScaleType::Bf16)] {
                    let o = Options {
                        block_size,
                        scale_type,
                        pipeline_depth: depth,
                        bidirectional,
                        ..Options::default()
                    };
                    let plan = RingPlan::new(8, n, &o).unwrap();
                    let ratio = ring_wire_bytes(8, 2 * n as u64) as f64 / plan.wire_bytes() as f64;
                    assert!(
                        (1.93..=1.94).contains(&ratio),
                        "n={n} D={depth} B={block_size}: {ratio}"
                    );
                }
            }
        }
    }
}
