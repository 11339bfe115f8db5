//! Test modules: fixtures, and variants of them made by editing the proto
//! (other group encodings and modes, async pairs, other sizes, negative
//! twins). Shared by the real-XLA runs and the snapshots.

use equarx::ir::shape;
use equarx::proto::hlo_instruction_proto::ReplicaGroupList;
use equarx::proto::{
    CollectiveDeviceListProto, DeviceAssignmentProto, HloInstructionProto, HloModuleProto,
    IotaReplicaGroupListProto, ReplicaGroup, ShapeProto,
    device_assignment_proto::ComputationDevice,
};
use equarx::{AlgorithmOption, Options, RewriteOptions, RotationOption};

pub fn load(name: &str) -> HloModuleProto {
    equarx::io::decode(&super::fixture(name), None)
        .expect("fixture decodes")
        .module
}

/// Test options: every eligible all-reduce is rewritten (small fixtures
/// would not pay on a real machine) by the paper's ring, unrotated, with
/// one lane, one way round (the shortest text; the cases about algorithms,
/// rotation, lanes and directions set them).
pub fn opts(edit: impl FnOnce(&mut Options)) -> RewriteOptions {
    let mut o = Options {
        min_payload_bytes: Some(0),
        pipeline_depth: 1,
        bidirectional: false,
        algorithm: AlgorithmOption::Ring,
        rotation: RotationOption::None,
        ..Options::default()
    };
    edit(&mut o);
    RewriteOptions {
        pass: o,
        ..RewriteOptions::default()
    }
}

pub fn all_reduces(m: &mut HloModuleProto) -> impl Iterator<Item = &mut HloInstructionProto> {
    m.computations
        .iter_mut()
        .flat_map(|c| c.instructions.iter_mut())
        .filter(|i| i.opcode == "all-reduce")
}

pub fn list(groups: &[&[i64]]) -> Option<ReplicaGroupList> {
    Some(ReplicaGroupList::CollectiveDeviceList(
        CollectiveDeviceListProto {
            replica_groups: groups
                .iter()
                .map(|g| ReplicaGroup {
                    replica_ids: g.to_vec(),
                })
                .collect(),
            iota_replica_group_list: None,
        },
    ))
}

pub fn with_counts(m: &mut HloModuleProto, replicas: usize, partitions: usize) {
    m.device_assignment = Some(DeviceAssignmentProto {
        replica_count: replicas as i32,
        computation_count: partitions as i32,
        computation_devices: (0..partitions)
            .map(|p| ComputationDevice {
                replica_device_ids: (0..replicas).map(|r| (r * partitions + p) as i64).collect(),
            })
            .collect(),
    });
}

/// Turns every all-reduce into an `all-reduce-start` / `all-reduce-done` pair.
pub fn make_async(m: &mut HloModuleProto) {
    for c in &mut m.computations {
        let Some(pos) = c.instructions.iter().position(|i| i.opcode == "all-reduce") else {
            continue;
        };
        let start_id = c.instructions[pos].id;
        c.instructions[pos].opcode = "all-reduce-start".into();
        let max_local = c
            .instructions
            .iter()
            .map(|i| i.id & 0xffff_ffff)
            .max()
            .unwrap();
        let done = HloInstructionProto {
            name: format!("{}.done", c.instructions[pos].name),
            opcode: "all-reduce-done".into(),
            shape: c.instructions[pos].shape.clone(),
            id: (c.id << 32) | (max_local + 1),
            operand_ids: vec![start_id],
            ..Default::default()
        };
        let done_id = done.id;
        for i in &mut c.instructions {
            for op in &mut i.operand_ids {
                if *op == start_id {
                    *op = done_id;
                }
            }
        }
        if c.root_id == start_id {
            c.root_id = done_id;
        }
        c.instructions.insert(pos + 1, done);
    }
}

pub fn iota(groups: i64, size: i64, dims: &[i64], perm: &[i32]) -> Option<ReplicaGroupList> {
    Some(ReplicaGroupList::IotaCollectiveDeviceList(
        IotaReplicaGroupListProto {
            num_replica_groups: groups,
            num_devices_per_group: size,
            iota_reshape_dims: dims.to_vec(),
            iota_transpose_perm: perm.to_vec(),
        },
    ))
}

/// Every shape with dimensions `from` gets dimensions `to` (module and
/// computation program shapes included): the same program at another size.
pub fn resized(mut m: HloModuleProto, from: &[i64], to: &[i64]) -> HloModuleProto {
    fn grow(s: &mut ShapeProto, from: &[i64], to: &[i64]) {
        if s.dimensions == from {
            s.dimensions = to.to_vec();
            s.is_dynamic_dimension = vec![false; to.len()];
            s.layout = Some(Box::new(shape::default_layout(to.len())));
        }
        s.tuple_shapes.iter_mut().for_each(|t| grow(t, from, to));
    }
    for c in &mut m.computations {
        for i in &mut c.instructions {
            if let Some(s) = i.shape.as_mut() {
                grow(s, from, to);
            }
        }
        if let Some(ps) = &mut c.program_shape {
            ps.parameters.iter_mut().for_each(|p| grow(p, from, to));
            ps.result.iter_mut().for_each(|r| grow(r, from, to));
        }
    }
    if let Some(ps) = &mut m.host_program_shape {
        ps.parameters.iter_mut().for_each(|p| grow(p, from, to));
        ps.result.iter_mut().for_each(|r| grow(r, from, to));
    }
    m
}

/// Every array of element type `from` becomes `to` (the whole program).
pub fn retyped(mut m: HloModuleProto, from: i32, to: i32) -> HloModuleProto {
    fn fix(s: &mut ShapeProto, from: i32, to: i32) {
        if s.element_type == from {
            s.element_type = to;
        }
        s.tuple_shapes.iter_mut().for_each(|t| fix(t, from, to));
    }
    for c in &mut m.computations {
        for i in &mut c.instructions {
            if let Some(s) = i.shape.as_mut() {
                fix(s, from, to);
            }
        }
        if let Some(ps) = &mut c.program_shape {
            ps.parameters.iter_mut().for_each(|p| fix(p, from, to));
            ps.result.iter_mut().for_each(|r| fix(r, from, to));
        }
    }
    if let Some(ps) = &mut m.host_program_shape {
        ps.parameters.iter_mut().for_each(|p| fix(p, from, to));
        ps.result.iter_mut().for_each(|r| fix(r, from, to));
    }
    m
}

/// The reduction computations' `add` becomes `opcode`.
pub fn with_reducer(mut m: HloModuleProto, opcode: &str) -> HloModuleProto {
    let reducers: Vec<i64> = all_reduces(&mut m)
        .flat_map(|i| i.called_computation_ids.clone())
        .collect();
    for c in m
        .computations
        .iter_mut()
        .filter(|c| reducers.contains(&c.id))
    {
        for i in c.instructions.iter_mut().filter(|i| i.id == c.root_id) {
            i.opcode = opcode.into();
        }
    }
    m
}

/// Sets a frontend attribute on every all-reduce.
pub fn with_attribute(mut m: HloModuleProto, key: &str, value: &str) -> HloModuleProto {
    for ar in all_reduces(&mut m) {
        ar.frontend_attributes
            .get_or_insert_with(Box::default)
            .map
            .insert(key.into(), value.into());
    }
    m
}
