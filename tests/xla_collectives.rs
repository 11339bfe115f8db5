//! Real XLA runs the rewritten reduce-scatters, all-gathers and
//! all-to-alls.
//!
//! Each case is a small module holding one collective (written as HLO text
//! here, in every group mode the pass can express), rewritten by the pass,
//! then compiled and executed by pinned jaxlib on 8 virtual CPU devices
//! with seeded Gaussian and outlier-heavy inputs. Required: every device's
//! result is within the error model's bound of the exact result, the
//! devices that must agree (an all-gather's group) hold bit-identical
//! results, a NaN input makes exactly its block non-finite, and the
//! simulator reproduces XLA bit for bit. All jobs go to XLA in one batch.

mod common;

use common::{Rng, outputs, rel_rms, run_xla, scratch, write_inputs};
use equarx::numerics::error::rel_rms_with_crest;
use equarx::numerics::simulate;
use equarx::plan::{Algorithm, Rotation};
use equarx::plan::{Collective, Plan, QuantFormat};
use equarx::proto::HloModuleProto;
use equarx::{DeviceCounts, GatherForm, Options, RewriteOptions};
use prost::Message;
use serde_json::json;

/// How the groups are written, and in which id space.
#[derive(Clone, Copy, Debug)]
enum Groups {
    /// One group of 8 partitions, flattened ids (what JAX SPMD emits).
    All,
    /// {0..3}, {4..7} as partition ids.
    TwoOfFour,
    /// {0,2,4,6}, {1,3,5,7}.
    Strided,
    /// No channel id: 8 replicas.
    Replicas,
}

impl Groups {
    fn lists(self) -> Vec<Vec<usize>> {
        match self {
            Groups::All | Groups::Replicas => vec![(0..8).collect()],
            Groups::TwoOfFour => vec![(0..4).collect(), (4..8).collect()],
            Groups::Strided => vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]],
        }
    }

    fn counts(self) -> (usize, usize) {
        match self {
            Groups::Replicas => (8, 1),
            _ => (1, 8),
        }
    }
}

/// The case's module.
fn module(c: &Case) -> HloModuleProto {
    common::modules::collective_module(&common::modules::CollectiveSpec {
        name: &c.name,
        collective: c.collective,
        dims: &c.dims,
        dim: c.dim,
        groups: &c.groups.lists(),
        replicas: matches!(c.groups, Groups::Replicas),
        async_pair: c.async_pair,
    })
}

/// What one case runs: `op` of a bf16 operand of `dims` along `dim`.
#[derive(Clone)]
struct Case {
    name: String,
    collective: Collective,
    dims: Vec<i64>,
    /// The collective's dimension; `None`: a tuple all-to-all of 8
    /// operands of `dims`.
    dim: Option<i64>,
    groups: Groups,
    options: RewriteOptions,
    /// Written as an async pair (all-gather-start / -done).
    async_pair: bool,
}

/// Row-major `v` of `dims` cut along `d` into `p` equal pieces.
fn split(v: &[f32], dims: &[i64], d: usize, p: usize) -> Vec<Vec<f32>> {
    let before: usize = dims[..d].iter().product::<i64>() as usize;
    let size = dims[d] as usize;
    let after: usize = dims[d + 1..].iter().product::<i64>() as usize;
    let piece = size / p;
    (0..p)
        .map(|k| {
            (0..before)
                .flat_map(|a| {
                    let start = a * size * after + k * piece * after;
                    v[start..start + piece * after].iter().copied()
                })
                .collect()
        })
        .collect()
}

/// Pieces of `dims` each, laid side by side along `d`.
fn concat(pieces: &[Vec<f32>], dims: &[i64], d: usize) -> Vec<f32> {
    let before: usize = dims[..d].iter().product::<i64>() as usize;
    let run: usize = dims[d..].iter().product::<i64>() as usize;
    (0..before)
        .flat_map(|a| {
            pieces
                .iter()
                .flat_map(move |p| p[a * run..(a + 1) * run].iter().copied())
        })
        .collect()
}

/// The exact result on each rank of a group, given the group's inputs
/// (per rank, per operand), in f64.
fn exact(c: &Case, inputs: &[Vec<Vec<f32>>]) -> Vec<Vec<f64>> {
    let p = inputs.len();
    let to64 = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<f64>>();
    match (c.collective, c.dim) {
        (Collective::ReduceScatter, Some(d)) => (0..p)
            .map(|r| {
                let mut sum = vec![0.0f64; inputs[0][0].len() / p];
                for x in inputs {
                    for (s, v) in sum.iter_mut().zip(&split(&x[0], &c.dims, d as usize, p)[r]) {
                        *s += f64::from(*v);
                    }
                }
                sum
            })
            .collect(),
        (Collective::AllGather, Some(d)) => {
            let pieces: Vec<Vec<f32>> = inputs.iter().map(|x| x[0].clone()).collect();
            vec![to64(concat(&pieces, &c.dims, d as usize)); p]
        }
        (Collective::AllToAll, Some(d)) => {
            let mut piece_dims = c.dims.clone();
            piece_dims[d as usize] /= p as i64;
            (0..p)
                .map(|r| {
                    let pieces: Vec<Vec<f32>> = inputs
                        .iter()
                        .map(|x| split(&x[0], &c.dims, d as usize, p)[r].clone())
                        .collect();
                    to64(concat(&pieces, &piece_dims, d as usize))
                })
                .collect()
        }
        // Tuple: rank r's result k is rank k's operand r.
        (Collective::AllToAll, None) => (0..p)
            .map(|r| to64(inputs.iter().flat_map(|x| x[r].clone()).collect()))
            .collect(),
        _ => unreachable!(),
    }
}

/// The simulator's answer per rank, laid out like the result.
fn simulated(c: &Case, plan: &Plan, inputs: &[Vec<Vec<f32>>]) -> Vec<Vec<f32>> {
    let p = inputs.len();
    // The simulator takes each rank's operand as its rows.
    let rows: Vec<Vec<f32>> = inputs
        .iter()
        .map(|x| match (c.collective, c.dim) {
            (Collective::AllGather, _) => x[0].clone(),
            (_, Some(d)) => split(&x[0], &c.dims, d as usize, p).concat(),
            (_, None) => x.concat(),
        })
        .collect();
    let got = simulate::run(&rows, plan, true);
    got.into_iter()
        .map(|v| {
            let v = simulate::to_bf16(&v);
            match (c.collective, c.dim) {
                (Collective::ReduceScatter, _) | (_, None) => v,
                (Collective::AllGather, Some(d)) => {
                    let pieces: Vec<Vec<f32>> =
                        v.chunks(v.len() / p).map(<[f32]>::to_vec).collect();
                    concat(&pieces, &c.dims, d as usize)
                }
                (_, Some(d)) => {
                    let mut piece_dims = c.dims.clone();
                    piece_dims[d as usize] /= p as i64;
                    let pieces: Vec<Vec<f32>> =
                        v.chunks(v.len() / p).map(<[f32]>::to_vec).collect();
                    concat(&pieces, &piece_dims, d as usize)
                }
            }
        })
        .collect()
}

fn opts(edit: impl FnOnce(&mut Options)) -> RewriteOptions {
    let mut o = RewriteOptions::default();
    o.pass.min_payload_bytes = Some(0);
    edit(&mut o.pass);
    o
}

fn cases() -> Vec<Case> {
    let case = |name: &str, collective, dims: &[i64], dim, groups| Case {
        name: name.into(),
        collective,
        dims: dims.to_vec(),
        dim,
        groups,
        options: opts(|_| {}),
        async_pair: false,
    };
    let mut v = Vec::new();
    // Every op in every group mode, along the major dimension and along
    // one with dimensions before it.
    for groups in [
        Groups::All,
        Groups::TwoOfFour,
        Groups::Strided,
        Groups::Replicas,
    ] {
        let g = format!("{groups:?}").to_lowercase();
        v.push(case(
            &format!("rs_{g}"),
            Collective::ReduceScatter,
            &[64, 512],
            Some(0),
            groups,
        ));
        v.push(case(
            &format!("ag_{g}"),
            Collective::AllGather,
            &[16, 512],
            Some(0),
            groups,
        ));
        v.push(case(
            &format!("a2a_{g}"),
            Collective::AllToAll,
            &[64, 512],
            Some(0),
            groups,
        ));
    }
    v.push(case(
        "rs_dim1",
        Collective::ReduceScatter,
        &[16, 2048],
        Some(1),
        Groups::All,
    ));
    v.push(case(
        "ag_dim1",
        Collective::AllGather,
        &[16, 256],
        Some(1),
        Groups::All,
    ));
    v.push(case(
        "a2a_dim1",
        Collective::AllToAll,
        &[16, 2048],
        Some(1),
        Groups::All,
    ));
    v.push(case(
        "a2a_tuple",
        Collective::AllToAll,
        &[8, 512],
        None,
        Groups::All,
    ));
    // Rows that are no whole number of blocks: each is padded on its own.
    v.push(case(
        "rs_padded",
        Collective::ReduceScatter,
        &[8, 600],
        Some(1),
        Groups::All,
    ));
    let mut c = case(
        "ag_async",
        Collective::AllGather,
        &[16, 512],
        Some(0),
        Groups::All,
    );
    c.async_pair = true;
    v.push(c);
    // The reduce-scatter's algorithms and forms, and rotation for each op.
    type Edit = fn(&mut Options);
    let variants: [(&str, Edit); 6] = [
        ("ring", |o| {
            (o.algorithm, o.rotation) = (Some(Algorithm::Ring), Some(Rotation::None))
        }),
        ("two_shot", |o| o.algorithm = Some(Algorithm::TwoShot)),
        ("two_level", |o| o.algorithm = Some(Algorithm::TwoLevel)),
        ("unrolled", |o| {
            (o.algorithm, o.unroll) = (Some(Algorithm::Ring), true)
        }),
        ("hadamard", |o| o.rotation = Some(Rotation::Hadamard)),
        ("norot", |o| o.rotation = Some(Rotation::None)),
    ];
    for (suffix, edit) in variants {
        let mut c = case(
            &format!("rs_{suffix}"),
            Collective::ReduceScatter,
            &[64, 512],
            Some(0),
            Groups::All,
        );
        c.options = opts(edit);
        v.push(c);
    }
    for (name, collective, dims, rotation) in [
        (
            "ag_hadamard",
            Collective::AllGather,
            [16i64, 512],
            Some(Rotation::Hadamard),
        ),
        (
            "a2a_hadamard",
            Collective::AllToAll,
            [64, 512],
            Some(Rotation::Hadamard),
        ),
        (
            "ag_norot",
            Collective::AllGather,
            [16i64, 512],
            Some(Rotation::None),
        ),
        (
            "a2a_norot",
            Collective::AllToAll,
            [64, 512],
            Some(Rotation::None),
        ),
    ] {
        let mut c = case(name, collective, &dims, Some(0), Groups::All);
        c.options = opts(|o| o.rotation = rotation);
        v.push(c);
    }
    let mut c = case(
        "ag_permute",
        Collective::AllGather,
        &[16, 512],
        Some(0),
        Groups::All,
    );
    c.options = opts(|o| o.gather = GatherForm::Permute);
    v.push(c);
    // Every format on every op.
    for (suffix, format) in [
        ("fp8_e4m3", QuantFormat::Fp8E4m3),
        ("fp8_e5m2", QuantFormat::Fp8E5m2),
        ("int4", QuantFormat::Int4),
    ] {
        for (op, collective, dims) in [
            ("rs", Collective::ReduceScatter, [64i64, 512]),
            ("ag", Collective::AllGather, [16, 512]),
            ("a2a", Collective::AllToAll, [64, 512]),
        ] {
            let mut c = case(
                &format!("{op}_{suffix}"),
                collective,
                &dims,
                Some(0),
                Groups::All,
            );
            // int4 is over the model limit the pass's own choice keeps:
            // a budget of the user's takes it.
            c.options = opts(|o| {
                o.quant_format = format;
                if format == QuantFormat::Int4 {
                    o.max_error_pct = Some(100.0);
                }
            });
            v.push(c);
        }
    }
    v
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Data {
    Gaussian,
    Outliers,
    Poisoned,
}

#[test]
fn rewritten_collectives_run_in_xla_with_bounded_error() {
    let dir = scratch("xla_collectives");
    let cases = cases();
    let mut jobs = Vec::new();
    let mut runs = Vec::new();
    for (ci, c) in cases.iter().enumerate() {
        let module = module(c);
        let (replicas, partitions) = c.groups.counts();
        let counts = DeviceCounts {
            replica_count: Some(replicas as i64),
            num_partitions: Some(partitions as i64),
        };
        let r = equarx::rewrite(module, counts, &c.options)
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert!(
            r.changed && r.report[0].rewritten,
            "{}: {:#?}",
            c.name,
            r.report
        );
        let cdir = dir.join(&c.name);
        std::fs::create_dir_all(&cdir).unwrap();
        let path = cdir.join("rewritten.pb");
        std::fs::write(&path, r.module.encode_to_vec()).unwrap();
        let operands = if c.dim.is_none() { 8 } else { 1 };
        let params: Vec<(String, Vec<i64>)> = (0..operands)
            .map(|_| ("bf16".into(), c.dims.clone()))
            .collect();
        for (di, data) in [Data::Gaussian, Data::Outliers, Data::Poisoned]
            .into_iter()
            .enumerate()
        {
            let mut rng = Rng::new(7000 + (ci * 10 + di) as u64);
            let n: i64 = c.dims.iter().product();
            let values: Vec<Vec<Vec<f32>>> = (0..8)
                .map(|_| {
                    (0..operands)
                        .map(|_| {
                            (0..n)
                                .map(|_| {
                                    let x = rng.gaussian() as f32;
                                    let x = if data == Data::Outliers && rng.uniform() < 1e-3 {
                                        100.0 * x
                                    } else {
                                        x
                                    };
                                    half::bf16::from_f32(x).to_f32()
                                })
                                .collect()
                        })
                        .collect()
                })
                .collect();
            let mut values = values;
            if data == Data::Poisoned {
                values[3][0][100] = f32::NAN;
            }
            let idir = cdir.join(format!("{data:?}"));
            std::fs::create_dir_all(&idir).unwrap();
            let spec = write_inputs(&idir, &params, &values);
            jobs.push(json!({
                "kind": "run", "module": path, "num_partitions": partitions,
                "num_replicas": replicas, "inputs": spec, "outputs_dir": idir.join("out"),
            }));
            runs.push((ci, data, values, idir, r.report[0].clone()));
        }
    }
    let results = run_xla(&dir, &jobs);
    let mut failures = Vec::new();
    let mut table = String::from("case                 data        measured     bound\n");
    let mut sim_runs = 0;
    for ((ci, data, values, idir, report), res) in runs.iter().zip(&results) {
        let c = &cases[*ci];
        if res["ok"] != true {
            failures.push(format!(
                "{} {data:?}: XLA refused the rewrite: {}",
                c.name, res["error"]
            ));
            continue;
        }
        let got = outputs(res, &idir.join("out"), 8);
        let config = report.plan.as_ref().expect("a plan").config.clone();
        let mut worst: f64 = 0.0;
        let mut bound: f64 = 0.0;
        for group in c.groups.lists() {
            let p = group.len();
            let inputs: Vec<Vec<Vec<f32>>> = group.iter().map(|&d| values[d].clone()).collect();
            let want = exact(c, &inputs);
            let m = match c.collective {
                Collective::AllGather => inputs[0][0].len(),
                _ => inputs[0].iter().map(Vec::len).sum::<usize>() / p,
            };
            let plan = Plan::rows(c.collective, p, m, &config).unwrap();
            // The result of rank r, flattened (tuple outputs in order).
            let result = |r: usize| -> Vec<f32> { got[group[r]].concat() };
            if c.collective == Collective::AllGather {
                for r in 1..p {
                    if result(r)
                        .iter()
                        .zip(result(0).iter())
                        .any(|(a, b)| a.to_bits() != b.to_bits())
                    {
                        failures.push(format!(
                            "{} {data:?}: device {} differs from {}",
                            c.name, group[r], group[0]
                        ));
                    }
                }
            }
            if *data == Data::Poisoned {
                // Only the NaN's block may be non-finite, and it must be
                // wholly so; it reaches rank 0 of the first group only for
                // the cases that gather it there.
                let non_finite: usize = (0..p)
                    .map(|r| result(r).iter().filter(|x| !x.is_finite()).count())
                    .sum();
                let contains = group.contains(&3);
                if contains && non_finite == 0 {
                    failures.push(format!("{} {data:?}: the NaN vanished", c.name));
                }
                if !contains && non_finite > 0 {
                    failures.push(format!(
                        "{} {data:?}: non-finite values without a NaN input",
                        c.name
                    ));
                }
                if non_finite % plan.block() != 0 {
                    failures.push(format!(
                        "{} {data:?}: {non_finite} non-finite values, not whole blocks",
                        c.name
                    ));
                }
                continue;
            }
            let sim = simulated(c, &plan, &inputs);
            for r in 0..p {
                sim_runs += 1;
                let got_r = result(r);
                let differs = sim[r]
                    .iter()
                    .zip(got_r.iter())
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                if let Some(i) = differs {
                    failures.push(format!(
                        "{} {data:?}: rank {r} differs from the bit-exact simulator at {i} of {} \
                         ({} vs XLA {})",
                        c.name,
                        got_r.len(),
                        sim[r][i],
                        got_r[i]
                    ));
                }
                let measured = rel_rms(&result(r), &want[r]);
                let exact_f32: Vec<f32> = want[r].iter().map(|&x| x as f32).collect();
                let rows: Vec<Vec<f32>> = inputs.iter().map(|x| x.concat()).collect();
                let crest = simulate::crest_seen(&rows, &exact_f32, plan.block(), config.rotation);
                let b = 1.25 * rel_rms_with_crest(&plan, crest, 7);
                worst = worst.max(measured);
                bound = bound.max(b);
                if measured > b {
                    failures.push(format!(
                        "{} {data:?} rank {r}: error {measured:.5} > bound {b:.5}",
                        c.name
                    ));
                }
            }
        }
        if *data != Data::Poisoned {
            table.push_str(&format!(
                "{:<21}{:<11}{worst:>9.5}{bound:>10.5}\n",
                c.name,
                format!("{data:?}")
            ));
        }
    }
    std::fs::write(dir.join("summary.txt"), &table).unwrap();
    eprintln!("{table}\nsimulator compared on {sim_runs} ranks");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
