//! JAX's compilation caches must never serve an executable compiled in
//! another equarx state: not a plain one once equarx is enabled, not a
//! rewritten one once it is disabled (or never imported), not one made with
//! other options. `tests/jax_cache.py` compiles an 8-way psum, each compile
//! in its own Python process sharing one persistent cache directory, and
//! says how many s8 collective-permutes (equarx's ring) the compiled HLO
//! holds and whether JAX's cache served it.

mod common;
mod doors;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn run(args: &[&str]) -> Value {
    let out = Command::new(common::python())
        .arg(common::repo().join("tests/jax_cache.py"))
        .args(args)
        .env("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
        .env("JAX_PLATFORMS", "cpu")
        .env("PYTHONPATH", common::repo().join("python"))
        .env("EQUARX_LIB", doors::cdylib())
        .output()
        .expect("run tests/jax_cache.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("JAX_CACHE_RESULT "))
        .unwrap_or_else(|| {
            let lines: Vec<&str> = stderr.lines().collect();
            panic!(
                "tests/jax_cache.py {args:?} gave no result ({}):\n{stdout}\n--- stderr (last lines)\n{}",
                out.status,
                lines[lines.len().saturating_sub(30)..].join("\n")
            )
        });
    let r: Value = serde_json::from_str(line).expect("result JSON");
    println!("{args:?} -> {r}");
    r
}

/// One process, one compile, against the persistent cache in `dir`.
fn compile(dir: &Path, state: &str, options: &[&str]) -> Value {
    let mut args = vec!["persistent", dir.to_str().expect("utf-8 path"), state];
    args.extend_from_slice(options);
    run(&args)
}

fn s8(r: &Value) -> u64 {
    r["s8_collective_permutes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no s8 count in {r}"))
}

fn served_from_cache(r: &Value) -> bool {
    let (hits, misses) = (&r["cache"]["hits"], &r["cache"]["misses"]);
    match (hits.as_u64(), misses.as_u64()) {
        (Some(1), Some(0)) => true,
        (Some(0), Some(1)) => false,
        _ => panic!("expected one cache lookup, a hit or a miss: {r}"),
    }
}

#[test]
fn a_plain_cache_entry_is_not_served_once_equarx_is_enabled() {
    let dir = common::scratch("jax_cache_plain_first");
    let plain = compile(&dir, "plain", &[]);
    assert_eq!(s8(&plain), 0, "the plain compile has no s8 ring");
    assert!(!served_from_cache(&plain), "the cache starts empty");

    let equarx = compile(&dir, "equarx", &[]);
    assert!(
        s8(&equarx) > 0,
        "enable() in a new process must compile afresh, not take the plain \
         executable from the persistent cache: {equarx}"
    );
    assert!(!served_from_cache(&equarx), "{equarx}");
    assert_ne!(
        equarx["output_sum"], plain["output_sum"],
        "the quantized ring gives other bits than the exact psum"
    );

    // The cache still works for equarx: the same state is served.
    let again = compile(&dir, "equarx", &[]);
    assert!(served_from_cache(&again), "same state, same key: {again}");
    assert_eq!(s8(&again), s8(&equarx));

    // Other options, another executable.
    let depth1 = compile(&dir, "equarx", &["pipeline_depth=1"]);
    assert!(
        !served_from_cache(&depth1),
        "an option change must reach the cache key: {depth1}"
    );
    assert!(
        s8(&depth1) > 0 && s8(&depth1) < s8(&equarx),
        "one lane sends fewer messages than two: {depth1} vs {equarx}"
    );
}

#[test]
fn a_rewritten_cache_entry_is_not_served_without_equarx() {
    let dir = common::scratch("jax_cache_equarx_first");
    let equarx = compile(&dir, "equarx", &[]);
    assert!(s8(&equarx) > 0, "equarx rewrote the psum: {equarx}");
    assert!(!served_from_cache(&equarx), "the cache starts empty");

    let plain = compile(&dir, "plain", &[]);
    assert_eq!(
        s8(&plain),
        0,
        "a process that never imports equarx must not get the rewritten \
         executable from the persistent cache: {plain}"
    );
    assert!(!served_from_cache(&plain), "{plain}");

    // disable() gives the key of a process that never imported equarx:
    // the plain entry is served, the rewritten one is not.
    let disabled = compile(&dir, "enable-disable", &[]);
    assert_eq!(disabled["disable_returned"], true);
    assert_eq!(
        s8(&disabled),
        0,
        "after disable() the rewritten executable must not be served: {disabled}"
    );
    assert!(
        served_from_cache(&disabled),
        "disabled equarx shares the plain key: {disabled}"
    );
    assert_eq!(disabled["output_sum"], plain["output_sum"]);

    // Leaving `with enable(...)` is disable() when nothing was enabled
    // before: the plain key, the plain executable.
    let with_block = compile(&dir, "with-block", &[]);
    assert_eq!(with_block["enabled_inside"], true, "{with_block}");
    assert_eq!(with_block["enabled"], false, "{with_block}");
    assert_eq!(s8(&with_block), 0, "{with_block}");
    assert!(served_from_cache(&with_block), "{with_block}");
    assert_eq!(with_block["output_sum"], plain["output_sum"]);

    // Leaving a nested `with enable(other options)` restores the outer
    // registration and its key exactly: the executable compiled in that
    // state before is served.
    let restored = compile(&dir, "with-restores", &[]);
    assert_eq!(
        restored["options_inside"]["pipeline_depth"], 1,
        "{restored}"
    );
    assert_eq!(restored["options_after"]["pipeline_depth"], 2, "{restored}");
    assert!(
        served_from_cache(&restored),
        "the restored state has the key it had: {restored}"
    );
    assert_eq!(s8(&restored), s8(&equarx), "{restored} vs {equarx}");
    assert_eq!(restored["output_sum"], equarx["output_sum"]);
}

#[test]
fn in_memory_caches_follow_enable_option_changes_and_disable() {
    let r = run(&["in-process"]);
    let steps = r["steps"].as_array().expect("steps");
    let by_name = |name: &str| {
        steps
            .iter()
            .find(|s| s["step"] == name)
            .unwrap_or_else(|| panic!("no step {name} in {r}"))
    };
    let (plain, enabled, depth1, disabled) = (
        by_name("plain"),
        by_name("enabled"),
        by_name("pipeline_depth=1"),
        by_name("disabled"),
    );
    for s in steps {
        assert_eq!(
            s["call_matches_compile"], true,
            "calling the jitted function runs the executable of the current state: {s}"
        );
    }
    assert_eq!(s8(plain), 0);
    assert!(
        s8(enabled) > 0,
        "a function jitted before enable() is compiled again with equarx: {enabled}"
    );
    assert_ne!(enabled["call_sum"], plain["call_sum"], "{r}");
    assert!(
        s8(depth1) > 0 && s8(depth1) < s8(enabled),
        "enable() with other options recompiles: {depth1} vs {enabled}"
    );
    assert_eq!(
        s8(disabled),
        0,
        "disable() drops the rewritten executables: {disabled}"
    );
    assert_eq!(disabled["call_sum"], plain["call_sum"]);

    // `with enable(...)`: the block compiles with equarx, a nested block
    // with its options, and each exit (an exception included) compiles in
    // the state from before again, under the same cache key.
    let (with, nested, after_nested, after) = (
        by_name("with"),
        by_name("nested with"),
        by_name("after nested with"),
        by_name("after with"),
    );
    assert_eq!(s8(with), s8(enabled), "{r}");
    assert_eq!(with["call_sum"], enabled["call_sum"], "{r}");
    assert_eq!(s8(nested), s8(depth1), "{r}");
    assert_eq!(s8(after_nested), s8(enabled), "{r}");
    assert_eq!(after_nested["call_sum"], enabled["call_sum"], "{r}");
    assert_eq!(s8(after), 0, "{r}");
    assert_eq!(after["call_sum"], plain["call_sum"], "{r}");
    for (what, equal) in r["key_parts_equal"].as_object().expect("key_parts_equal") {
        assert_eq!(equal, true, "{what}: {r}");
    }
    assert_eq!(r["enabled_after_with"], Value::Null, "{r}");
}

#[test]
fn a_lost_cache_key_hook_is_refused_not_ignored() {
    let dir = common::scratch("jax_cache_guards");
    let r = run(&["guards", dir.to_str().expect("utf-8 path")]);
    let replaced = r["hook_replaced"]["message"].as_str().unwrap_or("");
    assert!(
        replaced.contains("missing from JAX's persistent compilation cache key"),
        "a compile with equarx's part gone from the key must fail: {r}"
    );
    assert!(
        r["hook_restored_s8"].as_u64().unwrap_or(0) > 0,
        "with the hook back the compile works and is rewritten: {r}"
    );
    let moved = r["hook_moved"]["message"].as_str().unwrap_or("");
    assert!(
        moved.contains("no longer hashes") && moved.contains("jax_enable_compilation_cache"),
        "enable() refuses a jax whose cache key ignores the hook, and says how to go on: {r}"
    );
    assert_eq!(r["hook_moved"]["type"], "EquarxError", "{r}");
    assert_eq!(r["enabled_after_refusal"], false, "{r}");
    assert_eq!(
        r["hook_moved_cache_off"],
        Value::Null,
        "without the persistent cache there is nothing to key: {r}"
    );
    assert!(
        r["cache_off_s8"].as_u64().unwrap_or(0) > 0,
        "and the rewrite runs: {r}"
    );
}
