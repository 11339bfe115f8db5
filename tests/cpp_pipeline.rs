//! The C++ door against real XLA: `cpp_shim/equarx_pass.cc` (an
//! `xla::HloModulePass` calling equarx through the cxx bridge) runs inside
//! an `xla::HloPassPipeline` with `xla::HloVerifier` as invariant checker,
//! over the fixtures. Every option of equarx's one list (`core/src/options/schema.rs`)
//! goes through `EquarxPassOptions::Set` too: its example is accepted, its
//! refused value and an unknown name fail the pipeline (and `Check()`) with
//! the library's own message.
//!
//! XLA comes from the tensorflow-cpu 2.21.0 wheel (its C++ headers and
//! `libtensorflow_cc.so.2`), fetched and unpacked under `target/` by
//! `scripts/tf-wheel`. The two C++ translation units take ~30 s each to
//! compile; their objects are cached under `target/cpp-shim-cache/`, keyed
//! by the sources, the generated bridge header, the compiler and the flags.
//! The link against this build's `libequarx.a` is redone when that changes.

mod doors;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `scripts/tf-wheel`: the unpacked `tensorflow/` directory.
fn tf_dir() -> PathBuf {
    let out = Command::new(repo().join("scripts/tf-wheel"))
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run scripts/tf-wheel: {e}"));
    assert!(
        out.status.success(),
        "scripts/tf-wheel failed (see its message above): this test needs XLA's C++ headers and \
         libtensorflow_cc from the tensorflow-cpu 2.21.0 wheel on PyPI; give it network access \
         to PyPI, or set EQUARX_TF_WHEEL to a downloaded wheel or EQUARX_TF_DIR to an unpacked one"
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

const CXX_FLAGS: &[&str] = &[
    "-std=c++17",
    "-D_GLIBCXX_USE_CXX11_ABI=1",
    "-DEIGEN_MAX_ALIGN_BYTES=64",
    "-O0",
    "-Wall",
    "-Wno-deprecated-declarations",
    "-Wno-sign-compare",
];

fn cxx() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".into())
}

fn compiler_version(cxx: &str) -> String {
    let out = doors::run(Command::new(cxx).arg("--version"), "the C++ compiler");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn include_flags(tf: &Path) -> Vec<String> {
    let inc = tf.join("include");
    [
        inc.clone(),
        inc.join("external/highwayhash"),
        inc.join("external/farmhash_archive/src"),
        doors::cxxbridge_include(),
        repo().join("cpp_shim"),
    ]
    .iter()
    .map(|d| format!("-I{}", d.display()))
    .collect()
}

/// Compiles the two translation units (in parallel), or takes them from the
/// cache. Returns the object files.
fn objects(tf: &Path) -> Vec<PathBuf> {
    let sources = [
        repo().join("cpp_shim/equarx_pass.cc"),
        repo().join("cpp_shim/tests/pipeline_test.cc"),
    ];
    let bridge_h = doors::cxxbridge_include().join("equarx/src/ffi/bridge.rs.h");
    let cxx_h = doors::cxxbridge_include().join("rust/cxx.h");
    let header = repo().join("cpp_shim/equarx_pass.h");
    let cxx = cxx();
    let version = compiler_version(&cxx);
    let flags = CXX_FLAGS.join(" ");
    let tf_marker = tf.join("include/xla/hlo/ir/hlo_module.h");
    let key = doors::content_hash(
        &[
            &sources[0],
            &sources[1],
            &header,
            &bridge_h,
            &cxx_h,
            &tf_marker,
        ],
        &[&version, &flags],
    );
    let dir = repo().join("target/cpp-shim-cache").join(&key);
    let objs: Vec<PathBuf> = sources
        .iter()
        .map(|s| dir.join(s.file_stem().unwrap()).with_extension("o"))
        .collect();
    if objs.iter().all(|o| o.is_file()) {
        println!("C++ objects from the cache: {}", dir.display());
        return objs;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let started = std::time::Instant::now();
    let jobs: Vec<(Child, PathBuf, PathBuf, Command)> = sources
        .iter()
        .zip(&objs)
        .map(|(src, obj)| {
            let tmp = obj.with_extension(format!("o.tmp{}", std::process::id()));
            let mut cmd = Command::new(&cxx);
            cmd.args(CXX_FLAGS)
                .args(include_flags(tf))
                .arg("-c")
                .arg(src)
                .arg("-o")
                .arg(&tmp)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let child = cmd.spawn().unwrap_or_else(|e| {
                panic!("cannot run {cxx} (set CXX to use another compiler): {e}")
            });
            (child, tmp, obj.clone(), cmd)
        })
        .collect();
    for (child, tmp, obj, cmd) in jobs {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "compiling against XLA's headers failed:\n$ {cmd:?}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &obj).unwrap();
    }
    println!(
        "compiled cpp_shim against XLA's headers in {:.0?} (cached in {})",
        started.elapsed(),
        dir.display()
    );
    objs
}

/// Links the test program against `libequarx.a` and XLA; relinks only when
/// the objects or the library changed.
fn link(tf: &Path, objs: &[PathBuf]) -> PathBuf {
    let lib = doors::staticlib();
    let meta = std::fs::metadata(&lib).unwrap();
    let stamp = format!("{:?} {} {:?}", objs, meta.len(), meta.modified().ok());
    let dir = repo().join("target/test-scratch/cpp_pipeline");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("pipeline_test");
    let stamp_file = dir.join("pipeline_test.stamp");
    if exe.is_file() && std::fs::read_to_string(&stamp_file).ok().as_deref() == Some(&stamp) {
        return exe;
    }
    let started = std::time::Instant::now();
    let _ = std::fs::remove_file(&stamp_file);
    let mut cmd = Command::new(cxx());
    // gold links the 150 MB debug libequarx.a in a third of GNU ld's time.
    let gold = Command::new("ld.gold")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if gold {
        cmd.arg("-fuse-ld=gold");
    }
    cmd.args(objs)
        .arg(&lib)
        .arg(format!("-L{}", tf.display()))
        .arg("-l:libtensorflow_cc.so.2")
        .arg("-l:libtensorflow_framework.so.2")
        .arg(format!("-Wl,-rpath,{}", tf.display()))
        .args(["-lpthread", "-ldl", "-lm"])
        .arg("-o")
        .arg(&exe);
    doors::run(&mut cmd, "linking the C++ pipeline test");
    std::fs::write(&stamp_file, stamp).unwrap();
    println!("linked in {:.0?}", started.elapsed());
    exe
}

struct Case {
    fixture: &'static str,
    expect: &'static str,
    /// `NAME=VALUE;...`, handed to `EquarxPassOptions::Set` as they are.
    options: String,
    /// For `error`: the message equarx's status must carry.
    message: Option<String>,
}

fn case(fixture: &'static str, expect: &'static str, options: &str) -> Case {
    Case {
        fixture,
        expect,
        options: options.to_string(),
        message: None,
    }
}

fn cases() -> Vec<Case> {
    let mut v = vec![
        // The eligible modules the issue names, with the small-payload options.
        case(
            "psum_bf16_p8.pb",
            "changed",
            "min_payload_bytes=0;pipeline_depth=1",
        ),
        case(
            "tp_block_spmd.pb",
            "changed",
            "min_payload_bytes=0;pipeline_depth=1",
        ),
        // Other group encodings and placements.
        case(
            "tp_block_shmap_spmd.pb",
            "changed",
            "min_payload_bytes=0;pipeline_depth=4;block_size=64",
        ),
        case("scan_psum.pb", "changed", "min_payload_bytes=0"),
        case(
            "mesh_axes_bf16_2x4.pb",
            "changed",
            "min_payload_bytes=0;bidirectional=true",
        ),
        case(
            "psum_bf16_2x4_strided.pb",
            "changed",
            "min_payload_bytes=0;gather=permute",
        ),
        // Scheduled, fused modules after XLA:CPU's optimizations (f32 promoted).
        case(
            "tp_block_after_opt.pb",
            "changed",
            "min_payload_bytes=0;types=bf16,f32",
        ),
        case(
            "psum_tuple_p8.pb",
            "changed",
            "min_payload_bytes=0;types=bf16,f32",
        ),
        // Every algorithm and form in the real pipeline, on a plain module
        // and on the scheduled, fused one (the pre-scheduler position).
        case(
            "psum_bf16_p8.pb",
            "changed",
            "min_payload_bytes=0;algorithm=ring;rotation=hadamard",
        ),
        case(
            "psum_bf16_p8.pb",
            "changed",
            "min_payload_bytes=0;algorithm=two-level;gather=permute",
        ),
        case(
            "psum_bf16_p8.pb",
            "changed",
            "min_payload_bytes=0;algorithm=ring;unroll=true",
        ),
        case(
            "tp_block_after_opt.pb",
            "changed",
            "min_payload_bytes=0;types=bf16,f32;algorithm=ring;rotation=hadamard",
        ),
        case(
            "tp_block_after_opt.pb",
            "changed",
            "min_payload_bytes=0;types=bf16,f32;algorithm=two-shot",
        ),
        case(
            "tp_block_after_opt.pb",
            "changed",
            "min_payload_bytes=0;types=bf16,f32;algorithm=two-level;gather=permute",
        ),
        // The other code formats, plain and fused.
        case(
            "psum_bf16_p8.pb",
            "changed",
            "min_payload_bytes=0;quant_format=fp8-e4m3",
        ),
        case(
            "tp_block_after_opt.pb",
            "changed",
            "min_payload_bytes=0;types=bf16,f32;quant_format=int4;algorithm=ring;rotation=hadamard",
        ),
        case(
            "sp_mlp/sp_mlp.pb",
            "changed",
            "min_payload_bytes=0;quant_format=fp8-e5m2",
        ),
        // Sequence parallelism: an all-gather and a reduce-scatter, no
        // all-reduce.
        case("sp_mlp/sp_mlp.pb", "changed", "min_payload_bytes=0"),
        case(
            "sp_mlp/sp_mlp.pb",
            "changed",
            "min_payload_bytes=0;algorithm=ring;rotation=none",
        ),
        // Negative twins: an f32 all-reduce with only bf16 enabled, a payload
        // the cost model does not find worth it, and options the pass refuses.
        case(
            "psum_f32_p8.pb",
            "unchanged",
            "min_payload_bytes=0;types=bf16",
        ),
        case("psum_bf16_p8.pb", "unchanged", ""),
        Case {
            message: Some("block size must be in 1..=".into()),
            ..case("psum_bf16_p8.pb", "error", "block_size=0")
        },
    ];
    // Every option of equarx's one list (core/src/options/schema.rs): its example is
    // accepted, its refused value fails the pipeline with the message the
    // library gives, and so does a name that is no option.
    let library_error = |name: &str, value: &str| {
        equarx::options::from_pairs([(name, value)]).expect_err("refused by the library")
    };
    for o in equarx::options::OPTIONS {
        // A threshold of 0 makes the cost model's verdict irrelevant.
        let base = if o.name == "min_payload_bytes" {
            ""
        } else {
            "min_payload_bytes=0;"
        };
        v.push(case(
            "psum_bf16_p8.pb",
            "ok",
            &format!("{base}{}={}", o.name, o.example),
        ));
        if let Some((value, _)) = o.refused {
            v.push(Case {
                message: Some(library_error(o.name, value)),
                ..case("psum_bf16_p8.pb", "error", &format!("{}={value}", o.name))
            });
        }
    }
    let every: Vec<String> = equarx::options::OPTIONS
        .iter()
        .map(|o| format!("{}={}", o.name, o.example))
        .collect();
    v.push(case("psum_bf16_p8.pb", "ok", &every.join(";")));
    v.push(Case {
        message: Some(library_error("blok_size", "64")),
        ..case("psum_bf16_p8.pb", "error", "blok_size=64")
    });
    v
}

#[test]
fn equarx_pass_runs_in_a_real_xla_pipeline() {
    let tf = tf_dir();
    let objs = objects(&tf);
    let exe = link(&tf, &objs);
    let fixtures = repo().join("tests/fixtures");
    let cases = cases();
    let args: Vec<String> = cases
        .iter()
        .map(|c| {
            format!(
                "{}|{}|{}",
                fixtures.join(c.fixture).display(),
                c.expect,
                c.options
            )
        })
        .collect();
    let out = Command::new(&exe)
        .args(&args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let results: Vec<Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad result line {l}: {e}")))
        .collect();
    assert_eq!(
        results.len(),
        cases.len(),
        "one result per case (exit {:?}):\n{stdout}\n{stderr}",
        out.status
    );
    let mut failures = Vec::new();
    for (case, r) in cases.iter().zip(&results) {
        let summary = format!(
            "{:<28} {:<9} {:<32} changed={} verifier={} s8-collectives={} whiles={} all-reduces {}->{} schedule={} {}",
            case.fixture,
            case.expect,
            case.options,
            r["changed"],
            r["verifier"],
            r["s8_collectives"],
            r["whiles"],
            r["all_reduces_before"],
            r["all_reduces_after"],
            r["schedule_after"],
            r["status"].as_str().unwrap_or("")
        );
        println!("{summary}");
        if r["ok"] != Value::Bool(true) {
            failures.push(format!("{summary}: {}", r["problem"]));
        }
        if let Some(message) = &case.message {
            let status = r["status"].as_str().unwrap_or("");
            if !status.contains(message.as_str()) {
                failures.push(format!(
                    "{summary}: the status lacks equarx's message {message:?}"
                ));
            }
            // Check() answers as Run does.
            let check = r["check"].as_str().unwrap_or("");
            if !check.contains(message.as_str()) {
                failures.push(format!(
                    "{summary}: Check() said {check:?}, not {message:?}"
                ));
            }
        } else if r["check"] != Value::String("ok".into()) {
            failures.push(format!("{summary}: Check() refused: {}", r["check"]));
        }
        if case.expect == "changed" {
            assert_eq!(r["config_kept"], Value::Bool(true), "{summary}");
            let report = r["report"].as_array().expect("a report");
            assert!(
                report.iter().any(|e| e["rewritten"] == Value::Bool(true)),
                "{summary}"
            );
        }
    }
    assert!(
        failures.is_empty(),
        "cases that missed their expectation:\n{}\n--- stderr\n{stderr}",
        failures.join("\n")
    );
    assert!(out.status.success(), "exit {:?}\n{stderr}", out.status);
}
