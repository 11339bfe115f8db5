//! Blessed rewrites: `tests/cases/snapshots/FILE[.VARIANT].PLAN.hlo`, the
//! canonical text of a test's rewrite (instructions renamed `base.N` in
//! print order, so id shifts do not churn diffs), under a name that says
//! the plan. `EQUARX_BLESS=1` writes them; otherwise a difference fails the
//! test with a diff. A constant whose literal is long (the Hadamard matrix)
//! is stored as its shape, element count and hash; XLA's parser reads the
//! full text in the file's batch.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::common;

pub fn dir() -> PathBuf {
    common::repo().join("tests/cases/snapshots")
}

pub fn blessing() -> bool {
    std::env::var_os("EQUARX_BLESS").is_some_and(|v| v == "1")
}

/// The plan as a file-name part: `ring+hadamard/loop` →
/// `ring+hadamard-loop`, `two-level 2x4/loop` → `two-level-2x4-loop`, op
/// plans joined by `,`.
pub fn slug(plan: &str) -> String {
    plan.replace(", ", ",").replace(['/', ' '], "-")
}

/// The snapshot's file name: `FILE.PLAN.hlo` for a file's base test,
/// `FILE.VARIANT.PLAN.hlo` for a variant.
pub fn file_name(file: &str, variant: Option<&str>, plan: &str) -> String {
    match variant {
        None => format!("{file}.{}.hlo", slug(plan)),
        Some(v) => format!("{file}.{v}.{}.hlo", slug(plan)),
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

/// The stored form of test `name`'s rewrite of `source`.
pub fn stored_form(name: &str, source: &str, plan: &str, canonical: &str) -> String {
    format!(
        "// {name}: tests/cases/{source} rewritten, plan {plan}.\n\
         // Canonical text; written by EQUARX_BLESS=1 (tests/cases/README.md).\n\n{}",
        summarized(canonical)
    )
}

/// Compares the test's rewrite with its blessed snapshot, or blesses it.
pub fn check(
    name: &str,
    file: &str,
    variant: Option<&str>,
    plan: &str,
    canonical: &str,
) -> Result<(), String> {
    let path = dir().join(file_name(file, variant, plan));
    let want = stored_form(name, &format!("{file}.hlo"), plan, canonical);
    let have = std::fs::read_to_string(&path).ok();
    if have.as_deref() == Some(want.as_str()) {
        return Ok(());
    }
    if blessing() {
        std::fs::create_dir_all(dir()).map_err(|e| e.to_string())?;
        std::fs::write(&path, &want).map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("{name}: blessed {}", path.display());
        return Ok(());
    }
    let rel = path
        .strip_prefix(common::repo())
        .unwrap_or(&path)
        .display()
        .to_string();
    match have {
        None => Err(format!(
            "{name}: no snapshot {rel}; review the rewrite, then EQUARX_BLESS=1 writes it"
        )),
        Some(have) => {
            let diff = similar::TextDiff::from_lines(&have, &want);
            let text = diff
                .unified_diff()
                .context_radius(3)
                .header(&format!("{rel} (blessed)"), &format!("{name} (now)"))
                .to_string();
            let lines: Vec<&str> = text.lines().collect();
            let shown = lines.len().min(400);
            Err(format!(
                "{name}: the rewrite differs from its snapshot {rel} \
                 (EQUARX_BLESS=1 accepts it):\n{}{}",
                lines[..shown].join("\n"),
                if shown < lines.len() {
                    format!("\n... {} more diff lines", lines.len() - shown)
                } else {
                    String::new()
                }
            ))
        }
    }
}
