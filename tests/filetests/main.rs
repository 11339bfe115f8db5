//! The case files: `tests/cases/*.hlo`, each an HLO module under a header
//! that says what its tests need and expect (the grammar is in
//! `tests/cases/README.md`). Every test is a test of its own, named
//! `FILE` (the file's base test) or `FILE::VARIANT`:
//!
//! 1. the pass rewrites the module with the test's options (the JSON every
//!    door reads); the report must give the header's plan, or, for a
//!    negative twin, leave the module unchanged with the header's reason;
//! 2. the rewrite's canonical text must be its snapshot, which insta
//!    keeps (`snapshot.rs`; `cargo insta review` or `INSTA_UPDATE=always`
//!    accepts a change);
//! 3. real XLA parses that text back, and, when the check runs, compiles
//!    and runs the rewrite (and the reference) on the header's devices with
//!    seeded inputs of the header's data kinds (`checks.rs` says what is
//!    required of the outputs).
//!
//! XLA's work is batched per file and kept by content (`store.rs`), so a
//! test run alone by name (`cargo nextest run --test filetests
//! 'p8::two_shot'`) runs its file's batch, and a test whose job is
//! unchanged reads its answer instead of asking again.

#[path = "../common/mod.rs"]
mod common;

mod case;
mod checks;
mod header;
mod snapshot;
mod store;

use std::collections::BTreeSet;

use libtest_mimic::{Arguments, Failed, Trial};

use case::{CaseFile, test_name};
use common::inputs::Data;
use header::{Check, Expect};

fn main() {
    // insta's paths are relative to the workspace, which it would otherwise
    // ask `cargo metadata` for in every test's process.
    if std::env::var_os("INSTA_WORKSPACE_ROOT").is_none() {
        // SAFETY: no other thread runs yet.
        unsafe { std::env::set_var("INSTA_WORKSPACE_ROOT", common::repo()) };
    }
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    let mut files = Vec::new();
    for loaded in case::load_all() {
        match loaded {
            // `suite::` names the suite's own tests.
            Ok(f) if f.name == "suite" => trials.push(Trial::test("suite", || {
                Err(Failed::from("tests/cases/suite.hlo: the name is taken"))
            })),
            Ok(f) => files.push(std::sync::Arc::new(f)),
            // A file that does not read is a failing test of its name.
            Err((name, e)) => trials.push(Trial::test(name, move || Err(Failed::from(e)))),
        }
    }
    let all = std::sync::Arc::new(files);
    for (index, f) in all.iter().enumerate() {
        for (i, spec) in f.header.tests.iter().enumerate() {
            let files = all.clone();
            trials.push(Trial::test(test_name(&f.name, spec), move || {
                case::run(&files, index, &files[index].header.tests[i]).map_err(Failed::from)
            }));
        }
    }
    let a = all.clone();
    trials.push(Trial::test(
        "suite::every_snapshot_belongs_to_a_test",
        move || every_snapshot_belongs_to_a_test(&a).map_err(Failed::from),
    ));
    trials.push(Trial::test(
        "suite::the_header_refuses_what_it_does_not_know",
        || the_header_refuses_what_it_does_not_know().map_err(Failed::from),
    ));
    trials.push(Trial::test(
        "suite::the_simulator_is_compared_often",
        move || the_simulator_is_compared_often(&all).map_err(Failed::from),
    ));
    libtest_mimic::run(&args, trials).exit();
}

/// A snapshot no test writes (its case, variant or plan gone) is stale, and
/// so is a pending `.snap.new` of one, or any other file there;
/// `INSTA_UPDATE=always` removes them. This check needs no cargo-insta
/// (`cargo insta test --unreferenced=reject` is the same check through it).
/// A pending `.snap.new` of a live test is its own test's failure, and left
/// to `cargo insta review`.
fn every_snapshot_belongs_to_a_test(files: &[std::sync::Arc<CaseFile>]) -> Result<(), String> {
    let mut wanted = BTreeSet::new();
    for f in files {
        for t in &f.header.tests {
            if let Expect::Plan(plan) = &t.expect {
                wanted.insert(snapshot::snapshot_name(&f.name, t.variant.as_deref(), plan));
            }
        }
    }
    let mut stale = Vec::new();
    let Ok(entries) = std::fs::read_dir(snapshot::dir()) else {
        return Ok(());
    };
    for e in entries {
        let path = e.map_err(|e| e.to_string())?.path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let snapshot = name
            .strip_suffix(".snap")
            .or_else(|| name.strip_suffix(".snap.new"));
        if snapshot.is_some_and(|s| wanted.contains(s)) {
            continue;
        }
        if snapshot::accepting() {
            std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            eprintln!("removed stale snapshot {name}");
        } else {
            stale.push(name);
        }
    }
    if stale.is_empty() {
        Ok(())
    } else {
        stale.sort();
        Err(format!(
            "{} files in tests/cases/snapshots belong to no test \
             (`INSTA_UPDATE=always cargo nextest run --test filetests` removes them):\n{}",
            stale.len(),
            stale.join("\n")
        ))
    }
}

/// The psum tests compare the simulator with XLA on every single-operand
/// all-reduce, group and data kind but the poisoned: at least 20 such
/// comparisons must be in the suite.
fn the_simulator_is_compared_often(files: &[std::sync::Arc<CaseFile>]) -> Result<(), String> {
    let mut n = 0;
    for f in files {
        let Check::Psum(groups) = &f.header.check else {
            continue;
        };
        let m = equarx::text::parse(&f.text).map_err(|e| format!("{}: {e}", f.name))?;
        if common::inputs::parameters(&m.proto).len() != 1 {
            continue;
        }
        let data = f
            .header
            .data
            .iter()
            .filter(|&&d| d != Data::Poisoned)
            .count();
        let positives = f
            .header
            .tests
            .iter()
            .filter(|t| matches!(t.expect, Expect::Plan(_)))
            .count();
        n += positives * data * groups.len();
    }
    if n >= 20 {
        Ok(())
    } else {
        Err(format!("too few simulator comparisons: {n}"))
    }
}

/// A header that does not say exactly what it means is an error, never a
/// looser test: a typo in a key, a key twice, a check without data, a goal
/// on data that is not drawn.
fn the_header_refuses_what_it_does_not_know() -> Result<(), String> {
    let good = "// check: psum {{0,1}}\n// devices: replicas=1 partitions=2\n\
                // data: gaussian\n// plan: ring/loop\n";
    header::parse(good).map_err(|e| format!("the good header: {e}"))?;
    let cases: &[(&str, &str)] = &[
        ("// chek: psum {{0,1}}\n", "unknown key \"chek\""),
        ("// goals: gaussian 0.1\n", "unknown key \"goals\""),
        ("// data: gaussian\n", "data is given twice"),
        (
            "// goal: outliers 0.01\n",
            "the goal's data outliers is not in `data:`",
        ),
        (
            "// variant a: {} -> ring\n// variant a: {} -> ring\n",
            "variant a is given twice",
        ),
        ("// variant b: {\"block_size\": } -> ring\n", "options JSON"),
        ("// variant c: {} ring\n", "variant NAME: {OPTIONS} -> PLAN"),
        ("// baseline: maybe\n", "baseline is `yes` or `no: WHY`"),
        ("// door: ffi\n", "door is `library` or `cli`"),
    ];
    for (extra, want) in cases {
        match header::parse(&format!("{good}{extra}")) {
            Ok(_) => return Err(format!("accepted {extra:?}")),
            Err(e) if e.contains(want) => {}
            Err(e) => return Err(format!("{extra:?}: {e:?} does not say {want:?}")),
        }
    }
    let bare = "// devices: replicas=1 partitions=2\n// plan: ring/loop\n";
    match header::parse(bare) {
        Err(e) if e.contains("no `check:`") => {}
        other => return Err(format!("a positive test without a check: {other:?}")),
    }
    let dataless = "// check: psum {{0,1}}\n// devices: replicas=1 partitions=2\n// plan: ring\n";
    match header::parse(dataless) {
        Err(e) if e.contains("needs `data:`") => {}
        other => return Err(format!("a run without data: {other:?}")),
    }
    Ok(())
}
