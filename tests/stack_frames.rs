//! The stack-frame table (`HloModuleProto.stack_frame_index`) through
//! `equarx print`, equarx's parser and XLA's parser, judged on XLA's own
//! dumps: each holds the module as XLA had it in memory twice, as a proto
//! (`NAME.hlo.pb`) and as XLA printed it (`NAME.txt`).
//!
//! - equarx prints the table byte for byte as XLA printed it: every row, in
//!   the stored order, names C-escaped like XLA's (`tests/fixtures/frames`
//!   has a non-ASCII function name and a quote in an op name);
//! - equarx's parser reads XLA's text of the table into exactly the stored
//!   table, and reads its own text back into it;
//! - XLA's parser does not keep the table: it rebuilds it from the
//!   instructions, in text order, dropping rows no instruction reaches
//!   (function names included) — for its own text exactly as for ours. From
//!   equarx's text it keeps the same rows as from its own, and the same
//!   table field for field where both texts list the computations in the
//!   same order.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::normalize::{frame_chain, report};
use equarx::proto::{HloModuleProto, StackFrameIndexProto};
use equarx::text::{parse, print_module};
use prost::Message;
use serde_json::json;

/// One XLA dump: the name, the module as stored, XLA's text of it.
struct Dump {
    name: String,
    module: HloModuleProto,
    counts: equarx::DeviceCounts,
    xla_text: String,
}

fn dumps() -> Vec<Dump> {
    let mut v = Vec::new();
    for dir in ["dumps", "frames"] {
        let dir = common::fixtures_dir().join(dir);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .filter(|p| p.to_string_lossy().ends_with(".hlo.pb"))
            .collect();
        files.sort();
        for pb in files {
            let name = pb.file_name().unwrap().to_string_lossy().into_owned();
            let txt = PathBuf::from(pb.to_string_lossy().replace(".hlo.pb", ".txt"));
            let loaded = equarx::io::decode(&std::fs::read(&pb).expect("dump"), None)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let xla_text = std::fs::read_to_string(&txt)
                .unwrap_or_else(|e| panic!("{}: XLA's text of the dump: {e}", txt.display()));
            v.push(Dump {
                name,
                module: loaded.module,
                counts: loaded.counts,
                xla_text,
            });
        }
    }
    assert!(v.len() >= 5, "expected the XLA dumps, found {}", v.len());
    v
}

/// The `FileNames` … `StackFrames` rows of a module's text.
fn table_text(text: &str) -> &str {
    let Some(start) = text.find("\nFileNames\n").map(|k| k + 1) else {
        return "";
    };
    let frames = text[start..]
        .find("\nStackFrames\n")
        .map_or(text.len(), |k| start + k + 1);
    let end = text[frames..]
        .find("\n\n")
        .map_or(text.len(), |k| frames + k);
    &text[start..end]
}

/// `metadata={...}` of every instruction, by instruction name.
fn metadata_by_instruction(text: &str) -> Vec<(String, String)> {
    let mut v = Vec::new();
    for line in text.lines() {
        let line = line.trim_start().trim_start_matches("ROOT ");
        let (Some(name), Some(at)) = (line.split(' ').next(), line.find("metadata={")) else {
            continue;
        };
        // op names are quoted and may hold braces: scan to the closing one.
        let rest = &line[at..];
        let (mut depth, mut quoted, mut escaped, mut end) = (0i32, false, false, rest.len());
        for (k, c) in rest.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                '{' if !quoted => depth += 1,
                '}' if !quoted => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        v.push((name.to_string(), rest[..end].to_string()));
    }
    v.sort();
    v
}

fn first_difference(a: &str, b: &str) -> String {
    let k = a
        .lines()
        .zip(b.lines())
        .position(|(x, y)| x != y)
        .unwrap_or(a.lines().count().min(b.lines().count()));
    format!(
        "line {}:\n    equarx: {}\n    XLA:    {}",
        k + 1,
        a.lines().nth(k).unwrap_or("<end>"),
        b.lines().nth(k).unwrap_or("<end>")
    )
}

/// equarx prints the table (and the op metadata that points into it) byte
/// for byte as XLA printed the same module.
#[test]
fn equarx_prints_the_table_as_xla_does() {
    let mut failures = Vec::new();
    let mut rows = 0;
    for d in dumps() {
        let ours = print_module(&d.module, &d.counts)
            .unwrap_or_else(|e| panic!("{}: printing: {e}", d.name));
        let (a, b) = (table_text(&ours), table_text(&d.xla_text));
        assert!(!b.is_empty(), "{}: XLA's text has no table", d.name);
        if a != b {
            failures.push(format!(
                "{}: the table differs from XLA's, {}",
                d.name,
                first_difference(a, b)
            ));
        }
        rows += b.lines().count();
        let (ma, mb) = (
            metadata_by_instruction(&ours),
            metadata_by_instruction(&d.xla_text),
        );
        for (x, y) in ma.iter().zip(&mb) {
            if x != y {
                failures.push(format!(
                    "{}: metadata differs:\n    equarx: {} {}\n    XLA:    {} {}",
                    d.name, x.0, x.1, y.0, y.1
                ));
                break;
            }
        }
        if ma.len() != mb.len() {
            failures.push(format!(
                "{}: {} instructions with metadata, XLA prints {}",
                d.name,
                ma.len(),
                mb.len()
            ));
        }
    }
    report(failures);
    eprintln!("{rows} table lines as XLA prints them");
}

/// equarx's parser reads XLA's text of the table, and its own, into
/// exactly the stored table: every row, in order.
#[test]
fn equarx_parses_the_table_exactly() {
    let mut failures = Vec::new();
    for d in dumps() {
        let stored = d.module.stack_frame_index.clone().unwrap_or_default();
        let ours = print_module(&d.module, &d.counts).expect("printing");
        for (what, text) in [("XLA's text", &d.xla_text), ("equarx's text", &ours)] {
            let parsed = parse(text)
                .unwrap_or_else(|e| panic!("{}: {what} does not parse: {e}", d.name))
                .proto
                .stack_frame_index
                .unwrap_or_default();
            if parsed != stored {
                failures.push(format!(
                    "{}: the table parsed from {what} is not the stored one:\n    parsed {:?}\n    stored {:?}",
                    d.name,
                    rows(&parsed),
                    rows(&stored)
                ));
            }
        }
    }
    report(failures);
}

fn rows(t: &StackFrameIndexProto) -> [usize; 4] {
    [
        t.file_names.len(),
        t.function_names.len(),
        t.file_locations.len(),
        t.stack_frames.len(),
    ]
}

/// Every frame of a table by content: its chain of "file:line:col function".
fn frames_by_content(t: &StackFrameIndexProto) -> BTreeSet<Vec<String>> {
    (1..=t.stack_frames.len())
        .map(|id| frame_chain(Some(t), i32::try_from(id).expect("frame id")))
        .collect()
}

/// The frames instructions reach (their own and every parent), by content.
fn frames_reached(m: &HloModuleProto) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    for i in m.computations.iter().flat_map(|c| &c.instructions) {
        let id = i.metadata.as_ref().map_or(0, |md| md.stack_frame_id);
        if id != 0 {
            let chain = frame_chain(m.stack_frame_index.as_ref(), id);
            for k in 0..chain.len() {
                out.insert(chain[k..].to_vec());
            }
        }
    }
    out
}

fn function_names(t: &StackFrameIndexProto) -> BTreeSet<String> {
    t.function_names.iter().cloned().collect()
}

/// The computation names in the order a text lists them.
fn computation_order(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with('%') || l.starts_with("ENTRY %"))
        .filter_map(|l| l.trim_start_matches("ENTRY ").split(' ').next())
        .collect()
}

fn decode(path: &Path) -> HloModuleProto {
    HloModuleProto::decode(&*std::fs::read(path).expect("XLA's proto")).expect("decode")
}

/// What XLA's parser makes of the table, from its own text and from ours.
#[test]
fn xla_rebuilds_the_same_table_from_equarx_text_as_from_its_own() {
    let dir = common::scratch("stack_frames_xla_parse");
    let dumps = dumps();
    let mut jobs = Vec::new();
    for (k, d) in dumps.iter().enumerate() {
        let ours = print_module(&d.module, &d.counts).expect("printing");
        for (tag, text) in [("xla", &d.xla_text), ("equarx", &ours)] {
            let path = dir.join(format!("{k}.{tag}.txt"));
            std::fs::write(&path, text).expect("write text");
            jobs.push(json!({"kind": "text_to_proto", "text": path,
                             "out": dir.join(format!("{k}.{tag}.pb"))}));
        }
    }
    let results = common::run_xla(&dir, &jobs);
    let mut failures = Vec::new();
    let mut exact = 0;
    let mut dropped_functions = 0;
    for (k, d) in dumps.iter().enumerate() {
        for r in &results[2 * k..2 * k + 2] {
            assert_eq!(
                r["ok"], true,
                "{}: XLA cannot parse: {}",
                d.name, r["error"]
            );
        }
        let table = |tag: &str| {
            decode(&dir.join(format!("{k}.{tag}.pb")))
                .stack_frame_index
                .unwrap_or_default()
        };
        let (from_xla, from_ours) = (table("xla"), table("equarx"));
        let stored = d.module.stack_frame_index.clone().unwrap_or_default();

        // XLA keeps exactly the frames instructions reach, whichever text.
        let reached = frames_reached(&d.module);
        for (what, t) in [("its own text", &from_xla), ("equarx's text", &from_ours)] {
            let kept = frames_by_content(t);
            if kept != reached {
                failures.push(format!(
                    "{}: from {what} XLA keeps {} frames, instructions reach {}",
                    d.name,
                    kept.len(),
                    reached.len()
                ));
            }
        }
        if function_names(&from_ours) != function_names(&from_xla) {
            failures.push(format!(
                "{}: XLA keeps other function names from equarx's text: {:?} vs {:?}",
                d.name, from_ours.function_names, from_xla.function_names
            ));
        }
        dropped_functions += stored
            .function_names
            .len()
            .saturating_sub(from_xla.function_names.len());

        // It numbers them in text order: the same order, the same table.
        let ours = print_module(&d.module, &d.counts).expect("printing");
        if computation_order(&ours) == computation_order(&d.xla_text) {
            if from_ours != from_xla {
                failures.push(format!(
                    "{}: same order of computations, yet XLA builds another table from equarx's text",
                    d.name
                ));
            }
            exact += 1;
        }
    }
    report(failures);
    assert!(exact > 0, "no dump listed its computations in XLA's order");
    eprintln!(
        "{} dumps: XLA kept the same frames from equarx's text as from its own; \
         field for field in {exact} (same computation order); it dropped {dropped_functions} \
         function names no instruction reaches",
        dumps.len()
    );
}
