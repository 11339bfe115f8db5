//! Window and dimension-number attributes: dot, convolution, gather and
//! scatter, the `window={...}` and `dim_labels=` they (and convolution-like
//! custom calls, reduce-window, select-and-scatter) carry, and the
//! precision config of dots and convolutions.

use crate::proto::{ConvolutionDimensionNumbers, HloInstructionProto, Window, WindowDimension};
use crate::text::print::int_list;

pub(super) fn dot(i: &HloInstructionProto, a: &mut Vec<String>) -> Result<(), String> {
    let d = i
        .dot_dimension_numbers
        .as_ref()
        .ok_or("dot without dimension numbers")?;
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
    Ok(())
}

pub(super) fn convolution(i: &HloInstructionProto, a: &mut Vec<String>) {
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

pub(super) fn gather(i: &HloInstructionProto, a: &mut Vec<String>) -> Result<(), String> {
    let g = i
        .gather_dimension_numbers
        .as_ref()
        .ok_or("gather without dimension numbers")?;
    a.push(format!("offset_dims={}", int_list(&g.offset_dims)));
    a.push(format!(
        "collapsed_slice_dims={}",
        int_list(&g.collapsed_slice_dims)
    ));
    a.push(format!("start_index_map={}", int_list(&g.start_index_map)));
    if !g.operand_batching_dims.is_empty() {
        a.push(format!(
            "operand_batching_dims={}",
            int_list(&g.operand_batching_dims)
        ));
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
    Ok(())
}

pub(super) fn scatter(i: &HloInstructionProto, a: &mut Vec<String>) -> Result<(), String> {
    let s = i
        .scatter_dimension_numbers
        .as_ref()
        .ok_or("scatter without dimension numbers")?;
    a.push(format!(
        "update_window_dims={}",
        int_list(&s.update_window_dims)
    ));
    a.push(format!(
        "inserted_window_dims={}",
        int_list(&s.inserted_window_dims)
    ));
    a.push(format!(
        "scatter_dims_to_operand_dims={}",
        int_list(&s.scatter_dims_to_operand_dims)
    ));
    if !s.input_batching_dims.is_empty() {
        a.push(format!(
            "input_batching_dims={}",
            int_list(&s.input_batching_dims)
        ));
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
    Ok(())
}

pub(super) fn precision(i: &HloInstructionProto) -> Vec<String> {
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

pub(super) fn window(w: &Window) -> String {
    let dims = &w.dimensions;
    let join =
        |f: &dyn Fn(&WindowDimension) -> String| dims.iter().map(f).collect::<Vec<_>>().join("x");
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

pub(super) fn conv_dim_labels(d: &ConvolutionDimensionNumbers) -> String {
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
