//! Who takes part: the collective's groups, turned into ids that
//! collective-permute and all-gather can name.
//!
//! collective-permute only knows two id spaces: replica ids (no channel id;
//! the permutation runs inside every partition) and partition ids (channel
//! id; it runs inside every replica). An all-reduce is rewritten only when
//! its participants are exactly groups in one of those spaces:
//!
//! | all-reduce mode                 | expressible when   | id space  |
//! |---------------------------------|--------------------|-----------|
//! | cross replica (no channel id)   | always             | replica   |
//! | cross replica and partition     | 1 replica          | partition (the group is every partition) |
//! |                                 | 1 partition        | replica   |
//! | flattened ids                   | 1 replica          | partition (flattened id = partition id) |
//! |                                 | 1 partition        | replica   |
//!
//! The replica and partition counts come from the module (config, header,
//! device assignment) or the options; when the rule needs one that nobody
//! gave, the op is skipped with a reason that says which flag to pass.

use std::collections::HashSet;

use super::skip::SkipReason;
use crate::ir::DeviceCounts;
use crate::ir::groups::{GroupEncoding, GroupMode, MAX_DEVICES, ReplicaGroups};
use crate::plan::Axis;
use crate::proto::HloInstructionProto;

/// The ids the emitted collectives use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdSpace {
    /// `replica-id()`, collectives without a channel id.
    Replica,
    /// `partition-id()`, collectives with a channel id.
    Partition,
}

/// The participants of one all-reduce, in a space collective-permute knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Participants {
    pub mode: GroupMode,
    pub encoding: GroupEncoding,
    pub space: IdSpace,
    /// Every group, each of the same size, ids in `space`; a device's rank is
    /// its position in its group.
    pub groups: Vec<Vec<i64>>,
    /// Ids in `space` run over `0..id_count`.
    pub id_count: usize,
}

impl Participants {
    pub fn group_size(&self) -> usize {
        self.groups.first().map_or(0, Vec::len)
    }

    /// id → rank in its group, or `None` when rank = id (one ordered group).
    pub fn rank_table(&self) -> Option<Vec<i32>> {
        let identity = self.groups.len() == 1
            && self.groups[0]
                .iter()
                .enumerate()
                .all(|(k, &id)| id == k as i64);
        if identity {
            return None;
        }
        let mut table = vec![0i32; self.id_count];
        for g in &self.groups {
            for (rank, &id) in g.iter().enumerate() {
                table[id as usize] = rank as i32;
            }
        }
        Some(table)
    }

    /// Source → target pairs of a ring step along `axis`: each rank sends
    /// to the rank whose coordinate on the axis is one `dir` on (the
    /// other coordinates equal; `axis` spanning the group: rank + `dir`).
    pub fn axis_pairs(&self, axis: Axis, dir: i64) -> Vec<(i64, i64)> {
        let q = axis.size as i64;
        let mut pairs = Vec::new();
        for g in &self.groups {
            for (k, &id) in g.iter().enumerate() {
                let a = (k / axis.stride) % axis.size;
                let next = (a as i64 + dir).rem_euclid(q) as usize;
                pairs.push((id, g[k - a * axis.stride + next * axis.stride]));
            }
        }
        pairs
    }
}

/// The participants of collective `instr`, or why collective-permute cannot
/// express them.
pub fn participants(
    instr: &HloInstructionProto,
    counts: &DeviceCounts,
) -> Result<Participants, SkipReason> {
    let groups = ReplicaGroups::of(instr).map_err(SkipReason::BadGroups)?;
    let mode = GroupMode::of(instr);
    let (r, p) = (counts.replica_count, counts.num_partitions);
    // Counts are believed only up to what an id table may hold: "every
    // replica" of a hostile 2^40 replicas must not become a 2^40-entry list.
    for (n, what) in [(r, "replica"), (p, "partition")] {
        if let Some(n) = n.filter(|&n| !(1..=MAX_DEVICES).contains(&n)) {
            return Err(SkipReason::BadGroups(format!(
                "{n} {what}s is outside 1..={MAX_DEVICES}"
            )));
        }
    }
    let everyone = |n: Option<i64>, what: &str| -> Result<Vec<Vec<i64>>, SkipReason> {
        let n = n.ok_or_else(|| {
            SkipReason::CountsUnknown(format!("empty replica groups mean all {what}s"))
        })?;
        Ok(vec![(0..n).collect()])
    };
    let given_or_all = |n: Option<i64>, what: &str| -> Result<Vec<Vec<i64>>, SkipReason> {
        if groups.groups.is_empty() {
            everyone(n, what)
        } else {
            Ok(groups.groups.clone())
        }
    };
    let (space, list, count) = match mode {
        GroupMode::CrossReplica => (IdSpace::Replica, given_or_all(r, "replica")?, r),
        GroupMode::CrossReplicaAndPartition if r == Some(1) => {
            let only_replica_zero = groups.groups.iter().all(|g| g == &[0]);
            if !only_replica_zero {
                return Err(SkipReason::BadGroups(
                    "cross-replica-and-partition groups name replicas other than 0, but there is one replica"
                        .into(),
                ));
            }
            (IdSpace::Partition, everyone(p, "partition")?, p)
        }
        GroupMode::CrossReplicaAndPartition if p == Some(1) => {
            (IdSpace::Replica, given_or_all(r, "replica")?, r)
        }
        GroupMode::FlattenedId if r == Some(1) => {
            (IdSpace::Partition, given_or_all(p, "partition")?, p)
        }
        GroupMode::FlattenedId if p == Some(1) => {
            (IdSpace::Replica, given_or_all(r, "replica")?, r)
        }
        GroupMode::CrossReplicaAndPartition | GroupMode::FlattenedId => {
            return Err(match (r, p) {
                (Some(r), Some(p)) => SkipReason::ModeNotExpressible(format!(
                    "{} groups over {r} replicas × {p} partitions span both; collective-permute \
                     works within one replica or one partition",
                    mode.as_str()
                )),
                _ => SkipReason::CountsUnknown(format!(
                    "{} groups are expressible only with one replica or one partition",
                    mode.as_str()
                )),
            });
        }
        // An all-to-all with a channel id: partition ids, within every
        // replica, as collective-permute and all-to-all name them.
        GroupMode::CrossPartition => (IdSpace::Partition, given_or_all(p, "partition")?, p),
    };
    let size = list.first().map_or(0, Vec::len);
    if list.iter().any(|g| g.len() != size) {
        return Err(SkipReason::UnevenGroups);
    }
    if size < 2 {
        return Err(SkipReason::Plan(crate::plan::PlanError::GroupOfOne));
    }
    let mut seen = HashSet::new();
    let mut max_id = -1;
    for &id in list.iter().flatten() {
        if id < 0 || !seen.insert(id) {
            return Err(SkipReason::BadGroups(format!(
                "id {id} is negative or in two groups"
            )));
        }
        max_id = max_id.max(id);
    }
    let id_count = count.unwrap_or(max_id + 1);
    if max_id >= id_count || seen.len() as i64 != id_count {
        return Err(SkipReason::BadGroups(format!(
            "groups cover {} of {id_count} ids: every device must be in exactly one group",
            seen.len()
        )));
    }
    Ok(Participants {
        mode,
        encoding: groups.encoding,
        space,
        groups: list,
        id_count: id_count as usize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{
        CollectiveDeviceListProto, ReplicaGroup, hlo_instruction_proto::ReplicaGroupList,
    };

    fn all_reduce(groups: &[&[i64]], channel: i64, global: bool) -> HloInstructionProto {
        HloInstructionProto {
            opcode: "all-reduce".into(),
            channel_id: channel,
            use_global_device_ids: global,
            replica_group_list: Some(ReplicaGroupList::CollectiveDeviceList(
                CollectiveDeviceListProto {
                    replica_groups: groups
                        .iter()
                        .map(|g| ReplicaGroup {
                            replica_ids: g.to_vec(),
                        })
                        .collect(),
                    iota_replica_group_list: None,
                },
            )),
            ..Default::default()
        }
    }

    fn counts(r: i64, p: i64) -> DeviceCounts {
        DeviceCounts {
            replica_count: Some(r),
            num_partitions: Some(p),
        }
    }

    #[test]
    fn jax_spmd_groups_are_partition_ids() {
        let p = participants(
            &all_reduce(&[&[0, 1, 2, 3, 4, 5, 6, 7]], 1, true),
            &counts(1, 8),
        )
        .unwrap();
        assert_eq!(p.space, IdSpace::Partition);
        assert_eq!(p.rank_table(), None);
        assert_eq!(
            p.axis_pairs(
                Axis {
                    size: p.group_size(),
                    stride: 1
                },
                1
            )[7],
            (7, 0)
        );
    }

    #[test]
    fn strided_groups_get_a_rank_table_and_per_group_rings() {
        let p = participants(
            &all_reduce(&[&[0, 2, 4, 6], &[1, 3, 5, 7]], 1, true),
            &counts(1, 8),
        )
        .unwrap();
        assert_eq!(p.rank_table(), Some(vec![0, 0, 1, 1, 2, 2, 3, 3]));
        assert_eq!(
            p.axis_pairs(
                Axis {
                    size: p.group_size(),
                    stride: 1
                },
                1
            ),
            vec![
                (0, 2),
                (2, 4),
                (4, 6),
                (6, 0),
                (1, 3),
                (3, 5),
                (5, 7),
                (7, 1)
            ]
        );
        assert_eq!(
            p.axis_pairs(
                Axis {
                    size: p.group_size(),
                    stride: 1
                },
                -1
            )[0],
            (0, 6)
        );
    }

    #[test]
    fn cross_replica_and_partition_needs_a_trivial_dimension() {
        let ar = all_reduce(&[&[0]], 1, false);
        let p = participants(&ar, &counts(1, 4)).unwrap();
        assert_eq!(
            (p.space, p.groups.clone()),
            (IdSpace::Partition, vec![vec![0, 1, 2, 3]])
        );
        let both = all_reduce(&[&[0, 1]], 1, false);
        assert!(matches!(
            participants(&both, &counts(2, 4)),
            Err(SkipReason::ModeNotExpressible(_))
        ));
        assert!(matches!(
            participants(&both, &DeviceCounts::default()),
            Err(SkipReason::CountsUnknown(_))
        ));
    }

    #[test]
    fn groups_must_cover_every_device_once() {
        let ar = all_reduce(&[&[0, 1], &[1, 2]], 0, false);
        assert!(matches!(
            participants(&ar, &counts(4, 1)),
            Err(SkipReason::BadGroups(_))
        ));
        let partial = all_reduce(&[&[0, 1]], 0, false);
        assert!(matches!(
            participants(&partial, &counts(4, 1)),
            Err(SkipReason::BadGroups(_))
        ));
        let single = all_reduce(&[&[0], &[1]], 0, false);
        assert!(matches!(
            participants(&single, &counts(2, 1)),
            Err(SkipReason::Plan(crate::plan::PlanError::GroupOfOne))
        ));
    }
}
