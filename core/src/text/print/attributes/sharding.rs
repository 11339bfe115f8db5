//! Shardings (`{replicated}`, `{devices=[2,1]<=[2]}`, tuples, shard
//! groups, sharding metadata) and the sharding domain they bound.

use std::fmt::Write;

use super::metadata::metadata;
use crate::proto::{HloInstructionProto, OpSharding, op_sharding};
use crate::text::print::join;

pub(super) fn domain(i: &HloInstructionProto, a: &mut Vec<String>) -> Result<(), String> {
    // XLA's proto keeps the text's `exit=` as the entry sharding
    // (operand side) and `entry=` as the exit sharding.
    if let (Some(entry), Some(exit)) = (&i.domain_exit_sharding, &i.domain_entry_sharding) {
        a.push(format!(
            "domain={{kind=\"sharding\", entry={}, exit={}}}",
            sharding(entry)?,
            sharding(exit)?
        ));
    }
    Ok(())
}

pub(in crate::text::print) fn sharding(s: &OpSharding) -> Result<String, String> {
    use op_sharding::Type;
    let body = match Type::try_from(s.r#type).unwrap_or(Type::Other) {
        Type::Tuple => {
            let parts: Result<Vec<String>, String> =
                s.tuple_shardings.iter().map(sharding).collect();
            return Ok(format!("{{{}}}", parts?.join(", ")));
        }
        Type::Replicated => "replicated".to_string(),
        Type::Manual => "manual".to_string(),
        Type::Unknown => "unknown".to_string(),
        Type::Unreduced => "unreduced".to_string(),
        Type::Maximal => format!(
            "maximal device={}",
            s.tile_assignment_devices.first().copied().unwrap_or(0)
        ),
        Type::Other => {
            let mut b = format!("devices=[{}]", join(&s.tile_assignment_dimensions, ","));
            if !s.iota_reshape_dims.is_empty() {
                let _ = write!(b, "<=[{}]", join(&s.iota_reshape_dims, ","));
                let identity = s
                    .iota_transpose_perm
                    .iter()
                    .enumerate()
                    .all(|(k, &p)| p as usize == k);
                if !identity {
                    let _ = write!(b, "T({})", join(&s.iota_transpose_perm, ","));
                }
            } else {
                b.push_str(&join(&s.tile_assignment_devices, ","));
            }
            if s.replicate_on_last_tile_dim {
                b.push_str(" last_tile_dim_replicate");
            }
            if !s.last_tile_dims.is_empty() {
                let names: Vec<&str> = s
                    .last_tile_dims
                    .iter()
                    .map(|&t| match Type::try_from(t) {
                        Ok(Type::Manual) => "manual",
                        Ok(Type::Replicated) => "replicated",
                        Ok(Type::Unreduced) => "unreduced",
                        Ok(Type::Maximal) => "maximal",
                        _ => "unknown",
                    })
                    .collect();
                let _ = write!(b, " last_tile_dims={{{}}}", names.join(", "));
            }
            b
        }
    };
    let mut body = body;
    if s.is_shard_group {
        let kind = if s.shard_group_type == 0 {
            "shard_as"
        } else {
            "shard_like"
        };
        let _ = write!(body, " {kind} {}", s.shard_group_id);
    }
    match s.metadata.as_slice() {
        [] => {}
        [m] => {
            let _ = write!(body, " metadata={{{}}}", metadata(m));
        }
        ms => {
            let parts: Vec<String> = ms.iter().map(|m| format!("{{{}}}", metadata(m))).collect();
            let _ = write!(body, " metadata={{{}}}", parts.join(", "));
        }
    }
    Ok(format!("{{{body}}}"))
}
