//! Plumbing shared by the door tests (C ABI, C++ pass, JAX): where the
//! built libraries and the generated cxx headers are, running a command with
//! its output shown on failure.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The cargo profile directory of this build (`target/<profile>`), where
/// cargo puts `libequarx.so` and `libequarx.a` next to `deps/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary has a directory");
    deps.parent().expect("deps/ has a parent").to_path_buf()
}

/// A library cargo built with this test run (`libequarx.so` / `.a`).
/// `cargo test` builds the library with all its crate types into `deps/`
/// before any integration test (only `cargo build` copies them up a level,
/// so the copy there may be stale); if neither is there, say how to make it.
pub fn built_lib(file: &str) -> PathBuf {
    let dir = profile_dir();
    for p in [dir.join("deps").join(file), dir.join(file)] {
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "{file} is not in {} (nor deps/): it is built with the library \
         (crate-type cdylib/staticlib in Cargo.toml); run `cargo build --lib` \
         with the same CARGO_TARGET_DIR and profile, then re-run the test",
        dir.display()
    )
}

pub fn cdylib() -> PathBuf {
    built_lib("libequarx.so")
}

pub fn staticlib() -> PathBuf {
    built_lib("libequarx.a")
}

/// The include directory cxx-build links for this build's core library
/// (`<target>/cxxbridge`): `rust/cxx.h` and `equarx/src/ffi/bridge.rs.h`.
pub fn cxxbridge_include() -> PathBuf {
    let target = profile_dir()
        .parent()
        .expect("the profile directory is inside the target directory")
        .to_path_buf();
    let d = target.join("cxxbridge");
    assert!(
        d.join("equarx/src/ffi/bridge.rs.h").is_file() && d.join("rust/cxx.h").is_file(),
        "the cxx bridge headers are missing from {} (core/build.rs generates them when the \
         core library builds)",
        d.display()
    );
    d
}

/// Runs `cmd`; panics with its command line, status, stdout and stderr
/// unless it succeeds.
pub fn run(cmd: &mut Command, what: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{what} failed ({}):\n$ {cmd:?}\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// A 128-bit hash (two seeded FNV-1a lanes) of some files' names and
/// contents and some strings: the key of a build cache, not a security
/// measure.
pub fn content_hash(files: &[&Path], extra: &[&str]) -> String {
    use std::fmt::Write;
    let mut h1: u64 = 0xcbf2_9ce4_8422_2325;
    let mut h2: u64 = 0x6c62_272e_07bb_0142;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            h1 = (h1 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
            h2 = (h2 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        h1 ^= 0xff;
        h2 = h2.rotate_left(7);
    };
    for f in files {
        feed(
            f.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .as_bytes(),
        );
        feed(&std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display())));
    }
    for s in extra {
        feed(s.as_bytes());
    }
    let mut out = String::new();
    write!(out, "{h1:016x}{h2:016x}").unwrap();
    out
}
