//! Bad input gets a clear one-line error naming the file, a non-zero exit,
//! no output file, and never a panic.

mod common;

use std::path::Path;

use common::{equarx, fixtures_dir, scratch};
use equarx::proto::{HloModuleProto, LiteralProto, ShapeProto};
use prost::Message;

/// Runs `equarx <cmd> input -o out` and checks the failure contract;
/// returns the error line.
fn fails(dir: &Path, cmd: &str, name: &str, bytes: &[u8]) -> String {
    let input = dir.join(name);
    std::fs::write(&input, bytes).unwrap();
    let out = dir.join(format!("{name}.out"));
    let mut c = equarx();
    c.arg(cmd).arg(&input);
    if cmd != "analyze" {
        c.arg("-o").arg(&out);
    }
    if cmd == "rewrite" {
        c.args(["--min-payload", "0"]);
    }
    let o = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{cmd} {name}: exit {:?}, stderr: {stderr}",
        o.status
    );
    assert!(
        !stderr.contains("panicked"),
        "{cmd} {name} panicked: {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{cmd} {name}: want one line, got {stderr}");
    assert!(lines[0].starts_with("equarx: error: "), "{stderr}");
    assert!(
        lines[0].contains(name),
        "{cmd} {name}: the error must name the file: {stderr}"
    );
    assert!(!out.exists(), "{cmd} {name}: an output file was written");
    lines[0].to_string()
}

fn module_with(edit: impl FnOnce(&mut HloModuleProto)) -> Vec<u8> {
    let bytes = std::fs::read(fixtures_dir().join("psum_bf16_p8.pb")).unwrap();
    let mut m = HloModuleProto::decode(bytes.as_slice()).unwrap();
    edit(&mut m);
    m.encode_to_vec()
}

#[test]
fn bad_files_fail_cleanly_through_every_command() {
    let dir = scratch("bad_input");
    let good = std::fs::read(fixtures_dir().join("psum_bf16_p8.pb")).unwrap();
    let mut rng = common::Rng::new(7);
    let random: Vec<u8> = (0..4096).map(|_| rng.next_u64() as u8).collect();
    let shape = ShapeProto {
        element_type: 11,
        dimensions: vec![4, 4],
        ..Default::default()
    };
    let literal = LiteralProto {
        shape: Some(shape.clone()),
        f32s: vec![1.0; 16],
        ..Default::default()
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty.pb", vec![], "empty"),
        ("truncated.pb", good[..good.len() / 2].to_vec(), ""),
        ("random.pb", random, ""),
        ("shape.pb", shape.encode_to_vec(), "not an HLO module"),
        ("literal.pb", literal.encode_to_vec(), ""),
        (
            "dangling_operand.pb",
            module_with(|m| {
                let c = m.computations.last_mut().unwrap();
                c.instructions.last_mut().unwrap().operand_ids = vec![123_456];
            }),
            "operand id 123456",
        ),
        (
            "dangling_callee.pb",
            module_with(|m| {
                for c in &mut m.computations {
                    for i in &mut c.instructions {
                        if i.opcode == "all-reduce" {
                            i.called_computation_ids = vec![999];
                        }
                    }
                }
            }),
            "called computation id 999",
        ),
        (
            "duplicate_ids.pb",
            module_with(|m| {
                let c = m.computations.last_mut().unwrap();
                let id = c.instructions[0].id;
                c.instructions[1].id = id;
            }),
            "used by both",
        ),
        (
            "no_entry.pb",
            module_with(|m| m.entry_computation_id = 77),
            "entry computation",
        ),
    ];
    for (name, bytes, needle) in &cases {
        for cmd in ["rewrite", "print", "analyze"] {
            let line = fails(&dir, cmd, name, bytes);
            assert!(line.contains(needle), "{cmd} {name}: {line}");
        }
    }
}

#[test]
fn a_failed_rewrite_leaves_an_existing_output_untouched() {
    let dir = scratch("bad_input_keep");
    let out = dir.join("out.pb");
    std::fs::write(&out, b"previous contents").unwrap();
    let input = dir.join("broken.pb");
    std::fs::write(&input, b"\x0a\xff\xff\xff").unwrap();
    let o = equarx()
        .arg("rewrite")
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert_eq!(std::fs::read(&out).unwrap(), b"previous contents");
    let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(leftovers.len(), 2, "no temporary file may be left behind");
}

#[test]
fn bad_options_are_refused_before_reading() {
    for args in [
        &["--block-size", "0"][..],
        &["--pipeline-depth", "0"],
        &["--types", "s32"],
        &["--min-payload", "lots"],
        &["--replica-count", "0"],
    ] {
        let o = equarx()
            .arg("rewrite")
            .arg(fixtures_dir().join("psum_bf16_p8.pb"))
            .args(["-o", "/nonexistent/out.pb"])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} was accepted");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
    }
}

/// A bug in equarx (a panic; `EQUARX_TEST_INTERNAL_ERROR` makes one where
/// no input can) is said to be one: an `internal error` line that points
/// at equarx, not at the input, exit status 70, no Rust panic text, and no
/// output file. A directory rewrite names the module and goes on.
#[test]
fn an_internal_error_is_reported_as_a_bug_not_a_panic() {
    let dir = scratch("internal_error");
    let input = fixtures_dir().join("psum_bf16_p8.pb");
    let out = dir.join("out.pb");
    // `equarx rewrite FROM -o TO` with the bug switched on.
    let buggy = |from: &Path, to: &Path| {
        equarx()
            .args(["rewrite", "--min-payload", "0"])
            .arg(from)
            .arg("-o")
            .arg(to)
            .env("EQUARX_TEST_INTERNAL_ERROR", "1")
            .env_remove("RUST_BACKTRACE")
            .output()
            .unwrap()
    };
    let o = buggy(&input, &out);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(70), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "want one line, got {stderr}");
    assert!(
        lines[0].starts_with("equarx: error: ")
            && lines[0].contains("psum_bf16_p8.pb")
            && lines[0].contains("internal error: EQUARX_TEST_INTERNAL_ERROR is set at src/")
            && lines[0].contains("a bug in equarx"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!out.exists(), "an output file was written");

    // A directory: every module is tried, each failure named, exit 70.
    let inputs = dir.join("in");
    std::fs::create_dir_all(&inputs).unwrap();
    for name in ["a.pb", "b.pb"] {
        std::fs::copy(&input, inputs.join(name)).unwrap();
    }
    let outputs = dir.join("out");
    let o = buggy(&inputs, &outputs);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(70),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    for name in ["a.pb", "b.pb"] {
        assert!(
            stdout.contains(&format!("{name}: error: ")) && !outputs.join(name).exists(),
            "{name}: {stdout}"
        );
    }
    assert!(
        stderr.contains("2 of 2 modules failed")
            && stderr.contains("internal error: in a.pb, b.pb"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
