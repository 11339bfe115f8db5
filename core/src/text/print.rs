//! The HLO text printer.
//!
//! Output follows `HloModule::ToString` of current XLA with operand shapes
//! off and large constants on: one instruction per line,
//! `[ROOT ]%name = shape opcode(operands), attr=value, ...`, the op's own
//! attributes first, then called computations, sharding, frontend
//! attributes, control predecessors, metadata and backend config.

use std::collections::HashMap;
use std::fmt::Write;

use crate::ir::DeviceCounts;
use crate::ir::groups::{GroupEncoding, ReplicaGroups};
use crate::ir::shape::{self, type_name};
use crate::proto::hlo_instruction_proto::ReplicaGroupList;
use crate::proto::{
    FrontendAttributes, HloComputationProto, HloInstructionProto, HloModuleProto, LayoutProto,
    LiteralProto, OpMetadata, OpSharding, PrimitiveType, ShapeProto, StackFrameIndexProto, Window,
    op_sharding,
};

#[derive(Debug, thiserror::Error)]
pub enum PrintError {
    #[error("{instr}: {message}")]
    Instruction { instr: String, message: String },
    #[error("{0}")]
    Module(String),
}

/// How to print.
#[derive(Clone, Copy, Debug, Default)]
pub struct PrintOptions {
    /// Rename every instruction `base.N` with N counting up in print order
    /// per base, so that snapshots do not churn when ids shift.
    pub canonical_names: bool,
}

/// Prints `module` the way XLA does, with constants in full.
pub fn print_module(module: &HloModuleProto, counts: &DeviceCounts) -> Result<String, PrintError> {
    print_module_with(module, counts, PrintOptions::default())
}

pub fn print_module_with(
    module: &HloModuleProto,
    counts: &DeviceCounts,
    options: PrintOptions,
) -> Result<String, PrintError> {
    let p = Printer::new(module, options);
    p.module(counts)
}

struct Printer<'a> {
    module: &'a HloModuleProto,
    /// Instruction id → printed name.
    names: HashMap<i64, String>,
    /// Instruction id → shape (for defaults that depend on operand types).
    shapes: HashMap<i64, &'a ShapeProto>,
    comp_names: HashMap<i64, &'a str>,
}

impl<'a> Printer<'a> {
    fn new(module: &'a HloModuleProto, options: PrintOptions) -> Self {
        let mut names = HashMap::new();
        let mut shapes = HashMap::new();
        let mut counters: HashMap<String, usize> = HashMap::new();
        for c in &module.computations {
            for i in ordered(module, c) {
                let name = if options.canonical_names {
                    let base = canonical_base(&i.name).to_string();
                    let n = counters.entry(base.clone()).or_insert(0);
                    let name = format!("{base}.{n}");
                    *n += 1;
                    name
                } else {
                    i.name.clone()
                };
                names.insert(i.id, name);
                if let Some(s) = &i.shape {
                    shapes.insert(i.id, s);
                }
            }
        }
        let comp_names = module
            .computations
            .iter()
            .map(|c| (c.id, c.name.as_str()))
            .collect();
        Printer {
            module,
            names,
            shapes,
            comp_names,
        }
    }

    fn module(&self, counts: &DeviceCounts) -> Result<String, PrintError> {
        let m = self.module;
        let mut out = format!("HloModule {}", m.name);
        let scheduled = m.schedule.as_ref().is_some_and(|s| !s.sequences.is_empty());
        if scheduled {
            out.push_str(", is_scheduled=true");
        }
        if let Some(alias) = &m.input_output_alias {
            if !alias.entries.is_empty() {
                let entries: Vec<String> = alias
                    .entries
                    .iter()
                    .map(|e| {
                        let kind = match e.kind {
                            2 => ", must-alias",
                            1 => ", may-alias",
                            _ => "",
                        };
                        format!(
                            "{}: ({}, {}{kind})",
                            index_list(&e.output_shape_index),
                            e.parameter_number,
                            index_list(&e.parameter_shape_index)
                        )
                    })
                    .collect();
                let _ = write!(out, ", input_output_alias={{ {} }}", entries.join(", "));
            }
        }
        if let Some(donor) = &m.buffer_donor {
            if !donor.entries.is_empty() {
                let entries: Vec<String> = donor
                    .entries
                    .iter()
                    .map(|e| {
                        format!(
                            "({}, {})",
                            e.parameter_number,
                            index_list(&e.parameter_shape_index)
                        )
                    })
                    .collect();
                let _ = write!(out, ", buffer_donor={{ {} }}", entries.join(", "));
            }
        }
        if let Some(ps) = &m.host_program_shape {
            let params: Vec<String> = ps.parameters.iter().map(print_shape).collect();
            let result = ps
                .result
                .as_ref()
                .map(print_shape)
                .unwrap_or_else(|| "()".into());
            let _ = write!(
                out,
                ", entry_computation_layout={{({})->{}}}",
                params.join(", "),
                result
            );
        }
        if let Some(r) = counts.replica_count.filter(|&r| r != 1) {
            let _ = write!(out, ", replica_count={r}");
        }
        if let Some(p) = counts.num_partitions.filter(|&p| p != 1) {
            let _ = write!(out, ", num_partitions={p}");
        }
        if let Some(fa) = m.frontend_attributes.as_ref().filter(|f| !f.map.is_empty()) {
            let _ = write!(out, ", frontend_attributes={}", frontend_attributes(fa));
        }
        out.push_str("\n\n");
        if let Some(index) = &m.stack_frame_index {
            stack_frames(&mut out, index);
        }
        for c in &m.computations {
            self.computation(&mut out, c)?;
            out.push('\n');
        }
        // XLA ends the module with the last computation's closing brace line.
        while out.ends_with("\n\n") {
            out.pop();
        }
        Ok(out)
    }

    fn computation(&self, out: &mut String, c: &HloComputationProto) -> Result<(), PrintError> {
        let instrs = ordered(self.module, c);
        let mut params: Vec<&HloInstructionProto> = instrs
            .iter()
            .copied()
            .filter(|i| i.opcode == "parameter")
            .collect();
        params.sort_by_key(|i| i.parameter_number);
        let params: Vec<String> = params
            .iter()
            .map(|p| {
                format!(
                    "{}: {}",
                    self.name(p.id),
                    p.shape
                        .as_ref()
                        .map(shape_without_layout)
                        .unwrap_or_default()
                )
            })
            .collect();
        let root = instrs.iter().find(|i| i.id == c.root_id);
        let result = root
            .and_then(|r| r.shape.as_ref())
            .map(shape_without_layout)
            .unwrap_or_default();
        if c.id == self.module.entry_computation_id {
            out.push_str("ENTRY ");
        }
        let _ = write!(out, "%{} ({}) -> {}", c.name, params.join(", "), result);
        out.push_str(" {\n");
        for i in instrs {
            out.push_str("  ");
            if i.id == c.root_id {
                out.push_str("ROOT ");
            }
            self.instruction(out, i)
                .map_err(|message| PrintError::Instruction {
                    instr: i.name.clone(),
                    message,
                })?;
            out.push('\n');
        }
        out.push('}');
        // XLA's parser reads the thread after the body.
        if !c.execution_thread.is_empty() && c.execution_thread != "main" {
            let _ = write!(out, ", execution_thread={}", quoted(&c.execution_thread));
        }
        out.push('\n');
        Ok(())
    }

    fn name(&self, id: i64) -> String {
        self.names
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("unknown_id_{id}"))
    }

    fn comp(&self, id: i64) -> String {
        format!(
            "%{}",
            self.comp_names
                .get(&id)
                .copied()
                .unwrap_or("unknown_computation")
        )
    }

    fn instruction(&self, out: &mut String, i: &HloInstructionProto) -> Result<(), String> {
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
        if i.opcode == "call" && i.is_composite {
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

    /// The attributes specific to an opcode, in XLA's order.
    fn op_attributes(&self, i: &HloInstructionProto) -> Result<Vec<String>, String> {
        let mut a = Vec::new();
        let op = i.opcode.as_str();
        let dims = || format!("dimensions={}", int_list(&i.dimensions));
        match op {
            "reshape" => {
                if let Some(d) = i.dimensions.first() {
                    a.push(format!("inferred_dimension={d}"));
                }
            }
            "rng-get-and-update-state" => a.push(format!("delta={}", i.delta)),
            "domain" => {
                // XLA's proto keeps the text's `exit=` as the entry sharding
                // (operand side) and `entry=` as the exit sharding.
                if let (Some(entry), Some(exit)) = (&i.domain_exit_sharding, &i.domain_entry_sharding) {
                    a.push(format!(
                        "domain={{kind=\"sharding\", entry={}, exit={}}}",
                        sharding(entry)?,
                        sharding(exit)?
                    ));
                }
            }
            "parameter" => {
                if let Some(r) = &i.parameter_replication {
                    let v: Vec<&str> = r
                        .replicated_at_leaf_buffers
                        .iter()
                        .map(|&b| if b { "true" } else { "false" })
                        .collect();
                    a.push(format!("parameter_replication={{{}}}", v.join(",")));
                }
            }
            "iota" => a.push(format!("iota_dimension={}", i.dimensions.first().copied().unwrap_or(0))),
            "broadcast" | "transpose" | "reverse" | "reduce" | "concatenate" | "map" => a.push(dims()),
            "set-dimension-size" | "get-dimension-size" => a.push(dims()),
            "sort" => {
                a.push(dims());
                if i.is_stable {
                    a.push("is_stable=true".into());
                }
            }
            "get-tuple-element" => a.push(format!("index={}", i.tuple_index)),
            "slice" => {
                let parts: Vec<String> = i
                    .slice_dimensions
                    .iter()
                    .map(|s| {
                        if s.stride == 1 {
                            format!("[{}:{}]", s.start, s.limit)
                        } else {
                            format!("[{}:{}:{}]", s.start, s.limit, s.stride)
                        }
                    })
                    .collect();
                a.push(format!("slice={{{}}}", parts.join(", ")));
            }
            "dynamic-slice" => a.push(format!("dynamic_slice_sizes={}", int_list(&i.dynamic_slice_sizes))),
            "pad" => {
                let cfg = i.padding_config.as_ref().ok_or("pad without padding config")?;
                let interior = cfg.dimensions.iter().any(|d| d.interior_padding != 0);
                let parts: Vec<String> = cfg
                    .dimensions
                    .iter()
                    .map(|d| {
                        if interior {
                            format!("{}_{}_{}", d.edge_padding_low, d.edge_padding_high, d.interior_padding)
                        } else {
                            format!("{}_{}", d.edge_padding_low, d.edge_padding_high)
                        }
                    })
                    .collect();
                a.push(format!("padding={}", parts.join("x")));
            }
            "compare" => {
                a.push(format!("direction={}", i.comparison_direction));
                if !i.comparison_type.is_empty() {
                    let operand_type = i
                        .operand_ids
                        .first()
                        .and_then(|o| self.shapes.get(o))
                        .map(|s| s.element_type)
                        .unwrap_or(0);
                    if i.comparison_type != default_comparison_type(operand_type) {
                        a.push(format!("type={}", i.comparison_type));
                    }
                }
            }
            "fusion" => {
                a.push(format!("kind={}", i.fusion_kind));
                a.extend(output_to_operand_aliasing(i));
            }
            "dot" => {
                let d = i.dot_dimension_numbers.as_ref().ok_or("dot without dimension numbers")?;
                for (name, v) in [
                    ("lhs_batch_dims", &d.lhs_batch_dimensions),
                    ("lhs_contracting_dims", &d.lhs_contracting_dimensions),
                    ("rhs_batch_dims", &d.rhs_batch_dimensions),
                    ("rhs_contracting_dims", &d.rhs_contracting_dimensions),
                ] {
                    if !v.is_empty() {
                        a.push(format!("{name}={}", int_list(v)));
                    }
                }
                a.extend(precision(i));
            }
            "convolution" => {
                if let Some(w) = &i.window {
                    a.push(format!("window={{{}}}", window(w)));
                }
                if let Some(d) = &i.convolution_dimension_numbers {
                    a.push(format!("dim_labels={}", conv_dim_labels(d)));
                }
                if i.feature_group_count > 1 {
                    a.push(format!("feature_group_count={}", i.feature_group_count));
                }
                if i.batch_group_count > 1 {
                    a.push(format!("batch_group_count={}", i.batch_group_count));
                }
                a.extend(precision(i));
            }
            "reduce-window" | "select-and-scatter" => {
                if let Some(w) = &i.window {
                    a.push(format!("window={{{}}}", window(w)));
                }
            }
            "gather" => {
                let g = i.gather_dimension_numbers.as_ref().ok_or("gather without dimension numbers")?;
                a.push(format!("offset_dims={}", int_list(&g.offset_dims)));
                a.push(format!("collapsed_slice_dims={}", int_list(&g.collapsed_slice_dims)));
                a.push(format!("start_index_map={}", int_list(&g.start_index_map)));
                if !g.operand_batching_dims.is_empty() {
                    a.push(format!("operand_batching_dims={}", int_list(&g.operand_batching_dims)));
                }
                if !g.start_indices_batching_dims.is_empty() {
                    a.push(format!(
                        "start_indices_batching_dims={}",
                        int_list(&g.start_indices_batching_dims)
                    ));
                }
                a.push(format!("index_vector_dim={}", g.index_vector_dim));
                a.push(format!("slice_sizes={}", int_list(&i.gather_slice_sizes)));
                if i.indices_are_sorted {
                    a.push("indices_are_sorted=true".into());
                }
            }
            "scatter" => {
                let s = i.scatter_dimension_numbers.as_ref().ok_or("scatter without dimension numbers")?;
                a.push(format!("update_window_dims={}", int_list(&s.update_window_dims)));
                a.push(format!("inserted_window_dims={}", int_list(&s.inserted_window_dims)));
                a.push(format!("scatter_dims_to_operand_dims={}", int_list(&s.scatter_dims_to_operand_dims)));
                if !s.input_batching_dims.is_empty() {
                    a.push(format!("input_batching_dims={}", int_list(&s.input_batching_dims)));
                }
                if !s.scatter_indices_batching_dims.is_empty() {
                    a.push(format!(
                        "scatter_indices_batching_dims={}",
                        int_list(&s.scatter_indices_batching_dims)
                    ));
                }
                a.push(format!("index_vector_dim={}", s.index_vector_dim));
                if i.indices_are_sorted {
                    a.push("indices_are_sorted=true".into());
                }
                if i.unique_indices {
                    a.push("unique_indices=true".into());
                }
            }
            "reduce-precision" => {
                a.push(format!("exponent_bits={}", i.exponent_bits));
                a.push(format!("mantissa_bits={}", i.mantissa_bits));
            }
            "rng" => a.push(format!(
                "distribution={}",
                match i.distribution {
                    1 => "rng_uniform",
                    2 => "rng_normal",
                    _ => "rng_invalid",
                }
            )),
            "rng-bit-generator" => a.push(format!(
                "algorithm={}",
                match i.rng_algorithm {
                    1 => "rng_three_fry",
                    2 => "rng_philox",
                    _ => "rng_default",
                }
            )),
            // XLA's parser takes a missing `largest` as true.
            "topk" => {
                a.push(format!("k={}", i.k));
                a.push(format!("largest={}", i.largest));
            }
            "cholesky" if i.cholesky_options.as_ref().is_some_and(|o| o.lower) => {
                a.push("lower=true".into());
            }
            "triangular-solve" => {
                if let Some(o) = &i.triangular_solve_options {
                    if o.left_side {
                        a.push("left_side=true".into());
                    }
                    if o.lower {
                        a.push("lower=true".into());
                    }
                    if o.unit_diagonal {
                        a.push("unit_diagonal=true".into());
                    }
                    let t = ["TRANSPOSE_INVALID", "NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"];
                    a.push(format!("transpose_a={}", t.get(o.transpose_a as usize).unwrap_or(&"NO_TRANSPOSE")));
                }
            }
            "fft" => {
                let t = ["FFT", "IFFT", "RFFT", "IRFFT"];
                a.push(format!("fft_type={}", t.get(i.fft_type as usize).unwrap_or(&"FFT")));
                a.push(format!("fft_length={}", int_list(&i.fft_length)));
            }
            "batch-norm-training" | "batch-norm-inference" | "batch-norm-grad" => {
                a.push(format!("epsilon={}", float_text(f64::from(i.epsilon))));
                a.push(format!("feature_index={}", i.feature_index));
            }
            "send" | "recv" | "send-done" | "recv-done" => {
                if i.channel_id > 0 {
                    a.push(format!("channel_id={}", i.channel_id));
                }
                if i.is_host_transfer {
                    a.push("is_host_transfer=true".into());
                }
            }
            "infeed" if !i.infeed_config.is_empty() => {
                a.push(format!("infeed_config={}", quoted_bytes(&i.infeed_config)));
            }
            "outfeed" => {
                if let Some(s) = &i.outfeed_shape {
                    a.push(format!("outfeed_shape={}", print_shape(s)));
                }
                if !i.outfeed_config.is_empty() {
                    a.push(format!("outfeed_config={}", quoted_bytes(&i.outfeed_config)));
                }
            }
            "custom-call" => {
                if let Ok(t) = crate::proto::PaddingType::try_from(i.padding_type) {
                    if i.padding_type != 0 {
                        a.push(format!("padding_type={}", t.as_str_name()));
                    }
                }
                a.push(format!("custom_call_target={}", quoted(&i.custom_call_target)));
                if let Some(w) = &i.window {
                    a.push(format!("window={{{}}}", window(w)));
                }
                if let Some(d) = &i.convolution_dimension_numbers {
                    a.push(format!("dim_labels={}", conv_dim_labels(d)));
                }
                if i.feature_group_count > 1 {
                    a.push(format!("feature_group_count={}", i.feature_group_count));
                }
                if i.batch_group_count > 1 {
                    a.push(format!("batch_group_count={}", i.batch_group_count));
                }
                if i.constrain_layout {
                    let shapes: Vec<String> = i.operand_shapes_with_layout.iter().map(print_shape).collect();
                    a.push(format!("operand_layout_constraints={{{}}}", shapes.join(", ")));
                }
                if i.custom_call_has_side_effect {
                    a.push("custom_call_has_side_effect=true".into());
                }
                if let Some(l) = &i.literal {
                    a.push(format!("literal={}", shaped_literal(l)?));
                }
                a.extend(output_to_operand_aliasing(i));
                match i.custom_call_schedule {
                    1 => a.push("schedule=SCHEDULE_LATEST".into()),
                    2 => a.push("schedule=SCHEDULE_EARLIEST".into()),
                    _ => {}
                }
                let api = [
                    "API_VERSION_UNSPECIFIED",
                    "API_VERSION_ORIGINAL",
                    "API_VERSION_STATUS_RETURNING",
                    "API_VERSION_STATUS_RETURNING_UNIFIED",
                    "API_VERSION_TYPED_FFI",
                ];
                if i.custom_call_api_version > 1 {
                    if let Some(v) = api.get(i.custom_call_api_version as usize) {
                        a.push(format!("api_version={v}"));
                    }
                }
                a.extend(precision(i));
            }
            "all-reduce" | "all-reduce-start" | "reduce-scatter" | "all-gather" | "all-gather-start"
            | "all-to-all" | "ragged-all-to-all" | "collective-broadcast" => {
                if i.channel_id > 0 {
                    a.push(format!("channel_id={}", i.channel_id));
                }
                a.push(format!("replica_groups={}", replica_groups(i)?));
                if i.constrain_layout {
                    a.push("constrain_layout=true".into());
                }
                let gathers = op.starts_with("all-gather");
                if gathers {
                    a.push(dims());
                }
                if i.use_global_device_ids {
                    a.push("use_global_device_ids=true".into());
                }
                if op == "reduce-scatter" || (op == "all-to-all" && !i.dimensions.is_empty()) {
                    a.push(dims());
                }
            }
            "collective-permute" | "collective-permute-start" => {
                if i.channel_id > 0 {
                    a.push(format!("channel_id={}", i.channel_id));
                }
                let pairs: Vec<String> = i
                    .source_target_pairs
                    .iter()
                    .map(|p| format!("{{{},{}}}", p.source, p.target))
                    .collect();
                a.push(format!("source_target_pairs={{{}}}", pairs.join(",")));
                if !i.dynamic_slice_sizes.is_empty() {
                    a.push(format!("slice_sizes={}", int_list(&i.dynamic_slice_sizes)));
                }
            }
            "async-start" | "async-update" | "async-done" => {
                if !i.async_execution_thread.is_empty() && i.async_execution_thread != "main" {
                    a.push(format!("async_execution_thread={}", quoted(&i.async_execution_thread)));
                }
                a.extend(output_to_operand_aliasing(i));
            }
            "copy-start" => {
                if let Some(crate::proto::hlo_instruction_proto::OptionalCrossProgramPrefetchIndex::CrossProgramPrefetchIndex(n)) =
                    i.optional_cross_program_prefetch_index
                {
                    a.push(format!("cross_program_prefetch_index={n}"));
                }
            }
            _ => {}
        }
        Ok(a)
    }

    fn called_computations(&self, i: &HloInstructionProto) -> Vec<String> {
        let called = &i.called_computation_ids;
        if called.is_empty() {
            return vec![];
        }
        match i.opcode.as_str() {
            // XLA stores a while's computations as [body, condition].
            "while" if called.len() == 2 => vec![
                format!("condition={}", self.comp(called[1])),
                format!("body={}", self.comp(called[0])),
            ],
            "select-and-scatter" if called.len() == 2 => vec![
                format!("select={}", self.comp(called[0])),
                format!("scatter={}", self.comp(called[1])),
            ],
            "conditional" => {
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
            "fusion" | "async-start" | "async-update" | "async-done" | "call"
                if called.len() == 1 =>
            {
                let key = if i.opcode == "call" {
                    "to_apply"
                } else {
                    "calls"
                };
                vec![format!("{key}={}", self.comp(called[0]))]
            }
            "custom-call" => {
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

/// A computation's instructions in print order: the schedule's order when the
/// module is scheduled (XLA's parser takes the schedule from the text order),
/// else proto order.
fn ordered<'a>(
    module: &'a HloModuleProto,
    c: &'a HloComputationProto,
) -> Vec<&'a HloInstructionProto> {
    let seq = module
        .schedule
        .as_ref()
        .and_then(|s| s.sequences.get(&c.id))
        .filter(|s| s.instruction_ids.len() == c.instructions.len());
    match seq {
        Some(seq) => {
            let by_id: HashMap<i64, &HloInstructionProto> =
                c.instructions.iter().map(|i| (i.id, i)).collect();
            let v: Vec<_> = seq
                .instruction_ids
                .iter()
                .filter_map(|id| by_id.get(id).copied())
                .collect();
            if v.len() == c.instructions.len() {
                v
            } else {
                c.instructions.iter().collect()
            }
        }
        None => c.instructions.iter().collect(),
    }
}

/// `add.12` → `add`; names without a numeric suffix stay as they are.
fn canonical_base(name: &str) -> &str {
    match name.rsplit_once('.') {
        Some((base, n))
            if !base.is_empty() && n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty() =>
        {
            base
        }
        _ => name,
    }
}

fn default_comparison_type(element_type: i32) -> &'static str {
    if shape::is_float(element_type) {
        "FLOAT"
    } else if type_name(element_type).is_some_and(|n| n.starts_with('s')) {
        "SIGNED"
    } else {
        "UNSIGNED"
    }
}

/// `result_accuracy={mode=highest}` or `{tolerance={atol=..,rtol=..,ulps=..}}`;
/// nothing for the default mode.
fn result_accuracy(r: &crate::proto::ResultAccuracy) -> Option<String> {
    use crate::proto::result_accuracy::{Mode, Specs};
    match r.specs.as_ref()? {
        Specs::Mode(0) => None,
        Specs::Mode(m) => Some(format!(
            "result_accuracy={{mode={}}}",
            Mode::try_from(*m)
                .map_or("default", |m| m.as_str_name())
                .to_ascii_lowercase()
        )),
        Specs::Tolerance(t) => Some(format!(
            "result_accuracy={{tolerance={{atol={},rtol={},ulps={}}}}}",
            float_text(t.atol),
            float_text(t.rtol),
            t.ulps
        )),
    }
}

/// `origin={{"name" {1}}}`, tuples as `{({"a"}, {"b" {0}})}`, following the
/// instruction's shape.
fn original_value(v: &crate::proto::OriginalValueProto, s: &ShapeProto) -> String {
    if v.is_synthetic_call {
        return "{[synthetic_call]}".into();
    }
    fn tree(
        v: &crate::proto::OriginalValueProto,
        s: &ShapeProto,
        index: &mut Vec<i64>,
        out: &mut String,
    ) {
        if shape::is_tuple(s) {
            out.push('(');
            for (k, e) in s.tuple_shapes.iter().enumerate() {
                if k > 0 {
                    out.push_str(", ");
                }
                index.push(k as i64);
                tree(v, e, index, out);
                index.pop();
            }
            out.push(')');
            return;
        }
        let array = v
            .elements
            .iter()
            .find(|e| e.shape_index == *index)
            .and_then(|e| e.original_array.as_ref());
        match array {
            Some(a) if a.shape_index.is_empty() => {
                let _ = write!(out, "{{{}}}", quoted(&a.instruction_name));
            }
            Some(a) => {
                let _ = write!(
                    out,
                    "{{{} {}}}",
                    quoted(&a.instruction_name),
                    index_list(&a.shape_index)
                );
            }
            None => out.push_str("{}"),
        }
    }
    let mut out = String::from("{");
    tree(v, s, &mut Vec::new(), &mut out);
    out.push('}');
    out
}

/// `output_to_operand_aliasing={{0}: (1, {})}` (fusion, custom-call,
/// async-start).
fn output_to_operand_aliasing(i: &HloInstructionProto) -> Option<String> {
    if i.output_operand_aliasing.is_empty() {
        return None;
    }
    let parts: Vec<String> = i
        .output_operand_aliasing
        .iter()
        .map(|o| {
            format!(
                "{}: ({}, {})",
                index_list(&o.output_shape_index),
                o.operand_index,
                index_list(&o.operand_shape_index)
            )
        })
        .collect();
    Some(format!(
        "output_to_operand_aliasing={{{}}}",
        parts.join(", ")
    ))
}

fn precision(i: &HloInstructionProto) -> Vec<String> {
    let mut a = Vec::new();
    if let Some(p) = &i.precision_config {
        if p.operand_precision.iter().any(|&x| x != 0) {
            let names: Vec<&str> = p
                .operand_precision
                .iter()
                .map(|&x| match x {
                    1 => "high",
                    2 => "highest",
                    _ => "default",
                })
                .collect();
            a.push(format!("operand_precision={{{}}}", names.join(",")));
        }
        if p.algorithm != 0 {
            if let Ok(alg) = crate::proto::precision_config::Algorithm::try_from(p.algorithm) {
                // XLA spells ALG_DOT_BF16_BF16_F32 as dot_bf16_bf16_f32.
                let name = alg.as_str_name();
                a.push(format!(
                    "algorithm={}",
                    name.strip_prefix("ALG_")
                        .unwrap_or(name)
                        .to_ascii_lowercase()
                ));
            }
        }
    }
    a
}

fn window(w: &Window) -> String {
    let dims = &w.dimensions;
    let join = |f: &dyn Fn(&crate::proto::WindowDimension) -> String| {
        dims.iter().map(f).collect::<Vec<_>>().join("x")
    };
    let mut parts = vec![format!("size={}", join(&|d| d.size.to_string()))];
    if dims.iter().any(|d| d.stride != 1) {
        parts.push(format!("stride={}", join(&|d| d.stride.to_string())));
    }
    if dims
        .iter()
        .any(|d| d.padding_low != 0 || d.padding_high != 0)
    {
        parts.push(format!(
            "pad={}",
            join(&|d| format!("{}_{}", d.padding_low, d.padding_high))
        ));
    }
    if dims.iter().any(|d| d.base_dilation != 1) {
        parts.push(format!(
            "lhs_dilate={}",
            join(&|d| d.base_dilation.to_string())
        ));
    }
    if dims.iter().any(|d| d.window_dilation != 1) {
        parts.push(format!(
            "rhs_dilate={}",
            join(&|d| d.window_dilation.to_string())
        ));
    }
    if dims.iter().any(|d| d.window_reversal) {
        parts.push(format!(
            "rhs_reversal={}",
            join(&|d| u8::from(d.window_reversal).to_string())
        ));
    }
    parts.join(" ")
}

fn conv_dim_labels(d: &crate::proto::ConvolutionDimensionNumbers) -> String {
    fn labels(rank: usize, named: &[(i64, char)], spatial: &[i64]) -> String {
        let mut v = vec!['?'; rank];
        for &(i, c) in named {
            if let Some(x) = usize::try_from(i).ok().and_then(|i| v.get_mut(i)) {
                *x = c;
            }
        }
        for (k, &s) in spatial.iter().enumerate() {
            if let Some(x) = usize::try_from(s).ok().and_then(|i| v.get_mut(i)) {
                *x = char::from_digit(k as u32, 36).unwrap_or('?');
            }
        }
        v.into_iter().collect()
    }
    let rank = d.input_spatial_dimensions.len() + 2;
    format!(
        "{}_{}->{}",
        labels(
            rank,
            &[
                (d.input_batch_dimension, 'b'),
                (d.input_feature_dimension, 'f')
            ],
            &d.input_spatial_dimensions
        ),
        labels(
            rank,
            &[
                (d.kernel_input_feature_dimension, 'i'),
                (d.kernel_output_feature_dimension, 'o')
            ],
            &d.kernel_spatial_dimensions
        ),
        labels(
            rank,
            &[
                (d.output_batch_dimension, 'b'),
                (d.output_feature_dimension, 'f')
            ],
            &d.output_spatial_dimensions
        ),
    )
}

fn replica_groups(i: &HloInstructionProto) -> Result<String, String> {
    // Print the form the instruction was written in, as XLA does.
    if i.replica_groups.is_empty() {
        match &i.replica_group_list {
            Some(ReplicaGroupList::IotaCollectiveDeviceList(iota)) => return Ok(iota_groups(iota)),
            Some(ReplicaGroupList::CollectiveDeviceList(l))
                if l.iota_replica_group_list.is_some() =>
            {
                if let Some(iota) = &l.iota_replica_group_list {
                    return Ok(iota_groups(iota));
                }
            }
            Some(ReplicaGroupList::MeshAxesReplicaGroupList(m)) => return mesh_axes_groups(m),
            _ => {}
        }
    }
    let groups = ReplicaGroups::of(i)?;
    debug_assert!(matches!(
        groups.encoding,
        GroupEncoding::List | GroupEncoding::Empty
    ));
    Ok(list_groups(&groups.groups))
}

pub(crate) fn list_groups(groups: &[Vec<i64>]) -> String {
    let parts: Vec<String> = groups.iter().map(|g| int_list_tight(g)).collect();
    format!("{{{}}}", parts.join(","))
}

fn iota_groups(iota: &crate::proto::IotaReplicaGroupListProto) -> String {
    let mut s = format!(
        "[{},{}]<=[{}]",
        iota.num_replica_groups,
        iota.num_devices_per_group,
        join(&iota.iota_reshape_dims, ",")
    );
    let identity = iota
        .iota_transpose_perm
        .iter()
        .enumerate()
        .all(|(k, &p)| p as usize == k);
    if iota.iota_reshape_dims.is_empty() {
        s = format!(
            "[{},{}]<=[{}]",
            iota.num_replica_groups,
            iota.num_devices_per_group,
            iota.num_replica_groups * iota.num_devices_per_group
        );
    } else if !identity {
        let _ = write!(s, "T({})", join(&iota.iota_transpose_perm, ","));
    }
    s
}

fn mesh_axes_groups(m: &crate::proto::MeshAxesReplicaGroupListProto) -> Result<String, String> {
    let mesh = m
        .mesh
        .as_ref()
        .ok_or("mesh-axes replica groups without a mesh")?;
    let axes: Vec<String> = mesh
        .axes
        .iter()
        .map(|a| format!("'{}'={}", a.name, a.size))
        .collect();
    let mut s = format!("mesh[{}]", axes.join(","));
    if let Some(iota) = &mesh.iota_transform {
        let _ = write!(s, ", device_ids=([{}]", join(&iota.reshape_dims, ","));
        if iota.reshape_dims.len() > 1 {
            let _ = write!(s, "T({})", join(&iota.transpose_perm, ","));
        }
        s.push(')');
    } else if !mesh.device_ids.is_empty() {
        let _ = write!(s, ", device_ids=({})", join(&mesh.device_ids, ","));
    }
    let refs: Vec<String> = m
        .axes
        .iter()
        .map(|r| {
            let name = usize::try_from(r.mesh_axis_index)
                .ok()
                .and_then(|k| mesh.axes.get(k))
                .map(|a| a.name.clone())
                .unwrap_or_else(|| r.mesh_axis_index.to_string());
            match &r.sub_axis_info {
                Some(sub) => format!("'{name}':({}){}", sub.pre_size, sub.size),
                None => format!("'{name}'"),
            }
        })
        .collect();
    let _ = write!(s, " {{{}}}", refs.join(","));
    Ok(s)
}

fn sharding(s: &OpSharding) -> Result<String, String> {
    use op_sharding::Type;
    let body = match Type::try_from(s.r#type).unwrap_or(Type::Other) {
        Type::Tuple => {
            let parts: Result<Vec<String>, String> =
                s.tuple_shardings.iter().map(sharding).collect();
            return Ok(format!("{{{}}}", parts?.join(", ")));
        }
        Type::Replicated => "replicated".to_string(),
        Type::Manual => "manual".to_string(),
        Type::Unknown => "unknown".to_string(),
        Type::Unreduced => "unreduced".to_string(),
        Type::Maximal => format!(
            "maximal device={}",
            s.tile_assignment_devices.first().copied().unwrap_or(0)
        ),
        Type::Other => {
            let mut b = format!("devices=[{}]", join(&s.tile_assignment_dimensions, ","));
            if !s.iota_reshape_dims.is_empty() {
                let _ = write!(b, "<=[{}]", join(&s.iota_reshape_dims, ","));
                let identity = s
                    .iota_transpose_perm
                    .iter()
                    .enumerate()
                    .all(|(k, &p)| p as usize == k);
                if !identity {
                    let _ = write!(b, "T({})", join(&s.iota_transpose_perm, ","));
                }
            } else {
                b.push_str(&join(&s.tile_assignment_devices, ","));
            }
            if s.replicate_on_last_tile_dim {
                b.push_str(" last_tile_dim_replicate");
            }
            if !s.last_tile_dims.is_empty() {
                let names: Vec<&str> = s
                    .last_tile_dims
                    .iter()
                    .map(|&t| match Type::try_from(t) {
                        Ok(Type::Manual) => "manual",
                        Ok(Type::Replicated) => "replicated",
                        Ok(Type::Unreduced) => "unreduced",
                        Ok(Type::Maximal) => "maximal",
                        _ => "unknown",
                    })
                    .collect();
                let _ = write!(b, " last_tile_dims={{{}}}", names.join(", "));
            }
            b
        }
    };
    let mut body = body;
    if s.is_shard_group {
        let kind = if s.shard_group_type == 0 {
            "shard_as"
        } else {
            "shard_like"
        };
        let _ = write!(body, " {kind} {}", s.shard_group_id);
    }
    match s.metadata.as_slice() {
        [] => {}
        [m] => {
            let _ = write!(body, " metadata={{{}}}", metadata(m));
        }
        ms => {
            let parts: Vec<String> = ms.iter().map(|m| format!("{{{}}}", metadata(m))).collect();
            let _ = write!(body, " metadata={{{}}}", parts.join(", "));
        }
    }
    Ok(format!("{{{body}}}"))
}

fn frontend_attributes(fa: &FrontendAttributes) -> String {
    // BTreeMap: already sorted by key, as XLA prints them.
    let parts: Vec<String> = fa
        .map
        .iter()
        .map(|(k, v)| {
            if lexes_as_dict(v) {
                format!("{k}={v}")
            } else {
                format!("{k}={}", quoted(v))
            }
        })
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// `{...}` with balanced braces outside of string literals: printed bare,
/// like XLA prints JSON backend configs and dict-valued frontend attributes.
fn lexes_as_dict(s: &str) -> bool {
    if !(s.starts_with('{') && s.ends_with('}')) {
        return false;
    }
    let mut depth = 0i64;
    let mut in_string = false;
    let mut escaped = false;
    for (k, c) in s.char_indices() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 && k != s.len() - 1 {
                    return false;
                }
            }
            _ => {}
        }
    }
    depth == 0 && !in_string
}

fn backend_config(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) if lexes_as_dict(s) => s.to_string(),
        Ok(s) => quoted(s),
        Err(_) => quoted_bytes(b),
    }
}

fn metadata(m: &OpMetadata) -> String {
    let mut parts = Vec::new();
    if !m.op_type.is_empty() {
        parts.push(format!("op_type={}", quoted(&m.op_type)));
    }
    if !m.op_name.is_empty() {
        parts.push(format!("op_name={}", quoted(&m.op_name)));
    }
    if !m.source_file.is_empty() {
        parts.push(format!("source_file={}", quoted(&m.source_file)));
    }
    if m.source_line != 0 {
        parts.push(format!("source_line={}", m.source_line));
    }
    if m.source_end_line != 0 {
        parts.push(format!("source_end_line={}", m.source_end_line));
    }
    if m.source_column != 0 {
        parts.push(format!("source_column={}", m.source_column));
    }
    if m.source_end_column != 0 {
        parts.push(format!("source_end_column={}", m.source_end_column));
    }
    if !m.profile_type.is_empty() {
        // XLA prints (and its parser reads) the enum numbers.
        parts.push(format!("profile_type={}", int_list(&m.profile_type)));
    }
    if !m.deduplicated_name.is_empty() {
        parts.push(format!(
            "deduplicated_name={}",
            quoted(&m.deduplicated_name)
        ));
    }
    if !m.scheduling_name.is_empty() {
        parts.push(format!("scheduling_name={}", quoted(&m.scheduling_name)));
    }
    if m.stack_frame_id != 0 {
        parts.push(format!("stack_frame_id={}", m.stack_frame_id));
    }
    parts.join(" ")
}

/// The table exactly as stored: every row, in order, unreferenced ones too
/// (XLA's parser drops those when it reads the text; equarx's keeps them).
fn stack_frames(out: &mut String, s: &StackFrameIndexProto) {
    if s.file_names.is_empty()
        && s.function_names.is_empty()
        && s.file_locations.is_empty()
        && s.stack_frames.is_empty()
    {
        return;
    }
    out.push_str("FileNames\n");
    for (k, f) in s.file_names.iter().enumerate() {
        let _ = writeln!(out, "{} {}", k + 1, quoted(f));
    }
    out.push_str("\nFunctionNames\n");
    for (k, f) in s.function_names.iter().enumerate() {
        let _ = writeln!(out, "{} {}", k + 1, quoted(f));
    }
    out.push_str("\nFileLocations\n");
    for (k, l) in s.file_locations.iter().enumerate() {
        let _ = writeln!(
            out,
            "{} {{file_name_id={} function_name_id={} line={} end_line={} column={} end_column={}}}",
            k + 1,
            l.file_name_id,
            l.function_name_id,
            l.line,
            l.end_line,
            l.column,
            l.end_column
        );
    }
    out.push_str("\nStackFrames\n");
    // XLA prints parent ids one up (its parser takes one off again).
    for (k, f) in s.stack_frames.iter().enumerate() {
        let _ = writeln!(
            out,
            "{} {{file_location_id={} parent_frame_id={}}}",
            k + 1,
            f.file_location_id,
            i64::from(f.parent_frame_id) + 1
        );
    }
    out.push_str("\n\n");
}

/// `bf16[8,16]{1,0}`: type, dimensions (`<=N` if dynamic), layout.
pub fn print_shape(s: &ShapeProto) -> String {
    if shape::is_tuple(s) {
        let parts: Vec<String> = s.tuple_shapes.iter().map(print_shape).collect();
        return format!("({})", parts.join(", "));
    }
    let mut out = shape_without_layout(s);
    if let Some(l) = &s.layout {
        if !s.dimensions.is_empty() || has_layout_extras(l) {
            out.push_str(&layout(l));
        }
    }
    out
}

fn shape_without_layout(s: &ShapeProto) -> String {
    if shape::is_tuple(s) {
        let parts: Vec<String> = s.tuple_shapes.iter().map(shape_without_layout).collect();
        return format!("({})", parts.join(", "));
    }
    let dims: Vec<String> = s
        .dimensions
        .iter()
        .enumerate()
        .map(|(k, d)| {
            if *d == i64::MIN {
                "?".to_string()
            } else if s.is_dynamic_dimension.get(k).copied().unwrap_or(false) {
                format!("<={d}")
            } else {
                d.to_string()
            }
        })
        .collect();
    format!(
        "{}[{}]",
        type_name(s.element_type).unwrap_or("invalid"),
        dims.join(",")
    )
}

fn has_layout_extras(l: &LayoutProto) -> bool {
    !l.tiles.is_empty() || l.memory_space != 0 || l.element_size_in_bits != 0
}

fn layout(l: &LayoutProto) -> String {
    let mut s = format!("{{{}", join(&l.minor_to_major, ","));
    let mut extra = String::new();
    if l.dim_level_types.iter().any(|&d| d != 0) {
        let names: Vec<&str> = l
            .dim_level_types
            .iter()
            .map(|&d| match d {
                1 => "C",
                2 => "S",
                3 => "H",
                _ => "D",
            })
            .collect();
        let _ = write!(extra, "D({})", names.join(","));
    }
    if !l.tiles.is_empty() {
        extra.push('T');
        for t in &l.tiles {
            let dims: Vec<String> = t
                .dimensions
                .iter()
                .map(|&d| {
                    if d == i64::MIN {
                        "*".to_string()
                    } else {
                        d.to_string()
                    }
                })
                .collect();
            let _ = write!(extra, "({})", dims.join(","));
        }
    }
    if l.tail_padding_alignment_in_elements > 1 {
        let _ = write!(extra, "L({})", l.tail_padding_alignment_in_elements);
    }
    if l.index_primitive_type != 0 {
        let _ = write!(
            extra,
            "#({})",
            type_name(l.index_primitive_type).unwrap_or("?")
        );
    }
    if l.pointer_primitive_type != 0 {
        let _ = write!(
            extra,
            "*({})",
            type_name(l.pointer_primitive_type).unwrap_or("?")
        );
    }
    if l.element_size_in_bits != 0 {
        let _ = write!(extra, "E({})", l.element_size_in_bits);
    }
    if l.memory_space != 0 {
        let _ = write!(extra, "S({})", l.memory_space);
    }
    if let Some(p) = &l.physical_shape {
        let _ = write!(extra, "P({})", print_shape(p));
    }
    if !extra.is_empty() {
        s.push(':');
        s.push_str(&extra);
    }
    s.push('}');
    s
}

fn literal(l: &LiteralProto) -> Result<String, String> {
    let s = l.shape.as_ref().ok_or("literal without a shape")?;
    if shape::is_tuple(s) {
        let parts: Result<Vec<String>, String> = l.tuple_literals.iter().map(literal).collect();
        return Ok(format!("({})", parts?.join(", ")));
    }
    let n = shape::element_count(s).ok_or("literal shape overflows")? as usize;
    let values = logical_order(literal_values(l, s.element_type, n)?, s)?;
    if s.dimensions.is_empty() {
        return values
            .into_iter()
            .next()
            .ok_or_else(|| "scalar literal without a value".into());
    }
    Ok(nest(&values, &s.dimensions))
}

/// `s32[2]{0} {1, 2}`, tuples as `(s32[] 1, f32[] 2)`: a literal with its
/// shape, as XLA's parser reads a custom-call's `literal=`.
fn shaped_literal(l: &LiteralProto) -> Result<String, String> {
    let s = l.shape.as_ref().ok_or("literal without a shape")?;
    if shape::is_tuple(s) {
        let parts: Result<Vec<String>, String> =
            l.tuple_literals.iter().map(shaped_literal).collect();
        return Ok(format!("({})", parts?.join(", ")));
    }
    Ok(format!("{} {}", print_shape(s), literal(l)?))
}

/// XLA stores a literal's values in the order of its layout; the text lists
/// them row-major.
fn logical_order(values: Vec<String>, s: &ShapeProto) -> Result<Vec<String>, String> {
    let Some(l) = s.layout.as_deref() else {
        return Ok(values);
    };
    let Some(positions) = shape::physical_positions(&s.dimensions, &l.minor_to_major).map_err(
        |shape::NotAPermutation| "literal layout is not a permutation of its dimensions",
    )?
    else {
        return Ok(values);
    };
    positions
        .iter()
        .take(values.len())
        .map(|&pos| {
            values
                .get(pos)
                .cloned()
                .ok_or_else(|| "literal layout out of range".to_string())
        })
        .collect()
}

/// Row-major values nested by dimension: `{ { 1, 2 }, { 3, 4 } }`.
fn nest(values: &[String], dims: &[i64]) -> String {
    if dims.len() <= 1 {
        return format!("{{{}}}", values.join(", "));
    }
    let inner: usize = dims[1..].iter().map(|&d| d as usize).product();
    let parts: Vec<String> = if inner == 0 {
        (0..dims[0]).map(|_| nest(&[], &dims[1..])).collect()
    } else {
        values.chunks(inner).map(|c| nest(c, &dims[1..])).collect()
    };
    format!("{{ {} }}", parts.join(", "))
}

fn literal_values(l: &LiteralProto, ty: i32, n: usize) -> Result<Vec<String>, String> {
    let t = PrimitiveType::try_from(ty).map_err(|_| format!("unknown element type {ty}"))?;
    let check = |len: usize| {
        if len == n {
            Ok(())
        } else {
            Err(format!("literal holds {len} values for {n} elements"))
        }
    };
    let v: Vec<String> = match t {
        PrimitiveType::Pred => {
            check(l.preds.len())?;
            l.preds
                .iter()
                .map(|&b| if b { "true" } else { "false" }.to_string())
                .collect()
        }
        PrimitiveType::S8 => {
            check(l.s8s.len())?;
            l.s8s.iter().map(|&b| (b as i8).to_string()).collect()
        }
        PrimitiveType::U8 => {
            check(l.u8s.len())?;
            l.u8s.iter().map(u8::to_string).collect()
        }
        PrimitiveType::S16 | PrimitiveType::U16 | PrimitiveType::F16 | PrimitiveType::Bf16 => {
            let bytes = match t {
                PrimitiveType::S16 => &l.s16s,
                PrimitiveType::U16 => &l.u16s,
                PrimitiveType::F16 => &l.f16s,
                _ => &l.bf16s,
            };
            check(bytes.len() / 2)?;
            bytes
                .chunks_exact(2)
                .map(|c| {
                    let bits = u16::from_le_bytes([c[0], c[1]]);
                    match t {
                        PrimitiveType::S16 => (bits as i16).to_string(),
                        PrimitiveType::U16 => bits.to_string(),
                        PrimitiveType::F16 => {
                            float_text(f64::from(half::f16::from_bits(bits).to_f32()))
                        }
                        _ => float_text(f64::from(half::bf16::from_bits(bits).to_f32())),
                    }
                })
                .collect()
        }
        PrimitiveType::S32 => {
            check(l.s32s.len())?;
            l.s32s.iter().map(i32::to_string).collect()
        }
        PrimitiveType::U32 => {
            check(l.u32s.len())?;
            l.u32s.iter().map(u32::to_string).collect()
        }
        PrimitiveType::S64 => {
            check(l.s64s.len())?;
            l.s64s.iter().map(i64::to_string).collect()
        }
        PrimitiveType::U64 => {
            check(l.u64s.len())?;
            l.u64s.iter().map(u64::to_string).collect()
        }
        PrimitiveType::F32 => {
            check(l.f32s.len())?;
            l.f32s.iter().map(|&x| float_text_f32(x)).collect()
        }
        PrimitiveType::F64 => {
            check(l.f64s.len())?;
            l.f64s.iter().map(|&x| float_text(x)).collect()
        }
        PrimitiveType::S4
        | PrimitiveType::S2
        | PrimitiveType::S1
        | PrimitiveType::U4
        | PrimitiveType::U2
        | PrimitiveType::U1 => {
            // One byte per element holding the low bits, as XLA stores them.
            let (bytes, bits, signed) = match t {
                PrimitiveType::S4 => (&l.s4s, 4, true),
                PrimitiveType::S2 => (&l.s2s, 2, true),
                PrimitiveType::S1 => (&l.s1s, 1, true),
                PrimitiveType::U4 => (&l.u4s, 4, false),
                PrimitiveType::U2 => (&l.u2s, 2, false),
                _ => (&l.u1s, 1, false),
            };
            check(bytes.len())?;
            bytes
                .iter()
                .map(|&b| {
                    let v = i64::from(b) & ((1 << bits) - 1);
                    let v = if signed && v >= 1 << (bits - 1) {
                        v - (1 << bits)
                    } else {
                        v
                    };
                    v.to_string()
                })
                .collect()
        }
        PrimitiveType::C64 => {
            check(l.c64s.len() / 2)?;
            l.c64s
                .chunks_exact(2)
                .map(|c| format!("({}, {})", float_text_f32(c[0]), float_text_f32(c[1])))
                .collect()
        }
        PrimitiveType::C128 => {
            check(l.c128s.len() / 2)?;
            l.c128s
                .chunks_exact(2)
                .map(|c| format!("({}, {})", float_text(c[0]), float_text(c[1])))
                .collect()
        }
        other => return Err(format!("printing {other:?} constants is not supported")),
    };
    Ok(v)
}

/// Shortest text that reads back to the same f32.
fn float_text_f32(x: f32) -> String {
    special_float_text(x.is_nan(), x.is_infinite(), x.is_sign_negative(), x == 0.0)
        .unwrap_or_else(|| shortest(format!("{x:?}")))
}

/// Shortest text that reads back to the same f64.
fn float_text(x: f64) -> String {
    special_float_text(x.is_nan(), x.is_infinite(), x.is_sign_negative(), x == 0.0)
        .unwrap_or_else(|| shortest(format!("{x:?}")))
}

/// NaN, infinities and -0 as XLA's parser reads them; `None` for the rest.
fn special_float_text(nan: bool, inf: bool, negative: bool, zero: bool) -> Option<String> {
    if nan {
        return Some(nan_text(negative));
    }
    if inf {
        return Some(if negative { "-inf" } else { "inf" }.into());
    }
    // XLA reads `-0` as the integer 0 (+0.0); `-0.0` keeps the sign.
    (zero && negative).then(|| "-0.0".into())
}

/// `1.0` prints as `1`: XLA reads an integer literal into a float.
fn shortest(s: String) -> String {
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

fn nan_text(negative: bool) -> String {
    if negative {
        "-nan".into()
    } else {
        "nan".into()
    }
}

fn int_list<T: ToString>(v: &[T]) -> String {
    format!("{{{}}}", join(v, ","))
}

fn int_list_tight<T: ToString>(v: &[T]) -> String {
    format!("{{{}}}", join(v, ","))
}

fn index_list(v: &[i64]) -> String {
    format!("{{{}}}", join(v, ","))
}

fn join<T: ToString>(v: &[T], sep: &str) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(sep)
}

/// A double-quoted string, escaped as XLA's printer escapes (absl::CEscape):
/// quotes, backslash, `\n` `\r` `\t` by name, every other byte outside
/// printable ASCII in octal, so non-ASCII names read `"ma\303\237stab"` as
/// in XLA's dumps.
fn quoted(s: &str) -> String {
    quoted_bytes(s.as_bytes())
}

fn quoted_bytes(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len() + 2);
    out.push('"');
    for &c in b {
        match c {
            b'"' => out.push_str("\\\""),
            b'\'' => out.push_str("\\'"),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x20..=0x7e => out.push(char::from(c)),
            _ => {
                let _ = write!(out, "\\{c:03o}");
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dict_detection_respects_strings() {
        assert!(lexes_as_dict(r#"{"a":{"b":"}"}}"#));
        assert!(!lexes_as_dict(r#"{"a":1} {"b":2}"#));
        assert!(!lexes_as_dict("#sdy.sharding<@mesh, [{}, {}]>"));
    }

    #[test]
    fn floats_read_back_exactly() {
        for x in [1.0f32 / 127.0, 3.0e-39, f32::MAX, -0.0, 1.0] {
            let t = float_text_f32(x);
            assert_eq!(t.parse::<f32>().unwrap().to_bits(), x.to_bits(), "{t}");
        }
        assert_eq!(float_text_f32(2.0), "2");
        assert_eq!(float_text_f32(f32::INFINITY), "inf");
    }

    #[test]
    fn canonical_base_strips_numeric_suffix_only() {
        assert_eq!(canonical_base("add.12"), "add");
        assert_eq!(canonical_base("param"), "param");
        assert_eq!(canonical_base("main.0_spmd"), "main.0_spmd");
    }

    #[test]
    fn strings_are_escaped_like_xla() {
        // As in XLA's dump of tests/fixtures/frames: octal UTF-8 bytes, \'.
        assert_eq!(quoted("ma\u{df}stab"), r#""ma\303\237stab""#);
        assert_eq!(quoted("na\u{ef}ve's"), r#""na\303\257ve\'s""#);
        assert_eq!(
            quoted("a\"b\\c\n\t\r\u{7f}\u{1}"),
            r#""a\"b\\c\n\t\r\177\001""#
        );
    }
}
