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

use crate::RewriteOptions;
use crate::io::{self, Format, FormatError};

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

/// Parses the JSON options of the C ABI, Python and PJRT doors (see
/// [`crate::options`], the one list of options). An empty string means all
/// defaults; absent keys keep their defaults; an unknown key is an error.
pub fn parse_options(json: &str) -> Result<RewriteOptions, DoorError> {
    crate::options::from_json(json).map_err(DoorError::Options)
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
        Some(loaded.encode(&result.module, None, loaded.gzip, &result.counts)?)
    } else {
        None
    };
    Ok(Outcome {
        changed: result.changed,
        module,
        report_json,
    })
}

/// The collectives of serialized module `bytes` as calibration sees them
/// ([`crate::calibrate::sites`]), as a JSON array; counts in `options`
/// override the module's.
pub fn sites_json(bytes: &[u8], options: &RewriteOptions) -> Result<String, DoorError> {
    let loaded = io::decode(bytes, None)?;
    let counts = loaded.counts.overridden_by(options.counts);
    let module = crate::ir::Module::from_proto(loaded.module);
    serde_json::to_string(&crate::calibrate::sites(&module, &counts))
        .map_err(|e| DoorError::Internal(format!("sites JSON: {e}")))
}

/// The profile (JSON) of measurements (JSON,
/// [`crate::calibrate::Measurements`]).
pub fn profile_json(measurements: &str) -> Result<String, DoorError> {
    let m: crate::calibrate::Measurements = serde_json::from_str(measurements)
        .map_err(|e| DoorError::Argument(format!("measurements: {e}")))?;
    let profile = crate::calibrate::build(m).map_err(DoorError::Argument)?;
    serde_json::to_string_pretty(&profile)
        .map_err(|e| DoorError::Internal(format!("profile JSON: {e}")))
}

/// Runs `f`, turning a panic into [`DoorError::Internal`] so that no unwind
/// ever crosses into C or C++.
pub fn guarded<T>(f: impl FnOnce() -> Result<T, DoorError>) -> Result<T, DoorError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(DoorError::Internal(panic_message(payload.as_ref()))),
    }
}

/// What a panic said: its `&str` or `String` payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-string payload".into())
}

/// The library version, as `equarx_version()` returns it.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::PrimitiveType;
    use crate::{DeviceCounts, GatherForm, Options, ScaleType};

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
        assert!(err(r#"{"blok_size": 1}"#).contains("unknown option \"blok_size\""));
        assert!(err(r#"{"block_size": 0}"#).contains("block size must be in 1..="));
        assert!(err(r#"{"types": ["s32"]}"#).contains(r#""s32" is not one of bf16, f16, f32"#));
        assert!(err(r#"{"replica_count": 0}"#).contains("replica_count: must be at least 1"));
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
