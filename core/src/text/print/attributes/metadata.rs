//! Attributes any instruction may carry, whatever its op: metadata,
//! frontend attributes, backend config, result accuracy and origin (the
//! original value).

use std::fmt::Write;

use crate::ir::shape;
use crate::proto::{
    FrontendAttributes, OpMetadata, OriginalValueProto, ResultAccuracy, ShapeProto,
};
use crate::text::print::literals::float_text;
use crate::text::print::{index_list, int_list, quoted, quoted_bytes};

/// `result_accuracy={mode=highest}` or `{tolerance={atol=..,rtol=..,ulps=..}}`;
/// nothing for the default mode.
pub(in crate::text::print) fn result_accuracy(r: &ResultAccuracy) -> Option<String> {
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
pub(in crate::text::print) fn original_value(v: &OriginalValueProto, s: &ShapeProto) -> String {
    if v.is_synthetic_call {
        return "{[synthetic_call]}".into();
    }
    fn tree(v: &OriginalValueProto, s: &ShapeProto, index: &mut Vec<i64>, out: &mut String) {
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

pub(in crate::text::print) fn frontend_attributes(fa: &FrontendAttributes) -> String {
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

pub(in crate::text::print) fn backend_config(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) if lexes_as_dict(s) => s.to_string(),
        Ok(s) => quoted(s),
        Err(_) => quoted_bytes(b),
    }
}

pub(in crate::text::print) fn metadata(m: &OpMetadata) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dict_detection_respects_strings() {
        assert!(lexes_as_dict(r#"{"a":{"b":"}"}}"#));
        assert!(!lexes_as_dict(r#"{"a":1} {"b":2}"#));
        assert!(!lexes_as_dict("#sdy.sharding<@mesh, [{}, {}]>"));
    }
}
