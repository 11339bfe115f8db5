//! One test of a case file: its rewrite, what the report must say, its
//! snapshot, and its XLA jobs and checks.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use equarx::proto::HloModuleProto;
use equarx::{DeviceCounts, RewriteOptions, Rewritten};
use prost::Message;
use serde_json::Value;

use crate::checks::{self, Findings};
use crate::common::inputs::Data;
use crate::common::layouts::Layout;
use crate::common::{self, inputs};
use crate::header::{self, Check, Expect, Header, Reference, TestSpec};
use crate::snapshot;
use crate::store::{self, Answer, Inputs, Job, Module};

pub fn cases_dir() -> PathBuf {
    common::repo().join("tests/cases")
}

/// A case file with its header read.
pub struct CaseFile {
    /// The file name without `.hlo`.
    pub name: String,
    pub text: String,
    pub header: Header,
}

/// Every `tests/cases/*.hlo`, sorted; a file that does not read is an
/// error naming it.
pub fn load_all() -> Vec<Result<CaseFile, (String, String)>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(cases_dir())
        .expect("tests/cases")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "hlo"))
        .collect();
    paths.sort();
    paths.iter().map(|p| load(p)).collect()
}

fn load(path: &Path) -> Result<CaseFile, (String, String)> {
    let name = path.file_stem().unwrap().to_string_lossy().into_owned();
    let fail = |e: String| (name.clone(), format!("tests/cases/{name}.hlo: {e}"));
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let header = header::parse(&text).map_err(fail)?;
    Ok(CaseFile {
        name: name.clone(),
        text,
        header,
    })
}

/// `FILE` for a file's base test, `FILE::VARIANT` for a variant.
pub fn test_name(file: &str, spec: &TestSpec) -> String {
    match &spec.variant {
        None => file.to_string(),
        Some(v) => format!("{file}::{v}"),
    }
}

/// One run of a test on one kind of data: its inputs, and which of the
/// test's jobs run the rewrite and the reference.
pub struct Run {
    pub data: Data,
    pub inputs: Arc<Inputs>,
    pub rewritten: usize,
    pub reference: Option<usize>,
}

/// A test made ready, without side effects: its rewrite and its jobs.
pub struct Prepared {
    pub name: String,
    pub devices: (usize, usize),
    pub options: RewriteOptions,
    pub goal: Option<(Data, f64)>,
    pub original: HloModuleProto,
    pub rewritten: Rewritten,
    /// The rewrite's canonical text (a positive test).
    pub canonical: Option<String>,
    /// `door: cli`: the command line's output text and the plan its report
    /// gives.
    pub cli: Option<(String, String)>,
    pub jobs: Vec<Job>,
    pub runs: Vec<Run>,
}

/// A stable seed from a name: FNV-1a.
fn seed(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn parse_module(path_name: &str, text: &str) -> Result<equarx::text::ParsedText, String> {
    equarx::text::parse(text).map_err(|e| format!("{path_name}: {e}"))
}

/// The plan of every op of a report, as `equarx rewrite --report` writes
/// it (`ring+hadamard/loop`), one for all when they agree.
pub fn plan_text(report: &[equarx::OpReport]) -> String {
    let plans: Vec<String> = report
        .iter()
        .map(|op| match &op.plan {
            None => "-".to_string(),
            Some(p) => {
                let rotation = match p.rotation {
                    equarx::plan::Rotation::Hadamard => "+hadamard",
                    equarx::plan::Rotation::None => "",
                };
                let form = match p.form {
                    Some(equarx::plan::Form::Loop) => "/loop",
                    Some(equarx::plan::Form::Unrolled) => "/unrolled",
                    None => "",
                };
                format!("{}{rotation}{form}", p.algorithm)
            }
        })
        .collect();
    join_plans(plans)
}

fn join_plans(plans: Vec<String>) -> String {
    if plans.iter().all(|p| *p == plans[0]) {
        plans[0].clone()
    } else {
        plans.join(", ")
    }
}

/// The same from the report JSON the command line writes.
fn plan_text_json(report: &Value) -> String {
    let plans: Vec<String> = report
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|op| {
            let p = &op["plan"];
            let rotation = if p["rotation"] == "hadamard" {
                "+hadamard"
            } else {
                ""
            };
            let form = p["form"]
                .as_str()
                .map_or(String::new(), |f| format!("/{f}"));
            format!("{}{rotation}{form}", p["algorithm"].as_str().unwrap_or("-"))
        })
        .collect();
    join_plans(plans)
}

/// A case's options as XLA:CPU runs them: the HLO emission unless the
/// header names the kernels (equarx's Mosaic kernels, XLA:TPU's default
/// where they take an op, are custom calls only libtpu compiles; their
/// host check is `tests/compilers.rs`'s `kernels::`).
fn on_xla_cpu(options: &serde_json::Map<String, Value>) -> serde_json::Map<String, Value> {
    let mut o = options.clone();
    o.entry("kernels").or_insert_with(|| Value::from("hlo"));
    o
}

/// The command line's flags for the options JSON (`--block-size 32`).
fn flags(options: &serde_json::Map<String, Value>) -> Vec<String> {
    let mut v = Vec::new();
    for (k, x) in options {
        let text = match x {
            Value::String(s) => s.clone(),
            Value::Array(a) => a
                .iter()
                .map(|e| e.as_str().map_or(e.to_string(), str::to_string))
                .collect::<Vec<_>>()
                .join(","),
            other => other.to_string(),
        };
        v.push(format!("--{}", k.replace('_', "-")));
        v.push(text);
    }
    v
}

/// The command line rewrites the case file: its output text and plan.
fn rewrite_by_cli(
    file: &CaseFile,
    spec: &TestSpec,
    name: &str,
) -> Result<(String, String), String> {
    let dir = common::repo().join("target/filetests/cli").join(format!(
        "{}.{}",
        name.replace("::", "."),
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let out = dir.join("rewritten.txt");
    let report = dir.join("report.json");
    let o = common::equarx()
        .arg("rewrite")
        .arg(cases_dir().join(format!("{}.hlo", file.name)))
        .arg("-o")
        .arg(&out)
        .arg("--report-json")
        .arg(&report)
        .args(flags(&on_xla_cpu(&spec.options)))
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "{name}: the command line failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
    let json: Value = serde_json::from_slice(&std::fs::read(&report).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok((text, plan_text_json(&json)))
}

/// The test's rewrite and jobs.
/// The rewrite as XLA:CPU runs it. Past XLA:TPU's tiling (`stage: tiled`)
/// a reshape that moves no byte under libtpu's tiles is emitted as a
/// `bitcast`, which XLA:CPU, compiling the module from its start, refuses
/// before its layout assignment; there it is the reshape it stands for.
fn for_xla_cpu(module: &HloModuleProto, tiled: bool) -> std::borrow::Cow<'_, HloModuleProto> {
    if !tiled {
        return std::borrow::Cow::Borrowed(module);
    }
    let mut m = module.clone();
    for i in m
        .computations
        .iter_mut()
        .flat_map(|c| c.instructions.iter_mut())
    {
        if i.opcode == "bitcast" {
            i.opcode = "reshape".into();
        }
    }
    split_multi_output_fusions(&mut m);
    std::borrow::Cow::Owned(m)
}

/// Each multi-output loop fusion of `m` as one fusion an output, each
/// calling a copy of the body rooted at that output, and its
/// `get-tuple-element`s as those fusions: the same values. XLA:CPU, which
/// compiles the tiled module from its start, aborts on a multi-output
/// fusion it did not make (`GetWorkDimensions`: "Check failed:
/// has_layout()").
fn split_multi_output_fusions(m: &mut HloModuleProto) {
    use equarx::proto::{HloComputationProto, HloInstructionProto};
    use std::collections::HashMap;
    let is_tuple =
        |i: &HloInstructionProto| i.shape.as_ref().is_some_and(|s| !s.tuple_shapes.is_empty());
    let bodies: HashMap<i64, HloComputationProto> =
        m.computations.iter().map(|c| (c.id, c.clone())).collect();
    // XLA reads an id's low 32 bits as its place in its computation.
    let local = |id: i64| id & 0xffff_ffff;
    let mut next_comp = 1 + m.computations.iter().map(|c| c.id).max().unwrap_or(0);
    let mut added: Vec<HloComputationProto> = Vec::new();
    for c in &mut m.computations {
        let mut next_local = 1 + c
            .instructions
            .iter()
            .map(|i| local(i.id))
            .max()
            .unwrap_or(0);
        // (fusion id, output) → the fusion of that output alone.
        let mut alone: HashMap<(i64, i64), i64> = HashMap::new();
        let mut replace: HashMap<i64, i64> = HashMap::new();
        let mut out: Vec<HloInstructionProto> = Vec::with_capacity(c.instructions.len());
        for i in std::mem::take(&mut c.instructions) {
            let body = i.called_computation_ids.first().and_then(|b| bodies.get(b));
            match body {
                Some(body) if i.opcode == "fusion" && is_tuple(&i) => {
                    let Some(root) = body.instructions.iter().find(|r| r.id == body.root_id) else {
                        out.push(i);
                        continue;
                    };
                    for (k, &element) in root.operand_ids.iter().enumerate() {
                        let mut b = body.clone();
                        b.id = next_comp;
                        next_comp += 1;
                        let ids: HashMap<i64, i64> = b
                            .instructions
                            .iter()
                            .zip(1..)
                            .map(|(x, n)| (x.id, (b.id << 32) | n))
                            .collect();
                        b.instructions.retain(|x| x.id != body.root_id);
                        for x in &mut b.instructions {
                            x.id = ids[&x.id];
                            x.name = format!("{}.out{k}", x.name);
                            x.operand_ids.iter_mut().for_each(|o| *o = ids[o]);
                        }
                        b.name = format!("{}.out{k}", b.name);
                        b.root_id = ids[&element];
                        let shape = i.shape.as_ref().map(|s| s.tuple_shapes[k].clone());
                        if let Some(p) = b.program_shape.as_mut() {
                            p.result = shape.clone();
                        }
                        let mut f = i.clone();
                        f.id = (c.id << 32) | next_local;
                        next_local += 1;
                        f.name = format!("{}.out{k}", i.name);
                        f.shape = shape;
                        f.called_computation_ids = vec![b.id];
                        alone.insert((i.id, k as i64), f.id);
                        added.push(b);
                        out.push(f);
                    }
                }
                _ => match i.operand_ids.first() {
                    Some(o)
                        if i.opcode == "get-tuple-element"
                            && alone.contains_key(&(*o, i.tuple_index)) =>
                    {
                        replace.insert(i.id, alone[&(*o, i.tuple_index)]);
                    }
                    _ => out.push(i),
                },
            }
        }
        for x in &mut out {
            x.operand_ids
                .iter_mut()
                .for_each(|o| *o = *replace.get(o).unwrap_or(o));
        }
        c.root_id = *replace.get(&c.root_id).unwrap_or(&c.root_id);
        c.instructions = out;
    }
    // Callees come first.
    added.extend(std::mem::take(&mut m.computations));
    m.computations = added;
}

pub fn prepare(file: &CaseFile, spec: &TestSpec) -> Result<Prepared, String> {
    let h = &file.header;
    let name = test_name(&file.name, spec);
    let source = format!("tests/cases/{}.hlo", file.name);
    let parsed = parse_module(&source, &file.text)?;
    let (replicas, partitions) = h.devices;
    for (said, want, what) in [
        (parsed.counts.replica_count, replicas, "replica_count"),
        (parsed.counts.num_partitions, partitions, "num_partitions"),
    ] {
        if said.is_some_and(|n| n != want as i64) {
            return Err(format!(
                "{source}: the module's {what}={} is not the header's devices",
                said.unwrap_or_default()
            ));
        }
    }
    let counts = DeviceCounts {
        replica_count: Some(replicas as i64),
        num_partitions: Some(partitions as i64),
    };
    let options = equarx::options::from_json(&Value::Object(on_xla_cpu(&spec.options)).to_string())
        .map_err(|e| format!("{name}: {e}"))?;
    let rewritten = equarx::rewrite(parsed.proto.clone(), counts, &options)
        .map_err(|e| format!("{name}: {e}"))?;
    let mut p = Prepared {
        name: name.clone(),
        devices: h.devices,
        options,
        goal: h.goal,
        original: parsed.proto,
        rewritten,
        canonical: None,
        cli: None,
        jobs: Vec::new(),
        runs: Vec::new(),
    };
    if matches!(spec.expect, Expect::Unchanged(_)) || !p.rewritten.changed {
        return Ok(p);
    }
    let canonical = p
        .rewritten
        .canonical_text()
        .map_err(|e| format!("{name}: printing: {e}"))?;
    p.jobs.push(Job::Parse(canonical.clone()));
    p.canonical = Some(canonical);
    let module = if h.cli {
        let (text, plan) = rewrite_by_cli(file, spec, &name)?;
        p.jobs.push(Job::Parse(text.clone()));
        p.cli = Some((text.clone(), plan));
        Arc::new(Module::Text(text))
    } else {
        let tiled = p.options.pass.stage == Some(equarx::Stage::Tiled);
        Arc::new(Module::Proto(
            for_xla_cpu(&p.rewritten.module, tiled).encode_to_vec(),
        ))
    };
    let reference = match &h.check {
        Check::Psum(_) if h.baseline => Some(p.original.clone()),
        Check::Program { reference, .. } => Some(match reference {
            Reference::Original => p.original.clone(),
            Reference::File(f) => {
                let path = cases_dir().join(f);
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("{source}: reference {}: {e}", path.display()))?;
                parse_module(f, &text)?.proto
            }
        }),
        _ => None,
    };
    let reference = reference.map(|m| Arc::new(Module::Proto(m.encode_to_vec())));
    let devices = replicas * partitions;
    for &data in &h.data {
        let s = seed(&format!("{name}/{}", data.name()));
        let params = inputs::parameters(&p.original);
        let values = match &h.check {
            Check::Psum(_) => inputs::inputs(&params, &vec![None; params.len()], devices, data, s),
            Check::Program { .. } => {
                inputs::inputs(&params, &inputs::shardings(&p.original), devices, data, s)
            }
            Check::Collective(..) => {
                inputs::collective_inputs(params.len(), &params[0].1, devices, data, s)
            }
            Check::Parse | Check::Unchanged => unreachable!("no data without a run"),
        };
        let inputs = Arc::new(Inputs { params, values });
        let job = |module: &Arc<Module>| Job::Run {
            module: module.clone(),
            replicas,
            partitions,
            disable: h.disable.clone(),
            inputs: inputs.clone(),
        };
        p.jobs.push(job(&module));
        let rewritten = p.jobs.len() - 1;
        let reference = reference.as_ref().map(|m| {
            p.jobs.push(job(m));
            p.jobs.len() - 1
        });
        p.runs.push(Run {
            data,
            inputs,
            rewritten,
            reference,
        });
    }
    Ok(p)
}

/// The jobs of every test of `file`, for its batch (tests that cannot be
/// prepared fail on their own).
fn all_jobs(file: &CaseFile) -> Vec<Job> {
    file.header
        .tests
        .iter()
        .filter_map(|t| prepare(file, t).ok())
        .flat_map(|p| p.jobs)
        .collect()
}

/// The module's one collective of the check's kind, as the checks see it.
fn collective_shape(m: &HloModuleProto, kind: equarx::plan::Collective) -> Result<Layout, String> {
    let op = kind.opcode();
    let instr = m
        .computations
        .iter()
        .flat_map(|c| &c.instructions)
        .find(|i| i.opcode == op || i.opcode == format!("{op}-start"))
        .ok_or_else(|| format!("the module has no {op}"))?;
    let dims = inputs::parameters(m)
        .first()
        .map(|p| p.1.clone())
        .ok_or("the module has no parameter")?;
    let dim = match instr.dimensions.as_slice() {
        [] => None,
        [d] => Some(*d),
        more => return Err(format!("{op} has dimensions {more:?}")),
    };
    Ok(Layout {
        collective: kind,
        dims,
        dim,
    })
}

fn s8_collectives(m: &HloModuleProto) -> usize {
    m.computations
        .iter()
        .flat_map(|c| &c.instructions)
        .filter(|i| {
            ["collective-permute", "all-to-all", "all-gather"]
                .iter()
                .any(|op| i.opcode.starts_with(op))
                && i.shape.as_ref().is_some_and(|s| {
                    s.element_type == 2
                        || s.tuple_shapes.first().is_some_and(|t| t.element_type == 2)
                })
        })
        .count()
}

/// While another process runs this file's batch: run the batch of one of
/// the next files in name order (the order tests run in) that no one is
/// running and that lacks answers, so that two workers run two batches.
/// Whatever goes wrong there is that file's tests' to report: this test
/// then just waits for its own file.
fn help(files: &[Arc<CaseFile>], after: usize) -> bool {
    for f in files.iter().skip(after + 1).take(4) {
        let Ok(Some(_lock)) = store::try_lock(&f.name) else {
            continue;
        };
        let ran = std::panic::catch_unwind(|| store::fill(&f.name, all_jobs(f)));
        match ran {
            Ok(Ok(answers)) if !answers.is_empty() => return true,
            Ok(Ok(_)) => continue,
            Ok(Err(_)) | Err(_) => return false,
        }
    }
    false
}

/// Runs test `spec` of `files[index]`; `Err` lists every failure, each
/// naming the test.
pub fn run(files: &[Arc<CaseFile>], index: usize, spec: &TestSpec) -> Result<(), String> {
    let file = &*files[index];
    let p = prepare(file, spec)?;
    let name = &p.name;
    let r = &p.rewritten;
    let mut f = Findings {
        failures: Vec::new(),
        table: Vec::new(),
        simulated: 0,
    };
    match &spec.expect {
        Expect::Unchanged(reason) => {
            if r.changed {
                f.failures.push(format!(
                    "{name}: rewritten, but the header says unchanged: {reason}"
                ));
            }
            if r.module != p.original {
                f.failures.push(format!("{name}: the module changed"));
            }
            let got = r
                .report
                .first()
                .and_then(|o| o.reason.clone())
                .unwrap_or_default();
            if !got.contains(reason.as_str()) {
                f.failures
                    .push(format!("{name}: reason {got:?} lacks {reason:?}"));
            }
            return finish(name, f);
        }
        Expect::Plan(plan) => {
            if !r.changed || !r.report.iter().all(|o| o.rewritten) {
                return Err(format!(
                    "{name}: not every collective was rewritten: {:#?}",
                    r.report
                ));
            }
            if s8_collectives(&r.module) == 0 {
                f.failures.push(format!("{name}: no s8 collective"));
            }
            let got = plan_text(&r.report);
            if got != *plan {
                f.failures.push(format!(
                    "{name}: the plan is {got}, the header says {plan} (edit the header if that is right)"
                ));
            }
            if let Some((text, cli_plan)) = &p.cli {
                if cli_plan != plan {
                    f.failures.push(format!(
                        "{name}: the command line's plan is {cli_plan}, the header says {plan}"
                    ));
                }
                if !(text.starts_with("HloModule") && text.contains("s8[")) {
                    f.failures.push(format!(
                        "{name}: the command line printed no quantized module"
                    ));
                }
            }
            let canonical = p.canonical.as_deref().expect("a rewrite");
            if let Err(e) =
                snapshot::check(name, &file.name, spec.variant.as_deref(), &got, canonical)
            {
                f.failures.push(e);
            }
        }
    }
    let answers = store::answers(
        &file.name,
        &p.jobs,
        || all_jobs(file),
        || help(files, index),
    )?;
    check_answers(file, &p, &answers, &mut f)?;
    finish(name, f)
}

fn check_answers(
    file: &CaseFile,
    p: &Prepared,
    answers: &[Answer],
    f: &mut Findings,
) -> Result<(), String> {
    let name = &p.name;
    let what = ["the rewrite's canonical text", "the command line's text"];
    let parses = if p.cli.is_some() { 2 } else { 1 };
    for (k, a) in answers[..parses].iter().enumerate() {
        if a.result["ok"] != true {
            f.failures.push(format!(
                "{name}: XLA cannot parse {}: {}",
                what[k], a.result["error"]
            ));
        }
    }
    let h = &file.header;
    for run in &p.runs {
        let got = &answers[run.rewritten];
        let reference = run.reference.map(|j| &answers[j]);
        match &h.check {
            Check::Psum(groups) => checks::psum(p, groups, run, got, reference, f),
            Check::Program { bound, .. } => {
                let bound = checks::program_bound(*bound, p.options.pass.quant_format);
                checks::program(p, bound, run, got, reference.expect("a reference run"), f)
            }
            Check::Collective(kind, groups) => {
                let shape =
                    collective_shape(&p.original, *kind).map_err(|e| format!("{name}: {e}"))?;
                checks::collective(p, &shape, groups, run, got, f)
            }
            Check::Parse | Check::Unchanged => {}
        }
    }
    Ok(())
}

fn finish(name: &str, f: Findings) -> Result<(), String> {
    if !f.table.is_empty() {
        let mut t = String::from("data          measured     bound   baseline\n");
        for m in &f.table {
            t.push_str(&format!(
                "{:<12}{:>10.5}{:>10.5}{:>11}\n",
                format!("{:?}", m.data),
                m.measured,
                m.bound,
                m.baseline.map_or("-".into(), |b| format!("{b:.5}"))
            ));
        }
        eprintln!("{name}:\n{t}simulator compared {} times", f.simulated);
    }
    if f.failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{name}: {} failures:\n{}",
            f.failures.len(),
            f.failures.join("\n")
        ))
    }
}
