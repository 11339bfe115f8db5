//! The doors into XLA for other languages, all over one function:
//! [`rewrite_bytes`] (serialized module in, serialized module + report out).
//!
//! - [`c_abi`]: `extern "C"` functions for C, Python (ctypes) and anything
//!   else that can call C; header `cpp_shim/include/equarx.h`.
//! - [`bridge`]: the cxx bridge that `cpp_shim/equarx_pass.cc` (an
//!   `xla::HloModulePass`) calls.
//! - [`pjrt`]: a native callback in the shape of the PJRT XLA-transform
//!   extension (experimental), so a framework can register equarx without a
//!   Python callback.
//!
//! Every door catches panics ([`guarded`]): a bug in equarx becomes an error
//! message, never an unwind into C or C++. Nothing here keeps state between
//! calls (except the options of the PJRT callback), so every door can be
//! called from many threads at once, as XLA does when it compiles modules in
//! parallel.

pub mod bridge;
pub mod c_abi;
pub mod pjrt;

use std::panic::{AssertUnwindSafe, catch_unwind};

use serde::Deserialize;

use crate::io::{self, Format, FormatError};
use crate::passes::quantized_all_reduce::parse_element_types;
use crate::proto::PrimitiveType;
use crate::{DeviceCounts, FuseMode, GatherForm, Options, RewriteOptions, ScaleType};

/// Why a door call failed. The variants map to the C ABI's status codes.
#[derive(Debug, thiserror::Error)]
pub enum DoorError {
    /// A null pointer, a bad length, a struct from an unknown ABI version.
    #[error("invalid argument: {0}")]
    Argument(String),
    #[error("invalid options: {0}")]
    Options(String),
    #[error("cannot read the module: {0}")]
    Module(#[from] FormatError),
    #[error("{0}")]
    Rewrite(#[from] crate::Error),
    /// A panic inside equarx (a bug): caught at the door.
    #[error("internal error (a bug in equarx, please report it): {0}")]
    Internal(String),
}

/// The options every door takes, as one JSON object. Absent keys keep their
/// defaults (those of [`Options::default`]); unknown keys are an error, so a
/// misspelt option never goes unnoticed.
///
/// ```json
/// {"block_size": 64, "pipeline_depth": 2, "bidirectional": true,
///  "min_payload_bytes": null, "topology": "v5e", "types": ["bf16"], "scale_type": "bf16",
///  "gather": "all-gather", "fuse": "auto", "replica_count": null, "num_partitions": null,
///  "disabled_passes": []}
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JsonOptions {
    pub block_size: usize,
    pub pipeline_depth: usize,
    pub bidirectional: bool,
    /// `null` (the default): the cost model decides, for `topology`.
    pub min_payload_bytes: Option<u64>,
    /// The cost model's machine: `v5e`, `v6e`, `v5p`, `h100`, `h200`,
    /// optionally with a slice shape (`v5e:4x4`).
    pub topology: String,
    /// Element types to quantize: `bf16`, `f16`, `f32`.
    pub types: Vec<String>,
    pub scale_type: ScaleType,
    pub gather: GatherForm,
    /// `auto` (loop fusions when the module is already fused), `on`, `off`.
    pub fuse: FuseMode,
    /// Overrides what the module says (e.g. its `device_assignment`).
    pub replica_count: Option<i64>,
    pub num_partitions: Option<i64>,
    pub disabled_passes: Vec<String>,
}

impl Default for JsonOptions {
    fn default() -> Self {
        let o = Options::default();
        JsonOptions {
            block_size: o.block_size,
            pipeline_depth: o.pipeline_depth,
            bidirectional: o.bidirectional,
            min_payload_bytes: o.min_payload_bytes,
            topology: o.topology.name.clone(),
            types: o.element_types.iter().map(|t| type_name(*t)).collect(),
            scale_type: o.scale_type,
            gather: o.gather,
            fuse: o.fuse,
            replica_count: None,
            num_partitions: None,
            disabled_passes: Vec::new(),
        }
    }
}

fn type_name(t: PrimitiveType) -> String {
    match t {
        PrimitiveType::Bf16 => "bf16".into(),
        PrimitiveType::F16 => "f16".into(),
        PrimitiveType::F32 => "f32".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

impl JsonOptions {
    /// Checks and converts to the library's options.
    pub fn into_rewrite_options(self) -> Result<RewriteOptions, DoorError> {
        let element_types = parse_element_types(&self.types).map_err(DoorError::Options)?;
        let pass = Options {
            block_size: self.block_size,
            pipeline_depth: self.pipeline_depth,
            bidirectional: self.bidirectional,
            min_payload_bytes: self.min_payload_bytes,
            topology: crate::cost::Topology::parse(&self.topology).map_err(DoorError::Options)?,
            element_types,
            scale_type: self.scale_type,
            gather: self.gather,
            fuse: self.fuse,
            ..Options::default()
        };
        let counts = DeviceCounts {
            replica_count: self.replica_count,
            num_partitions: self.num_partitions,
        };
        checked(pass, counts, self.disabled_passes)
    }
}

/// Validates assembled options.
fn checked(
    pass: Options,
    counts: DeviceCounts,
    disabled_passes: Vec<String>,
) -> Result<RewriteOptions, DoorError> {
    let options = RewriteOptions {
        pass,
        counts,
        disabled_passes,
    };
    options.validate().map_err(DoorError::Options)?;
    Ok(options)
}

/// Parses the JSON options of the C ABI, Python and PJRT doors. An empty
/// string means all defaults.
pub fn parse_options(json: &str) -> Result<RewriteOptions, DoorError> {
    if json.trim().is_empty() {
        return JsonOptions::default().into_rewrite_options();
    }
    let o: JsonOptions =
        serde_json::from_str(json).map_err(|e| DoorError::Options(format!("options JSON: {e}")))?;
    o.into_rewrite_options()
}

/// What a door hands back.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub changed: bool,
    /// The rewritten module in the input's container; `None` when unchanged
    /// (the caller keeps its input: no copy, no re-encoding).
    pub module: Option<Vec<u8>>,
    /// The per-all-reduce report, a JSON array of [`crate::OpReport`].
    pub report_json: String,
}

/// Rewrites serialized module `bytes`. `format` names the container (the
/// hooks always pass a bare `HloModuleProto`); `None` detects it. Counts in
/// `options` override those the module carries.
pub fn rewrite_bytes(
    bytes: &[u8],
    format: Option<Format>,
    options: &RewriteOptions,
) -> Result<Outcome, DoorError> {
    let mut loaded = io::decode(bytes, format)?;
    let module = std::mem::take(&mut loaded.module);
    let result = crate::rewrite(module, loaded.counts, options)?;
    let report_json = serde_json::to_string(&result.report)
        .map_err(|e| DoorError::Internal(format!("report JSON: {e}")))?;
    let module = if result.changed {
        Some(loaded.encode(&result.module, None, loaded.gzip)?)
    } else {
        None
    };
    Ok(Outcome {
        changed: result.changed,
        module,
        report_json,
    })
}

/// Runs `f`, turning a panic into [`DoorError::Internal`] so that no unwind
/// ever crosses into C or C++.
pub fn guarded<T>(f: impl FnOnce() -> Result<T, DoorError>) -> Result<T, DoorError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic with a non-string payload".into());
            Err(DoorError::Internal(msg))
        }
    }
}

/// The library version, as `equarx_version()` returns it.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_options_are_the_defaults() {
        let o = parse_options("  ").unwrap();
        assert_eq!(o.pass, Options::default());
        assert_eq!(o.counts, DeviceCounts::default());
        let o = parse_options("{}").unwrap();
        assert_eq!(o.pass, Options::default());
    }

    #[test]
    fn options_map_to_the_library() {
        let o = parse_options(
            r#"{"block_size": 64, "pipeline_depth": 1, "bidirectional": true,
                "min_payload_bytes": 0, "types": ["bf16", "f32"], "scale_type": "bf16",
                "gather": "permute", "replica_count": 1, "num_partitions": 8,
                "disabled_passes": ["quantized-all-reduce"]}"#,
        )
        .unwrap();
        assert_eq!(o.pass.block_size, 64);
        assert_eq!(o.pass.pipeline_depth, 1);
        assert!(o.pass.bidirectional);
        assert_eq!(o.pass.min_payload_bytes, Some(0));
        assert_eq!(
            o.pass.element_types,
            vec![PrimitiveType::Bf16, PrimitiveType::F32]
        );
        assert_eq!(o.pass.scale_type, ScaleType::Bf16);
        assert_eq!(o.pass.gather, GatherForm::Permute);
        assert_eq!(o.counts.replica_count, Some(1));
        assert_eq!(o.counts.num_partitions, Some(8));
        assert_eq!(o.disabled_passes, vec!["quantized-all-reduce".to_string()]);
    }

    #[test]
    fn bad_options_say_what_is_wrong() {
        let err = |j: &str| parse_options(j).unwrap_err().to_string();
        assert!(err(r#"{"blok_size": 1}"#).contains("unknown field `blok_size`"));
        assert!(err(r#"{"block_size": 0}"#).contains("block size must be in 1..="));
        assert!(err(r#"{"types": ["s32"]}"#).contains(r#""s32" is not one of bf16, f16, f32"#));
        assert!(err(r#"{"replica_count": 0}"#).contains("replica_count must be at least 1"));
        assert!(err("[1,2").contains("options JSON"));
    }

    #[test]
    fn a_panic_becomes_an_internal_error() {
        let r: Result<(), _> = guarded(|| panic!("boom {}", 42));
        match r {
            Err(DoorError::Internal(m)) => assert_eq!(m, "boom 42"),
            other => panic!("expected an internal error, got {other:?}"),
        }
        let r: Result<(), _> = guarded(|| std::panic::panic_any(7u8));
        assert!(matches!(r, Err(DoorError::Internal(m)) if m.contains("non-string")));
    }
}
