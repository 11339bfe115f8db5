//! Shapes and layouts: `bf16[8,16]{1,0}`, tuples, dynamic dimensions and
//! the layout extras (`{1,0:T(8,128)S(1)}`).

use std::fmt::Write;

use super::join;
use crate::ir::shape::{self, type_name};
use crate::proto::{LayoutProto, ShapeProto};

/// `bf16[8,16]{1,0}`: type, dimensions (`<=N` if dynamic), layout.
pub(crate) fn print_shape(s: &ShapeProto) -> String {
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

pub(super) fn shape_without_layout(s: &ShapeProto) -> String {
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
