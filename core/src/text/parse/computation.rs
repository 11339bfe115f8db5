//! A computation: `ENTRY? name (params) -> result { instructions }`, with
//! its `execution_thread`, read into a [`CompText`] whose computation
//! names [`super::assembly`] resolves later.

use std::collections::{HashMap, HashSet};

use super::lexer::Tok;
use super::{Failure, Parser, Res};
use crate::ir::shape;
use crate::proto::HloInstructionProto;

/// A computation as read, before computation names are resolved.
pub(super) struct CompText {
    pub(super) name: String,
    pub(super) name_at: usize,
    pub(super) id: i64,
    pub(super) is_entry: bool,
    pub(super) entry_at: usize,
    pub(super) instrs: Vec<HloInstructionProto>,
    /// Where each instruction's name is, for later errors.
    pub(super) instr_at: Vec<usize>,
    /// Each instruction's called computations, by name, in proto order.
    pub(super) calls: Vec<Vec<(String, usize)>>,
    pub(super) by_name: HashMap<String, usize>,
    pub(super) root: Option<usize>,
    pub(super) execution_thread: String,
}

impl<'a> Parser<'a> {
    pub(super) fn computation(&mut self, id: i64) -> Res<CompText> {
        let entry_at = self.here()?;
        let is_entry = self.eat_ident("ENTRY")?;
        let (name, name_at) = self.name("a computation name")?;
        let mut declared_result = None;
        if self.is_sym('(')? {
            self.list('(', ')', "the parameter list", |p| {
                p.name("a parameter name")?;
                p.expect_sym(':', "after the parameter name")?;
                p.shape()
            })?;
            if *self.peek()? != Tok::Arrow {
                return Err(self.expected("'->' after the parameter list"));
            }
            self.bump()?;
            let at = self.here()?;
            declared_result = Some((self.shape()?, at));
        }
        self.expect_sym('{', &format!("to start the body of computation '{name}'"))?;
        let mut comp = CompText {
            name,
            name_at,
            id,
            is_entry,
            entry_at,
            instrs: Vec::new(),
            instr_at: Vec::new(),
            calls: Vec::new(),
            by_name: HashMap::new(),
            root: None,
            execution_thread: String::new(),
        };
        if self.is_sym('}')? {
            return Err(self.expected("an instruction"));
        }
        while !self.eat_sym('}')? {
            if *self.peek()? == Tok::Eof {
                return Err(self.expected(&format!("'}}' to end computation '{}'", comp.name)));
            }
            self.instruction(&mut comp)?;
        }
        let mut seen = HashSet::new();
        while self.eat_sym(',')? {
            let (key, at) = self.ident("a computation attribute")?;
            self.expect_sym('=', &format!("after '{key}'"))?;
            if !seen.insert(key.clone()) {
                return Err(Failure::new(at, format!("duplicate attribute '{key}'")));
            }
            match key.as_str() {
                // XLA writes the main thread as "" in protos.
                "execution_thread" => {
                    let t = self.string("an execution thread")?;
                    comp.execution_thread = if t == "main" { String::new() } else { t };
                }
                _ => {
                    return Err(Failure::new(
                        at,
                        format!("unknown computation attribute '{key}'"),
                    ));
                }
            }
        }
        let root = comp.root.unwrap_or(comp.instrs.len().saturating_sub(1));
        comp.root = Some(root);
        if let (Some((declared, at)), Some(root)) = (declared_result, comp.instrs.get(root)) {
            let actual = root.shape.clone().unwrap_or_default();
            if !shape::compatible(&declared, &actual) {
                return Err(Failure::new(
                    at,
                    format!(
                        "computation '{}' declares result {}, but its root '{}' is {}",
                        comp.name,
                        shape::describe(&declared),
                        root.name,
                        shape::describe(&actual)
                    ),
                ));
            }
        }
        Ok(comp)
    }
}
