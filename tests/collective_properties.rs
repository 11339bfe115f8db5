//! Property tests over every collective kind: random all-reduce,
//! reduce-scatter, all-gather and all-to-all modules (array and tuple
//! all-to-all; groups of 2, 4 and 8, contiguous and strided, partition or
//! replica ids; sizes that need padding; every algorithm, rotation, code
//! format, scale type, gather form, loop or unrolled, lanes and depth)
//! through the pass.
//!
//! For every case:
//! - the pass rewrites it (the op carries `equarx.quantize="true"`, so the
//!   cost model cannot decline) into a module equarx's verifier accepts;
//! - the bit-exact simulator, run on the plan the report names over
//!   seeded bf16 inputs, gives every rank of a group the same bits where
//!   the collective promises the same result (all-reduce, all-gather);
//! - every rank's relative RMS error against the exact result stays within
//!   the error model's bound for the data (1.25x, as the case files' checks).
//!
//! The cases are drawn from a fixed seed ([`common::property_seed`]), so CI
//! runs the same ones every time; `scripts/property-campaign` draws new
//! ones and records the run.
//!
//! A fixed-seed sample of the same generator, every kind in it, runs in
//! real XLA on 8 CPU devices: XLA equals the simulator bit for bit on every
//! rank, and the ranks that must agree hold the same bits.

mod common;

use std::collections::BTreeSet;

use common::layouts::{Layout, exact, simulated};
use common::{Rng, outputs, rel_rms, run_xla, scratch, write_inputs};
use equarx::numerics::error::rel_rms_with_crest;
use equarx::numerics::simulate;
use equarx::plan::{Algorithm, Collective, Config, Plan, QuantFormat, Rotation};
use equarx::{FuseMode, GatherForm, Options, RewriteOptions, ScaleType};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as RunnerConfig, RngAlgorithm, TestRng, TestRunner};
use prost::Message;
use serde_json::json;

/// Property cases per run (each a rewrite and a simulation per group).
const CASES: u32 = 64;

/// Eight devices, grouped one of these ways.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Groups {
    All,
    TwoOfFour,
    Strided,
    Pairs,
    /// No channel id: one group of 8 replicas.
    Replicas,
}

impl Groups {
    fn lists(self) -> Vec<Vec<usize>> {
        match self {
            Groups::All | Groups::Replicas => vec![(0..8).collect()],
            Groups::TwoOfFour => vec![(0..4).collect(), (4..8).collect()],
            Groups::Strided => vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]],
            Groups::Pairs => (0..4).map(|k| vec![2 * k, 2 * k + 1]).collect(),
        }
    }

    fn size(self) -> usize {
        self.lists()[0].len()
    }

    fn counts(self) -> (usize, usize) {
        match self {
            Groups::Replicas => (8, 1),
            _ => (1, 8),
        }
    }
}

#[derive(Clone, Debug)]
struct Case {
    collective: Collective,
    dims: Vec<i64>,
    /// The collective's dimension; `None`: an all-reduce, or a tuple
    /// all-to-all of one operand (of `dims`) per rank.
    dim: Option<i64>,
    groups: Groups,
    options: Options,
    seed: u64,
}

impl Case {
    fn layout(&self) -> Layout {
        Layout {
            collective: self.collective,
            dims: self.dims.clone(),
            dim: self.dim,
        }
    }
}

impl Case {
    fn operands(&self) -> usize {
        match (self.collective, self.dim) {
            (Collective::AllToAll, None) => self.groups.size(),
            (Collective::AllToAll, Some(_))
            | (Collective::AllReduce | Collective::ReduceScatter | Collective::AllGather, _) => 1,
        }
    }

    fn out_dims(&self) -> Vec<i64> {
        let p = self.groups.size() as i64;
        let mut out = self.dims.clone();
        if let Some(d) = self.dim {
            match self.collective {
                Collective::ReduceScatter => out[d as usize] /= p,
                Collective::AllGather => out[d as usize] *= p,
                Collective::AllReduce | Collective::AllToAll => {}
            }
        }
        out
    }

    /// The module, as HLO text.
    fn hlo(&self) -> String {
        let text = |d: &[i64]| d.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        let x = format!("bf16[{}]", text(&self.dims));
        let y = format!("bf16[{}]", text(&self.out_dims()));
        let lists: Vec<String> = self
            .groups
            .lists()
            .iter()
            .map(|g| {
                let g: Vec<String> = g.iter().map(usize::to_string).collect();
                format!("{{{}}}", g.join(","))
            })
            .collect();
        let groups = format!("replica_groups={{{}}}", lists.join(","));
        let op = self.collective.opcode();
        let attrs = match (self.groups, self.collective) {
            (Groups::Replicas, _) => groups,
            (_, Collective::AllToAll) => format!("channel_id=1, {groups}"),
            (_, Collective::AllReduce | Collective::ReduceScatter | Collective::AllGather) => {
                format!("channel_id=1, {groups}, use_global_device_ids=true")
            }
        };
        let force = r#"frontend_attributes={equarx.quantize="true"}"#;
        let (replicas, partitions) = self.groups.counts();
        let header =
            format!("HloModule prop, replica_count={replicas}, num_partitions={partitions}\n\n");
        let add = "%add (a: bf16[], b: bf16[]) -> bf16[] {\n  %a = bf16[] parameter(0)\n  \
                   %b = bf16[] parameter(1)\n  ROOT %s = bf16[] add(%a, %b)\n}\n\n";
        let n = self.operands();
        let params: Vec<String> = (0..n).map(|k| format!("p{k}: {x}")).collect();
        let mut lines: Vec<String> = (0..n)
            .map(|k| format!("  %p{k} = {x} parameter({k})"))
            .collect();
        let (root_shape, root) = match (self.collective, self.dim) {
            (Collective::AllToAll, None) => {
                let ops: Vec<String> = (0..n).map(|k| format!("%p{k}")).collect();
                let tuple = format!("({})", vec![x.clone(); n].join(", "));
                let root = format!(
                    "  ROOT %c = {tuple} all-to-all({}), {attrs}, {force}",
                    ops.join(", ")
                );
                (tuple, root)
            }
            (Collective::AllReduce, _) => (
                y.clone(),
                format!("  ROOT %c = {y} all-reduce(%p0), {attrs}, to_apply=%add, {force}"),
            ),
            (Collective::ReduceScatter, Some(d)) => (
                y.clone(),
                format!(
                    "  ROOT %c = {y} reduce-scatter(%p0), {attrs}, dimensions={{{d}}}, \
                     to_apply=%add, {force}"
                ),
            ),
            (_, Some(d)) => (
                y.clone(),
                format!("  ROOT %c = {y} {op}(%p0), {attrs}, dimensions={{{d}}}, {force}"),
            ),
            (_, None) => unreachable!("only all-reduce and all-to-all have no dimension"),
        };
        lines.push(root);
        format!(
            "{header}{add}ENTRY %main ({}) -> {root_shape} {{\n{}\n}}\n",
            params.join(", "),
            lines.join("\n")
        )
    }

    fn rewrite_options(&self) -> RewriteOptions {
        RewriteOptions {
            pass: self.options.clone(),
            ..RewriteOptions::default()
        }
    }
}

fn case() -> impl Strategy<Value = Case> {
    let kind = prop_oneof![
        Just(Collective::AllReduce),
        Just(Collective::ReduceScatter),
        Just(Collective::AllGather),
        Just(Collective::AllToAll),
    ];
    let groups = prop_oneof![
        Just(Groups::All),
        Just(Groups::TwoOfFour),
        Just(Groups::Strided),
        Just(Groups::Pairs),
        Just(Groups::Replicas),
    ];
    let shape = (
        1usize..=3,
        prop::collection::vec(1i64..=3, 3),
        0usize..3,
        1i64..=4,
    );
    let config = (
        prop_oneof![
            Just(Algorithm::Ring),
            Just(Algorithm::TwoShot),
            Just(Algorithm::TwoLevel)
        ],
        any::<bool>(),
        prop_oneof![
            3 => Just(QuantFormat::Int8),
            1 => Just(QuantFormat::Fp8E4m3),
            1 => Just(QuantFormat::Fp8E5m2),
            1 => Just(QuantFormat::Int4),
        ],
        prop_oneof![
            Just(8usize),
            Just(16),
            Just(32),
            Just(64),
            Just(5),
            Just(48)
        ],
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        1usize..=2,
        any::<bool>(),
    );
    (
        kind,
        groups,
        shape,
        any::<bool>(),
        config,
        any::<u64>(),
        0u64..2,
    )
        .prop_map(
            |(
                collective,
                groups,
                (rank, sizes, d, k),
                tuple_a2a,
                (algorithm, rotate, format, block, f32_scales, permute, unroll, depth, bidi),
                seed,
                scale,
            )| {
                let p = groups.size() as i64;
                let mut dims: Vec<i64> = sizes[..rank].to_vec();
                let d = d % rank;
                // Big enough for the error model's statistics to mean
                // something (~1-10 K elements), odd enough to pad.
                dims[rank - 1] = dims[rank - 1] * (64 << scale) + seed as i64 % 3;
                let dim = match collective {
                    Collective::AllReduce => None,
                    Collective::AllToAll if tuple_a2a => None,
                    Collective::ReduceScatter | Collective::AllGather | Collective::AllToAll => {
                        Some(d as i64)
                    }
                };
                if let (Some(d), Collective::ReduceScatter | Collective::AllToAll) =
                    (dim, collective)
                {
                    dims[d as usize] = p * k * if d + 1 == rank as i64 { 64 } else { 1 };
                }
                // int4 codes pack two to a byte: an even block.
                let block = if format.packs_two_per_byte() {
                    block + block % 2
                } else {
                    block
                };
                let rotation = if rotate && block.is_power_of_two() {
                    Rotation::Hadamard
                } else {
                    Rotation::None
                };
                // Two-level needs the topology's 2-D slice of the group's size.
                let (algorithm, topology) = match (algorithm, p) {
                    (Algorithm::TwoLevel, 4) => (algorithm, "v5e:2x2"),
                    (Algorithm::TwoLevel, 8) => (algorithm, "v5e:2x4"),
                    (Algorithm::TwoLevel, _) => (Algorithm::Ring, "v5e"),
                    (a, _) => (a, "v5e"),
                };
                let options = Options {
                    block_size: block,
                    pipeline_depth: depth,
                    bidirectional: bidi,
                    min_payload_bytes: Some(0),
                    topology: Some(equarx::cost::Topology::parse(topology).unwrap()),
                    scale_type: if f32_scales {
                        ScaleType::F32
                    } else {
                        ScaleType::Bf16
                    },
                    quant_format: format,
                    gather: if permute {
                        GatherForm::Permute
                    } else {
                        GatherForm::AllGather
                    },
                    fuse: FuseMode::Off,
                    algorithm: Some(algorithm),
                    rotation: Some(rotation),
                    unroll,
                    // XLA:CPU runs them: the HLO emission, never the
                    // Mosaic kernels XLA:TPU's default writes.
                    kernels: Some(equarx::plan::Kernels::Hlo),
                    ..Options::default()
                };
                Case {
                    collective,
                    dims,
                    dim,
                    groups,
                    options,
                    seed,
                }
            },
        )
}

/// Seeded bf16 Gaussian inputs: per device, per operand.
fn inputs(c: &Case) -> Vec<Vec<Vec<f32>>> {
    let mut rng = Rng::new(c.seed);
    let n: i64 = c.dims.iter().product();
    (0..8)
        .map(|_| {
            (0..c.operands())
                .map(|_| {
                    (0..n)
                        .map(|_| half::bf16::from_f32(rng.gaussian() as f32).to_f32())
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// The plan a rewritten case ran with, for a group of `p`.
fn plan_of(c: &Case, config: &Config, p: usize) -> Plan {
    let n = c.dims.iter().product::<i64>() as usize * c.operands();
    match c.collective {
        Collective::AllReduce => Plan::new(p, n, config),
        Collective::AllGather => Plan::rows(c.collective, p, n, config),
        Collective::ReduceScatter | Collective::AllToAll => {
            Plan::rows(c.collective, p, n / p, config)
        }
    }
    .expect("the report's configuration plans again")
}

/// Whether every rank of a group gets the same result.
fn agrees(c: Collective) -> bool {
    match c {
        Collective::AllReduce | Collective::AllGather => true,
        Collective::ReduceScatter | Collective::AllToAll => false,
    }
}

/// Rewrites `c`: the configuration the report names, or what broke.
fn rewrite(c: &Case) -> Result<(Config, equarx::Rewritten), String> {
    let parsed = equarx::text::parse(&c.hlo()).map_err(|e| format!("generated HLO: {e}"))?;
    let r = equarx::rewrite(parsed.proto, parsed.counts, &c.rewrite_options())
        .map_err(|e| format!("rewrite failed: {e}"))?;
    let op = &r.report[0];
    if !op.rewritten {
        return Err(format!("not rewritten: {:?}", op.reason));
    }
    let config = op.plan.as_ref().ok_or("no plan")?.config.clone();
    Ok((config, r))
}

/// The simulator checks on one case; `Err` says what broke.
fn check(c: &Case) -> Result<(), String> {
    let (config, _) = rewrite(c)?;
    let values = inputs(c);
    for group in c.groups.lists() {
        let p = group.len();
        let plan = plan_of(c, &config, p);
        let ins: Vec<Vec<Vec<f32>>> = group.iter().map(|&d| values[d].clone()).collect();
        let sim = simulated(&c.layout(), &plan, &ins);
        let want = exact(&c.layout(), &ins);
        if agrees(c.collective) {
            for r in 1..p {
                if sim[r]
                    .iter()
                    .zip(&sim[0])
                    .any(|(a, b)| a.to_bits() != b.to_bits())
                {
                    return Err(format!("rank {r} of {group:?} differs from rank 0"));
                }
            }
        }
        let rows: Vec<Vec<f32>> = ins.iter().map(|x| x.concat()).collect();
        for r in 0..p {
            let measured = rel_rms(&sim[r], &want[r]);
            let exact_f32: Vec<f32> = want[r].iter().map(|&x| x as f32).collect();
            let crest = simulate::crest_seen(&rows, &exact_f32, plan.block(), config.rotation);
            let bound = 1.25 * rel_rms_with_crest(&plan, crest, 7);
            // A NaN error fails too.
            if measured.is_nan() || measured > bound {
                return Err(format!(
                    "rank {r} of {group:?}: error {measured:.5} > bound {bound:.5}"
                ));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: CASES,
        max_shrink_iters: 200,
        rng_seed: common::property_seed(0x0e9a_2026_1202),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_collective_kind_keeps_the_numerics_contract(c in case()) {
        check(&c).map_err(|e| TestCaseError::fail(format!("{e}\n{c:?}\n{}", c.hlo())))?;
    }
}

fn sample(seed: u8, n: usize) -> Vec<Case> {
    let mut runner = TestRunner::new_with_rng(
        RunnerConfig::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]),
    );
    let strategy = case();
    (0..n)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect()
}

/// The generator reaches every kind, form and option it promises (so the
/// property is not vacuous).
#[test]
fn the_collective_generator_covers_the_space() {
    let mut seen = BTreeSet::new();
    for c in sample(9, 300) {
        seen.insert(format!("{:?}", c.collective));
        seen.insert(format!("{:?}", c.groups));
        seen.insert(format!("{:?}", c.options.quant_format));
        seen.insert(format!("{:?}", c.options.rotation));
        seen.insert(format!("{:?}", c.options.algorithm));
        seen.insert(format!("{:?}", c.options.gather));
        if c.collective == Collective::AllToAll && c.dim.is_none() {
            seen.insert("tuple".into());
        }
        if c.options.unroll {
            seen.insert("unroll".into());
        }
    }
    for want in [
        "AllReduce",
        "ReduceScatter",
        "AllGather",
        "AllToAll",
        "All",
        "TwoOfFour",
        "Strided",
        "Pairs",
        "Replicas",
        "Int8",
        "Fp8E4m3",
        "Fp8E5m2",
        "Int4",
        "Some(Hadamard)",
        "Some(None)",
        "Some(Ring)",
        "Some(TwoShot)",
        "Some(TwoLevel)",
        "Permute",
        "tuple",
        "unroll",
    ] {
        assert!(seen.contains(want), "{want} never generated: {seen:?}");
    }
}

/// A fixed-seed sample, two cases of each kind, in real XLA on 8 CPU
/// devices: XLA equals the simulator bit for bit on every rank, and the
/// ranks of an all-reduce or all-gather group hold the same bits.
#[test]
fn a_sample_of_every_kind_matches_the_simulator_in_xla() {
    let mut cases: Vec<Case> = Vec::new();
    for c in sample(42, 400) {
        let kind_count = cases
            .iter()
            .filter(|k| k.collective == c.collective)
            .count();
        if kind_count < 2 && rewrite(&c).is_ok() {
            cases.push(c);
        }
    }
    assert_eq!(cases.len(), 8, "two of each kind");
    let dir = scratch("collective_properties_xla");
    let mut jobs = Vec::new();
    let mut runs = Vec::new();
    for (n, c) in cases.iter().enumerate() {
        let (config, r) = rewrite(c).unwrap();
        let cdir = dir.join(format!("case{n}"));
        std::fs::create_dir_all(&cdir).unwrap();
        std::fs::write(cdir.join("case.hlo"), c.hlo()).unwrap();
        let path = cdir.join("rewritten.pb");
        std::fs::write(&path, r.module.encode_to_vec()).unwrap();
        let values = inputs(c);
        let params: Vec<(String, Vec<i64>)> = (0..c.operands())
            .map(|_| ("bf16".to_string(), c.dims.clone()))
            .collect();
        let spec = write_inputs(&cdir, &params, &values);
        let (replicas, partitions) = c.groups.counts();
        jobs.push(json!({
            "kind": "run", "module": path, "num_partitions": partitions,
            "num_replicas": replicas, "inputs": spec, "outputs_dir": cdir.join("out"),
        }));
        runs.push((config, values, cdir));
    }
    let results = run_xla(&dir, &jobs);
    let mut failures = Vec::new();
    for (n, (c, ((config, values, cdir), res))) in
        cases.iter().zip(runs.iter().zip(&results)).enumerate()
    {
        if res["ok"] != true {
            failures.push(format!(
                "case {n}: XLA refused it: {}\n{}",
                res["error"],
                c.hlo()
            ));
            continue;
        }
        let got = outputs(res, &cdir.join("out"), 8);
        for group in c.groups.lists() {
            let p = group.len();
            let plan = plan_of(c, config, p);
            let ins: Vec<Vec<Vec<f32>>> = group.iter().map(|&d| values[d].clone()).collect();
            let sim = simulated(&c.layout(), &plan, &ins);
            for (r, &d) in group.iter().enumerate() {
                let xla = got[d].concat();
                if let Some(i) = sim[r]
                    .iter()
                    .zip(&xla)
                    .position(|(a, b)| a.to_bits() != b.to_bits())
                {
                    failures.push(format!(
                        "case {n} {:?} {:?}: device {d} differs from the simulator at {i} \
                         ({} vs XLA {})",
                        c.collective, c.groups, sim[r][i], xla[i]
                    ));
                }
                if agrees(c.collective) && xla != got[group[0]].concat() {
                    failures.push(format!("case {n}: device {d} differs from {}", group[0]));
                }
            }
        }
        println!(
            "case {n}: {:?} {:?} dims {:?} dim {:?}: {:?}",
            c.collective, c.groups, c.dims, c.dim, config
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
