//! Literals: constants' values, element by element, in the proto's
//! representation for each element type.

use super::lexer::Tok;
use super::{Failure, Parser, Res, float_value, parse_i64};
use crate::ir::shape;
use crate::proto::{LayoutProto, LiteralProto, PrimitiveType, ShapeProto};

/// One element of a literal, in its final representation.
#[derive(Clone, Copy)]
enum Elem {
    Bool(bool),
    Int(i64),
    UInt(u64),
    /// f16 / bf16 bits.
    Half(u16),
    F32(f32),
    F64(f64),
    C64(f32, f32),
    C128(f64, f64),
}

/// The element kinds literals support.
#[derive(Clone, Copy, PartialEq)]
enum ElemKind {
    Pred,
    Signed(u32),
    Unsigned(u32),
    F16,
    Bf16,
    F32,
    F64,
    C64,
    C128,
}

fn elem_kind(ty: PrimitiveType) -> Option<ElemKind> {
    use PrimitiveType as P;
    Some(match ty {
        P::Pred => ElemKind::Pred,
        P::S1 | P::S2 | P::S4 | P::S8 | P::S16 | P::S32 | P::S64 => {
            ElemKind::Signed(shape::type_bits(ty as i32)?)
        }
        P::U1 | P::U2 | P::U4 | P::U8 | P::U16 | P::U32 | P::U64 => {
            ElemKind::Unsigned(shape::type_bits(ty as i32)?)
        }
        P::F16 => ElemKind::F16,
        P::Bf16 => ElemKind::Bf16,
        P::F32 => ElemKind::F32,
        P::F64 => ElemKind::F64,
        P::C64 => ElemKind::C64,
        P::C128 => ElemKind::C128,
        _ => return None,
    })
}

/// A float as XLA stores it: `value` converted, NaNs quiet with the sign
/// and payload of the text, out-of-range finite values rejected.
fn float_elem(text: &str, kind: ElemKind) -> Result<Elem, String> {
    // NaN: (exponent mask, payload mask, quiet bit, sign shift) per type.
    if text.contains("nan") {
        let negative = text.starts_with('-');
        let payload = match text.split_once("(0x") {
            Some((_, hex)) => Some(
                u64::from_str_radix(hex.trim_end_matches(')'), 16)
                    .map_err(|_| format!("bad NaN payload in '{text}'"))?,
            ),
            None => None,
        };
        let double_quiet = 1u64 << 51;
        let bits = |exp: u64, mask: u64, quiet: u64, sign: u32| -> Result<u64, String> {
            let p = match payload {
                None => quiet,
                Some(p) if p == double_quiet => quiet,
                Some(p) if p > 0 && p <= mask => p,
                Some(p) => return Err(format!("NaN payload 0x{p:x} does not fit")),
            };
            Ok((u64::from(negative) << sign) | exp | p)
        };
        return Ok(match kind {
            ElemKind::F16 => Elem::Half(bits(0x7c00, 0x3ff, 0x200, 15)? as u16),
            ElemKind::Bf16 => Elem::Half(bits(0x7f80, 0x7f, 0x40, 15)? as u16),
            ElemKind::F32 => Elem::F32(f32::from_bits(
                bits(0x7f80_0000, 0x7f_ffff, 0x40_0000, 31)? as u32,
            )),
            _ => Elem::F64(f64::from_bits(bits(
                0x7ff0_0000_0000_0000,
                (1 << 52) - 1,
                double_quiet,
                63,
            )?)),
        });
    }
    let v =
        float_value(text).ok_or_else(|| format!("'{text}' is not a number, or out of range"))?;
    let out_of_range = |ok: bool| {
        if v.is_finite() && !ok {
            Err(format!("{text} is out of range for the element type"))
        } else {
            Ok(())
        }
    };
    Ok(match kind {
        ElemKind::F16 => {
            let h = half::f16::from_f32(v as f32);
            out_of_range(h.is_finite())?;
            Elem::Half(h.to_bits())
        }
        ElemKind::Bf16 => {
            let h = half::bf16::from_f32(v as f32);
            out_of_range(h.is_finite())?;
            Elem::Half(h.to_bits())
        }
        ElemKind::F32 => {
            let f = v as f32;
            out_of_range(f.is_finite())?;
            Elem::F32(f)
        }
        _ => Elem::F64(v),
    })
}

impl<'a> Parser<'a> {
    /// A literal of `shape` (a constant's value).
    pub(super) fn literal(&mut self, shape: &ShapeProto) -> Res<LiteralProto> {
        self.enter()?;
        let l = self.literal_inner(shape);
        self.leave();
        l
    }

    fn literal_inner(&mut self, sh: &ShapeProto) -> Res<LiteralProto> {
        let at = self.here()?;
        if shape::is_tuple(sh) {
            self.expect_sym('(', "to start a tuple literal")?;
            let mut tuple_literals = Vec::new();
            for (k, element) in sh.tuple_shapes.iter().enumerate() {
                if k > 0 {
                    self.expect_sym(',', "between tuple literal elements")?;
                }
                tuple_literals.push(self.literal(element)?);
            }
            self.expect_sym(')', "to end a tuple literal")?;
            return Ok(LiteralProto {
                shape: Some(sh.clone()),
                tuple_literals,
                ..Default::default()
            });
        }
        let ty = PrimitiveType::try_from(sh.element_type).unwrap_or(PrimitiveType::Invalid);
        let kind = elem_kind(ty).ok_or_else(|| {
            Failure::new(
                at,
                format!(
                    "constants of element type {} are not supported",
                    shape::type_name(sh.element_type).unwrap_or("?")
                ),
            )
        })?;
        let dims = &sh.dimensions;
        if dims.iter().any(|&d| d < 0) {
            return Err(Failure::new(at, "a constant needs static dimensions"));
        }
        let rank = dims.len();
        let mut values = Vec::new();
        if rank == 0 {
            values.push(self.literal_element(kind)?);
        } else {
            // Nested braces, one level per dimension, sizes checked as we go.
            let mut seen = vec![0i64; rank];
            let mut level = 0usize;
            loop {
                let t = self.peek()?.clone();
                let tat = self.here()?;
                match t {
                    Tok::Sym('{') => {
                        if level == rank {
                            return Err(Failure::new(
                                tat,
                                format!("too many '{{' for a rank-{rank} constant"),
                            ));
                        }
                        if level > 0 {
                            seen[level - 1] += 1;
                            if seen[level - 1] > dims[level - 1] {
                                return Err(Failure::new(
                                    tat,
                                    format!(
                                        "more than {} entries in dimension {}",
                                        dims[level - 1],
                                        level - 1
                                    ),
                                ));
                            }
                        }
                        level += 1;
                        self.bump()?;
                    }
                    Tok::Sym('}') => {
                        if level == 0 {
                            return Err(Failure::new(tat, "unbalanced '}' in a constant"));
                        }
                        level -= 1;
                        if seen[level] != dims[level] {
                            return Err(Failure::new(
                                tat,
                                format!(
                                    "expected {} entries in dimension {level}, found {}",
                                    dims[level], seen[level]
                                ),
                            ));
                        }
                        seen[level] = 0;
                        self.bump()?;
                        if level == 0 {
                            break;
                        }
                    }
                    Tok::Sym(',') => {
                        self.bump()?;
                    }
                    Tok::Dots => {
                        return Err(Failure::new(
                            tat,
                            "constant abbreviated as {...}; print the module with print_large_constants",
                        ));
                    }
                    Tok::Eof => return Err(self.expected("'}' to end the constant")),
                    _ => {
                        if level != rank {
                            return Err(Failure::new(
                                tat,
                                format!(
                                    "expected '{{': a rank-{rank} constant nests {rank} levels of braces"
                                ),
                            ));
                        }
                        seen[rank - 1] += 1;
                        if seen[rank - 1] > dims[rank - 1] {
                            return Err(Failure::new(
                                tat,
                                format!(
                                    "more than {} entries in dimension {}",
                                    dims[rank - 1],
                                    rank - 1
                                ),
                            ));
                        }
                        values.push(self.literal_element(kind)?);
                    }
                }
            }
        }
        let values =
            physical_order(values, dims, sh.layout.as_deref()).map_err(|m| Failure::new(at, m))?;
        Ok(literal_proto(sh.clone(), kind, &values))
    }

    fn literal_element(&mut self, kind: ElemKind) -> Res<Elem> {
        let at = self.here()?;
        let t = self.peek()?.clone();
        let err = |m: String| Failure::new(at, m);
        let e = match (kind, &t) {
            (ElemKind::Pred, Tok::Ident(w)) if w == "true" || w == "false" => {
                Elem::Bool(w == "true")
            }
            (ElemKind::Pred, Tok::Number(n)) => Elem::Bool(
                parse_i64(n).ok_or_else(|| {
                    err(format!("expected true, false or an integer, found '{n}'"))
                })? != 0,
            ),
            (ElemKind::Signed(bits), Tok::Number(n)) => {
                let v =
                    parse_i64(n).ok_or_else(|| err(format!("expected an integer, found '{n}'")))?;
                let max = (1i64 << (bits - 1)).wrapping_sub(1);
                let min = if bits == 64 {
                    i64::MIN
                } else {
                    -(1i64 << (bits - 1))
                };
                if bits < 64 && (v < min || v > max) {
                    return Err(err(format!("{v} is out of range for s{bits}")));
                }
                Elem::Int(v)
            }
            (ElemKind::Unsigned(bits), Tok::Number(n)) => {
                let v: u64 = n
                    .parse()
                    .map_err(|_| err(format!("expected an unsigned integer, found '{n}'")))?;
                if bits < 64 && v >= (1u64 << bits) {
                    return Err(err(format!("{v} is out of range for u{bits}")));
                }
                Elem::UInt(v)
            }
            (ElemKind::F16 | ElemKind::Bf16 | ElemKind::F32 | ElemKind::F64, Tok::Number(n)) => {
                float_elem(n, kind).map_err(err)?
            }
            (ElemKind::F16 | ElemKind::Bf16 | ElemKind::F32 | ElemKind::F64, Tok::Ident(w))
                if w == "inf" || w == "nan" =>
            {
                float_elem(w, kind).map_err(err)?
            }
            (ElemKind::C64 | ElemKind::C128, Tok::Sym('(')) => {
                self.bump()?;
                let part = |q: &mut Self| -> Res<f64> {
                    let at = q.here()?;
                    let text = match q.peek()?.clone() {
                        Tok::Number(n) => n,
                        Tok::Ident(w) if w == "inf" || w == "nan" => w,
                        _ => return Err(q.expected("a complex component")),
                    };
                    q.bump()?;
                    match float_elem(&text, ElemKind::F64) {
                        Ok(Elem::F64(v)) => Ok(v),
                        Ok(_) => Err(Failure::new(at, "bad complex component")),
                        Err(m) => Err(Failure::new(at, m)),
                    }
                };
                let re = part(self)?;
                self.expect_sym(',', "between the real and imaginary parts")?;
                let im = part(self)?;
                self.expect_sym(')', "after a complex value")?;
                let e = if kind == ElemKind::C64 {
                    if (re.is_finite() && !(re as f32).is_finite())
                        || (im.is_finite() && !(im as f32).is_finite())
                    {
                        return Err(err("complex value is out of range for c64".into()));
                    }
                    Elem::C64(re as f32, im as f32)
                } else {
                    Elem::C128(re, im)
                };
                return Ok(e);
            }
            _ => return Err(self.expected("a constant value")),
        };
        self.bump()?;
        Ok(e)
    }

    /// `shape value` (custom-call `literal=`), or a parenthesized tuple of them.
    pub(super) fn shaped_literal(&mut self) -> Res<LiteralProto> {
        self.enter()?;
        let r = if self.is_sym('(')? && !self.can_be_shape_after_paren()? {
            self.list('(', ')', "a tuple literal", |q| q.shaped_literal())
                .map(|tuple_literals| LiteralProto {
                    shape: Some(ShapeProto {
                        element_type: PrimitiveType::Tuple as i32,
                        tuple_shapes: tuple_literals
                            .iter()
                            .filter_map(|l| l.shape.clone())
                            .collect(),
                        ..Default::default()
                    }),
                    tuple_literals,
                    ..Default::default()
                })
        } else {
            let sh = self.shape();
            sh.and_then(|sh| self.literal(&sh))
        };
        self.leave();
        r
    }

    /// Whether a `(` starts a tuple *shape* (then a tuple literal follows the
    /// whole shape) rather than a tuple of shaped literals.
    fn can_be_shape_after_paren(&mut self) -> Res<bool> {
        // `(f32[] 1, ...)` is a tuple of literals: after the first shape
        // comes a value, not ',' or ')'.
        let mut ahead = Parser {
            lex: self.lex.clone(),
            depth: self.depth,
        };
        if ahead.shape().is_err() {
            return Ok(false);
        }
        ahead.is_sym('(')
    }
}

/// Reorders row-major `values` into the physical order of `layout` (XLA's
/// literals store their data in layout order).
fn physical_order(
    values: Vec<Elem>,
    dims: &[i64],
    layout: Option<&LayoutProto>,
) -> Result<Vec<Elem>, String> {
    let Some(l) = layout else { return Ok(values) };
    let Some(positions) = shape::physical_positions(dims, &l.minor_to_major).map_err(
        |shape::NotAPermutation| "the constant's layout is not a permutation of its dimensions",
    )?
    else {
        return Ok(values);
    };
    let mut out = values.clone();
    for (v, pos) in values.into_iter().zip(positions) {
        if let Some(slot) = out.get_mut(pos) {
            *slot = v;
        }
    }
    Ok(out)
}

fn literal_proto(sh: ShapeProto, kind: ElemKind, values: &[Elem]) -> LiteralProto {
    let ty = PrimitiveType::try_from(sh.element_type).unwrap_or(PrimitiveType::Invalid);
    let mut l = LiteralProto {
        shape: Some(sh),
        ..Default::default()
    };
    let ints = || {
        values
            .iter()
            .map(|e| if let Elem::Int(v) = e { *v } else { 0 })
    };
    let uints = || {
        values
            .iter()
            .map(|e| if let Elem::UInt(v) = e { *v } else { 0 })
    };
    let halves = || {
        values
            .iter()
            .flat_map(|e| if let Elem::Half(b) = e { *b } else { 0 }.to_le_bytes())
            .collect::<Vec<u8>>()
    };
    use PrimitiveType as P;
    match kind {
        ElemKind::Pred => {
            l.preds = values
                .iter()
                .map(|e| matches!(e, Elem::Bool(true)))
                .collect()
        }
        ElemKind::Signed(_) => match ty {
            P::S64 => l.s64s = ints().collect(),
            P::S32 => l.s32s = ints().map(|v| v as i32).collect(),
            P::S16 => l.s16s = ints().flat_map(|v| (v as i16).to_le_bytes()).collect(),
            P::S8 => l.s8s = ints().map(|v| v as u8).collect(),
            // Sub-byte values: one byte each, the low bits (two's complement).
            P::S4 => l.s4s = ints().map(|v| (v & 0xf) as u8).collect(),
            P::S2 => l.s2s = ints().map(|v| (v & 0x3) as u8).collect(),
            _ => l.s1s = ints().map(|v| (v & 0x1) as u8).collect(),
        },
        ElemKind::Unsigned(_) => match ty {
            P::U64 => l.u64s = uints().collect(),
            P::U32 => l.u32s = uints().map(|v| v as u32).collect(),
            P::U16 => l.u16s = uints().flat_map(|v| (v as u16).to_le_bytes()).collect(),
            P::U8 => l.u8s = uints().map(|v| v as u8).collect(),
            P::U4 => l.u4s = uints().map(|v| v as u8).collect(),
            P::U2 => l.u2s = uints().map(|v| v as u8).collect(),
            _ => l.u1s = uints().map(|v| v as u8).collect(),
        },
        ElemKind::F16 => l.f16s = halves(),
        ElemKind::Bf16 => l.bf16s = halves(),
        ElemKind::F32 => {
            l.f32s = values
                .iter()
                .map(|e| if let Elem::F32(v) = e { *v } else { 0.0 })
                .collect()
        }
        ElemKind::F64 => {
            l.f64s = values
                .iter()
                .map(|e| if let Elem::F64(v) = e { *v } else { 0.0 })
                .collect()
        }
        ElemKind::C64 => {
            l.c64s = values
                .iter()
                .flat_map(|e| {
                    if let Elem::C64(a, b) = e {
                        [*a, *b]
                    } else {
                        [0.0, 0.0]
                    }
                })
                .collect();
        }
        ElemKind::C128 => {
            l.c128s = values
                .iter()
                .flat_map(|e| {
                    if let Elem::C128(a, b) = e {
                        [*a, *b]
                    } else {
                        [0.0, 0.0]
                    }
                })
                .collect();
        }
    }
    l
}
