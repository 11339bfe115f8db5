//! How fast the pass is on large modules, against the bare prost decode +
//! encode of the same bytes.
//!
//! The module is a synthesized tensor-parallel prefill: Gemma-3-27B-like
//! shapes (width 5376, MLP 21504, TP = 8 → 2688 per device, 2048 tokens),
//! two row-parallel matmuls per layer each followed by a bf16 all-reduce:
//! 62 layers give 124 all-reduces; the "10x" module has 620 layers.
//!
//! `cargo bench --bench pass`; figures in BENCHMARKS.md. Under `cargo test`
//! it runs once on a 2-layer module, as a smoke test.
//!
//! **File mode** (what `bench/compile/run` uses): with `EQUARX_BENCH_MODULE`
//! set, the same two measurements run on that module file instead, without
//! criterion, and one JSON object goes to stdout:
//!
//! | variable | meaning |
//! |---|---|
//! | `EQUARX_BENCH_MODULE` | the module to rewrite (any container `equarx rewrite` reads) |
//! | `EQUARX_BENCH_OPTIONS` | the pass options as the JSON object every door reads (`{"pipeline_depth": 1}`); unset: defaults |
//! | `EQUARX_BENCH_EXPECT` | optional: a file the rewrite must reproduce byte for byte (the CLI's output for the same flags) |
//! | `EQUARX_BENCH_RUNS` | timed runs of each measurement, interleaved (default 3) |

mod tp_prefill;

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use equarx::proto::HloModuleProto;
use equarx::{DeviceCounts, RewriteOptions};
use prost::Message;
use tp_prefill::{TP, tp_prefill};

/// What `equarx rewrite` does in memory: decode (with the unknown-field
/// guard), verify, pass, verify, encode in the input's container.
fn rewrite(bytes: &[u8], options: &RewriteOptions) -> Vec<u8> {
    let mut loaded = equarx::io::decode(bytes, None).unwrap();
    let module = std::mem::take(&mut loaded.module);
    let r = equarx::rewrite(module, loaded.counts, options).unwrap();
    loaded
        .encode(&r.module, None, loaded.gzip, &r.counts)
        .unwrap()
}

/// The floor any proto-to-proto pass pays: prost decode + encode.
fn decode_encode(bytes: &[u8]) -> Vec<u8> {
    HloModuleProto::decode(bytes).unwrap().encode_to_vec()
}

fn bench(c: &mut Criterion) {
    // `cargo bench` passes `--bench`; without it (`cargo test`, `cargo
    // nextest run --all-targets`) criterion runs each function once as a
    // smoke test, and a 2-layer module keeps that quick in a debug build.
    let measuring = std::env::args().any(|a| a == "--bench");
    let sizes: &[usize] = if measuring { &[62, 620] } else { &[2] };
    for &layers in sizes {
        let bytes = tp_prefill(layers).encode_to_vec();
        let options = RewriteOptions {
            counts: DeviceCounts {
                replica_count: Some(1),
                num_partitions: Some(TP),
            },
            ..Default::default()
        };
        // What the pass turns it into, for the report line.
        let out = equarx::rewrite(
            HloModuleProto::decode(bytes.as_slice()).unwrap(),
            options.counts,
            &options,
        )
        .unwrap();
        let out_bytes = out.module.encode_to_vec();
        eprintln!(
            "{layers} layers: {} all-reduces, {} of them rewritten; {} bytes in, {} bytes and {} instructions out",
            out.report.len(),
            out.report.iter().filter(|r| r.rewritten).count(),
            bytes.len(),
            out_bytes.len(),
            instructions(&out.module)
        );
        let mut g = c.benchmark_group(format!("{layers}_layers"));
        g.sample_size(10);
        g.bench_function("decode+encode input", |b| b.iter(|| decode_encode(&bytes)));
        g.bench_function("decode+encode output", |b| {
            b.iter(|| decode_encode(&out_bytes))
        });
        g.bench_function("rewrite (decode, verify, pass, verify, encode)", |b| {
            b.iter(|| rewrite(&bytes, &options))
        });
        g.finish();
    }
}

fn instructions(m: &HloModuleProto) -> usize {
    m.computations.iter().map(|c| c.instructions.len()).sum()
}

/// File mode: see the module docs. Errors are messages for the caller
/// (bench/compile/run prints them), not panics.
fn file_mode(path: &str) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let flags = std::env::var("EQUARX_BENCH_OPTIONS").unwrap_or_default();
    let options = equarx::options::from_json(&flags)
        .map_err(|e| format!("EQUARX_BENCH_OPTIONS={flags}: {e}"))?;
    let runs: usize = match std::env::var("EQUARX_BENCH_RUNS") {
        Ok(s) => s
            .parse()
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| format!("EQUARX_BENCH_RUNS={s:?}: want a count >= 1"))?,
        Err(_) => 3,
    };
    // Checked once, untimed: the input reads and the options are valid.
    let loaded = equarx::io::decode(&bytes, None).map_err(|e| format!("{path}: {e}"))?;
    equarx::rewrite(loaded.module, loaded.counts, &options).map_err(|e| format!("{path}: {e}"))?;
    // Warm-up run (page faults, allocator), which also gives the output.
    let out = rewrite(&bytes, &options);
    if let Ok(expect) = std::env::var("EQUARX_BENCH_EXPECT") {
        let want = std::fs::read(&expect).map_err(|e| format!("cannot read {expect}: {e}"))?;
        if want != out {
            return Err(format!(
                "the library's rewrite with EQUARX_BENCH_OPTIONS={flags} differs from {expect} \
                 ({} bytes against {}): not the module the CLI wrote",
                out.len(),
                want.len()
            ));
        }
    }
    let time = |f: &dyn Fn() -> Vec<u8>| {
        let t = Instant::now();
        std::hint::black_box(f());
        t.elapsed()
    };
    let (mut rw, mut de) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        rw.push(time(&|| rewrite(&bytes, &options)));
        de.push(time(&|| decode_encode(&out)));
    }
    let secs = |v: &[Duration]| {
        serde_json::Value::from(v.iter().map(Duration::as_secs_f64).collect::<Vec<_>>())
    };
    let module = HloModuleProto::decode(out.as_slice()).map_err(|e| e.to_string())?;
    Ok(serde_json::json!({
        "module": path,
        "runs": runs,
        "input_bytes": bytes.len(),
        "output_bytes": out.len(),
        "output_instructions": instructions(&module),
        "matched_expected": std::env::var("EQUARX_BENCH_EXPECT").is_ok(),
        "rewrite_s": secs(&rw),
        "decode_encode_output_s": secs(&de),
    })
    .to_string())
}

criterion_group!(benches, bench);

fn main() {
    if let Ok(path) = std::env::var("EQUARX_BENCH_MODULE") {
        match file_mode(&path) {
            Ok(json) => println!("{json}"),
            Err(e) => {
                eprintln!("benches/pass: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    // What criterion_main! expands to.
    benches();
    Criterion::default().configure_from_args().final_summary();
}
