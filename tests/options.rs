//! One list of options (`core/src/options/schema.rs`), every door: each option's
//! example is accepted and its refused value is refused with the library's
//! own message, and so is a name that is no option, through the CLI, the C
//! ABI, the cxx bridge (what the C++ pass calls) and the Python package;
//! the C++ `EquarxPass` in a real `xla::HloPassPipeline` gets the same
//! cases in `tests/cpp_pipeline.rs`. A door that dropped, renamed or
//! re-parsed an option would accept its refused value, or answer with
//! another message.
//!
//! The docs are made from the same list: the README's short table (made
//! here from each option's help), docs/options.md's table of reasons and
//! the key lists of `cpp_shim/README.md` and `cpp_shim/include/equarx.h`
//! must be what `equarx::options` generates (`EQUARX_BLESS=1` rewrites
//! them), and `--help` must show every flag.

mod common;
mod doors;

use std::ffi::{CStr, CString};
use std::path::Path;

use common::{equarx, fixture, repo, run_python_door, scratch};
use equarx::ffi::bridge::{OptionValue, rewrite_module};
use equarx::ffi::c_abi::{EQUARX_OK, EquarxResult, equarx_free_result, equarx_rewrite};
use equarx::options::{OPTIONS, OptionSpec, Syntax, from_pairs};
use serde_json::{Value, json};

/// A bare `HloModuleProto` (the bridge reads nothing else) with one bf16
/// all-reduce over 8 partitions.
const MODULE: &str = "psum_bf16_p8.pb";

/// One case: option pairs (text, as the command line writes them) and what
/// every door must answer.
struct Case {
    what: String,
    pairs: Vec<(String, String)>,
    /// `None`: accepted. `Some(m)`: refused, with `m` in the message.
    refused: Option<String>,
}

fn cases() -> Vec<Case> {
    let pair = |n: &str, v: &str| (n.to_string(), v.to_string());
    let library = |pairs: &[(String, String)]| {
        from_pairs(pairs.iter().map(|(n, v)| (n.as_str(), v.as_str()))).err()
    };
    let mut v = Vec::new();
    for o in OPTIONS {
        // A threshold of 0 makes the cost model's verdict irrelevant.
        let mut pairs = vec![pair(o.name, o.example)];
        if o.name != "min_payload_bytes" {
            pairs.insert(0, pair("min_payload_bytes", "0"));
        }
        assert_eq!(library(&pairs), None, "{}: the example is refused", o.name);
        v.push(Case {
            what: format!("{}={}", o.name, o.example),
            pairs,
            refused: None,
        });
        if let Some((value, _)) = o.refused {
            let pairs = vec![pair(o.name, value)];
            let message = library(&pairs).expect("the library refuses it");
            v.push(Case {
                what: format!("{}={value}", o.name),
                pairs,
                refused: Some(message),
            });
        }
    }
    // Every option at once.
    let all: Vec<_> = OPTIONS.iter().map(|o| pair(o.name, o.example)).collect();
    assert_eq!(library(&all), None);
    v.push(Case {
        what: "every option".into(),
        pairs: all,
        refused: None,
    });
    // No option of that name.
    v.push(Case {
        what: "blok_size=64".into(),
        pairs: vec![pair("blok_size", "64")],
        refused: Some(equarx::options::unknown_option("blok_size")),
    });
    v
}

/// The pairs as the JSON doors take them: each value as a JSON string
/// (text means the same there as on the command line).
fn json_of(pairs: &[(String, String)]) -> String {
    let map: serde_json::Map<String, Value> = pairs
        .iter()
        .map(|(n, v)| (n.clone(), Value::String(v.clone())))
        .collect();
    Value::Object(map).to_string()
}

/// The same value as native JSON (a number, a bool, an array) where the
/// option's syntax has one.
fn native(o: &OptionSpec, text: &str) -> Value {
    match o.syntax {
        Syntax::Whole(_) | Syntax::Bytes => text
            .parse::<i64>()
            .map_or_else(|_| json!(text), |n| json!(n)),
        Syntax::Number(_) => text
            .parse::<f64>()
            .map_or_else(|_| json!(text), |x| json!(x)),
        Syntax::Bool => text
            .parse::<bool>()
            .map_or_else(|_| json!(text), |b| json!(b)),
        Syntax::List(_) => json!(text.split(',').collect::<Vec<_>>()),
        Syntax::Choice(_) | Syntax::Text(_) => json!(text),
    }
}

type Answer = Result<(), String>;

fn c_abi(json: &str) -> Answer {
    let bytes = fixture(MODULE);
    let json = CString::new(json).unwrap();
    let mut r = EquarxResult::default();
    // SAFETY: live buffers, NUL-terminated options, a sized result.
    let status = unsafe { equarx_rewrite(bytes.as_ptr(), bytes.len(), json.as_ptr(), &mut r) };
    let answer = if status == EQUARX_OK {
        Ok(())
    } else {
        assert!(!r.error.is_null(), "a message with every error status");
        // SAFETY: a NUL-terminated string from equarx.
        Err(unsafe { CStr::from_ptr(r.error) }
            .to_string_lossy()
            .into_owned())
    };
    // SAFETY: filled by equarx_rewrite.
    unsafe { equarx_free_result(&mut r) };
    answer
}

fn bridge(pairs: &[(String, String)]) -> Answer {
    let pairs: Vec<OptionValue> = pairs
        .iter()
        .map(|(name, value)| OptionValue {
            name: name.clone(),
            value: value.clone(),
        })
        .collect();
    let r = rewrite_module(&fixture(MODULE), &pairs, 0, 0);
    if r.ok {
        return Ok(());
    }
    assert!(
        r.options_error,
        "an options error is flagged as one: {}",
        r.error
    );
    Err(r.error)
}

fn cli(pairs: &[(String, String)], dir: &Path) -> Answer {
    let out = dir.join("out.pb");
    let _ = std::fs::remove_file(&out);
    let o = equarx()
        .arg("rewrite")
        .arg(repo().join("tests/fixtures").join(MODULE))
        .arg("-o")
        .arg(&out)
        .args(
            pairs
                .iter()
                .map(|(n, v)| format!("--{}={v}", n.replace('_', "-"))),
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    if o.status.success() {
        assert!(out.is_file(), "success writes the output");
        return Ok(());
    }
    assert!(
        matches!(o.status.code(), Some(1 | 2)) && !out.exists(),
        "a refused option: exit 1 or 2, no output: {:?} {stderr}",
        o.status
    );
    Err(stderr)
}

fn judge(c: &Case, door: &str, a: &Answer, failures: &mut Vec<String>) {
    let ok = match (&c.refused, a) {
        (None, Ok(())) => true,
        (Some(m), Err(e)) => e.contains(m.as_str()),
        _ => false,
    };
    if !ok {
        failures.push(format!(
            "{} via {door}: want {:?}, got {a:?}",
            c.what, c.refused
        ));
    }
}

#[test]
fn every_door_takes_every_option_and_refuses_alike() {
    let dir = scratch("options");
    let cases = cases();
    let mut failures = Vec::new();
    let mut py_jobs = Vec::new();
    for c in &cases {
        judge(c, "C ABI", &c_abi(&json_of(&c.pairs)), &mut failures);
        judge(c, "bridge", &bridge(&c.pairs), &mut failures);
        judge(c, "CLI", &cli(&c.pairs, &dir), &mut failures);
        let kwargs: serde_json::Map<String, Value> =
            c.pairs.iter().map(|(n, v)| (n.clone(), json!(v))).collect();
        py_jobs.push(json!({"what": c.what, "kwargs": kwargs}));
    }

    // Native JSON values (numbers, bools, arrays) mean what their text does.
    for o in OPTIONS {
        let text = from_pairs([(o.name, o.example)]).unwrap();
        let j = json!({o.name: native(o, o.example)}).to_string();
        match equarx::ffi::parse_options(&j) {
            Ok(n) if n == text => {}
            other => failures.push(format!("{} as native JSON {j}: {other:?}", o.name)),
        }
        let c = Case {
            what: format!("{} as native JSON", o.name),
            pairs: vec![],
            refused: None,
        };
        judge(&c, "C ABI", &c_abi(&j), &mut failures);
        py_jobs.push(json!({"what": c.what, "kwargs": serde_json::from_str::<Value>(&j).unwrap()}));
    }

    // The Python package, every job in one interpreter.
    let answers = run_python_door(
        &dir,
        "options.py",
        &[repo().join("tests/fixtures").join(MODULE)],
        &doors::cdylib(),
        &py_jobs,
    );
    let native_case = Case {
        what: String::new(),
        pairs: vec![],
        refused: None,
    };
    for (i, a) in answers.iter().enumerate() {
        let c = cases.get(i).unwrap_or(&native_case);
        let answer: Answer = if a["ok"] == true {
            Ok(())
        } else {
            assert_eq!(a["type"], "EquarxError", "{}: Python raised {a}", c.what);
            // check_options() and rewrite() answer alike.
            assert_eq!(a["check"], a["message"], "{}: {a}", c.what);
            Err(a["message"].as_str().unwrap_or("").to_string())
        };
        let what = py_jobs[i]["what"].as_str().unwrap_or("");
        judge(
            &Case {
                what: what.to_string(),
                pairs: vec![],
                refused: c.refused.clone(),
            },
            "Python",
            &answer,
            &mut failures,
        );
    }
    println!(
        "{} cases x 4 doors, {} options also as native JSON",
        cases.len(),
        OPTIONS.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn help_shows_every_option_with_its_default() {
    for command in ["rewrite", "analyze", "model"] {
        let out = equarx().args([command, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for o in OPTIONS {
            let flag = format!("--{} <{}", o.flag(), o.syntax.placeholder());
            let flag = if matches!(o.syntax, Syntax::Bool) {
                format!("--{} [<{}", o.flag(), o.syntax.placeholder())
            } else {
                flag
            };
            assert!(
                help.contains(&flag),
                "{command} --help lacks {flag}:\n{help}"
            );
            let default = format!("[default: {}]", o.default_text());
            let first = o
                .help
                .split_whitespace()
                .take(4)
                .collect::<Vec<_>>()
                .join(" ");
            assert!(
                flat.contains(&first) && flat.contains(&default),
                "{command} --help lacks {first:?} / {default}"
            );
        }
    }
}

/// The text between `begin` and `end` in `path` must be `generated`;
/// with `EQUARX_BLESS=1` it is rewritten to be. (Not insta's: these are
/// blocks inside hand-written docs, rewritten in place, where insta keeps
/// whole `.snap` files; docs/snapshots.md says so.)
fn generated_block(path: &str, begin: &str, end: &str, generated: &str, stale: &mut Vec<String>) {
    let file = repo().join(path);
    let text = std::fs::read_to_string(&file).unwrap();
    let start = text
        .find(begin)
        .unwrap_or_else(|| panic!("{path} lacks the marker {begin:?}"));
    let body_start = start + text[start..].find('\n').expect("a marker line") + 1;
    let body_end = body_start
        + text[body_start..]
            .find(end)
            .unwrap_or_else(|| panic!("{path} lacks the marker {end:?}"));
    if &text[body_start..body_end] == generated {
        return;
    }
    if std::env::var_os("EQUARX_BLESS").is_some() {
        let new = format!("{}{generated}{}", &text[..body_start], &text[body_end..]);
        std::fs::write(&file, new).unwrap();
        println!("rewrote {path}");
    } else {
        stale.push(format!(
            "{path}: the options block is not what core/src/options/schema.rs makes; run \
             `EQUARX_BLESS=1 cargo test --test options` and review the diff\n--- in the file\n{}\
             --- generated\n{generated}",
            &text[body_start..body_end]
        ));
    }
}

#[test]
fn docs_are_made_from_the_option_list() {
    let begin = "BEGIN options: made from core/src/options/schema.rs";
    let mut stale = Vec::new();
    generated_block(
        "README.md",
        begin,
        "<!-- END options -->",
        &equarx::options::summary_table(),
        &mut stale,
    );
    generated_block(
        "docs/options.md",
        begin,
        "<!-- END options -->",
        // The table's links are written from the repository's root.
        &equarx::options::markdown_table().replace("](BENCHMARKS.md)", "](../BENCHMARKS.md)"),
        &mut stale,
    );
    generated_block(
        "cpp_shim/README.md",
        begin,
        "<!-- END options -->",
        &equarx::options::markdown_key_list(),
        &mut stale,
    );
    // The header's marker spans two comment lines.
    generated_block(
        "cpp_shim/include/equarx.h",
        "`EQUARX_BLESS=1 cargo test --test options`; edit there",
        " * END options",
        &equarx::options::key_list(" *   "),
        &mut stale,
    );
    assert!(stale.is_empty(), "{}", stale.join("\n"));
}
