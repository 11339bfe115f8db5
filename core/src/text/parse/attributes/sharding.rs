//! Shardings (`{replicated}`, `{maximal device=1}`, `{devices=[2,1]<=[2]}`,
//! tuples `{{...}, {...}}`, shard groups, sharding metadata) and the
//! sharding `domain={...}` they bound.

use super::super::lexer::Tok;
use super::super::{Failure, Parser, Res};
use super::product;
use crate::proto::{HloInstructionProto, OpSharding, op_sharding};

impl<'a> Parser<'a> {
    /// `domain={kind="sharding", entry={...}, exit={...}}`.
    pub(super) fn domain_attribute(
        &mut self,
        key: &str,
        p: &mut HloInstructionProto,
        at: usize,
    ) -> Res<bool> {
        match key {
            "domain" => {
                let mut entry = None;
                let mut exit = None;
                let mut kind = None;
                self.sub_attributes("a domain", |q, k, at| {
                    match k {
                        "kind" => kind = Some((q.string("a domain kind")?, at)),
                        "entry" => entry = Some(q.sharding()?),
                        "exit" => exit = Some(q.sharding()?),
                        _ => return Err(Failure::new(at, format!("unknown domain field '{k}'"))),
                    }
                    Ok(())
                })?;
                match kind {
                    Some((k, _)) if k == "sharding" => {}
                    Some((k, at)) => {
                        return Err(Failure::new(at, format!("unsupported domain kind '{k}'")));
                    }
                    None => return Err(Failure::new(at, "domain without a kind")),
                }
                if entry.is_none() || exit.is_none() {
                    return Err(Failure::new(at, "domain needs entry= and exit="));
                }
                // XLA's proto keeps the text's `exit=` (operand side) as the
                // entry sharding and `entry=` as the exit sharding.
                p.domain_entry_sharding = exit.map(Box::new);
                p.domain_exit_sharding = entry.map(Box::new);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// `{replicated}`, `{maximal device=1}`, `{devices=[2,1]<=[2]}`, tuples
    /// `{{...}, {...}}`.
    pub(super) fn sharding(&mut self) -> Res<OpSharding> {
        self.expect_sym('{', "to start a sharding")?;
        if !(self.is_sym('{')? || self.is_sym('}')?) {
            return self.single_sharding();
        }
        let mut tuple_shardings = Vec::new();
        if !self.eat_sym('}')? {
            loop {
                self.expect_sym('{', "to start a tuple element's sharding")?;
                tuple_shardings.push(self.single_sharding()?);
                if self.eat_sym(',')? {
                    continue;
                }
                self.expect_sym('}', "to end a tuple sharding")?;
                break;
            }
        }
        Ok(OpSharding {
            r#type: op_sharding::Type::Tuple as i32,
            tuple_shardings,
            ..Default::default()
        })
    }

    /// The inside of one `{...}` sharding (its `{` already read), through `}`.
    fn single_sharding(&mut self) -> Res<OpSharding> {
        use op_sharding::Type;
        let at = self.here()?;
        let mut kind: Option<Type> = None;
        let mut s = OpSharding::default();
        let mut devices: Vec<i64> = Vec::new();
        let mut last_tile_dim_replicate = false;
        loop {
            let t = self.peek()?.clone();
            let tat = self.here()?;
            let word = match t {
                Tok::Sym('}') => {
                    self.bump()?;
                    break;
                }
                Tok::Ident(w) => w,
                _ => return Err(self.expected("a sharding attribute or '}'")),
            };
            self.bump()?;
            let mut set_kind = |k: Type| -> Res<()> {
                if kind.replace(k).is_some_and(|old| old != k) {
                    return Err(Failure::new(tat, "sharding has more than one kind"));
                }
                Ok(())
            };
            match word.as_str() {
                "replicated" => set_kind(Type::Replicated)?,
                "manual" => set_kind(Type::Manual)?,
                "maximal" => set_kind(Type::Maximal)?,
                "unknown" => set_kind(Type::Unknown)?,
                "unreduced" => set_kind(Type::Unreduced)?,
                "last_tile_dim_replicate" => last_tile_dim_replicate = true,
                "shard_as" | "shard_like" => {
                    s.is_shard_group = true;
                    s.shard_group_id = self.int("a shard group id")?;
                    s.shard_group_type = i32::from(word == "shard_like");
                }
                "device" => {
                    self.expect_sym('=', "after device")?;
                    devices = vec![self.int("a device id")?];
                }
                "devices" => self.tile_assignment(&mut s, &mut devices, tat)?,
                "metadata" => {
                    self.expect_sym('=', "after metadata")?;
                    s.metadata = self.metadata_list()?;
                }
                "last_tile_dims" => {
                    self.expect_sym('=', "after last_tile_dims")?;
                    s.last_tile_dims = self.list('{', '}', "last_tile_dims", |q| {
                        let (w, at) = q.ident("a sharding type")?;
                        Ok(match w.as_str() {
                            "replicated" => Type::Replicated,
                            "manual" => Type::Manual,
                            "maximal" => Type::Maximal,
                            "unreduced" => Type::Unreduced,
                            _ => {
                                return Err(Failure::new(
                                    at,
                                    format!("unknown sharding type '{w}'"),
                                ));
                            }
                        } as i32)
                    })?;
                }
                "mesh" | "maximal_mesh" => {
                    return Err(Failure::new(
                        tat,
                        "named (mesh) shardings are not supported",
                    ));
                }
                _ => {
                    return Err(Failure::new(
                        tat,
                        format!("unknown sharding attribute '{word}'"),
                    ));
                }
            }
        }
        finish_sharding(s, kind, devices, last_tile_dim_replicate, at)
    }

    /// `=[2,1]<=[2]` or `=[2,1]0,1` after `devices`: the tile assignment
    /// shape and its devices, iota or listed.
    fn tile_assignment(
        &mut self,
        s: &mut OpSharding,
        devices: &mut Vec<i64>,
        tat: usize,
    ) -> Res<()> {
        self.expect_sym('=', "after devices")?;
        s.tile_assignment_dimensions = self.list('[', ']', "the tile assignment shape", |q| {
            q.count("a dimension")
        })?;
        if *self.peek()? == Tok::Leq {
            self.bump()?;
            let (dims, perm) = self.iota_array("the iota dimensions")?;
            if product(&dims) != product(&s.tile_assignment_dimensions) {
                return Err(Failure::new(
                    tat,
                    "iota devices do not fill the tile assignment",
                ));
            }
            s.iota_reshape_dims = dims;
            s.iota_transpose_perm = perm;
        } else {
            loop {
                devices.push(self.int("a device id")?);
                if !(self.is_sym(',')? && matches!(self.peek2()?, Tok::Number(_))) {
                    break;
                }
                self.bump()?;
            }
            if product(&s.tile_assignment_dimensions) != i64::try_from(devices.len()).ok() {
                return Err(Failure::new(
                    tat,
                    format!(
                        "tile assignment {:?} needs as many devices, found {}",
                        s.tile_assignment_dimensions,
                        devices.len()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The sharding of the kind its words named (none: tiled), with the devices
/// that kind needs.
fn finish_sharding(
    mut s: OpSharding,
    kind: Option<op_sharding::Type>,
    devices: Vec<i64>,
    last_tile_dim_replicate: bool,
    at: usize,
) -> Res<OpSharding> {
    use op_sharding::Type;
    let tiled = !s.tile_assignment_dimensions.is_empty();
    match kind {
        Some(Type::Maximal) => {
            if devices.len() != 1 || tiled {
                return Err(Failure::new(
                    at,
                    "maximal shardings need exactly one device=",
                ));
            }
            s.r#type = Type::Maximal as i32;
            s.tile_assignment_devices = devices;
        }
        Some(k) => {
            if !devices.is_empty() || tiled {
                return Err(Failure::new(
                    at,
                    format!(
                        "{} shardings have no devices",
                        k.as_str_name().to_ascii_lowercase()
                    ),
                ));
            }
            s.r#type = k as i32;
        }
        None => {
            if !tiled {
                return Err(Failure::new(at, "a tiled sharding needs devices=[...]"));
            }
            s.r#type = Type::Other as i32;
            s.tile_assignment_devices = devices;
            s.replicate_on_last_tile_dim = last_tile_dim_replicate;
        }
    }
    Ok(s)
}
