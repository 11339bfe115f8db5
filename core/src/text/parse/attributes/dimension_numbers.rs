//! Dot, convolution, gather and scatter attributes: their dimension
//! numbers, precision configs and dot algorithms, and the values written
//! in their own syntax (`window={size=3x3 ...}`, `dim_labels=b01f_01io->b01f`).

use std::collections::{HashMap, HashSet};

use super::super::instruction::Instr;
use super::super::{Failure, Parser, Res};
use crate::proto::{
    ConvolutionDimensionNumbers, DotDimensionNumbers, HloInstructionProto, Window, WindowDimension,
};

impl<'a> Parser<'a> {
    /// dot, ragged-dot, scaled-dot.
    pub(super) fn dot_attribute(&mut self, key: &str, ins: &mut Instr, op: &str) -> Res<bool> {
        let p = &mut ins.proto;
        match key {
            "lhs_batch_dims"
            | "lhs_contracting_dims"
            | "rhs_batch_dims"
            | "rhs_contracting_dims" => {
                let v = self.int_list(key)?;
                let d = if op == "ragged-dot" {
                    p.ragged_dot_dimension_numbers
                        .get_or_insert_with(Box::default)
                        .dot_dimension_numbers
                        .get_or_insert_with(DotDimensionNumbers::default)
                } else {
                    p.dot_dimension_numbers.get_or_insert_with(Box::default)
                };
                match key {
                    "lhs_batch_dims" => d.lhs_batch_dimensions = v,
                    "lhs_contracting_dims" => d.lhs_contracting_dimensions = v,
                    "rhs_batch_dims" => d.rhs_batch_dimensions = v,
                    _ => d.rhs_contracting_dimensions = v,
                }
            }
            "lhs_ragged_dims" | "rhs_group_dims" => {
                let v = self.int_list(key)?;
                let r = p
                    .ragged_dot_dimension_numbers
                    .get_or_insert_with(Box::default);
                if key == "lhs_ragged_dims" {
                    r.lhs_ragged_dimensions = v;
                } else {
                    r.rhs_group_dimensions = v;
                }
            }
            "operand_precision" => {
                ins.operand_precision = Some(self.list('{', '}', key, |q| {
                    let (w, at) = q.ident("a precision")?;
                    match w.to_ascii_lowercase().as_str() {
                        "default" => Ok(0),
                        "high" => Ok(1),
                        "highest" => Ok(2),
                        "packed_nibble" => Ok(3),
                        _ => Err(Failure::new(at, format!("unknown precision '{w}'"))),
                    }
                })?);
            }
            "algorithm" => {
                let (w, at) = self.ident("an algorithm")?;
                if op == "rng-bit-generator" {
                    p.rng_algorithm = match w.as_str() {
                        "rng_default" => 0,
                        "rng_three_fry" => 1,
                        "rng_philox" => 2,
                        _ => return Err(Failure::new(at, format!("unknown rng algorithm '{w}'"))),
                    };
                } else {
                    let upper = w.to_ascii_uppercase();
                    let name = if upper.starts_with("ALG_") {
                        upper
                    } else {
                        format!("ALG_{upper}")
                    };
                    let alg = crate::proto::precision_config::Algorithm::from_str_name(&name)
                        .ok_or_else(|| Failure::new(at, format!("unknown dot algorithm '{w}'")))?;
                    ins.algorithm = Some(alg as i32);
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// convolution (and convolution-like custom calls).
    pub(super) fn convolution_attribute(
        &mut self,
        key: &str,
        p: &mut HloInstructionProto,
    ) -> Res<bool> {
        match key {
            "window" => p.window = Some(Box::new(self.window()?)),
            "dim_labels" => p.convolution_dimension_numbers = Some(Box::new(self.dim_labels()?)),
            "feature_group_count" => p.feature_group_count = self.int(key)?,
            "batch_group_count" => p.batch_group_count = self.int(key)?,
            "conv_kind" => {
                let (w, at) = self.ident("a convolution kind")?;
                p.conv_kind = match w.as_str() {
                    "unset" => 0,
                    "fprop" => 1,
                    "dgrad" => 2,
                    "wgrad" => 3,
                    _ => return Err(Failure::new(at, format!("unknown convolution kind '{w}'"))),
                };
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// gather and scatter.
    pub(super) fn gather_scatter_attribute(
        &mut self,
        key: &str,
        p: &mut HloInstructionProto,
        op: &str,
    ) -> Res<bool> {
        match key {
            "offset_dims"
            | "collapsed_slice_dims"
            | "start_index_map"
            | "operand_batching_dims"
            | "start_indices_batching_dims" => {
                let v = self.int_list(key)?;
                let g = p.gather_dimension_numbers.get_or_insert_with(Box::default);
                match key {
                    "offset_dims" => g.offset_dims = v,
                    "collapsed_slice_dims" => g.collapsed_slice_dims = v,
                    "start_index_map" => g.start_index_map = v,
                    "operand_batching_dims" => g.operand_batching_dims = v,
                    _ => g.start_indices_batching_dims = v,
                }
            }
            "update_window_dims"
            | "inserted_window_dims"
            | "scatter_dims_to_operand_dims"
            | "input_batching_dims"
            | "scatter_indices_batching_dims" => {
                let v = self.int_list(key)?;
                let s = p.scatter_dimension_numbers.get_or_insert_with(Box::default);
                match key {
                    "update_window_dims" => s.update_window_dims = v,
                    "inserted_window_dims" => s.inserted_window_dims = v,
                    "scatter_dims_to_operand_dims" => s.scatter_dims_to_operand_dims = v,
                    "input_batching_dims" => s.input_batching_dims = v,
                    _ => s.scatter_indices_batching_dims = v,
                }
            }
            "index_vector_dim" => {
                let v = self.int(key)?;
                if op == "scatter" {
                    p.scatter_dimension_numbers
                        .get_or_insert_with(Box::default)
                        .index_vector_dim = v;
                } else {
                    p.gather_dimension_numbers
                        .get_or_insert_with(Box::default)
                        .index_vector_dim = v;
                }
            }
            "indices_are_sorted" => p.indices_are_sorted = self.bool(key)?,
            "unique_indices" => p.unique_indices = self.bool(key)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// `{size=3x3 stride=2x2 pad=0_1x0_1 lhs_dilate=.. rhs_dilate=.. rhs_reversal=..}`.
    fn window(&mut self) -> Res<Window> {
        let at = self.expect_sym('{', "to start a window")?;
        let mut fields: HashMap<String, (usize, String)> = HashMap::new();
        while !self.eat_sym('}')? {
            let (key, kat) = self.ident("a window field or '}'")?;
            self.expect_sym('=', &format!("after '{key}'"))?;
            if ![
                "size",
                "stride",
                "pad",
                "lhs_dilate",
                "rhs_dilate",
                "rhs_reversal",
            ]
            .contains(&key.as_str())
            {
                return Err(Failure::new(kat, format!("unknown window field '{key}'")));
            }
            let value = self
                .lex
                .raw_word(|c| c.is_ascii_digit() || matches!(c, b'x' | b'_' | b'-'))?;
            if fields.insert(key.clone(), value).is_some() {
                return Err(Failure::new(kat, format!("duplicate window field '{key}'")));
            }
        }
        let dxd = |key: &str| -> Res<Option<Vec<i64>>> {
            let Some((at, text)) = fields.get(key) else {
                return Ok(None);
            };
            text.split('x')
                .map(|s| s.parse::<i64>().ok())
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| Failure::new(*at, format!("expected {key}=NxM..., found '{text}'")))
        };
        let size = dxd("size")?.unwrap_or_default();
        let stride = dxd("stride")?;
        let lhs = dxd("lhs_dilate")?;
        let rhs = dxd("rhs_dilate")?;
        let rev = dxd("rhs_reversal")?;
        let pad = match fields.get("pad") {
            None => None,
            Some((pat, text)) => Some(
                text.split('x')
                    .map(|d| {
                        match d
                            .split('_')
                            .map(|s| s.parse::<i64>().ok())
                            .collect::<Option<Vec<_>>>()
                        {
                            Some(v) if v.len() == 2 => Some((v[0], v[1])),
                            _ => None,
                        }
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        Failure::new(*pat, format!("expected pad=L_HxL_H..., found '{text}'"))
                    })?,
            ),
        };
        let n = size.len();
        for (name, len) in [
            ("stride", stride.as_ref().map(Vec::len)),
            ("lhs_dilate", lhs.as_ref().map(Vec::len)),
            ("rhs_dilate", rhs.as_ref().map(Vec::len)),
            ("rhs_reversal", rev.as_ref().map(Vec::len)),
            ("pad", pad.as_ref().map(Vec::len)),
        ] {
            if len.is_some_and(|l| l != n) {
                return Err(Failure::new(
                    at,
                    format!("window {name}= does not have {n} entries like size="),
                ));
            }
        }
        let get = |v: &Option<Vec<i64>>, k: usize, d: i64| {
            v.as_ref().and_then(|v| v.get(k).copied()).unwrap_or(d)
        };
        let dimensions = (0..n)
            .map(|k| WindowDimension {
                size: size.get(k).copied().unwrap_or(0),
                stride: get(&stride, k, 1),
                padding_low: pad.as_ref().and_then(|p| p.get(k)).map_or(0, |p| p.0),
                padding_high: pad.as_ref().and_then(|p| p.get(k)).map_or(0, |p| p.1),
                window_dilation: get(&rhs, k, 1),
                base_dilation: get(&lhs, k, 1),
                window_reversal: get(&rev, k, 0) == 1,
            })
            .collect();
        Ok(Window { dimensions })
    }

    /// `b01f_01io->b01f`: XLA's `ParseConvolutionDimensionNumbers`.
    fn dim_labels(&mut self) -> Res<ConvolutionDimensionNumbers> {
        let (at, text) = self
            .lex
            .raw_word(|c| c.is_ascii_alphanumeric() || matches!(c, b'?' | b'_' | b'-' | b'>'))?;
        let bad = |m: &str| Failure::new(at, format!("bad dim_labels '{text}': {m}"));
        let (lhs, rest) = text
            .split_once('_')
            .ok_or_else(|| bad("expected lhs_rhs->out"))?;
        let (rhs, out) = rest
            .split_once("->")
            .ok_or_else(|| bad("expected lhs_rhs->out"))?;
        /// Positions of the two named dimensions and the spatial ones.
        fn labels(s: &str, a: char, b: char) -> Result<(i64, i64, Vec<i64>), String> {
            let mut first = 0;
            let mut second = 0;
            let spatial_count = s.chars().filter(|&c| c != a && c != b && c != '?').count();
            let mut spatial = vec![-1i64; spatial_count];
            let mut seen = HashSet::new();
            for (i, c) in s.chars().enumerate() {
                let i = i as i64;
                if c == '?' {
                    continue;
                }
                if !seen.insert(c) {
                    return Err(format!("'{c}' appears twice in '{s}'"));
                }
                if c == a {
                    first = i;
                } else if c == b {
                    second = i;
                } else {
                    let k = c
                        .to_digit(10)
                        .map(|d| d as usize)
                        .filter(|&d| d < spatial_count)
                        .ok_or_else(|| format!("unexpected '{c}' in '{s}'"))?;
                    if let Some(slot) = spatial.get_mut(k) {
                        *slot = i;
                    }
                }
            }
            Ok((first, second, spatial))
        }
        let (ib, if_, is) = labels(lhs, 'b', 'f').map_err(|m| bad(&m))?;
        let (ki, ko, ks) = labels(rhs, 'i', 'o').map_err(|m| bad(&m))?;
        let (ob, of, os) = labels(out, 'b', 'f').map_err(|m| bad(&m))?;
        if is.len() != ks.len() || is.len() != os.len() {
            return Err(bad(
                "input, kernel and output need the same number of spatial dimensions",
            ));
        }
        Ok(ConvolutionDimensionNumbers {
            input_batch_dimension: ib,
            input_feature_dimension: if_,
            input_spatial_dimensions: is,
            kernel_input_feature_dimension: ki,
            kernel_output_feature_dimension: ko,
            kernel_spatial_dimensions: ks,
            output_batch_dimension: ob,
            output_feature_dimension: of,
            output_spatial_dimensions: os,
        })
    }
}
