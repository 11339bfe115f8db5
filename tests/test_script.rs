//! `scripts/test`, the README's test command, on a machine without
//! cargo-nextest: only `bash` and `cargo` on PATH and an empty CARGO_HOME,
//! so nothing can find a nextest binary. In dry-run mode the script must
//! say that it would build the pinned cargo-nextest into the tools
//! directory, then run the suite. (The real install is measured in the
//! README; it takes minutes, too long for a test.)

mod common;

use std::process::Command;

use common::{repo, scratch};

#[test]
fn without_nextest_the_test_command_installs_it_then_runs_the_suite() {
    let dir = scratch("test_script");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_string());
    let bash = ["/bin/bash", "/usr/bin/bash"]
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
        .expect("bash at /bin/bash or /usr/bin/bash");
    std::os::unix::fs::symlink(&cargo, bin.join("cargo")).unwrap();
    std::os::unix::fs::symlink(bash, bin.join("bash")).unwrap();
    let tools = dir.join("tools");
    let out = Command::new(bash)
        .arg(repo().join("scripts/test"))
        .arg("--test")
        .arg("cli")
        .env_clear()
        .env("PATH", &bin)
        .env("HOME", &dir)
        .env("CARGO_HOME", dir.join("cargo-home"))
        .env("EQUARX_TOOLS", &tools)
        .env("EQUARX_TEST_DRY_RUN", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    let lines: Vec<&str> = stdout.lines().collect();
    let install = format!(
        "would run: cargo install --locked --root {} cargo-nextest@",
        tools.display()
    );
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].starts_with(&install), "{stdout}");
    assert_eq!(
        lines[1],
        "would run: cargo nextest run --all-targets --no-fail-fast --test cli"
    );
    assert!(stderr.contains("cargo-nextest not found"), "{stderr}");
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
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    assert!(
        readme.contains("\nscripts/test            # every test (= .ci/run)"),
        "the README's test command is scripts/test"
    );
}
