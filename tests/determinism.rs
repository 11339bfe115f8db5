//! Determinism and isolation: the same input and options give the same
//! bytes — across runs, processes and threads — and concurrent calls on
//! different modules give exactly what sequential calls give, through the
//! library and through the C ABI.
//!
//! Every fixture is rewritten with several option sets; 8 threads then take
//! the jobs in different orders, each job several times, all at once.
//! HashMap iteration order differs per map and per process (std's
//! RandomState), so any order-dependence in the pass shows up here.

mod common;

use std::collections::BTreeMap;
use std::ffi::{CString, c_int};
use std::sync::{Arc, Barrier};

use common::{equarx, fixture_protos, scratch};
use equarx::ffi::c_abi::{EQUARX_OK, EquarxResult, equarx_free_result, equarx_rewrite};
use equarx::{Options, RewriteOptions};
use prost::Message;

const OPTION_SETS: &[&str] = &[
    r#"{"min_payload_bytes": 0, "types": ["bf16", "f32"]}"#,
    r#"{"min_payload_bytes": 0, "types": ["bf16", "f32"], "block_size": 5, "pipeline_depth": 3,
        "bidirectional": true, "gather": "permute", "scale_type": "f32"}"#,
    r#"{"types": ["bf16", "f16", "f32"], "block_size": 128, "pipeline_depth": 1,
        "bidirectional": false}"#,
];

/// (fixture, options JSON) → input bytes: the fixtures of a few KB (every
/// group layout, tuples, async-free dumps) and one whole program.
fn jobs() -> Vec<(String, &'static str, Vec<u8>)> {
    let mut v = Vec::new();
    let chosen = fixture_protos().into_iter().filter(|p| {
        let len = std::fs::metadata(p).unwrap().len();
        len < 4096 || p.ends_with("tp_block_spmd.pb")
    });
    for path in chosen {
        let bytes = std::fs::read(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        for o in OPTION_SETS {
            v.push((name.clone(), *o, bytes.clone()));
        }
    }
    v
}

/// Library: `Err` as its message, `Ok` as the encoded output (the input
/// itself when unchanged) plus the report.
fn library(bytes: &[u8], json: &str) -> Result<(Vec<u8>, String), String> {
    let options = equarx::ffi::parse_options(json).map_err(|e| e.to_string())?;
    let loaded = equarx::io::decode(bytes, None).map_err(|e| e.to_string())?;
    let r = equarx::rewrite(loaded.module.clone(), loaded.counts, &options)
        .map_err(|e| e.to_string())?;
    let out = loaded
        .encode(&r.module, None, false, &r.counts)
        .map_err(|e| e.to_string())?;
    Ok((out, serde_json::to_string(&r.report).unwrap()))
}

fn c_abi(bytes: &[u8], json: &str) -> (c_int, Vec<u8>, String) {
    let json = CString::new(json).unwrap();
    let mut r = EquarxResult::default();
    // SAFETY: live buffers, NUL-terminated options, a sized result.
    let status = unsafe { equarx_rewrite(bytes.as_ptr(), bytes.len(), json.as_ptr(), &mut r) };
    let module = if r.module.is_null() {
        Vec::new()
    } else {
        // SAFETY: `module_len` bytes from equarx_rewrite.
        unsafe { std::slice::from_raw_parts(r.module, r.module_len) }.to_vec()
    };
    let text = if status == EQUARX_OK {
        r.report_json
    } else {
        r.error
    };
    // SAFETY: NUL-terminated string from equarx_rewrite.
    let text = unsafe { std::ffi::CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: filled by equarx_rewrite.
    unsafe { equarx_free_result(&mut r) };
    (status, module, text)
}

/// Runs `f` on every job from 8 threads at once, each thread in its own
/// order, and asserts every answer equals the sequential one.
fn concurrent_answers_equal<T: Send + PartialEq + std::fmt::Debug + 'static>(
    jobs: &Arc<Vec<(String, &'static str, Vec<u8>)>>,
    sequential: &[T],
    f: fn(&[u8], &str) -> T,
) {
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let jobs = Arc::clone(jobs);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let n = jobs.len();
                // A different stride (coprime with n) per thread.
                let stride = (1..n.max(2))
                    .filter(|s| gcd(*s, n) == 1)
                    .nth(t % 4)
                    .unwrap_or(1);
                barrier.wait();
                (0..n)
                    .map(|k| {
                        let j = (t + k * stride) % n;
                        (j, f(&jobs[j].2, jobs[j].1))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        for (j, a) in h.join().unwrap() {
            assert_eq!(
                a, sequential[j],
                "thread {t}: {} {} differs from the sequential run",
                jobs[j].0, jobs[j].1
            );
        }
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[test]
fn library_concurrent_calls_equal_sequential_ones() {
    let jobs = Arc::new(jobs());
    let sequential: Vec<_> = jobs.iter().map(|(_, o, b)| library(b, o)).collect();
    // Same bytes when called again in the same thread.
    for (k, (name, o, b)) in jobs.iter().enumerate() {
        assert_eq!(
            library(b, o),
            sequential[k],
            "{name} {o}: second run differs"
        );
    }
    let changed = sequential
        .iter()
        .zip(jobs.iter())
        .filter(|(r, j)| r.as_ref().is_ok_and(|(out, _)| *out != j.2))
        .count();
    assert!(changed >= 15, "only {changed} jobs rewrite anything");
    concurrent_answers_equal(&jobs, &sequential, library);
}

#[test]
fn c_abi_concurrent_calls_equal_sequential_ones() {
    let jobs = Arc::new(jobs());
    let sequential: Vec<_> = jobs.iter().map(|(_, o, b)| c_abi(b, o)).collect();
    assert!(
        sequential
            .iter()
            .any(|s| s.0 == EQUARX_OK && !s.1.is_empty())
    );
    // The C ABI's bytes are the library's bytes.
    for (k, (name, o, b)) in jobs.iter().enumerate() {
        if let (Ok((out, report)), (EQUARX_OK, module, json)) = (library(b, o), &sequential[k]) {
            if !module.is_empty() {
                assert_eq!(&out, module, "{name} {o}: C ABI and library bytes differ");
            }
            assert_eq!(&report, json, "{name} {o}: reports differ");
        }
    }
    concurrent_answers_equal(&jobs, &sequential, c_abi);
}

/// Two processes (the CLI), the library in this one: the same bytes, with
/// every output container.
#[test]
fn separate_processes_write_the_same_bytes() {
    let dir = scratch("determinism_cli");
    let mut outputs: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for input in ["psum_tuple_p8.pb", "tp_block_spmd.pb", "scan_psum.pb"] {
        let path = common::fixtures_dir().join(input);
        for ext in ["pb", "txt", "pb.gz"] {
            for run in 0..2 {
                let out = dir.join(format!("{input}.{run}.{ext}"));
                let o = equarx()
                    .arg("rewrite")
                    .arg(&path)
                    .arg("-o")
                    .arg(&out)
                    .args([
                        "--min-payload",
                        "0",
                        "--types",
                        "bf16,f32",
                        "--block-size",
                        "7",
                    ])
                    .output()
                    .unwrap();
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
                let bytes = std::fs::read(&out).unwrap();
                let key = format!("{input}.{ext}");
                if let Some(first) = outputs.get(&key) {
                    assert!(*first == bytes, "{key}: two CLI runs differ");
                } else {
                    outputs.insert(key, bytes);
                }
            }
        }
        // The library in this process gives the CLI's bytes.
        let options = RewriteOptions {
            pass: Options {
                min_payload_bytes: Some(0),
                block_size: 7,
                element_types: vec![
                    equarx::proto::PrimitiveType::Bf16,
                    equarx::proto::PrimitiveType::F32,
                ],
                ..Options::default()
            },
            ..RewriteOptions::default()
        };
        let loaded = equarx::io::decode(&std::fs::read(&path).unwrap(), None).unwrap();
        let r = equarx::rewrite(loaded.module.clone(), loaded.counts, &options).unwrap();
        assert!(r.changed, "{input}");
        assert!(
            r.module.encode_to_vec() == outputs[&format!("{input}.pb")],
            "{input}: library and CLI bytes differ"
        );
    }
}
