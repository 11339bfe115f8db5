//! `scripts/demo`, the README's first command, as a user runs it: the
//! shipped tensor-parallel block rewritten, then run in real XLA:CPU on 8
//! devices beside the original. The test build's `equarx` stands in for
//! the release build the script would make (`EQUARX`).

mod common;

use common::{doc_block, repo};

#[test]
fn the_demo_rewrites_the_block_and_xla_runs_both_alike() {
    // The README's block names the script this test runs.
    let block = doc_block(
        "README.md",
        "tests/demo.rs::the_demo_rewrites_the_block_and_xla_runs_both_alike",
    );
    assert!(
        block.lines().any(|l| l.starts_with("scripts/demo ")),
        "{block}"
    );
    // Made here so that a missing venv fails with scripts/pyenv's own advice.
    common::python();
    let out = std::process::Command::new(repo().join("scripts/demo"))
        .env("EQUARX", env!("CARGO_BIN_EXE_equarx"))
        .output()
        .expect("scripts/demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scripts/demo failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("2 of 2 collectives rewritten"), "{stdout}");
    assert!(
        stdout.contains("all 8 devices hold bit-identical outputs: yes"),
        "{stdout}"
    );
}
