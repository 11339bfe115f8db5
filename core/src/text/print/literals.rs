//! Constants in full, as XLA's parser reads them back: values nested by
//! dimension in row-major order, floats in the shortest text that reads back
//! to the same bits, and the shaped form a custom-call's `literal=` takes.

use super::shapes::print_shape;
use crate::ir::shape;
use crate::proto::{LiteralProto, PrimitiveType, ShapeProto};

pub(super) fn literal(l: &LiteralProto) -> Result<String, String> {
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
pub(super) fn shaped_literal(l: &LiteralProto) -> Result<String, String> {
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
pub(super) fn float_text(x: f64) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_read_back_exactly() {
        for x in [1.0f32 / 127.0, 3.0e-39, f32::MAX, -0.0, 1.0] {
            let t = float_text_f32(x);
            assert_eq!(t.parse::<f32>().unwrap().to_bits(), x.to_bits(), "{t}");
        }
        assert_eq!(float_text_f32(2.0), "2");
        assert_eq!(float_text_f32(f32::INFINITY), "inf");
    }
}
