//! The HLO text parser (`equarx::text::parse`), judged by real XLA.
//!
//! - XLA's parser and ours read the same text (every fixture's XLA text,
//!   the dumps, and the hand-written corpus `tests/text/*.hlo`) into the
//!   same module;
//! - our printer's text reads back in XLA as the module it was printed from
//!   (this is what proves printer bugs);
//! - print → parse → print is a fixpoint, and parse(print(proto)) is the
//!   proto;
//! - malformed text gives line/column errors, never a panic.
//!
//! Modules are compared structurally by `common::normalize`: ids become
//! names, and the few differences that carry no information are normalized
//! explicitly.

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use common::normalize::{Frames, assert_ordered, diff, diff_failure, report};
use equarx::DeviceCounts;
use equarx::proto::HloModuleProto;
use equarx::text::{ParseError, parse, print_module};
use prost::Message;
use serde_json::json;

// ---------------------------------------------------------------------------
// Inputs

/// XLA's text of every fixture (`NAME.txt`) and the dumps' text.
fn xla_texts() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for dir in [
        common::fixtures_dir(),
        common::fixtures_dir().join("dumps"),
        common::fixtures_dir().join("frames"),
    ] {
        for e in std::fs::read_dir(&dir).expect("fixtures dir") {
            let p = e.expect("dir entry").path();
            if p.extension().is_some_and(|x| x == "txt") {
                v.push(p);
            }
        }
    }
    v.sort();
    assert!(
        v.len() >= 18,
        "expected the fixture texts, found {}",
        v.len()
    );
    v
}

/// The hand-written corpus: every attribute the printer prints.
fn corpus() -> Vec<PathBuf> {
    let dir = common::repo().join("tests/text");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/text")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "hlo"))
        .collect();
    v.sort();
    assert!(
        v.len() >= 4,
        "expected the corpus in tests/text, found {}",
        v.len()
    );
    v
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn parse_ok(text: &str, what: &str) -> equarx::text::ParsedText {
    parse(text).unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn decode_module(path: &Path) -> HloModuleProto {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    HloModuleProto::decode(&*bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// Against XLA

/// Our parse of XLA's text (and of the corpus) is XLA's parse of it.
#[test]
fn equarx_reads_text_like_xla() {
    let t0 = Instant::now();
    let dir = common::scratch("text_parse_reads_like_xla");
    let inputs: Vec<PathBuf> = xla_texts().into_iter().chain(corpus()).collect();
    let jobs: Vec<_> = inputs
        .iter()
        .enumerate()
        .map(|(k, p)| json!({"kind": "text_to_proto", "text": p, "out": dir.join(format!("{k}.pb"))}))
        .collect();
    let results = common::run_xla(&dir, &jobs);
    let mut failures = Vec::new();
    for (k, (path, result)) in inputs.iter().zip(&results).enumerate() {
        let what = name_of(path);
        if result["ok"] != true {
            failures.push(format!("{what}: XLA cannot parse it: {}", result["error"]));
            continue;
        }
        let xla = decode_module(&dir.join(format!("{k}.pb")));
        let ours = match parse(&read(path)) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{what}: {e}"));
                continue;
            }
        };
        assert_ordered(&ours.proto, &what);
        failures.extend(diff_failure(
            &what,
            diff(&ours.proto, &xla, Frames::ByContent),
        ));
    }
    report(failures);
    eprintln!(
        "compared {} texts with XLA in {:.1?}",
        inputs.len(),
        t0.elapsed()
    );
}

/// Every module the printer is tested on: the fixture protos (top level and
/// dumps) and our parse of the corpus, with their device counts.
fn printable_modules() -> Vec<(String, HloModuleProto, DeviceCounts)> {
    let mut v = Vec::new();
    for p in common::fixture_protos() {
        let bytes = std::fs::read(&p).expect("fixture");
        let loaded =
            equarx::io::decode(&bytes, None).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        v.push((name_of(&p), loaded.module, loaded.counts));
    }
    for p in corpus() {
        let parsed = parse_ok(&read(&p), &name_of(&p));
        v.push((name_of(&p), parsed.proto, parsed.counts));
    }
    v
}

/// Our printer's text reads back in XLA as the module it was printed from.
#[test]
fn xla_reads_equarx_text_back() {
    let t0 = Instant::now();
    let dir = common::scratch("text_parse_printer_to_xla");
    let modules = printable_modules();
    let mut jobs = Vec::new();
    for (k, (name, proto, counts)) in modules.iter().enumerate() {
        let text = print_module(proto, counts).unwrap_or_else(|e| panic!("{name}: printing: {e}"));
        let path = dir.join(format!("{k}.txt"));
        std::fs::write(&path, text).expect("write text");
        jobs.push(
            json!({"kind": "text_to_proto", "text": path, "out": dir.join(format!("{k}.pb"))}),
        );
    }
    let results = common::run_xla(&dir, &jobs);
    let mut failures = Vec::new();
    for (k, ((name, proto, _), result)) in modules.iter().zip(&results).enumerate() {
        if result["ok"] != true {
            failures.push(format!(
                "{name}: XLA cannot parse our text ({}): {}",
                dir.join(format!("{k}.txt")).display(),
                result["error"]
            ));
            continue;
        }
        let xla = decode_module(&dir.join(format!("{k}.pb")));
        failures.extend(diff_failure(name, diff(&xla, proto, Frames::ByContent)));
    }
    report(failures);
    eprintln!(
        "XLA read back {} printed modules in {:.1?}",
        modules.len(),
        t0.elapsed()
    );
}

// ---------------------------------------------------------------------------
// Round trips without XLA

/// print → parse → print gives the same text, and parse(print(proto)) is
/// the proto (ids aside).
#[test]
fn print_parse_print_is_a_fixpoint() {
    let mut failures = Vec::new();
    for (name, proto, counts) in printable_modules() {
        let text =
            print_module(&proto, &counts).unwrap_or_else(|e| panic!("{name}: printing: {e}"));
        let parsed = match parse(&text) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{name}: our printer's text does not parse: {e}"));
                continue;
            }
        };
        assert_ordered(&parsed.proto, &name);
        // The printer leaves out counts of 1 (XLA's default), as XLA does.
        let printed = |c: Option<i64>| c.filter(|&n| n != 1);
        assert_eq!(
            (
                printed(parsed.counts.replica_count),
                printed(parsed.counts.num_partitions)
            ),
            (
                printed(counts.replica_count),
                printed(counts.num_partitions)
            ),
            "{name}: device counts"
        );
        let again =
            print_module(&parsed.proto, &parsed.counts).expect("printing the parsed module");
        if again != text {
            let line = text
                .lines()
                .zip(again.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            failures.push(format!(
                "{name}: print(parse(text)) differs from text at line {}:\n  {}\n  {}",
                line + 1,
                text.lines().nth(line).unwrap_or(""),
                again.lines().nth(line).unwrap_or("")
            ));
        }
        failures.extend(diff_failure(
            &format!("{name} (parse(print(proto)) vs proto)"),
            diff(&parsed.proto, &proto, Frames::Exact),
        ));
    }
    report(failures);
}

// ---------------------------------------------------------------------------
// Errors

/// A small valid module; the table below breaks it in one place each.
const GOOD: &str = "HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %r = f32[8]{0} all-reduce(%p), replica_groups={{0,1}}, to_apply=%add
  ROOT %n = f32[8]{0} negate(%r), metadata={op_name=\"n\"}
}
";

#[test]
fn good_module_parses() {
    let p = parse_ok(GOOD, "GOOD");
    assert_eq!(p.proto.computations.len(), 2);
    assert_eq!(p.proto.entry_computation_name, "main");
    let one = DeviceCounts {
        replica_count: Some(1),
        num_partitions: Some(1),
    };
    assert_eq!(p.counts, one, "no counts in the header: one of each");
}

/// Broken inputs: each gives an error at the expected line and column, with
/// the expected words in its message.
#[test]
fn malformed_text_reports_line_and_column() {
    let deep = format!(
        "%p = {}f32[8]{}{{0}} parameter(0)",
        "(".repeat(100),
        ")".repeat(100)
    );
    let stack_tables =
        "HloModule m\n\nFileNames\n1 \"a\"\n\nFunctionNames\n\nFileLocations\n2 {file_name_id=1}\n";
    let cases: Vec<(&str, String, usize, usize, &str)> = vec![
        (
            "misspelled header",
            GOOD.replace("HloModule m", "Hlomodule m"),
            1,
            1,
            "expected 'HloModule' at the start of the module, found 'Hlomodule'",
        ),
        (
            "missing comma",
            GOOD.replace("negate(%r)", "negate(%r %r)"),
            12,
            33,
            "expected ')' after the operands, found '%r'",
        ),
        (
            "trailing comma",
            GOOD.replace("negate(%r)", "negate(%r,)"),
            12,
            33,
            "expected an operand name, found ')'",
        ),
        (
            "undefined operand",
            GOOD.replace("negate(%r)", "negate(%q)"),
            12,
            30,
            "undefined instruction 'q'",
        ),
        (
            "duplicate instruction",
            GOOD.replace("%r = f32[8]{0} all-reduce", "%p = f32[8]{0} all-reduce"),
            11,
            3,
            "instruction 'p' is already defined",
        ),
        (
            "unknown attribute",
            GOOD.replace("to_apply=%add", "to_apply=%add, frobnicate=1"),
            11,
            73,
            "unknown attribute 'frobnicate'",
        ),
        (
            "unterminated string",
            GOOD.replace("op_name=\"n\"}", "op_name=\"n}\n}\n"),
            12,
            53,
            "unterminated string",
        ),
        (
            "unterminated comment",
            GOOD.replace("negate(%r)", "negate(/*%r)"),
            12,
            30,
            "unterminated comment",
        ),
        (
            "huge dimension",
            GOOD.replace(
                "f32[8]{0} parameter",
                "f32[99999999999999999999]{0} parameter",
            ),
            10,
            12,
            "integer 99999999999999999999 is out of range",
        ),
        (
            "deep nesting",
            GOOD.replace("%p = f32[8]{0} parameter(0)", &deep),
            10,
            72,
            "nesting deeper than 64 levels",
        ),
        (
            "unknown type",
            GOOD.replace("%p = f32[8]{0}", "%p = f33[8]{0}"),
            10,
            8,
            "unknown element type 'f33'",
        ),
        (
            "layout rank",
            GOOD.replace("%p = f32[8]{0}", "%p = f32[8]{1,0}"),
            10,
            14,
            "layout lists 2 dimensions, but the shape has 1",
        ),
        (
            "short constant",
            GOOD.replace(
                "%p = f32[8]{0} parameter(0)",
                "%p = f32[8]{0} constant({1, 2, 3})",
            ),
            10,
            35,
            "expected 8 entries in dimension 0, found 3",
        ),
        (
            "abbreviated constant",
            GOOD.replace(
                "%p = f32[8]{0} parameter(0)",
                "%p = f32[8]{0} constant({...})",
            ),
            10,
            28,
            "print_large_constants",
        ),
        (
            "constant range",
            GOOD.replace(
                "%p = f32[8]{0} parameter(0)",
                "%c = s8[] constant(200)\n  %p = f32[8]{0} parameter(0)",
            ),
            10,
            22,
            "200 is out of range for s8",
        ),
        (
            "undefined computation",
            GOOD.replace("to_apply=%add", "to_apply=%nowhere"),
            11,
            67,
            "undefined computation 'nowhere'",
        ),
        (
            "recursion",
            GOOD.replace(
                "ROOT %s = f32[] add(%a, %b)",
                "ROOT %s = f32[] call(%a, %b), to_apply=%add",
            ),
            6,
            42,
            "computation 'add' calls itself",
        ),
        (
            "two roots",
            GOOD.replace(
                "%r = f32[8]{0} all-reduce",
                "ROOT %r = f32[8]{0} all-reduce",
            ),
            12,
            3,
            "more than one ROOT",
        ),
        (
            "duplicate attribute",
            GOOD.replace("to_apply=%add", "to_apply=%add, to_apply=%add"),
            11,
            73,
            "duplicate attribute 'to_apply'",
        ),
        (
            "parameter gap",
            GOOD.replace("%b = f32[] parameter(1)", "%b = f32[] parameter(2)"),
            5,
            3,
            "found parameter(2)",
        ),
        (
            "stray character",
            GOOD.replace("negate(%r)", "negate($r)"),
            12,
            30,
            "unexpected character '$'",
        ),
        (
            "async sugar",
            GOOD.replace("negate(%r)", "fusion-start(%r)"),
            12,
            23,
            "async syntax sugar",
        ),
        (
            "no computation",
            "HloModule m\n".to_string(),
            2,
            1,
            "expected a computation, found end of input",
        ),
        (
            "result shape",
            GOOD.replace("-> f32[8] {", "-> f32[9] {"),
            9,
            28,
            "declares result f32[9], but its root 'n' is f32[8]",
        ),
        (
            "iota groups",
            GOOD.replace("replica_groups={{0,1}}", "replica_groups=[2,4]<=[4]"),
            11,
            49,
            "do not match",
        ),
        (
            "duplicate computation",
            GOOD.replace("ENTRY %main", "ENTRY %add"),
            9,
            7,
            "computation 'add' is already defined",
        ),
        (
            "stack table row",
            GOOD.replace("HloModule m\n", stack_tables),
            9,
            1,
            "expected row number 1, found 2",
        ),
        (
            "unknown module attribute",
            GOOD.replace("HloModule m", "HloModule m, replica_cnt=2"),
            1,
            14,
            "unknown module attribute 'replica_cnt'",
        ),
    ];
    assert!(cases.len() >= 10);
    let mut failures = Vec::new();
    for (name, text, line, column, words) in cases {
        match parse(&text) {
            Ok(_) => failures.push(format!("{name}: parsed without an error")),
            Err(ParseError {
                line: l,
                column: c,
                message,
            }) => {
                if (l, c) != (line, column) || !message.contains(words) {
                    failures.push(format!(
                        "{name}: got line {l}, column {c}: {message}\n  want line {line}, column {column}: ...{words}..."
                    ));
                }
            }
        }
    }
    report(failures);
    // The Display form names the place first.
    let e = parse(&GOOD.replace("negate(%r)", "negate(%r %r)")).expect_err("broken");
    assert_eq!(
        e.to_string(),
        "line 12, column 33: expected ')' after the operands, found '%r'"
    );
}

// ---------------------------------------------------------------------------
// Header counts, unknown opcodes, robustness

/// `replica_count` / `num_partitions` in the header feed `ParsedText::counts`;
/// absent means unknown, not 1.
#[test]
fn header_counts_feed_parsed_counts() {
    let with = GOOD.replace(
        "HloModule m",
        "HloModule m, replica_count=2, num_partitions=4",
    );
    let p = parse_ok(&with, "counts");
    assert_eq!(
        p.counts,
        DeviceCounts {
            replica_count: Some(2),
            num_partitions: Some(4)
        }
    );
    // A header without counts means one replica and one partition, as in XLA.
    let one = DeviceCounts {
        replica_count: Some(1),
        num_partitions: Some(1),
    };
    assert_eq!(parse_ok(GOOD, "no counts").counts, one);
    // The dumps print the module config: num_partitions=8, replicas left at 1.
    for t in xla_texts()
        .iter()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("dumps")))
    {
        let p = parse_ok(&read(t), &name_of(t));
        assert_eq!(
            p.counts,
            DeviceCounts {
                replica_count: Some(1),
                num_partitions: Some(8)
            },
            "{}",
            name_of(t)
        );
    }
    // Text input through equarx's format detection takes the same path.
    let loaded = equarx::io::decode(with.as_bytes(), None).expect("io::decode of HLO text");
    assert_eq!(
        loaded.counts,
        DeviceCounts {
            replica_count: Some(2),
            num_partitions: Some(4)
        }
    );
    assert_eq!(loaded.module.entry_computation_name, "main");
}

/// An opcode equarx does not know is kept as written, with its operands and
/// the attributes equarx knows; ids follow XLA's scheme.
#[test]
fn unknown_opcodes_parse_generically() {
    let text = GOOD.replace(
        "ROOT %n = f32[8]{0} negate(%r)",
        "%x = f32[8]{0} brand-new-op(%r, %p), dimensions={0}, to_apply=%add\n  ROOT %n = f32[8]{0} negate(%x)",
    );
    let p = parse_ok(&text, "unknown opcode");
    let main = p
        .proto
        .computations
        .iter()
        .find(|c| c.name == "main")
        .expect("main");
    let x = main.instructions.iter().find(|i| i.name == "x").expect("x");
    assert_eq!(x.opcode, "brand-new-op");
    assert_eq!(x.dimensions, vec![0]);
    assert_eq!(x.operand_ids.len(), 2);
    let add = p
        .proto
        .computations
        .iter()
        .find(|c| c.name == "add")
        .expect("add");
    assert_eq!(x.called_computation_ids, vec![add.id]);
    // Computation ids 1.. in text order, instruction ids (computation << 32) | 1..
    assert_eq!((add.id, main.id), (1, 2));
    let ids: Vec<i64> = main.instructions.iter().map(|i| i.id).collect();
    assert_eq!(ids, (1..=4).map(|k| (2 << 32) | k).collect::<Vec<i64>>());
    assert_eq!(main.root_id, (2 << 32) | 4);
    assert_eq!(p.proto.entry_computation_id, 2);
    // An attribute nobody knows is still an error, naming it.
    let bad = text.replace("dimensions={0}", "dimensions={0}, flavour=3");
    let e = parse(&bad).expect_err("unknown attribute");
    assert!(e.message.contains("unknown attribute 'flavour'"), "{e}");
}

/// Truncated and mutated inputs give errors with a place inside the text,
/// never a panic; pathological nesting and sizes are bounded.
#[test]
fn malformed_input_never_panics() {
    let mut texts: Vec<(String, String)> = xla_texts()
        .iter()
        .chain(corpus().iter())
        .map(|p| (name_of(p), read(p)))
        .collect();
    texts.push(("GOOD".into(), GOOD.to_string()));
    let mut rng = common::Rng::new(7);
    let alphabet = b"{}()[],=%\"'-.:0123456789x_<*#/ \neT";
    let mut checked = 0usize;
    let mut check = |what: &str, text: &str| {
        let lines = text.lines().count().max(1) + 1;
        match std::panic::catch_unwind(|| parse(text)) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                assert!(
                    e.line >= 1 && e.line <= lines && e.column >= 1,
                    "{what}: error outside the text: {e}"
                );
            }
            Err(_) => panic!("{what}: the parser panicked on:\n{text}"),
        }
        checked += 1;
    };
    for (name, text) in &texts {
        let bytes = text.as_bytes();
        // Fewer tries on the big dumps keep the test to a few seconds.
        let tries = if bytes.len() > 10_000 { 40 } else { 120 };
        let step = (bytes.len() / tries).max(1);
        for cut in (0..bytes.len()).step_by(step) {
            if let Ok(prefix) = std::str::from_utf8(&bytes[..cut]) {
                check(&format!("{name} cut at {cut}"), prefix);
            }
        }
        for k in 0..tries {
            let mut m = bytes.to_vec();
            for _ in 0..1 + k % 3 {
                let at = (rng.next_u64() % m.len() as u64) as usize;
                m[at] = alphabet[(rng.next_u64() % alphabet.len() as u64) as usize];
            }
            if let Ok(s) = String::from_utf8(m) {
                check(&format!("{name} mutation {k}"), &s);
            }
        }
    }
    // Pathological shapes: deep parens, long lists, giant numbers, NUL bytes.
    for (what, text) in [
        ("parens", format!("HloModule m\nENTRY %e () -> f32[] {{\n  ROOT %c = {}f32[] constant(1)\n}}", "(".repeat(100_000))),
        ("braces", format!("HloModule m\nENTRY %e () -> f32[1] {{\n  ROOT %c = f32[1]{{0}} constant({})\n}}", "{".repeat(100_000))),
        ("json", format!("HloModule m\nENTRY %e () -> f32[] {{\n  ROOT %c = f32[] constant(1), backend_config={}\n}}", "{".repeat(100_000))),
        ("dims", format!("HloModule m\nENTRY %e () -> f32[] {{\n  ROOT %c = f32[{}1] constant(1)\n}}", "1,".repeat(50_000))),
        ("elements", "HloModule m\nENTRY %e () -> f32[9223372036854775807] {\n  ROOT %c = f32[9223372036854775807]{0} constant({1, 2})\n}".to_string()),
        ("big", "HloModule m\nENTRY %e () -> f32[] {\n  ROOT %c = f32[] constant(1e999)\n}".to_string()),
        ("nul", "HloModule m\nENTRY %e () -> f32[] {\n  ROOT %c = f32[] constant(1\0)\n}".to_string()),
        ("origin", format!("HloModule m\nENTRY %e () -> f32[] {{\n  ROOT %c = f32[] constant(1), origin={{{}}}\n}}", "(".repeat(100_000))),
    ] {
        let t0 = Instant::now();
        check(what, &text);
        assert!(parse(&text).is_err(), "{what} should not parse");
        assert!(t0.elapsed().as_secs() < 5, "{what} took {:?}", t0.elapsed());
    }
    eprintln!("{checked} malformed inputs, no panic");
}
