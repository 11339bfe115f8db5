//! Metadata, frontend attributes, statistics, result accuracy and original
//! values: the structured values any instruction may carry (the module
//! header's frontend attributes too).

use std::collections::BTreeMap;

use super::super::lexer::Tok;
use super::super::{Failure, MAX_DEPTH, Parser, Res};
use crate::proto::{
    FrontendAttributes, OpMetadata, OriginalArrayProto, OriginalValueElementProto,
    OriginalValueProto, ResultAccuracy, Statistic, StatisticsViz, result_accuracy,
};

impl<'a> Parser<'a> {
    /// `{key=value,...}` with string or bare-dict values.
    pub(in crate::text::parse) fn frontend_attributes(&mut self) -> Res<FrontendAttributes> {
        let mut map = BTreeMap::new();
        let entries = self.list('{', '}', "frontend attributes", |q| {
            let (key, at) = match q.peek()?.clone() {
                Tok::Ident(k) => (k, q.bump()?.start),
                Tok::Str(_) => {
                    let at = q.here()?;
                    (q.string("an attribute name")?, at)
                }
                _ => return Err(q.expected("a frontend attribute name")),
            };
            q.expect_sym('=', &format!("after '{key}'"))?;
            let value = if q.is_sym('{')? {
                q.lex.raw_json_dict()?.1
            } else {
                q.string("a frontend attribute value")?
            };
            Ok((key, at, value))
        })?;
        for (key, at, value) in entries {
            if map.insert(key.clone(), value).is_some() {
                return Err(Failure::new(
                    at,
                    format!("duplicate frontend attribute '{key}'"),
                ));
            }
        }
        Ok(FrontendAttributes { map })
    }

    pub(super) fn metadata(&mut self) -> Res<OpMetadata> {
        let mut m = OpMetadata::default();
        self.sub_attributes("metadata", |q, key, at| {
            match key {
                "op_type" => m.op_type = q.string(key)?,
                "op_name" => m.op_name = q.string(key)?,
                "source_file" => m.source_file = q.string(key)?,
                "source_line" => m.source_line = q.int32(key)?,
                "source_end_line" => m.source_end_line = q.int32(key)?,
                "source_column" => m.source_column = q.int32(key)?,
                "source_end_column" => m.source_end_column = q.int32(key)?,
                "deduplicated_name" => m.deduplicated_name = q.string(key)?,
                "scheduling_name" => m.scheduling_name = q.string(key)?,
                "stack_frame_id" => m.stack_frame_id = q.int32(key)?,
                "preserve_layout" => m.preserve_layout = q.bool(key)?,
                "profile_type" => {
                    m.profile_type = q.list('{', '}', key, |q| {
                        let at = q.here()?;
                        let v = match q.peek()?.clone() {
                            Tok::Ident(w) => {
                                q.bump()?;
                                crate::proto::ProfileType::from_str_name(&w)
                                    .map(|t| t as i32)
                                    .ok_or_else(|| {
                                        Failure::new(at, format!("unknown profile type '{w}'"))
                                    })?
                            }
                            _ => q.int32("a profile type")?,
                        };
                        if crate::proto::ProfileType::try_from(v).is_err() {
                            return Err(Failure::new(at, format!("unknown profile type {v}")));
                        }
                        Ok(v)
                    })?;
                }
                _ => return Err(Failure::new(at, format!("unknown metadata field '{key}'"))),
            }
            Ok(())
        })?;
        Ok(m)
    }

    /// A single metadata or a `{ {...}, {...} }` list of them.
    pub(super) fn metadata_list(&mut self) -> Res<Vec<OpMetadata>> {
        if self.is_sym('{')? && self.peek2()? == Tok::Sym('{') {
            return self.list('{', '}', "a metadata list", |q| q.metadata());
        }
        if self.is_sym('{')? && self.peek2()? == Tok::Sym('}') {
            self.bump()?;
            self.bump()?;
            return Ok(Vec::new());
        }
        Ok(vec![self.metadata()?])
    }

    /// `{visualizing_index=N, name=value, ...}`.
    pub(super) fn statistics(&mut self) -> Res<StatisticsViz> {
        self.expect_sym('{', "to start statistics")?;
        let mut s = StatisticsViz::default();
        if self.eat_sym('}')? {
            return Ok(s);
        }
        self.ident("visualizing_index")?;
        self.expect_sym('=', "after visualizing_index")?;
        s.stat_index_to_visualize = self.int("a statistic index")?;
        while self.eat_sym(',')? {
            let (stat_name, _) = self.ident("a statistic name")?;
            self.expect_sym('=', "after the statistic name")?;
            let stat_val = self.float("a statistic value")?;
            s.statistics.push(Statistic {
                stat_name,
                stat_val,
            });
        }
        self.expect_sym('}', "to end statistics")?;
        Ok(s)
    }

    /// `{mode=highest}` or `{tolerance={atol=..,rtol=..,ulps=..}}`.
    pub(super) fn result_accuracy(&mut self) -> Res<ResultAccuracy> {
        self.expect_sym('{', "to start result_accuracy")?;
        let (key, at) = self.ident("mode or tolerance")?;
        self.expect_sym('=', &format!("after '{key}'"))?;
        let specs = match key.as_str() {
            "mode" => {
                let (w, at) = self.ident("a result accuracy mode")?;
                let m = result_accuracy::Mode::from_str_name(&w.to_ascii_uppercase()).ok_or_else(
                    || Failure::new(at, format!("unknown result accuracy mode '{w}'")),
                )?;
                result_accuracy::Specs::Mode(m as i32)
            }
            "tolerance" => {
                let mut t = result_accuracy::Tolerance::default();
                self.list('{', '}', "a tolerance", |q| {
                    let (k, at) = q.ident("atol, rtol or ulps")?;
                    q.expect_sym('=', &format!("after '{k}'"))?;
                    match k.as_str() {
                        "atol" => t.atol = q.float(&k)?,
                        "rtol" => t.rtol = q.float(&k)?,
                        "ulps" => t.ulps = q.float(&k)? as i64,
                        _ => {
                            return Err(Failure::new(at, format!("unknown tolerance field '{k}'")));
                        }
                    }
                    Ok(())
                })?;
                result_accuracy::Specs::Tolerance(t)
            }
            _ => {
                return Err(Failure::new(
                    at,
                    format!("unknown result_accuracy field '{key}'"),
                ));
            }
        };
        self.expect_sym('}', "to end result_accuracy")?;
        Ok(ResultAccuracy { specs: Some(specs) })
    }

    /// `{[synthetic_call]}` or a tuple tree of `{"name" {index}}` arrays.
    pub(super) fn original_value(&mut self) -> Res<OriginalValueProto> {
        self.expect_sym('{', "to start an original value")?;
        let mut v = OriginalValueProto::default();
        if self.eat_sym('[')? {
            if !self.eat_ident("synthetic_call")? {
                return Err(self.expected("'synthetic_call'"));
            }
            self.expect_sym(']', "after synthetic_call")?;
            self.expect_sym('}', "to end the original value")?;
            v.is_synthetic_call = true;
            return Ok(v);
        }
        let mut index: Vec<i64> = Vec::new();
        loop {
            let at = self.here()?;
            match self.peek()?.clone() {
                Tok::Sym('}') => {
                    self.bump()?;
                    return Ok(v);
                }
                Tok::Sym('(') => {
                    self.bump()?;
                    if index.len() >= MAX_DEPTH {
                        return Err(Failure::new(
                            at,
                            format!("nesting deeper than {MAX_DEPTH} levels"),
                        ));
                    }
                    index.push(0);
                }
                Tok::Sym(')') => {
                    self.bump()?;
                    if index.pop().is_none() {
                        return Err(Failure::new(at, "unbalanced ')' in original value"));
                    }
                }
                Tok::Sym(',') => {
                    self.bump()?;
                    match index.last_mut() {
                        Some(last) => *last += 1,
                        None => {
                            return Err(Failure::new(at, "',' outside a tuple in original value"));
                        }
                    }
                }
                Tok::Sym('{') => {
                    self.bump()?;
                    let mut array = None;
                    if matches!(self.peek()?, Tok::Str(_)) {
                        let instruction_name = self.string("an instruction name")?;
                        let shape_index = if self.is_sym('{')? {
                            self.int_list("a shape index")?
                        } else {
                            Vec::new()
                        };
                        array = Some(OriginalArrayProto {
                            instruction_name,
                            shape_index,
                        });
                    }
                    self.expect_sym('}', "to end an original array")?;
                    v.elements.push(OriginalValueElementProto {
                        shape_index: index.clone(),
                        original_array: array,
                    });
                }
                _ => return Err(self.expected("an original array, '(' or '}'")),
            }
        }
    }
}
