//! Instruction attributes: each `name=value` after the operands, and the
//! structured values they take (metadata, windows, replica groups,
//! shardings, ...).

use std::collections::{BTreeMap, HashMap, HashSet};

use super::assembly::{CompText, Instr};
use super::lexer::Tok;
use super::{Failure, MAX_DEPTH, Parser, Res};
use crate::proto::hlo_instruction_proto::{
    OptionalCrossProgramPrefetchIndex, ReplicaGroupList, SliceDimensions,
};
use crate::proto::{
    AxisRefProto, CholeskyOptions, CollectiveDeviceListProto, ConvolutionDimensionNumbers,
    DotDimensionNumbers, FrontendAttributes, IotaReplicaGroupListProto,
    MeshAxesReplicaGroupListProto, MeshProto, OpMetadata, OpSharding, OriginalArrayProto,
    OriginalValueElementProto, OriginalValueProto, OutputOperandAliasing, PaddingConfig,
    ParameterReplication, ReplicaGroup, ResultAccuracy, SourceTarget, Statistic, StatisticsViz,
    Window, WindowDimension, axis_ref_proto, mesh_proto, op_sharding, padding_config,
    result_accuracy,
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
        let p = &mut ins.proto;
        match key.as_str() {
            // Attributes of every instruction.
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
                    replicated_at_leaf_buffers: self.list('{', '}', &key, |q| q.bool("a leaf"))?,
                }));
            }
            // Called computations; ordered in `finish_instruction`.
            "to_apply" | "condition" | "body" | "select" | "scatter" | "true_computation"
            | "false_computation" => {
                let c = self.computation_ref()?;
                ins.calls.push((key, vec![c]));
            }
            "calls" => {
                let cs = if self.is_sym('{')? {
                    self.list('{', '}', "a computation list", |q| q.computation_ref())?
                } else {
                    vec![self.computation_ref()?]
                };
                ins.calls.push((key, cs));
            }
            "branch_computations" | "called_computations" => {
                let cs = self.list('{', '}', "a computation list", |q| q.computation_ref())?;
                ins.calls.push((key, cs));
            }
            // Dimensions and indices.
            "dimensions" => p.dimensions = self.int_list(&key)?,
            "iota_dimension" | "inferred_dimension" => p.dimensions = vec![self.int(&key)?],
            "index" => p.tuple_index = self.int(&key)?,
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
            "dynamic_slice_sizes" => p.dynamic_slice_sizes = self.int_list(&key)?,
            "slice_sizes" => {
                if op.starts_with("collective-permute") {
                    p.dynamic_slice_sizes = if self.is_sym('{')? && self.peek2()? == Tok::Sym('{') {
                        self.int_list_list(&key)?.into_iter().flatten().collect()
                    } else {
                        self.int_list(&key)?
                    };
                } else {
                    p.gather_slice_sizes = self.int_list(&key)?;
                }
            }
            "padding" => p.padding_config = Some(Box::new(self.padding_config()?)),
            "is_stable" => p.is_stable = self.bool(&key)?,
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
            // dot, ragged-dot, scaled-dot.
            "lhs_batch_dims"
            | "lhs_contracting_dims"
            | "rhs_batch_dims"
            | "rhs_contracting_dims" => {
                let v = self.int_list(&key)?;
                let d = if op == "ragged-dot" {
                    p.ragged_dot_dimension_numbers
                        .get_or_insert_with(Box::default)
                        .dot_dimension_numbers
                        .get_or_insert_with(DotDimensionNumbers::default)
                } else {
                    p.dot_dimension_numbers.get_or_insert_with(Box::default)
                };
                match key.as_str() {
                    "lhs_batch_dims" => d.lhs_batch_dimensions = v,
                    "lhs_contracting_dims" => d.lhs_contracting_dimensions = v,
                    "rhs_batch_dims" => d.rhs_batch_dimensions = v,
                    _ => d.rhs_contracting_dimensions = v,
                }
            }
            "lhs_ragged_dims" | "rhs_group_dims" => {
                let v = self.int_list(&key)?;
                let r = p
                    .ragged_dot_dimension_numbers
                    .get_or_insert_with(Box::default);
                if key == "lhs_ragged_dims" {
                    r.lhs_ragged_dimensions = v;
                } else {
                    r.rhs_group_dimensions = v;
                }
            }
            "operand_precision" => {
                ins.operand_precision = Some(self.list('{', '}', &key, |q| {
                    let (w, at) = q.ident("a precision")?;
                    match w.to_ascii_lowercase().as_str() {
                        "default" => Ok(0),
                        "high" => Ok(1),
                        "highest" => Ok(2),
                        "packed_nibble" => Ok(3),
                        _ => Err(Failure::new(at, format!("unknown precision '{w}'"))),
                    }
                })?);
            }
            "algorithm" => {
                let (w, at) = self.ident("an algorithm")?;
                if op == "rng-bit-generator" {
                    p.rng_algorithm = match w.as_str() {
                        "rng_default" => 0,
                        "rng_three_fry" => 1,
                        "rng_philox" => 2,
                        _ => return Err(Failure::new(at, format!("unknown rng algorithm '{w}'"))),
                    };
                } else {
                    let upper = w.to_ascii_uppercase();
                    let name = if upper.starts_with("ALG_") {
                        upper
                    } else {
                        format!("ALG_{upper}")
                    };
                    let alg = crate::proto::precision_config::Algorithm::from_str_name(&name)
                        .ok_or_else(|| Failure::new(at, format!("unknown dot algorithm '{w}'")))?;
                    ins.algorithm = Some(alg as i32);
                }
            }
            // convolution (and convolution-like custom calls).
            "window" => p.window = Some(Box::new(self.window()?)),
            "dim_labels" => p.convolution_dimension_numbers = Some(Box::new(self.dim_labels()?)),
            "feature_group_count" => p.feature_group_count = self.int(&key)?,
            "batch_group_count" => p.batch_group_count = self.int(&key)?,
            "conv_kind" => {
                let (w, at) = self.ident("a convolution kind")?;
                p.conv_kind = match w.as_str() {
                    "unset" => 0,
                    "fprop" => 1,
                    "dgrad" => 2,
                    "wgrad" => 3,
                    _ => return Err(Failure::new(at, format!("unknown convolution kind '{w}'"))),
                };
            }
            // gather and scatter.
            "offset_dims"
            | "collapsed_slice_dims"
            | "start_index_map"
            | "operand_batching_dims"
            | "start_indices_batching_dims" => {
                let v = self.int_list(&key)?;
                let g = p.gather_dimension_numbers.get_or_insert_with(Box::default);
                match key.as_str() {
                    "offset_dims" => g.offset_dims = v,
                    "collapsed_slice_dims" => g.collapsed_slice_dims = v,
                    "start_index_map" => g.start_index_map = v,
                    "operand_batching_dims" => g.operand_batching_dims = v,
                    _ => g.start_indices_batching_dims = v,
                }
            }
            "update_window_dims"
            | "inserted_window_dims"
            | "scatter_dims_to_operand_dims"
            | "input_batching_dims"
            | "scatter_indices_batching_dims" => {
                let v = self.int_list(&key)?;
                let s = p.scatter_dimension_numbers.get_or_insert_with(Box::default);
                match key.as_str() {
                    "update_window_dims" => s.update_window_dims = v,
                    "inserted_window_dims" => s.inserted_window_dims = v,
                    "scatter_dims_to_operand_dims" => s.scatter_dims_to_operand_dims = v,
                    "input_batching_dims" => s.input_batching_dims = v,
                    _ => s.scatter_indices_batching_dims = v,
                }
            }
            "index_vector_dim" => {
                let v = self.int(&key)?;
                if op == "scatter" {
                    p.scatter_dimension_numbers
                        .get_or_insert_with(Box::default)
                        .index_vector_dim = v;
                } else {
                    p.gather_dimension_numbers
                        .get_or_insert_with(Box::default)
                        .index_vector_dim = v;
                }
            }
            "indices_are_sorted" => p.indices_are_sorted = self.bool(&key)?,
            "unique_indices" => p.unique_indices = self.bool(&key)?,
            // Other op-specific attributes.
            "exponent_bits" => p.exponent_bits = self.int32(&key)?,
            "mantissa_bits" => p.mantissa_bits = self.int32(&key)?,
            "distribution" => {
                let (w, at) = self.ident("a distribution")?;
                p.distribution = match w.as_str() {
                    "rng_uniform" => 1,
                    "rng_normal" => 2,
                    _ => return Err(Failure::new(at, format!("unknown distribution '{w}'"))),
                };
            }
            "delta" => p.delta = self.int(&key)?,
            "k" => p.k = self.int(&key)?,
            "largest" => p.largest = self.bool(&key)?,
            "lower" if op == "cholesky" => {
                p.cholesky_options = Some(Box::new(CholeskyOptions {
                    lower: self.bool(&key)?,
                }));
            }
            "left_side" | "lower" | "unit_diagonal" | "transpose_a" => {
                let o = p.triangular_solve_options.get_or_insert_with(Box::default);
                match key.as_str() {
                    "left_side" => o.left_side = self.bool(&key)?,
                    "lower" => o.lower = self.bool(&key)?,
                    "unit_diagonal" => o.unit_diagonal = self.bool(&key)?,
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
            "fft_length" => p.fft_length = self.int_list(&key)?,
            "epsilon" => {
                let at = self.here()?;
                let v = self.float(&key)?;
                let f = v as f32;
                if v.is_finite() && !f.is_finite() {
                    return Err(Failure::new(at, "epsilon is out of range for f32"));
                }
                p.epsilon = f;
            }
            "feature_index" => p.feature_index = self.int(&key)?,
            "channel_id" => p.channel_id = self.int(&key)?,
            "is_host_transfer" => p.is_host_transfer = self.bool(&key)?,
            "infeed_config" => p.infeed_config = self.bytes(&key)?,
            "outfeed_config" => p.outfeed_config = self.bytes(&key)?,
            "outfeed_shape" => p.outfeed_shape = Some(Box::new(self.shape()?)),
            // custom-call.
            "custom_call_target" => p.custom_call_target = self.string(&key)?,
            "custom_call_has_side_effect" => p.custom_call_has_side_effect = self.bool(&key)?,
            "operand_layout_constraints" => {
                p.operand_shapes_with_layout = self.list('{', '}', &key, |q| q.shape())?;
                p.constrain_layout = true;
            }
            "literal" => p.literal = Some(Box::new(self.shaped_literal()?)),
            "output_to_operand_aliasing" => {
                p.output_operand_aliasing = self.list('{', '}', &key, |q| {
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
            // Collectives.
            "replica_groups" => p.replica_group_list = Some(self.replica_groups()?),
            "constrain_layout" => p.constrain_layout = self.bool(&key)?,
            "use_global_device_ids" => p.use_global_device_ids = self.bool(&key)?,
            "source_target_pairs" => {
                let at = self.here()?;
                p.source_target_pairs = self
                    .int_list_list(&key)?
                    .into_iter()
                    .map(|pair| match pair[..] {
                        [source, target] => Ok(SourceTarget { source, target }),
                        _ => Err(Failure::new(
                            at,
                            "source_target_pairs must be pairs {source,target}",
                        )),
                    })
                    .collect::<Res<_>>()?;
            }
            // XLA reads `mode` and ignores it.
            "mode" => {
                self.ident("a collective op group mode")?;
            }
            "async_execution_thread" => p.async_execution_thread = self.string(&key)?,
            "cross_program_prefetch_index" => {
                p.optional_cross_program_prefetch_index = Some(
                    OptionalCrossProgramPrefetchIndex::CrossProgramPrefetchIndex(self.int32(&key)?),
                );
            }
            "is_composite" => p.is_composite = self.bool(&key)?,
            "num_carries" => p.num_carries = self.int(&key)?,
            "is_reverse" => p.is_reverse = self.bool(&key)?,
            "is_associative" => p.is_associative = if self.bool(&key)? { 1 } else { 2 },
            "domain" => {
                let mut entry = None;
                let mut exit = None;
                let mut kind = None;
                self.sub_attributes("a domain", |q, k, at| {
                    match k {
                        "kind" => kind = Some((q.string("a domain kind")?, at)),
                        "entry" => entry = Some(q.sharding()?),
                        "exit" => exit = Some(q.sharding()?),
                        _ => return Err(Failure::new(at, format!("unknown domain field '{k}'"))),
                    }
                    Ok(())
                })?;
                match kind {
                    Some((k, _)) if k == "sharding" => {}
                    Some((k, at)) => {
                        return Err(Failure::new(at, format!("unsupported domain kind '{k}'")));
                    }
                    None => return Err(Failure::new(at, "domain without a kind")),
                }
                if entry.is_none() || exit.is_none() {
                    return Err(Failure::new(at, "domain needs entry= and exit="));
                }
                // XLA's proto keeps the text's `exit=` (operand side) as the
                // entry sharding and `entry=` as the exit sharding.
                p.domain_entry_sharding = exit.map(Box::new);
                p.domain_exit_sharding = entry.map(Box::new);
            }
            _ => return Err(Failure::new(at, format!("unknown attribute '{key}'"))),
        }
        Ok(())
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
}

// ---------------------------------------------------------------------------
// Attribute values

impl<'a> Parser<'a> {
    /// `{key=value,...}` with string or bare-dict values.
    pub(super) fn frontend_attributes(&mut self) -> Res<FrontendAttributes> {
        let mut map = BTreeMap::new();
        let entries = self.list('{', '}', "frontend attributes", |q| {
            let (key, at) = match q.peek()?.clone() {
                Tok::Ident(k) => (k, q.bump()?.start),
                Tok::Str(_) => {
                    let at = q.here()?;
                    (q.string("an attribute name")?, at)
                }
                _ => return Err(q.expected("a frontend attribute name")),
            };
            q.expect_sym('=', &format!("after '{key}'"))?;
            let value = if q.is_sym('{')? {
                q.lex.raw_json_dict()?.1
            } else {
                q.string("a frontend attribute value")?
            };
            Ok((key, at, value))
        })?;
        for (key, at, value) in entries {
            if map.insert(key.clone(), value).is_some() {
                return Err(Failure::new(
                    at,
                    format!("duplicate frontend attribute '{key}'"),
                ));
            }
        }
        Ok(FrontendAttributes { map })
    }

    fn metadata(&mut self) -> Res<OpMetadata> {
        let mut m = OpMetadata::default();
        self.sub_attributes("metadata", |q, key, at| {
            match key {
                "op_type" => m.op_type = q.string(key)?,
                "op_name" => m.op_name = q.string(key)?,
                "source_file" => m.source_file = q.string(key)?,
                "source_line" => m.source_line = q.int32(key)?,
                "source_end_line" => m.source_end_line = q.int32(key)?,
                "source_column" => m.source_column = q.int32(key)?,
                "source_end_column" => m.source_end_column = q.int32(key)?,
                "deduplicated_name" => m.deduplicated_name = q.string(key)?,
                "scheduling_name" => m.scheduling_name = q.string(key)?,
                "stack_frame_id" => m.stack_frame_id = q.int32(key)?,
                "preserve_layout" => m.preserve_layout = q.bool(key)?,
                "profile_type" => {
                    m.profile_type = q.list('{', '}', key, |q| {
                        let at = q.here()?;
                        let v = match q.peek()?.clone() {
                            Tok::Ident(w) => {
                                q.bump()?;
                                crate::proto::ProfileType::from_str_name(&w)
                                    .map(|t| t as i32)
                                    .ok_or_else(|| {
                                        Failure::new(at, format!("unknown profile type '{w}'"))
                                    })?
                            }
                            _ => q.int32("a profile type")?,
                        };
                        if crate::proto::ProfileType::try_from(v).is_err() {
                            return Err(Failure::new(at, format!("unknown profile type {v}")));
                        }
                        Ok(v)
                    })?;
                }
                _ => return Err(Failure::new(at, format!("unknown metadata field '{key}'"))),
            }
            Ok(())
        })?;
        Ok(m)
    }

    /// A single metadata or a `{ {...}, {...} }` list of them.
    fn metadata_list(&mut self) -> Res<Vec<OpMetadata>> {
        if self.is_sym('{')? && self.peek2()? == Tok::Sym('{') {
            return self.list('{', '}', "a metadata list", |q| q.metadata());
        }
        if self.is_sym('{')? && self.peek2()? == Tok::Sym('}') {
            self.bump()?;
            self.bump()?;
            return Ok(Vec::new());
        }
        Ok(vec![self.metadata()?])
    }

    /// `{visualizing_index=N, name=value, ...}`.
    fn statistics(&mut self) -> Res<StatisticsViz> {
        self.expect_sym('{', "to start statistics")?;
        let mut s = StatisticsViz::default();
        if self.eat_sym('}')? {
            return Ok(s);
        }
        self.ident("visualizing_index")?;
        self.expect_sym('=', "after visualizing_index")?;
        s.stat_index_to_visualize = self.int("a statistic index")?;
        while self.eat_sym(',')? {
            let (stat_name, _) = self.ident("a statistic name")?;
            self.expect_sym('=', "after the statistic name")?;
            let stat_val = self.float("a statistic value")?;
            s.statistics.push(Statistic {
                stat_name,
                stat_val,
            });
        }
        self.expect_sym('}', "to end statistics")?;
        Ok(s)
    }

    /// `{mode=highest}` or `{tolerance={atol=..,rtol=..,ulps=..}}`.
    fn result_accuracy(&mut self) -> Res<ResultAccuracy> {
        self.expect_sym('{', "to start result_accuracy")?;
        let (key, at) = self.ident("mode or tolerance")?;
        self.expect_sym('=', &format!("after '{key}'"))?;
        let specs = match key.as_str() {
            "mode" => {
                let (w, at) = self.ident("a result accuracy mode")?;
                let m = result_accuracy::Mode::from_str_name(&w.to_ascii_uppercase()).ok_or_else(
                    || Failure::new(at, format!("unknown result accuracy mode '{w}'")),
                )?;
                result_accuracy::Specs::Mode(m as i32)
            }
            "tolerance" => {
                let mut t = result_accuracy::Tolerance::default();
                self.list('{', '}', "a tolerance", |q| {
                    let (k, at) = q.ident("atol, rtol or ulps")?;
                    q.expect_sym('=', &format!("after '{k}'"))?;
                    match k.as_str() {
                        "atol" => t.atol = q.float(&k)?,
                        "rtol" => t.rtol = q.float(&k)?,
                        "ulps" => t.ulps = q.float(&k)? as i64,
                        _ => {
                            return Err(Failure::new(at, format!("unknown tolerance field '{k}'")));
                        }
                    }
                    Ok(())
                })?;
                result_accuracy::Specs::Tolerance(t)
            }
            _ => {
                return Err(Failure::new(
                    at,
                    format!("unknown result_accuracy field '{key}'"),
                ));
            }
        };
        self.expect_sym('}', "to end result_accuracy")?;
        Ok(ResultAccuracy { specs: Some(specs) })
    }

    /// `{[synthetic_call]}` or a tuple tree of `{"name" {index}}` arrays.
    fn original_value(&mut self) -> Res<OriginalValueProto> {
        self.expect_sym('{', "to start an original value")?;
        let mut v = OriginalValueProto::default();
        if self.eat_sym('[')? {
            if !self.eat_ident("synthetic_call")? {
                return Err(self.expected("'synthetic_call'"));
            }
            self.expect_sym(']', "after synthetic_call")?;
            self.expect_sym('}', "to end the original value")?;
            v.is_synthetic_call = true;
            return Ok(v);
        }
        let mut index: Vec<i64> = Vec::new();
        loop {
            let at = self.here()?;
            match self.peek()?.clone() {
                Tok::Sym('}') => {
                    self.bump()?;
                    return Ok(v);
                }
                Tok::Sym('(') => {
                    self.bump()?;
                    if index.len() >= MAX_DEPTH {
                        return Err(Failure::new(
                            at,
                            format!("nesting deeper than {MAX_DEPTH} levels"),
                        ));
                    }
                    index.push(0);
                }
                Tok::Sym(')') => {
                    self.bump()?;
                    if index.pop().is_none() {
                        return Err(Failure::new(at, "unbalanced ')' in original value"));
                    }
                }
                Tok::Sym(',') => {
                    self.bump()?;
                    match index.last_mut() {
                        Some(last) => *last += 1,
                        None => {
                            return Err(Failure::new(at, "',' outside a tuple in original value"));
                        }
                    }
                }
                Tok::Sym('{') => {
                    self.bump()?;
                    let mut array = None;
                    if matches!(self.peek()?, Tok::Str(_)) {
                        let instruction_name = self.string("an instruction name")?;
                        let shape_index = if self.is_sym('{')? {
                            self.int_list("a shape index")?
                        } else {
                            Vec::new()
                        };
                        array = Some(OriginalArrayProto {
                            instruction_name,
                            shape_index,
                        });
                    }
                    self.expect_sym('}', "to end an original array")?;
                    v.elements.push(OriginalValueElementProto {
                        shape_index: index.clone(),
                        original_array: array,
                    });
                }
                _ => return Err(self.expected("an original array, '(' or '}'")),
            }
        }
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

    /// `{size=3x3 stride=2x2 pad=0_1x0_1 lhs_dilate=.. rhs_dilate=.. rhs_reversal=..}`.
    fn window(&mut self) -> Res<Window> {
        let at = self.expect_sym('{', "to start a window")?;
        let mut fields: HashMap<String, (usize, String)> = HashMap::new();
        while !self.eat_sym('}')? {
            let (key, kat) = self.ident("a window field or '}'")?;
            self.expect_sym('=', &format!("after '{key}'"))?;
            if ![
                "size",
                "stride",
                "pad",
                "lhs_dilate",
                "rhs_dilate",
                "rhs_reversal",
            ]
            .contains(&key.as_str())
            {
                return Err(Failure::new(kat, format!("unknown window field '{key}'")));
            }
            let value = self
                .lex
                .raw_word(|c| c.is_ascii_digit() || matches!(c, b'x' | b'_' | b'-'))?;
            if fields.insert(key.clone(), value).is_some() {
                return Err(Failure::new(kat, format!("duplicate window field '{key}'")));
            }
        }
        let dxd = |key: &str| -> Res<Option<Vec<i64>>> {
            let Some((at, text)) = fields.get(key) else {
                return Ok(None);
            };
            text.split('x')
                .map(|s| s.parse::<i64>().ok())
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| Failure::new(*at, format!("expected {key}=NxM..., found '{text}'")))
        };
        let size = dxd("size")?.unwrap_or_default();
        let stride = dxd("stride")?;
        let lhs = dxd("lhs_dilate")?;
        let rhs = dxd("rhs_dilate")?;
        let rev = dxd("rhs_reversal")?;
        let pad = match fields.get("pad") {
            None => None,
            Some((pat, text)) => Some(
                text.split('x')
                    .map(|d| {
                        match d
                            .split('_')
                            .map(|s| s.parse::<i64>().ok())
                            .collect::<Option<Vec<_>>>()
                        {
                            Some(v) if v.len() == 2 => Some((v[0], v[1])),
                            _ => None,
                        }
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        Failure::new(*pat, format!("expected pad=L_HxL_H..., found '{text}'"))
                    })?,
            ),
        };
        let n = size.len();
        for (name, len) in [
            ("stride", stride.as_ref().map(Vec::len)),
            ("lhs_dilate", lhs.as_ref().map(Vec::len)),
            ("rhs_dilate", rhs.as_ref().map(Vec::len)),
            ("rhs_reversal", rev.as_ref().map(Vec::len)),
            ("pad", pad.as_ref().map(Vec::len)),
        ] {
            if len.is_some_and(|l| l != n) {
                return Err(Failure::new(
                    at,
                    format!("window {name}= does not have {n} entries like size="),
                ));
            }
        }
        let get = |v: &Option<Vec<i64>>, k: usize, d: i64| {
            v.as_ref().and_then(|v| v.get(k).copied()).unwrap_or(d)
        };
        let dimensions = (0..n)
            .map(|k| WindowDimension {
                size: size.get(k).copied().unwrap_or(0),
                stride: get(&stride, k, 1),
                padding_low: pad.as_ref().and_then(|p| p.get(k)).map_or(0, |p| p.0),
                padding_high: pad.as_ref().and_then(|p| p.get(k)).map_or(0, |p| p.1),
                window_dilation: get(&rhs, k, 1),
                base_dilation: get(&lhs, k, 1),
                window_reversal: get(&rev, k, 0) == 1,
            })
            .collect();
        Ok(Window { dimensions })
    }

    /// `b01f_01io->b01f`: XLA's `ParseConvolutionDimensionNumbers`.
    fn dim_labels(&mut self) -> Res<ConvolutionDimensionNumbers> {
        let (at, text) = self
            .lex
            .raw_word(|c| c.is_ascii_alphanumeric() || matches!(c, b'?' | b'_' | b'-' | b'>'))?;
        let bad = |m: &str| Failure::new(at, format!("bad dim_labels '{text}': {m}"));
        let (lhs, rest) = text
            .split_once('_')
            .ok_or_else(|| bad("expected lhs_rhs->out"))?;
        let (rhs, out) = rest
            .split_once("->")
            .ok_or_else(|| bad("expected lhs_rhs->out"))?;
        /// Positions of the two named dimensions and the spatial ones.
        fn labels(s: &str, a: char, b: char) -> Result<(i64, i64, Vec<i64>), String> {
            let mut first = 0;
            let mut second = 0;
            let spatial_count = s.chars().filter(|&c| c != a && c != b && c != '?').count();
            let mut spatial = vec![-1i64; spatial_count];
            let mut seen = HashSet::new();
            for (i, c) in s.chars().enumerate() {
                let i = i as i64;
                if c == '?' {
                    continue;
                }
                if !seen.insert(c) {
                    return Err(format!("'{c}' appears twice in '{s}'"));
                }
                if c == a {
                    first = i;
                } else if c == b {
                    second = i;
                } else {
                    let k = c
                        .to_digit(10)
                        .map(|d| d as usize)
                        .filter(|&d| d < spatial_count)
                        .ok_or_else(|| format!("unexpected '{c}' in '{s}'"))?;
                    if let Some(slot) = spatial.get_mut(k) {
                        *slot = i;
                    }
                }
            }
            Ok((first, second, spatial))
        }
        let (ib, if_, is) = labels(lhs, 'b', 'f').map_err(|m| bad(&m))?;
        let (ki, ko, ks) = labels(rhs, 'i', 'o').map_err(|m| bad(&m))?;
        let (ob, of, os) = labels(out, 'b', 'f').map_err(|m| bad(&m))?;
        if is.len() != ks.len() || is.len() != os.len() {
            return Err(bad(
                "input, kernel and output need the same number of spatial dimensions",
            ));
        }
        Ok(ConvolutionDimensionNumbers {
            input_batch_dimension: ib,
            input_feature_dimension: if_,
            input_spatial_dimensions: is,
            kernel_input_feature_dimension: ki,
            kernel_output_feature_dimension: ko,
            kernel_spatial_dimensions: ks,
            output_batch_dimension: ob,
            output_feature_dimension: of,
            output_spatial_dimensions: os,
        })
    }

    /// `[d0,d1,...]` optionally followed by `T(p0,p1,...)` (identity if absent).
    fn iota_array(&mut self, what: &str) -> Res<(Vec<i64>, Vec<i32>)> {
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

    fn replica_groups(&mut self) -> Res<ReplicaGroupList> {
        let at = self.here()?;
        match self.peek()?.clone() {
            Tok::Sym('{') => {
                let groups = self.int_list_list("replica groups")?;
                Ok(ReplicaGroupList::CollectiveDeviceList(
                    CollectiveDeviceListProto {
                        replica_groups: groups
                            .into_iter()
                            .map(|replica_ids| ReplicaGroup { replica_ids })
                            .collect(),
                        iota_replica_group_list: None,
                    },
                ))
            }
            Tok::Sym('[') => {
                let gs = self.list('[', ']', "the replica group shape", |q| q.count("a count"))?;
                let [groups, size] = gs[..] else {
                    return Err(Failure::new(at, "iota replica groups need [groups,size]"));
                };
                if *self.peek()? != Tok::Leq {
                    return Err(self.expected("'<=' in iota replica groups"));
                }
                self.bump()?;
                let (dims, perm) = self.iota_array("the iota dimensions")?;
                let total = product(&dims);
                if total.is_none() || total != groups.checked_mul(size) {
                    return Err(Failure::new(
                        at,
                        format!("iota replica groups [{groups},{size}] do not match <={dims:?}"),
                    ));
                }
                Ok(ReplicaGroupList::IotaCollectiveDeviceList(
                    IotaReplicaGroupListProto {
                        num_replica_groups: groups,
                        num_devices_per_group: size,
                        iota_reshape_dims: dims,
                        iota_transpose_perm: perm,
                    },
                ))
            }
            Tok::Ident(w) if w == "mesh" => self.mesh_axes(),
            _ => Err(self.expected("replica groups ('{...}', '[G,S]<=[...]' or 'mesh[...]')")),
        }
    }

    /// `mesh['a'=2,'b'=4], device_ids=(...) {'b', 'a':(1)2}`.
    fn mesh_axes(&mut self) -> Res<ReplicaGroupList> {
        self.bump()?; // mesh
        let axes = self.list('[', ']', "the mesh axes", |q| {
            let at = q.here()?;
            let name = q.axis_name()?;
            q.expect_sym('=', "after the axis name")?;
            let size = q.count("an axis size")?;
            Ok((name, size, at))
        })?;
        let mut mesh = MeshProto::default();
        let mut names = HashMap::new();
        for (k, (name, size, at)) in axes.into_iter().enumerate() {
            if names.insert(name.clone(), k as i64).is_some() {
                return Err(Failure::new(at, format!("duplicate mesh axis '{name}'")));
            }
            mesh.axes.push(mesh_proto::MeshAxis { name, size });
        }
        if self.is_sym(',')? && self.peek2()? == Tok::Ident("device_ids".into()) {
            self.bump()?;
            self.bump()?;
            self.expect_sym('=', "after device_ids")?;
            self.expect_sym('(', "to start the device ids")?;
            if self.is_sym('[')? {
                let (reshape_dims, perm) = self.iota_array("the device id dimensions")?;
                mesh.iota_transform = Some(mesh_proto::IotaTransform {
                    reshape_dims,
                    transpose_perm: perm.into_iter().map(i64::from).collect(),
                });
                self.expect_sym(')', "to end the device ids")?;
            } else {
                let at = self.here()?;
                let mut ids = Vec::new();
                if !self.is_sym(')')? {
                    loop {
                        ids.push(self.count("a device id")?);
                        if !self.eat_sym(',')? {
                            break;
                        }
                    }
                }
                self.expect_sym(')', "to end the device ids")?;
                let devices = product(&mesh.axes.iter().map(|a| a.size).collect::<Vec<_>>());
                if devices != i64::try_from(ids.len()).ok() {
                    return Err(Failure::new(
                        at,
                        format!(
                            "the mesh has {devices:?} devices, device_ids lists {}",
                            ids.len()
                        ),
                    ));
                }
                mesh.device_ids = ids;
            }
        }
        let refs = self.list('{', '}', "the reduced mesh axes", |q| {
            let at = q.here()?;
            let mesh_axis_index = match q.peek()?.clone() {
                Tok::Number(_) => q.count("an axis index")?,
                _ => {
                    let name = q.axis_name()?;
                    *names.get(&name).ok_or_else(|| {
                        Failure::new(at, format!("'{name}' is not an axis of the mesh"))
                    })?
                }
            };
            if usize::try_from(mesh_axis_index).map_or(true, |k| k >= names.len()) {
                return Err(Failure::new(
                    at,
                    format!("mesh axis index {mesh_axis_index} is out of range"),
                ));
            }
            let mut sub_axis_info = None;
            if q.eat_sym(':')? {
                q.expect_sym('(', "before the sub-axis pre-size")?;
                let pre_size = q.count("a sub-axis pre-size")?;
                q.expect_sym(')', "after the sub-axis pre-size")?;
                let size = q.count("a sub-axis size")?;
                sub_axis_info = Some(axis_ref_proto::SubAxis { pre_size, size });
            }
            Ok(AxisRefProto {
                mesh_axis_index,
                sub_axis_info,
            })
        })?;
        Ok(ReplicaGroupList::MeshAxesReplicaGroupList(
            MeshAxesReplicaGroupListProto {
                mesh: Some(mesh),
                axes: refs,
            },
        ))
    }

    /// A mesh axis name: `'a'`, `"a"` or `a`.
    fn axis_name(&mut self) -> Res<String> {
        match self.peek()?.clone() {
            Tok::Ident(n) => {
                self.bump()?;
                Ok(n)
            }
            Tok::Str(_) => self.string("an axis name"),
            _ => Err(self.expected("a mesh axis name")),
        }
    }

    /// `{replicated}`, `{maximal device=1}`, `{devices=[2,1]<=[2]}`, tuples
    /// `{{...}, {...}}`.
    fn sharding(&mut self) -> Res<OpSharding> {
        self.expect_sym('{', "to start a sharding")?;
        if !(self.is_sym('{')? || self.is_sym('}')?) {
            return self.single_sharding();
        }
        let mut tuple_shardings = Vec::new();
        if !self.eat_sym('}')? {
            loop {
                self.expect_sym('{', "to start a tuple element's sharding")?;
                tuple_shardings.push(self.single_sharding()?);
                if self.eat_sym(',')? {
                    continue;
                }
                self.expect_sym('}', "to end a tuple sharding")?;
                break;
            }
        }
        Ok(OpSharding {
            r#type: op_sharding::Type::Tuple as i32,
            tuple_shardings,
            ..Default::default()
        })
    }

    /// The inside of one `{...}` sharding (its `{` already read), through `}`.
    fn single_sharding(&mut self) -> Res<OpSharding> {
        use op_sharding::Type;
        let at = self.here()?;
        let mut kind: Option<Type> = None;
        let mut s = OpSharding::default();
        let mut devices: Vec<i64> = Vec::new();
        let mut last_tile_dim_replicate = false;
        loop {
            let t = self.peek()?.clone();
            let tat = self.here()?;
            let word = match t {
                Tok::Sym('}') => {
                    self.bump()?;
                    break;
                }
                Tok::Ident(w) => w,
                _ => return Err(self.expected("a sharding attribute or '}'")),
            };
            self.bump()?;
            let mut set_kind = |k: Type| -> Res<()> {
                if kind.replace(k).is_some_and(|old| old != k) {
                    return Err(Failure::new(tat, "sharding has more than one kind"));
                }
                Ok(())
            };
            match word.as_str() {
                "replicated" => set_kind(Type::Replicated)?,
                "manual" => set_kind(Type::Manual)?,
                "maximal" => set_kind(Type::Maximal)?,
                "unknown" => set_kind(Type::Unknown)?,
                "unreduced" => set_kind(Type::Unreduced)?,
                "last_tile_dim_replicate" => last_tile_dim_replicate = true,
                "shard_as" | "shard_like" => {
                    s.is_shard_group = true;
                    s.shard_group_id = self.int("a shard group id")?;
                    s.shard_group_type = i32::from(word == "shard_like");
                }
                "device" => {
                    self.expect_sym('=', "after device")?;
                    devices = vec![self.int("a device id")?];
                }
                "devices" => {
                    self.expect_sym('=', "after devices")?;
                    s.tile_assignment_dimensions =
                        self.list('[', ']', "the tile assignment shape", |q| {
                            q.count("a dimension")
                        })?;
                    if *self.peek()? == Tok::Leq {
                        self.bump()?;
                        let (dims, perm) = self.iota_array("the iota dimensions")?;
                        if product(&dims) != product(&s.tile_assignment_dimensions) {
                            return Err(Failure::new(
                                tat,
                                "iota devices do not fill the tile assignment",
                            ));
                        }
                        s.iota_reshape_dims = dims;
                        s.iota_transpose_perm = perm;
                    } else {
                        loop {
                            devices.push(self.int("a device id")?);
                            if !(self.is_sym(',')? && matches!(self.peek2()?, Tok::Number(_))) {
                                break;
                            }
                            self.bump()?;
                        }
                        if product(&s.tile_assignment_dimensions)
                            != i64::try_from(devices.len()).ok()
                        {
                            return Err(Failure::new(
                                tat,
                                format!(
                                    "tile assignment {:?} needs as many devices, found {}",
                                    s.tile_assignment_dimensions,
                                    devices.len()
                                ),
                            ));
                        }
                    }
                }
                "metadata" => {
                    self.expect_sym('=', "after metadata")?;
                    s.metadata = self.metadata_list()?;
                }
                "last_tile_dims" => {
                    self.expect_sym('=', "after last_tile_dims")?;
                    s.last_tile_dims = self.list('{', '}', "last_tile_dims", |q| {
                        let (w, at) = q.ident("a sharding type")?;
                        Ok(match w.as_str() {
                            "replicated" => Type::Replicated,
                            "manual" => Type::Manual,
                            "maximal" => Type::Maximal,
                            "unreduced" => Type::Unreduced,
                            _ => {
                                return Err(Failure::new(
                                    at,
                                    format!("unknown sharding type '{w}'"),
                                ));
                            }
                        } as i32)
                    })?;
                }
                "mesh" | "maximal_mesh" => {
                    return Err(Failure::new(
                        tat,
                        "named (mesh) shardings are not supported",
                    ));
                }
                _ => {
                    return Err(Failure::new(
                        tat,
                        format!("unknown sharding attribute '{word}'"),
                    ));
                }
            }
        }
        let tiled = !s.tile_assignment_dimensions.is_empty();
        match kind {
            Some(Type::Maximal) => {
                if devices.len() != 1 || tiled {
                    return Err(Failure::new(
                        at,
                        "maximal shardings need exactly one device=",
                    ));
                }
                s.r#type = Type::Maximal as i32;
                s.tile_assignment_devices = devices;
            }
            Some(k) => {
                if !devices.is_empty() || tiled {
                    return Err(Failure::new(
                        at,
                        format!(
                            "{} shardings have no devices",
                            k.as_str_name().to_ascii_lowercase()
                        ),
                    ));
                }
                s.r#type = k as i32;
            }
            None => {
                if !tiled {
                    return Err(Failure::new(at, "a tiled sharding needs devices=[...]"));
                }
                s.r#type = Type::Other as i32;
                s.tile_assignment_devices = devices;
                s.replicate_on_last_tile_dim = last_tile_dim_replicate;
            }
        }
        Ok(s)
    }
}

/// Product of non-negative sizes, `None` on overflow.
fn product(dims: &[i64]) -> Option<i64> {
    dims.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d))
}
