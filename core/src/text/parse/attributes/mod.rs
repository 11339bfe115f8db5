//! Instruction attributes: each `name=value` after the operands, and the
//! structured values they take.
//!
//! [`Parser::attribute`] reads the name and hands the value to the
//! attribute families in turn, each of which reads the names it knows and
//! says whether it knew this one. This file holds the families of every
//! instruction (sharding, metadata, ..., called computations), of
//! dimensions and indices, of single ops and of custom calls, and the
//! values only they take; [`dimension_numbers`] holds dot, convolution,
//! gather and scatter (windows, `dim_labels`), [`collectives`] the replica
//! groups and source-target pairs, [`sharding`] shardings and domains, and
//! [`metadata`] metadata, frontend attributes, statistics, result accuracy
//! and original values.

mod collectives;
mod dimension_numbers;
mod metadata;
mod sharding;

use super::computation::CompText;
use super::instruction::Instr;
use super::lexer::Tok;
use super::{Failure, Parser, Res};
use crate::proto::hlo_instruction_proto::{OptionalCrossProgramPrefetchIndex, SliceDimensions};
use crate::proto::{
    CholeskyOptions, HloInstructionProto, OutputOperandAliasing, PaddingConfig,
    ParameterReplication, padding_config,
};

impl<'a> Parser<'a> {
    /// One `name=value` after the operands.
    pub(super) fn attribute(&mut self, ins: &mut Instr, comp: &CompText) -> Res<()> {
        let (key, at) = self.ident("an attribute name")?;
        self.expect_sym('=', &format!("after attribute name '{key}'"))?;
        if !ins.seen.insert(key.clone()) {
            return Err(Failure::new(at, format!("duplicate attribute '{key}'")));
        }
        let op = ins.proto.opcode.clone();
        // Each family reads the attributes it knows and says whether `key`
        // was one of them; no two families know the same name.
        let read = self.general_attribute(&key, ins, comp)?
            || self.called_computations_attribute(&key, ins)?
            || self.dimension_attribute(&key, &mut ins.proto, &op)?
            || self.dot_attribute(&key, ins, &op)?
            || self.convolution_attribute(&key, &mut ins.proto)?
            || self.gather_scatter_attribute(&key, &mut ins.proto, &op)?
            || self.op_attribute(&key, &mut ins.proto, &op)?
            || self.custom_call_attribute(&key, &mut ins.proto)?
            || self.collective_attribute(&key, &mut ins.proto)?
            || self.domain_attribute(&key, &mut ins.proto, at)?;
        if !read {
            return Err(Failure::new(at, format!("unknown attribute '{key}'")));
        }
        Ok(())
    }

    /// Attributes of every instruction.
    fn general_attribute(&mut self, key: &str, ins: &mut Instr, comp: &CompText) -> Res<bool> {
        let p = &mut ins.proto;
        match key {
            "sharding" => p.sharding = Some(Box::new(self.sharding()?)),
            "frontend_attributes" => {
                p.frontend_attributes = Some(Box::new(self.frontend_attributes()?))
            }
            "metadata" => p.metadata = Some(self.metadata()?),
            "backend_config" => p.backend_config = self.string_or_dict("a backend config")?,
            "control-predecessors" => {
                p.control_predecessor_ids = self.list('{', '}', "control-predecessors", |q| {
                    let (name, at) = q.name("an instruction name")?;
                    comp.by_name
                        .get(&name)
                        .and_then(|&k| comp.instrs.get(k))
                        .map(|i| i.id)
                        .ok_or_else(|| {
                            Failure::new(
                                at,
                                format!("undefined instruction '{name}' in control-predecessors"),
                            )
                        })
                })?;
            }
            "statistics" => p.statistics_viz = Some(Box::new(self.statistics()?)),
            "origin" => p.original_value = Some(Box::new(self.original_value()?)),
            "result_accuracy" => p.result_accuracy = Some(Box::new(self.result_accuracy()?)),
            "parameter_replication" => {
                p.parameter_replication = Some(Box::new(ParameterReplication {
                    replicated_at_leaf_buffers: self.list('{', '}', key, |q| q.bool("a leaf"))?,
                }));
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Called computations; ordered in `finish_instruction`.
    fn called_computations_attribute(&mut self, key: &str, ins: &mut Instr) -> Res<bool> {
        match key {
            "to_apply" | "condition" | "body" | "select" | "scatter" | "true_computation"
            | "false_computation" => {
                let c = self.computation_ref()?;
                ins.calls.push((key.to_string(), vec![c]));
            }
            "calls" => {
                let cs = if self.is_sym('{')? {
                    self.list('{', '}', "a computation list", |q| q.computation_ref())?
                } else {
                    vec![self.computation_ref()?]
                };
                ins.calls.push((key.to_string(), cs));
            }
            "branch_computations" | "called_computations" => {
                let cs = self.list('{', '}', "a computation list", |q| q.computation_ref())?;
                ins.calls.push((key.to_string(), cs));
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Dimensions and indices.
    fn dimension_attribute(
        &mut self,
        key: &str,
        p: &mut HloInstructionProto,
        op: &str,
    ) -> Res<bool> {
        match key {
            "dimensions" => p.dimensions = self.int_list(key)?,
            "iota_dimension" | "inferred_dimension" => p.dimensions = vec![self.int(key)?],
            "index" => p.tuple_index = self.int(key)?,
            "slice" => {
                p.slice_dimensions = self.list('{', '}', "slice ranges", |q| {
                    q.expect_sym('[', "to start a slice range")?;
                    let start = q.int("a slice start")?;
                    q.expect_sym(':', "after the slice start")?;
                    let limit = q.int("a slice limit")?;
                    let stride = if q.eat_sym(':')? {
                        q.int("a slice stride")?
                    } else {
                        1
                    };
                    q.expect_sym(']', "to end a slice range")?;
                    Ok(SliceDimensions {
                        start,
                        limit,
                        stride,
                    })
                })?;
            }
            "dynamic_slice_sizes" => p.dynamic_slice_sizes = self.int_list(key)?,
            "slice_sizes" => {
                if op.starts_with("collective-permute") {
                    p.dynamic_slice_sizes = if self.is_sym('{')? && self.peek2()? == Tok::Sym('{') {
                        self.int_list_list(key)?.into_iter().flatten().collect()
                    } else {
                        self.int_list(key)?
                    };
                } else {
                    p.gather_slice_sizes = self.int_list(key)?;
                }
            }
            "padding" => p.padding_config = Some(Box::new(self.padding_config()?)),
            "is_stable" => p.is_stable = self.bool(key)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Other op-specific attributes.
    fn op_attribute(&mut self, key: &str, p: &mut HloInstructionProto, op: &str) -> Res<bool> {
        match key {
            "direction" => {
                let (d, at) = self.ident("a comparison direction")?;
                if !["EQ", "NE", "GE", "GT", "LE", "LT"].contains(&d.as_str()) {
                    return Err(Failure::new(
                        at,
                        format!("unknown comparison direction '{d}'"),
                    ));
                }
                p.comparison_direction = d;
            }
            "type" => {
                let (t, at) = self.ident("a comparison type")?;
                if !["FLOAT", "TOTALORDER", "SIGNED", "UNSIGNED"].contains(&t.as_str()) {
                    return Err(Failure::new(at, format!("unknown comparison type '{t}'")));
                }
                p.comparison_type = t;
            }
            "kind" => p.fusion_kind = self.ident("a fusion kind")?.0,
            "exponent_bits" => p.exponent_bits = self.int32(key)?,
            "mantissa_bits" => p.mantissa_bits = self.int32(key)?,
            "distribution" => {
                let (w, at) = self.ident("a distribution")?;
                p.distribution = match w.as_str() {
                    "rng_uniform" => 1,
                    "rng_normal" => 2,
                    _ => return Err(Failure::new(at, format!("unknown distribution '{w}'"))),
                };
            }
            "delta" => p.delta = self.int(key)?,
            "k" => p.k = self.int(key)?,
            "largest" => p.largest = self.bool(key)?,
            "lower" if op == "cholesky" => {
                p.cholesky_options = Some(Box::new(CholeskyOptions {
                    lower: self.bool(key)?,
                }));
            }
            "left_side" | "lower" | "unit_diagonal" | "transpose_a" => {
                let o = p.triangular_solve_options.get_or_insert_with(Box::default);
                match key {
                    "left_side" => o.left_side = self.bool(key)?,
                    "lower" => o.lower = self.bool(key)?,
                    "unit_diagonal" => o.unit_diagonal = self.bool(key)?,
                    _ => {
                        let (w, at) = self.ident("a transpose kind")?;
                        o.transpose_a =
                            crate::proto::triangular_solve_options::Transpose::from_str_name(&w)
                                .ok_or_else(|| {
                                    Failure::new(at, format!("unknown transpose kind '{w}'"))
                                })? as i32;
                    }
                }
            }
            "fft_type" => {
                let (w, at) = self.ident("an FFT type")?;
                p.fft_type = crate::proto::FftType::from_str_name(&w)
                    .ok_or_else(|| Failure::new(at, format!("unknown FFT type '{w}'")))?
                    as i32;
            }
            "fft_length" => p.fft_length = self.int_list(key)?,
            "epsilon" => {
                let at = self.here()?;
                let v = self.float(key)?;
                let f = v as f32;
                if v.is_finite() && !f.is_finite() {
                    return Err(Failure::new(at, "epsilon is out of range for f32"));
                }
                p.epsilon = f;
            }
            "feature_index" => p.feature_index = self.int(key)?,
            "channel_id" => p.channel_id = self.int(key)?,
            "is_host_transfer" => p.is_host_transfer = self.bool(key)?,
            "infeed_config" => p.infeed_config = self.bytes(key)?,
            "outfeed_config" => p.outfeed_config = self.bytes(key)?,
            "outfeed_shape" => p.outfeed_shape = Some(Box::new(self.shape()?)),
            "async_execution_thread" => p.async_execution_thread = self.string(key)?,
            "cross_program_prefetch_index" => {
                p.optional_cross_program_prefetch_index = Some(
                    OptionalCrossProgramPrefetchIndex::CrossProgramPrefetchIndex(self.int32(key)?),
                );
            }
            "is_composite" => p.is_composite = self.bool(key)?,
            "num_carries" => p.num_carries = self.int(key)?,
            "is_reverse" => p.is_reverse = self.bool(key)?,
            "is_associative" => p.is_associative = if self.bool(key)? { 1 } else { 2 },
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// custom-call.
    fn custom_call_attribute(&mut self, key: &str, p: &mut HloInstructionProto) -> Res<bool> {
        match key {
            "custom_call_target" => p.custom_call_target = self.string(key)?,
            "custom_call_has_side_effect" => p.custom_call_has_side_effect = self.bool(key)?,
            "operand_layout_constraints" => {
                p.operand_shapes_with_layout = self.list('{', '}', key, |q| q.shape())?;
                p.constrain_layout = true;
            }
            "literal" => p.literal = Some(Box::new(self.shaped_literal()?)),
            "output_to_operand_aliasing" => {
                p.output_operand_aliasing = self.list('{', '}', key, |q| {
                    let output_shape_index = q.int_list("an output shape index")?;
                    q.expect_sym(':', "after the output shape index")?;
                    q.expect_sym('(', "before the aliased operand")?;
                    let operand_index = q.count("an operand index")?;
                    q.expect_sym(',', "after the operand index")?;
                    let operand_shape_index = q.int_list("an operand shape index")?;
                    q.expect_sym(')', "after the aliased operand")?;
                    Ok(OutputOperandAliasing {
                        output_shape_index,
                        operand_index,
                        operand_shape_index,
                    })
                })?;
            }
            "schedule" => {
                let (w, at) = self.ident("a custom-call schedule")?;
                p.custom_call_schedule = crate::proto::CustomCallSchedule::from_str_name(&w)
                    .ok_or_else(|| {
                        Failure::new(at, format!("unknown custom-call schedule '{w}'"))
                    })? as i32;
            }
            "api_version" => {
                let (w, at) = self.ident("a custom-call API version")?;
                let v = crate::proto::CustomCallApiVersion::from_str_name(&w)
                    .filter(|v| *v as i32 != 0)
                    .ok_or_else(|| {
                        Failure::new(at, format!("invalid custom-call API version '{w}'"))
                    })?;
                p.custom_call_api_version = v as i32;
            }
            "padding_type" => {
                let (w, at) = self.ident("a padding type")?;
                p.padding_type = crate::proto::PaddingType::from_str_name(&w)
                    .ok_or_else(|| Failure::new(at, format!("unknown padding type '{w}'")))?
                    as i32;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn computation_ref(&mut self) -> Res<(String, usize)> {
        if self.is_sym('{')? {
            let at = self.here()?;
            return Err(Failure::new(
                at,
                "nested (inline) computations are not supported",
            ));
        }
        self.name("a computation name")
    }

    /// A quoted string, or a bare `{...}` dict kept verbatim.
    fn string_or_dict(&mut self, what: &str) -> Res<Vec<u8>> {
        if self.is_sym('{')? {
            return Ok(self.lex.raw_json_dict()?.1.into_bytes());
        }
        self.bytes(what)
    }

    /// `0_1x2_3` or `0_1_2x...` (low_high[_interior] per dimension).
    fn padding_config(&mut self) -> Res<PaddingConfig> {
        let (at, text) = self
            .lex
            .raw_word(|c| c.is_ascii_digit() || matches!(c, b'x' | b'_' | b'-'))?;
        let mut dimensions = Vec::new();
        for dim in text.split('x') {
            let v: Option<Vec<i64>> = dim.split('_').map(|s| s.parse().ok()).collect();
            match v.as_deref() {
                Some(&[lo, hi]) => dimensions.push(padding_config::PaddingConfigDimension {
                    edge_padding_low: lo,
                    edge_padding_high: hi,
                    interior_padding: 0,
                }),
                Some(&[lo, hi, interior]) => {
                    dimensions.push(padding_config::PaddingConfigDimension {
                        edge_padding_low: lo,
                        edge_padding_high: hi,
                        interior_padding: interior,
                    })
                }
                _ => {
                    return Err(Failure::new(
                        at,
                        format!("expected padding like 0_1x2_3 or 0_1_1, found '{text}'"),
                    ));
                }
            }
        }
        Ok(PaddingConfig { dimensions })
    }
}

// ---------------------------------------------------------------------------
// Shared by replica groups and shardings

impl<'a> Parser<'a> {
    /// `[d0,d1,...]` optionally followed by `T(p0,p1,...)` (identity if absent).
    pub(super) fn iota_array(&mut self, what: &str) -> Res<(Vec<i64>, Vec<i32>)> {
        let at = self.here()?;
        let dims = self.list('[', ']', what, |q| q.count("a dimension"))?;
        if dims.is_empty() {
            return Err(Failure::new(at, format!("{what} must not be empty")));
        }
        let perm: Vec<i32> = if self.is_ident("T")? && self.peek2()? == Tok::Sym('(') {
            self.bump()?;
            let pat = self.here()?;
            let perm = self.list('(', ')', "a transpose permutation", |q| {
                q.int32("a dimension")
            })?;
            let mut sorted = perm.clone();
            sorted.sort_unstable();
            if sorted
                .iter()
                .enumerate()
                .any(|(k, &d)| usize::try_from(d).ok() != Some(k))
                || perm.len() != dims.len()
            {
                return Err(Failure::new(
                    pat,
                    format!(
                        "T({perm:?}) is not a permutation of the {} dimensions",
                        dims.len()
                    ),
                ));
            }
            perm
        } else {
            (0..dims.len()).map(|k| k as i32).collect()
        };
        Ok((dims, perm))
    }
}

/// Product of non-negative sizes, `None` on overflow.
pub(super) fn product(dims: &[i64]) -> Option<i64> {
    dims.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d))
}
