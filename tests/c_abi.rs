//! The C ABI from C: `cpp_shim/tests/c_abi_test.c` is compiled with the
//! system C compiler against `cpp_shim/include/equarx.h`, linked to the
//! `libequarx.so` of this build, and run over the fixtures. It covers a
//! rewrite, an ineligible module, garbage and null inputs, bad options,
//! 8 threads calling at once (results byte-identical to sequential calls),
//! and the PJRT XLA-transform callback.
//!
//! The Rust half below calls the same functions in-process with mutated
//! modules: whatever the bytes, a status and a message come back, never a
//! crash.

mod doors;

use std::ffi::CStr;
use std::process::Command;

use equarx::ffi::c_abi::{
    EQUARX_INVALID_ARGUMENT, EQUARX_INVALID_MODULE, EQUARX_OK, EQUARX_REWRITE_FAILED, EquarxResult,
    equarx_free_result, equarx_free_string, equarx_op_stats, equarx_profile, equarx_rewrite,
    equarx_sites,
};

fn repo() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn c_program_uses_the_c_abi() {
    let lib = doors::cdylib();
    let lib_dir = lib.parent().unwrap();
    let scratch = repo().join("target/test-scratch/c_abi");
    std::fs::create_dir_all(&scratch).unwrap();
    let exe = scratch.join("c_abi_test");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut compile = Command::new(&cc);
    compile
        .args([
            "-std=c11",
            "-pedantic",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-O1",
            "-pthread",
        ])
        // `equarx_result r = {sizeof r};` is the intended idiom.
        .arg("-Wno-missing-field-initializers")
        .arg("-I")
        .arg(repo().join("cpp_shim/include"))
        .arg(repo().join("cpp_shim/tests/c_abi_test.c"))
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", lib_dir.display()))
        .arg("-l:libequarx.so")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()));
    doors::run(
        &mut compile,
        &format!("compiling the C test with {cc} (set CC to use another compiler)"),
    );
    // The header is also valid C++ (cpp_shim and C++ users include it).
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    doors::run(
        Command::new(&cxx)
            .args(["-std=c++17", "-pedantic", "-Wall", "-Wextra", "-Werror"])
            .args(["-fsyntax-only", "-x", "c++"])
            .arg(repo().join("cpp_shim/include/equarx.h")),
        &format!("compiling equarx.h as C++ with {cxx}"),
    );
    // The runpath names the library built with this test run; the test
    // runner's LD_LIBRARY_PATH (nextest puts target/<profile> on it, where
    // an older uplifted copy may lie) must not win over it.
    let out = doors::run(
        Command::new(&exe)
            .env("LD_LIBRARY_PATH", lib_dir)
            .arg(repo().join("tests/fixtures"))
            .arg(env!("CARGO_PKG_VERSION")),
        "the C test program",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(stdout.contains("all results identical to the sequential ones"));
    assert!(stdout.contains("0 failures"), "{stdout}");
}

fn call(bytes: &[u8], options: &CStr) -> (i32, bool, String) {
    let mut r = EquarxResult::default();
    // SAFETY: valid buffers; `r` is a properly sized result.
    let status = unsafe { equarx_rewrite(bytes.as_ptr(), bytes.len(), options.as_ptr(), &mut r) };
    let text = if r.error.is_null() {
        String::new()
    } else {
        // SAFETY: NUL-terminated string from equarx.
        unsafe { CStr::from_ptr(r.error) }
            .to_string_lossy()
            .into_owned()
    };
    let changed = r.changed == 1;
    // SAFETY: filled by equarx_rewrite.
    unsafe { equarx_free_result(&mut r) };
    (status, changed, text)
}

/// Truncations and byte flips of real modules: every one gets a status and
/// (unless it still decodes and rewrites) a message; the process survives.
#[test]
fn mutated_modules_never_crash_the_door() {
    let base = std::fs::read(repo().join("tests/fixtures/psum_bf16_p8.pb")).unwrap();
    let options = c"{\"min_payload_bytes\": 0}";
    assert_eq!(call(&base, options).0, EQUARX_OK);
    let mut statuses = std::collections::BTreeMap::<i32, usize>::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for i in 0..400 {
        let mut m = base.clone();
        match i % 4 {
            0 => m.truncate((next() as usize) % base.len()),
            1 => {
                let at = (next() as usize) % m.len();
                m[at] ^= 1 << (next() % 8);
            }
            2 => {
                for _ in 0..8 {
                    let at = (next() as usize) % m.len();
                    m[at] = next() as u8;
                }
            }
            _ => {
                let at = (next() as usize) % m.len();
                m.insert(at, next() as u8);
            }
        }
        let (status, _, error) = call(&m, options);
        assert!(
            [EQUARX_OK, EQUARX_INVALID_MODULE, EQUARX_REWRITE_FAILED].contains(&status),
            "mutation {i}: status {status}: {error}"
        );
        assert_eq!(
            status == EQUARX_OK,
            error.is_empty(),
            "mutation {i}: {error}"
        );
        *statuses.entry(status).or_default() += 1;
    }
    println!("statuses over 400 mutations: {statuses:?}");
    assert!(statuses.get(&EQUARX_INVALID_MODULE).copied().unwrap_or(0) > 50);
}

/// A `char**` out-string as Rust, freed.
fn take(p: *mut std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated string from equarx, freed once here.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    unsafe { equarx_free_string(p) };
    s
}

/// Calibration's three calls: sites of a real module, statistics of inputs,
/// a profile of them; nulls, garbage and mismatched statistics get a status
/// and a message, never a crash.
#[test]
fn calibration_calls_check_their_arguments() {
    let module = std::fs::read(repo().join("tests/fixtures/psum_bf16_p8.pb")).unwrap();
    let (mut out, mut err) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid buffers and out-pointers.
    let status = unsafe {
        equarx_sites(
            module.as_ptr(),
            module.len(),
            std::ptr::null(),
            &mut out,
            &mut err,
        )
    };
    assert_eq!(status, EQUARX_OK, "{}", take(err));
    let sites: serde_json::Value = serde_json::from_str(&take(out)).unwrap();
    assert_eq!(sites.as_array().map(Vec::len), Some(1), "{sites}");
    let key = sites[0]["key"].clone();
    assert_eq!(key["group_size"], 8);

    // SAFETY: as above; garbage bytes and a null module.
    let status = unsafe { equarx_sites(b"junk".as_ptr(), 4, std::ptr::null(), &mut out, &mut err) };
    assert_eq!(status, EQUARX_INVALID_MODULE);
    assert!(out.is_null() && !take(err).is_empty());
    // SAFETY: a null module is refused before use.
    let status = unsafe { equarx_sites(std::ptr::null(), 4, std::ptr::null(), &mut out, &mut err) };
    assert_eq!(status, EQUARX_INVALID_ARGUMENT);
    take(err);

    let rows: Vec<f32> = (0..8 * 256)
        .map(|i| ((i * 7919) % 97) as f32 - 48.0)
        .collect();
    let source = c"test";
    // SAFETY: `rows` holds 8 × 256 floats.
    let status = unsafe {
        equarx_op_stats(
            rows.as_ptr(),
            8,
            256,
            0,
            source.as_ptr(),
            &mut out,
            &mut err,
        )
    };
    assert_eq!(status, EQUARX_OK, "{}", take(err));
    let stats: serde_json::Value = serde_json::from_str(&take(out)).unwrap();
    // SAFETY: 8 × 0 elements is refused, not read.
    let status =
        unsafe { equarx_op_stats(rows.as_ptr(), 8, 0, 0, source.as_ptr(), &mut out, &mut err) };
    assert_eq!(status, EQUARX_INVALID_ARGUMENT);
    take(err);

    let profile = |ops: serde_json::Value| -> (i32, String) {
        let m = serde_json::json!({"source": "test", "ops": ops}).to_string();
        let m = std::ffi::CString::new(m).unwrap();
        let (mut out, mut err) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: a NUL-terminated string and out-pointers.
        let status = unsafe { equarx_profile(m.as_ptr(), &mut out, &mut err) };
        let text = if status == EQUARX_OK {
            take(out)
        } else {
            take(err)
        };
        (status, text)
    };
    let (status, text) = profile(serde_json::json!([{"key": key, "stats": [stats, stats]}]));
    assert_eq!(status, EQUARX_OK, "{text}");
    assert!(text.contains("\"version\": 1"), "{text}");
    let two = {
        let rows4: Vec<f32> = rows[..4 * 256].to_vec();
        // SAFETY: 4 × 256 floats.
        let status = unsafe {
            equarx_op_stats(
                rows4.as_ptr(),
                4,
                256,
                0,
                source.as_ptr(),
                &mut out,
                &mut err,
            )
        };
        assert_eq!(status, EQUARX_OK);
        serde_json::from_str::<serde_json::Value>(&take(out)).unwrap()
    };
    let (status, text) = profile(serde_json::json!([{"key": key, "stats": [stats, two]}]));
    assert_eq!(status, EQUARX_INVALID_ARGUMENT, "{text}");
    assert!(text.contains("different shapes"), "{text}");
    let (status, text) = profile(serde_json::json!([{"key": 3}]));
    assert_eq!(status, EQUARX_INVALID_ARGUMENT, "{text}");
    // SAFETY: a null string is refused before use.
    let status = unsafe { equarx_profile(std::ptr::null(), &mut out, &mut err) };
    assert_eq!(status, EQUARX_INVALID_ARGUMENT);
    take(err);
}
