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

mod tp_prefill;

use criterion::{Criterion, criterion_group, criterion_main};
use equarx::proto::HloModuleProto;
use equarx::{DeviceCounts, RewriteOptions};
use prost::Message;
use tp_prefill::{TP, tp_prefill};

fn bench(c: &mut Criterion) {
    // `cargo bench` passes `--bench`; without it (`cargo test`, `cargo
    // nextest run --all-targets`) criterion runs each function once as a
    // smoke test, and a 2-layer module keeps that quick in a debug build.
    let measuring = std::env::args().any(|a| a == "--bench");
    let sizes: &[usize] = if measuring { &[62, 620] } else { &[2] };
    for &layers in sizes {
        let bytes = tp_prefill(layers).encode_to_vec();
        let counts = DeviceCounts {
            replica_count: Some(1),
            num_partitions: Some(TP),
        };
        let options = RewriteOptions::default();
        // What the pass turns it into, for the report line.
        let out = equarx::rewrite(
            HloModuleProto::decode(bytes.as_slice()).unwrap(),
            counts,
            &options,
        )
        .unwrap();
        let out_bytes = out.module.encode_to_vec();
        let instrs: usize = out
            .module
            .computations
            .iter()
            .map(|c| c.instructions.len())
            .sum();
        eprintln!(
            "{layers} layers: {} all-reduces, {} of them rewritten; {} bytes in, {} bytes and {instrs} instructions out",
            out.report.len(),
            out.report.iter().filter(|r| r.rewritten).count(),
            bytes.len(),
            out_bytes.len()
        );
        let mut g = c.benchmark_group(format!("{layers}_layers"));
        g.sample_size(10);
        g.bench_function("decode+encode input", |b| {
            b.iter(|| {
                HloModuleProto::decode(bytes.as_slice())
                    .unwrap()
                    .encode_to_vec()
            })
        });
        g.bench_function("decode+encode output", |b| {
            b.iter(|| {
                HloModuleProto::decode(out_bytes.as_slice())
                    .unwrap()
                    .encode_to_vec()
            })
        });
        g.bench_function("rewrite (decode, verify, pass, verify, encode)", |b| {
            b.iter(|| {
                let m = equarx::io::decode(&bytes, None).unwrap();
                let r = equarx::rewrite(m.module, counts, &options).unwrap();
                r.module.encode_to_vec()
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
