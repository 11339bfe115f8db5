//! The real target compilers, deviceless: XLA:TPU (libtpu 0.0.42.1) and
//! XLA:GPU (jax-cuda12-plugin 0.10.2 with `tests/compilers/h100.txtpb`),
//! from the venv `scripts/pyenv compilers` makes on first use (pinned by
//! version and SHA-256, `python/compilers.txt`).
//!
//! Two kinds of test, one per case or plan and compiler:
//!
//! - `CASE[::VARIANT][::hlo]@TOPOLOGY`: every case file (`tests/cases/*.hlo`)
//!   compiles as the program, with equarx registered at the compiler's
//!   pre-scheduler hook (`equarx_pjrt_register` on the plugin's own
//!   `GetPjrtApi()`), the test's options configured: the default kernels
//!   (on XLA:TPU equarx's own Mosaic kernels where they take an op), and
//!   `::hlo` with `kernels=hlo` on the case's first TPU topology. Each test
//!   compiles on the case's first TPU generation and the GPU, and on one of
//!   the other TPU generations of its size, which take turns
//!   (`EQUARX_COMPILERS_EVERY_GENERATION=1`: on all of them). The compile must
//!   succeed (a process abort is reported as such, with the compiler's last
//!   words). A case that expects a rewrite must be rewritten there and its
//!   compiled module must carry quantized codes on the wire; a negative twin
//!   must stay unrewritten. XLA:GPU's hook comes before fusion, XLA:TPU's
//!   after tiling assignment, where the rotation's product is the fused
//!   convolution libtpu makes of a dot. A case the compilers cannot take
//!   says so in its header (`compilers: ... no: WHY`).
//! - `sample::N@TOPOLOGY`: random modules from the property tests'
//!   generator (fixed seed; 4 or 8 devices), each at the hook of h100 and
//!   v5e with its random options: it compiles exactly when the same module
//!   does with equarx disabled (the compiler may refuse a random module
//!   itself, an f64 one on TPU say, and equarx must not change that), and
//!   what equarx rewrites carries quantized codes on the wire.
//! - `kernel_sample::N@TOPOLOGY`: random modules of the same modes, layouts,
//!   encodings and options, shaped for equarx's own kernels (one bf16
//!   all-reduce, a two-shot of int8 blocks of 64): as `sample::`, and the
//!   op must take XLA:GPU's Triton or XLA:TPU's Mosaic kernels.
//! - `before_xla::PLAN@TOPOLOGY`: a `shard_map` psum lowered by JAX and
//!   rewritten before XLA by `equarx.jax.rewrite_lowered`, for every
//!   algorithm, rotation and format, on v5e:2x2 and h100 x4: it compiles,
//!   with the plan asked for and s8 on the wire, and no workaround.
//!   With `kernels=mosaic` on v5e:2x2, two-shot's steps are equarx's own
//!   Mosaic kernels, and the plan must say so.
//! - `hook::PLAN@TOPOLOGY`: the same `kernels=mosaic` psums through
//!   XLA:TPU's pre-scheduler hook, past its layout assignment, where every
//!   array of the kernels carries libtpu's tiles; the kernels' all-gathers
//!   and reduce-scatters at both doors too, and the all-gather at the hook
//!   of 64 chips.
//! - `kernels::PLAN@P=N`: those kernels' text run on the host by
//!   `tests/compilers/mosaic.py` (`bench/compile/kernel_probe.py --check`),
//!   bit for bit against equarx's HLO emission of the same plan for XLA:TPU
//!   on XLA:CPU, its twin.
//! - `bench::libtpu_floor`: `bench/compile/libtpu_floor.py` (libtpu's own
//!   fusion of the quantized two-shot, written in JAX) runs and compiles.
//!
//! Each topology's jobs run in one process (`tests/compilers/compile.py`;
//! one registration per process), and their answers are kept under
//! `target/compilers-results/`, keyed by the SHA-256 of everything they
//! depend on (the jobs, the library, the tool, the pins). nextest runs every
//! test in a process of its own: the first to need a topology runs its batch
//! under a file lock, the rest read the answers.

#[path = "common/mod.rs"]
mod common;
#[path = "doors/mod.rs"]
mod doors;
#[path = "filetests/header.rs"]
mod header;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use header::Expect;

/// The TPU topologies a case of `n` devices compiles on.
fn tpu_topologies(n: usize) -> &'static [&'static str] {
    match n {
        4 => &["v5e:2x2", "v5p:2x2x1", "v6e:2x2"],
        8 => &["v5e:2x4", "v5p:2x2x2", "v6e:2x4"],
        _ => &[],
    }
}

/// The GPU topology of `n` devices: one host of H100s.
fn gpu_topology(n: usize) -> Option<String> {
    matches!(n, 2 | 4 | 8).then(|| format!("h100x{n}"))
}

fn platform(topology: &str) -> &'static str {
    if topology.starts_with("h100") {
        "gpu"
    } else {
        "tpu"
    }
}

/// Element types that carry quantized codes and scales.
const QUANTIZED: &[&str] = &["s8", "u8", "f8e4m3fn", "f8e5m2"];

/// One compile: its name (the test's), what the tool is asked, and what
/// the answer must show.
struct Job {
    name: String,
    spec: Value,
    expect: Want,
}

#[derive(Clone)]
enum Want {
    /// Rewritten at the hook, quantized on the wire.
    Rewritten,
    /// Compiled, and no collective of the case's kinds (`opcodes`, those
    /// its text holds) rewritten, one of them left with a reason holding
    /// one of `reasons`. A compiler may make collectives of its own before its
    /// hook (XLA:TPU decomposes an all-reduce into an all-reduce and an
    /// all-gather); equarx may take those.
    Unchanged {
        reasons: Vec<String>,
        opcodes: Vec<&'static str>,
    },
    /// Not a test: the plain compile a [`Want::AsPlain`] job is judged
    /// against.
    Plain,
    /// Rewritten before XLA with this algorithm and rotation, for the
    /// platform the program was lowered for.
    Plan {
        algorithm: String,
        rotation: String,
        platform: &'static str,
        /// Who wrote the kernels (`hlo`, or `mosaic`: equarx's own).
        kernels: &'static str,
    },
    /// A random module: at the hook it compiles exactly when the plain
    /// compile (the named job, equarx disabled) does, and what equarx
    /// rewrites carries quantized codes on the wire.
    AsPlain(String),
    /// A random module shaped for equarx's own kernels: as
    /// [`Want::AsPlain`], and where the plain compile succeeds, equarx
    /// rewrote an op with the compiler's own kernels (Triton's on XLA:GPU,
    /// Mosaic's on XLA:TPU).
    OwnKernels(String),
}

impl Want {
    /// The plain compile a random module's job is judged against.
    fn plain_twin(&self) -> Option<&str> {
        match self {
            Want::AsPlain(plain) | Want::OwnKernels(plain) => Some(plain),
            _ => None,
        }
    }
}

/// Whether every test of a case compiles on every TPU generation of its
/// size (`EQUARX_COMPILERS_EVERY_GENERATION=1`: a longer run, recorded in
/// BENCHMARKS.md). By default the generations past a case's first take
/// turns: each test compiles on two TPU generations and the GPU, each
/// generation meets about as many tests, in half the compile time.
fn every_generation() -> bool {
    std::env::var_os("EQUARX_COMPILERS_EVERY_GENERATION").is_some_and(|v| v == "1")
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    let mut batches: HashMap<String, Vec<Job>> = HashMap::new();
    let every = every_generation();
    let mut turn = 0usize;
    let cases = common::repo().join("tests/cases");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&cases)
        .expect("tests/cases")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "hlo"))
        .collect();
    files.sort();
    for path in files {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).expect("read case");
        let h = match header::parse(&text) {
            Ok(h) => h,
            Err(e) => {
                trials.push(Trial::test(format!("{name}@header"), move || {
                    Err(Failed::from(format!("tests/cases/{name}.hlo: {e}")))
                }));
                continue;
            }
        };
        let (replicas, partitions) = h.devices;
        let n = replicas * partitions;
        let mut topologies: Vec<String> = Vec::new();
        if h.compilers.tpu_not.is_none() {
            if tpu_topologies(n).is_empty() {
                let msg = format!(
                    "tests/cases/{name}.hlo: no TPU topology has {n} chips here (a host holds 2x2); \
                     say so in its header: `// compilers: tpu no: WHY`"
                );
                trials.push(Trial::test(format!("{name}@tpu"), move || Err(msg.into())));
            }
            topologies.extend(tpu_topologies(n).iter().map(|t| t.to_string()));
        }
        if h.compilers.gpu_not.is_none() {
            match gpu_topology(n) {
                Some(t) => topologies.push(t),
                None => {
                    let msg = format!(
                        "tests/cases/{name}.hlo: no H100 node of {n} GPUs; say so in its header: \
                         `// compilers: gpu no: WHY`"
                    );
                    trials.push(Trial::test(format!("{name}@gpu"), move || Err(msg.into())));
                }
            }
        }
        // At a hook the stage is the compiler's and equarx reads it from
        // the module; a case's `stage` and `fuse` describe the case's own
        // text (an after-optimizations dump, or the tiled variants that
        // run XLA:TPU's forms on XLA:CPU). Without them a variant can be
        // another test of the file again, which compiles once.
        let mut seen = Vec::new();
        let tests: Vec<_> = h
            .tests
            .iter()
            .filter_map(|t| {
                let mut options = t.options.clone();
                options.remove("stage");
                options.remove("fuse");
                if seen.contains(&options) {
                    return None;
                }
                seen.push(options.clone());
                Some((t, options))
            })
            .collect();
        // The defaults' kernels (on XLA:TPU equarx's own Mosaic kernels
        // where they take an op, past libtpu's layout assignment; the HLO
        // emission elsewhere), and on the case's first TPU topology with
        // `kernels=hlo` too: never an abort either way. The first TPU
        // generation and the GPU take every test; the other TPU
        // generations take turns (`every_generation`).
        let first_tpu = topologies.iter().find(|t| !t.starts_with("h100")).cloned();
        let others: Vec<String> = topologies
            .iter()
            .filter(|t| !t.starts_with("h100") && Some(*t) != first_tpu.as_ref())
            .cloned()
            .collect();
        for (t, options) in &tests {
            let other = (!others.is_empty()).then(|| {
                turn += 1;
                &others[(turn - 1) % others.len()]
            });
            let runs = topologies
                .iter()
                .filter(|t| every || !others.contains(t) || other == Some(*t))
                .map(|t| (t, false))
                .chain(first_tpu.iter().map(|t| (t, true)));
            for (topology, hlo) in runs {
                let kernels = if hlo { "::hlo" } else { "" };
                let test = match &t.variant {
                    Some(v) => format!("{name}::{v}{kernels}@{topology}"),
                    None => format!("{name}{kernels}@{topology}"),
                };
                let mut options = options.clone();
                if hlo {
                    options.insert("kernels".into(), json!("hlo"));
                }
                let expect = match &t.expect {
                    Expect::Plan(_) => Want::Rewritten,
                    Expect::Unchanged(reason) => Want::Unchanged {
                        reasons: vec![reason.clone()],
                        opcodes: collective_kinds(&text),
                    },
                };
                batches.entry(topology.clone()).or_default().push(Job {
                    name: test,
                    spec: json!({
                        "module": path,
                        "replicas": replicas,
                        "partitions": partitions,
                        "door": "hook",
                        "options": options,
                    }),
                    expect,
                });
            }
        }
    }
    for topology in ["v5e:2x2", "h100x4"] {
        let jobs = batches.entry(topology.to_string()).or_default();
        for algorithm in ["ring", "two-shot"] {
            for rotation in ["none", "hadamard"] {
                for format in ["int8", "fp8-e4m3", "fp8-e5m2", "int4"] {
                    jobs.push(Job {
                        name: format!("before_xla::{algorithm}+{rotation}+{format}@{topology}"),
                        spec: json!({
                            "program": "psum", "devices": 4, "rows": 256, "cols": 1024,
                            "door": "before",
                            "options": {"min_payload_bytes": 0, "algorithm": algorithm,
                                        "rotation": rotation, "quant_format": format},
                        }),
                        // XLA:GPU's default: its Triton kernels, which
                        // take int8 two-shot (256 rows a device are not
                        // the Mosaic kernels' 128·P).
                        expect: Want::Plan {
                            algorithm: algorithm.to_string(),
                            rotation: rotation.to_string(),
                            platform: platform(topology),
                            kernels: if platform(topology) == "gpu"
                                && algorithm == "two-shot"
                                && format == "int8"
                            {
                                "triton"
                            } else {
                                "hlo"
                            },
                        },
                    });
                }
            }
        }
    }
    // equarx's own Mosaic kernels for XLA:TPU's two-shot (`emit/mosaic.rs`),
    // on every TPU generation the cases compile on.
    let mosaic = [
        ("v5e:2x2", 4, "none"),
        ("v5e:2x2", 4, "hadamard"),
        ("v5e:2x4", 8, "hadamard"),
        ("v5p:2x2x2", 8, "hadamard"),
        ("v6e:2x4", 8, "hadamard"),
    ];
    // 1024 columns are two of the kernels' groups; a row wider than 4096
    // (16 groups) takes them too.
    let wide = [("v5e:2x2", 4, "hadamard", "hook", "hook+wide")];
    for (topology, devices, rotation, door, prefix, cols) in mosaic
        .into_iter()
        .flat_map(|(t, d, r)| {
            [
                (t, d, r, "before", "before_xla", 1024),
                (t, d, r, "hook", "hook", 1024),
            ]
        })
        .chain(wide.map(|(t, d, r, door, prefix)| (t, d, r, door, prefix, 8192)))
    {
        batches.entry(topology.to_string()).or_default().push(Job {
            name: format!("{prefix}::two-shot+{rotation}+int8+mosaic@{topology}"),
            spec: json!({
                "program": "psum", "devices": devices, "rows": 128 * devices, "cols": cols,
                "door": door,
                "options": {"min_payload_bytes": 0, "algorithm": "two-shot",
                            "rotation": rotation, "quant_format": "int8", "kernels": "mosaic"},
            }),
            expect: Want::Plan {
                algorithm: "two-shot".to_string(),
                rotation: rotation.to_string(),
                platform: "tpu",
                kernels: "mosaic",
            },
        });
    }
    // Their all-gather (quantize, dequantize), which has no sum to unroll:
    // every generation, and 64 chips at the hook (where libtpu makes an
    // all-reduce of a small all-gather before the hook: 2 MiB a rank stays
    // an all-gather), and their reduce-scatter (quantize, sum): libtpu
    // keeps one of 1 MiB a device up to its hook (of 8 MiB it makes an
    // all-reduce inside a fusion there).
    let gathers = mosaic
        .iter()
        .flat_map(|&(t, d, r)| {
            [
                (t, d, r, "all-gather", 128, ["before", "hook"].as_slice()),
                (
                    t,
                    d,
                    r,
                    "reduce-scatter",
                    128 * d,
                    ["before", "hook"].as_slice(),
                ),
            ]
        })
        .chain([(
            "v5e:8x8",
            64,
            "hadamard",
            "all-gather",
            512,
            ["hook"].as_slice(),
        )]);
    for (topology, devices, rotation, collective, rows, doors) in gathers {
        for &door in doors {
            let prefix = if door == "hook" { "hook" } else { "before_xla" };
            let cols = if rows == 512 { 2048 } else { 1024 };
            let mut options = json!({"min_payload_bytes": 0, "rotation": rotation,
                                     "quant_format": "int8", "kernels": "mosaic"});
            let (program, planned) = match collective {
                "all-gather" => ("all_gather", "gather"),
                _ => {
                    options["algorithm"] = json!("two-shot");
                    ("reduce_scatter", "two-shot")
                }
            };
            batches.entry(topology.to_string()).or_default().push(Job {
                name: format!("{prefix}::{collective}+{rotation}+int8+mosaic@{topology}"),
                spec: json!({
                    "program": program, "devices": devices, "rows": rows, "cols": cols,
                    "door": door, "options": options,
                }),
                expect: Want::Plan {
                    algorithm: planned.to_string(),
                    rotation: rotation.to_string(),
                    platform: "tpu",
                    kernels: "mosaic",
                },
            });
        }
    }
    // equarx's own Triton kernels for XLA:GPU (`emit/triton.rs`): the
    // psum's two-shot, an all-gather and a reduce-scatter, through both
    // doors, h100 × 4, × 8 and × 16 (the sum kernel's most parts).
    let triton = [
        ("h100x4", 4, "none"),
        ("h100x4", 4, "hadamard"),
        ("h100x8", 8, "hadamard"),
        ("h100x16", 16, "hadamard"),
    ];
    for (topology, devices, rotation) in triton {
        for door in ["before", "hook"] {
            for (program, planned, rows) in [
                ("psum", "two-shot", 64 * devices),
                ("all_gather", "gather", 64),
                ("reduce_scatter", "two-shot", 64 * devices),
            ] {
                let prefix = if door == "hook" { "hook" } else { "before_xla" };
                let mut options = json!({"min_payload_bytes": 0, "rotation": rotation,
                                         "quant_format": "int8", "kernels": "triton"});
                if planned == "two-shot" {
                    options["algorithm"] = json!("two-shot");
                }
                batches.entry(topology.to_string()).or_default().push(Job {
                    name: format!("{prefix}::{program}+{rotation}+int8+triton@{topology}"),
                    spec: json!({
                        "program": program, "devices": devices, "rows": rows, "cols": 1024,
                        "door": door, "options": options,
                    }),
                    expect: Want::Plan {
                        algorithm: planned.to_string(),
                        rotation: rotation.to_string(),
                        platform: "gpu",
                        kernels: "triton",
                    },
                });
            }
        }
    }
    // equarx's own kernels' text run on the host against its HLO emission
    // for the same compiler, bit for bit. Mosaic: P = 3 carries an odd part
    // through the sum's halves, P = 8 adds three levels of them, 1024
    // columns are two groups of the grid. Triton: P = 6 carries an odd
    // part, P = 8 and 16 three and four levels.
    for (kind, collective, rotation, devices, shape) in [
        ("Mosaic", "psum", "hadamard", 4, "512,640"),
        ("Mosaic", "psum", "none", 4, "512,1024"),
        ("Mosaic", "psum", "hadamard", 3, "384,640"),
        ("Mosaic", "psum", "hadamard", 8, "1024,256"),
        ("Mosaic", "all-gather", "hadamard", 4, "128,640"),
        ("Mosaic", "all-gather", "none", 3, "256,256"),
        ("Mosaic", "all-gather", "hadamard", 8, "128,1024"),
        ("Mosaic", "reduce-scatter", "hadamard", 4, "512,640"),
        ("Mosaic", "reduce-scatter", "none", 3, "384,256"),
        ("Mosaic", "reduce-scatter", "hadamard", 8, "1024,1024"),
        ("Triton", "psum", "hadamard", 4, "256,640"),
        ("Triton", "psum", "none", 4, "256,640"),
        ("Triton", "psum", "hadamard", 6, "384,512"),
        ("Triton", "psum", "hadamard", 8, "256,1024"),
        ("Triton", "psum", "hadamard", 16, "128,128"),
        ("Triton", "all-gather", "hadamard", 4, "64,1024"),
        ("Triton", "all-gather", "none", 8, "64,512"),
        ("Triton", "reduce-scatter", "hadamard", 4, "256,640"),
        ("Triton", "reduce-scatter", "none", 6, "384,512"),
    ] {
        let triton = kind == "Triton";
        // (The Mosaic psum's checks are named by its algorithm.)
        let named = if triton || collective != "psum" {
            collective
        } else {
            "two-shot"
        };
        trials.push(Trial::test(
            format!(
                "kernels::{named}+{rotation}@P={devices} ({kind} text against equarx's emission)"
            ),
            move || {
                kernel_check(collective, rotation, devices, shape, triton).map_err(Failed::from)
            },
        ));
    }
    trials.push(Trial::test(
        "bench::libtpu_floor (libtpu's own fusion of the quantized two-shot)",
        || floor_check().map_err(Failed::from),
    ));
    sample_jobs(&mut batches);
    let mut batches: Vec<(String, Vec<Job>)> = batches.into_iter().collect();
    batches.sort_by(|a, b| a.0.cmp(&b.0));
    for (topology, jobs) in batches {
        let specs: Arc<Vec<Value>> = Arc::new(
            jobs.iter()
                .map(|j| {
                    let mut s = j.spec.clone();
                    s["name"] = json!(j.name);
                    s
                })
                .collect(),
        );
        let topology = Arc::new(topology);
        for job in jobs {
            if matches!(job.expect, Want::Plain) {
                continue;
            }
            let (specs, topology) = (specs.clone(), topology.clone());
            trials.push(Trial::test(job.name.clone(), move || {
                let answers = answers(&topology, &specs)?;
                let got = answers
                    .get(&job.name)
                    .ok_or_else(|| format!("{}: no answer in the batch", job.name))?;
                judge(&job, got, &answers).map_err(Failed::from)
            }));
        }
    }
    libtest_mimic::run(&args, trials).exit();
}

/// `bench/compile/kernel_probe.py --check`: the psum's three Mosaic
/// kernels, equarx's own (`kernels=mosaic`) and the probe's Pallas ones, as
/// the text libtpu compiles (run by `tests/compilers/mosaic.py`) and in
/// Pallas's interpreter (an all-gather's two: equarx's), bit for bit
/// against equarx's HLO emission of the same plan for XLA:TPU on P XLA:CPU
/// devices: the kernels' XLA:CPU twin. With `triton`, equarx's Triton
/// kernels (`kernels=triton`, run by `tests/compilers/triton.py`) against
/// its emission for XLA:GPU.
fn kernel_check(
    collective: &str,
    rotation: &str,
    devices: usize,
    shape: &str,
    triton: bool,
) -> Result<(), String> {
    let py = common::venv(common::Venv::Compilers)?;
    let repo = common::repo();
    let mut cmd = Command::new(&py);
    cmd.arg(repo.join("bench/compile/kernel_probe.py")).args([
        "--check",
        "--collective",
        collective,
        "--devices",
        &devices.to_string(),
        "--shape",
        shape,
    ]);
    if rotation == "none" {
        cmd.arg("--no-rotation");
    }
    if triton {
        cmd.arg("--triton");
    }
    let out = cmd
        .env("PYTHONPATH", repo.join("python"))
        .env("EQUARX_LIB", doors::cdylib())
        .output()
        .map_err(|e| format!("run kernel_probe.py: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let sides = if collective == "psum" && !triton {
        3
    } else {
        1
    };
    if out.status.success() && stdout.matches("differing bits 0 ").count() == sides {
        return Ok(());
    }
    Err(format!(
        "kernel_probe.py --check ({}):\n{stdout}\n{}",
        out.status,
        tail(&String::from_utf8_lossy(&out.stderr), 3000)
    ))
}

/// `bench/compile/libtpu_floor.py`, once over its psum and its quantized
/// two-shot: both compile in libtpu, the two-shot into fusions of its own
/// (the script's figures are BENCHMARKS.md's; this keeps it from rotting).
fn floor_check() -> Result<(), String> {
    let py = common::venv(common::Venv::Compilers)?;
    let repo = common::repo();
    let out = Command::new(&py)
        .arg(repo.join("bench/compile/libtpu_floor.py"))
        .args(["--variant", "psum", "--variant", "two-shot", "--runs", "1"])
        .output()
        .map_err(|e| format!("run libtpu_floor.py: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let fusions = |variant: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{variant} ")))
            .and_then(|l| l.split(", ").nth(1))
            .and_then(|f| f.split(' ').next())
            .and_then(|n| n.parse::<u32>().ok())
    };
    match (out.status.success(), fusions("psum"), fusions("two-shot")) {
        (true, Some(_), Some(n)) if n > 0 => Ok(()),
        _ => Err(format!(
            "libtpu_floor.py ({}):\n{stdout}\n{}",
            out.status,
            tail(&String::from_utf8_lossy(&out.stderr), 3000)
        )),
    }
}

/// Random modules of the property tests' generator (fixed seed), one per
/// test, each beside its plain compile: the suite's count.
/// `EQUARX_COMPILER_SAMPLES` sets another (`scripts/compiler-campaign`
/// runs a few hundred).
const SAMPLES: usize = 16;

/// The same for modules shaped for equarx's own kernels
/// (`EQUARX_COMPILER_KERNEL_SAMPLES`).
const KERNEL_SAMPLES: usize = 4;

fn count(variable: &str, default: usize) -> usize {
    match std::env::var(variable) {
        Err(_) => default,
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{variable}={v:?}: give a number of random modules")),
    }
}

/// `sample::N@TOPOLOGY` jobs: the first [`SAMPLES`] modules of 4 or 8
/// devices the property generator makes from a fixed seed, at the hook of
/// XLA:GPU (h100) and XLA:TPU (v5e), each with its options, and each beside
/// `sample::N@TOPOLOGY::plain`, the same module with equarx disabled. And
/// `kernel_sample::N@TOPOLOGY`: the first [`KERNEL_SAMPLES`] of its
/// generator of modules shaped for equarx's own kernels, which must take
/// them.
fn sample_jobs(batches: &mut HashMap<String, Vec<Job>>) {
    use common::random_modules::{case, kernel_case};
    let wanted = count("EQUARX_COMPILER_SAMPLES", SAMPLES);
    random_jobs(batches, "sample", case(), wanted, 26, Want::AsPlain);
    let wanted = count("EQUARX_COMPILER_KERNEL_SAMPLES", KERNEL_SAMPLES);
    random_jobs(
        batches,
        "kernel_sample",
        kernel_case(),
        wanted,
        27,
        Want::OwnKernels,
    );
}

/// The jobs of `wanted` modules of 4 or 8 devices that `strategy` draws
/// from the fixed `seed`, named `FAMILY::N@TOPOLOGY`, each judged by
/// `want` against its plain twin. The modules are kept in
/// `target/compilers-results/FAMILY/N.hlo`.
fn random_jobs(
    batches: &mut HashMap<String, Vec<Job>>,
    family: &str,
    strategy: impl proptest::strategy::Strategy<Value = common::random_modules::Case>,
    wanted: usize,
    seed: u8,
    want: fn(String) -> Want,
) {
    use common::random_modules::Encoding;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]),
    );
    let dir = results_dir().join(family);
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("create target/compilers-results/{family}: {e}"));
    let mut taken = 0;
    while taken < wanted {
        let c = strategy.new_tree(&mut runner).unwrap().current();
        let n = c.devices();
        // Mesh-axes groups need a Shardy mesh a bare module lacks (see the
        // case files' `compilers: none` headers).
        if !matches!(n, 4 | 8) || c.encoding == Encoding::MeshAxes {
            continue;
        }
        let path = dir.join(format!("{taken}.hlo"));
        write_unless_same(&path, &c.hlo());
        let (replicas, partitions) = c.counts();
        // The defaults' kernels, as a user gets them at the hook.
        let mut rewrite = c.rewrite_options();
        rewrite.pass.kernels = None;
        let options = options_json(&rewrite);
        let gpu = gpu_topology(n).expect("an H100 node of 4 or 8");
        for topology in [gpu, tpu_topologies(n)[0].to_string()] {
            let name = format!("{family}::{taken}@{topology}");
            let plain = format!("{name}::plain");
            let spec = |door: &str, options: &Value| {
                json!({"module": path, "replicas": replicas, "partitions": partitions,
                       "door": door, "options": options})
            };
            let jobs = batches.entry(topology.clone()).or_default();
            jobs.push(Job {
                name: plain.clone(),
                spec: spec("none", &json!({})),
                expect: Want::Plain,
            });
            jobs.push(Job {
                name,
                spec: spec("hook", &options),
                expect: want(plain),
            });
        }
        taken += 1;
    }
}

/// Writes `text` to `path` unless the file holds it already. Every test
/// process of the suite makes the sample again and the batch that compiles
/// it may be reading it: a new text goes in by rename, so a reader sees the
/// old file or the new, never half of one.
fn write_unless_same(path: &Path, text: &str) {
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return;
    }
    let tmp = path.with_extension(format!("hlo.{}.partial", std::process::id()));
    std::fs::write(&tmp, text).expect("write a sample module");
    std::fs::rename(&tmp, path).expect("put a sample module in place");
}

/// `options` as the JSON the C ABI reads: every option whose value differs
/// from the default, in the text its schema shows (which its reader takes
/// back); checked to read back as `options`.
fn options_json(options: &equarx::RewriteOptions) -> Value {
    let default = equarx::RewriteOptions::default();
    let mut map = serde_json::Map::new();
    for spec in equarx::options::OPTIONS {
        let shown = (spec.show)(options);
        if shown != (spec.show)(&default) {
            let text = shown.unwrap_or_default();
            let value = if spec.syntax.is_list() {
                json!(
                    text.split(',')
                        .filter(|s| !s.is_empty())
                        .collect::<Vec<_>>()
                )
            } else {
                json!(text)
            };
            map.insert(spec.name.to_string(), value);
        }
    }
    let json = Value::Object(map);
    let back = equarx::options::from_json(&json.to_string())
        .unwrap_or_else(|e| panic!("options {json} do not read back: {e}"));
    assert_eq!(&back, options, "options {json} read back differently");
    json
}

/// What a job's answer must show (`answers`: its batch's, for the plain
/// compile a random module is judged against).
fn judge(job: &Job, got: &Value, answers: &Answers) -> Result<(), String> {
    let name = &job.name;
    if let Some(plain) = job.expect.plain_twin() {
        let base = answers
            .get(plain)
            .ok_or_else(|| format!("{name}: no answer for {plain}"))?;
        if base["ok"] != json!(true) {
            // The compiler refuses the module itself: equarx must leave it
            // to refuse it the same way, unless what it refused is an op
            // equarx replaced (XLA:GPU refuses some tuple all-reduces of
            // random modules: "LogicalBuffer ar.13 ... does not have a
            // layout"), and then the rewrite must compile.
            let error = base["error"].as_str().unwrap_or("");
            let replaced = got["ok"] == json!(true)
                && got["report"].as_array().is_some_and(|ops| {
                    ops.iter().any(|op| {
                        op["rewritten"] == json!(true)
                            && op["name"]
                                .as_str()
                                .is_some_and(|n| error.contains(&format!(" {n}[")))
                    })
                });
            return if replaced || (got["ok"] == base["ok"] && failure(got) == failure(base)) {
                Ok(())
            } else {
                Err(format!(
                    "{name}: the plain compile failed ({}), the one with equarx answered {got}",
                    base["error"]
                ))
            };
        }
    }
    if got["ok"] != json!(true) {
        return Err(format!(
            "{name}: the compiler refused it: {}",
            got["error"].as_str().unwrap_or("(no message)")
        ));
    }
    let report: Vec<Value> = match &got["report"] {
        Value::Array(a) => a.clone(),
        Value::Null => Vec::new(),
        other => return Err(format!("{name}: equarx answered the compiler with {other}")),
    };
    let rewritten = report
        .iter()
        .filter(|r| r["rewritten"] == json!(true))
        .count();
    let wire: Vec<&str> = got["wire_types"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let quantized = wire.iter().any(|t| QUANTIZED.contains(t));
    let summary = || {
        format!(
            "report: {}; the compiled module's collectives carry {wire:?}",
            serde_json::to_string(&report).unwrap_or_default()
        )
    };
    // At a hook the module shows which compiler holds it: the native
    // door emits for that one unless the options name another.
    let compiler = platform(name.rsplit('@').next().unwrap_or_default());
    let door_options = job.spec["options"].as_object();
    let named = door_options.is_some_and(|o| o.contains_key("platform"));
    if job.spec["door"] == json!("hook") && !named {
        if let Some(r) = report
            .iter()
            .find(|r| r["rewritten"] == json!(true) && r["platform"] != json!(compiler))
        {
            return Err(format!(
                "{name}: an op emitted for {} at {compiler}'s hook: {r}",
                r["platform"]
            ));
        }
    }
    match &job.expect {
        Want::Rewritten => {
            if rewritten == 0 || !quantized {
                return Err(format!(
                    "{name}: expected a rewrite at the hook with quantized codes on the wire; {}",
                    summary()
                ));
            }
        }
        Want::Plain => {}
        Want::OwnKernels(_) => {
            let own = match compiler {
                "gpu" => "triton",
                _ => "mosaic",
            };
            let took = |r: &Value| {
                r["rewritten"] == json!(true) && r["plan"]["config"]["kernels"] == json!(own)
            };
            if !report.iter().any(took) || !quantized {
                return Err(format!(
                    "{name}: expected an op rewritten with {own} kernels, quantized codes on the \
                     wire; {}",
                    summary()
                ));
            }
        }
        Want::AsPlain(_) => {
            if rewritten != 0 && !quantized {
                return Err(format!(
                    "{name}: equarx rewrote an op but the wire carries no quantized codes; {}",
                    summary()
                ));
            }
        }
        Want::Unchanged { reasons, opcodes } => {
            let own = |r: &&Value| {
                r["opcode"]
                    .as_str()
                    .is_some_and(|o| opcodes.contains(&o.trim_end_matches("-start")))
            };
            // The compiler may also have turned the op into another kind
            // (XLA:TPU: a reduce-scatter into an all-reduce and a slice) or
            // removed it (a group of one): the reason is then another op's,
            // or there is no op left to give one.
            let left = report
                .iter()
                .filter(own)
                .all(|r| r["rewritten"] == json!(false));
            let said = report.is_empty()
                || report
                    .iter()
                    .any(|r| reasons.iter().any(|why| left_with(r, why)));
            if !left || !said {
                return Err(format!(
                    "{name}: expected no {opcodes:?} rewritten and one left with one of {reasons:?}; {}",
                    summary()
                ));
            }
        }
        Want::Plan {
            algorithm,
            rotation,
            platform,
            kernels,
        } => {
            let planned = |r: &Value| {
                r["plan"]["algorithm"] == json!(algorithm)
                    && r["plan"]["rotation"] == json!(rotation)
                    && r["platform"] == json!(platform)
                    && r["plan"]["config"]["kernels"].as_str().unwrap_or("hlo") == *kernels
            };
            if report.len() != 1 || !planned(&report[0]) || !quantized {
                return Err(format!(
                    "{name}: expected the one op rewritten as {algorithm}+{rotation} for {platform} \
                     (the door passes the platform it lowered for), {kernels} kernels, with \
                     quantized codes on the wire; {}",
                    summary()
                ));
            }
            // XLA:GPU compiles each Triton call as one kernel and the rest
            // is collectives and views: a kernel a step, issue 27's goal.
            let steps = if job.spec["program"] == json!("psum") {
                3
            } else {
                2
            };
            if *kernels == "triton" && got["kernels"] != json!(steps) {
                return Err(format!(
                    "{name}: XLA:GPU compiled {} kernels of the Triton plan, not {steps}; {}",
                    got["kernels"],
                    summary()
                ));
            }
        }
    }
    Ok(())
}

/// The collective kinds a case's text holds.
fn collective_kinds(text: &str) -> Vec<&'static str> {
    ["all-reduce", "all-gather", "reduce-scatter", "all-to-all"]
        .into_iter()
        .filter(|k| text.contains(&format!(" {k}(")) || text.contains(&format!(" {k}-start(")))
        .collect()
}

/// What a failed compile says, without the process's log lines: an
/// abort's `Check failed:` line, or the error's first line.
fn failure(answer: &Value) -> String {
    let e = answer["error"].as_str().unwrap_or_default();
    match e.find("Check failed:") {
        Some(at) => e[at..].lines().next().unwrap_or_default().to_string(),
        None => e.lines().next().unwrap_or_default().to_string(),
    }
}

/// An op equarx left with a reason holding `why`.
fn left_with(r: &Value, why: &str) -> bool {
    r["rewritten"] == json!(false) && r["reason"].as_str().is_some_and(|s| s.contains(why))
}

fn results_dir() -> PathBuf {
    common::repo().join("target/compilers-results")
}

/// The batch's key: the SHA-256 of every input its answers depend on.
fn batch_key(topology: &str, specs: &[Value], lib: &Path) -> Result<String, String> {
    let mut h = Sha256::new();
    let mut field = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(topology.as_bytes());
    field(&serde_json::to_vec(specs).unwrap());
    let repo = common::repo();
    for p in [
        lib.to_path_buf(),
        repo.join("tests/compilers/compile.py"),
        repo.join("tests/compilers/h100.txtpb"),
        repo.join("python/compilers.txt"),
        repo.join("python/equarx/jax.py"),
        repo.join("python/equarx/_native.py"),
    ] {
        field(&std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?);
    }
    for s in specs {
        if let Some(m) = s["module"].as_str() {
            field(&std::fs::read(m).map_err(|e| format!("{m}: {e}"))?);
        }
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// A batch's answers, by job name.
type Answers = HashMap<String, Value>;

/// The answers of `topology`'s batch, by job name: read if kept, else run
/// under the topology's lock.
fn answers(topology: &str, specs: &[Value]) -> Result<Arc<Answers>, String> {
    static DONE: OnceLock<Mutex<HashMap<String, Arc<Answers>>>> = OnceLock::new();
    let done = DONE.get_or_init(Default::default);
    let mut done = done.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(a) = done.get(topology) {
        return Ok(a.clone());
    }
    let lib = doors::cdylib();
    let key = batch_key(topology, specs, &lib)?;
    let dir = results_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let safe = topology.replace(':', "-");
    let kept = dir.join(format!("{safe}-{key}.jsonl"));
    let lock = File::create(dir.join(format!("{safe}.lock"))).map_err(|e| e.to_string())?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| format!("lock {topology}: {e}"))?;
    if !kept.is_file() {
        run_batch(topology, specs, &lib, &kept)?;
    }
    let text = std::fs::read_to_string(&kept).map_err(|e| e.to_string())?;
    let mut by_name = HashMap::new();
    for line in text.lines() {
        let v: Value =
            serde_json::from_str(line).map_err(|e| format!("{}: {e}", kept.display()))?;
        by_name.insert(v["name"].as_str().unwrap_or_default().to_string(), v);
    }
    let a = Arc::new(by_name);
    done.insert(topology.to_string(), a.clone());
    Ok(a)
}

/// Runs every job of the batch; a job that kills the process (a compiler
/// CHECK) is answered as such, and the batch goes on after it.
fn run_batch(topology: &str, specs: &[Value], lib: &Path, kept: &Path) -> Result<(), String> {
    let py = common::venv(common::Venv::Compilers)?;
    let repo = common::repo();
    let work = kept.with_extension("partial");
    let _ = std::fs::remove_file(&work);
    let running = PathBuf::from(format!("{}.running", work.display()));
    let mut answered: Vec<String> = Vec::new();
    loop {
        let rest: Vec<&Value> = specs
            .iter()
            .filter(|s| !answered.iter().any(|a| s["name"] == json!(a)))
            .collect();
        if rest.is_empty() {
            break;
        }
        let batch = json!({
            "platform": platform(topology),
            "topology": topology,
            "library": lib,
            "jobs": rest,
        });
        let jobs = kept.with_extension("jobs.json");
        std::fs::write(&jobs, serde_json::to_vec(&batch).unwrap()).map_err(|e| e.to_string())?;
        let out = Command::new(&py)
            .arg(repo.join("tests/compilers/compile.py"))
            .arg(&jobs)
            .arg(&work)
            .env("PYTHONPATH", repo.join("python"))
            .env("EQUARX_LIB", lib)
            .output()
            .map_err(|e| format!("run compile.py: {e}"))?;
        let text = std::fs::read_to_string(&work).unwrap_or_default();
        answered = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| v["name"].as_str().map(str::to_string))
            .collect();
        if out.status.success() {
            continue;
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let Ok(victim) = std::fs::read_to_string(&running) else {
            return Err(format!(
                "tests/compilers/compile.py failed before any job ({}):\n{}",
                out.status,
                tail(&stderr, 3000)
            ));
        };
        let last: String = stderr
            .lines()
            .filter(|l| l.contains("Check failed") || l.starts_with('F'))
            .take(3)
            .collect::<Vec<_>>()
            .join("\n");
        let answer = json!({
            "name": victim,
            "ok": false,
            "error": format!("the compiler aborted the process ({}): {}", out.status,
                             if last.is_empty() { tail(&stderr, 1500) } else { last }),
        });
        let mut all = text;
        all.push_str(&format!("{answer}\n"));
        std::fs::write(&work, all).map_err(|e| e.to_string())?;
        answered.push(victim);
        let _ = std::fs::remove_file(&running);
    }
    std::fs::rename(&work, kept).map_err(|e| format!("{}: {e}", kept.display()))
}

fn tail(s: &str, n: usize) -> String {
    let start = s.len().saturating_sub(n);
    let start = (start..s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0);
    s[start..].to_string()
}
