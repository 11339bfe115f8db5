//! The editable view of an `HloModuleProto`.
//!
//! Instructions stay the proto messages they were decoded as, so every field,
//! known to equarx's passes or not, survives an edit. The view adds what a
//! pass needs on top: instructions and computations by id, users, fresh ids
//! and names, insertion and removal that keep the schedule (if any) in step.
//!
//! Ids are the proto's own: XLA writes instruction ids as
//! `computation_id << 32 | local_id`, older XLA wrote module-unique small
//! integers. New ids follow whichever scheme the module uses.

pub mod builder;
pub mod devices;
pub mod groups;
pub mod infer;
pub mod opcode;
pub mod shape;

pub use devices::DeviceCounts;

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::proto::hlo_schedule_proto::InstructionSequence;
use crate::proto::{
    HloComputationProto, HloInstructionProto, HloModuleProto, PrimitiveType, ProgramShapeProto,
};

/// An instruction id as written in the proto (`HloInstructionProto.id`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstrId(pub i64);

/// A computation id as written in the proto (`HloComputationProto.id`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CompId(pub i64);

/// How the module numbers its instructions.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum IdScheme {
    /// `computation_id << 32 | local_id` (current XLA).
    Packed,
    /// Module-unique integers (older XLA, hand-written modules).
    Flat,
}

/// One computation: its proto header (with `instructions` moved out) and its
/// instructions in proto order, which is operands-before-users.
#[derive(Clone, Debug)]
pub struct Computation {
    header: HloComputationProto,
    instrs: Vec<HloInstructionProto>,
    pos: HashMap<InstrId, usize>,
}

impl Computation {
    fn new(mut header: HloComputationProto) -> Self {
        let instrs = std::mem::take(&mut header.instructions);
        let mut c = Computation {
            header,
            instrs,
            pos: HashMap::default(),
        };
        c.reindex();
        c
    }

    fn reindex(&mut self) {
        self.pos.clear();
        for (i, instr) in self.instrs.iter().enumerate() {
            // Keep the first of duplicate ids; the verifier reports the rest.
            self.pos.entry(InstrId(instr.id)).or_insert(i);
        }
    }

    pub fn id(&self) -> CompId {
        CompId(self.header.id)
    }

    pub fn name(&self) -> &str {
        &self.header.name
    }

    pub fn header(&self) -> &HloComputationProto {
        &self.header
    }

    pub fn root_id(&self) -> InstrId {
        InstrId(self.header.root_id)
    }

    pub fn is_fusion(&self) -> bool {
        self.header.is_fusion_computation
    }

    pub fn instructions(&self) -> &[HloInstructionProto] {
        &self.instrs
    }

    pub fn get(&self, id: InstrId) -> Option<&HloInstructionProto> {
        self.pos.get(&id).map(|&i| &self.instrs[i])
    }

    pub fn get_mut(&mut self, id: InstrId) -> Option<&mut HloInstructionProto> {
        self.pos.get(&id).map(|&i| &mut self.instrs[i])
    }

    pub fn position(&self, id: InstrId) -> Option<usize> {
        self.pos.get(&id).copied()
    }

    pub fn contains(&self, id: InstrId) -> bool {
        self.pos.contains_key(&id)
    }

    /// Users of every instruction (operand edges only), each list in
    /// instruction order without repeats.
    pub fn users(&self) -> HashMap<InstrId, Vec<InstrId>> {
        let mut users: HashMap<InstrId, Vec<InstrId>> = HashMap::default();
        for instr in &self.instrs {
            for &op in &instr.operand_ids {
                let list = users.entry(InstrId(op)).or_default();
                if list.last() != Some(&InstrId(instr.id)) {
                    list.push(InstrId(instr.id));
                }
            }
        }
        users
    }

    /// The users of `id` alone (operand edges only), in instruction order
    /// without repeats: [`Computation::users`]'s list for `id`, found in
    /// one scan instead of building every instruction's.
    pub fn users_of(&self, id: InstrId) -> Vec<&HloInstructionProto> {
        self.instrs
            .iter()
            .filter(|i| i.operand_ids.contains(&id.0))
            .collect()
    }

    fn into_proto(mut self) -> HloComputationProto {
        self.header.instructions = self.instrs;
        self.header
    }

    fn to_proto(&self) -> HloComputationProto {
        let mut header = self.header.clone();
        header.instructions = self.instrs.clone();
        header
    }
}

/// `add.12` → `add`: the part of a name before XLA's numeric suffix.
fn base_name(name: &str) -> &str {
    match name.rsplit_once('.') {
        Some((base, n)) if !base.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => name,
    }
}

/// Edits to one computation, applied together by [`Module::apply`].
#[derive(Debug, Default)]
pub struct Edits {
    /// New instructions (operands before users) to place just before an
    /// existing one.
    pub insert_before: HashMap<InstrId, Vec<HloInstructionProto>>,
    /// Every use of the key (operands and the root) becomes a use of the
    /// value.
    pub replace: HashMap<InstrId, InstrId>,
    /// Instructions to drop; nothing may use them after the replacements.
    pub remove: HashSet<InstrId>,
}

impl Edits {
    pub fn is_empty(&self) -> bool {
        self.insert_before.is_empty() && self.replace.is_empty() && self.remove.is_empty()
    }
}

/// An `HloModuleProto` opened for editing.
#[derive(Clone, Debug)]
pub struct Module {
    header: HloModuleProto,
    comps: Vec<Computation>,
    comp_pos: HashMap<CompId, usize>,
    scheme: IdScheme,
    next_local: HashMap<CompId, i64>,
    next_flat: i64,
    next_channel: i64,
    /// Hashes of every instruction name: a name whose hash is here counts
    /// as taken, so a collision only makes [`Module::fresh_name`] skip a
    /// suffix (names stay unique, and no name is copied to be remembered).
    names: HashSet<u64>,
    /// Per base name, the suffix [`Module::fresh_name`] tries first: names
    /// are never given back, so every smaller suffix is taken (keeps a
    /// rewrite that names thousands of instructions linear, not quadratic).
    next_suffix: HashMap<String, usize>,
}

fn name_hash(name: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<rustc_hash::FxHasher>::default().hash_one(name)
}

impl Module {
    /// Opens a module. Never fails: malformed modules (duplicate ids, dangling
    /// references) are the verifier's to report, see [`crate::verify`].
    pub fn from_proto(mut proto: HloModuleProto) -> Self {
        let comps: Vec<Computation> = std::mem::take(&mut proto.computations)
            .into_iter()
            .map(Computation::new)
            .collect();
        let packed = comps.iter().all(|c| {
            c.instrs
                .iter()
                .all(|i| i.id >= 0 && (i.id >> 32) == c.header.id)
        }) && comps.iter().any(|c| !c.instrs.is_empty());
        let mut m = Module {
            header: proto,
            comps,
            comp_pos: HashMap::default(),
            scheme: if packed {
                IdScheme::Packed
            } else {
                IdScheme::Flat
            },
            next_local: HashMap::default(),
            next_flat: 0,
            next_channel: 1,
            names: HashSet::default(),
            next_suffix: HashMap::default(),
        };
        m.reindex_all();
        m
    }

    fn reindex_all(&mut self) {
        self.comp_pos.clear();
        self.next_local.clear();
        self.names.clear();
        self.next_suffix.clear();
        let mut max_flat = 0i64;
        let mut max_channel = 0i64;
        for (i, c) in self.comps.iter().enumerate() {
            self.comp_pos.entry(c.id()).or_insert(i);
            // Computations and instructions draw fresh names from one
            // pool: a computation a previous run added (`equarx_max_s32.0`)
            // is never named again.
            self.names.insert(name_hash(&c.header.name));
            let mut max_local = 0i64;
            for instr in &c.instrs {
                max_local = max_local.max(instr.id & 0xffff_ffff);
                max_flat = max_flat.max(instr.id);
                max_channel = max_channel.max(instr.channel_id);
                self.names.insert(name_hash(&instr.name));
            }
            self.next_local.insert(c.id(), max_local + 1);
        }
        self.next_flat = max_flat.saturating_add(1);
        self.next_channel = max_channel.saturating_add(1);
    }

    pub fn into_proto(mut self) -> HloModuleProto {
        self.header.computations = self
            .comps
            .into_iter()
            .map(Computation::into_proto)
            .collect();
        self.header
    }

    pub fn to_proto(&self) -> HloModuleProto {
        let mut header = self.header.clone();
        header.computations = self.comps.iter().map(Computation::to_proto).collect();
        header
    }

    /// The module's own fields (name, schedule, config-like fields); its
    /// `computations` list is empty here, see [`Module::computations`].
    pub fn header(&self) -> &HloModuleProto {
        &self.header
    }

    pub fn name(&self) -> &str {
        &self.header.name
    }

    pub fn entry_id(&self) -> CompId {
        CompId(self.header.entry_computation_id)
    }

    pub fn computations(&self) -> &[Computation] {
        &self.comps
    }

    pub fn computation(&self, id: CompId) -> Option<&Computation> {
        self.comp_pos.get(&id).map(|&i| &self.comps[i])
    }

    pub fn computation_mut(&mut self, id: CompId) -> Option<&mut Computation> {
        self.comp_pos.get(&id).map(|&i| &mut self.comps[i])
    }

    pub fn is_scheduled(&self) -> bool {
        self.header
            .schedule
            .as_ref()
            .is_some_and(|s| !s.sequences.is_empty())
    }

    /// A fresh instruction id for computation `comp`, in the module's scheme.
    pub fn fresh_instr_id(&mut self, comp: CompId) -> InstrId {
        match self.scheme {
            IdScheme::Packed => {
                let next = self.next_local.entry(comp).or_insert(1);
                let id = (comp.0 << 32) | *next;
                *next += 1;
                InstrId(id)
            }
            IdScheme::Flat => {
                let id = self.next_flat;
                self.next_flat += 1;
                InstrId(id)
            }
        }
    }

    /// A channel id no instruction of the module uses yet.
    pub fn fresh_channel_id(&mut self) -> i64 {
        let id = self.next_channel;
        self.next_channel += 1;
        id
    }

    /// `base.N` for the smallest N that no instruction of the module has.
    pub fn fresh_name(&mut self, base: &str) -> String {
        let mut n = self.next_suffix.get(base).copied().unwrap_or(0);
        loop {
            let candidate = format!("{base}.{n}");
            if self.names.insert(name_hash(&candidate)) {
                match self.next_suffix.get_mut(base) {
                    Some(next) => *next = n + 1,
                    None => {
                        self.next_suffix.insert(base.to_string(), n + 1);
                    }
                }
                return candidate;
            }
            n += 1;
        }
    }

    /// Applies a batch of edits to `comp` in one pass over its instructions
    /// (and its schedule): a pass that rewrites many ops of a large
    /// computation pays for the computation once, not once per op.
    pub fn apply(&mut self, comp: CompId, edits: Edits) {
        if edits.is_empty() {
            return;
        }
        let Edits {
            mut insert_before,
            replace,
            remove,
        } = edits;
        let resolve = |mut id: i64| {
            // Replacements may chain (a get-tuple-element forwarded to a
            // tuple element); follow them to the end. An acyclic chain is
            // at most as long as there are replacements; a cycle (a bug of
            // the pass) stops there, and the verifier after the pass names
            // the dangling operand it leaves.
            for _ in 0..=replace.len() {
                match replace.get(&InstrId(id)) {
                    Some(next) => id = next.0,
                    None => break,
                }
            }
            id
        };
        let Some(c) = self.computation_mut(comp) else {
            return;
        };
        let old = std::mem::take(&mut c.instrs);
        let mut new =
            Vec::with_capacity(old.len() + insert_before.values().map(Vec::len).sum::<usize>());
        let mut inserted_before: HashMap<i64, Vec<i64>> = HashMap::default();
        for mut instr in old {
            let id = InstrId(instr.id);
            if let Some(batch) = insert_before.remove(&id) {
                inserted_before.insert(id.0, batch.iter().map(|i| i.id).collect());
                // A batch may read an instruction another edit replaces
                // (the rewrite of an op whose operand was rewritten too).
                new.extend(batch.into_iter().map(|mut i| {
                    i.operand_ids.iter_mut().for_each(|o| *o = resolve(*o));
                    i
                }));
            }
            if remove.contains(&id) {
                continue;
            }
            instr.operand_ids.iter_mut().for_each(|o| *o = resolve(*o));
            new.push(instr);
        }
        c.instrs = new;
        c.header.root_id = resolve(c.header.root_id);
        c.reindex();
        if let Some(seq) = self.sequence_mut(comp) {
            let old = std::mem::take(seq);
            for id in old {
                if let Some(batch) = inserted_before.remove(&id) {
                    seq.extend(batch);
                }
                if !remove.contains(&InstrId(id)) {
                    seq.push(id);
                }
            }
        }
    }

    /// Adds `name (a: T[], b: T[]) -> T[] { ROOT opcode(a, b) }` in front of
    /// all other computations (callees come first in a module proto); in a
    /// scheduled module it gets its sequence too.
    pub fn add_scalar_reducer(
        &mut self,
        base_name: &str,
        opcode: opcode::Opcode,
        ty: PrimitiveType,
    ) -> CompId {
        let opcode = opcode.as_str();
        let s = shape::scalar(ty);
        let mut instrs: Vec<HloInstructionProto> = ["lhs", "rhs"]
            .into_iter()
            .enumerate()
            .map(|(n, name)| HloInstructionProto {
                name: name.into(),
                opcode: "parameter".into(),
                shape: Some(s.clone()),
                parameter_number: n as i64,
                id: n as i64,
                ..Default::default()
            })
            .collect();
        instrs.push(HloInstructionProto {
            name: opcode.into(),
            opcode: opcode.into(),
            shape: Some(s.clone()),
            operand_ids: vec![0, 1],
            id: 2,
            ..Default::default()
        });
        let comp = HloComputationProto {
            name: base_name.into(),
            instructions: instrs,
            program_shape: Some(ProgramShapeProto {
                parameters: vec![s.clone(), s.clone()],
                result: Some(s),
                parameter_names: vec!["lhs".into(), "rhs".into()],
            }),
            root_id: 2,
            ..Default::default()
        };
        self.add_computation(comp, false, None)
    }

    /// Adds `comp` just before computation `before` (its caller: callees
    /// come first in a module proto, XLA reads them in order), or in front
    /// of all others. Its instruction ids are local stand-ins (operand
    /// and root ids refer to them): each gets a fresh id, and it and every
    /// instruction a fresh name based on its own. A fusion computation is
    /// marked so; any other gets a sequence in a scheduled module.
    pub fn add_computation(
        &mut self,
        mut comp: HloComputationProto,
        fusion: bool,
        before: Option<CompId>,
    ) -> CompId {
        let id = CompId(self.comps.iter().map(|c| c.header.id).max().unwrap_or(0) + 1);
        let mut new_id: HashMap<i64, i64> = HashMap::default();
        for instr in &mut comp.instructions {
            let fresh = self.fresh_instr_id(id).0;
            new_id.insert(instr.id, fresh);
            instr.id = fresh;
            instr.name = self.fresh_name(base_name(&instr.name));
        }
        for instr in &mut comp.instructions {
            for o in &mut instr.operand_ids {
                *o = new_id.get(o).copied().unwrap_or(*o);
            }
        }
        comp.root_id = new_id.get(&comp.root_id).copied().unwrap_or(comp.root_id);
        comp.id = id.0;
        comp.name = self.fresh_name(&comp.name);
        comp.is_fusion_computation = fusion;
        if !fusion && self.is_scheduled() {
            let ids = comp.instructions.iter().map(|i| i.id).collect();
            if let Some(sched) = self.header.schedule.as_mut() {
                sched.sequences.insert(
                    id.0,
                    InstructionSequence {
                        instruction_ids: ids,
                    },
                );
            }
        }
        let at = before
            .and_then(|b| self.comp_pos.get(&b).copied())
            .unwrap_or(0);
        self.comps.insert(at, Computation::new(comp));
        // Everything from `at` on moved one place: shift those positions
        // rather than hash every computation again (a rewrite adds
        // hundreds of computations to modules of thousands).
        for pos in self.comp_pos.values_mut() {
            if *pos >= at {
                *pos += 1;
            }
        }
        self.comp_pos.insert(id, at);
        id
    }

    /// Appends `instrs` (operands before users, ids of this computation) to
    /// computation `comp`, makes `root` its root with result `result`, and
    /// extends its schedule sequence, if any.
    pub fn append(
        &mut self,
        comp: CompId,
        instrs: Vec<HloInstructionProto>,
        root: InstrId,
        result: crate::proto::ShapeProto,
    ) {
        let ids: Vec<i64> = instrs.iter().map(|i| i.id).collect();
        let Some(c) = self.computation_mut(comp) else {
            return;
        };
        c.instrs.extend(instrs);
        c.header.root_id = root.0;
        if let Some(ps) = c.header.program_shape.as_mut() {
            ps.result = Some(result);
        }
        c.reindex();
        if let Some(seq) = self.sequence_mut(comp) {
            seq.extend(ids);
        }
    }

    /// Positions of the computations by id (the first of duplicate ids,
    /// as [`Module::from_proto`] keeps them; the verifier reports the rest).
    fn reindex_comps(&mut self) {
        self.comp_pos.clear();
        for (i, c) in self.comps.iter().enumerate() {
            self.comp_pos.entry(c.id()).or_insert(i);
        }
    }

    /// Drops computation `comp` (and its schedule sequence); nothing may
    /// call it any more.
    pub fn remove_computation(&mut self, comp: CompId) {
        self.comps.retain(|c| c.id() != comp);
        self.reindex_comps();
        if let Some(sched) = self.header.schedule.as_mut() {
            sched.sequences.remove(&comp.0);
        }
    }

    fn sequence_mut(&mut self, comp: CompId) -> Option<&mut Vec<i64>> {
        self.header
            .schedule
            .as_mut()
            .and_then(|s| s.sequences.get_mut(&comp.0))
            .map(|s| &mut s.instruction_ids)
    }

    /// The schedule's sequences, computation id → instruction ids.
    pub fn schedule(&self) -> Option<BTreeMap<i64, &[i64]>> {
        self.header.schedule.as_ref().map(|s| {
            s.sequences
                .iter()
                .map(|(k, v)| (*k, v.instruction_ids.as_slice()))
                .collect()
        })
    }

    /// Finds an instruction anywhere in the module.
    pub fn find(&self, id: InstrId) -> Option<(CompId, &HloInstructionProto)> {
        self.comps
            .iter()
            .find_map(|c| c.get(id).map(|i| (c.id(), i)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replacement chain longer than any fixed bound (the old one cut
    /// chains at 16 and left the use on the 17th link) resolves to its end.
    #[test]
    fn a_long_replacement_chain_resolves_to_its_end() {
        const LINKS: usize = 40;
        let mut text = String::from(
            "HloModule chain\n\nENTRY %main (p: f32[4]) -> (f32[4]) {\n  %p = f32[4] parameter(0)\n",
        );
        for k in 0..LINKS {
            text.push_str(&format!("  %n{k} = f32[4] negate(%p)\n"));
        }
        text.push_str("  ROOT %r = (f32[4]) tuple(%n0)\n}\n");
        let mut m = Module::from_proto(crate::text::parse(&text).unwrap().proto);
        let entry = m.entry_id();
        let id = |m: &Module, name: &str| {
            let c = m.computation(entry).unwrap();
            InstrId(c.instructions().iter().find(|i| i.name == name).unwrap().id)
        };
        let mut edits = Edits::default();
        for k in 0..LINKS - 1 {
            let (from, to) = (id(&m, &format!("n{k}")), id(&m, &format!("n{}", k + 1)));
            edits.replace.insert(from, to);
        }
        m.apply(entry, edits);
        let c = m.computation(entry).unwrap();
        let root = c.instructions().iter().find(|i| i.name == "r").unwrap();
        assert_eq!(root.operand_ids, vec![id(&m, &format!("n{}", LINKS - 1)).0]);
    }

    /// One instruction's users are its list in the map of every
    /// instruction's: in order, an instruction that reads it twice once.
    #[test]
    fn users_of_one_is_its_list_in_users() {
        let text = "HloModule u\n\nENTRY %main (p: f32[4]) -> (f32[4], f32[4]) {\n  \
                    %p = f32[4] parameter(0)\n  %a = f32[4] add(%p, %p)\n  \
                    %n = f32[4] negate(%a)\n  %m = f32[4] multiply(%p, %n)\n  \
                    ROOT %r = (f32[4], f32[4]) tuple(%m, %a)\n}\n";
        let m = Module::from_proto(crate::text::parse(text).unwrap().proto);
        let c = m.computation(m.entry_id()).unwrap();
        let users = c.users();
        for i in c.instructions() {
            let one: Vec<InstrId> = c
                .users_of(InstrId(i.id))
                .iter()
                .map(|u| InstrId(u.id))
                .collect();
            let all = users.get(&InstrId(i.id)).cloned().unwrap_or_default();
            assert_eq!(one, all, "users of {}", i.name);
        }
        let p = c.instructions().iter().find(|i| i.name == "p").unwrap();
        assert_eq!(
            c.users_of(InstrId(p.id)).len(),
            2,
            "add reads %p twice, counted once"
        );
    }
}
