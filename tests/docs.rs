//! The docs say only what is there and show only what the suite runs:
//! README.md and docs/*.md.
//!
//! - Every repository path they name, in backticks or as a markdown link,
//!   exists.
//! - Every fenced code block follows one of these markers (the line before
//!   it):
//!   - `<!-- run by: tests/X.rs::test_fn -->` (one or more tests, and
//!     `from FILE` where a test runs the block from another file). Each test
//!     function exists, and either a named test file names the marker's test
//!     (it reads the block from the doc with `common::doc_block`, so they
//!     cannot drift), or every line of the block but `...` is in the named
//!     files, in order (a C program the test compiles holds the snippet).
//!   - `<!-- not run: excerpt of PATH -->`, for output shown: every line of
//!     the block but `...` is in PATH, in order (a trailing `// comment`
//!     aside).
//!   - `<!-- not run: sketch -->`, for a ```text drawing that is no command
//!     and no output.

mod common;

use std::path::Path;

use common::{repo, run_by};

/// README.md and every docs/*.md, as (repository path, text).
fn docs() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_string()];
    let mut more: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    more.sort();
    names.extend(more);
    names
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(repo().join(&n)).unwrap();
            (n, text)
        })
        .collect()
}

/// The top-level names of the repository as git would track them: a
/// backticked word is taken for a repository path only when it starts at
/// one of these (`core/src/io.rs`, `README.md`), so a path inside an
/// installed wheel or a plugin (`equarx/libequarx.so`) is not.
fn top_level() -> Vec<String> {
    std::fs::read_dir(repo())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "target" && n != ".git")
        .collect()
}

/// A path as written, without a line range (`:21-35`), an anchor, or a
/// trailing slash; `None` when it is not meant as a repository path.
fn clean(raw: &str) -> Option<&str> {
    let p = raw.split('#').next()?;
    let p = p.split(':').next()?;
    let p = p.trim_end_matches('/');
    let odd = |c: char| c.is_whitespace() || "<>$*{}|=\"'()".contains(c);
    (!p.is_empty() && !p.contains(odd)).then_some(p)
}

/// The paths a doc names: backticked words (relative to the repository)
/// and markdown link targets (relative to the doc).
fn named_paths(doc: &str, text: &str, top: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        for (i, piece) in line.split('`').enumerate() {
            if i % 2 == 1
                && let Some(p) = clean(piece)
                && top
                    .iter()
                    .any(|t| p == t || p.starts_with(&format!("{t}/")))
            {
                out.push(p.to_string());
            }
        }
        for target in line.split("](").skip(1) {
            let target = target.split(')').next().unwrap_or("");
            if target.contains("://") || target.starts_with('#') || target.starts_with("mailto:") {
                continue;
            }
            if let Some(p) = clean(target) {
                let base = Path::new(doc).parent().unwrap_or(Path::new(""));
                out.push(normalize(&base.join(p)));
            }
        }
    }
    out
}

/// `docs/../BENCHMARKS.md` → `BENCHMARKS.md`.
fn normalize(p: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in p.components() {
        match c.as_os_str().to_string_lossy().as_ref() {
            ".." => {
                parts.pop();
            }
            "." => {}
            s => parts.push(s.to_string()),
        }
    }
    parts.join("/")
}

#[test]
fn every_path_the_docs_name_exists() {
    let top = top_level();
    let mut missing = Vec::new();
    let mut checked = 0;
    for (doc, text) in docs() {
        for p in named_paths(&doc, &text, &top) {
            checked += 1;
            if !repo().join(&p).exists() {
                missing.push(format!("{doc}: `{p}` does not exist"));
            }
        }
    }
    println!("{checked} paths named, all there");
    assert!(checked > 50, "the path finder found only {checked} paths");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn the_readme_links_every_doc() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    for (doc, _) in docs().into_iter().skip(1) {
        assert!(
            readme.contains(&format!("]({doc})")),
            "README.md links no [..]({doc})"
        );
    }
}

/// A fenced block: the marker line before it, its language, its lines.
struct Block<'a> {
    line: usize,
    marker: &'a str,
    lang: &'a str,
    body: Vec<&'a str>,
}

fn blocks(text: &str) -> Vec<Block<'_>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(lang) = lines[i].strip_prefix("```") {
            let marker = lines[..i]
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty())
                .copied()
                .unwrap_or("");
            let end = (i + 1..lines.len())
                .find(|&j| lines[j].starts_with("```"))
                .unwrap_or(lines.len());
            out.push(Block {
                line: i + 1,
                marker,
                lang: lang.trim(),
                body: lines[i + 1..end].to_vec(),
            });
            i = end + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// Every non-empty line of `want` (trimmed) is in `have`, in order.
fn lines_in_order<'a>(want: impl IntoIterator<Item = &'a str>, have: &str) -> Result<(), String> {
    let mut rest = have;
    for w in want.into_iter().map(str::trim).filter(|w| !w.is_empty()) {
        match rest.find(w) {
            Some(at) => rest = &rest[at + w.len()..],
            None => return Err(format!("{w:?} is not there (after the lines before it)")),
        }
    }
    Ok(())
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(repo().join(path)).map_err(|e| format!("cannot read {path}: {e}"))
}

/// Checks one block against its marker.
fn judge(doc: &str, b: &Block) -> Result<(), String> {
    if let Some((tests, from)) = run_by(b.marker) {
        if tests.is_empty() {
            return Err("the marker names no test".into());
        }
        let mut sources = String::new();
        let mut read_by_marker = false;
        for t in &tests {
            let (file, function) = t
                .split_once("::")
                .ok_or_else(|| format!("{t}: want tests/FILE.rs::function"))?;
            let src = read(file)?;
            if !src.contains(&format!("fn {function}(")) {
                return Err(format!("{file} has no fn {function}"));
            }
            read_by_marker |= src.contains(&format!("\"{t}\""));
            sources.push_str(&src);
        }
        for f in &from {
            sources.push_str(&read(f)?);
        }
        if read_by_marker {
            return Ok(());
        }
        return lines_in_order(
            b.body.iter().copied().filter(|l| l.trim() != "..."),
            &sources,
        )
        .map_err(|e| {
            format!(
                "no named test reads the block from {doc} by its marker, and {e} in the named files"
            )
        });
    }
    let note = b
        .marker
        .trim()
        .strip_prefix("<!-- not run:")
        .and_then(|m| m.strip_suffix("-->"))
        .map(str::trim)
        .ok_or_else(|| {
            "no marker before it: `<!-- run by: tests/X.rs::test_fn -->`, or for output \
             `<!-- not run: excerpt of PATH -->`, or `<!-- not run: sketch -->`"
                .to_string()
        })?;
    if note == "sketch" {
        return if b.lang == "text" {
            Ok(())
        } else {
            Err(format!("a sketch is a ```text block, not ```{}", b.lang))
        };
    }
    let path = note
        .strip_prefix("excerpt of ")
        .ok_or_else(|| format!("`not run: {note}`: want `excerpt of PATH` or `sketch`"))?;
    let have = read(path)?;
    let want = b
        .body
        .iter()
        .map(|l| l.split("  //").next().unwrap_or(""))
        .filter(|l| l.trim() != "...");
    lines_in_order(want, &have).map_err(|e| format!("{e} in {path}"))
}

#[test]
fn every_code_block_is_run_by_a_test_or_is_an_excerpt() {
    let mut wrong = Vec::new();
    let mut count = 0;
    for (doc, text) in docs() {
        for b in blocks(&text) {
            count += 1;
            if let Err(e) = judge(&doc, &b) {
                wrong.push(format!("{doc}:{}: {e}", b.line));
            }
        }
    }
    println!("{count} code blocks, each run by a test or checked as an excerpt");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
