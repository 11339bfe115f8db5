//! The cluster benchmark cannot rot: `bench/cluster/run` in its smallest
//! form — loopback instead of network namespaces (no root, no shaping), 2
//! JAX processes joined by `jax.distributed` with gloo collectives, one
//! 256 KiB bf16 all-reduce — run as psum, as the 2-byte ring and two-shot
//! baselines, as their 1-byte bounds and
//! with equarx enabled through the JAX door (this build's `libequarx.so`) —
//! and a reduce-scatter and an all-gather of the same size, each as is and
//! through the door.
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
            "allreduce,reducescatter,allgather",
        ])
        .args([
            "--sizes",
            "256k",
            "--baselines",
            "psum,ring-u16,twoshot-u16,ring-u8,twoshot-u8,psum-scatter,all-gather",
            "--configs",
            "b64-d2",
            "--reducescatter-configs",
            "auto",
            "--allgather-configs",
            "auto",
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
    assert_eq!(table_rows, 6, "one table row per program:\n{stdout}");

    let results: Value =
        serde_json::from_slice(&std::fs::read(&json).expect("results JSON")).expect("JSON");
    let rows = results["rows"].as_array().expect("rows");
    let row_of = |workload: &str, variant: &str| -> &Value {
        rows.iter()
            .find(|r| r["workload"] == workload && r["variant"] == variant)
            .unwrap_or_else(|| panic!("no {workload} {variant} row in {rows:?}"))
    };
    let row = |variant: &str| row_of("allreduce", variant);
    assert_eq!(rows.len(), 11, "one row per program: {rows:?}");
    for r in rows {
        let median = r["median_s"].as_f64().expect("median_s");
        assert!(median > 0.0 && median < 30.0, "median time {median} s: {r}");
        // a reduce-scatter leaves each rank its own part: n/a (null)
        let replicated = r["workload"] != "reducescatter";
        assert_eq!(
            r["bit_identical"],
            if replicated {
                Value::Bool(true)
            } else {
                Value::Null
            },
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
    // The two-shot baseline sends what equarx's two-shot sends, in 2
    // bytes, and sums in f32 as the ring does; the 1-byte bounds send the
    // bf16's high byte and are far off (powers of four), which is why
    // they are bounds and never the "× 2-byte" denominator.
    let two_shot = row("twoshot-u16");
    for op in ["all-to-all u16", "all-gather u16"] {
        assert_eq!(two_shot["wire_types"][op], 1, "{two_shot}");
    }
    let ring_err = row("ring-u16")["err_vs_exact"].as_f64().expect("err");
    let two_shot_err = two_shot["err_vs_exact"].as_f64().expect("err");
    assert!(
        two_shot_err < 2.0 * ring_err + 1e-6,
        "a bf16 two-shot is as close as the bf16 ring: {two_shot_err} vs {ring_err}"
    );
    for (bound, ops) in [
        ("ring-u8", ["collective-permute u8", "all-gather u8"]),
        ("twoshot-u8", ["all-to-all u8", "all-gather u8"]),
    ] {
        let b = row(bound);
        for op in ops {
            assert!(b["wire_types"][op].as_u64() >= Some(1), "{b}");
        }
        assert!(
            b["err_vs_exact"].as_f64().expect("err") > 0.1,
            "the high byte alone is a bound, not a codec: {b}"
        );
        assert_ne!(b["two_byte_baseline"], bound, "{b}");
    }

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
    // Round by round: the ratio's median and range over the same timed
    // rounds; the 2-byte baseline against itself is 1 in every round.
    let rounds = |r: &Value| -> [f64; 3] {
        ["min", "median", "max"].map(|k| {
            r["speedup_vs_2byte_rounds"][k]
                .as_f64()
                .unwrap_or_else(|| panic!("{k} of the rounds: {r}"))
        })
    };
    let [lo, mid, hi] = rounds(eq);
    assert!(0.0 < lo && lo <= mid && mid <= hi, "{eq}");
    let base = row(eq["two_byte_baseline"].as_str().expect("a 2-byte baseline"));
    assert_eq!(rounds(base), [1.0; 3], "{base}");

    // The reduce-scatter and the all-gather: XLA:CPU sends them as f32;
    // through the door equarx sends s8 instead, within one quantization's
    // error of the plain program's output (the ring of 2 quantizes once on
    // the way, the gather once), against rank 0's part of the exact result.
    for (workload, plain, op) in [
        ("reducescatter", "psum-scatter", "reduce-scatter"),
        ("allgather", "all-gather", "all-gather"),
    ] {
        let base = row_of(workload, plain);
        assert_eq!(base["wire_types"][format!("{op} f32")], 1, "{base}");
        let eq = row_of(workload, "equarx:auto");
        assert_eq!(eq["rewritten"], 1, "equarx rewrote the {op}: {eq}");
        assert!(
            eq["wire_types"].get(format!("{op} f32")).is_none(),
            "no f32 {op} left: {eq}"
        );
        // A ring's hops, a gather, or a two-shot's exchange: whichever
        // plan the time model chose.
        let s8: u64 = ["collective-permute s8", "all-gather s8", "all-to-all s8"]
            .iter()
            .map(|k| eq["wire_types"][k].as_u64().unwrap_or(0))
            .sum();
        assert!(s8 >= 1, "s8 on the wire: {eq}");
        let err = eq["err_vs_psum"].as_f64().expect("err_vs_psum");
        let exact = eq["err_vs_exact"].as_f64().expect("err_vs_exact");
        assert!(
            err > 0.0 && err < bound,
            "{workload}: error vs {plain} {err}"
        );
        assert!(
            exact < bound,
            "{workload}: error vs the exact result {exact}"
        );
    }
    let rs_ring = row_of("reducescatter", "ring-u16");
    assert!(
        rs_ring["wire_types"]["collective-permute u16"].as_u64() >= Some(1),
        "{rs_ring}"
    );
}

/// `trace_summary.py` on a made-up trace of a loop: XLA:CPU's `while` event
/// spans its body's instruction events, so it is neither compute nor an
/// overlap of compute with the body's collectives; what it covers beyond
/// them is the loop's own time. A long tuple shape (`/*index=5*/`) must
/// not hide the loop from the opcode map.
#[test]
fn trace_summary_counts_a_loop_by_its_body() {
    let script = r#"
import json, sys
sys.path.insert(0, "bench/cluster")
import trace_summary as ts
hlo = """
%body (p: (s32[], f32[8], f32[8], s32[], f32[8], /*index=5*/f32[8])) -> (s32[], f32[8], f32[8], s32[], f32[8], /*index=5*/f32[8]) {
  %q = f32[8]{0} fusion(%x), kind=kLoop, calls=%f
  %cp = f32[8]{0} collective-permute(%q), channel_id=1, source_target_pairs={{0,1},{1,0}}
  %d = f32[8]{0} fusion(%cp), kind=kLoop, calls=%g
}
ENTRY %main (a: f32[8]) -> f32[8] {
  %w = (s32[], f32[8], f32[8], s32[], f32[8], /*index=5*/f32[8]) while(%t), condition=%c, body=%body
  %ag = f32[32]{0} all-gather(%y), channel_id=2, replica_groups={{0,1}}, dimensions={0}
  ROOT %out = f32[8]{0} fusion(%ag), kind=kLoop, calls=%h
}
"""
ops = ts.opcodes(hlo)
ev = lambda n, t, d: {"ph": "X", "name": n, "ts": t, "dur": d}
events = [ev("w", 0, 100), ev("q", 0, 10), ev("cp", 10, 50), ev("d", 60, 10),
          ev("ag", 100, 50), ev("out", 170, 10), ev("ThunkExecutor::Execute", 0, 180)]
print(json.dumps({"ops": ops, "summary": ts.summarize(events, ops)}))
"#;
    let out = Command::new(common::python())
        .current_dir(common::repo())
        .args(["-c", script])
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "trace_summary check failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON from the check");
    assert_eq!(
        v["ops"]["w"], "while",
        "the loop is in the opcode map: {}",
        v["ops"]
    );
    let s = &v["summary"];
    let ms = |k: &str| s[k].as_f64().unwrap_or_else(|| panic!("{k} in {s}"));
    let close = |k: &str, want: f64| {
        assert!(
            (ms(k) - want).abs() < 1e-9,
            "{k}: {} ms, want {want} ms: {s}",
            ms(k)
        )
    };
    close("collective_ms", 0.100); // cp 50 µs + ag 50 µs
    close("compute_ms", 0.030); // q, d, out: 10 µs each; not the while
    close("overlap_ms", 0.0); // the while spans the permute; that is no overlap
    close("control_ms", 0.030); // 70..100 µs: inside the while, no instruction
    close("gap_ms", 0.050); // the 30 µs in the loop and 150..170 µs
    assert_eq!(s["events"], 6, "{s}");
    assert!(
        s["by_opcode_ms"].get("while").is_none(),
        "per-opcode sums are instruction time: {s}"
    );
}
