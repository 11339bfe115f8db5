//! Real XLA's answers, batched per case file and kept by content.
//!
//! nextest runs every test in a process of its own, and a jax import costs
//! seconds, so a test does not run its own XLA jobs: the first test of a
//! file to need XLA takes the file's lock (`target/filetests/locks/`), runs
//! the jobs of every test of that file in one `tests/xla/xla_tool.py`
//! process, and stores each answer under the SHA-256 of its job
//! (`target/filetests/results/KEY/`: `result.json` and the outputs). The
//! key covers everything the answer depends on — the module's bytes (or
//! text), the device counts, the disabled passes, every input's type, shape
//! and bytes, and the tool and its pinned requirements — so each test finds
//! its own answers, and an answer is never read for a changed rewrite: a
//! changed job is a new key, run on its first use. `rm -rf
//! target/filetests` forgets them all.
//!
//! Only answers that say something about the job are kept: a worker that
//! crashed or timed out (`crashed` in the result) is answered for this
//! process only, and asked again next time.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::common;

/// A module XLA compiles.
pub enum Module {
    /// `HloModuleProto` bytes.
    Proto(Vec<u8>),
    /// HLO text; XLA's parser reads it, and its proto is what runs.
    Text(String),
}

/// Per device, per entry parameter: the values (f32, already rounded to
/// the type) and the parameters' types and dimensions.
pub struct Inputs {
    pub params: Vec<(String, Vec<i64>)>,
    pub values: Vec<Vec<Vec<f32>>>,
}

pub enum Job {
    /// XLA's parser reads this text.
    Parse(String),
    Run {
        module: Arc<Module>,
        replicas: usize,
        partitions: usize,
        /// XLA passes to disable, on top of the partitioner's.
        disable: Option<String>,
        inputs: Arc<Inputs>,
    },
}

/// One job's answer: XLA's result, and the directory of its outputs
/// (`dev{d}_out{k}.bin`).
#[derive(Clone)]
pub struct Answer {
    pub result: Value,
    pub dir: PathBuf,
}

fn root() -> PathBuf {
    common::repo().join("target/filetests")
}

/// Length-prefixed fields, so that no two jobs hash alike by accident.
struct Hasher(Sha256);

impl Hasher {
    fn field(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.update((bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
        self
    }

    fn hex(self) -> String {
        self.0
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// The tool and the environment it runs in, as far as they can change an
/// answer.
fn tool_digest() -> &'static str {
    static D: OnceLock<String> = OnceLock::new();
    D.get_or_init(|| {
        let mut h = Hasher(Sha256::new());
        h.field(b"equarx filetests answers v1");
        for f in ["tests/xla/xla_tool.py", "python/requirements.txt"] {
            let p = common::repo().join(f);
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            h.field(&bytes);
        }
        h.hex()
    })
}

fn digest(bytes: &[u8]) -> String {
    let mut h = Hasher(Sha256::new());
    h.field(bytes);
    h.hex()
}

impl Module {
    fn digest(&self) -> String {
        match self {
            Module::Proto(b) => digest(&[b"proto:".as_slice(), b].concat()),
            Module::Text(t) => digest(&[b"text:".as_slice(), t.as_bytes()].concat()),
        }
    }
}

impl Inputs {
    /// The bytes of parameter `k` on device `d`, as XLA reads them.
    fn bytes(&self, d: usize, k: usize) -> Vec<u8> {
        let v = &self.values[d][k];
        if self.params[k].0 == "bf16" {
            common::bf16_bytes(v)
        } else {
            common::f32_bytes(v)
        }
    }

    fn digest(&self) -> String {
        let mut h = Hasher(Sha256::new());
        for d in 0..self.values.len() {
            for (k, (ty, dims)) in self.params.iter().enumerate() {
                h.field(ty.as_bytes());
                let dims: Vec<u8> = dims.iter().flat_map(|x| x.to_le_bytes()).collect();
                h.field(&dims);
                h.field(&self.bytes(d, k));
            }
        }
        h.hex()
    }
}

impl Job {
    /// The job's content address.
    pub fn key(&self) -> String {
        let mut h = Hasher(Sha256::new());
        h.field(tool_digest().as_bytes());
        match self {
            Job::Parse(text) => {
                h.field(b"parse").field(text.as_bytes());
            }
            Job::Run {
                module,
                replicas,
                partitions,
                disable,
                inputs,
            } => {
                h.field(b"run")
                    .field(module.digest().as_bytes())
                    .field(&(*replicas as u64).to_le_bytes())
                    .field(&(*partitions as u64).to_le_bytes())
                    .field(disable.as_deref().unwrap_or("").as_bytes())
                    .field(inputs.digest().as_bytes());
            }
        }
        h.hex()
    }
}

fn stored(key: &str) -> Option<Answer> {
    let dir = root().join("results").join(key);
    let bytes = std::fs::read(dir.join("result.json")).ok()?;
    let result = serde_json::from_slice(&bytes).ok()?;
    Some(Answer { result, dir })
}

/// The file lock of case file `name`, held until dropped.
pub struct Lock(#[allow(dead_code)] File);

fn lock_file(name: &str) -> Result<File, String> {
    let dir = root().join("locks");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{name}.lock"));
    File::create(&path).map_err(|e| format!("{}: {e}", path.display()))
}

fn lock(name: &str) -> Result<Lock, String> {
    let f = lock_file(name)?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| format!("lock {name}: {e}"))?;
    Ok(Lock(f))
}

/// The lock of case file `name` if no one holds it.
pub fn try_lock(name: &str) -> Result<Option<Lock>, String> {
    let f = lock_file(name)?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(Lock(f))),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(format!("lock {name}: {e}")),
    }
}

/// The answers to `own` (a test's jobs, in order). Missing ones are made
/// by running, under case file `file`'s lock, every job of `all` (the jobs
/// of all that file's tests) that has no answer yet, in one batch. While
/// another process holds the lock (running this file's batch), `help` may
/// run another file's batch; it says whether it did.
pub fn answers(
    file: &str,
    own: &[Job],
    all: impl FnOnce() -> Vec<Job>,
    mut help: impl FnMut() -> bool,
) -> Result<Vec<Answer>, String> {
    let keys: Vec<String> = own.iter().map(Job::key).collect();
    let lookup = |fresh: &HashMap<String, Answer>| -> Option<Vec<Answer>> {
        keys.iter()
            .map(|k| fresh.get(k).cloned().or_else(|| stored(k)))
            .collect()
    };
    if let Some(a) = lookup(&HashMap::new()) {
        return Ok(a);
    }
    let _lock = loop {
        if let Some(l) = try_lock(file)? {
            break l;
        }
        if !help() {
            break lock(file)?;
        }
    };
    // Another test of the file may have run the batch while we waited.
    if let Some(a) = lookup(&HashMap::new()) {
        return Ok(a);
    }
    let fresh = fill(file, own.iter().map(clone_job).chain(all()).collect())?;
    lookup(&fresh).ok_or_else(|| "a job of this test got no answer from its batch".into())
}

/// Runs, in one batch, the jobs of `jobs` that have no answer yet (the
/// caller holds `file`'s lock); their answers by key.
pub fn fill(file: &str, jobs: Vec<Job>) -> Result<HashMap<String, Answer>, String> {
    let mut batch: Vec<Job> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for job in jobs {
        let k = job.key();
        if !seen.contains(&k) && stored(&k).is_none() {
            seen.push(k);
            batch.push(job);
        }
    }
    if batch.is_empty() {
        return Ok(HashMap::new());
    }
    run_batch(file, &batch)
}

fn clone_job(j: &Job) -> Job {
    match j {
        Job::Parse(t) => Job::Parse(t.clone()),
        Job::Run {
            module,
            replicas,
            partitions,
            disable,
            inputs,
        } => Job::Run {
            module: module.clone(),
            replicas: *replicas,
            partitions: *partitions,
            disable: disable.clone(),
            inputs: inputs.clone(),
        },
    }
}

/// Runs `jobs` in one xla_tool process; stores what is worth keeping and
/// returns every answer by key.
fn run_batch(file: &str, jobs: &[Job]) -> Result<HashMap<String, Answer>, String> {
    let pid = std::process::id();
    let work = root().join("work").join(format!("{file}.{pid}"));
    let results = root().join("results");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    std::fs::create_dir_all(&results).map_err(|e| format!("{}: {e}", results.display()))?;
    let write = |p: &Path, bytes: &[u8]| {
        std::fs::write(p, bytes).map_err(|e| format!("{}: {e}", p.display()))
    };
    let mut tool_jobs: Vec<Value> = Vec::new();
    // Per job of ours: its key, its tool job's index, its outputs directory.
    let mut ours: Vec<(String, usize, PathBuf)> = Vec::new();
    let mut modules: HashMap<String, PathBuf> = HashMap::new();
    let mut specs: HashMap<String, Value> = HashMap::new();
    for job in jobs {
        let key = job.key();
        let out = results.join(format!("{key}.tmp.{pid}"));
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
        match job {
            Job::Parse(text) => {
                let path = work.join(format!("{key}.txt"));
                write(&path, text.as_bytes())?;
                tool_jobs.push(json!({"kind": "text_to_proto", "text": path, "out": work.join(format!("{key}.pb"))}));
            }
            Job::Run {
                module,
                replicas,
                partitions,
                disable,
                inputs,
            } => {
                let md = module.digest();
                if !modules.contains_key(&md) {
                    let pb = work.join(format!("m-{md}.pb"));
                    match &**module {
                        Module::Proto(b) => write(&pb, b)?,
                        Module::Text(t) => {
                            let txt = work.join(format!("m-{md}.txt"));
                            write(&txt, t.as_bytes())?;
                            tool_jobs
                                .push(json!({"kind": "text_to_proto", "text": txt, "out": pb}));
                        }
                    }
                    modules.insert(md.clone(), pb);
                }
                let id = inputs.digest();
                if !specs.contains_key(&id) {
                    let dir = work.join(format!("i-{id}"));
                    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                    let mut devices = Vec::new();
                    for d in 0..inputs.values.len() {
                        let mut entries = Vec::new();
                        for (k, (ty, dims)) in inputs.params.iter().enumerate() {
                            let p = dir.join(format!("dev{d}_in{k}.bin"));
                            write(&p, &inputs.bytes(d, k))?;
                            entries.push(json!({"path": p, "dtype": ty, "shape": dims}));
                        }
                        devices.push(Value::Array(entries));
                    }
                    specs.insert(id.clone(), Value::Array(devices));
                }
                let mut j = json!({
                    "kind": "run",
                    "module": modules[&md],
                    "num_partitions": partitions,
                    "num_replicas": replicas,
                    "inputs": specs[&id],
                    "outputs_dir": out,
                });
                if let Some(d) = disable {
                    let passes = format!("sharding-propagation,spmd-partitioning,shardy-xla,{d}");
                    j["debug_options"] = json!({ "xla_disable_hlo_passes": passes });
                }
                tool_jobs.push(j);
            }
        }
        ours.push((key, tool_jobs.len() - 1, out));
    }
    eprintln!(
        "{file}: the file's {} missing XLA answers, in one batch",
        jobs.len()
    );
    let answers = common::run_xla(&work, &tool_jobs);
    let mut fresh = HashMap::new();
    for (key, index, out) in ours {
        let result = answers[index].clone();
        let keep = result["crashed"] != true;
        let text = serde_json::to_vec_pretty(&result).map_err(|e| e.to_string())?;
        write(&out.join("result.json"), &text)?;
        let dir = if keep {
            let dest = results.join(&key);
            match std::fs::rename(&out, &dest) {
                Ok(()) => dest,
                // Another batch stored the same job meanwhile.
                Err(_) if dest.join("result.json").exists() => {
                    let _ = std::fs::remove_dir_all(&out);
                    dest
                }
                Err(e) => return Err(format!("{} -> {}: {e}", out.display(), dest.display())),
            }
        } else {
            out
        };
        fresh.insert(key, Answer { result, dir });
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(fresh)
}
