//! Snapshots of rewrites: canonical HLO text (instructions renamed `base.N`
//! in print order, so id shifts do not churn diffs) that XLA's own parser
//! reads back — checked here in one batch. Every positive case has negative
//! twins that must come out unchanged, with the reason in the report.
//!
//! Review changes with `cargo insta review`.

mod common;

use common::modules::{
    CollectiveSpec, all_reduces, iota, list, load, make_async, opts, resized, retyped,
    with_attribute, with_counts, with_reducer,
};
use common::{run_xla, scratch};
use equarx::io::DeviceCounts;
use equarx::plan::{Algorithm, Rotation};
use equarx::plan::{Collective, QuantFormat};
use equarx::proto::{HloModuleProto, PrimitiveType};
use equarx::text::{PrintOptions, print_module_with};
use equarx::{FuseMode, GatherForm, RewriteOptions, ScaleType};
use serde_json::json;

struct Case {
    name: &'static str,
    module: HloModuleProto,
    options: RewriteOptions,
    counts: DeviceCounts,
}

fn counts(replicas: i64, partitions: i64) -> DeviceCounts {
    DeviceCounts {
        replica_count: Some(replicas),
        num_partitions: Some(partitions),
    }
}

fn case(name: &'static str, module: HloModuleProto, options: RewriteOptions) -> Case {
    Case {
        name,
        module,
        options,
        counts: counts(1, 8),
    }
}

fn p8() -> HloModuleProto {
    load("psum_bf16_p8.pb")
}

/// One reduce-scatter, all-gather or all-to-all over the 8 partitions.
fn collective(collective: Collective, dims: &[i64], dim: Option<i64>) -> HloModuleProto {
    common::modules::collective_module(&CollectiveSpec {
        name: collective.opcode(),
        collective,
        dims,
        dim,
        groups: &[(0..8).collect()],
        replicas: false,
        async_pair: false,
    })
}

fn positives() -> Vec<Case> {
    let b32 = |d, bi| opts(|o| (o.block_size, o.pipeline_depth, o.bidirectional) = (32, d, bi));
    let mut cross_replica = p8();
    for ar in all_reduces(&mut cross_replica) {
        ar.channel_id = 0;
        ar.use_global_device_ids = false;
    }
    with_counts(&mut cross_replica, 8, 1);
    let mut one_replica = p8();
    for ar in all_reduces(&mut one_replica) {
        ar.use_global_device_ids = false;
        ar.replica_group_list = list(&[&[0]]);
    }
    let mut iota_groups = p8();
    for ar in all_reduces(&mut iota_groups) {
        ar.replica_group_list = iota(2, 4, &[4, 2], &[1, 0]);
    }
    let mut async_pair = p8();
    make_async(&mut async_pair);
    // The tuple fixture is fused (wrapped converts): `off` keeps its
    // snapshot about packing; `fused_loops` shows the fusions.
    let f32_only = || {
        opts(|o| {
            o.element_types = vec![PrimitiveType::F32];
            o.fuse = FuseMode::Off;
        })
    };
    vec![
        case("p8_flattened_ids", p8(), opts(|_| {})),
        case("p4_two_groups_of_4", load("psum_bf16_2x4.pb"), opts(|_| {})),
        case(
            "p4_strided_groups",
            load("psum_bf16_4x2_strided.pb"),
            opts(|_| {}),
        ),
        case("p2", load("psum_bf16_2x4_strided.pb"), opts(|_| {})),
        case("iota_groups", iota_groups, opts(|_| {})),
        case(
            "mesh_axes_groups",
            load("mesh_axes_bf16_2x4.pb"),
            opts(|_| {}),
        ),
        Case {
            counts: counts(8, 1),
            ..case("cross_replica", cross_replica, opts(|_| {}))
        },
        case(
            "cross_replica_and_partition_one_replica",
            one_replica,
            opts(|_| {}),
        ),
        case("tuple_packed", load("psum_tuple_p8.pb"), f32_only()),
        case("f32_opt_in", load("psum_f32_p8.pb"), f32_only()),
        case("bidirectional", p8(), b32(1, true)),
        case("d1", p8(), b32(1, false)),
        case("d2", p8(), b32(2, false)),
        case("d4", p8(), b32(4, false)),
        case("padded", resized(p8(), &[8, 128], &[7, 100]), opts(|_| {})),
        case("while_body", load("scan_psum.pb"), opts(|_| {})),
        case("async_pair", async_pair, opts(|_| {})),
        case(
            "gather_by_permutes",
            p8(),
            opts(|o| o.gather = GatherForm::Permute),
        ),
        case("f32_scales", p8(), opts(|o| o.scale_type = ScaleType::F32)),
        // As after XLA's fusion: the ring's chains outlined into kLoop fusions.
        case("fused_loops", p8(), opts(|o| o.fuse = FuseMode::On)),
        // The ring written out step by step instead of the loop.
        case("unrolled", p8(), opts(|o| o.unroll = true)),
        // The other algorithms, and the rotation.
        case(
            "two_shot",
            p8(),
            opts(|o| o.algorithm = Some(Algorithm::TwoShot)),
        ),
        case(
            "two_level",
            p8(),
            opts(|o| o.algorithm = Some(Algorithm::TwoLevel)),
        ),
        case(
            "hadamard",
            p8(),
            opts(|o| o.rotation = Some(Rotation::Hadamard)),
        ),
        // The other collectives: reduce-scatter by the ring, all-gather,
        // all-to-all (array, along an inner dimension, and tuple).
        case(
            "reduce_scatter",
            collective(Collective::ReduceScatter, &[64, 128], Some(0)),
            opts(|_| {}),
        ),
        case(
            "all_gather",
            collective(Collective::AllGather, &[8, 128], Some(0)),
            opts(|_| {}),
        ),
        case(
            "all_to_all_dim1",
            collective(Collective::AllToAll, &[8, 1024], Some(1)),
            opts(|_| {}),
        ),
        case(
            "all_to_all_tuple",
            collective(Collective::AllToAll, &[8, 64], None),
            opts(|_| {}),
        ),
        // The other code formats.
        case(
            "fp8_e4m3",
            p8(),
            opts(|o| o.quant_format = QuantFormat::Fp8E4m3),
        ),
        case("int4", p8(), opts(|o| o.quant_format = QuantFormat::Int4)),
        // The time model's choice for a small psum on v5e.
        case(
            "defaults",
            p8(),
            RewriteOptions {
                pass: equarx::Options {
                    min_payload_bytes: Some(0),
                    ..equarx::Options::default()
                },
                ..RewriteOptions::default()
            },
        ),
    ]
}

fn negatives() -> Vec<(Case, &'static str)> {
    let mut singletons = p8();
    for ar in all_reduces(&mut singletons) {
        ar.replica_group_list = list(&[&[0], &[1], &[2], &[3], &[4], &[5], &[6], &[7]]);
    }
    let mut both = p8();
    for ar in all_reduces(&mut both) {
        ar.use_global_device_ids = false;
        ar.replica_group_list = list(&[&[0, 1]]);
    }
    with_counts(&mut both, 2, 4);
    vec![
        (
            case("max_reducer", with_reducer(p8(), "maximum"), opts(|_| {})),
            "not a sum",
        ),
        (
            case("group_of_one", singletons, opts(|_| {})),
            "group size 1",
        ),
        (
            case(
                "below_threshold",
                p8(),
                opts(|o| o.min_payload_bytes = Some(1 << 20)),
            ),
            "below the minimum",
        ),
        (
            case("model_predicts_no_gain", p8(), RewriteOptions::default()),
            "cost model predicts no gain",
        ),
        (
            Case {
                counts: counts(2, 4),
                ..case("cross_replica_and_partition", both, opts(|_| {}))
            },
            "span both",
        ),
        (
            case(
                "opted_out",
                with_attribute(p8(), "equarx.quantize", "false"),
                opts(|_| {}),
            ),
            "opted out",
        ),
        (
            case(
                "integer",
                retyped(p8(), PrimitiveType::Bf16 as i32, PrimitiveType::S32 as i32),
                opts(|_| {}),
            ),
            "not floating point",
        ),
        (
            case("f32_not_enabled", load("psum_f32_p8.pb"), opts(|_| {})),
            "f32 is not enabled",
        ),
        (
            case(
                "reduce_scatter_by_max",
                with_reducer(
                    collective(Collective::ReduceScatter, &[64, 128], Some(0)),
                    "maximum",
                ),
                opts(|_| {}),
            ),
            "not a sum",
        ),
        (
            case(
                "all_gather_of_s32",
                retyped(
                    collective(Collective::AllGather, &[8, 128], Some(0)),
                    PrimitiveType::Bf16 as i32,
                    PrimitiveType::S32 as i32,
                ),
                opts(|_| {}),
            ),
            "not floating point",
        ),
        (
            case(
                "all_to_all_below_threshold",
                collective(Collective::AllToAll, &[64, 128], Some(0)),
                opts(|o| o.min_payload_bytes = Some(1 << 20)),
            ),
            "below the minimum",
        ),
        (
            case(
                "int4_over_error_budget",
                p8(),
                opts(|o| {
                    o.quant_format = QuantFormat::Int4;
                    o.max_error_pct = Some(5.0);
                }),
            ),
            "no configuration meets the error budget",
        ),
        (
            case(
                "over_error_budget",
                p8(),
                opts(|o| o.max_error_pct = Some(0.1)),
            ),
            "no configuration meets the error budget",
        ),
        (
            case(
                "two_level_without_a_grid",
                load("psum_bf16_2x4_strided.pb"),
                opts(|o| o.algorithm = Some(Algorithm::TwoLevel)),
            ),
            "has none",
        ),
    ]
}

fn canonical(m: &HloModuleProto, counts: &DeviceCounts) -> String {
    print_module_with(
        m,
        counts,
        PrintOptions {
            canonical_names: true,
        },
    )
    .unwrap()
}

#[test]
fn rewrites_match_their_snapshots_and_xla_parses_them() {
    let dir = scratch("snapshots");
    let mut jobs = Vec::new();
    for c in positives() {
        let r = equarx::rewrite(c.module.clone(), c.counts, &c.options)
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert!(
            r.report.iter().all(|o| o.rewritten),
            "{}: {:#?}",
            c.name,
            r.report
        );
        let text = canonical(&r.module, &c.counts);
        insta::assert_snapshot!(c.name, text);
        let path = dir.join(format!("{}.txt", c.name));
        std::fs::write(&path, &text).unwrap();
        jobs.push(json!({"kind": "text_to_proto", "text": path, "out": dir.join(format!("{}.pb", c.name))}));
    }
    for (r, job) in run_xla(&dir, &jobs).iter().zip(&jobs) {
        assert_eq!(
            r["ok"], true,
            "XLA cannot parse {}: {}",
            job["text"], r["error"]
        );
    }
}

#[test]
fn negative_twins_come_out_unchanged_with_their_reason() {
    for (c, reason) in negatives() {
        let r = equarx::rewrite(c.module.clone(), c.counts, &c.options)
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert!(!r.changed, "{} was rewritten", c.name);
        assert_eq!(r.module, c.module, "{} changed", c.name);
        let got = r.report[0].reason.clone().unwrap_or_default();
        assert!(
            got.contains(reason),
            "{}: reason {got:?} lacks {reason:?}",
            c.name
        );
    }
}
