//! The rewrites' snapshots, kept by [insta](https://insta.rs):
//! `tests/cases/snapshots/FILE[.VARIANT].PLAN.snap`, the canonical text of a
//! test's rewrite ([`equarx::Rewritten::canonical_text`]: instructions
//! renamed `base.N` in print order, so id shifts do not churn diffs) under a
//! name that says the plan. Each file is a short YAML header (the test, its
//! case file) and then the HLO text verbatim. A constant whose literal is
//! long (the Hadamard matrix) is stored as its shape, element count and
//! hash; XLA's parser reads the full text in the file's batch.
//!
//! insta compares, prints the diff and writes: locally a changed or new
//! rewrite leaves `FILE...snap.new` for `cargo insta review`;
//! `INSTA_UPDATE=always` writes the `.snap` in place; on CI (`CI` set)
//! nothing is written (docs/snapshots.md).

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::common;

pub fn dir() -> PathBuf {
    common::repo().join("tests/cases/snapshots")
}

/// Whether this run accepts every rewrite as its snapshot
/// (`INSTA_UPDATE=always`, insta's switch): then snapshots that belong to
/// no test are removed too.
pub fn accepting() -> bool {
    std::env::var_os("INSTA_UPDATE").is_some_and(|v| v == "always")
}

/// The plan as a file-name part: `ring+hadamard/loop` →
/// `ring+hadamard-loop`, `two-level 2x4/loop` → `two-level-2x4-loop`, op
/// plans joined by `,`.
pub fn slug(plan: &str) -> String {
    plan.replace(", ", ",").replace(['/', ' '], "-")
}

/// The snapshot's insta name: `FILE.PLAN` for a file's base test,
/// `FILE.VARIANT.PLAN` for a variant; its file is the name with `.snap`.
pub fn snapshot_name(file: &str, variant: Option<&str>, plan: &str) -> String {
    match variant {
        None => format!("{file}.{}", slug(plan)),
        Some(v) => format!("{file}.{v}.{}", slug(plan)),
    }
}

/// Literals longer than this are summarized in the stored text.
const LONG_LITERAL: usize = 400;

/// `text` with every long constant literal replaced by a summary.
pub fn summarized(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        out.push_str(&summarize_line(line));
    }
    out
}

fn summarize_line(line: &str) -> String {
    let Some(at) = line.find(" constant(") else {
        return line.to_string();
    };
    let start = at + " constant(".len();
    let mut depth = 1;
    let mut end = None;
    for (i, c) in line[start..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    end = Some(start + i);
                    break;
                }
            }
            _ => {}
        }
    }
    let Some(end) = end else {
        return line.to_string();
    };
    let literal = &line[start..end];
    if literal.len() <= LONG_LITERAL {
        return line.to_string();
    }
    let elements = literal
        .split(|c: char| c == ',' || c == '{' || c == '}' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .count();
    let hash: String = Sha256::digest(literal.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        "{}/* {elements} elements, {} characters, sha256 {hash}… */{}",
        &line[..start],
        literal.len(),
        &line[end..]
    )
}

/// Compares the test's rewrite with its snapshot through insta, which
/// prints the diff and, as `INSTA_UPDATE` says, writes the `.snap.new` or
/// the `.snap`. A mismatch is this test's failure (insta's panic, caught),
/// so the test's other checks still run.
pub fn check(
    name: &str,
    file: &str,
    variant: Option<&str>,
    plan: &str,
    canonical: &str,
) -> Result<(), String> {
    let snapshot = snapshot_name(file, variant, plan);
    let rel = format!("tests/cases/snapshots/{snapshot}.snap");
    let existed = dir().join(format!("{snapshot}.snap")).exists();
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(dir());
    settings.set_prepend_module_to_snapshot(false);
    settings.set_input_file(common::repo().join(format!("tests/cases/{file}.hlo")));
    settings.set_description(format!(
        "{name}: tests/cases/{file}.hlo rewritten, plan {plan}"
    ));
    settings.set_omit_expression(true);
    let stored = summarized(canonical);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        settings.bind(|| insta::assert_snapshot!(snapshot.as_str(), stored));
    }));
    if outcome.is_ok() {
        return Ok(());
    }
    let what = if existed {
        format!("the rewrite differs from its snapshot {rel} (insta's diff is above)")
    } else {
        format!("no snapshot {rel} yet")
    };
    Err(format!(
        "{name}: {what}; review it with `cargo insta review`, or accept every \
         rewrite with `INSTA_UPDATE=always cargo nextest run --test filetests`"
    ))
}
