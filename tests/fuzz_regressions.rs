//! What the fuzzers found, replayed through the paths that found them.
//!
//! `fuzz/harness.rs` is the fuzz targets' own code (included here, not
//! copied): `tests/fuzz/<target>/*` are inputs a target once crashed,
//! timed out or leaked on, each now required to pass through the same
//! target cleanly (the harness asserts its invariants: a clean error or a
//! rewrite that verifies, re-reads and repeats bit for bit). The seed
//! corpus (the fixtures) goes through every target too. See BENCHMARKS.md,
//! "Fuzzing", for the campaign and `fuzz/run` to repeat it.

mod common;

#[path = "../fuzz/harness.rs"]
mod harness;

#[path = "../fuzz/structured.rs"]
mod structured;

use std::path::PathBuf;
use std::time::{Duration, Instant};

type Target = fn(&[u8]);

const TARGETS: &[(&str, Target)] = &[
    ("decode_verify", harness::decode_verify),
    ("text_parse", harness::text_parse),
    ("pipeline", harness::pipeline),
    ("c_abi", harness::c_abi),
    ("structured", structured::structured),
];

fn files(dir: PathBuf) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Generous: the slowest input takes well under a second in a debug build;
/// the quadratic naming bug made the first one take ~30 s under the fuzzer.
const BUDGET: Duration = Duration::from_secs(30);

#[test]
fn every_recorded_finding_now_passes_its_target() {
    let mut replayed = 0;
    for (name, target) in TARGETS {
        for f in files(common::repo().join("tests/fuzz").join(name)) {
            let bytes = std::fs::read(&f).unwrap();
            let started = Instant::now();
            target(&bytes);
            let took = started.elapsed();
            println!("{name}: {} in {took:?}", f.display());
            assert!(took < BUDGET, "{}: {took:?}", f.display());
            replayed += 1;
        }
    }
    assert!(
        replayed >= 1,
        "no recorded findings found under tests/fuzz/"
    );
}

#[test]
fn the_seed_corpus_passes_every_target() {
    let mut seeds: Vec<PathBuf> = common::fixture_protos();
    for dir in ["tests/fixtures", "tests/fixtures/dumps", "tests/text"] {
        seeds.extend(
            files(common::repo().join(dir))
                .into_iter()
                .filter(|p| p.extension().is_some_and(|x| x == "txt" || x == "hlo")),
        );
    }
    seeds.extend(files(common::repo().join("fuzz/seeds/c_abi")));
    for (name, target) in TARGETS {
        // The rewriting targets get the seeds `fuzz/run` lets them mutate
        // whole (4 KiB and less); a debug build takes a while per program.
        let rewrites = matches!(*name, "pipeline" | "c_abi");
        let mut n = 0;
        for f in &seeds {
            let bytes = std::fs::read(f).unwrap();
            if rewrites && bytes.len() > 4096 {
                continue;
            }
            target(&bytes);
            n += 1;
        }
        println!("{name}: {n} seeds");
    }
}

/// The first finding (a `pipeline` timeout): `Module::fresh_name` searched
/// every suffix from 0 on each call, so naming the thousands of ops of a
/// many-lane ring was quadratic (minutes for 50 000 names). Each base now
/// remembers its next suffix; the timeout input itself replays above. The
/// speed is not timed here (benchmarks time things); the names are checked.
#[test]
fn fresh_names_count_on_from_the_last_one() {
    let m = equarx::io::decode(&common::fixture("psum_bf16_p8.pb"), None).unwrap();
    let mut m = equarx::ir::Module::from_proto(m.module);
    for k in 0..50_000 {
        assert_eq!(m.fresh_name("x"), format!("x.{k}"));
    }
}

/// The structure-aware target's generator makes what it promises: over
/// seeded random inputs every module parses and verifies (none is
/// `invalid_input`), and every collective kind, group mode, host and the
/// async and tuple forms occur and get rewritten. The counts are printed
/// (`--nocapture`); the campaign's own are in BENCHMARKS.md.
#[test]
fn the_structured_generator_reaches_every_kind() {
    let mut rng = common::Rng::new(23);
    for _ in 0..400 {
        let len = 64 + (rng.next_u64() % 512) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        structured::structured(&bytes);
    }
    let guard = structured::COVERAGE.lock().unwrap();
    let c = guard.as_ref().expect("counts");
    println!("{}", c.summary());
    assert_eq!(c.invalid_input, 0, "the generator made invalid modules");
    let rewritten = |k: &str| c.counts.get(k).map_or(0, |e| e.1);
    for k in [
        "kind=all-reduce",
        "kind=reduce-scatter",
        "kind=all-gather",
        "kind=all-to-all",
        "mode=CrossReplica",
        "mode=CrossPartition",
        "mode=Flattened",
        "groups=list",
        "groups=iota",
        "groups=mesh",
        "host=While",
        "host=Conditional",
        "host=Call",
        "async",
        "tuple",
    ] {
        assert!(rewritten(k) > 0, "{k}: never rewritten");
    }
}

/// The structured target's first finding: a collective whose result is not
/// what its groups make of its operand (here an all-gather over a
/// cross-replica-and-partition group of 4, written with the result of a
/// group of 1) passed equarx's verifier, and the rewrite failed inside the
/// emitter with "reshape of f32[4,64] to f32[1,64] changes the element
/// count". Such an op is now left as it is, with the reason in the report.
#[test]
fn a_collective_result_of_another_group_size_is_left_with_its_reason() {
    let text = "HloModule structured, replica_count=4, num_partitions=1\n\n\
                ENTRY %main (p0: bf16[1,64]) -> (bf16[1,64]) {\n\
                \x20 %p0 = bf16[1,64] parameter(0)\n\
                \x20 %c0 = bf16[1,64] all-gather(%p0), channel_id=1, replica_groups={}, dimensions={0}\n\
                \x20 ROOT %out = (bf16[1,64]) tuple(%c0)\n}\n";
    let parsed = equarx::text::parse(text).unwrap();
    let options = equarx::options::from_pairs([
        ("block_size", "64"),
        ("stage", "fused"),
        ("topology", "h200"),
        ("min_payload_bytes", "0"),
    ])
    .unwrap();
    let r = equarx::rewrite(parsed.proto, parsed.counts, &options).expect("a clean rewrite");
    assert!(!r.changed);
    let reason = r.report[0].reason.as_deref().unwrap_or("");
    assert!(
        reason.contains("all-gather result dimensions [1, 64] are not [4, 64]"),
        "{reason}"
    );
}

/// The structured target's second finding, the other side of the first: a
/// cross-replica-and-partition all-gather (channel id, no global ids) over
/// groups of one replica and its 8 partitions gathers 8 pieces, as XLA's
/// verifier computes it; equarx's verifier counted the replicas only and
/// refused the valid module ("its operands make it bf16[512]").
#[test]
fn a_cross_replica_and_partition_all_gather_verifies() {
    let text = "HloModule structured, replica_count=1, num_partitions=8\n\n\
                ENTRY %main (p0: bf16[512]) -> bf16[4096] {\n\
                \x20 %p0 = bf16[512] parameter(0)\n\
                \x20 ROOT %c0 = bf16[4096] all-gather(%p0), channel_id=1, replica_groups=[1,1]<=[1,1]T(1,0), dimensions={0}\n}\n";
    let parsed = equarx::text::parse(text).unwrap();
    let m = equarx::ir::Module::from_proto(parsed.proto);
    equarx::verify::verify(&m).expect("a module XLA accepts");
}
