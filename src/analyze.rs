//! `equarx analyze`: every collective of a module, with what the pass needs
//! to know about it.

use crate::ir::groups::{GroupMode, ReplicaGroups};
use crate::ir::{InstrId, Module, shape};

/// One collective instruction.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Collective {
    pub name: String,
    pub computation: String,
    pub opcode: String,
    pub shape: String,
    pub element_types: Vec<String>,
    /// Devices per group (for collective-permute: the number of pairs).
    pub group_size: Option<usize>,
    pub groups: Option<usize>,
    pub mode: String,
    pub encoding: Option<String>,
    pub channel_id: Option<i64>,
    /// Bytes of the operands.
    pub payload_bytes: u64,
}

const COLLECTIVES: &[&str] = &[
    "all-reduce",
    "all-reduce-start",
    "all-gather",
    "all-gather-start",
    "reduce-scatter",
    "all-to-all",
    "ragged-all-to-all",
    "collective-permute",
    "collective-permute-start",
    "collective-broadcast",
];

/// Lists the collectives of `module` in module order.
pub fn collectives(module: &Module) -> Vec<Collective> {
    let mut out = Vec::new();
    for c in module.computations() {
        for i in c.instructions() {
            if !COLLECTIVES.contains(&i.opcode.as_str()) {
                continue;
            }
            let operands: Vec<_> = i
                .operand_ids
                .iter()
                .filter_map(|&o| c.get(InstrId(o)).and_then(|o| o.shape.as_ref()))
                .collect();
            let mut types: Vec<String> = operands
                .iter()
                .map(|s| shape::type_name(s.element_type).unwrap_or("?").to_string())
                .collect();
            types.dedup();
            let permute = i.opcode.starts_with("collective-permute");
            let groups = if permute {
                None
            } else {
                ReplicaGroups::of(i).ok()
            };
            out.push(Collective {
                name: i.name.clone(),
                computation: c.name().to_string(),
                opcode: i.opcode.clone(),
                shape: i.shape.as_ref().map(shape::describe).unwrap_or_default(),
                element_types: types,
                group_size: if permute {
                    Some(i.source_target_pairs.len())
                } else {
                    groups.as_ref().and_then(ReplicaGroups::uniform_size)
                },
                groups: groups.as_ref().map(|g| g.groups.len()),
                mode: GroupMode::of(i).as_str().to_string(),
                encoding: groups.map(|g| g.encoding.as_str().to_string()),
                channel_id: (i.channel_id > 0).then_some(i.channel_id),
                payload_bytes: operands.iter().filter_map(|s| shape::byte_size(s)).sum(),
            });
        }
    }
    out
}
