//! The cluster benchmark cannot rot: `bench/cluster/run` in its smallest
//! form — loopback instead of network namespaces (no root, no shaping), 2
//! JAX processes joined by `jax.distributed` with gloo collectives, one
//! 256 KiB bf16 all-reduce — run as psum, as the 2-byte ring baseline and
//! with equarx enabled through the JAX door (this build's `libequarx.so`).
//! The measured table lives in BENCHMARKS.md ("4-host cluster over
//! rate-limited links"); this only checks that the path works end to end.

mod common;
mod doors;

use std::process::Command;
use std::time::Instant;

use serde_json::Value;

#[test]
fn cluster_benchmark_runs_two_processes_on_loopback() {
    common::python(); // the pinned venv, or a clear failure saying how to make it
    let lib = doors::cdylib();
    let dir = common::scratch("cluster_smoke");
    let json = dir.join("results.json");
    let started = Instant::now();
    let out = Command::new(common::repo().join("bench/cluster/run"))
        .args([
            "--net",
            "loopback",
            "--procs",
            "2",
            "--workload",
            "allreduce",
        ])
        .args([
            "--sizes",
            "256k",
            "--baselines",
            "psum,ring-u16",
            "--configs",
            "b64-d2",
        ])
        .args(["--iters", "2", "--timeout", "120"])
        .arg("--workdir")
        .arg(&dir)
        .arg("--json")
        .arg(&json)
        .env("EQUARX_LIB", &lib)
        .output()
        .expect("run bench/cluster/run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!(
        "{stdout}\n(bench/cluster/run took {:.1?})",
        started.elapsed()
    );
    assert!(
        out.status.success(),
        "bench/cluster/run failed ({}):\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );

    // The printed table: a header and one row per program.
    assert!(
        stdout.contains("| rate | workload | size | variant |"),
        "{stdout}"
    );
    let table_rows = stdout
        .lines()
        .filter(|l| l.starts_with("| unshaped | allreduce | 256 KiB |"))
        .count();
    assert_eq!(table_rows, 3, "one table row per program:\n{stdout}");

    let results: Value =
        serde_json::from_slice(&std::fs::read(&json).expect("results JSON")).expect("JSON");
    let rows = results["rows"].as_array().expect("rows");
    let row = |variant: &str| -> &Value {
        rows.iter()
            .find(|r| r["variant"] == variant)
            .unwrap_or_else(|| panic!("no {variant} row in {rows:?}"))
    };
    for r in rows {
        let median = r["median_s"].as_f64().expect("median_s");
        assert!(median > 0.0 && median < 30.0, "median time {median} s: {r}");
        assert_eq!(
            r["bit_identical"], true,
            "both ranks hold the same bits: {r}"
        );
        assert_eq!(r["finite"], true, "{r}");
    }

    // What each program sends, read from XLA's optimized HLO: XLA:CPU
    // promotes the bf16 psum to f32; the baseline ring sends u16; equarx
    // replaced the all-reduce by an s8 ring.
    assert_eq!(
        row("psum")["wire_types"]["all-reduce f32"],
        1,
        "{}",
        row("psum")
    );
    assert!(
        row("ring-u16")["wire_types"]["collective-permute u16"].as_u64() >= Some(1),
        "{}",
        row("ring-u16")
    );
    let eq = row("equarx:b64-d2");
    assert_eq!(eq["rewritten"], 1, "equarx rewrote the all-reduce: {eq}");
    assert!(
        eq["wire_types"]["collective-permute s8"].as_u64() >= Some(1),
        "{eq}"
    );
    assert!(
        eq["wire_types"].get("all-reduce f32").is_none(),
        "no all-reduce left: {eq}"
    );

    // Close to the unquantized run: within the error model of one ring of
    // 2 (the bound the real-XLA pass tests use), and not bit-equal (the
    // quantization did happen).
    let err = eq["err_vs_psum"].as_f64().expect("err_vs_psum");
    let bound = common::chained_bound(1.0, 2);
    assert!(
        err > 0.0 && err < bound,
        "relative RMS error vs psum {err} (want 0 < e < {bound})"
    );
    let exact = eq["err_vs_exact"].as_f64().expect("err_vs_exact");
    assert!(exact < bound, "relative RMS error vs the exact sum {exact}");
    assert!(
        eq["speedup_vs_psum"].as_f64().is_some() && eq["speedup_vs_2byte"].as_f64().is_some(),
        "speedups reported: {eq}"
    );
}
