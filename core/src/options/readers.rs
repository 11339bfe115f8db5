//! Readers: JSON or text into a typed value, with one message each. Every
//! option's `set` reads its value with one of these, so a JSON number and
//! the text of one mean the same thing at every door.

use serde_json::Value;

use crate::choice::Choice;
use crate::proto::PrimitiveType;

fn got(v: &Value) -> String {
    v.to_string()
}

/// A whole number: a JSON number, or text of one.
pub fn whole(v: &Value) -> Result<u64, String> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("expected a whole number, got {}", got(v)))
}

/// A signed integer (the device counts, which `validate` checks).
pub fn integer(v: &Value) -> Result<i64, String> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("expected an integer, got {}", got(v)))
}

/// A finite number: a JSON number, or text of one.
pub fn number(v: &Value) -> Result<f64, String> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|x: &f64| x.is_finite())
    .ok_or_else(|| format!("expected a number, got {}", got(v)))
}

pub(super) fn size(n: u64) -> Result<usize, String> {
    usize::try_from(n).map_err(|_| format!("{n} is too large"))
}

pub fn boolean(v: &Value) -> Result<bool, String> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) => match s.trim() {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        },
        _ => None,
    }
    .ok_or_else(|| format!("expected true or false, got {}", got(v)))
}

/// Bytes: a number, or text like `65536`, `64KiB`, `1MiB`, `2GiB`.
pub fn byte_count(v: &Value) -> Result<u64, String> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| format!("expected a byte count, got {n}")),
        Value::String(s) => parse_bytes(s),
        _ => Err(format!("expected a byte count, got {}", got(v))),
    }
}

/// `null` is "not set"; anything else goes to `read`.
pub fn nullable<T>(v: &Value, read: fn(&Value) -> Result<T, String>) -> Result<Option<T>, String> {
    match v {
        Value::Null => Ok(None),
        v => read(v).map(Some),
    }
}

pub fn text(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.trim().to_string()),
        _ => Err(format!("expected a string, got {}", got(v))),
    }
}

/// A list: a JSON array of strings, or comma-separated text (`""` is empty).
pub fn list(v: &Value) -> Result<Vec<String>, String> {
    match v {
        Value::String(s) if s.trim().is_empty() => Ok(Vec::new()),
        Value::String(s) => Ok(s.split(',').map(|p| p.trim().to_string()).collect()),
        Value::Array(items) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => Ok(s.trim().to_string()),
                other => Err(format!("expected a list of strings, got {}", got(other))),
            })
            .collect(),
        _ => Err(format!("expected a list of strings, got {}", got(v))),
    }
}

/// One of an enum's names ([`Choice`]).
pub fn choice<T: Choice>(v: &Value) -> Result<T, String> {
    T::parse(&text(v)?)
}

/// `auto`, or one of an enum's names: `None` is the pass's own choice.
pub fn auto_choice<T: Choice>(v: &Value) -> Result<Option<T>, String> {
    let s = text(v)?;
    if s == "auto" {
        return Ok(None);
    }
    T::from_name(&s)
        .map(Some)
        .ok_or_else(|| format!("\"{s}\" is not one of {}", auto_names::<T>().join(", ")))
}

pub(super) fn names<T: Choice>() -> Vec<String> {
    T::names().into_iter().map(String::from).collect()
}

/// `auto` and an enum's names, for [`auto_choice`].
pub(super) fn auto_names<T: Choice>() -> Vec<String> {
    std::iter::once("auto".to_string())
        .chain(names::<T>())
        .collect()
}

pub(super) fn name_of<T: Choice>(t: T) -> String {
    t.name().to_string()
}

/// What [`auto_choice`] reads back.
pub(super) fn auto_name<T: Choice>(t: Option<T>) -> String {
    t.map_or_else(|| "auto".to_string(), name_of)
}

pub(super) fn type_name(t: PrimitiveType) -> &'static str {
    crate::ir::shape::type_name(t as i32).unwrap_or("?")
}

/// `65536`, `64KiB`, `1MiB`, `2GiB` (also `B`), as bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = [
        ("GiB", 1u64 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("B", 1),
    ]
    .iter()
    .find_map(|(suffix, m)| s.strip_suffix(suffix).map(|n| (n.trim(), *m)))
    .unwrap_or((s, 1));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count like 65536 or 1MiB"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s} is too large"))
}
