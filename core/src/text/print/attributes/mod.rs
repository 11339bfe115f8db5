//! The attributes after an instruction's operands.
//!
//! [`Printer::op_attributes`] is the opcode's own attributes, in XLA's
//! order: one match over the [`Opcode`] whose arms are a line each, a call
//! to one op's function below, or a call into the attribute family's file.
//! This file holds that match and the attributes of single ops (slices,
//! padding, comparisons, custom calls, ...); [`dimension_numbers`] holds
//! dot, convolution, gather and scatter (with windows and precision
//! configs), [`collectives`] the collectives and their replica groups, [`sharding`] shardings and domains, and
//! [`metadata`] what any instruction may carry (metadata, frontend
//! attributes, backend config, result accuracy, origin).

mod collectives;
mod dimension_numbers;
mod metadata;
mod sharding;

pub(super) use metadata::{
    backend_config, frontend_attributes, metadata, original_value, result_accuracy,
};
pub(super) use sharding::sharding;

use super::literals::{float_text, shaped_literal};
use super::shapes::print_shape;
use super::{Printer, index_list, int_list, quoted, quoted_bytes};
use crate::ir::opcode::Opcode;
use crate::ir::shape::{self, type_name};
use crate::proto::HloInstructionProto;
use crate::proto::hlo_instruction_proto::OptionalCrossProgramPrefetchIndex;
use dimension_numbers::{conv_dim_labels, precision, window};

impl Printer<'_> {
    /// The attributes specific to an opcode, in XLA's order.
    pub(super) fn op_attributes(&self, i: &HloInstructionProto) -> Result<Vec<String>, String> {
        let mut a = Vec::new();
        // An opcode the table does not know has no attributes equarx knows.
        let Some(op) = Opcode::of(i) else {
            return Ok(a);
        };
        match op {
            Opcode::Reshape => inferred_dimension(i, &mut a),
            Opcode::RngGetAndUpdateState => a.push(format!("delta={}", i.delta)),
            Opcode::Domain => sharding::domain(i, &mut a)?,
            Opcode::Parameter => parameter_replication(i, &mut a),
            Opcode::Iota => iota_dimension(i, &mut a),
            Opcode::Broadcast
            | Opcode::Transpose
            | Opcode::Reverse
            | Opcode::Reduce
            | Opcode::Concatenate
            | Opcode::Map
            | Opcode::SetDimensionSize
            | Opcode::GetDimensionSize => a.push(dimensions(i)),
            Opcode::Sort => sort(i, &mut a),
            Opcode::GetTupleElement => a.push(format!("index={}", i.tuple_index)),
            Opcode::Slice => slice(i, &mut a),
            Opcode::DynamicSlice => a.push(format!(
                "dynamic_slice_sizes={}",
                int_list(&i.dynamic_slice_sizes)
            )),
            Opcode::Pad => padding(i, &mut a)?,
            Opcode::Compare => self.comparison(i, &mut a),
            Opcode::Fusion => fusion(i, &mut a),
            Opcode::Dot => dimension_numbers::dot(i, &mut a)?,
            Opcode::Convolution => dimension_numbers::convolution(i, &mut a),
            Opcode::ReduceWindow | Opcode::SelectAndScatter => windowed(i, &mut a),
            Opcode::Gather => dimension_numbers::gather(i, &mut a)?,
            Opcode::Scatter => dimension_numbers::scatter(i, &mut a)?,
            Opcode::ReducePrecision => reduce_precision(i, &mut a),
            Opcode::Rng => a.push(rng_distribution(i)),
            Opcode::RngBitGenerator => a.push(rng_algorithm(i)),
            Opcode::Topk => topk(i, &mut a),
            Opcode::Cholesky => cholesky(i, &mut a),
            Opcode::TriangularSolve => triangular_solve(i, &mut a),
            Opcode::Fft => fft(i, &mut a),
            Opcode::BatchNormTraining | Opcode::BatchNormInference | Opcode::BatchNormGrad => {
                batch_norm(i, &mut a)
            }
            Opcode::Send | Opcode::Recv | Opcode::SendDone | Opcode::RecvDone => {
                send_recv(i, &mut a)
            }
            Opcode::Infeed => infeed(i, &mut a),
            Opcode::Outfeed => outfeed(i, &mut a),
            Opcode::CustomCall => custom_call(i, &mut a)?,
            Opcode::AllReduce
            | Opcode::AllReduceStart
            | Opcode::ReduceScatter
            | Opcode::AllGather
            | Opcode::AllGatherStart
            | Opcode::AllToAll
            | Opcode::RaggedAllToAll
            | Opcode::CollectiveBroadcast => collectives::collective(op, i, &mut a)?,
            Opcode::CollectivePermute | Opcode::CollectivePermuteStart => {
                collectives::collective_permute(i, &mut a)
            }
            Opcode::AsyncStart | Opcode::AsyncUpdate | Opcode::AsyncDone => async_op(i, &mut a),
            Opcode::CopyStart => copy_start(i, &mut a),
            _ => {}
        }
        Ok(a)
    }

    /// `direction=`, and `type=` when it is not the operand type's default.
    fn comparison(&self, i: &HloInstructionProto, a: &mut Vec<String>) {
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

/// `dimensions={0,1}`.
fn dimensions(i: &HloInstructionProto) -> String {
    format!("dimensions={}", int_list(&i.dimensions))
}

/// A reshape's `inferred_dimension=`, when it has one.
fn inferred_dimension(i: &HloInstructionProto, a: &mut Vec<String>) {
    if let Some(d) = i.dimensions.first() {
        a.push(format!("inferred_dimension={d}"));
    }
}

fn iota_dimension(i: &HloInstructionProto, a: &mut Vec<String>) {
    a.push(format!(
        "iota_dimension={}",
        i.dimensions.first().copied().unwrap_or(0)
    ));
}

fn sort(i: &HloInstructionProto, a: &mut Vec<String>) {
    a.push(dimensions(i));
    if i.is_stable {
        a.push("is_stable=true".into());
    }
}

fn fusion(i: &HloInstructionProto, a: &mut Vec<String>) {
    a.push(format!("kind={}", i.fusion_kind));
    a.extend(output_to_operand_aliasing(i));
}

/// `window=` of reduce-window and select-and-scatter.
fn windowed(i: &HloInstructionProto, a: &mut Vec<String>) {
    if let Some(w) = &i.window {
        a.push(format!("window={{{}}}", window(w)));
    }
}

fn reduce_precision(i: &HloInstructionProto, a: &mut Vec<String>) {
    a.push(format!("exponent_bits={}", i.exponent_bits));
    a.push(format!("mantissa_bits={}", i.mantissa_bits));
}

fn rng_distribution(i: &HloInstructionProto) -> String {
    let name = match i.distribution {
        1 => "rng_uniform",
        2 => "rng_normal",
        _ => "rng_invalid",
    };
    format!("distribution={name}")
}

fn rng_algorithm(i: &HloInstructionProto) -> String {
    let name = match i.rng_algorithm {
        1 => "rng_three_fry",
        2 => "rng_philox",
        _ => "rng_default",
    };
    format!("algorithm={name}")
}

/// `k=` and `largest=`, always: XLA's parser takes a missing `largest` as
/// true.
fn topk(i: &HloInstructionProto, a: &mut Vec<String>) {
    a.push(format!("k={}", i.k));
    a.push(format!("largest={}", i.largest));
}

fn cholesky(i: &HloInstructionProto, a: &mut Vec<String>) {
    if i.cholesky_options.as_ref().is_some_and(|o| o.lower) {
        a.push("lower=true".into());
    }
}

fn fft(i: &HloInstructionProto, a: &mut Vec<String>) {
    let t = ["FFT", "IFFT", "RFFT", "IRFFT"];
    a.push(format!(
        "fft_type={}",
        t.get(i.fft_type as usize).unwrap_or(&"FFT")
    ));
    a.push(format!("fft_length={}", int_list(&i.fft_length)));
}

fn batch_norm(i: &HloInstructionProto, a: &mut Vec<String>) {
    a.push(format!("epsilon={}", float_text(f64::from(i.epsilon))));
    a.push(format!("feature_index={}", i.feature_index));
}

/// Send, recv and their `-done`s: the channel and whether it is the host's.
fn send_recv(i: &HloInstructionProto, a: &mut Vec<String>) {
    if i.channel_id > 0 {
        a.push(format!("channel_id={}", i.channel_id));
    }
    if i.is_host_transfer {
        a.push("is_host_transfer=true".into());
    }
}

fn infeed(i: &HloInstructionProto, a: &mut Vec<String>) {
    if !i.infeed_config.is_empty() {
        a.push(format!("infeed_config={}", quoted_bytes(&i.infeed_config)));
    }
}

fn outfeed(i: &HloInstructionProto, a: &mut Vec<String>) {
    if let Some(s) = &i.outfeed_shape {
        a.push(format!("outfeed_shape={}", print_shape(s)));
    }
    if !i.outfeed_config.is_empty() {
        a.push(format!(
            "outfeed_config={}",
            quoted_bytes(&i.outfeed_config)
        ));
    }
}

/// async-start, -update and -done: a thread other than the main one, and
/// the aliasing.
fn async_op(i: &HloInstructionProto, a: &mut Vec<String>) {
    if !i.async_execution_thread.is_empty() && i.async_execution_thread != "main" {
        a.push(format!(
            "async_execution_thread={}",
            quoted(&i.async_execution_thread)
        ));
    }
    a.extend(output_to_operand_aliasing(i));
}

fn copy_start(i: &HloInstructionProto, a: &mut Vec<String>) {
    if let Some(OptionalCrossProgramPrefetchIndex::CrossProgramPrefetchIndex(n)) =
        i.optional_cross_program_prefetch_index
    {
        a.push(format!("cross_program_prefetch_index={n}"));
    }
}

/// `parameter_replication={true,false}`.
fn parameter_replication(i: &HloInstructionProto, a: &mut Vec<String>) {
    if let Some(r) = &i.parameter_replication {
        let v: Vec<&str> = r
            .replicated_at_leaf_buffers
            .iter()
            .map(|&b| if b { "true" } else { "false" })
            .collect();
        a.push(format!("parameter_replication={{{}}}", v.join(",")));
    }
}

/// `slice={[0:4], [0:8:2]}`.
fn slice(i: &HloInstructionProto, a: &mut Vec<String>) {
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

/// `padding=0_1x2_3`, with `_interior` on every dimension when any has one.
fn padding(i: &HloInstructionProto, a: &mut Vec<String>) -> Result<(), String> {
    let cfg = i
        .padding_config
        .as_ref()
        .ok_or("pad without padding config")?;
    let interior = cfg.dimensions.iter().any(|d| d.interior_padding != 0);
    let parts: Vec<String> = cfg
        .dimensions
        .iter()
        .map(|d| {
            if interior {
                format!(
                    "{}_{}_{}",
                    d.edge_padding_low, d.edge_padding_high, d.interior_padding
                )
            } else {
                format!("{}_{}", d.edge_padding_low, d.edge_padding_high)
            }
        })
        .collect();
    a.push(format!("padding={}", parts.join("x")));
    Ok(())
}

fn triangular_solve(i: &HloInstructionProto, a: &mut Vec<String>) {
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
        a.push(format!(
            "transpose_a={}",
            t.get(o.transpose_a as usize).unwrap_or(&"NO_TRANSPOSE")
        ));
    }
}

fn custom_call(i: &HloInstructionProto, a: &mut Vec<String>) -> Result<(), String> {
    if let Ok(t) = crate::proto::PaddingType::try_from(i.padding_type) {
        if i.padding_type != 0 {
            a.push(format!("padding_type={}", t.as_str_name()));
        }
    }
    a.push(format!(
        "custom_call_target={}",
        quoted(&i.custom_call_target)
    ));
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
        let shapes: Vec<String> = i
            .operand_shapes_with_layout
            .iter()
            .map(print_shape)
            .collect();
        a.push(format!(
            "operand_layout_constraints={{{}}}",
            shapes.join(", ")
        ));
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
    Ok(())
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
