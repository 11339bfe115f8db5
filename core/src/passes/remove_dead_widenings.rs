//! `remove-dead-widenings`: drops the widening converts that
//! [`super::quantize_collectives`] read past.
//!
//! XLA:CPU promotes a bf16 all-reduce to f32 before its pre-scheduler
//! stage: the collective's operand is `convert(x)` from bf16 (or XLA's
//! wrapped form, a kLoop fusion of that one convert). The rewrite reads `x`
//! itself and converts what it reads, so the widened copy is never made,
//! and the convert is left with no user. This pass removes such converts
//! (and a wrapping fusion's computation) wherever nothing reads them and an
//! instruction equarx emitted reads their narrow source.
//!
//! Why it is sound: a convert has no side effect, and nothing reads it.
//! Disabled, the module keeps a dead convert, which XLA removes itself.

use rustc_hash::FxHashSet as HashSet;

use super::outline_fusions::emitted_by_equarx;
use super::quantize_collectives::splice::widening;
use super::{Pass, PassError};
use crate::ir::{CompId, Edits, InstrId, Module};

pub struct RemoveDeadWidenings;

impl Pass for RemoveDeadWidenings {
    fn name(&self) -> &'static str {
        "remove-dead-widenings"
    }

    fn run(&mut self, module: &mut Module) -> Result<bool, PassError> {
        let mut dead_comps: Vec<CompId> = Vec::new();
        let mut changed = false;
        let comps: Vec<CompId> = module.computations().iter().map(|c| c.id()).collect();
        for comp in comps {
            let Some(c) = module.computation(comp) else {
                continue;
            };
            let users = c.users();
            // What orders other instructions is used, even with no reader.
            let orders: HashSet<i64> = c
                .instructions()
                .iter()
                .flat_map(|j| j.control_predecessor_ids.iter().copied())
                .collect();
            let mut edits = Edits::default();
            for i in c.instructions() {
                let id = InstrId(i.id);
                let unused = users.get(&id).is_none_or(|u| u.is_empty())
                    && c.root_id() != id
                    && !orders.contains(&i.id);
                if !unused {
                    continue;
                }
                let Some(source) = i.operand_ids.first().and_then(|&s| c.get(InstrId(s))) else {
                    continue;
                };
                let read_by_equarx = users
                    .get(&InstrId(source.id))
                    .is_some_and(|u| u.iter().filter_map(|&u| c.get(u)).any(emitted_by_equarx));
                if let (true, Some(wrapped)) = (read_by_equarx, widening(module, i, source)) {
                    edits.remove.insert(id);
                    dead_comps.extend(wrapped);
                }
            }
            changed |= !edits.is_empty();
            module.apply(comp, edits);
        }
        for dead in dead_comps {
            let called = module.computations().iter().any(|c| {
                c.instructions()
                    .iter()
                    .any(|i| i.called_computation_ids.contains(&dead.0))
            });
            if !called {
                module.remove_computation(dead);
            }
        }
        Ok(changed)
    }
}
