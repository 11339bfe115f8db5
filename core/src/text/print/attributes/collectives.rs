//! Collectives: channel ids, the three replica-group encodings (printed in
//! the form the instruction was written in), and collective-permute's
//! source-target pairs.

use std::fmt::Write;

use crate::ir::groups::{GroupEncoding, ReplicaGroups};
use crate::ir::opcode::Opcode;
use crate::proto::hlo_instruction_proto::ReplicaGroupList;
use crate::proto::{HloInstructionProto, IotaReplicaGroupListProto, MeshAxesReplicaGroupListProto};
use crate::text::print::{int_list, int_list_tight, join};

/// All-reduce, reduce-scatter, all-gather, all-to-all and
/// collective-broadcast (and their `-start` forms).
pub(super) fn collective(
    op: Opcode,
    i: &HloInstructionProto,
    a: &mut Vec<String>,
) -> Result<(), String> {
    let dims = || format!("dimensions={}", int_list(&i.dimensions));
    if i.channel_id > 0 {
        a.push(format!("channel_id={}", i.channel_id));
    }
    a.push(format!("replica_groups={}", replica_groups(i)?));
    if i.constrain_layout {
        a.push("constrain_layout=true".into());
    }
    let gathers = matches!(op, Opcode::AllGather | Opcode::AllGatherStart);
    if gathers {
        a.push(dims());
    }
    if i.use_global_device_ids {
        a.push("use_global_device_ids=true".into());
    }
    if op == Opcode::ReduceScatter || (op == Opcode::AllToAll && !i.dimensions.is_empty()) {
        a.push(dims());
    }
    Ok(())
}

pub(super) fn collective_permute(i: &HloInstructionProto, a: &mut Vec<String>) {
    if i.channel_id > 0 {
        a.push(format!("channel_id={}", i.channel_id));
    }
    let pairs: Vec<String> = i
        .source_target_pairs
        .iter()
        .map(|p| format!("{{{},{}}}", p.source, p.target))
        .collect();
    a.push(format!("source_target_pairs={{{}}}", pairs.join(",")));
    if !i.dynamic_slice_sizes.is_empty() {
        a.push(format!("slice_sizes={}", int_list(&i.dynamic_slice_sizes)));
    }
}

fn replica_groups(i: &HloInstructionProto) -> Result<String, String> {
    // Print the form the instruction was written in, as XLA does.
    if i.replica_groups.is_empty() {
        match &i.replica_group_list {
            Some(ReplicaGroupList::IotaCollectiveDeviceList(iota)) => return Ok(iota_groups(iota)),
            Some(ReplicaGroupList::CollectiveDeviceList(l))
                if l.iota_replica_group_list.is_some() =>
            {
                if let Some(iota) = &l.iota_replica_group_list {
                    return Ok(iota_groups(iota));
                }
            }
            Some(ReplicaGroupList::MeshAxesReplicaGroupList(m)) => return mesh_axes_groups(m),
            _ => {}
        }
    }
    let groups = ReplicaGroups::of(i)?;
    debug_assert!(matches!(
        groups.encoding,
        GroupEncoding::List | GroupEncoding::Empty
    ));
    Ok(list_groups(&groups.groups))
}

fn list_groups(groups: &[Vec<i64>]) -> String {
    let parts: Vec<String> = groups.iter().map(|g| int_list_tight(g)).collect();
    format!("{{{}}}", parts.join(","))
}

fn iota_groups(iota: &IotaReplicaGroupListProto) -> String {
    let mut s = format!(
        "[{},{}]<=[{}]",
        iota.num_replica_groups,
        iota.num_devices_per_group,
        join(&iota.iota_reshape_dims, ",")
    );
    let identity = iota
        .iota_transpose_perm
        .iter()
        .enumerate()
        .all(|(k, &p)| p as usize == k);
    if iota.iota_reshape_dims.is_empty() {
        s = format!(
            "[{},{}]<=[{}]",
            iota.num_replica_groups,
            iota.num_devices_per_group,
            iota.num_replica_groups * iota.num_devices_per_group
        );
    } else if !identity {
        let _ = write!(s, "T({})", join(&iota.iota_transpose_perm, ","));
    }
    s
}

fn mesh_axes_groups(m: &MeshAxesReplicaGroupListProto) -> Result<String, String> {
    let mesh = m
        .mesh
        .as_ref()
        .ok_or("mesh-axes replica groups without a mesh")?;
    let axes: Vec<String> = mesh
        .axes
        .iter()
        .map(|a| format!("'{}'={}", a.name, a.size))
        .collect();
    let mut s = format!("mesh[{}]", axes.join(","));
    if let Some(iota) = &mesh.iota_transform {
        let _ = write!(s, ", device_ids=([{}]", join(&iota.reshape_dims, ","));
        if iota.reshape_dims.len() > 1 {
            let _ = write!(s, "T({})", join(&iota.transpose_perm, ","));
        }
        s.push(')');
    } else if !mesh.device_ids.is_empty() {
        let _ = write!(s, ", device_ids=({})", join(&mesh.device_ids, ","));
    }
    let refs: Vec<String> = m
        .axes
        .iter()
        .map(|r| {
            let name = usize::try_from(r.mesh_axis_index)
                .ok()
                .and_then(|k| mesh.axes.get(k))
                .map(|a| a.name.clone())
                .unwrap_or_else(|| r.mesh_axis_index.to_string());
            match &r.sub_axis_info {
                Some(sub) => format!("'{name}':({}){}", sub.pre_size, sub.size),
                None => format!("'{name}'"),
            }
        })
        .collect();
    let _ = write!(s, " {{{}}}", refs.join(","));
    Ok(s)
}
