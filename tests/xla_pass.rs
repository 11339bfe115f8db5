//! Real XLA runs the rewritten modules.
//!
//! Every positive case is rewritten by the pass, then compiled and executed
//! by pinned jaxlib on 8 virtual CPU devices with seeded inputs — Gaussian,
//! heavy-tailed like LLM activations (a few channels 100× larger), and with
//! NaN/Inf planted — and compared with the exact sum (f64 accumulation of
//! the inputs). Required: the relative RMS error stays within the error
//! model's bound, every participant of a group holds bit-identical results,
//! a non-finite input makes exactly its block non-finite. The original
//! module runs the same way as the baseline. All jobs go to XLA in one
//! batch (a jax import costs seconds).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::modules::{all_reduces, iota, list, load, make_async, opts, with_counts};
use common::{Rng, outputs, rel_rms, run_xla, scratch, write_inputs};
use equarx::ir::shape;
use equarx::numerics::error::{format_rel_rms, rel_rms_with_crest};
use equarx::numerics::simulate;
use equarx::plan::Plan;
use equarx::plan::QuantFormat;
use equarx::plan::{Algorithm, Rotation};
use equarx::proto::{HloInstructionProto, HloModuleProto, OpSharding};
use equarx::{DeviceCounts, GatherForm, Options, RewriteOptions, ScaleType};
use prost::Message;
use serde_json::{Value, json};

/// How a case's outputs are checked.
#[derive(Clone)]
enum Check {
    /// Output k on device d is the sum of parameter k over d's group.
    Psum { groups: Vec<Vec<usize>> },
    /// Compared with a reference module (the original, or an equivalent
    /// one XLA runs correctly) on the same inputs.
    Program {
        reference: Box<HloModuleProto>,
        bound: f64,
    },
}

#[derive(Clone)]
struct Case {
    name: String,
    module: HloModuleProto,
    options: RewriteOptions,
    replicas: usize,
    partitions: usize,
    check: Check,
    /// Whether the original module runs correctly in XLA:CPU here.
    baseline: bool,
    /// XLA passes to disable when compiling: re-optimizing an already fused
    /// module trips XLA's reshape-mover (it moves a reshape through a fusion
    /// and leaves the fusion's computation behind). In a real pipeline the
    /// pass runs after these passes, so they never see its output.
    disable: &'static str,
    /// Rewrite this HLO text file with the `equarx` command line (text in,
    /// text out) and let XLA's parser read the result, instead of handing
    /// XLA the library's proto.
    via_text_cli: Option<std::path::PathBuf>,
    /// A goal the measured error must meet on one input (the issues'
    /// targets for the defaults), on top of the model's bound.
    goal: Option<(Data, f64)>,
}

const P8: &[usize] = &[0, 1, 2, 3, 4, 5, 6, 7];
const FUSED_DISABLE: &str = "reshape-mover,algsimp";

/// The fused fixtures (XLA's after-optimizations modules) re-enter XLA's
/// whole pipeline here (through MLIR, layout assignment included), which a
/// module that already holds fusions and bitcasts cannot take: equarx's own
/// fusions (`fuse = auto` on a fused module) are for the pre-scheduler
/// stage, proven by `tests/jax_door.rs` and the cluster. These cases check
/// the ring's arithmetic, so they leave fusion to XLA.
fn unfused(mut o: RewriteOptions) -> RewriteOptions {
    o.pass.fuse = equarx::FuseMode::Off;
    o
}

fn groups_of(g: &[&[usize]]) -> Vec<Vec<usize>> {
    g.iter().map(|x| x.to_vec()).collect()
}

fn cases() -> Vec<Case> {
    // Psum fixtures hold 1 024 elements per device; 8× that keeps the error
    // statistics of sparse outliers (0.1 % of the inputs) meaningful.
    let grown = |m: HloModuleProto| {
        let m = common::modules::resized(m, &[8, 128], &[64, 128]);
        common::modules::resized(m, &[16, 64], &[128, 64])
    };
    let psum =
        |name: &str, module: HloModuleProto, options: RewriteOptions, groups: &[&[usize]]| Case {
            name: name.into(),
            module: grown(module),
            options,
            replicas: 1,
            partitions: 8,
            check: Check::Psum {
                groups: groups_of(groups),
            },
            baseline: true,
            disable: "",
            via_text_cli: None,
            goal: None,
        };
    let p8 = || load("psum_bf16_p8.pb");
    let mut v = vec![
        psum("p8", p8(), opts(|_| {}), &[P8]),
        psum(
            "p8_d2_b32",
            p8(),
            opts(|o| (o.pipeline_depth, o.block_size) = (2, 32)),
            &[P8],
        ),
        psum(
            "p8_d4_b32",
            p8(),
            opts(|o| (o.pipeline_depth, o.block_size) = (4, 32)),
            &[P8],
        ),
        psum(
            "p8_bidirectional_b32",
            p8(),
            opts(|o| (o.bidirectional, o.block_size) = (true, 32)),
            &[P8],
        ),
        psum(
            "p8_bidirectional_d2_b32",
            p8(),
            opts(|o| (o.bidirectional, o.pipeline_depth, o.block_size) = (true, 2, 32)),
            &[P8],
        ),
        psum("p8_padded_b96", p8(), opts(|o| o.block_size = 96), &[P8]),
        psum(
            "p8_permute_gather",
            p8(),
            opts(|o| o.gather = GatherForm::Permute),
            &[P8],
        ),
        psum(
            "p8_f32_scales",
            p8(),
            opts(|o| o.scale_type = ScaleType::F32),
            &[P8],
        ),
        psum(
            "two_groups_of_4",
            load("psum_bf16_2x4.pb"),
            opts(|_| {}),
            &[&[0, 1, 2, 3], &[4, 5, 6, 7]],
        ),
        psum(
            "strided_groups_of_4",
            load("psum_bf16_4x2_strided.pb"),
            opts(|_| {}),
            &[&[0, 2, 4, 6], &[1, 3, 5, 7]],
        ),
        psum(
            "p2",
            load("psum_bf16_2x4_strided.pb"),
            opts(|_| {}),
            &[&[0, 4], &[1, 5], &[2, 6], &[3, 7]],
        ),
        psum(
            "f32_opt_in",
            load("psum_f32_p8.pb"),
            opts(|o| o.element_types = vec![equarx::proto::PrimitiveType::F32]),
            &[P8],
        ),
        psum(
            "two_all_reduces",
            load("psum_pair_bf16_p8.pb"),
            opts(|_| {}),
            &[P8],
        ),
    ];
    let mut fused = psum(
        "after_optimizations_f32",
        load("psum_bf16_p8_after_opt.pb"),
        unfused(opts(|o| {
            o.element_types.push(equarx::proto::PrimitiveType::F32)
        })),
        &[P8],
    );
    fused.disable = FUSED_DISABLE;
    v.push(fused);

    // Iota groups: [2,4]<=[8] and [2,4]<=[4,2]T(1,0).
    for (name, dims, perm, groups) in [
        (
            "iota_groups",
            vec![8],
            vec![0],
            groups_of(&[&[0, 1, 2, 3], &[4, 5, 6, 7]]),
        ),
        (
            "iota_groups_transposed",
            vec![4, 2],
            vec![1, 0],
            groups_of(&[&[0, 2, 4, 6], &[1, 3, 5, 7]]),
        ),
    ] {
        let mut m = p8();
        for ar in all_reduces(&mut m) {
            ar.replica_group_list = iota(2, 4, &dims, &perm);
        }
        let g: Vec<&[usize]> = groups.iter().map(Vec::as_slice).collect();
        v.push(psum(name, m, opts(|_| {}), &g));
    }

    // Cross-replica: no channel id, replica ids, 8 replicas.
    let mut m = p8();
    for ar in all_reduces(&mut m) {
        ar.channel_id = 0;
        ar.use_global_device_ids = false;
    }
    m.computations
        .iter_mut()
        .flat_map(|c| c.instructions.iter_mut())
        .for_each(|i| i.sharding = None);
    with_counts(&mut m, 8, 1);
    let mut c = psum("cross_replica", m, opts(|_| {}), &[P8]);
    (c.replicas, c.partitions) = (8, 1);
    v.push(c);

    // Channel id without global ids, one replica: every partition.
    let mut m = p8();
    for ar in all_reduces(&mut m) {
        ar.use_global_device_ids = false;
        ar.replica_group_list = list(&[&[0]]);
    }
    v.push(psum(
        "cross_replica_and_partition_one_replica",
        m,
        opts(|_| {}),
        &[P8],
    ));

    // An all-reduce inside a conditional branch (the predicate holds on
    // every device for these inputs).
    let text =
        std::fs::read_to_string(common::repo().join("tests/cases/modules/conditional_psum.hlo"))
            .unwrap();
    let parsed = equarx::text::parse(&text).unwrap();
    v.push(psum(
        "conditional_branch",
        parsed.proto,
        opts(|_| {}),
        &[P8],
    ));

    // Async all-reduce-start / all-reduce-done.
    let mut m = p8();
    make_async(&mut m);
    v.push(psum("async_pair", m, opts(|_| {}), &[P8]));

    // Tuple all-reduce (XLA's combiner output). XLA:CPU cannot run the
    // original through this path (a layout check), but it runs the rewrite.
    let mut t = psum(
        "tuple",
        load("psum_tuple_p8.pb"),
        unfused(opts(|o| {
            o.element_types.push(equarx::proto::PrimitiveType::F32)
        })),
        &[P8],
    );
    t.baseline = false;
    t.disable = FUSED_DISABLE;
    v.push(t);

    // Programs: compared with the original's run.
    let program = |name: &str, file: &str, options: RewriteOptions, bound: f64| {
        let m = load(file);
        Case {
            name: name.into(),
            module: m.clone(),
            options,
            replicas: 1,
            partitions: 8,
            check: Check::Program {
                reference: Box::new(m),
                bound,
            },
            baseline: true,
            disable: "",
            via_text_cli: None,
            goal: None,
        }
    };
    // Inside programs the all-reduce inputs are matmul partials: products
    // of Gaussians have κ² ≈ 20.5 for B = 128 (numpy, 20000 blocks), and the
    // errors of L chained all-reduces add at most linearly.
    let chained = common::chained_bound;
    let tp_bound = chained(2.0, 8);
    v.push(program(
        "tp_block_mesh_axes",
        "tp_block_spmd.pb",
        opts(|_| {}),
        tp_bound,
    ));
    v.push(program(
        "tp_block_shard_map",
        "tp_block_shmap_spmd.pb",
        opts(|_| {}),
        tp_bound,
    ));
    // A text dump (XLA's own text after SPMD partitioning) through the
    // command line, text in and text out; XLA parses what equarx printed.
    let dump = "dumps/module_0012.jit_tp_block.0007.spmd-partitioner.after_spmd-partitioning.before_control-dep-rewriter";
    let mut from_text = program(
        "text_dump_tp_block",
        &format!("{dump}.hlo.pb"),
        opts(|_| {}),
        tp_bound,
    );
    from_text.via_text_cli = Some(common::fixtures_dir().join(format!("{dump}.txt")));
    v.push(from_text);
    // Four all-reduces inside a while body (a scan over layers).
    v.push(program(
        "while_body",
        "scan_psum.pb",
        opts(|_| {}),
        chained(4.0, 8),
    ));

    // Mesh-axes groups with device ids: XLA's MLIR path mangles those in the
    // original, so the reference is the same module with the groups the
    // fixture generator recorded, written as explicit lists.
    let m = load("mesh_axes_bf16_2x4.pb");
    let mut reference = m.clone();
    let recorded: Vec<Vec<Vec<i64>>> = common::manifest()["fixtures"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "mesh_axes_bf16_2x4")
        .unwrap()["all_reduces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| serde_json::from_value(a["groups"].clone()).unwrap())
        .collect();
    for (ar, groups) in all_reduces(&mut reference).zip(&recorded) {
        let g: Vec<&[i64]> = groups.iter().map(Vec::as_slice).collect();
        ar.replica_group_list = list(&g);
    }
    v.push(Case {
        name: "mesh_axes_device_ids".into(),
        module: m,
        options: opts(|_| {}),
        replicas: 1,
        partitions: 8,
        check: Check::Program {
            reference: Box::new(reference),
            bound: chained(1.0, 4),
        },
        baseline: false,
        disable: "",
        via_text_cli: None,
        goal: None,
    });

    // Sequence-parallel tensor parallelism (Megatron-SP): an all-gather,
    // the MLP, a reduce-scatter, and no all-reduce; the goal is
    // 2.5 % against the unquantized run.
    let mut sp = program(
        "sp_mlp",
        "sp_mlp/sp_mlp.pb",
        opts(|o| (o.algorithm, o.rotation) = (None, None)),
        chained(2.0, 8),
    );
    sp.goal = Some((Data::Gaussian, 0.025));
    v.push(sp);

    // The loop form is the default; the unrolled form on the hosts where
    // the loop's shape matters most.
    let unrolled = |o: &mut Options| o.unroll = true;
    for host in ["p8", "async_pair", "while_body", "p8_permute_gather"] {
        let base = v
            .iter()
            .find(|c| c.name == host)
            .expect("host case")
            .clone();
        let mut c = variant(&base, "unrolled", unrolled);
        c.options.pass.unroll = true;
        v.push(c);
    }

    // Every algorithm, with and without rotation, over the group modes and
    // the hosts (while body, conditional branch, async pair, tuple, fused
    // module, programs).
    let algorithms: [(&str, Option<Algorithm>, Option<Rotation>); 5] = [
        ("two_shot", Some(Algorithm::TwoShot), Some(Rotation::None)),
        ("two_level", Some(Algorithm::TwoLevel), Some(Rotation::None)),
        (
            "ring_hadamard",
            Some(Algorithm::Ring),
            Some(Rotation::Hadamard),
        ),
        (
            "two_shot_hadamard",
            Some(Algorithm::TwoShot),
            Some(Rotation::Hadamard),
        ),
        (
            "two_level_hadamard",
            Some(Algorithm::TwoLevel),
            Some(Rotation::Hadamard),
        ),
    ];
    let hosts = [
        "p8",
        "two_groups_of_4",
        "strided_groups_of_4",
        "p2",
        "iota_groups_transposed",
        "cross_replica",
        "cross_replica_and_partition_one_replica",
        "conditional_branch",
        "async_pair",
        "tuple",
        "after_optimizations_f32",
        "while_body",
        "tp_block_mesh_axes",
        "mesh_axes_device_ids",
        "p8_permute_gather",
    ];
    for host in hosts {
        let base = v
            .iter()
            .find(|c| c.name == host)
            .expect("host case")
            .clone();
        for (suffix, algorithm, rotation) in algorithms {
            // A group of 2 has no 2-D grid.
            if ["p2", "mesh_axes_device_ids"].contains(&host)
                && algorithm == Some(Algorithm::TwoLevel)
            {
                continue;
            }
            let c = variant(&base, suffix, |o| {
                (o.algorithm, o.rotation) = (algorithm, rotation)
            });
            v.push(c);
        }
    }

    // Every code format over the ring and the two-shot, with and without
    // rotation, in a while body, an async pair and a tuple.
    let formats: [(&str, QuantFormat); 3] = [
        ("fp8_e4m3", QuantFormat::Fp8E4m3),
        ("fp8_e5m2", QuantFormat::Fp8E5m2),
        ("int4", QuantFormat::Int4),
    ];
    for host in ["p8", "two_groups_of_4", "async_pair", "tuple", "while_body"] {
        let base = v
            .iter()
            .find(|c| c.name == host)
            .expect("host case")
            .clone();
        for (suffix, format) in formats {
            let mut c = variant(&base, suffix, |o| o.quant_format = format);
            // A program's bound is the int8 ring's: the format's own
            // error model scales it.
            if let Check::Program { bound, .. } = &mut c.check {
                let w = 4.5; // P = 8
                let crest = common::PRODUCT_CREST_SQ;
                *bound *=
                    format_rel_rms(format, w, crest) / format_rel_rms(QuantFormat::Int8, w, crest);
            }
            v.push(c);
        }
    }
    let base = v.iter().find(|c| c.name == "p8").expect("p8").clone();
    for (suffix, format) in formats {
        v.push(variant(
            &base,
            &format!("two_shot_hadamard_{suffix}"),
            |o| {
                (o.algorithm, o.rotation, o.quant_format) =
                    (Some(Algorithm::TwoShot), Some(Rotation::Hadamard), format)
            },
        ));
    }

    // The defaults (the time model's choice on v5e and on an H100 node)
    // on a psum large enough for the statistics, with the issues' goals:
    // 100x outliers on 0.1 % of the inputs at most 0.9 % off, and Gaussian
    // data on a switched topology at most 0.9 %.
    let big = || common::modules::resized(p8(), &[8, 128], &[64, 1024]);
    let defaults = |topology: &str| {
        let mut o = RewriteOptions::default();
        o.pass.min_payload_bytes = Some(0);
        o.pass.topology = equarx::cost::Topology::parse(topology).unwrap();
        o
    };
    let mut c = psum("defaults_v5e", big(), defaults("v5e"), &[P8]);
    c.goal = Some((Data::Outliers, 0.009));
    v.push(c);
    let mut c = psum("defaults_h100", big(), defaults("h100"), &[P8]);
    c.goal = Some((Data::Gaussian, 0.009));
    v.push(c);
    // A tensor-parallel attention+MLP block with the defaults, 100x
    // outliers on 0.1 % of its inputs: at most 2 % off the unquantized run.
    let mut c = program(
        "tp_block_defaults",
        "tp_block_shmap_spmd.pb",
        defaults("v5e"),
        tp_bound,
    );
    c.goal = Some((Data::Outliers, 0.02));
    v.push(c);
    v
}

/// `base` with its options edited, named `base_suffix`.
fn variant(base: &Case, suffix: &str, edit: impl FnOnce(&mut Options)) -> Case {
    let mut options = base.options.clone();
    edit(&mut options.pass);
    Case {
        name: format!("{}_{suffix}", base.name),
        module: base.module.clone(),
        options,
        replicas: base.replicas,
        partitions: base.partitions,
        check: base.check.clone(),
        baseline: base.baseline,
        disable: base.disable,
        via_text_cli: None,
        goal: None,
    }
}

/// Which shard of a parameter device `d` holds: devices with the same key
/// hold the same data (replicated parameters: every device).
fn shard_key(sharding: Option<&OpSharding>, d: usize) -> Vec<i64> {
    use equarx::proto::op_sharding::Type;
    let Some(s) = sharding else {
        return vec![d as i64];
    };
    match Type::try_from(s.r#type) {
        Ok(Type::Replicated) => vec![],
        Ok(Type::Other) => {
            let dims = &s.tile_assignment_dimensions;
            let devices = if s.iota_reshape_dims.is_empty() {
                s.tile_assignment_devices.clone()
            } else {
                let perm: Vec<i64> = s
                    .iota_transpose_perm
                    .iter()
                    .map(|&p| i64::from(p))
                    .collect();
                equarx::ir::groups::transposed_iota(&s.iota_reshape_dims, &perm).unwrap()
            };
            let pos = devices
                .iter()
                .position(|&x| x == d as i64)
                .expect("device in tile assignment");
            let mut coords = vec![0i64; dims.len()];
            let mut rest = pos as i64;
            for k in (0..dims.len()).rev() {
                coords[k] = rest % dims[k];
                rest /= dims[k];
            }
            let replicated_dims =
                usize::from(s.replicate_on_last_tile_dim) + s.last_tile_dims.len();
            coords.truncate(dims.len() - replicated_dims);
            coords
        }
        _ => vec![d as i64],
    }
}

/// The entry computation's parameters, in parameter order.
fn entry_parameters(m: &HloModuleProto) -> Vec<&HloInstructionProto> {
    let entry = m
        .computations
        .iter()
        .find(|c| c.id == m.entry_computation_id)
        .unwrap();
    let mut params: Vec<&HloInstructionProto> = entry
        .instructions
        .iter()
        .filter(|i| i.opcode == "parameter")
        .collect();
    params.sort_by_key(|p| p.parameter_number);
    params
}

/// Parameter shapes and element types of the entry computation.
fn parameters(m: &HloModuleProto) -> Vec<(String, Vec<i64>)> {
    entry_parameters(m)
        .iter()
        .map(|p| {
            let s = p.shape.as_ref().unwrap();
            (
                shape::type_name(s.element_type).unwrap().to_string(),
                s.dimensions.clone(),
            )
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Data {
    Gaussian,
    /// LLM-activation-like: every 64th channel of the last dimension is
    /// 100× larger, on every device.
    HeavyTailed,
    /// Gaussian with 0.1 % of the values, at random on each device, 100×
    /// larger.
    Outliers,
    /// Gaussian with a NaN on device 1 and an Inf on device 5.
    Poisoned,
}

const POISON: [(usize, usize, f32); 2] = [(1, 300, f32::NAN), (5, 700, f32::INFINITY)];

/// Inputs per device per parameter, rounded to the parameter's type.
/// Devices that hold the same shard of a parameter (by its sharding) get the
/// same values, as they would in the program JAX compiled.
fn inputs(
    params: &[(String, Vec<i64>)],
    shardings: &[Option<OpSharding>],
    devices: usize,
    data: Data,
    seed: u64,
) -> Vec<Vec<Vec<f32>>> {
    (0..devices)
        .map(|d| {
            params
                .iter()
                .enumerate()
                .map(|(k, (ty, dims))| {
                    let key = shard_key(shardings[k].as_ref(), d);
                    let mut rng = Rng::new(seed ^ hash(&(k, &key)));
                    let n: i64 = dims.iter().product();
                    let last = *dims.last().unwrap_or(&1);
                    let mut v: Vec<f32> = (0..n)
                        .map(|i| {
                            let x = rng.gaussian() as f32;
                            let outlier = match data {
                                Data::HeavyTailed => (i % last) % 64 == 5,
                                Data::Outliers => rng.uniform() < 1e-3,
                                _ => false,
                            };
                            if outlier { 100.0 * x } else { x }
                        })
                        .collect();
                    if data == Data::Poisoned && k == 0 {
                        for &(pd, at, bad) in &POISON {
                            if pd == d && at < v.len() {
                                v[at] = bad;
                            }
                        }
                    }
                    if ty == "bf16" {
                        v.iter_mut()
                            .for_each(|x| *x = half::bf16::from_f32(*x).to_f32());
                    }
                    v
                })
                .collect()
        })
        .collect()
}

fn hash<T: std::hash::Hash>(t: &T) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    t.hash(&mut h);
    h.finish()
}

/// The entry parameters' shardings (psum cases: none, every device its own
/// data).
fn shardings(m: &HloModuleProto, check: &Check, n: usize) -> Vec<Option<OpSharding>> {
    if matches!(check, Check::Psum { .. }) {
        return vec![None; n];
    }
    entry_parameters(m)
        .iter()
        .map(|p| p.sharding.as_deref().cloned())
        .collect()
}

fn run_job(module: &Path, case: &Case, inputs: &Value, out: &Path) -> Value {
    let mut job = json!({
        "kind": "run",
        "module": module,
        "num_partitions": case.partitions,
        "num_replicas": case.replicas,
        "inputs": inputs,
        "outputs_dir": out,
    });
    if !case.disable.is_empty() {
        let passes = format!(
            "sharding-propagation,spmd-partitioning,shardy-xla,{}",
            case.disable
        );
        job["debug_options"] = json!({ "xla_disable_hlo_passes": passes });
    }
    job
}

struct Measured {
    case: String,
    data: Data,
    measured: f64,
    bound: f64,
    baseline: Option<f64>,
}

#[test]
fn rewritten_modules_run_in_xla_with_bounded_error_and_identical_replicas() {
    let dir = scratch("xla_pass");
    let cases = cases();
    let mut jobs = Vec::new();
    // Cases whose rewrite XLA reads from equarx's text: (case, job index).
    let mut text_jobs: Vec<(String, usize)> = Vec::new();
    // (case index, data, rewritten job, baseline job, inputs)
    let mut plan = Vec::new();
    // Per case, the pass's report.
    let mut reports = Vec::new();
    for (ci, case) in cases.iter().enumerate() {
        let counts = DeviceCounts {
            replica_count: Some(case.replicas as i64),
            num_partitions: Some(case.partitions as i64),
        };
        let r = equarx::rewrite(case.module.clone(), counts, &case.options)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert!(
            r.changed,
            "{}: nothing rewritten: {:#?}",
            case.name, r.report
        );
        assert!(
            r.report.iter().all(|o| o.rewritten),
            "{}: {:#?}",
            case.name,
            r.report
        );
        let s8_collectives = r
            .module
            .computations
            .iter()
            .flat_map(|c| &c.instructions)
            .filter(|i| {
                ["collective-permute", "all-to-all", "all-gather"]
                    .iter()
                    .any(|op| i.opcode.starts_with(op))
                    && i.shape.as_ref().is_some_and(|s| {
                        s.element_type == 2
                            || s.tuple_shapes.first().is_some_and(|t| t.element_type == 2)
                    })
            })
            .count();
        assert!(s8_collectives > 0, "{}: no s8 collective", case.name);
        reports.push(r.report.clone());
        let cdir = dir.join(&case.name);
        std::fs::create_dir_all(&cdir).unwrap();
        let rewritten = cdir.join("rewritten.pb");
        match &case.via_text_cli {
            None => std::fs::write(&rewritten, r.module.encode_to_vec()).unwrap(),
            Some(text) => {
                let out = cdir.join("rewritten.txt");
                let o = common::equarx()
                    .args([
                        "rewrite",
                        "--min-payload",
                        "0",
                        "--pipeline-depth",
                        "1",
                        "--bidirectional",
                        "false",
                    ])
                    .arg(text)
                    .arg("-o")
                    .arg(&out)
                    .output()
                    .unwrap();
                assert!(
                    o.status.success(),
                    "{}: {}",
                    case.name,
                    String::from_utf8_lossy(&o.stderr)
                );
                let printed = std::fs::read_to_string(&out).unwrap();
                assert!(
                    printed.starts_with("HloModule") && printed.contains("s8["),
                    "{}",
                    case.name
                );
                jobs.push(json!({"kind": "text_to_proto", "text": out, "out": rewritten}));
                text_jobs.push((case.name.clone(), jobs.len() - 1));
            }
        }
        let reference = cdir.join("reference.pb");
        let reference_module = match &case.check {
            Check::Program { reference, .. } => (**reference).clone(),
            Check::Psum { .. } => case.module.clone(),
        };
        std::fs::write(&reference, reference_module.encode_to_vec()).unwrap();
        let params = parameters(&case.module);
        let devices = case.replicas * case.partitions;
        let datas: &[Data] = match case.check {
            Check::Psum { .. } => &[
                Data::Gaussian,
                Data::HeavyTailed,
                Data::Outliers,
                Data::Poisoned,
            ],
            // Programs run on Gaussian inputs, and on the data of their goal.
            Check::Program { .. } => match case.goal {
                Some((Data::Outliers, _)) => &[Data::Gaussian, Data::Outliers],
                _ => &[Data::Gaussian],
            },
        };
        for (di, &data) in datas.iter().enumerate() {
            let idir = cdir.join(format!("{data:?}"));
            std::fs::create_dir_all(&idir).unwrap();
            let shards = shardings(&case.module, &case.check, params.len());
            let values = inputs(
                &params,
                &shards,
                devices,
                data,
                1000 + (ci * 10 + di) as u64,
            );
            let spec = write_inputs(&idir, &params, &values);
            let rj = jobs.len();
            jobs.push(run_job(&rewritten, case, &spec, &idir.join("rewritten")));
            let bj = (case.baseline || matches!(case.check, Check::Program { .. })).then(|| {
                jobs.push(run_job(&reference, case, &spec, &idir.join("reference")));
                jobs.len() - 1
            });
            plan.push((ci, data, rj, bj, values, idir));
        }
    }
    let results = run_xla(&dir, &jobs);
    for (name, j) in &text_jobs {
        assert_eq!(
            results[*j]["ok"], true,
            "{name}: XLA cannot parse equarx's text: {}",
            results[*j]["error"]
        );
    }

    let mut table: Vec<Measured> = Vec::new();
    let mut failures = Vec::new();
    // (case, data, [matches with FMA, matches without])
    let mut sim_matches: Vec<(String, Data, [bool; 2])> = Vec::new();
    for (ci, data, rj, bj, values, idir) in &plan {
        let case = &cases[*ci];
        let devices = case.replicas * case.partitions;
        if results[*rj]["ok"] != true {
            failures.push(format!(
                "{} {data:?}: XLA refused the rewrite: {}",
                case.name, results[*rj]["error"]
            ));
            continue;
        }
        let got = outputs(&results[*rj], &idir.join("rewritten"), devices);
        let block = case.options.pass.block_size;
        let config = reports[*ci][0]
            .plan
            .as_ref()
            .expect("rewritten")
            .config
            .clone();
        match &case.check {
            Check::Psum { groups } => {
                for group in groups {
                    // Bit-identical results across the group.
                    for &d in &group[1..] {
                        for (k, out) in got[d].iter().enumerate() {
                            let same = out
                                .iter()
                                .zip(&got[group[0]][k])
                                .all(|(a, b)| a.to_bits() == b.to_bits());
                            if !same {
                                failures.push(format!(
                                    "{} {data:?}: device {d} differs from device {} in output {k}",
                                    case.name, group[0]
                                ));
                            }
                        }
                    }
                    let mut worst: f64 = 0.0;
                    let mut bound: f64 = 0.0;
                    let mut baseline: f64 = 0.0;
                    for k in 0..got[group[0]].len() {
                        let exact: Vec<f64> = (0..values[0][k].len())
                            .map(|i| group.iter().map(|&d| f64::from(values[d][k][i])).sum())
                            .collect();
                        let out = &got[group[0]][k];
                        if *data == Data::Poisoned {
                            check_poison(&case.name, k, group, out, block, &mut failures);
                            continue;
                        }
                        // The simulator must reproduce XLA bit for bit
                        // (single-operand all-reduces: one payload each).
                        if values[0].len() == 1 {
                            let inputs: Vec<Vec<f32>> =
                                group.iter().map(|&d| values[d][k].clone()).collect();
                            let plan = Plan::new(group.len(), inputs[0].len(), &config).unwrap();
                            let bf16_out = results[*rj]["outputs"][k]["dtype"] == "bf16";
                            let matches = [true, false].map(|fma| {
                                let sim = simulate::quantized_all_reduce(&inputs, &plan, fma);
                                let sim = if bf16_out {
                                    simulate::to_bf16(&sim)
                                } else {
                                    sim
                                };
                                sim.iter()
                                    .zip(out.iter())
                                    .all(|(a, b)| a.to_bits() == b.to_bits())
                            });
                            sim_matches.push((case.name.clone(), *data, matches));
                        }
                        let measured = rel_rms(out, &exact);
                        // κ² from the data the quantizer sees (rotated, if
                        // the plan rotates): the largest of the inputs' and
                        // the sum's.
                        let inputs: Vec<Vec<f32>> =
                            group.iter().map(|&d| values[d][k].clone()).collect();
                        let exact_f32: Vec<f32> = exact.iter().map(|&x| x as f32).collect();
                        let crest =
                            simulate::crest_seen(&inputs, &exact_f32, block, config.rotation);
                        let plan = Plan::new(group.len(), inputs[0].len(), &config).unwrap();
                        let out_type = if results[*rj]["outputs"][k]["dtype"] == "bf16" {
                            7
                        } else {
                            23
                        };
                        let model = rel_rms_with_crest(&plan, crest, out_type);
                        let b = 1.25 * model;
                        // On Gaussian data the model is within 10 % of the
                        // measured error, for every algorithm, rotation and
                        // format (issue 13's goal).
                        if *data == Data::Gaussian && !(0.9..=1.1).contains(&(measured / model)) {
                            failures.push(format!(
                                "{} Gaussian output {k}: error {measured:.5} is not within 10 % of the model's {model:.5}",
                                case.name
                            ));
                        }
                        worst = worst.max(measured);
                        bound = bound.max(b);
                        if measured > b {
                            failures.push(format!(
                                "{} {data:?} output {k}: error {measured:.5} > bound {b:.5}",
                                case.name
                            ));
                        }
                        if let Some((goal_data, goal)) = case.goal {
                            if goal_data == *data && measured > goal {
                                failures.push(format!(
                                    "{} {data:?} output {k}: error {measured:.5} misses the goal {goal}",
                                    case.name
                                ));
                            }
                        }
                        if let Some(bj) = bj {
                            let base = outputs(&results[*bj], &idir.join("reference"), devices);
                            baseline = baseline.max(rel_rms(&base[group[0]][k], &exact));
                        }
                    }
                    if *data != Data::Poisoned {
                        table.push(Measured {
                            case: case.name.clone(),
                            data: *data,
                            measured: worst,
                            bound,
                            baseline: bj.map(|_| baseline),
                        });
                    }
                }
            }
            Check::Program { bound, .. } => {
                let bj = bj.expect("programs have a reference run");
                if results[bj]["ok"] != true {
                    failures.push(format!(
                        "{}: reference failed: {}",
                        case.name, results[bj]["error"]
                    ));
                    continue;
                }
                let want = outputs(&results[bj], &idir.join("reference"), devices);
                // Devices whose results the original makes bit-identical
                // (replicated outputs) must stay so; sharded outputs differ.
                let same = |v: &[Vec<Vec<f32>>], d: usize| {
                    v[d].iter()
                        .zip(&v[0])
                        .all(|(a, b)| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()))
                };
                for d in 1..devices {
                    if same(&want, d) && !same(&got, d) {
                        failures.push(format!("{}: device {d} differs from device 0", case.name));
                    }
                }
                let mut worst: f64 = 0.0;
                for d in 0..devices {
                    for (k, out) in got[d].iter().enumerate() {
                        let exact: Vec<f64> = want[d][k].iter().map(|&x| f64::from(x)).collect();
                        worst = worst.max(rel_rms(out, &exact));
                    }
                }
                if worst > *bound {
                    failures.push(format!(
                        "{}: error vs reference {worst:.5} > bound {bound:.5}",
                        case.name
                    ));
                }
                if let Some((_, goal)) = case.goal.filter(|g| g.0 == *data) {
                    if worst > goal {
                        failures.push(format!(
                            "{}: error vs reference {worst:.5} misses the goal {goal}",
                            case.name
                        ));
                    }
                }
                table.push(Measured {
                    case: case.name.clone(),
                    data: *data,
                    measured: worst,
                    bound: *bound,
                    baseline: None,
                });
            }
        }
    }
    let mut summary = String::from(
        "case                                    data          measured    bound   baseline\n",
    );
    let mut seen = BTreeMap::new();
    for m in &table {
        *seen.entry(m.case.clone()).or_insert(0) += 1;
        summary.push_str(&format!(
            "{:<40}{:<12}{:>10.5}{:>10.5}{:>10}\n",
            m.case,
            format!("{:?}", m.data),
            m.measured,
            m.bound,
            m.baseline.map_or("-".into(), |b| format!("{b:.5}"))
        ));
    }
    std::fs::write(dir.join("summary.txt"), &summary).unwrap();
    eprintln!("{summary}");
    // The emitted scales make every code·scale product exact, so the
    // simulator matches XLA bit for bit whether or not XLA fuses a hop's
    // multiply and add (XLA:CPU does for some hops and not others).
    let mismatched: Vec<String> = sim_matches
        .iter()
        .filter(|m| m.2 != [true, true])
        .map(|m| {
            format!(
                "{} {:?} (with FMA {}, without {})",
                m.0, m.1, m.2[0], m.2[1]
            )
        })
        .collect();
    eprintln!(
        "simulator bit-exact with XLA on {} runs",
        sim_matches.len() - mismatched.len()
    );
    assert!(
        sim_matches.len() >= 20,
        "too few simulator comparisons: {}",
        sim_matches.len()
    );
    assert!(
        mismatched.is_empty(),
        "simulator differs from XLA in: {}",
        mismatched.join(", ")
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(seen.len(), cases.len(), "every case was measured");
}

/// Output blocks holding a poisoned input element are entirely non-finite;
/// every other block is finite.
fn check_poison(
    name: &str,
    k: usize,
    group: &[usize],
    out: &[f32],
    block: usize,
    failures: &mut Vec<String>,
) {
    let poisoned: Vec<usize> = POISON
        .iter()
        .filter(|(d, at, _)| k == 0 && group.contains(d) && *at < out.len())
        .map(|(_, at, _)| at / block)
        .collect();
    for (b, chunk) in out.chunks(block).enumerate() {
        let bad = poisoned.contains(&b);
        if bad && chunk.iter().any(|x| x.is_finite()) {
            failures.push(format!(
                "{name}: output {k} block {b} holds a finite value next to a NaN/Inf input"
            ));
        }
        if !bad && chunk.iter().any(|x| !x.is_finite()) {
            failures.push(format!(
                "{name}: output {k} block {b} is non-finite without a NaN/Inf input"
            ));
        }
    }
}

/// Extreme but finite per-device inputs for an 8-way psum.
#[derive(Clone, Copy, Debug)]
enum Extreme {
    /// Near the largest finite bf16 (and so f32) value, both signs: partial
    /// sums overflow f32 somewhere round the ring.
    NearMax,
    /// Every binade from subnormal to near the maximum.
    AllBinades,
    /// Subnormal and tiny normal values only.
    Tiny,
    /// Signed zeros with a few huge values.
    SignedZeros,
}

fn extreme_values(kind: Extreme, n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let sign = if rng.uniform() < 0.5 { -1.0 } else { 1.0 };
            match kind {
                Extreme::NearMax => sign * (1.0 + 2.3 * rng.uniform() as f32) * 1e38,
                Extreme::AllBinades => {
                    let e = -149.0 + 276.0 * rng.uniform();
                    sign * (2f64.powf(e) * (1.0 + rng.uniform())).min(3.3e38) as f32
                }
                Extreme::Tiny => sign * (1e-45 + 1e-37 * rng.uniform()) as f32,
                Extreme::SignedZeros => {
                    if rng.uniform() < 0.05 {
                        sign * 1e19 * rng.gaussian() as f32
                    } else {
                        sign * 0.0
                    }
                }
            }
        })
        .collect()
}

/// One run of the huge-input test: a module and its per-device inputs.
struct HugeRun {
    name: String,
    module: HloModuleProto,
    values: Vec<Vec<Vec<f32>>>,
}

/// Bit-identical replicas are promised for every finite input, huge ones
/// included: a reported case (issue 15) was a scan over tensor-parallel MLP
/// layers whose activations reach ~1e19, said to leave one output element
/// different across the 8 devices. Here, with the default options (two
/// lanes each way round the ring, bf16 scales, all-gather) and every
/// all-reduce rewritten, real XLA runs:
/// - `tests/cases/modules/scan_mlp.hlo` (4 MLP layers, the psum in the while body)
///   with heavy-tailed inputs, every 64th channel 100× larger: the
///   activations reach 1e19 and more, all finite;
/// - 8-way psums (bf16 and f32) of extreme finite values: near the largest
///   finite value (the ring's partial sums overflow), every binade,
///   subnormals, signed zeros.
///
/// Every device must hold the same bits as every other, as the original
/// modules do. Nothing here looks at the emitted HLO, only at outputs.
#[test]
fn replicas_stay_bit_identical_for_huge_finite_inputs() {
    let dir = scratch("xla_pass_huge");
    let mut pass = equarx::Options {
        min_payload_bytes: Some(0),
        ..equarx::Options::default()
    };
    pass.element_types = vec![
        equarx::proto::PrimitiveType::Bf16,
        equarx::proto::PrimitiveType::F32,
    ];
    let options = RewriteOptions {
        pass,
        ..RewriteOptions::default()
    };
    let counts = DeviceCounts {
        replica_count: Some(1),
        num_partitions: Some(8),
    };
    let text =
        std::fs::read_to_string(common::repo().join("tests/cases/modules/scan_mlp.hlo")).unwrap();
    let mlp = equarx::text::parse(&text)
        .expect("scan_mlp.hlo parses")
        .proto;

    let mut runs: Vec<HugeRun> = Vec::new();
    let params = parameters(&mlp);
    let shards: Vec<Option<OpSharding>> = entry_parameters(&mlp)
        .iter()
        .map(|p| p.sharding.as_deref().cloned())
        .collect();
    for seed in 0..4u64 {
        let values = inputs(&params, &shards, 8, Data::HeavyTailed, 7000 + seed);
        runs.push(HugeRun {
            name: format!("scan_mlp_heavy_{seed}"),
            module: mlp.clone(),
            values,
        });
    }
    for (file, ty) in [("psum_bf16_p8.pb", "bf16"), ("psum_f32_p8.pb", "f32")] {
        let m = load(file);
        for (k, kind) in [
            Extreme::NearMax,
            Extreme::AllBinades,
            Extreme::Tiny,
            Extreme::SignedZeros,
        ]
        .into_iter()
        .enumerate()
        {
            let values: Vec<Vec<Vec<f32>>> = (0..8)
                .map(|d| {
                    let mut rng = Rng::new(9000 + 100 * k as u64 + d);
                    let v = extreme_values(kind, 1024, &mut rng);
                    let v = if ty == "bf16" {
                        v.iter()
                            .map(|&x| half::bf16::from_f32(x).to_f32())
                            .collect()
                    } else {
                        v
                    };
                    assert!(v.iter().all(|x| x.is_finite()), "{kind:?}: finite inputs");
                    vec![v]
                })
                .collect();
            runs.push(HugeRun {
                name: format!("psum_{ty}_{kind:?}"),
                module: m.clone(),
                values,
            });
        }
    }

    let mut jobs = Vec::new();
    for HugeRun {
        name,
        module,
        values,
    } in &runs
    {
        let r = equarx::rewrite(module.clone(), counts, &options)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            r.report.iter().all(|o| o.rewritten),
            "{name}: {:#?}",
            r.report
        );
        let cdir = dir.join(name);
        std::fs::create_dir_all(&cdir).unwrap();
        let spec = write_inputs(&cdir, &parameters(module), values);
        for (which, m) in [("original", module), ("rewritten", &r.module)] {
            let path = cdir.join(format!("{which}.pb"));
            std::fs::write(&path, m.encode_to_vec()).unwrap();
            jobs.push(json!({
                "kind": "run",
                "module": path,
                "num_partitions": 8,
                "num_replicas": 1,
                "inputs": spec,
                "outputs_dir": cdir.join(which),
            }));
        }
    }
    let results = run_xla(&dir, &jobs);

    let mut failures = Vec::new();
    for (i, HugeRun { name, .. }) in runs.iter().enumerate() {
        for (j, which) in ["original", "rewritten"].into_iter().enumerate() {
            let res = &results[2 * i + j];
            let got = outputs(res, &dir.join(name).join(which), 8);
            for d in 1..8 {
                for (k, out) in got[d].iter().enumerate() {
                    let differ: Vec<usize> = (0..out.len())
                        .filter(|&e| out[e].to_bits() != got[0][k][e].to_bits())
                        .collect();
                    if let Some(&e) = differ.first() {
                        failures.push(format!(
                            "{name} {which}: device {d} differs from device 0 in {} elements \
                             of output {k}, first [{e}]: {:e} ({:#010x}) vs {:e} ({:#010x})",
                            differ.len(),
                            out[e],
                            out[e].to_bits(),
                            got[0][k][e],
                            got[0][k][e].to_bits()
                        ));
                    }
                }
            }
            if name.starts_with("scan_mlp") {
                // The regime of the report: huge and finite.
                let out = &got[0][0];
                let absmax = out.iter().fold(0f32, |m, x| m.max(x.abs()));
                assert!(
                    out.iter().all(|x| x.is_finite()) && absmax > 1e18,
                    "{name} {which}: expected finite activations beyond 1e18, absmax {absmax:e}"
                );
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} replica divergences:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
