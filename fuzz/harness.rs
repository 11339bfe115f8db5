//! The paths the fuzz targets drive, one function each. Shared, through
//! `#[path]`, by the fuzz targets (`fuzz/fuzz_targets/*.rs`) and by the
//! regression tests (`tests/fuzz_regressions.rs`), so a crash the fuzzer
//! found is replayed through exactly the code that found it.
//!
//! Each function takes arbitrary bytes. Errors are fine; a panic (an
//! equarx bug, or a broken invariant asserted here), an abort, a hang or a
//! leak is a finding.

#![allow(dead_code)]

use std::ffi::{CStr, CString, c_char};

use equarx::ffi::c_abi::{
    EQUARX_INTERNAL, EQUARX_INVALID_ARGUMENT, EQUARX_INVALID_MODULE, EQUARX_INVALID_OPTIONS,
    EQUARX_OK, EQUARX_REWRITE_FAILED, EquarxResult, equarx_check_options, equarx_free_result,
    equarx_free_string, equarx_rewrite,
};
use equarx::io::{self, Format};
use equarx::ir::Module;
use equarx::proto::PrimitiveType;
use equarx::{DeviceCounts, GatherForm, Options, RewriteOptions, ScaleType};
use prost::Message;

/// Separates options JSON from the module in a `c_abi` input.
pub const OPTIONS_SEPARATOR: &[u8] = b"\0EQX\0";

/// Proto decode (detected container and each binary container by name),
/// then the verifier over whatever decodes.
pub fn decode_verify(data: &[u8]) {
    for format in [
        None,
        Some(Format::Module),
        Some(Format::HloProto),
        Some(Format::WithConfig),
    ] {
        if let Ok(loaded) = io::decode(data, format) {
            let m = Module::from_proto(loaded.module);
            let _ = equarx::verify::verify(&m);
        }
    }
}

/// The HLO text parser; what parses is verified and printed back, and the
/// printed text parsed again.
pub fn text_parse(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(parsed) = equarx::text::parse(text) else {
        return;
    };
    let m = Module::from_proto(parsed.proto.clone());
    let _ = equarx::verify::verify(&m);
    if let Ok(printed) = equarx::text::print_module(&parsed.proto, &parsed.counts) {
        let _ = equarx::text::parse(&printed);
    }
}

/// The pass options a `pipeline` input runs with, picked by its length so
/// that seed files stay plain modules.
pub fn pipeline_options(len: usize) -> RewriteOptions {
    let all_types = vec![PrimitiveType::Bf16, PrimitiveType::F16, PrimitiveType::F32];
    let pass = match len % 4 {
        0 => Options {
            min_payload_bytes: Some(0),
            element_types: all_types,
            ..Options::default()
        },
        1 => Options {
            block_size: 5,
            pipeline_depth: 3,
            bidirectional: true,
            min_payload_bytes: Some(0),
            element_types: all_types,
            scale_type: ScaleType::F32,
            gather: GatherForm::Permute,
            ..Options::default()
        },
        2 => Options::default(),
        _ => Options {
            block_size: 1,
            pipeline_depth: 1,
            bidirectional: false,
            min_payload_bytes: Some(0),
            element_types: all_types,
            ..Options::default()
        },
    };
    let counts = if len % 8 == 3 {
        DeviceCounts {
            replica_count: Some(1),
            num_partitions: Some(8),
        }
    } else {
        DeviceCounts::default()
    };
    RewriteOptions {
        pass,
        counts,
        ..RewriteOptions::default()
    }
}

/// Decode, the pass (which verifies its input and its output), verify
/// again, encode in the input's container, decode that again. Asserts that
/// whatever equarx writes, equarx reads back unchanged and well-formed, and
/// that a second run gives the same bytes.
pub fn pipeline(data: &[u8]) {
    let Ok(loaded) = io::decode(data, None) else {
        return;
    };
    let options = pipeline_options(data.len());
    let Ok(r) = equarx::rewrite(loaded.module.clone(), loaded.counts, &options) else {
        return;
    };
    let m = Module::from_proto(r.module.clone());
    if let Err(e) = equarx::verify::verify(&m) {
        panic!("rewrite returned a module the verifier refuses: {e}");
    }
    if !r.changed {
        assert_eq!(
            r.module.encode_to_vec(),
            loaded.module.encode_to_vec(),
            "an unchanged module must come back byte-identical"
        );
        return;
    }
    let again = equarx::rewrite(loaded.module.clone(), loaded.counts, &options)
        .expect("the same input and options rewrite twice");
    assert_eq!(
        again.module.encode_to_vec(),
        r.module.encode_to_vec(),
        "two runs on the same input give different bytes"
    );
    for format in [Format::Module, Format::HloProto, Format::WithConfig] {
        let bytes = loaded
            .encode(&r.module, Some(format), false, &r.counts)
            .expect("binary encoding cannot fail");
        let back = io::decode(&bytes, Some(format))
            .unwrap_or_else(|e| panic!("equarx cannot read its own {format:?} output: {e}"));
        assert_eq!(
            back.module.encode_to_vec(),
            r.module.encode_to_vec(),
            "{format:?} round trip changed the module"
        );
    }
    // Text output may legitimately fail (a module XLA's printer cannot write
    // either); it must not panic.
    let _ = loaded.encode(&r.module, Some(Format::Text), false, &r.counts);
}

/// The options JSON a `c_abi` input uses (by its length, unless it carries
/// its own before [`OPTIONS_SEPARATOR`]) and the module bytes.
pub fn c_abi_split(data: &[u8]) -> (CString, &[u8]) {
    if let Some(at) = data
        .windows(OPTIONS_SEPARATOR.len())
        .position(|w| w == OPTIONS_SEPARATOR)
    {
        let json = &data[..at];
        let json = &json[..json.iter().position(|&b| b == 0).unwrap_or(json.len())];
        let json = CString::new(json).expect("NULs cut off");
        return (json, &data[at + OPTIONS_SEPARATOR.len()..]);
    }
    let json: &CStr = match data.len() % 3 {
        0 => c"",
        1 => c"{\"min_payload_bytes\": 0, \"types\": [\"bf16\", \"f16\", \"f32\"]}",
        _ => {
            c"{\"min_payload_bytes\": 0, \"block_size\": 3, \"pipeline_depth\": 4, \
               \"bidirectional\": true, \"gather\": \"permute\", \"scale_type\": \"f32\", \
               \"replica_count\": 1}"
        }
    };
    (json.to_owned(), data)
}

fn c_str(p: *const c_char) -> Option<String> {
    // SAFETY: equarx hands out NUL-terminated strings or null.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// `equarx_rewrite` and `equarx_check_options` as C callers use them;
/// asserts the ABI's contract: a known status, a message exactly on
/// failure, a report exactly on success, a module exactly when changed, and
/// `equarx_free_result` safe to call twice.
pub fn c_abi(data: &[u8]) {
    let (json, module) = c_abi_split(data);
    let mut r = EquarxResult::default();
    // SAFETY: `module` is a live slice, `json` NUL-terminated, `r` sized.
    let status = unsafe { equarx_rewrite(module.as_ptr(), module.len(), json.as_ptr(), &mut r) };
    let error = c_str(r.error);
    let report = c_str(r.report_json);
    assert!(
        [
            EQUARX_OK,
            EQUARX_INVALID_OPTIONS,
            EQUARX_INVALID_MODULE,
            EQUARX_REWRITE_FAILED,
        ]
        .contains(&status),
        "unexpected status {status}: {error:?}"
    );
    assert_ne!(
        status, EQUARX_INTERNAL,
        "a panic reached the door: {error:?}"
    );
    assert_ne!(status, EQUARX_INVALID_ARGUMENT);
    if status == EQUARX_OK {
        assert!(error.is_none(), "error on success: {error:?}");
        let report = report.expect("a report on success");
        serde_json::from_str::<serde_json::Value>(&report).expect("the report is JSON");
        assert_eq!(
            r.changed == 1,
            !r.module.is_null(),
            "a module exactly when changed"
        );
        if r.changed == 1 {
            // SAFETY: equarx_rewrite returned `module_len` bytes at `module`.
            let out = unsafe { std::slice::from_raw_parts(r.module, r.module_len) };
            io::decode(out, None).expect("the rewritten module decodes");
        }
    } else {
        let error = error.expect("a message on failure");
        assert!(!error.is_empty());
        assert!(report.is_none() && r.module.is_null() && r.changed == 0);
    }
    // SAFETY: filled by equarx_rewrite; freeing twice is part of the contract.
    unsafe {
        equarx_free_result(&mut r);
        equarx_free_result(&mut r);
    }
    assert!(r.module.is_null() && r.error.is_null() && r.report_json.is_null());

    let mut err: *mut c_char = std::ptr::null_mut();
    // SAFETY: NUL-terminated options, writable out pointer.
    let checked = unsafe { equarx_check_options(json.as_ptr(), &mut err) };
    if checked == EQUARX_OK {
        assert!(err.is_null());
    } else {
        assert_eq!(checked, EQUARX_INVALID_OPTIONS);
        assert!(c_str(err).is_some_and(|e| !e.is_empty()));
        assert_eq!(
            status, EQUARX_INVALID_OPTIONS,
            "options refused by equarx_check_options but not by equarx_rewrite"
        );
    }
    // SAFETY: from equarx_check_options (or null).
    unsafe { equarx_free_string(err) };
}
