//! One instruction line: `[ROOT ]%name = shape opcode(operands), attr=value,
//! ...`, with the op's own attributes first (from [`super::attributes`]),
//! then called computations, sharding, frontend attributes, control
//! predecessors, statistics, result accuracy, origin, metadata and backend
//! config, in XLA's order.

use std::fmt::Write;

use super::Printer;
use super::attributes::{
    backend_config, frontend_attributes, metadata, original_value, result_accuracy, sharding,
};
use super::literals::{float_text, literal};
use super::shapes::print_shape;
use crate::ir::opcode::Opcode;
use crate::proto::{HloInstructionProto, PrimitiveType};

impl Printer<'_> {
    pub(super) fn instruction(
        &self,
        out: &mut String,
        i: &HloInstructionProto,
    ) -> Result<(), String> {
        let shape = i.shape.as_ref().ok_or("no shape")?;
        let _ = write!(
            out,
            "%{} = {} {}(",
            self.name(i.id),
            print_shape(shape),
            i.opcode
        );
        match i.opcode.as_str() {
            "parameter" => {
                let _ = write!(out, "{}", i.parameter_number);
            }
            "constant" => {
                let lit = i.literal.as_ref().ok_or("constant without a literal")?;
                out.push_str(&literal(lit)?);
            }
            _ => {
                let ops: Vec<String> = i
                    .operand_ids
                    .iter()
                    .map(|&o| format!("%{}", self.name(o)))
                    .collect();
                out.push_str(&ops.join(", "));
            }
        }
        out.push(')');
        let mut attrs = self.op_attributes(i)?;
        attrs.extend(self.called_computations(i));
        if Opcode::of(i) == Some(Opcode::Call) && i.is_composite {
            attrs.push("is_composite=true".into());
        }
        if let Some(s) = &i.sharding {
            attrs.push(format!("sharding={}", sharding(s)?));
        }
        if let Some(fa) = i.frontend_attributes.as_ref().filter(|f| !f.map.is_empty()) {
            attrs.push(format!("frontend_attributes={}", frontend_attributes(fa)));
        }
        if !i.control_predecessor_ids.is_empty() {
            let preds: Vec<String> = i
                .control_predecessor_ids
                .iter()
                .map(|&p| format!("%{}", self.name(p)))
                .collect();
            attrs.push(format!("control-predecessors={{{}}}", preds.join(", ")));
        }
        if let Some(s) = i
            .statistics_viz
            .as_ref()
            .filter(|s| s.stat_index_to_visualize != 0 || !s.statistics.is_empty())
        {
            let mut parts = vec![format!("visualizing_index={}", s.stat_index_to_visualize)];
            parts.extend(
                s.statistics
                    .iter()
                    .map(|st| format!("{}={}", st.stat_name, float_text(st.stat_val))),
            );
            attrs.push(format!("statistics={{{}}}", parts.join(",")));
        }
        attrs.extend(i.result_accuracy.as_ref().and_then(|r| result_accuracy(r)));
        if let (Some(v), Some(s)) = (&i.original_value, &i.shape) {
            attrs.push(format!("origin={}", original_value(v, s)));
        }
        if let Some(m) = &i.metadata {
            let md = metadata(m);
            if !md.is_empty() {
                attrs.push(format!("metadata={{{md}}}"));
            }
        }
        if !i.backend_config.is_empty() {
            attrs.push(format!(
                "backend_config={}",
                backend_config(&i.backend_config)
            ));
        }
        for a in attrs {
            out.push_str(", ");
            out.push_str(&a);
        }
        Ok(())
    }

    fn called_computations(&self, i: &HloInstructionProto) -> Vec<String> {
        let called = &i.called_computation_ids;
        if called.is_empty() {
            return vec![];
        }
        let op = Opcode::of(i);
        match op {
            // XLA stores a while's computations as [body, condition].
            Some(Opcode::While) if called.len() == 2 => vec![
                format!("condition={}", self.comp(called[1])),
                format!("body={}", self.comp(called[0])),
            ],
            Some(Opcode::SelectAndScatter) if called.len() == 2 => vec![
                format!("select={}", self.comp(called[0])),
                format!("scatter={}", self.comp(called[1])),
            ],
            Some(Opcode::Conditional) => {
                let branch_index = i
                    .operand_ids
                    .first()
                    .and_then(|o| self.shapes.get(o))
                    .is_some_and(|s| s.element_type == PrimitiveType::S32 as i32);
                if !branch_index && called.len() == 2 {
                    vec![
                        format!("true_computation={}", self.comp(called[0])),
                        format!("false_computation={}", self.comp(called[1])),
                    ]
                } else {
                    let names: Vec<String> = called.iter().map(|&c| self.comp(c)).collect();
                    vec![format!("branch_computations={{{}}}", names.join(", "))]
                }
            }
            Some(
                Opcode::Fusion
                | Opcode::AsyncStart
                | Opcode::AsyncUpdate
                | Opcode::AsyncDone
                | Opcode::Call,
            ) if called.len() == 1 => {
                let key = if op == Some(Opcode::Call) {
                    "to_apply"
                } else {
                    "calls"
                };
                vec![format!("{key}={}", self.comp(called[0]))]
            }
            Some(Opcode::CustomCall) => {
                let names: Vec<String> = called.iter().map(|&c| self.comp(c)).collect();
                if names.len() == 1 {
                    vec![format!("to_apply={}", names[0])]
                } else {
                    vec![format!("called_computations={{{}}}", names.join(", "))]
                }
            }
            _ if called.len() == 1 => vec![format!("to_apply={}", self.comp(called[0]))],
            _ => {
                let names: Vec<String> = called.iter().map(|&c| self.comp(c)).collect();
                vec![format!("calls={}", names.join(", "))]
            }
        }
    }
}
