//! Shapes and layouts.

use super::lexer::Tok;
use super::{Failure, Parser, Res};
use crate::ir::shape::{self, type_from_name};
use crate::proto::{LayoutProto, PrimitiveType, ShapeProto, SplitConfigProto, TileProto};

/// XLA's default layout for a rank: `{rank-1,...,1,0}`.
fn default_layout(rank: usize) -> LayoutProto {
    LayoutProto {
        minor_to_major: (0..rank as i64).rev().collect(),
        tail_padding_alignment_in_elements: 1,
        ..Default::default()
    }
}

impl<'a> Parser<'a> {
    pub(super) fn shape(&mut self) -> Res<ShapeProto> {
        self.enter()?;
        let s = self.shape_inner();
        self.leave();
        s
    }

    fn shape_inner(&mut self) -> Res<ShapeProto> {
        if self.is_sym('(')? {
            let tuple_shapes = self.list('(', ')', "a tuple shape", |q| q.shape())?;
            return Ok(ShapeProto {
                element_type: PrimitiveType::Tuple as i32,
                tuple_shapes,
                ..Default::default()
            });
        }
        let (name, at) = self.ident("a shape")?;
        let ty = type_from_name(&name)
            .filter(|t| *t != PrimitiveType::Tuple)
            .ok_or_else(|| Failure::new(at, format!("unknown element type '{name}'")))?;
        let dims = self.list('[', ']', "the dimensions", |q| {
            if q.eat_sym('?')? {
                return Ok((i64::MIN, true));
            }
            let dynamic = *q.peek()? == Tok::Leq;
            if dynamic {
                q.bump()?;
            }
            Ok((q.count("a dimension size")?, dynamic))
        })?;
        let mut s = ShapeProto {
            element_type: ty as i32,
            dimensions: dims.iter().map(|d| d.0).collect(),
            is_dynamic_dimension: dims.iter().map(|d| d.1).collect(),
            ..Default::default()
        };
        let is_array = !matches!(ty, PrimitiveType::Token | PrimitiveType::OpaqueType);
        if self.is_sym('{')? && matches!(self.peek2()?, Tok::Number(_) | Tok::Sym(':')) {
            let lat = self.here()?;
            let layout = self.layout()?;
            if layout.minor_to_major.len() != dims.len() {
                return Err(Failure::new(
                    lat,
                    format!(
                        "layout lists {} dimensions, but the shape has {}",
                        layout.minor_to_major.len(),
                        dims.len()
                    ),
                ));
            }
            s.layout = Some(Box::new(layout));
        } else if is_array {
            s.layout = Some(Box::new(default_layout(dims.len())));
        }
        Ok(s)
    }

    /// `{1,0:T(8,128)(2,1)E(4)S(1)}` and the other `Layout::ToString` parts.
    fn layout(&mut self) -> Res<LayoutProto> {
        self.expect_sym('{', "to start a layout")?;
        let mut l = default_layout(0);
        while matches!(self.peek()?, Tok::Number(_)) {
            l.minor_to_major.push(self.count("a dimension number")?);
            if !self.eat_sym(',')? {
                break;
            }
        }
        if self.eat_sym(':')? {
            loop {
                let t = self.peek()?.clone();
                match t {
                    Tok::Ident(w) if w == "D" => {
                        self.bump()?;
                        l.dim_level_types = self.list('(', ')', "dim level types", |q| {
                            let (w, at) = q.ident("D, C, S or H")?;
                            let v = match w.as_str() {
                                "D" => 0,
                                "C" => 1,
                                "S" => 2,
                                "H" => 3,
                                _ => {
                                    return Err(Failure::new(
                                        at,
                                        format!("unknown dim level type '{w}'"),
                                    ));
                                }
                            };
                            // XLA reads and drops the unique/ordered markers.
                            while q.eat_sym('+')? || q.eat_sym('~')? {}
                            Ok(v)
                        })?;
                    }
                    Tok::Ident(w) if w == "T" => {
                        self.bump()?;
                        while self.is_sym('(')? {
                            let dimensions = self.list('(', ')', "a tile", |q| {
                                if q.eat_sym('*')? {
                                    return Ok(i64::MIN);
                                }
                                q.int("a tile dimension")
                            })?;
                            l.tiles.push(TileProto { dimensions });
                        }
                    }
                    Tok::Ident(w) if w == "L" => {
                        self.bump()?;
                        l.tail_padding_alignment_in_elements = self.paren_int("L")?;
                    }
                    Tok::Sym('#') | Tok::Sym('*') => {
                        self.bump()?;
                        self.expect_sym('(', "before a primitive type")?;
                        let (name, at) = self.ident("an unsigned integer type")?;
                        let ty = type_from_name(&name)
                            .filter(|t| {
                                shape::type_name(*t as i32).is_some_and(|n| n.starts_with('u'))
                            })
                            .ok_or_else(|| {
                                Failure::new(
                                    at,
                                    format!("expected an unsigned integer type, found '{name}'"),
                                )
                            })?;
                        self.expect_sym(')', "after the primitive type")?;
                        if t == Tok::Sym('#') {
                            l.index_primitive_type = ty as i32;
                        } else {
                            l.pointer_primitive_type = ty as i32;
                        }
                    }
                    Tok::Ident(w) if w == "E" => {
                        self.bump()?;
                        l.element_size_in_bits = self.paren_int("E")?;
                    }
                    Tok::Ident(w) if w == "S" => {
                        self.bump()?;
                        l.memory_space = self.paren_int("S")?;
                    }
                    Tok::Ident(w) if w == "SC" => {
                        self.bump()?;
                        while self.eat_sym('(')? {
                            let dimension = self.int("a split dimension")?;
                            self.expect_sym(':', "after the split dimension")?;
                            let mut split_indices = Vec::new();
                            loop {
                                split_indices.push(self.int("a split index")?);
                                if !self.eat_sym(',')? {
                                    break;
                                }
                            }
                            self.expect_sym(')', "after the split indices")?;
                            l.split_configs.push(SplitConfigProto {
                                dimension,
                                split_indices,
                            });
                        }
                    }
                    Tok::Ident(w) if w == "P" => {
                        self.bump()?;
                        self.expect_sym('(', "before the physical shape")?;
                        l.physical_shape = Some(Box::new(self.shape()?));
                        self.expect_sym(')', "after the physical shape")?;
                    }
                    Tok::Ident(w) if w == "M" => {
                        self.bump()?;
                        l.dynamic_shape_metadata_prefix_bytes = self.paren_int("M")?;
                    }
                    _ => break,
                }
            }
        }
        self.expect_sym('}', "to end the layout")?;
        Ok(l)
    }

    fn paren_int(&mut self, what: &str) -> Res<i64> {
        self.expect_sym('(', &format!("after {what}"))?;
        let v = self.int("an integer")?;
        self.expect_sym(')', &format!("to end {what}(...)"))?;
        Ok(v)
    }
}
