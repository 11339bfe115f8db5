//! Shared test plumbing: fixtures, the pinned Python environment, and
//! batches of jobs for real XLA (`tests/xla/xla_tool.py`).
//!
//! Real XLA is the judge: these helpers never stand in for it. When the
//! Python environment cannot be made, the test fails and says how to fix it.

#![allow(dead_code)]

pub mod inputs;
pub mod layouts;
pub mod modules;
pub mod normalize;
pub mod random_modules;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixtures_dir() -> PathBuf {
    repo().join("tests/fixtures")
}

pub fn fixture(name: &str) -> Vec<u8> {
    let p = fixtures_dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("cannot read fixture {}: {e}", p.display()))
}

/// `tests/fixtures/manifest.json`.
pub fn manifest() -> Value {
    serde_json::from_slice(&fixture("manifest.json")).expect("manifest.json is JSON")
}

/// Every binary module file among the fixtures (top level and `dumps/`).
pub fn fixture_protos() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for dir in [
        fixtures_dir(),
        fixtures_dir().join("dumps"),
        fixtures_dir().join("frames"),
    ] {
        for e in std::fs::read_dir(&dir).expect("fixtures dir") {
            let p = e.expect("dir entry").path();
            if p.extension().is_some_and(|x| x == "pb") {
                v.push(p);
            }
        }
    }
    v.sort();
    assert!(
        v.len() >= 15,
        "expected the fixture set, found {} files",
        v.len()
    );
    v
}

/// A `<!-- run by: TEST, TEST, from FILE -->` line: the tests
/// (`tests/cli.rs::readme_cli`) and the files they take the block from.
pub fn run_by(line: &str) -> Option<(Vec<&str>, Vec<&str>)> {
    let inner = line
        .trim()
        .strip_prefix("<!-- run by:")?
        .strip_suffix("-->")?;
    let (mut tests, mut from) = (Vec::new(), Vec::new());
    for item in inner.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match item.strip_prefix("from ") {
            Some(file) => from.push(file.trim()),
            None => tests.push(item),
        }
    }
    Some((tests, from))
}

/// The bodies of the fenced code blocks that follow a marker
/// `<!-- run by: ... -->` naming `test` (`tests/cli.rs::readme_cli`) in the
/// doc at `doc` (a repository path), in the doc's order. Tests that run a
/// doc's snippet read it from the doc through this, so the doc and the
/// test cannot drift; `tests/docs.rs` checks that every block is run so,
/// or says why not.
pub fn doc_blocks(doc: &str, test: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo().join(doc))
        .unwrap_or_else(|e| panic!("cannot read {doc}: {e}"));
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if !run_by(l).is_some_and(|(tests, _)| tests.contains(&test)) {
            continue;
        }
        let mut rest = lines[i + 1..].iter().skip_while(|l| l.trim().is_empty());
        let fence = rest.next().copied().unwrap_or_default();
        assert!(
            fence.starts_with("```"),
            "{doc}: the line after a marker for {test} opens no code block"
        );
        let body: String = rest
            .take_while(|l| !l.starts_with("```"))
            .map(|l| format!("{l}\n"))
            .collect();
        blocks.push(body);
    }
    assert!(
        !blocks.is_empty(),
        "{doc} has no `<!-- run by: {test} -->` marker"
    );
    blocks
}

/// The one block [`doc_blocks`] finds for `test`.
pub fn doc_block(doc: &str, test: &str) -> String {
    let mut blocks = doc_blocks(doc, test);
    assert_eq!(blocks.len(), 1, "{doc}: one block marked for {test}");
    blocks.remove(0)
}

/// A pinned Python venv that `scripts/pyenv` makes on first use.
#[derive(Clone, Copy)]
pub enum Venv {
    /// `target/pyenv`: jax and jaxlib, so XLA:CPU.
    Xla,
    /// `target/compilers`: libtpu and XLA:GPU, deviceless.
    Compilers,
}

impl Venv {
    fn arg(self) -> Option<&'static str> {
        match self {
            Venv::Xla => None,
            Venv::Compilers => Some("compilers"),
        }
    }

    fn what(self) -> &'static str {
        match self {
            Venv::Xla => "python/requirements.txt from PyPI into target/pyenv",
            Venv::Compilers => {
                "python/compilers.txt, pinned by SHA-256, from PyPI into target/compilers (~525 MB)"
            }
        }
    }
}

/// The venv's python, or a message that says how it failed and what
/// `scripts/pyenv` needs.
pub fn venv(v: Venv) -> Result<PathBuf, String> {
    static PY: [OnceLock<Result<PathBuf, String>>; 2] = [OnceLock::new(), OnceLock::new()];
    PY[v as usize]
        .get_or_init(|| {
            let script = repo().join("scripts/pyenv");
            let out = Command::new(&script)
                .args(v.arg())
                .output()
                .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "scripts/pyenv{} failed (it installs {}; needs python3 with venv and \
                     network access to PyPI):\n{}",
                    v.arg().map(|a| format!(" {a}")).unwrap_or_default(),
                    v.what(),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
            Ok(PathBuf::from(path))
        })
        .clone()
}

/// The XLA:CPU venv's python; panics with `venv`'s message when it cannot
/// be made.
pub fn python() -> PathBuf {
    venv(Venv::Xla).unwrap_or_else(|e| panic!("{e}"))
}

/// A scratch directory under `target/` (kept for post-mortems, cleaned on
/// the next run of the same test).
pub fn scratch(name: &str) -> PathBuf {
    let d = repo().join("target/test-scratch").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}

/// Runs `jobs` through real XLA in one process; one result per job.
pub fn run_xla(dir: &Path, jobs: &[Value]) -> Vec<Value> {
    let jobs_path = dir.join("jobs.json");
    let results_path = dir.join("results.json");
    std::fs::write(&jobs_path, serde_json::to_vec_pretty(jobs).unwrap()).unwrap();
    let out = Command::new(python())
        .arg(repo().join("tests/xla/xla_tool.py"))
        .arg(&jobs_path)
        .arg(&results_path)
        .current_dir(dir)
        .output()
        .expect("run xla_tool.py");
    let results: Vec<Value> = std::fs::read(&results_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| {
            panic!(
                "xla_tool.py wrote no results (exit {:?}):\n{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert_eq!(results.len(), jobs.len(), "one result per job");
    results
}

/// Runs a door script (`tests/SCRIPT`) once over all `jobs`, with the
/// Python package and `lib` (libequarx.so): `SCRIPT [ARGS..] JOBS RESULTS`.
/// One answer per job, or a panic with the script's stderr.
pub fn run_python_door(
    dir: &Path,
    script: &str,
    args: &[PathBuf],
    lib: &Path,
    jobs: &[Value],
) -> Vec<Value> {
    let jobs_path = dir.join("python_jobs.json");
    std::fs::write(&jobs_path, serde_json::to_vec(jobs).unwrap()).unwrap();
    let results = dir.join("python_results.json");
    let out = Command::new(python())
        .arg(repo().join("tests").join(script))
        .args(args)
        .arg(&jobs_path)
        .arg(&results)
        .env("PYTHONPATH", repo().join("python"))
        .env("EQUARX_LIB", lib)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tests/{script} died ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<Value> = serde_json::from_slice(&std::fs::read(&results).unwrap()).unwrap();
    assert_eq!(
        answers.len(),
        jobs.len(),
        "tests/{script}: one answer per job"
    );
    answers
}

/// The `equarx` binary built for this test run.
pub fn equarx() -> Command {
    Command::new(env!("CARGO_BIN_EXE_equarx"))
}

/// Little-endian bytes of bf16 values.
pub fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes())
        .collect()
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Reads an output file of `dtype` as f32 values.
pub fn read_values(path: &Path, dtype: &str) -> Vec<f32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match dtype {
        "bf16" => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        "f32" => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        other => panic!("read_values: unsupported dtype {other}"),
    }
}

/// The seeded generator the simulator uses, so tests and simulator draw alike.
#[allow(unused_imports)] // not every test crate draws numbers
pub use equarx::numerics::simulate::Rng;

/// κ² of blocks of 128 products of two standard Gaussians (numpy, 20 000
/// blocks): the all-reduce inputs of a matmul-heavy program have about this
/// crest factor, more than Gaussian data (8.2).
pub const PRODUCT_CREST_SQ: f64 = 20.5;

/// The error bound for a program with `chain` all-reduces over groups of
/// `p` in a row: each within the model for matmul partials, the errors
/// adding at most linearly.
pub fn chained_bound(chain: f64, p: usize) -> f64 {
    chain * equarx::numerics::error::ring_rel_rms(p, PRODUCT_CREST_SQ)
}

/// Writes every device's inputs (per parameter: type, dims) under `dir`;
/// the job's `inputs` field.
pub fn write_inputs(dir: &Path, params: &[(String, Vec<i64>)], values: &[Vec<Vec<f32>>]) -> Value {
    let devices: Vec<Value> = values
        .iter()
        .enumerate()
        .map(|(d, per_param)| {
            let entries: Vec<Value> = per_param
                .iter()
                .enumerate()
                .map(|(k, v)| {
                    let (ty, dims) = &params[k];
                    let path = dir.join(format!("dev{d}_in{k}.bin"));
                    let bytes = if ty == "bf16" {
                        bf16_bytes(v)
                    } else {
                        f32_bytes(v)
                    };
                    std::fs::write(&path, bytes).unwrap();
                    serde_json::json!({"path": path, "dtype": ty, "shape": dims})
                })
                .collect();
            Value::Array(entries)
        })
        .collect();
    Value::Array(devices)
}

/// Outputs of a run: per device, per output, f32 values.
pub fn outputs(result: &Value, dir: &Path, devices: usize) -> Vec<Vec<Vec<f32>>> {
    assert_eq!(result["ok"], true, "run failed: {}", result["error"]);
    let outs = result["outputs"].as_array().unwrap();
    (0..devices)
        .map(|d| {
            outs.iter()
                .enumerate()
                .map(|(k, o)| {
                    read_values(
                        &dir.join(format!("dev{d}_out{k}.bin")),
                        o["dtype"].as_str().unwrap(),
                    )
                })
                .collect()
        })
        .collect()
}

/// Relative RMS error of `got` against `want`.
pub fn rel_rms(got: &[f32], want: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (&g, &w) in got.iter().zip(want) {
        num += (f64::from(g) - w).powi(2);
        den += w * w;
    }
    (num / den).sqrt()
}

/// The seed of a property test's random cases: fixed, so CI draws the same
/// cases every run (a failure found elsewhere is replayed from the
/// `*.proptest-regressions` file beside the test); `PROPTEST_RNG_SEED`
/// draws others, as `scripts/property-campaign` does, which records what
/// it ran.
pub fn property_seed(fixed: u64) -> proptest::test_runner::RngSeed {
    let seed = std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(fixed);
    proptest::test_runner::RngSeed::Fixed(seed)
}
