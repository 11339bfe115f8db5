//! The module: its header (`HloModule name, attr=value, ...`) and its
//! stack-frame table, then the computations, handed to [`super::assembly`]
//! to be put together.

use std::collections::HashSet;

use super::assembly::{Header, assemble};
use super::lexer::Tok;
use super::{Failure, Parser, Res};
use crate::proto::hlo_buffer_donor_proto::BufferDonorEntryProto;
use crate::proto::hlo_input_output_alias_proto::AliasEntryProto;
use crate::proto::stack_frame_index_proto::{FileLocation, StackFrame};
use crate::proto::{HloBufferDonorProto, HloInputOutputAliasProto, StackFrameIndexProto};
use crate::text::ParsedText;

impl<'a> Parser<'a> {
    pub(super) fn module(&mut self) -> Res<ParsedText> {
        if !self.eat_ident("HloModule")? {
            return Err(self.expected("'HloModule' at the start of the module"));
        }
        let (name, _) = self.name("the module name")?;
        let mut header = Header {
            name,
            ..Header::default()
        };
        let mut seen = HashSet::new();
        while self.eat_sym(',')? {
            self.header_attribute(&mut header, &mut seen)?;
        }
        let frames = self.stack_frames()?;
        let mut comps = Vec::new();
        while *self.peek()? != Tok::Eof {
            let id = i64::try_from(comps.len() + 1).unwrap_or(i64::MAX);
            comps.push(self.computation(id)?);
        }
        if comps.is_empty() {
            return Err(self.expected("a computation"));
        }
        assemble(header, comps, frames)
    }

    fn header_attribute(&mut self, h: &mut Header, seen: &mut HashSet<String>) -> Res<()> {
        let (key, at) = self.ident("a module attribute")?;
        self.expect_sym('=', &format!("after '{key}'"))?;
        if !seen.insert(key.clone()) {
            return Err(Failure::new(
                at,
                format!("duplicate module attribute '{key}'"),
            ));
        }
        match key.as_str() {
            "is_scheduled" => h.is_scheduled = self.bool(&key)?,
            "replica_count" => h.counts.replica_count = Some(self.count(&key)?),
            "num_partitions" => h.counts.num_partitions = Some(self.count(&key)?),
            "entry_computation_layout" => {
                self.expect_sym('{', "to start the entry computation layout")?;
                let params = self.list('(', ')', "the parameter shapes", |p| p.shape())?;
                if *self.peek()? != Tok::Arrow {
                    return Err(self.expected("'->' before the result shape"));
                }
                self.bump()?;
                let result = self.shape()?;
                self.expect_sym('}', "to end the entry computation layout")?;
                h.layout = Some((params, result));
            }
            "input_output_alias" => {
                let entries = self.list('{', '}', "input_output_alias", |p| {
                    let output_shape_index = p.int_list("an output shape index")?;
                    p.expect_sym(':', "after the output shape index")?;
                    p.expect_sym('(', "before the aliased parameter")?;
                    let parameter_number = p.count("a parameter number")?;
                    p.expect_sym(',', "after the parameter number")?;
                    let parameter_shape_index = p.int_list("a parameter shape index")?;
                    let mut kind = 1; // XLA's default: may-alias
                    if p.eat_sym(',')? {
                        let (k, at) = p.ident("may-alias or must-alias")?;
                        kind = match k.as_str() {
                            "may-alias" => 1,
                            "must-alias" => 2,
                            _ => {
                                return Err(Failure::new(
                                    at,
                                    format!("expected may-alias or must-alias, found '{k}'"),
                                ));
                            }
                        };
                    }
                    p.expect_sym(')', "after the aliased parameter")?;
                    Ok(AliasEntryProto {
                        output_shape_index,
                        parameter_number,
                        parameter_shape_index,
                        kind,
                    })
                })?;
                h.input_output_alias = Some(HloInputOutputAliasProto { entries });
            }
            "buffer_donor" => {
                let entries = self.list('{', '}', "buffer_donor", |p| {
                    p.expect_sym('(', "before a buffer donor")?;
                    let parameter_number = p.count("a parameter number")?;
                    p.expect_sym(',', "after the parameter number")?;
                    let parameter_shape_index = p.int_list("a parameter shape index")?;
                    p.expect_sym(')', "after the buffer donor")?;
                    Ok(BufferDonorEntryProto {
                        parameter_number,
                        parameter_shape_index,
                    })
                })?;
                h.buffer_donor = Some(HloBufferDonorProto { entries });
            }
            "frontend_attributes" => h.frontend_attributes = Some(self.frontend_attributes()?),
            // Module config, not part of an HloModuleProto (XLA's parser puts
            // them into the HloModuleConfig): read and dropped.
            "alias_passthrough_params" => {
                self.bool(&key)?;
            }
            "allow_spmd_sharding_propagation_to_parameters"
            | "allow_spmd_sharding_propagation_to_output" => {
                if self.is_sym('{')? {
                    self.list('{', '}', &key, |p| p.bool("a list entry"))?;
                } else {
                    self.bool(&key)?;
                }
            }
            "origin_recovery_table" => {
                return Err(Failure::new(
                    at,
                    "module attribute 'origin_recovery_table' is not supported",
                ));
            }
            _ => {
                return Err(Failure::new(
                    at,
                    format!("unknown module attribute '{key}'"),
                ));
            }
        }
        Ok(())
    }

    /// The `FileNames` ... `StackFrames` tables, if present.
    fn stack_frames(&mut self) -> Res<Option<StackFrameIndexProto>> {
        if !self.eat_ident("FileNames")? {
            return Ok(None);
        }
        let mut index = StackFrameIndexProto::default();
        while matches!(self.peek()?, Tok::Number(_)) {
            self.table_index(index.file_names.len())?;
            index.file_names.push(self.string("a file name")?);
        }
        if !self.eat_ident("FunctionNames")? {
            return Err(self.expected("'FunctionNames'"));
        }
        while matches!(self.peek()?, Tok::Number(_)) {
            self.table_index(index.function_names.len())?;
            index.function_names.push(self.string("a function name")?);
        }
        if !self.eat_ident("FileLocations")? {
            return Err(self.expected("'FileLocations'"));
        }
        while matches!(self.peek()?, Tok::Number(_)) {
            self.table_index(index.file_locations.len())?;
            let at = self.here()?;
            let mut l = FileLocation::default();
            let mut seen = HashSet::new();
            self.sub_attributes("a file location", |p, key, at| {
                let v = p.int32(key)?;
                match key {
                    "file_name_id" => l.file_name_id = v,
                    "function_name_id" => l.function_name_id = v,
                    "line" => l.line = v,
                    "end_line" => l.end_line = v,
                    "column" => l.column = v,
                    "end_column" => l.end_column = v,
                    _ => {
                        return Err(Failure::new(
                            at,
                            format!("unknown file location field '{key}'"),
                        ));
                    }
                }
                seen.insert(key.to_string());
                Ok(())
            })?;
            require(
                &seen,
                &[
                    "file_name_id",
                    "function_name_id",
                    "line",
                    "end_line",
                    "column",
                    "end_column",
                ],
                at,
            )?;
            index.file_locations.push(l);
        }
        if !self.eat_ident("StackFrames")? {
            return Err(self.expected("'StackFrames'"));
        }
        while matches!(self.peek()?, Tok::Number(_)) {
            self.table_index(index.stack_frames.len())?;
            let at = self.here()?;
            let mut f = StackFrame::default();
            let mut seen = HashSet::new();
            self.sub_attributes("a stack frame", |p, key, at| {
                let v = p.int32(key)?;
                match key {
                    "file_location_id" => f.file_location_id = v,
                    // XLA prints parent ids one up (0, "no parent", prints as 1).
                    "parent_frame_id" => f.parent_frame_id = v.saturating_sub(1),
                    _ => {
                        return Err(Failure::new(
                            at,
                            format!("unknown stack frame field '{key}'"),
                        ));
                    }
                }
                seen.insert(key.to_string());
                Ok(())
            })?;
            require(&seen, &["file_location_id", "parent_frame_id"], at)?;
            index.stack_frames.push(f);
        }
        Ok(Some(index))
    }

    /// The 1-based row number in front of each stack-frame table row.
    fn table_index(&mut self, rows_so_far: usize) -> Res<()> {
        let at = self.here()?;
        let n = self.int("a table row number")?;
        if usize::try_from(n).ok() != Some(rows_so_far + 1) {
            return Err(Failure::new(
                at,
                format!("expected row number {}, found {n}", rows_so_far + 1),
            ));
        }
        Ok(())
    }
}

fn require(seen: &HashSet<String>, keys: &[&str], at: usize) -> Res<()> {
    for k in keys {
        if !seen.contains(*k) {
            return Err(Failure::new(at, format!("missing field '{k}'")));
        }
    }
    Ok(())
}
