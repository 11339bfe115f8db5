//! A synthesized tensor-parallel prefill module (see benches/pass.rs).

use equarx::proto::hlo_instruction_proto::ReplicaGroupList;
use equarx::proto::{
    CollectiveDeviceListProto, DeviceAssignmentProto, DotDimensionNumbers, HloComputationProto,
    HloInstructionProto, HloModuleProto, LayoutProto, PrimitiveType, ProgramShapeProto,
    ReplicaGroup, ShapeProto, device_assignment_proto::ComputationDevice,
    hlo_instruction_proto::SliceDimensions,
};

const WIDTH: i64 = 5376;
const FFN_PER_DEVICE: i64 = 2688;
const SEQ: i64 = 2048;
pub const TP: i64 = 8;

fn shape(dims: &[i64]) -> ShapeProto {
    ShapeProto {
        element_type: PrimitiveType::Bf16 as i32,
        dimensions: dims.to_vec(),
        is_dynamic_dimension: vec![false; dims.len()],
        tuple_shapes: vec![],
        layout: Some(Box::new(LayoutProto {
            minor_to_major: (0..dims.len() as i64).rev().collect(),
            ..Default::default()
        })),
    }
}

/// Instructions of one computation, numbered the way XLA numbers them.
struct Comp {
    id: i64,
    instrs: Vec<HloInstructionProto>,
}

impl Comp {
    fn add(
        &mut self,
        name: String,
        opcode: &str,
        dims: &[i64],
        operands: &[i64],
        edit: impl FnOnce(&mut HloInstructionProto),
    ) -> i64 {
        let id = (self.id << 32) | (self.instrs.len() as i64 + 1);
        let mut i = HloInstructionProto {
            name,
            opcode: opcode.into(),
            shape: Some(shape(dims)),
            id,
            operand_ids: operands.to_vec(),
            ..Default::default()
        };
        edit(&mut i);
        self.instrs.push(i);
        id
    }
}

/// A `layers`-layer tensor-parallel prefill after SPMD partitioning.
pub fn tp_prefill(layers: usize) -> HloModuleProto {
    let mut add = Comp {
        id: 1,
        instrs: vec![],
    };
    let a = add.add("a".into(), "parameter", &[], &[], |_| {});
    let b = add.add("b".into(), "parameter", &[], &[], |i| {
        i.parameter_number = 1
    });
    let sum = add.add("sum".into(), "add", &[], &[a, b], |_| {});
    let mut e = Comp {
        id: 2,
        instrs: vec![],
    };
    let mut params = vec![shape(&[SEQ, WIDTH])];
    let mut x = e.add("x".into(), "parameter", &[SEQ, WIDTH], &[], |_| {});
    let dot = |lhs: i64, rhs: i64| {
        move |i: &mut HloInstructionProto| {
            i.dot_dimension_numbers = Some(Box::new(DotDimensionNumbers {
                lhs_contracting_dimensions: vec![1],
                rhs_contracting_dimensions: vec![0],
                ..Default::default()
            }));
            let _ = (lhs, rhs);
        }
    };
    let all_reduce = |i: &mut HloInstructionProto| {
        i.channel_id = 1;
        i.use_global_device_ids = true;
        i.called_computation_ids = vec![1];
        i.replica_group_list = Some(ReplicaGroupList::CollectiveDeviceList(
            CollectiveDeviceListProto {
                replica_groups: vec![ReplicaGroup {
                    replica_ids: (0..TP).collect(),
                }],
                iota_replica_group_list: None,
            },
        ));
    };
    for l in 0..layers {
        let n = params.len() as i64;
        let wo = e.add(
            format!("wo.{l}"),
            "parameter",
            &[WIDTH / TP, WIDTH],
            &[],
            |i| i.parameter_number = n,
        );
        let wd = e.add(
            format!("wdown.{l}"),
            "parameter",
            &[FFN_PER_DEVICE, WIDTH],
            &[],
            |i| i.parameter_number = n + 1,
        );
        params.push(shape(&[WIDTH / TP, WIDTH]));
        params.push(shape(&[FFN_PER_DEVICE, WIDTH]));
        let slice = |limit: i64| {
            move |i: &mut HloInstructionProto| {
                i.slice_dimensions = vec![
                    SliceDimensions {
                        start: 0,
                        limit: SEQ,
                        stride: 1,
                    },
                    SliceDimensions {
                        start: 0,
                        limit,
                        stride: 1,
                    },
                ];
            }
        };
        let heads = e.add(
            format!("heads.{l}"),
            "slice",
            &[SEQ, WIDTH / TP],
            &[x],
            slice(WIDTH / TP),
        );
        let proj = e.add(
            format!("attn_out.{l}"),
            "dot",
            &[SEQ, WIDTH],
            &[heads, wo],
            dot(heads, wo),
        );
        let ar = e.add(
            format!("all-reduce.{}", 2 * l),
            "all-reduce",
            &[SEQ, WIDTH],
            &[proj],
            all_reduce,
        );
        x = e.add(
            format!("residual.{}", 2 * l),
            "add",
            &[SEQ, WIDTH],
            &[x, ar],
            |_| {},
        );
        let up = e.add(
            format!("mlp_up.{l}"),
            "slice",
            &[SEQ, FFN_PER_DEVICE],
            &[x],
            slice(FFN_PER_DEVICE),
        );
        let down = e.add(
            format!("mlp_down.{l}"),
            "dot",
            &[SEQ, WIDTH],
            &[up, wd],
            dot(up, wd),
        );
        let ar = e.add(
            format!("all-reduce.{}", 2 * l + 1),
            "all-reduce",
            &[SEQ, WIDTH],
            &[down],
            all_reduce,
        );
        x = e.add(
            format!("residual.{}", 2 * l + 1),
            "add",
            &[SEQ, WIDTH],
            &[x, ar],
            |_| {},
        );
    }
    let root = x;
    let program = ProgramShapeProto {
        parameters: params,
        result: Some(shape(&[SEQ, WIDTH])),
        parameter_names: vec![],
    };
    let scalar = ProgramShapeProto {
        parameters: vec![shape(&[]), shape(&[])],
        result: Some(shape(&[])),
        parameter_names: vec![],
    };
    HloModuleProto {
        name: format!("tp_prefill_{layers}_layers"),
        entry_computation_name: "main".into(),
        entry_computation_id: 2,
        host_program_shape: Some(program.clone()),
        computations: vec![
            HloComputationProto {
                name: "add".into(),
                instructions: add.instrs,
                program_shape: Some(scalar),
                id: 1,
                root_id: sum,
                ..Default::default()
            },
            HloComputationProto {
                name: "main".into(),
                instructions: e.instrs,
                program_shape: Some(program),
                id: 2,
                root_id: root,
                ..Default::default()
            },
        ],
        device_assignment: Some(DeviceAssignmentProto {
            replica_count: 1,
            computation_count: TP as i32,
            computation_devices: (0..TP)
                .map(|p| ComputationDevice {
                    replica_device_ids: vec![p],
                })
                .collect(),
        }),
        ..Default::default()
    }
}
