//! The compile-time benchmark cannot rot: `bench/compile/run` in its
//! smallest form — a 1-layer prefill generated with JAX, two variants, one
//! compile each in XLA:CPU, one timed pass run on a debug build — must print
//! both tables and a JSON record whose numbers hang together. The measured
//! figures live in BENCHMARKS.md ("Compile time in XLA:CPU"); nothing here
//! judges speed.

mod common;
#[path = "doors/mod.rs"]
mod doors;

use std::process::{Command, Output};
use std::time::Instant;

use serde_json::Value;

/// The second variant: a lone flag (the `=` form), read by the CLI and by
/// benches/pass.rs alike.
const UNROLL: &str = "--unroll";

fn bench(args: &[&str]) -> Output {
    Command::new(common::repo().join("bench/compile/run"))
        .args(args)
        .output()
        .expect("run bench/compile/run")
}

/// The rows of the markdown table that follows the line starting with
/// `title`, as cells.
fn table(stdout: &str, title: &str) -> Vec<Vec<String>> {
    let mut lines = stdout
        .lines()
        .skip_while(|l| !l.starts_with(title))
        .skip(1)
        .skip_while(|l| l.is_empty());
    let header = lines
        .next()
        .unwrap_or_else(|| panic!("no table after {title:?}:\n{stdout}"));
    assert!(header.starts_with("| layers | variant"), "{header}");
    let rule = lines.next().expect("the header rule");
    assert!(rule.starts_with("|---"), "{rule}");
    lines
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

fn positive(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x > 0.0 && x.is_finite(), "{what} = {x}");
    x
}

#[test]
fn compile_benchmark_runs_one_layer() {
    common::python(); // the pinned venv, or a clear failure saying how to make it
    let dir = common::scratch("bench_compile");
    let json = dir.join("results.json");
    let started = Instant::now();
    let out = bench(&[
        "--layers",
        "1",
        "--runs",
        "1",
        "--pass-runs",
        "1",
        "--profile",
        "dev",
        "--equarx",
        env!("CARGO_BIN_EXE_equarx"),
        "--timeout",
        "120",
        "--variant",
        "default",
        "--variant=--unroll",
        "--workdir",
        dir.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!(
        "{stdout}\n(bench/compile/run took {:.1?})",
        started.elapsed()
    );
    assert!(
        out.status.success(),
        "bench/compile/run failed ({}):\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );

    let results: Value =
        serde_json::from_slice(&std::fs::read(&json).expect("results JSON")).expect("JSON");
    let rows = results["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2, "one row per variant: {results}");
    let compile = table(&stdout, "compile:");
    let pass = table(&stdout, "the pass:");
    assert_eq!(compile.len(), 2, "{stdout}");
    assert_eq!(pass.len(), 2, "{stdout}");

    for (i, (r, variant)) in rows.iter().zip(["default", UNROLL]).enumerate() {
        assert_eq!(r["variant"], variant, "{r}");
        assert_eq!(r["layers"], 1);
        // One layer: two psums, both rewritten (--min-payload 0).
        assert_eq!(r["all_reduces"], 2, "{r}");
        assert_eq!(r["rewritten"], 2, "{r}");
        let before = r["instructions_before"].as_u64().expect("before");
        let after = r["instructions_after"].as_u64().expect("after");
        assert!(before > 0 && after > before, "{r}");
        let per = positive(
            &r["instructions_per_rewritten"],
            "instructions per all-reduce",
        );
        assert_eq!(per, (after - before) as f64 / 2.0, "{r}");
        // The bench binary decoded the same rewritten module: its count
        // (Rust) agrees with the script's (Python, from the proto bytes).
        assert_eq!(r["pass"]["output_instructions"], after, "{r}");
        assert_eq!(r["pass"]["matched_expected"], true, "{r}");

        let t_orig = positive(&r["compile_original"]["times"][0], "original compile s");
        let t_rw = positive(&r["compile_rewrite"]["times"][0], "rewrite compile s");
        let cpu_orig = positive(&r["compile_original"]["cpu_times"][0], "original CPU s");
        let cpu_rw = positive(&r["compile_rewrite"]["cpu_times"][0], "rewrite CPU s");
        assert_eq!(r["compile_rewrite"]["timed_out"], false, "{r}");
        let rewrite_s = positive(&r["pass"]["rewrite_s"][0], "rewrite s");
        let de_s = positive(&r["pass"]["decode_encode_output_s"][0], "decode+encode s");

        // The printed tables say what the JSON says.
        let c = &compile[i];
        assert_eq!(c[0], "1");
        assert_eq!(c[1], variant);
        assert_eq!(c[2], format!("{t_orig:.2}"), "{c:?}");
        assert_eq!(c[3], format!("{t_rw:.2}"), "{c:?}");
        assert_eq!(c[4], format!("{:.1}x", t_rw / t_orig), "{c:?}");
        assert_eq!(c[5], format!("{cpu_orig:.2}"), "{c:?}");
        assert_eq!(c[6], format!("{cpu_rw:.2}"), "{c:?}");
        assert_eq!(c[7], format!("{:.1}x", cpu_rw / cpu_orig), "{c:?}");
        assert_eq!(c[8], before.to_string());
        assert_eq!(c[9], after.to_string());
        assert_eq!(c[10], "2/2");
        assert_eq!(c[11], format!("{per:.0}"));
        let p = &pass[i];
        assert_eq!(p[1], variant);
        assert_eq!(p[2], format!("{:.1}", rewrite_s * 1e3), "{p:?}");
        assert_eq!(p[3], format!("{:.1}", de_s * 1e3), "{p:?}");
        assert_eq!(p[4], format!("{:.2}x", rewrite_s / de_s), "{p:?}");
    }
    // Both variants were compiled against the same original compile.
    assert_eq!(rows[0]["compile_original"], rows[1]["compile_original"]);
    assert!(
        stdout.contains(&format!(
            "commit {}",
            results["commit"].as_str().expect("commit")
        )),
        "{stdout}"
    );
}

#[test]
fn compile_benchmark_refuses_bad_options_before_doing_anything() {
    for (args, says) in [
        (&["--layers", "0"][..], "--layers wants layer counts >= 1"),
        (
            &["--layers", "x"][..],
            "--layers wants comma-separated integers",
        ),
        (&["--runs", "0"][..], "--runs must be at least 1"),
        (
            &["--variant", "--output /tmp/x"][..],
            "--output is set by the benchmark itself",
        ),
        (&["--variant", "unroll"][..], "want equarx rewrite flags"),
        (
            &["--variant", "default", "--variant", ""][..],
            "given twice",
        ),
    ] {
        let out = bench(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(says),
            "{args:?}: want {says:?} in:\n{stderr}"
        );
    }
}

/// `bench/compile/ab.py` in its smallest form: this checkout as its one
/// side, one psum on v5e:2x2 (XLA:TPU, deviceless), one measured round. It
/// must print the original and the side, the side's kernels and a ratio;
/// nothing here judges speed.
#[test]
fn the_side_by_side_compile_runs_in_xla_tpu() {
    let py = common::venv(common::Venv::Compilers).unwrap_or_else(|e| panic!("{e}"));
    let side = format!(
        "here={}:{}",
        common::repo().display(),
        doors::cdylib().display()
    );
    let out = Command::new(py)
        .arg(common::repo().join("bench/compile/ab.py"))
        .args([
            "--program",
            "psum",
            "--topology",
            "v5e:2x2",
            "--rounds",
            "1",
        ])
        .args(["--side", &side])
        .output()
        .expect("run bench/compile/ab.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ab.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = |name: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row:\n{stdout}"))
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let (original, here) = (row("original "), row("here "));
    assert_eq!(
        original[2], "0",
        "the plain psum compiles to no kernel: {original:?}"
    );
    let kernels: u32 = here[2].parse().expect("the side's kernels");
    assert!(kernels > 0, "the rewrite compiles to kernels: {here:?}");
    let ratio = here
        .iter()
        .find_map(|t| t.strip_suffix('x').and_then(|v| v.parse::<f64>().ok()));
    assert!(
        ratio.is_some_and(|r| r > 0.0),
        "a ratio to the original: {here:?}"
    );
}
