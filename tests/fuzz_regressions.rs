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

use std::path::PathBuf;
use std::time::{Duration, Instant};

type Target = fn(&[u8]);

const TARGETS: &[(&str, Target)] = &[
    ("decode_verify", harness::decode_verify),
    ("text_parse", harness::text_parse),
    ("pipeline", harness::pipeline),
    ("c_abi", harness::c_abi),
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
