//! Hostile input through every door: the Rust library, the C ABI
//! (in-process), the cxx bridge's Rust entry (what the C++ `EquarxPass`
//! calls), the CLI, and the Python ctypes door (`tests/hostile.py`, one
//! process for all cases).
//!
//! Each input — huge declared sizes, element counts that overflow, nesting
//! thousands deep (bytes and text), colliding ids, cycles in the call graph
//! and in operands, dangling references, absurd replica counts and group
//! sizes, a gzip bomb, options out of range — gets the same answer from
//! every door: a clean error that says what is wrong, or a clean result.
//! No door panics (the C ABI and the bridge would report an internal
//! error), the CLI exits with 0 or 1 (never a signal: no stack overflow, no
//! abort), and a failed CLI run leaves no output file, not even a
//! temporary one.

mod common;
mod doors;

use std::ffi::{CStr, CString};
use std::path::Path;
use std::time::Instant;

use common::modules::{all_reduces, iota, load, resized};
use common::{equarx, run_python_door, scratch};
use equarx::ffi::bridge::{OptionValue, rewrite_module};
use equarx::ffi::c_abi::{EQUARX_OK, EquarxResult, equarx_free_result, equarx_rewrite};
use equarx::proto::{HloModuleProto, HloModuleProtoWithConfig, LiteralProto, ShapeProto};
use prost::Message;
use serde_json::{Value, json};

/// The pass options of a case, in each door's dialect.
#[derive(Clone, Debug)]
struct Opts {
    block_size: i128,
    pipeline_depth: i128,
    replica_count: Option<i64>,
    num_partitions: Option<i64>,
    types: &'static [&'static str],
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            block_size: 64,
            pipeline_depth: 2,
            replica_count: None,
            num_partitions: None,
            types: &["bf16"],
        }
    }
}

impl Opts {
    fn json(&self) -> String {
        let mut j = json!({
            "block_size": self.block_size,
            "pipeline_depth": self.pipeline_depth,
            "min_payload_bytes": 0,
            "types": self.types,
        });
        if let Some(r) = self.replica_count {
            j["replica_count"] = json!(r);
        }
        if let Some(p) = self.num_partitions {
            j["num_partitions"] = json!(p);
        }
        j.to_string()
    }

    fn cli(&self) -> Vec<String> {
        let mut v = vec![
            format!("--block-size={}", self.block_size),
            format!("--pipeline-depth={}", self.pipeline_depth),
            "--min-payload=0".into(),
            format!("--types={}", self.types.join(",")),
        ];
        if let Some(r) = self.replica_count {
            v.push(format!("--replica-count={r}"));
        }
        if let Some(p) = self.num_partitions {
            v.push(format!("--num-partitions={p}"));
        }
        v
    }

    /// The name/value pairs `EquarxPassOptions::Set` hands the bridge
    /// (text carries any value, so every case reaches equarx's checks).
    fn bridge(&self) -> Vec<OptionValue> {
        let mut pairs = vec![
            ("block_size", self.block_size.to_string()),
            ("pipeline_depth", self.pipeline_depth.to_string()),
            ("min_payload_bytes", "0".to_string()),
            ("types", self.types.join(",")),
        ];
        if let Some(r) = self.replica_count {
            pairs.push(("replica_count", r.to_string()));
        }
        if let Some(p) = self.num_partitions {
            pairs.push(("num_partitions", p.to_string()));
        }
        pairs
            .into_iter()
            .map(|(name, value)| OptionValue {
                name: name.into(),
                value,
            })
            .collect()
    }
}

/// What every door must answer.
#[derive(Clone, Debug)]
enum Expect {
    /// An error whose message contains this.
    Error(&'static str),
    /// Success; the all-reduces are rewritten or not, as said; when not, the
    /// report's reasons contain the needle.
    Ok {
        rewritten: bool,
        reason: &'static str,
    },
}

struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    opts: Opts,
    expect: Expect,
    /// A bare `HloModuleProto` (the bridge reads nothing else).
    bare: bool,
}

fn case(name: &'static str, bytes: Vec<u8>, expect: Expect) -> Case {
    Case {
        name,
        bytes,
        opts: Opts::default(),
        expect,
        bare: true,
    }
}

fn p8() -> HloModuleProto {
    load("psum_bf16_p8.pb")
}

/// Every all-reduce of `m` in the group mode of `channel_id` and
/// `use_global_device_ids`, with no replica groups written.
fn without_groups(m: &mut HloModuleProto, channel_id: i64, global: bool) {
    for ar in all_reduces(m) {
        ar.channel_id = channel_id;
        ar.use_global_device_ids = global;
        ar.replica_group_list = None;
        ar.replica_groups.clear();
    }
}

fn edited(edit: impl FnOnce(&mut HloModuleProto)) -> Vec<u8> {
    let mut m = p8();
    edit(&mut m);
    m.encode_to_vec()
}

/// `varint(len) ++ payload` after a key: one length-delimited field.
fn field(number: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::encode_key(number, prost::encoding::WireType::LengthDelimited, &mut out);
    prost::encoding::encode_varint(payload.len() as u64, &mut out);
    out.extend_from_slice(payload);
    out
}

/// The psum module whose all-reduce's shape (or literal) is replaced by
/// `depth` nested tuples, written byte by byte (prost would recurse).
fn deeply_nested(depth: usize, literal: bool) -> Vec<u8> {
    let leaf = ShapeProto {
        element_type: 11,
        ..Default::default()
    }
    .encode_to_vec();
    // ShapeProto.tuple_shapes = 4; LiteralProto.tuple_literals = 10.
    let inner_field = if literal { 10 } else { 4 };
    let mut nested = if literal {
        LiteralProto {
            shape: Some(ShapeProto {
                element_type: 11,
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec()
    } else {
        leaf
    };
    for _ in 0..depth {
        nested = field(inner_field, &nested);
    }
    let mut m = p8();
    for ar in all_reduces(&mut m) {
        ar.shape = None;
        ar.literal = None;
    }
    let ar_name = all_reduces(&mut m).next().unwrap().name.clone();
    // Re-encode: find the all-reduce's bytes and append the nested field
    // (HloInstructionProto.shape = 3, .literal = 8) inside it.
    let entry = m
        .computations
        .iter()
        .position(|c| c.instructions.iter().any(|i| i.name == ar_name))
        .unwrap();
    let comps = std::mem::take(&mut m.computations);
    let mut out = m.encode_to_vec();
    for (k, mut c) in comps.into_iter().enumerate() {
        if k != entry {
            out.extend(field(3, &c.encode_to_vec()));
            continue;
        }
        let instrs = std::mem::take(&mut c.instructions);
        let mut cb = c.encode_to_vec();
        for i in instrs {
            let mut ib = i.encode_to_vec();
            if i.name == ar_name {
                ib.extend(field(if literal { 8 } else { 3 }, &nested));
            }
            cb.extend(field(2, &ib));
        }
        out.extend(field(3, &cb));
    }
    out
}

/// A gzip stream that inflates to more than protobuf's 2 GiB limit:
/// 33 concatenated members of 64 MiB of zeros (~2 MB in all).
fn gzip_bomb() -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..64 {
        enc.write_all(&zeros).unwrap();
    }
    let member = enc.finish().unwrap();
    member.repeat(33)
}

fn cases() -> Vec<Case> {
    let text = |depth: usize| {
        format!(
            "HloModule deep\n\nENTRY %main (p: f32[]) -> f32[] {{\n  %p = f32[] parameter(0)\n  \
             %t = {}f32[]{} tuple(%p)\n  ROOT %r = f32[] negate(%p)\n}}\n",
            "(".repeat(depth),
            ")".repeat(depth)
        )
        .into_bytes()
    };
    let mut v = vec![
        // Huge declared sizes.
        case(
            "dims_2_40",
            resized(p8(), &[8, 128], &[1 << 40]).encode_to_vec(),
            Expect::Ok {
                rewritten: false,
                reason: "too large",
            },
        ),
        case(
            "element_count_overflows",
            resized(p8(), &[8, 128], &[1 << 40, 1 << 40, 1 << 40]).encode_to_vec(),
            Expect::Ok {
                rewritten: false,
                reason: "too large",
            },
        ),
        case(
            "dims_i64_max",
            resized(p8(), &[8, 128], &[i64::MAX, i64::MAX]).encode_to_vec(),
            Expect::Ok {
                rewritten: false,
                reason: "too large",
            },
        ),
        // Nesting thousands deep: bytes (prost and equarx's schema walk stop
        // at 100 levels) and text (the parser stops at 64).
        case(
            "tuple_shape_5000_deep",
            deeply_nested(5000, false),
            Expect::Error("nested more than 100"),
        ),
        case(
            "tuple_literal_5000_deep",
            deeply_nested(5000, true),
            Expect::Error("nested more than 100"),
        ),
        Case {
            bare: false,
            ..case(
                "text_tuple_10000_deep",
                text(10_000),
                Expect::Error("nesting deeper than"),
            )
        },
        // Ids that collide.
        case(
            "duplicate_instruction_ids",
            edited(|m| {
                let c = m.computations.last_mut().unwrap();
                c.instructions[1].id = c.instructions[0].id;
            }),
            Expect::Error("is used by both"),
        ),
        case(
            "duplicate_computation_ids",
            edited(|m| {
                let id = m.computations[0].id;
                m.computations.last_mut().unwrap().id = id;
            }),
            Expect::Error("computation id"),
        ),
        case(
            "duplicate_names",
            edited(|m| {
                let c = m.computations.last_mut().unwrap();
                c.instructions[1].name = c.instructions[0].name.clone();
            }),
            Expect::Error("is used twice"),
        ),
        // Cycles.
        case(
            "computation_calls_itself",
            edited(|m| {
                let c = &mut m.computations[0];
                let id = c.id;
                c.instructions.last_mut().unwrap().called_computation_ids = vec![id];
            }),
            Expect::Error("calls itself"),
        ),
        case(
            "call_cycle_through_entry",
            edited(|m| {
                let entry = m.entry_computation_id;
                m.computations[0]
                    .instructions
                    .last_mut()
                    .unwrap()
                    .called_computation_ids = vec![entry];
            }),
            Expect::Error("calls itself"),
        ),
        case(
            "operand_is_itself",
            edited(|m| {
                let i = m
                    .computations
                    .last_mut()
                    .unwrap()
                    .instructions
                    .last_mut()
                    .unwrap();
                i.operand_ids = vec![i.id];
            }),
            Expect::Error("is not an earlier instruction"),
        ),
        case(
            "operands_in_a_cycle",
            edited(|m| {
                let c = m.computations.last_mut().unwrap();
                let n = c.instructions.len();
                let (a, b) = (c.instructions[n - 2].id, c.instructions[n - 1].id);
                c.instructions[n - 2].operand_ids = vec![b];
                c.instructions[n - 1].operand_ids = vec![a];
            }),
            Expect::Error("is not an earlier instruction"),
        ),
        // Dangling references.
        case(
            "dangling_to_apply",
            edited(|m| {
                for ar in all_reduces(m) {
                    ar.called_computation_ids = vec![987_654];
                }
            }),
            Expect::Error("called computation id 987654 does not exist"),
        ),
        case(
            "dangling_entry",
            edited(|m| m.entry_computation_id = 4242),
            Expect::Error("entry computation id 4242 does not exist"),
        ),
        case(
            "dangling_root",
            edited(|m| m.computations.last_mut().unwrap().root_id = 31_337),
            Expect::Error("root id 31337"),
        ),
        case(
            "no_computations",
            edited(|m| {
                m.computations.clear();
                m.name = "empty".into();
            }),
            Expect::Error(""),
        ),
        // Absurd groups and counts: skipped with a reason, never expanded.
        case(
            "iota_groups_2_60_devices",
            edited(|m| {
                for ar in all_reduces(m) {
                    ar.replica_group_list = iota(1 << 30, 1 << 30, &[], &[]);
                }
            }),
            Expect::Ok {
                rewritten: false,
                reason: "replica groups",
            },
        ),
        Case {
            opts: Opts {
                block_size: 1,
                num_partitions: Some(1 << 15),
                replica_count: Some(1),
                ..Opts::default()
            },
            ..case(
                "group_of_2_15_devices",
                {
                    let mut m = resized(p8(), &[8, 128], &[1 << 21]);
                    for ar in all_reduces(&mut m) {
                        ar.replica_group_list = iota(1, 1 << 15, &[], &[]);
                    }
                    m.encode_to_vec()
                },
                // The ring would run too many hops; two-shot's padding to
                // P·B would send more bytes than it saves.
                Expect::Ok {
                    rewritten: false,
                    reason: "not fewer than",
                },
            )
        },
        Case {
            opts: Opts {
                replica_count: Some(1 << 40),
                ..Opts::default()
            },
            ..case(
                "replica_count_2_40_empty_groups",
                edited(|m| without_groups(m, 0, false)),
                Expect::Ok {
                    rewritten: false,
                    reason: "outside 1..=",
                },
            )
        },
        // XLA's verifier refuses flattened ids with no groups listed
        // ("Replica groups must be specified in flattened-id mode"); so
        // does equarx's, rather than guess that they mean everyone.
        case(
            "flattened_ids_without_groups",
            edited(|m| without_groups(m, 1, true)),
            Expect::Error("needs its replica groups listed"),
        ),
        Case {
            bare: false,
            ..case(
                "config_replica_count_2_40",
                HloModuleProtoWithConfig {
                    hlo_module: Some({
                        let mut m = p8();
                        without_groups(&mut m, 0, false);
                        m
                    }),
                    config: Some(hlo_module_config_proto_with(1 << 40)),
                }
                .encode_to_vec(),
                Expect::Ok {
                    rewritten: false,
                    reason: "outside 1..=",
                },
            )
        },
    ];
    // Options out of range (on a module that is otherwise rewritten).
    let good = p8().encode_to_vec();
    let with = |name, opts: Opts, expect| Case {
        opts,
        ..case(name, good.clone(), expect)
    };
    v.extend([
        with(
            "block_size_0",
            Opts {
                block_size: 0,
                ..Opts::default()
            },
            Expect::Error("block size must be in 1..="),
        ),
        with(
            "block_size_2_21",
            Opts {
                block_size: 1 << 21,
                ..Opts::default()
            },
            Expect::Error("block size must be in 1..="),
        ),
        with(
            "block_size_u64_max",
            Opts {
                block_size: i128::from(u64::MAX),
                ..Opts::default()
            },
            Expect::Error("block size"),
        ),
        with(
            "block_size_negative",
            Opts {
                block_size: -64,
                ..Opts::default()
            },
            Expect::Error(""),
        ),
        with(
            "block_size_2_20_one_block_per_rank",
            Opts {
                block_size: 1 << 20,
                ..Opts::default()
            },
            // Padding 1024 elements to 8 blocks of 2^20 sends more bytes.
            Expect::Ok {
                rewritten: false,
                reason: "not fewer than",
            },
        ),
        with(
            "pipeline_depth_0",
            Opts {
                pipeline_depth: 0,
                ..Opts::default()
            },
            Expect::Error("pipeline depth must be in 1..="),
        ),
        with(
            "pipeline_depth_over_the_chunk",
            Opts {
                pipeline_depth: 256,
                block_size: 8,
                ..Opts::default()
            },
            // 16 blocks of 8 per rank: 16 lanes, not 512.
            Expect::Ok {
                rewritten: true,
                reason: "",
            },
        ),
        with(
            "pipeline_depth_huge",
            Opts {
                pipeline_depth: 1 << 40,
                ..Opts::default()
            },
            Expect::Error("pipeline depth"),
        ),
        with(
            "replica_count_negative",
            Opts {
                replica_count: Some(-3),
                ..Opts::default()
            },
            Expect::Error("replica_count: must be at least 1"),
        ),
        with(
            "num_partitions_negative",
            Opts {
                num_partitions: Some(-1),
                ..Opts::default()
            },
            Expect::Error("num_partitions: must be at least 1"),
        ),
        with(
            "integer_type_enabled",
            Opts {
                types: &["s32"],
                ..Opts::default()
            },
            Expect::Error(""),
        ),
    ]);
    v
}

fn hlo_module_config_proto_with(replicas: i64) -> equarx::proto::HloModuleConfigProto {
    equarx::proto::HloModuleConfigProto {
        replica_count: replicas,
        num_partitions: 1,
        ..Default::default()
    }
}

/// One door's answer: Ok(rewritten, report reasons) or Err(message).
type Answer = Result<(bool, String), String>;

fn reasons(report_json: &str) -> String {
    let v: Value = serde_json::from_str(report_json).expect("report JSON");
    v.as_array()
        .unwrap()
        .iter()
        .map(|o| o["reason"].as_str().unwrap_or("").to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

fn library(c: &Case) -> Answer {
    let options = equarx::ffi::parse_options(&c.opts.json()).map_err(|e| e.to_string())?;
    let loaded = equarx::io::decode(&c.bytes, None).map_err(|e| e.to_string())?;
    let r = equarx::rewrite(loaded.module.clone(), loaded.counts, &options)
        .map_err(|e| e.to_string())?;
    let bytes = loaded
        .encode(&r.module, None, loaded.gzip, &r.counts)
        .map_err(|e| e.to_string())?;
    if r.changed {
        equarx::io::decode(&bytes, None).expect("the library reads its own output");
    }
    let json = serde_json::to_string(&r.report).unwrap();
    Ok((r.changed, reasons(&json)))
}

fn c_abi(c: &Case) -> Answer {
    let json = CString::new(c.opts.json()).unwrap();
    let mut r = EquarxResult::default();
    // SAFETY: live buffers, NUL-terminated options, a sized result.
    let status = unsafe { equarx_rewrite(c.bytes.as_ptr(), c.bytes.len(), json.as_ptr(), &mut r) };
    let text = |p: *mut std::ffi::c_char| {
        // SAFETY: NUL-terminated strings from equarx.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let answer = if status == EQUARX_OK {
        Ok((r.changed == 1, reasons(&text(r.report_json).unwrap())))
    } else {
        let e = text(r.error).expect("a message with every error status");
        assert!(!e.contains("internal error"), "{}: C ABI: {e}", c.name);
        Err(e)
    };
    // SAFETY: filled by equarx_rewrite.
    unsafe { equarx_free_result(&mut r) };
    answer
}

fn bridge(c: &Case) -> Option<Answer> {
    if !c.bare {
        return None;
    }
    let r = rewrite_module(&c.bytes, &c.opts.bridge(), 0, 0);
    Some(if r.ok {
        Ok((r.changed, reasons(&r.report_json)))
    } else {
        assert!(
            !r.error.contains("internal error"),
            "{}: bridge: {}",
            c.name,
            r.error
        );
        Err(r.error)
    })
}

fn cli(c: &Case, dir: &Path) -> Answer {
    let cdir = dir.join(c.name);
    std::fs::create_dir_all(&cdir).unwrap();
    let input = cdir.join("input.bin");
    std::fs::write(&input, &c.bytes).unwrap();
    let out = cdir.join("out.bin");
    let report = cdir.join("report.json");
    let o = equarx()
        .arg("rewrite")
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .arg("--report-json")
        .arg(&report)
        .args(c.opts.cli())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        matches!(o.status.code(), Some(0) | Some(1) | Some(2)),
        "{}: the CLI died: {:?}\n{stderr}",
        c.name,
        o.status
    );
    assert!(!stderr.contains("panicked"), "{}: {stderr}", c.name);
    // `print` and `analyze` read the same input: an answer, never a crash.
    for cmd in ["print", "analyze"] {
        let p = equarx()
            .arg(cmd)
            .arg(&input)
            .stdout(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&p.stderr);
        assert!(
            matches!(p.status.code(), Some(0) | Some(1)) && !err.contains("panicked"),
            "{}: equarx {cmd} died: {:?}\n{err}",
            c.name,
            p.status
        );
    }
    if o.status.success() {
        assert!(out.is_file(), "{}: no output", c.name);
        let r = std::fs::read_to_string(&report).unwrap();
        let v: Value = serde_json::from_str(&r).expect("report JSON");
        let array = v.as_array().or_else(|| v["all_reduces"].as_array());
        let changed = array.is_some_and(|a| a.iter().any(|o| o["rewritten"] == true));
        Ok((changed, reasons(&serde_json::to_string(&array).unwrap())))
    } else {
        let leftovers: Vec<String> = std::fs::read_dir(&cdir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "input.bin")
            .collect();
        assert!(
            leftovers.is_empty(),
            "{}: a failed run left {leftovers:?}",
            c.name
        );
        Err(stderr)
    }
}

fn judge(c: &Case, door: &str, a: &Answer, failures: &mut Vec<String>) {
    let ok = match (&c.expect, a) {
        (Expect::Error(needle), Err(m)) => m.contains(needle),
        (Expect::Ok { rewritten, reason }, Ok((changed, reasons))) => {
            changed == rewritten && (*rewritten || reasons.to_lowercase().contains(reason))
        }
        _ => false,
    };
    if !ok {
        failures.push(format!(
            "{} via {door}: want {:?}, got {a:?}",
            c.name, c.expect
        ));
    }
}

#[test]
fn hostile_input_gets_a_clean_answer_through_every_door() {
    let dir = scratch("hostile");
    let cases = cases();
    let mut failures = Vec::new();
    let mut py_jobs = Vec::new();
    for c in &cases {
        let started = Instant::now();
        judge(c, "library", &library(c), &mut failures);
        judge(c, "C ABI", &c_abi(c), &mut failures);
        if let Some(a) = bridge(c) {
            judge(c, "bridge", &a, &mut failures);
        }
        let cli_answer = cli(c, &dir);
        // Option values reach equarx's own parser (core/src/options/schema.rs), as at
        // every other door; clap's exit 2 is for malformed command lines.
        judge(c, "CLI", &cli_answer, &mut failures);
        let input = dir.join(c.name).join("input.bin");
        py_jobs.push(json!({"name": c.name, "input": input, "options": c.opts.json()}));
        let took = started.elapsed();
        println!("{:<38} {:>8.2?}  {:?}", c.name, took, c.expect);
        assert!(
            took.as_secs() < 60,
            "{}: {took:?} through four doors",
            c.name
        );
    }

    // The Python door, all cases in one interpreter.
    let answers = run_python_door(&dir, "hostile.py", &[], &doors::cdylib(), &py_jobs);
    assert_eq!(answers.len(), cases.len());
    for (c, a) in cases.iter().zip(&answers) {
        let answer: Answer = if a["ok"] == true {
            Ok((a["changed"] == true, reasons(&a["report"].to_string())))
        } else {
            let m = a["message"].as_str().unwrap_or("").to_string();
            assert_eq!(a["type"], "EquarxError", "{}: Python raised {a}", c.name);
            Err(m)
        };
        judge(c, "Python", &answer, &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A module built in memory with shapes nested deeper than any decoder
/// allows still gets an error from the verifier, not a stack overflow in a
/// recursive shape helper.
#[test]
fn in_memory_nesting_is_refused_before_recursion() {
    // On a thread with a main thread's 8 MiB stack: prost's derived `Drop`
    // of a 3000-deep shape needs it in a debug build (the caller's own cost
    // of building such a value, not equarx's).
    let run = || {
        let mut s = ShapeProto {
            element_type: 11,
            ..Default::default()
        };
        for _ in 0..3000 {
            s = ShapeProto {
                element_type: 13, // TUPLE
                tuple_shapes: vec![s],
                ..Default::default()
            };
        }
        let mut m = p8();
        all_reduces(&mut m).next().unwrap().shape = Some(s);
        let e = equarx::rewrite(m, equarx::DeviceCounts::default(), &Default::default())
            .expect_err("refused");
        assert!(e.to_string().contains("nested more than 100"), "{e}");
    };
    std::thread::Builder::new()
        .stack_size(8 << 20)
        .spawn(run)
        .unwrap()
        .join()
        .unwrap();
}

/// A gzip bomb (33 × 64 MiB of zeros in 2 MB) is refused once it has
/// inflated past protobuf's 2 GiB limit, by the library and by the CLI (the
/// other doors share the library's `io::decode`). Inflating 2 GiB takes a
/// debug build ~15 s, so the other doors are not run again.
#[test]
fn a_gzip_bomb_is_refused() {
    let c = Case {
        bare: false,
        ..case(
            "gzip_bomb",
            gzip_bomb(),
            Expect::Error("inflates to more than"),
        )
    };
    let mut failures = Vec::new();
    judge(&c, "library", &library(&c), &mut failures);
    let dir = scratch("hostile_gzip_bomb");
    let input = dir.join("input.pb.gz");
    std::fs::write(&input, &c.bytes).unwrap();
    let out = dir.join("out.pb");
    let o = equarx()
        .arg("rewrite")
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("inflates to more than"), "{stderr}");
    assert!(!out.exists(), "an output was written");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        1,
        "a temporary file was left"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Shape inference in the verifier with sizes at the edge of i64: found by
/// review while hardening (each overflowed — a panic with overflow checks,
/// a silently wrong shape without — or indexed a missing operand); now each
/// is a clean verdict.
#[test]
fn verifier_shape_arithmetic_never_overflows() {
    const BIG: &str = "4611686018427387904"; // 2^62
    let module = |decls: &str, op: &str| {
        format!(
            "HloModule m\n\nENTRY %e (p: f32[4]) -> f32[4] {{\n  %p = f32[4] parameter(0)\n{decls}  \
             {op}\n  ROOT %r = f32[4] negate(%p)\n}}\n"
        )
    };
    let big = format!("  %b = f32[{BIG}] parameter(1)\n  %z = f32[] constant(0)\n");
    let cases = [
        // stride i64::MAX: (limit - start + stride - 1) overflowed.
        (
            "slice",
            module(
                "",
                "%s = f32[1] slice(%p), slice={[0:4:9223372036854775807]}",
            ),
            None,
        ),
        (
            "concatenate",
            module(&big, "%c = f32[1] concatenate(%b, %b, %b), dimensions={0}"),
            Some("overflows"),
        ),
        (
            "pad",
            module(
                &big,
                "%q = f32[1] pad(%b, %z), padding=0_4611686018427387904_1",
            ),
            Some("overflows"),
        ),
        (
            "all-gather",
            module(
                &big,
                "%g = f32[1] all-gather(%b), dimensions={0}, replica_groups={{0,1,2,3}}",
            ),
            Some("overflows"),
        ),
        (
            "dynamic-slice without operands",
            module("", "%d = f32[1] dynamic-slice(), dynamic_slice_sizes={1}"),
            Some("needs operand 0"),
        ),
    ];
    for (what, text, want) in cases {
        let text = text.replace(
            "ENTRY %e (p: f32[4])",
            &format!("ENTRY %e (p: f32[4], b: f32[{BIG}])"),
        );
        let parsed = match equarx::text::parse(&text) {
            Ok(p) => p,
            Err(e) => panic!("{what}: the test's HLO does not parse: {e}\n{text}"),
        };
        let m = equarx::ir::Module::from_proto(parsed.proto);
        let verdict = equarx::verify::verify(&m);
        match want {
            None => assert!(verdict.is_ok(), "{what}: {verdict:?}"),
            Some(needle) => {
                let e = verdict.expect_err(what).to_string();
                assert!(e.contains(needle), "{what}: {e}");
            }
        }
    }
}
