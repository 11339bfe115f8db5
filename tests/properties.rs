//! Property tests: random all-reduce modules through the pass
//! (`tests/common/random_modules.rs` makes them: shapes of rank 0–4 with odd
//! and zero sizes, bf16/f16/f32/f64/s32/s8/pred, 1–3 operands, 1–3 groups of
//! 1–5, list/iota/mesh-axes/empty groups, every group mode and replica ×
//! partition layout, B, D, bidirectional, scale type, gather form, minimum
//! payload, enabled types).
//!
//! For every case:
//! - `equarx::rewrite` succeeds, so equarx's verifier accepted the input
//!   and the output (the pipeline runs it before and after the pass);
//! - the all-reduce is rewritten exactly when an oracle written without the
//!   pass says it must be (sum, enabled float type, expressible groups of
//!   P ≥ 2, payload over the minimum, fewer bytes on the wire);
//! - every op not rewritten is untouched, and a module with nothing
//!   rewritten comes back byte-identical;
//! - the wire bytes in the report are `Plan::wire_bytes` of the plan the
//!   oracle makes, the same as counted from the emitted collectives, and the
//!   emitted collective-permutes stay inside the groups;
//! - a second run gives the same bytes.
//!
//! A sample of six eligible cases also runs in real XLA (one batch): exact
//! sum within the error bound, bit-identical replicas, and the bit-exact
//! simulator where it applies. The other collectives (reduce-scatter,
//! all-gather, all-to-all) have their own: `tests/collective_properties.rs`.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::random_modules::{Case, Mode, Ty, case};
use common::{Rng, read_values, run_xla, scratch};
use equarx::ir::shape;
use equarx::plan::{Phase, ring_wire_bytes};
use equarx::proto::{HloInstructionProto, HloModuleProto};
use equarx::{FuseMode, GatherForm, OpReport};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use prost::Message;
use serde_json::{Value, json};

/// Property cases per run (each a parse and two rewrites; ~2 s in all).
const CASES: u32 = 256;

fn instructions(m: &HloModuleProto) -> impl Iterator<Item = &HloInstructionProto> {
    m.computations.iter().flat_map(|c| &c.instructions)
}

fn by_name<'a>(m: &'a HloModuleProto, name: &str) -> Option<&'a HloInstructionProto> {
    instructions(m).find(|i| i.name == name)
}

/// Bytes of an instruction's first operand (looked up in its computation).
/// How often each `while` body of the module runs: the s32 constant its
/// condition compares the counter with (equarx's loops count from 0).
fn trip_counts(m: &HloModuleProto) -> BTreeMap<i64, u64> {
    let mut trips = BTreeMap::new();
    for i in instructions(m).filter(|i| i.opcode == "while") {
        let (body, cond) = (i.called_computation_ids[0], i.called_computation_ids[1]);
        let cond = m
            .computations
            .iter()
            .find(|c| c.id == cond)
            .expect("condition");
        let bound = cond
            .instructions
            .iter()
            .find_map(|i| i.literal.as_ref().and_then(|l| l.s32s.first().copied()))
            .expect("a trip count constant");
        trips.insert(body, bound as u64);
    }
    trips
}

fn operand_bytes(m: &HloModuleProto, i: &HloInstructionProto) -> u64 {
    let c = m
        .computations
        .iter()
        .find(|c| c.instructions.iter().any(|x| x.id == i.id))
        .expect("instruction in a computation");
    let op = c
        .instructions
        .iter()
        .find(|x| Some(&x.id) == i.operand_ids.first())
        .expect("operand exists");
    shape::byte_size(op.shape.as_ref().expect("shape")).expect("array operand")
}

fn parse(c: &Case) -> equarx::text::ParsedText {
    equarx::text::parse(&c.hlo()).unwrap_or_else(|e| panic!("generated HLO: {e}\n{}", c.hlo()))
}

/// Checks one case; `Err` says what broke (proptest shrinks on it).
fn check(c: &Case) -> Result<(), TestCaseError> {
    let parsed = parse(c);
    let input = parsed.proto;
    let options = c.rewrite_options();
    let r = equarx::rewrite(input.clone(), parsed.counts, &options)
        .map_err(|e| TestCaseError::fail(format!("rewrite failed: {e}\n{}", c.hlo())))?;
    let report: BTreeMap<&str, &OpReport> =
        r.report.iter().map(|o| (o.op.name.as_str(), o)).collect();
    let ar = report["ar"];
    let expected = c.expected();
    prop_assert_eq!(
        ar.rewritten,
        expected.is_some(),
        "oracle and pass disagree ({:?}): {:#?}\n{}",
        ar.reason,
        ar,
        c.hlo()
    );
    if let Some(ints) = report.get("ints") {
        prop_assert!(!ints.rewritten, "an s32 all-reduce was rewritten");
    }
    prop_assert_eq!(r.changed, expected.is_some());

    // Whatever is not rewritten is untouched.
    for o in r.report.iter().filter(|o| !o.rewritten) {
        prop_assert_eq!(
            by_name(&r.module, &o.op.name),
            by_name(&input, &o.op.name),
            "{} changed without being rewritten",
            &o.op.name
        );
    }
    if !r.changed {
        prop_assert!(
            r.module.encode_to_vec() == input.encode_to_vec(),
            "nothing rewritten, yet the module's bytes changed"
        );
        return Ok(());
    }
    let plan = expected.expect("rewritten");
    let p = plan.group_size;

    // The wire bytes: the report, the formula and the emitted collectives.
    let payload: u64 = c
        .operands
        .iter()
        .filter(|o| c.joins(o))
        .map(|o| o.elements() * o.ty.bytes())
        .sum();
    prop_assert_eq!(ar.wire_bytes_before, Some(ring_wire_bytes(p, payload)));
    prop_assert_eq!(ar.wire_bytes_after, Some(plan.wire_bytes()));
    let summary = ar.plan.as_ref().expect("a plan summary");
    prop_assert_eq!(summary.lanes, plan.lanes.len());
    prop_assert_eq!(summary.collective_steps, plan.collective_steps());
    // Collective ops written: a loop's body once, unrolled every step; a
    // collective per array of a message.
    let unrolled = c.options.unroll;
    let written: u64 = plan
        .phases
        .iter()
        .map(|ph| match ph {
            Phase::Ring { axis } => {
                plan.lanes.len() as u64 * if unrolled { axis.size as u64 - 1 } else { 1 }
            }
            Phase::Exchange { .. } | Phase::Scatter => 1,
            Phase::Gather => match plan.config.gather {
                GatherForm::AllGather => 1,
                GatherForm::Permute => {
                    plan.relay_directions().len() as u64 * if unrolled { p as u64 - 1 } else { 1 }
                }
            },
        })
        .sum::<u64>()
        * plan.config.wire.arrays() as u64;
    prop_assert_eq!(summary.collectives as u64, written);
    let trips = trip_counts(&r.module);
    let mut counted = 0u64;
    let groups = c.participant_groups().expect("expressible");
    let group_of: BTreeMap<i64, usize> = groups
        .iter()
        .enumerate()
        .flat_map(|(g, ids)| ids.iter().map(move |&id| (id, g)))
        .collect();
    let partition_space = matches!(
        (c.mode, c.layout),
        (
            Mode::Flattened | Mode::CrossReplicaAndPartition,
            common::random_modules::Layout::Partitions
        )
    );
    for (comp, i) in r
        .module
        .computations
        .iter()
        .flat_map(|c| c.instructions.iter().map(move |i| (c.id, i)))
    {
        let runs = trips.get(&comp).copied().unwrap_or(1);
        match i.opcode.as_str() {
            "all-to-all" => counted += (p as u64 - 1) * operand_bytes(&r.module, i) / p as u64,
            "collective-permute" => {
                counted += runs * operand_bytes(&r.module, i);
                prop_assert_eq!(i.channel_id > 0, partition_space, "{}", &i.name);
                let mut sources = BTreeSet::new();
                for pair in &i.source_target_pairs {
                    prop_assert_eq!(
                        group_of.get(&pair.source),
                        group_of.get(&pair.target),
                        "{} sends across groups",
                        &i.name
                    );
                    prop_assert!(sources.insert(pair.source));
                }
                prop_assert_eq!(sources.len(), group_of.len());
            }
            "all-gather" => counted += (p as u64 - 1) * operand_bytes(&r.module, i),
            _ => {}
        }
    }
    prop_assert_eq!(
        counted,
        plan.wire_bytes(),
        "emitted collectives vs the plan"
    );

    // No loop fusions: the random modules are unfused, and a module before
    // XLA's fusion never gets any (XLA:GPU's layout assignment aborts on
    // them).
    let fused = r
        .module
        .computations
        .iter()
        .any(|k| k.name.starts_with("equarx_fused"));
    prop_assert!(!fused, "fusions outlined into an unfused module");

    // Deterministic.
    let again = equarx::rewrite(input, parsed.counts, &options).expect("second run");
    prop_assert!(again.module.encode_to_vec() == r.module.encode_to_vec());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: CASES,
        max_shrink_iters: 2000,
        rng_seed: common::property_seed(0x0e9a_2026_1203),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_all_reduces_keep_the_pass_contract(c in case()) {
        check(&c)?;
    }
}

/// The strategy reaches every branch of the oracle (so the property above
/// is not vacuous): over a fixed-seed sample, both outcomes, every mode,
/// encoding and element type occur.
#[test]
fn the_generator_covers_the_space() {
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let strategy = case();
    let (mut rewritten, mut skipped) = (0, 0);
    let mut seen = BTreeSet::new();
    for _ in 0..400 {
        let c = strategy.new_tree(&mut runner).unwrap().current();
        if c.expected().is_some() {
            rewritten += 1;
        } else {
            skipped += 1;
        }
        seen.insert(format!("{:?}", c.mode));
        seen.insert(format!("{:?}", c.encoding));
        seen.insert(format!("{:?}", c.layout));
        for o in &c.operands {
            seen.insert(format!("{:?}", o.ty));
            seen.insert(format!("rank{}", o.dims.len()));
        }
        if c.operands.len() > 1 {
            seen.insert("tuple".into());
        }
    }
    println!("{rewritten} rewritten, {skipped} skipped; seen {seen:?}");
    assert!(rewritten >= 80 && skipped >= 80, "{rewritten} / {skipped}");
    for want in [
        "CrossReplica",
        "CrossReplicaAndPartition",
        "Flattened",
        "List",
        "Iota",
        "MeshAxes",
        "Empty",
        "Replicas",
        "Partitions",
        "Both",
        "Bf16",
        "F16",
        "F32",
        "F64",
        "S32",
        "S8",
        "Pred",
        "rank0",
        "rank4",
        "tuple",
    ] {
        assert!(seen.contains(want), "{want} never generated");
    }
}

/// Six eligible random cases (fixed seed) run in real XLA on up to 8 CPU
/// devices: every output element within the worst-case quantization bound
/// of the exact sum, the relative RMS within the error model's bound where
/// there are enough elements for it to mean something, replicas of a group
/// bit-identical, and single-operand cases equal to the bit-exact simulator.
#[test]
fn six_random_cases_run_in_xla() {
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[42; 32]),
    );
    let strategy = case();
    let mut cases: Vec<Case> = Vec::new();
    let mut tries = 0;
    while cases.len() < 6 {
        tries += 1;
        assert!(tries < 100_000, "no eligible cases found");
        let mut c = strategy.new_tree(&mut runner).unwrap().current();
        c.with_integer_all_reduce = false;
        let ty = c.operands[0].ty;
        let elements: u64 = c.operands.iter().map(|o| o.elements()).sum();
        let ok = c.expected().is_some()
            && matches!(ty, Ty::Bf16 | Ty::F32)
            && c.operands.iter().all(|o| o.ty == ty && c.joins(o))
            && (2..=8).contains(&c.devices())
            && elements <= 20_000
            // A variety: not six of the same mode.
            && cases.iter().filter(|k| k.mode == c.mode).count() < 3;
        if ok {
            cases.push(c);
        }
    }
    let dir = scratch("properties_xla");
    let mut jobs = Vec::new();
    let mut inputs_of = Vec::new();
    for (n, c) in cases.iter().enumerate() {
        let parsed = parse(c);
        // XLA compiles these from the start (through MLIR): fusion is its own
        // job there, and its layout assignment refuses equarx's bitcasts.
        let mut options = c.rewrite_options();
        options.pass.fuse = FuseMode::Off;
        let r = equarx::rewrite(parsed.proto, parsed.counts, &options).unwrap();
        assert!(r.changed, "case {n}: {:#?}", r.report);
        let cdir = dir.join(format!("case{n}"));
        std::fs::create_dir_all(&cdir).unwrap();
        std::fs::write(cdir.join("case.hlo"), c.hlo()).unwrap();
        let module = cdir.join("rewritten.pb");
        std::fs::write(&module, r.module.encode_to_vec()).unwrap();
        let mut rng = Rng::new(1000 + n as u64);
        let devices = c.devices();
        // values[d][k]: operand k on device d, rounded to its type.
        let values: Vec<Vec<Vec<f32>>> = (0..devices)
            .map(|_| {
                c.operands
                    .iter()
                    .map(|o| {
                        (0..o.elements())
                            .map(|_| {
                                let x = rng.gaussian() as f32;
                                if o.ty == Ty::Bf16 {
                                    half::bf16::from_f32(x).to_f32()
                                } else {
                                    x
                                }
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let spec: Vec<Value> = values
            .iter()
            .enumerate()
            .map(|(d, per)| {
                Value::Array(
                    per.iter()
                        .enumerate()
                        .map(|(k, v)| {
                            let o = &c.operands[k];
                            let path = cdir.join(format!("dev{d}_in{k}.bin"));
                            let bytes = if o.ty == Ty::Bf16 {
                                common::bf16_bytes(v)
                            } else {
                                common::f32_bytes(v)
                            };
                            std::fs::write(&path, bytes).unwrap();
                            json!({"path": path, "dtype": o.ty.name(), "shape": o.dims})
                        })
                        .collect(),
                )
            })
            .collect();
        let (replicas, partitions) = c.counts();
        jobs.push(json!({
            "kind": "run",
            "module": module,
            "num_replicas": replicas,
            "num_partitions": partitions,
            "inputs": spec,
            "outputs_dir": cdir.join("out"),
        }));
        inputs_of.push((values, cdir));
    }
    let results = run_xla(&dir, &jobs);
    let mut failures = Vec::new();
    for (n, c) in cases.iter().enumerate() {
        let (values, cdir) = &inputs_of[n];
        let res = &results[n];
        if res["ok"] != true {
            failures.push(format!(
                "case {n}: XLA refused it: {}\n{}",
                res["error"],
                c.hlo()
            ));
            continue;
        }
        let groups = c.participant_groups().unwrap();
        let plan = c.expected().unwrap();
        let b = c.options.block_size;
        let k_count = c.operands.len();
        let got: Vec<Vec<Vec<f32>>> = (0..c.devices())
            .map(|d| {
                (0..k_count)
                    .map(|k| {
                        let dtype = res["outputs"][k]["dtype"].as_str().unwrap();
                        read_values(&cdir.join("out").join(format!("dev{d}_out{k}.bin")), dtype)
                    })
                    .collect()
            })
            .collect();
        for group in &groups {
            let g: Vec<usize> = group.iter().map(|&i| i as usize).collect();
            for &d in &g[1..] {
                if got[d].iter().zip(&got[g[0]]).any(|(a, b)| {
                    a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits())
                }) {
                    failures.push(format!("case {n}: device {d} differs from {}", g[0]));
                }
            }
            // The packed payload of each device, operand after operand: the
            // quantization blocks are B consecutive elements of it.
            let packed: Vec<Vec<f32>> = g.iter().map(|&d| values[d].concat()).collect();
            let exact: Vec<f64> = (0..packed[0].len())
                .map(|i| packed.iter().map(|v| f64::from(v[i])).sum())
                .collect();
            let out: Vec<f32> = got[g[0]].concat();
            assert_eq!(out.len(), exact.len(), "case {n}: output size");
            // Worst case: each of the P quantizations of an element errs by
            // at most half a step of its block, and no partial sum's block
            // maximum exceeds the sum of the inputs' block maxima.
            let p = g.len() as f64;
            let mut worst_ratio: f64 = 0.0;
            for (blk, chunk) in exact.chunks(b).enumerate() {
                let a: f64 = packed
                    .iter()
                    .map(|v| {
                        v[blk * b..(blk * b + chunk.len())]
                            .iter()
                            .fold(0.0f64, |m, x| m.max(f64::from(x.abs())))
                    })
                    .sum();
                for (j, &e) in chunk.iter().enumerate() {
                    let i = blk * b + j;
                    let rounding = if c.operands[0].ty == Ty::Bf16 {
                        e.abs() * 2f64.powi(-8) + 1e-30
                    } else {
                        e.abs() * 2f64.powi(-23)
                    };
                    let bound = 1.1 * p * a / 254.0 + rounding;
                    let err = (f64::from(out[i]) - e).abs();
                    worst_ratio = worst_ratio.max(err / bound.max(f64::MIN_POSITIVE));
                    if err > bound {
                        failures.push(format!(
                            "case {n}: element {i}: {} vs exact {e}: error {err} > worst case {bound}",
                            out[i]
                        ));
                        break;
                    }
                }
            }
            // The statistical model, where the sample is large enough.
            if exact.len() >= 1024 {
                let (mut num, mut den) = (0.0, 0.0);
                for (&o, &e) in out.iter().zip(&exact) {
                    num += (f64::from(o) - e).powi(2);
                    den += e * e;
                }
                let measured = (num / den).sqrt();
                let exact_f32: Vec<f32> = exact.iter().map(|&x| x as f32).collect();
                let crest = equarx::numerics::simulate::crest_seen(
                    &packed,
                    &exact_f32,
                    b,
                    plan.config.rotation,
                );
                let bits = if c.operands[0].ty == Ty::Bf16 { 7 } else { 23 };
                let bound = 1.25 * equarx::numerics::error::rel_rms_with_crest(&plan, crest, bits);
                if measured > bound {
                    failures.push(format!(
                        "case {n}: relative RMS {measured:.5} > model bound {bound:.5}"
                    ));
                }
            }
            // Single operand: the simulator reproduces XLA bit for bit.
            if k_count == 1 {
                let inputs: Vec<Vec<f32>> = g.iter().map(|&d| values[d][0].clone()).collect();
                let sim = equarx::numerics::simulate::quantized_all_reduce(&inputs, &plan, false);
                let sim = if c.operands[0].ty == Ty::Bf16 {
                    equarx::numerics::simulate::to_bf16(&sim)
                } else {
                    sim
                };
                if sim
                    .iter()
                    .zip(&out)
                    .any(|(a, b)| a.to_bits() != b.to_bits())
                {
                    failures.push(format!(
                        "case {n}: XLA differs from the bit-exact simulator"
                    ));
                }
            }
            println!(
                "case {n}: {:?} {:?} P={} operands {:?} B={} D={} bidirectional={} {:?} {:?} \
                 {} {:?} {:?}: worst error / worst-case bound = {worst_ratio:.3}",
                c.mode,
                c.encoding,
                g.len(),
                c.operands.iter().map(|o| o.text()).collect::<Vec<_>>(),
                b,
                c.options.pipeline_depth,
                c.options.bidirectional,
                c.options.scale_type,
                c.options.gather,
                plan.config.algorithm,
                plan.config.rotation,
                plan.config.form,
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
