//! The attributes after an instruction's operands.
//!
//! [`Printer::op_attributes`] is the opcode's own attributes, in XLA's
//! order: one match over the opcode whose arms are a line each or a call
//! into the attribute family's file. This file holds that match and the
//! attributes of single ops (slices, padding, comparisons, custom calls,
//! ...); [`dimension_numbers`] holds dot, convolution, gather and scatter
//! (with windows and precision configs), [`collectives`] the collectives
//! and their replica groups, [`sharding`] shardings and domains, and
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
use crate::ir::shape::{self, type_name};
use crate::proto::HloInstructionProto;
use crate::proto::hlo_instruction_proto::OptionalCrossProgramPrefetchIndex;
use dimension_numbers::{conv_dim_labels, precision, window};

impl Printer<'_> {
    /// The attributes specific to an opcode, in XLA's order.
    pub(super) fn op_attributes(&self, i: &HloInstructionProto) -> Result<Vec<String>, String> {
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
            "domain" => sharding::domain(i, &mut a)?,
            "parameter" => parameter_replication(i, &mut a),
            "iota" => a.push(format!(
                "iota_dimension={}",
                i.dimensions.first().copied().unwrap_or(0)
            )),
            "broadcast" | "transpose" | "reverse" | "reduce" | "concatenate" | "map" => {
                a.push(dims())
            }
            "set-dimension-size" | "get-dimension-size" => a.push(dims()),
            "sort" => {
                a.push(dims());
                if i.is_stable {
                    a.push("is_stable=true".into());
                }
            }
            "get-tuple-element" => a.push(format!("index={}", i.tuple_index)),
            "slice" => slice(i, &mut a),
            "dynamic-slice" => a.push(format!(
                "dynamic_slice_sizes={}",
                int_list(&i.dynamic_slice_sizes)
            )),
            "pad" => padding(i, &mut a)?,
            "compare" => self.comparison(i, &mut a),
            "fusion" => {
                a.push(format!("kind={}", i.fusion_kind));
                a.extend(output_to_operand_aliasing(i));
            }
            "dot" => dimension_numbers::dot(i, &mut a)?,
            "convolution" => dimension_numbers::convolution(i, &mut a),
            "reduce-window" | "select-and-scatter" => {
                if let Some(w) = &i.window {
                    a.push(format!("window={{{}}}", window(w)));
                }
            }
            "gather" => dimension_numbers::gather(i, &mut a)?,
            "scatter" => dimension_numbers::scatter(i, &mut a)?,
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
            "triangular-solve" => triangular_solve(i, &mut a),
            "fft" => {
                let t = ["FFT", "IFFT", "RFFT", "IRFFT"];
                a.push(format!(
                    "fft_type={}",
                    t.get(i.fft_type as usize).unwrap_or(&"FFT")
                ));
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
                    a.push(format!(
                        "outfeed_config={}",
                        quoted_bytes(&i.outfeed_config)
                    ));
                }
            }
            "custom-call" => custom_call(i, &mut a)?,
            "all-reduce"
            | "all-reduce-start"
            | "reduce-scatter"
            | "all-gather"
            | "all-gather-start"
            | "all-to-all"
            | "ragged-all-to-all"
            | "collective-broadcast" => collectives::collective(i, &mut a)?,
            "collective-permute" | "collective-permute-start" => {
                collectives::collective_permute(i, &mut a)
            }
            "async-start" | "async-update" | "async-done" => {
                if !i.async_execution_thread.is_empty() && i.async_execution_thread != "main" {
                    a.push(format!(
                        "async_execution_thread={}",
                        quoted(&i.async_execution_thread)
                    ));
                }
                a.extend(output_to_operand_aliasing(i));
            }
            "copy-start" => {
                if let Some(OptionalCrossProgramPrefetchIndex::CrossProgramPrefetchIndex(n)) =
                    i.optional_cross_program_prefetch_index
                {
                    a.push(format!("cross_program_prefetch_index={n}"));
                }
            }
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
