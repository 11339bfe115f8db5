//! Test modules: fixtures, and variants of them made by editing the proto
//! (other group encodings and counts, other sizes, frontend attributes),
//! for the tests that are not case files (`tests/cases/` holds those as
//! text).

use equarx::ir::shape;
use equarx::proto::hlo_instruction_proto::ReplicaGroupList;
use equarx::proto::{
    CollectiveDeviceListProto, DeviceAssignmentProto, HloInstructionProto, HloModuleProto,
    IotaReplicaGroupListProto, ReplicaGroup, ShapeProto,
    device_assignment_proto::ComputationDevice,
};

pub fn load(name: &str) -> HloModuleProto {
    equarx::io::decode(&super::fixture(name), None)
        .expect("fixture decodes")
        .module
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

/// A module holding one reduce-scatter, all-gather or all-to-all of bf16
/// operands, for [`collective_text`].
pub struct CollectiveSpec<'a> {
    pub name: &'a str,
    pub collective: equarx::plan::Collective,
    /// The operand's dimensions (a tuple all-to-all: each operand's).
    pub dims: &'a [i64],
    /// The collective's dimension; `None`: a tuple all-to-all of one
    /// operand per rank.
    pub dim: Option<i64>,
    /// The groups, as partition ids (or replica ids with `replicas`).
    pub groups: &'a [Vec<usize>],
    /// No channel id: the groups name replicas.
    pub replicas: bool,
    /// Written as an all-gather-start / -done pair.
    pub async_pair: bool,
}

/// The module of `spec` as HLO text (equarx's parser reads it; XLA's own
/// parser agrees with it: tests/text.rs).
pub fn collective_text(spec: &CollectiveSpec) -> String {
    use equarx::plan::Collective;
    let text = |d: &[i64]| d.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let p = spec.groups[0].len() as i64;
    let devices: usize = spec.groups.iter().map(Vec::len).sum();
    let mut out_dims = spec.dims.to_vec();
    if let Some(d) = spec.dim {
        match spec.collective {
            Collective::ReduceScatter => out_dims[d as usize] /= p,
            Collective::AllGather => out_dims[d as usize] *= p,
            _ => {}
        }
    }
    let x = format!("bf16[{}]", text(spec.dims));
    let y = format!("bf16[{}]", text(&out_dims));
    let lists: Vec<String> = spec
        .groups
        .iter()
        .map(|g| {
            format!(
                "{{{}}}",
                g.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
            )
        })
        .collect();
    let groups = format!("replica_groups={{{}}}", lists.join(","));
    let op = spec.collective.opcode();
    // all-to-all has no use_global_device_ids: with a channel id it is
    // cross-partition.
    let attrs = match (spec.replicas, op) {
        (true, _) => groups,
        (false, "all-to-all") => format!("channel_id=1, {groups}"),
        (false, _) => format!("channel_id=1, {groups}, use_global_device_ids=true"),
    };
    let (replicas, partitions) = if spec.replicas {
        (devices, 1)
    } else {
        (1, devices)
    };
    let header = format!(
        "HloModule {}, replica_count={replicas}, num_partitions={partitions}\n\n",
        spec.name
    );
    if spec.dim.is_none() {
        let n = p as usize;
        let params: Vec<String> = (0..n).map(|k| format!("p{k}: {x}")).collect();
        let mut lines: Vec<String> = (0..n)
            .map(|k| format!("  %p{k} = {x} parameter({k})"))
            .collect();
        let ops: Vec<String> = (0..n).map(|k| format!("%p{k}")).collect();
        let tuple = vec![x.clone(); n].join(", ");
        lines.push(format!(
            "  ROOT %c = ({tuple}) all-to-all({}), {attrs}",
            ops.join(", ")
        ));
        return format!(
            "{header}ENTRY %main ({}) -> ({tuple}) {{\n{}\n}}\n",
            params.join(", "),
            lines.join("\n")
        );
    }
    let d = spec.dim.unwrap_or(0);
    let body = match spec.collective {
        Collective::ReduceScatter => {
            format!(
                "  ROOT %c = {y} reduce-scatter(%x), {attrs}, dimensions={{{d}}}, to_apply=%add"
            )
        }
        Collective::AllGather if spec.async_pair => format!(
            "  %start = ({x}, {y}) all-gather-start(%x), {attrs}, dimensions={{{d}}}\n  ROOT %c = {y} all-gather-done(%start)"
        ),
        Collective::AllGather => {
            format!("  ROOT %c = {y} all-gather(%x), {attrs}, dimensions={{{d}}}")
        }
        _ => format!("  ROOT %c = {y} {op}(%x), {attrs}, dimensions={{{d}}}"),
    };
    let add = "%add (a: bf16[], b: bf16[]) -> bf16[] {\n  %a = bf16[] parameter(0)\n  %b = bf16[] parameter(1)\n  ROOT %s = bf16[] add(%a, %b)\n}\n\n";
    format!("{header}{add}ENTRY %main (x: {x}) -> {y} {{\n  %x = {x} parameter(0)\n{body}\n}}\n")
}

/// The module of `spec`, parsed.
pub fn collective_module(spec: &CollectiveSpec) -> HloModuleProto {
    let text = collective_text(spec);
    equarx::text::parse(&text)
        .unwrap_or_else(|e| panic!("{}: {e}\n{text}", spec.name))
        .proto
}
