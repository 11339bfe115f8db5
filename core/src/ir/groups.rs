//! Replica groups of a collective, in all three encodings XLA writes.
//!
//! - explicit lists (`replica_groups={{0,1},{2,3}}`), in the legacy field 49
//!   or in `collective_device_list` (87);
//! - iota (`[2,4]<=[4,2]T(1,0)`), in field 92 or inside field 87;
//! - mesh axes (`mesh['x'=2,'y'=4] {'y'}`), field 93, what jit with a
//!   NamedSharding emits.
//!
//! XLA reads the legacy field first, then iota, then mesh axes, then the
//! device list; [`ReplicaGroups::of`] does the same and expands every form to
//! explicit lists, keeping which form it came from.

use crate::ir::opcode::Opcode;
use crate::proto::hlo_instruction_proto::ReplicaGroupList;
use crate::proto::{
    HloInstructionProto, IotaReplicaGroupListProto, MeshAxesReplicaGroupListProto, MeshProto,
};

/// Whose ids a collective's groups list: XLA's `GetCollectiveOpGroupMode`.
///
/// Ops that carry `use_global_device_ids` (all-reduce, all-gather,
/// reduce-scatter) always pass it, so for them a channel id without global
/// ids means cross-replica-and-partition; ops without the field
/// (collective-permute, all-to-all, ...) are cross-partition with a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GroupMode {
    /// No channel id: replica ids, one instance of each group per partition.
    CrossReplica,
    /// Channel id on an op without global ids: partition ids, one instance
    /// per replica.
    CrossPartition,
    /// Channel id, `use_global_device_ids=false`: replica ids, each group
    /// spanning every partition of its replicas.
    CrossReplicaAndPartition,
    /// Channel id and `use_global_device_ids=true`: flattened ids
    /// `replica * num_partitions + partition`.
    FlattenedId,
}

impl GroupMode {
    pub fn of(instr: &HloInstructionProto) -> Self {
        let has_global_field = Opcode::of(instr).is_some_and(Opcode::has_global_device_ids);
        match (
            instr.channel_id > 0,
            has_global_field,
            instr.use_global_device_ids,
        ) {
            (false, _, _) => GroupMode::CrossReplica,
            (true, false, _) => GroupMode::CrossPartition,
            (true, true, false) => GroupMode::CrossReplicaAndPartition,
            (true, true, true) => GroupMode::FlattenedId,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GroupMode::CrossReplica => "cross replica",
            GroupMode::CrossPartition => "cross partition",
            GroupMode::CrossReplicaAndPartition => "cross replica and partition",
            GroupMode::FlattenedId => "flattened ids",
        }
    }
}

/// Which encoding an instruction's groups were written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GroupEncoding {
    /// No groups at all: every participant of the mode is in one group.
    Empty,
    List,
    Iota,
    MeshAxes,
}

impl GroupEncoding {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupEncoding::Empty => "empty",
            GroupEncoding::List => "list",
            GroupEncoding::Iota => "iota",
            GroupEncoding::MeshAxes => "mesh-axes",
        }
    }
}

/// The groups of one collective, expanded to explicit id lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaGroups {
    pub encoding: GroupEncoding,
    /// Empty when `encoding` is [`GroupEncoding::Empty`].
    pub groups: Vec<Vec<i64>>,
}

/// Largest device count an encoding may expand to; guards against hostile
/// protos that declare astronomically large iota or mesh shapes.
pub const MAX_DEVICES: i64 = 1 << 20;

impl ReplicaGroups {
    /// Reads the groups of `instr` the way XLA does.
    pub fn of(instr: &HloInstructionProto) -> Result<Self, String> {
        if !instr.replica_groups.is_empty() {
            return Ok(Self::list(
                instr
                    .replica_groups
                    .iter()
                    .map(|g| g.replica_ids.clone())
                    .collect(),
            ));
        }
        match &instr.replica_group_list {
            None => Ok(Self::empty()),
            Some(ReplicaGroupList::IotaCollectiveDeviceList(iota)) => Self::from_iota(iota),
            Some(ReplicaGroupList::MeshAxesReplicaGroupList(mesh)) => Self::from_mesh_axes(mesh),
            Some(ReplicaGroupList::CollectiveDeviceList(list)) => {
                if let Some(iota) = &list.iota_replica_group_list {
                    Self::from_iota(iota)
                } else if list.replica_groups.is_empty() {
                    Ok(Self::empty())
                } else {
                    Ok(Self::list(
                        list.replica_groups
                            .iter()
                            .map(|g| g.replica_ids.clone())
                            .collect(),
                    ))
                }
            }
        }
    }

    fn empty() -> Self {
        ReplicaGroups {
            encoding: GroupEncoding::Empty,
            groups: vec![],
        }
    }

    fn list(groups: Vec<Vec<i64>>) -> Self {
        ReplicaGroups {
            encoding: GroupEncoding::List,
            groups,
        }
    }

    pub fn from_iota(iota: &IotaReplicaGroupListProto) -> Result<Self, String> {
        let g = iota.num_replica_groups;
        let s = iota.num_devices_per_group;
        let total = checked_product(&[g, s])?;
        let (dims, perm) = if iota.iota_reshape_dims.is_empty() {
            (vec![total], vec![0])
        } else {
            let perm: Vec<i64> = if iota.iota_transpose_perm.is_empty() {
                (0..iota.iota_reshape_dims.len() as i64).collect()
            } else {
                iota.iota_transpose_perm
                    .iter()
                    .map(|&p| i64::from(p))
                    .collect()
            };
            (iota.iota_reshape_dims.clone(), perm)
        };
        if checked_product(&dims)? != total {
            return Err(format!(
                "iota replica groups [{g},{s}] do not match reshape dims {dims:?}"
            ));
        }
        let ids = transposed_iota(&dims, &perm)?;
        Ok(ReplicaGroups {
            encoding: GroupEncoding::Iota,
            groups: ids.chunks(s.max(1) as usize).map(<[i64]>::to_vec).collect(),
        })
    }

    pub fn from_mesh_axes(m: &MeshAxesReplicaGroupListProto) -> Result<Self, String> {
        let mesh = m
            .mesh
            .as_ref()
            .ok_or("mesh-axes replica groups without a mesh")?;
        let sizes: Vec<i64> = mesh.axes.iter().map(|a| a.size).collect();
        if sizes.is_empty() || sizes.iter().any(|&s| s <= 0) {
            return Err(format!("mesh axis sizes {sizes:?} are not all positive"));
        }
        let devices = mesh_devices(mesh, &sizes)?;

        // Split each mesh axis that sub-axes refer to into its factors, then
        // group over the referenced factors (in the order the axes list them).
        let mut split_dims: Vec<Vec<i64>> = sizes.iter().map(|&s| vec![s]).collect();
        let mut aggregate: Vec<Vec<usize>> = vec![vec![]; sizes.len()];
        for (axis_index, full) in sizes.iter().enumerate() {
            let refs: Vec<(usize, Option<(i64, i64)>)> = m
                .axes
                .iter()
                .enumerate()
                .filter(|(_, a)| a.mesh_axis_index == axis_index as i64)
                .map(|(i, a)| (i, a.sub_axis_info.as_ref().map(|s| (s.pre_size, s.size))))
                .collect();
            if refs.is_empty() {
                continue;
            }
            if refs.len() == 1 && refs[0].1.is_none() {
                aggregate[axis_index] = vec![0];
                continue;
            }
            let mut subs = Vec::new();
            for (i, sub) in &refs {
                let (pre, size) =
                    sub.ok_or("a full mesh axis is referenced together with its sub-axes")?;
                if pre <= 0 || size <= 0 {
                    return Err(format!("sub-axis ({pre}){size} is not positive"));
                }
                subs.push((*i, pre, size));
            }
            subs.sort_by_key(|s| s.1);
            let mut dims = Vec::new();
            let mut prefix = 1i64;
            let mut by_ref: Vec<(usize, usize)> = Vec::new();
            for (i, pre, size) in subs {
                if pre % prefix != 0 {
                    return Err(format!("sub-axes of mesh axis {axis_index} overlap"));
                }
                if pre != prefix {
                    dims.push(pre / prefix);
                    prefix = pre;
                }
                by_ref.push((i, dims.len()));
                dims.push(size);
                prefix = prefix.checked_mul(size).ok_or("sub-axis sizes overflow")?;
            }
            if full % prefix != 0 {
                return Err(format!(
                    "sub-axes do not divide mesh axis {axis_index} of size {full}"
                ));
            }
            if prefix != *full {
                dims.push(full / prefix);
            }
            by_ref.sort_by_key(|r| r.0);
            aggregate[axis_index] = by_ref.into_iter().map(|r| r.1).collect();
            split_dims[axis_index] = dims;
        }

        // Flatten the split dimensions and find each referenced factor's place.
        let mut offsets = Vec::new();
        let mut flat_dims = Vec::new();
        for d in &split_dims {
            offsets.push(flat_dims.len());
            flat_dims.extend(d);
        }
        let mut consumed = vec![0usize; sizes.len()];
        let mut grouped = Vec::new();
        for a in &m.axes {
            let axis = usize::try_from(a.mesh_axis_index)
                .ok()
                .filter(|&i| i < sizes.len())
                .ok_or_else(|| format!("mesh axis index {} out of range", a.mesh_axis_index))?;
            let k = consumed[axis];
            consumed[axis] += 1;
            grouped.push(offsets[axis] + aggregate[axis][k]);
        }
        let mut perm: Vec<usize> = (0..flat_dims.len())
            .filter(|d| !grouped.contains(d))
            .collect();
        perm.extend(&grouped);
        let per_group: i64 = grouped.iter().map(|&d| flat_dims[d]).product();
        let ordered = transpose(&devices, &flat_dims, &perm);
        Ok(ReplicaGroups {
            encoding: GroupEncoding::MeshAxes,
            groups: ordered
                .chunks(per_group.max(1) as usize)
                .map(<[i64]>::to_vec)
                .collect(),
        })
    }

    /// Size of every group, if all groups have the same size.
    pub fn uniform_size(&self) -> Option<usize> {
        let first = self.groups.first()?.len();
        self.groups
            .iter()
            .all(|g| g.len() == first)
            .then_some(first)
    }
}

fn checked_product(dims: &[i64]) -> Result<i64, String> {
    let mut p = 1i64;
    for &d in dims {
        if d < 0 {
            return Err(format!("negative dimension in {dims:?}"));
        }
        p = p
            .checked_mul(d)
            .ok_or_else(|| format!("{dims:?} overflows"))?;
    }
    if p > MAX_DEVICES {
        return Err(format!(
            "{dims:?} names {p} devices, more than {MAX_DEVICES}"
        ));
    }
    Ok(p)
}

/// The devices of a mesh in row-major order of its axes.
fn mesh_devices(mesh: &MeshProto, sizes: &[i64]) -> Result<Vec<i64>, String> {
    let total = checked_product(sizes)?;
    if !mesh.device_ids.is_empty() {
        if mesh.device_ids.len() as i64 != total {
            return Err(format!(
                "mesh has {} device ids for {total} positions",
                mesh.device_ids.len()
            ));
        }
        return Ok(mesh.device_ids.clone());
    }
    match &mesh.iota_transform {
        Some(t) if !t.reshape_dims.is_empty() => {
            if checked_product(&t.reshape_dims)? != total {
                return Err("mesh iota transform does not match the mesh size".into());
            }
            let perm = if t.transpose_perm.is_empty() {
                (0..t.reshape_dims.len() as i64).collect()
            } else {
                t.transpose_perm.clone()
            };
            transposed_iota(&t.reshape_dims, &perm)
        }
        _ => Ok((0..total).collect()),
    }
}

/// iota(product(dims)) reshaped to `dims`, transposed by `perm`, flattened.
pub fn transposed_iota(dims: &[i64], perm: &[i64]) -> Result<Vec<i64>, String> {
    let n = checked_product(dims)?;
    let mut sorted: Vec<i64> = perm.to_vec();
    sorted.sort_unstable();
    if perm.len() != dims.len() || sorted.iter().enumerate().any(|(i, &p)| p != i as i64) {
        return Err(format!(
            "{perm:?} is not a permutation of {} dimensions",
            dims.len()
        ));
    }
    let perm: Vec<usize> = perm.iter().map(|&p| p as usize).collect();
    Ok(transpose(&(0..n).collect::<Vec<_>>(), dims, &perm))
}

/// Row-major `data` of shape `dims`, transposed so output dim i is input dim
/// `perm[i]`, flattened row-major.
fn transpose(data: &[i64], dims: &[i64], perm: &[usize]) -> Vec<i64> {
    let rank = dims.len();
    let mut strides = vec![1i64; rank];
    for i in (0..rank.saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    let out_dims: Vec<i64> = perm.iter().map(|&p| dims[p]).collect();
    let mut idx = vec![0i64; rank];
    let mut out = Vec::with_capacity(data.len());
    for _ in 0..data.len() {
        let src: i64 = (0..rank).map(|i| idx[i] * strides[perm[i]]).sum();
        out.push(data[src as usize]);
        for i in (0..rank).rev() {
            idx[i] += 1;
            if idx[i] < out_dims[i] {
                break;
            }
            idx[i] = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{AxisRefProto, axis_ref_proto::SubAxis, mesh_proto::MeshAxis};

    #[test]
    fn iota_groups_expand_like_xla_documents() {
        let iota = |g, s, dims: Vec<i64>, perm: Vec<i32>| IotaReplicaGroupListProto {
            num_replica_groups: g,
            num_devices_per_group: s,
            iota_reshape_dims: dims,
            iota_transpose_perm: perm,
        };
        let plain = ReplicaGroups::from_iota(&iota(2, 4, vec![8], vec![0])).unwrap();
        assert_eq!(plain.groups, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        let strided = ReplicaGroups::from_iota(&iota(2, 4, vec![4, 2], vec![1, 0])).unwrap();
        assert_eq!(strided.groups, vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
        assert!(ReplicaGroups::from_iota(&iota(2, 4, vec![3], vec![0])).is_err());
    }

    fn mesh(axes: &[(&str, i64)]) -> MeshProto {
        MeshProto {
            axes: axes
                .iter()
                .map(|(n, s)| MeshAxis {
                    name: n.to_string(),
                    size: *s,
                })
                .collect(),
            ..Default::default()
        }
    }

    fn axis(i: i64, sub: Option<(i64, i64)>) -> AxisRefProto {
        AxisRefProto {
            mesh_axis_index: i,
            sub_axis_info: sub.map(|(pre_size, size)| SubAxis { pre_size, size }),
        }
    }

    #[test]
    fn mesh_axes_group_over_the_named_axes() {
        let m = |axes| MeshAxesReplicaGroupListProto {
            mesh: Some(mesh(&[("x", 2), ("y", 4)])),
            axes,
        };
        let over_y = ReplicaGroups::from_mesh_axes(&m(vec![axis(1, None)])).unwrap();
        assert_eq!(over_y.groups, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        let over_x = ReplicaGroups::from_mesh_axes(&m(vec![axis(0, None)])).unwrap();
        assert_eq!(
            over_x.groups,
            vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]
        );
        let both = ReplicaGroups::from_mesh_axes(&m(vec![axis(1, None), axis(0, None)])).unwrap();
        assert_eq!(both.groups, vec![vec![0, 4, 1, 5, 2, 6, 3, 7]]);
    }

    #[test]
    fn mesh_sub_axes_split_the_axis() {
        // {a:(1)2} on a=8: factors [1,2,4], grouped over the 2 (stride 4).
        let m = MeshAxesReplicaGroupListProto {
            mesh: Some(mesh(&[("a", 8)])),
            axes: vec![axis(0, Some((1, 2)))],
        };
        let g = ReplicaGroups::from_mesh_axes(&m).unwrap();
        assert_eq!(
            g.groups,
            vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]
        );
        // {a:(2)2}: factors [2,2,2], grouped over the middle one (stride 2).
        let m = MeshAxesReplicaGroupListProto {
            mesh: Some(mesh(&[("a", 8)])),
            axes: vec![axis(0, Some((2, 2)))],
        };
        let g = ReplicaGroups::from_mesh_axes(&m).unwrap();
        assert_eq!(
            g.groups,
            vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]
        );
    }

    #[test]
    fn hostile_sizes_are_refused() {
        let iota = IotaReplicaGroupListProto {
            num_replica_groups: 1 << 40,
            num_devices_per_group: 1 << 40,
            iota_reshape_dims: vec![],
            iota_transpose_perm: vec![],
        };
        assert!(ReplicaGroups::from_iota(&iota).is_err());
    }
}
