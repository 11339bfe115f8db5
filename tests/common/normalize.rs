//! Structural comparison of two modules whose ids differ (XLA's parser and
//! ours number differently): ids become names, and the few differences that
//! carry no information are normalized explicitly (listed on [`normalize`]).
//! Fields are compared through prost-reflect, so a field nobody thought of
//! is compared too.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use equarx::proto::HloModuleProto;
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MapKey, ReflectMessage, Value};

pub fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(equarx::proto::DESCRIPTOR_SET).expect("descriptor set")
    })
}

pub fn dynamic<M: Message>(m: &M, name: &str) -> DynamicMessage {
    let desc = pool().get_message_by_name(name).expect("message in schema");
    let mut d = DynamicMessage::decode(desc, &*m.encode_to_vec()).expect("re-decode");
    prune(&mut d);
    d
}

/// Sub-messages XLA writes even when they hold nothing, where the text says
/// nothing: an empty one equals an absent one. Other messages keep their
/// presence (an all-default `sharding={replicated}` is not "no sharding").
pub const WRITTEN_WHEN_EMPTY: &[&str] = &[
    "metadata",
    "frontend_attributes",
    "statistics_viz",
    "input_output_alias",
    "buffer_donor",
    "collective_device_list",
    "stack_frame_index",
];

/// Clears the [`WRITTEN_WHEN_EMPTY`] sub-messages that hold nothing.
pub fn prune(m: &mut DynamicMessage) {
    let mut empty = Vec::new();
    for (f, v) in m.fields_mut() {
        match v {
            Value::Message(inner) => {
                prune(inner);
                if WRITTEN_WHEN_EMPTY.contains(&f.name()) && inner.fields().next().is_none() {
                    empty.push(f);
                }
            }
            Value::List(items) => {
                for item in items {
                    if let Value::Message(inner) = item {
                        prune(inner);
                    }
                }
            }
            Value::Map(entries) => {
                for item in entries.values_mut() {
                    if let Value::Message(inner) = item {
                        prune(inner);
                    }
                }
            }
            _ => {}
        }
    }
    for f in empty {
        m.clear_field(&f);
    }
}

/// One instruction: its fields (ids cleared) and its references by name.
pub struct NormInstr {
    msg: DynamicMessage,
    operands: Vec<String>,
    control: Vec<String>,
    called: Vec<String>,
    /// The stack frames its metadata points to, by content (see [`Frames`]).
    frames: Vec<String>,
}

/// How stack frames are compared.
#[derive(Clone, Copy, PartialEq)]
pub enum Frames {
    /// Table and `stack_frame_id`s as they are.
    Exact,
    /// By content: each `stack_frame_id` becomes the chain of
    /// "file:line:column function" it points to, and the tables are not
    /// compared. XLA rebuilds the table when it builds its module from text
    /// or from a proto (in instruction order, dropping rows no instruction
    /// reaches, renumbering the rest), which our parser does not imitate;
    /// the frames each instruction points to stay the same.
    ByContent,
}

/// The frame chain `id` points to, innermost first.
pub fn frame_chain(index: Option<&equarx::proto::StackFrameIndexProto>, id: i32) -> Vec<String> {
    let mut out = Vec::new();
    let Some(ix) = index else {
        return vec![format!("<no table, frame {id}>")];
    };
    let mut id = id;
    while id != 0 && out.len() < 1000 {
        let Some(f) = usize::try_from(id - 1)
            .ok()
            .and_then(|k| ix.stack_frames.get(k))
        else {
            out.push(format!("<bad frame {id}>"));
            break;
        };
        let loc = usize::try_from(f.file_location_id - 1)
            .ok()
            .and_then(|k| ix.file_locations.get(k));
        out.push(match loc {
            Some(l) => {
                let get = |v: &Vec<String>, k: i32| {
                    usize::try_from(k - 1)
                        .ok()
                        .and_then(|k| v.get(k))
                        .cloned()
                        .unwrap_or_default()
                };
                format!(
                    "{}:{}:{}-{}:{} {}",
                    get(&ix.file_names, l.file_name_id),
                    l.line,
                    l.column,
                    l.end_line,
                    l.end_column,
                    get(&ix.function_names, l.function_name_id)
                )
            }
            None => format!("<bad location {}>", f.file_location_id),
        });
        id = f.parent_frame_id;
    }
    out
}

pub struct NormComp {
    header: DynamicMessage,
    root: String,
    instrs: BTreeMap<String, NormInstr>,
}

/// A module with ids replaced by names.
pub struct Norm {
    header: DynamicMessage,
    /// Computation names in proto order.
    order: Vec<String>,
    comps: BTreeMap<String, NormComp>,
    schedule: BTreeMap<String, Vec<String>>,
    entry: String,
}

/// Normalizations, all explicit:
/// - ids (module, computation, instruction) are replaced by names; the
///   module `id` is XLA's process-wide counter and is dropped;
/// - empty sub-messages equal absent ones ([`prune`]);
/// - module fields HLO text has no syntax for are dropped:
///   `device_assignment` (its counts travel as `replica_count` /
///   `num_partitions` in the header and are checked against
///   `ParsedText::counts` separately), `spmd_output_sharding` and
///   `spmd_parameters_shardings`;
/// - with [`Frames::ByContent`], stack frames are compared by content.
pub fn normalize(m: &HloModuleProto, frames: Frames) -> Norm {
    let comp_names: BTreeMap<i64, String> = m
        .computations
        .iter()
        .map(|c| (c.id, c.name.clone()))
        .collect();
    let mut instr_names: BTreeMap<i64, String> = BTreeMap::new();
    for c in &m.computations {
        for i in &c.instructions {
            instr_names.insert(i.id, i.name.clone());
        }
    }
    let iname = |id: &i64| {
        instr_names
            .get(id)
            .cloned()
            .unwrap_or_else(|| format!("<unknown id {id}>"))
    };
    let cname = |id: &i64| {
        comp_names
            .get(id)
            .cloned()
            .unwrap_or_else(|| format!("<unknown computation {id}>"))
    };
    let mut comps = BTreeMap::new();
    for c in &m.computations {
        let mut instrs = BTreeMap::new();
        for i in &c.instructions {
            let mut i2 = i.clone();
            i2.id = 0;
            let operands = std::mem::take(&mut i2.operand_ids)
                .iter()
                .map(iname)
                .collect();
            let control = std::mem::take(&mut i2.control_predecessor_ids)
                .iter()
                .map(iname)
                .collect();
            let called = std::mem::take(&mut i2.called_computation_ids)
                .iter()
                .map(cname)
                .collect();
            let mut chain = Vec::new();
            if frames == Frames::ByContent {
                if let Some(md) = i2.metadata.as_mut() {
                    if md.stack_frame_id != 0 {
                        chain = frame_chain(m.stack_frame_index.as_ref(), md.stack_frame_id);
                        md.stack_frame_id = 0;
                    }
                }
            }
            let prev = instrs.insert(
                i.name.clone(),
                NormInstr {
                    msg: dynamic(&i2, "xla.HloInstructionProto"),
                    operands,
                    control,
                    called,
                    frames: chain,
                },
            );
            assert!(
                prev.is_none(),
                "duplicate instruction name {} in {}",
                i.name,
                c.name
            );
        }
        let mut header = c.clone();
        header.instructions.clear();
        header.id = 0;
        header.root_id = 0;
        comps.insert(
            c.name.clone(),
            NormComp {
                header: dynamic(&header, "xla.HloComputationProto"),
                root: iname(&c.root_id),
                instrs,
            },
        );
    }
    let schedule = m
        .schedule
        .as_ref()
        .map(|s| {
            s.sequences
                .iter()
                .map(|(id, seq)| (cname(id), seq.instruction_ids.iter().map(iname).collect()))
                .collect()
        })
        .unwrap_or_default();
    let mut header = m.clone();
    header.computations.clear();
    header.id = 0;
    header.entry_computation_id = 0;
    header.schedule = None;
    header.device_assignment = None;
    header.spmd_output_sharding = None;
    header.spmd_parameters_shardings.clear();
    if frames == Frames::ByContent {
        header.stack_frame_index = None;
    }
    Norm {
        header: dynamic(&header, "xla.HloModuleProto"),
        order: m.computations.iter().map(|c| c.name.clone()).collect(),
        comps,
        schedule,
        entry: cname(&m.entry_computation_id),
    }
}

/// Every difference between `a` and `b`, as readable lines.
pub fn diff(a: &HloModuleProto, b: &HloModuleProto, frames: Frames) -> Vec<String> {
    let (a, b) = (normalize(a, frames), normalize(b, frames));
    let mut out = Vec::new();
    diff_msg("module", &a.header, &b.header, &mut out);
    if a.entry != b.entry {
        out.push(format!("entry: {} vs {}", a.entry, b.entry));
    }
    if a.order != b.order {
        out.push(format!("computation order: {:?} vs {:?}", a.order, b.order));
    }
    if a.schedule != b.schedule {
        out.push(format!("schedule: {:?} vs {:?}", a.schedule, b.schedule));
    }
    for (name, ca) in &a.comps {
        let Some(cb) = b.comps.get(name) else {
            out.push(format!("computation {name} only on the left"));
            continue;
        };
        diff_msg(name, &ca.header, &cb.header, &mut out);
        if ca.root != cb.root {
            out.push(format!("{name}: root {} vs {}", ca.root, cb.root));
        }
        for (iname, ia) in &ca.instrs {
            let Some(ib) = cb.instrs.get(iname) else {
                out.push(format!("{name}/{iname} only on the left"));
                continue;
            };
            let path = format!("{name}/{iname}");
            diff_msg(&path, &ia.msg, &ib.msg, &mut out);
            for (what, x, y) in [
                ("operands", &ia.operands, &ib.operands),
                ("control-predecessors", &ia.control, &ib.control),
                ("called computations", &ia.called, &ib.called),
                ("stack frames", &ia.frames, &ib.frames),
            ] {
                if x != y {
                    out.push(format!("{path}: {what} {x:?} vs {y:?}"));
                }
            }
        }
        for iname in cb.instrs.keys().filter(|n| !ca.instrs.contains_key(*n)) {
            out.push(format!("{name}/{iname} only on the right"));
        }
    }
    for name in b.comps.keys().filter(|n| !a.comps.contains_key(*n)) {
        out.push(format!("computation {name} only on the right"));
    }
    out
}

pub fn diff_msg(path: &str, a: &DynamicMessage, b: &DynamicMessage, out: &mut Vec<String>) {
    for f in a.descriptor().fields() {
        let (x, y) = (a.has_field(&f), b.has_field(&f));
        let p = format!("{path}.{}", f.name());
        match (x, y) {
            (false, false) => {}
            (true, false) => out.push(format!("{p}: {} vs (absent)", show(&a.get_field(&f)))),
            (false, true) => out.push(format!("{p}: (absent) vs {}", show(&b.get_field(&f)))),
            (true, true) => diff_value(&p, &a.get_field(&f), &b.get_field(&f), out),
        }
    }
}

pub fn diff_value(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Message(x), Value::Message(y)) => diff_msg(path, x, y, out),
        (Value::List(x), Value::List(y)) => {
            if x.len() != y.len() {
                out.push(format!(
                    "{path}: {} vs {} entries: {} vs {}",
                    x.len(),
                    y.len(),
                    show(a),
                    show(b)
                ));
                return;
            }
            for (k, (u, v)) in x.iter().zip(y).enumerate() {
                diff_value(&format!("{path}[{k}]"), u, v, out);
            }
        }
        (Value::Map(x), Value::Map(y)) => {
            let keys: std::collections::BTreeSet<String> =
                x.keys().chain(y.keys()).map(map_key).collect();
            for k in keys {
                let find = |m: &std::collections::HashMap<MapKey, Value>| {
                    m.iter()
                        .find(|(mk, _)| map_key(mk) == k)
                        .map(|(_, v)| v.clone())
                };
                match (find(x), find(y)) {
                    (Some(u), Some(v)) => diff_value(&format!("{path}[{k}]"), &u, &v, out),
                    (u, v) => out.push(format!(
                        "{path}[{k}]: {} vs {}",
                        u.as_ref().map_or("(absent)".into(), show),
                        v.as_ref().map_or("(absent)".into(), show)
                    )),
                }
            }
        }
        (Value::F32(x), Value::F32(y)) if x.to_bits() == y.to_bits() => {}
        (Value::F64(x), Value::F64(y)) if x.to_bits() == y.to_bits() => {}
        (Value::F32(_), Value::F32(_)) | (Value::F64(_), Value::F64(_)) => {
            out.push(format!("{path}: {} vs {}", show(a), show(b)));
        }
        _ if a == b => {}
        _ => out.push(format!("{path}: {} vs {}", show(a), show(b))),
    }
}

/// A value in one short line: `{field: value, ...}`, `[...]`.
pub fn show(v: &Value) -> String {
    match v {
        Value::Message(m) => {
            let parts: Vec<String> = m
                .fields()
                .map(|(f, v)| format!("{}: {}", f.name(), show(v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        Value::List(items) => {
            let parts: Vec<String> = items.iter().take(16).map(show).collect();
            let more = if items.len() > 16 { ", ..." } else { "" };
            format!("[{}{more}]", parts.join(", "))
        }
        Value::Map(m) => {
            let mut parts: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{}: {}", map_key(k), show(v)))
                .collect();
            parts.sort();
            format!("{{{}}}", parts.join(", "))
        }
        Value::String(s) => format!("{s:?}"),
        Value::Bytes(b) => format!("b{:?}", String::from_utf8_lossy(b)),
        Value::EnumNumber(n) => n.to_string(),
        Value::F32(x) => format!("{x:?} (0x{:08x})", x.to_bits()),
        Value::F64(x) => format!("{x:?} (0x{:016x})", x.to_bits()),
        Value::Bool(x) => x.to_string(),
        Value::I32(x) => x.to_string(),
        Value::I64(x) => x.to_string(),
        Value::U32(x) => x.to_string(),
        Value::U64(x) => x.to_string(),
    }
}

pub fn map_key(k: &MapKey) -> String {
    format!("{k:?}")
}

/// Every computation's operands and control predecessors come before their
/// users, and callees come before their callers.
pub fn assert_ordered(m: &HloModuleProto, what: &str) {
    let mut seen_comps = std::collections::HashSet::new();
    for c in &m.computations {
        let mut seen = std::collections::HashSet::new();
        for i in &c.instructions {
            for o in i.operand_ids.iter().chain(&i.control_predecessor_ids) {
                assert!(
                    seen.contains(o),
                    "{what}: {}/{} uses {o} before it is defined",
                    c.name,
                    i.name
                );
            }
            for callee in &i.called_computation_ids {
                assert!(
                    seen_comps.contains(callee),
                    "{what}: {} calls computation {callee} before it is listed",
                    c.name
                );
            }
            seen.insert(i.id);
        }
        seen_comps.insert(c.id);
    }
}

pub fn report(failures: Vec<String>) {
    if !failures.is_empty() {
        panic!("{} failure(s):\n{}", failures.len(), failures.join("\n\n"));
    }
}

pub fn diff_failure(what: &str, d: Vec<String>) -> Option<String> {
    if d.is_empty() {
        return None;
    }
    let shown: Vec<&String> = d.iter().take(40).collect();
    Some(format!(
        "{what}: {} difference(s):\n  {}",
        d.len(),
        shown
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n  ")
    ))
}
