//! The JAX door: `python/equarx` registered with
//! `jax.extend.xla.register_hlo_module_transformation` through
//! `equarx.jax.enable(...)`, loading this build's `libequarx.so`. A
//! tensor-parallel transformer block runs on 8 CPU devices with and without
//! the pass (`tests/jax_door.py`, in the pinned venv of `scripts/pyenv`).

mod common;
mod doors;

use std::process::Command;

use serde_json::Value;

#[test]
fn jax_enable_rewrites_a_tensor_parallel_block() {
    let python = common::python();
    let lib = doors::cdylib();
    let started = std::time::Instant::now();
    let out = Command::new(&python)
        .arg(common::repo().join("tests/jax_door.py"))
        .env("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
        .env("JAX_PLATFORMS", "cpu")
        .env("PYTHONPATH", common::repo().join("python"))
        .env("EQUARX_LIB", &lib)
        .current_dir(common::scratch("jax_door"))
        .output()
        .expect("run tests/jax_door.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: String = {
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.starts_with("    @")).collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    };
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("JAX_DOOR_RESULT "))
        .unwrap_or_else(|| {
            panic!(
                "tests/jax_door.py gave no result ({}; a signal means XLA aborted, e.g. on HLO its \
                 backend cannot emit):\n{stdout}\n--- stderr (last lines)\n{tail}",
                out.status
            )
        });
    let r: Value = serde_json::from_str(line).expect("result JSON");
    println!("{}", serde_json::to_string_pretty(&r).unwrap());
    println!("python process: {:.1?}", started.elapsed());

    assert_eq!(
        r["plain"]["s8_collectives"], 0,
        "plain compile has no s8 ring"
    );

    let e = &r["equarx"];
    assert!(
        e["equarx_fusions"].as_u64().unwrap_or(0) > 0,
        "after XLA's fusion equarx emits loop fusions: {e}"
    );
    assert!(
        e["s8_collectives"].as_u64().unwrap_or(0) > 0,
        "no s8 collective in the compiled HLO: {e}"
    );
    assert_eq!(
        e["rewritten"], 2,
        "both all-reduces of the block are rewritten: {e}"
    );
    // Two all-reduces in a row, each within the error model for matmul
    // partials (the bound of the real-XLA pass tests).
    let rel = e["rel_rms"].as_f64().expect("rel_rms");
    let bound = common::chained_bound(2.0, 8);
    assert!(
        rel > 0.0 && rel < bound,
        "relative RMS error {rel} (want 0 < e < {bound})"
    );
    assert_eq!(
        e["devices_bit_identical"], true,
        "every device holds the same bits"
    );
    assert_eq!(e["shards"], 8);

    // enable() with no platforms: JAX's default backend; as a context
    // manager, restoring what was enabled before; the report as a table.
    let w = &r["with_default_backend"];
    assert_eq!(w["default_backend"], "cpu", "{w}");
    assert_eq!(w["platforms"], serde_json::json!(["cpu"]), "{w}");
    assert!(w["s8_collectives"].as_u64() >= Some(2), "{w}");
    let table = w["report_table"].as_str().unwrap_or("");
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("collective ") && lines[0].ends_with(" reason"),
        "{table}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.contains(" rewritten ")).count(),
        2,
        "{table}"
    );
    assert!(
        lines
            .last()
            .unwrap()
            .starts_with("2 of 2 collectives rewritten"),
        "{table}"
    );
    assert_eq!(
        w["restored_options"]["quant_format"], "int4",
        "leaving the block restores the registration before it: {w}"
    );

    let bad = &r["bad_options"];
    assert_eq!(
        bad["type"], "EquarxError",
        "enable() refuses bad options: {r}"
    );
    assert!(
        bad["message"]
            .as_str()
            .unwrap_or("")
            .contains("block size must be in 1..="),
        "{bad}"
    );
    assert_eq!(
        r["still_enabled_after_bad_options"], true,
        "a refused enable() keeps the old one"
    );

    let pass_error = r["pass_error"]["message"].as_str().unwrap_or("");
    assert!(
        pass_error.contains("unknown pass \\\"no-such-pass\\\"")
            || pass_error.contains("unknown pass \"no-such-pass\""),
        "the pass's error reaches Python with equarx's message: {}",
        r["pass_error"]
    );

    assert_eq!(r["disable_returned"], true);
    assert_eq!(
        r["after_disable"]["s8_collectives"], 0,
        "disable() removes the pass"
    );
    assert_eq!(r["after_disable"]["disable_again"], false);

    let native = r["native"]["message"].as_str().unwrap_or("");
    assert!(
        native.contains("no XLA-transform extension"),
        "register_native on a plugin without the extension: {}",
        r["native"]
    );

    // Huge finite activations (past 1e19) keep every device's bits equal,
    // with the pass's default options.
    // Every code format through the door: rewritten, bit-identical, and
    // erring in the order of their precision.
    let auto4 = r["int4_auto"].as_array().expect("int4_auto");
    assert!(!auto4.is_empty(), "{}", r["int4_auto"]);
    for op in auto4 {
        assert_eq!(op["rewritten"], false, "int4 under auto: {op}");
        let reason = op["reason"].as_str().unwrap_or("");
        assert!(
            reason.starts_with("declined") && reason.contains("keeps a model"),
            "int4 under auto is declined as breaking the model: {op}"
        );
    }
    let formats = &r["formats"];
    let mut last = 0.0;
    for fmt in ["int8", "fp8-e4m3", "fp8-e5m2", "int4"] {
        let f = &formats[fmt];
        assert_eq!(f["rewritten"], 2, "{fmt}: {f}");
        assert!(f["s8_collectives"].as_u64() >= Some(2), "{fmt}: {f}");
        assert_eq!(f["finite"], true, "{fmt}: {f}");
        assert_eq!(f["devices_bit_identical"], true, "{fmt}: {f}");
        let err = f["rel_rms"].as_f64().expect("rel_rms");
        assert!(err > last && err < 0.5, "{fmt}: error {err} after {last}");
        last = err;
    }

    // The hook's s8 product (XLA:CPU's YNNPACK) against the door before
    // XLA's f32 one: every rotated plan the same bits, NaN blocks
    // included.
    let plans = r["hook_product"].as_object().expect("hook_product");
    assert_eq!(
        plans.keys().collect::<Vec<_>>(),
        ["ring", "two-shot"],
        "both rotated plans compared"
    );
    for (algorithm, h) in plans {
        // Both products, forward and back.
        assert!(h["ynn_products"].as_u64() >= Some(2), "{algorithm}: {h}");
        assert_eq!(
            h["f32_results"], 0,
            "{algorithm}: the narrowing folded: {h}"
        );
        assert!(
            h["tasks"].as_u64() >= Some(1),
            "{algorithm}: equarx's fusions split into tasks as XLA's: {h}"
        );
        assert_eq!(
            h["bare_slices"], 0,
            "{algorithm}: an exchange's parts are fusions, not bare slices: {h}"
        );
        assert_eq!(h["differing_bits"], 0, "{algorithm}: {h}");
        assert!(
            h["nan"].as_u64() >= Some(64),
            "{algorithm}: the NaN's block: {h}"
        );
    }

    // Calibration: the SP MLP's two collectives measured, its profile
    // steering the rewrite; the GSPMD block's all-reduces (inserted by
    // XLA) left unmeasured with the reason, and that profile not applied
    // to another program.
    let cal = &r["calibration"];
    let ops = cal["ops"].as_array().expect("ops");
    assert_eq!(ops.len(), 2, "{cal}");
    assert!(ops.iter().all(|o| o["group_size"] == 8), "{cal}");
    assert_eq!(cal["unmeasured"], serde_json::json!([]), "{cal}");
    assert_eq!(cal["file_matches"], true, "{cal}");
    assert_eq!(
        cal["still_enabled"], true,
        "calibrate restores the registration: {cal}"
    );
    let steered = cal["with_profile"].as_array().expect("with_profile");
    assert_eq!(steered.len(), 2, "{cal}");
    for op in steered {
        assert_eq!(op["rewritten"], true, "{op}");
        assert_eq!(op["basis"], "profile", "{op}");
        let said = op["prediction"].as_str().unwrap_or("");
        assert!(
            said.contains("quantization of the sum errs") || said.contains("κ²"),
            "the statistic is named: {op}"
        );
    }
    assert_eq!(cal["gspmd_ops"], 0, "{cal}");
    let why = cal["gspmd_unmeasured"]
        .as_array()
        .expect("gspmd_unmeasured");
    assert_eq!(why.len(), 2, "{cal}");
    assert!(
        why.iter()
            .all(|w| w.as_str().unwrap_or("").contains("inserted by XLA")),
        "{cal}"
    );
    for op in cal["misfit"].as_array().expect("misfit") {
        assert_eq!(op["basis"], "prior-unmatched", "{op}");
        assert!(
            op["prediction"].as_str().unwrap_or("").contains("no op"),
            "{op}"
        );
    }

    let huge = &r["huge_activations"];
    for run in ["plain", "equarx"] {
        let h = &huge[run];
        assert_eq!(h["finite"], true, "{run}: {h}");
        assert!(
            h["absmax"].as_f64().unwrap_or(0.0) > 1e19,
            "{run}: the activations reach the huge regime: {h}"
        );
        assert_eq!(
            h["devices_bit_identical"], true,
            "{run}: every device holds the same bits: {h}"
        );
    }
    assert_eq!(
        huge["equarx"]["rewritten"], 1,
        "the psum in the scan body is rewritten: {huge}"
    );
    assert!(out.status.success(), "{}\n{tail}", out.status);

    // Sequence parallelism: both collectives quantized through the door,
    // within the 2.5 % of the unquantized run.
    let sp = &r["sequence_parallel"];
    assert_eq!(
        sp["rewritten"],
        serde_json::json!(["all-gather", "reduce-scatter"]),
        "{sp}"
    );
    assert!(sp["s8_collectives"].as_u64() >= Some(2), "{sp}");
    assert_eq!(sp["finite"], true, "{sp}");
    let err = sp["rel_rms"].as_f64().expect("rel_rms");
    assert!(
        err > 0.0 && err < 0.025,
        "sequence-parallel MLP error {err}"
    );
}

/// The README's example of the door before XLA, as it stands: a
/// `shard_map` psum lowered, rewritten by `equarx.jax.rewrite_lowered`,
/// compiled and run on 8 CPU devices, no registration.
#[test]
fn the_readme_door_before_xla_runs() {
    let snippet = common::doc_block(
        "README.md",
        "tests/jax_door.rs::the_readme_door_before_xla_runs",
    );
    let dir = common::scratch("readme_rewrite_lowered");
    std::fs::write(dir.join("snippet.py"), &snippet).unwrap();
    let out = Command::new(common::python())
        .arg("snippet.py")
        .env("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
        .env("JAX_PLATFORMS", "cpu")
        .env("PYTHONPATH", common::repo().join("python"))
        .env("EQUARX_LIB", doors::cdylib())
        .current_dir(&dir)
        .output()
        .expect("run the README's snippet");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "README.md's snippet failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("1 of 1 collectives rewritten"), "{stdout}");
    // The door tells equarx which compiler it lowered for.
    assert!(
        stdout.contains("emitted for cpu (option platform)"),
        "{stdout}"
    );
}
