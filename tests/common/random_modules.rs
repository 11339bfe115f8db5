//! Random all-reduce modules for the property tests (`tests/properties.rs`):
//! a [`Case`] describes one module — operands (shapes of rank 0–4, odd
//! sizes, several element types, tuple mixes), the reduction, the group
//! mode, the group encoding (list, iota, mesh axes, empty) and the pass
//! options — and knows, independently of the pass, what the pass must do
//! with it ([`Case::expected`]).
//!
//! Modules are written as HLO text and read by `equarx::text::parse`
//! (itself judged by XLA's parser in `tests/text.rs`), so a failing case
//! prints as a module one can paste into XLA.

#![allow(dead_code)]

use equarx::ir::shape;
use equarx::passes::quantize_collectives::choose::{Payload, choose_plan};
use equarx::plan::{Algorithm, Rotation};
use equarx::plan::{Plan, ring_wire_bytes};
use equarx::proto::PrimitiveType;
use equarx::{
    DeviceCounts, FuseMode, GatherForm, Options, Platform, RewriteOptions, ScaleType, Stage,
};
use proptest::prelude::*;
use proptest::sample::select;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    Bf16,
    F16,
    F32,
    F64,
    S32,
    S8,
    Pred,
}

impl Ty {
    pub fn name(self) -> &'static str {
        match self {
            Ty::Bf16 => "bf16",
            Ty::F16 => "f16",
            Ty::F32 => "f32",
            Ty::F64 => "f64",
            Ty::S32 => "s32",
            Ty::S8 => "s8",
            Ty::Pred => "pred",
        }
    }

    pub fn primitive(self) -> PrimitiveType {
        shape::type_from_name(self.name()).expect("a known type")
    }

    /// bf16, f16 and f32 are the types the pass can quantize.
    pub fn quantizable(self) -> bool {
        matches!(self, Ty::Bf16 | Ty::F16 | Ty::F32)
    }

    /// Explicit mantissa bits of the quantizable types.
    pub fn mantissa_bits(self) -> u32 {
        match self {
            Ty::Bf16 => 7,
            Ty::F16 => 10,
            _ => 23,
        }
    }

    pub fn bytes(self) -> u64 {
        match self {
            Ty::Bf16 | Ty::F16 => 2,
            Ty::F32 | Ty::S32 => 4,
            Ty::F64 => 8,
            Ty::S8 | Ty::Pred => 1,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operand {
    pub ty: Ty,
    pub dims: Vec<i64>,
}

impl Operand {
    pub fn elements(&self) -> u64 {
        self.dims.iter().map(|&d| d as u64).product()
    }

    pub fn text(&self) -> String {
        let dims: Vec<String> = self.dims.iter().map(i64::to_string).collect();
        format!("{}[{}]", self.ty.name(), dims.join(","))
    }
}

/// Whose ids the all-reduce's groups list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No channel id: replica ids.
    CrossReplica,
    /// Channel id, `use_global_device_ids=false`.
    CrossReplicaAndPartition,
    /// Channel id, `use_global_device_ids=true`.
    Flattened,
}

/// How the module's N devices are split into replicas × partitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// N replicas, 1 partition.
    Replicas,
    /// 1 replica, N partitions.
    Partitions,
    /// 2 replicas × N/2 partitions (N even, at least 4).
    Both,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    List,
    Iota,
    MeshAxes,
    /// `replica_groups={}`: everyone (one group).
    Empty,
}

#[derive(Clone, Debug)]
pub struct Case {
    pub operands: Vec<Operand>,
    /// `add`, or another binary op (never eligible).
    pub reducer: &'static str,
    pub mode: Mode,
    pub layout: Layout,
    pub encoding: Encoding,
    /// Groups G and group size S as written (G·S ids).
    pub groups: usize,
    pub size: usize,
    /// Group g holds ids g, g+G, ... instead of g·S, g·S+1, ...
    pub strided: bool,
    /// A second, never eligible all-reduce (s32) next to the first.
    pub with_integer_all_reduce: bool,
    pub options: Options,
}

impl Case {
    /// Devices of the module: G·S (replicas × partitions).
    pub fn devices(&self) -> usize {
        self.groups * self.size
    }

    pub fn counts(&self) -> (usize, usize) {
        let n = self.devices();
        match self.layout {
            Layout::Replicas => (n, 1),
            Layout::Partitions => (1, n),
            Layout::Both => (2, n / 2),
        }
    }

    /// The groups as the all-reduce writes them (ids in its mode's space).
    pub fn written_groups(&self) -> Vec<Vec<i64>> {
        let (g, s) = (self.groups as i64, self.size as i64);
        (0..g)
            .map(|k| {
                (0..s)
                    .map(|j| if self.strided { k + j * g } else { k * s + j })
                    .collect()
            })
            .collect()
    }

    /// The groups attribute in HLO text.
    fn groups_text(&self) -> String {
        let (g, s) = (self.groups, self.size);
        if self.mode == Mode::CrossReplicaAndPartition && self.layout == Layout::Partitions {
            // One replica: the only group XLA accepts names replica 0.
            return match self.encoding {
                Encoding::Empty => "replica_groups={}".into(),
                _ => "replica_groups={{0}}".into(),
            };
        }
        match self.encoding {
            Encoding::Empty => "replica_groups={}".into(),
            Encoding::List => {
                let groups: Vec<String> = self
                    .written_groups()
                    .iter()
                    .map(|grp| {
                        let ids: Vec<String> = grp.iter().map(i64::to_string).collect();
                        format!("{{{}}}", ids.join(","))
                    })
                    .collect();
                format!("replica_groups={{{}}}", groups.join(","))
            }
            Encoding::Iota if self.strided => {
                format!("replica_groups=[{g},{s}]<=[{s},{g}]T(1,0)")
            }
            Encoding::Iota => format!("replica_groups=[{g},{s}]<=[{}]", g * s),
            // Device d = a·|b| + b; grouping over the minor axis gives
            // contiguous groups, over the major one strided groups.
            Encoding::MeshAxes if self.strided => {
                format!("replica_groups=mesh['a'={s},'b'={g}] {{'a'}}")
            }
            Encoding::MeshAxes => format!("replica_groups=mesh['a'={g},'b'={s}] {{'b'}}"),
        }
    }

    /// The mode's attributes, on `channel` where the mode has one.
    fn mode_text(&self, channel: i64) -> String {
        match self.mode {
            Mode::CrossReplica => String::new(),
            Mode::CrossReplicaAndPartition => format!("channel_id={channel}, "),
            Mode::Flattened => format!("channel_id={channel}, use_global_device_ids=true, "),
        }
    }

    fn result_text(&self) -> String {
        if self.operands.len() == 1 {
            self.operands[0].text()
        } else {
            let parts: Vec<String> = self.operands.iter().map(Operand::text).collect();
            format!("({})", parts.join(", "))
        }
    }

    /// The module, as HLO text.
    pub fn hlo(&self) -> String {
        let (r, p) = self.counts();
        let ty0 = self.operands[0].ty.name();
        let mut t = format!("HloModule prop, replica_count={r}, num_partitions={p}\n\n");
        t += &format!(
            "%reduce (a: {ty0}[], b: {ty0}[]) -> {ty0}[] {{\n  %a = {ty0}[] parameter(0)\n  \
             %b = {ty0}[] parameter(1)\n  ROOT %r = {ty0}[] {}(%a, %b)\n}}\n\n",
            self.reducer
        );
        if self.with_integer_all_reduce {
            t += "%sum_s32 (x: s32[], y: s32[]) -> s32[] {\n  %x = s32[] parameter(0)\n  \
                  %y = s32[] parameter(1)\n  ROOT %s = s32[] add(%x, %y)\n}\n\n";
        }
        let mut params: Vec<String> = self
            .operands
            .iter()
            .enumerate()
            .map(|(k, o)| format!("p{k}: {}", o.text()))
            .collect();
        let result = self.result_text();
        let root_type = if self.with_integer_all_reduce {
            params.push("q: s32[3]".into());
            format!("({result}, s32[3])")
        } else {
            result.clone()
        };
        t += &format!("ENTRY %main ({}) -> {root_type} {{\n", params.join(", "));
        for (k, o) in self.operands.iter().enumerate() {
            t += &format!("  %p{k} = {} parameter({k})\n", o.text());
        }
        let args: Vec<String> = (0..self.operands.len()).map(|k| format!("%p{k}")).collect();
        let groups = self.groups_text();
        let mode = self.mode_text(1);
        let root = if self.with_integer_all_reduce {
            ""
        } else {
            "ROOT "
        };
        t += &format!(
            "  {root}%ar = {result} all-reduce({}), {mode}{groups}, to_apply=%reduce\n",
            args.join(", ")
        );
        if self.with_integer_all_reduce {
            let q = self.operands.len();
            t += &format!("  %q = s32[3] parameter({q})\n");
            // A channel of its own: XLA's layout assignment gives ops of one
            // channel one layout (XLA:GPU refused a bf16[2,2,128,128] and
            // this s32[3] sharing channel 1).
            let mode = self.mode_text(2);
            t += &format!("  %ints = s32[3] all-reduce(%q), {mode}{groups}, to_apply=%sum_s32\n");
            t += &format!("  ROOT %out = ({result}, s32[3]) tuple(%ar, %ints)\n");
        }
        t += "}\n";
        t
    }

    pub fn rewrite_options(&self) -> RewriteOptions {
        RewriteOptions {
            pass: self.options.clone(),
            ..RewriteOptions::default()
        }
    }

    /// Whether operand `o` joins the quantized ring.
    pub fn joins(&self, o: &Operand) -> bool {
        o.ty.quantizable() && self.options.element_types.contains(&o.ty.primitive())
    }

    /// The participants' groups (ids of the emitted collectives' space) if
    /// collective-permute can express the mode, else `None`.
    pub fn participant_groups(&self) -> Option<Vec<Vec<i64>>> {
        let n = self.devices() as i64;
        let everyone = || vec![(0..n).collect::<Vec<i64>>()];
        match (self.mode, self.layout) {
            (_, Layout::Both) if self.mode != Mode::CrossReplica => None,
            (Mode::CrossReplicaAndPartition, Layout::Partitions) => Some(everyone()),
            _ if self.encoding == Encoding::Empty => Some(everyone()),
            _ => Some(self.written_groups()),
        }
    }

    /// What the pass must do, decided without it: `Some(plan)` when the
    /// all-reduce is rewritten.
    pub fn expected(&self) -> Option<Plan> {
        if self.reducer != "add" {
            return None;
        }
        let groups = self.participant_groups()?;
        let p = groups[0].len();
        let joining: Vec<&Operand> = self.operands.iter().filter(|o| self.joins(o)).collect();
        if joining.is_empty() || p < 2 {
            return None;
        }
        let payload: u64 = joining.iter().map(|o| o.elements() * o.ty.bytes()).sum();
        if payload < self.options.min_payload_bytes.unwrap_or(0) {
            return None;
        }
        let elements: u64 = joining.iter().map(|o| o.elements()).sum();
        // Which plan is the pass's choice (tested on its own); whether the
        // op is rewritten at all is decided here, without the pass.
        let mantissa = joining.iter().map(|o| o.ty.mantissa_bits()).min()?;
        let payload_of = Payload {
            collective: equarx::plan::Collective::AllReduce,
            elements: elements as usize,
            row: None,
            bytes: payload,
            mantissa_bits: mantissa,
        };
        let mut plan = choose_plan(
            p,
            &payload_of,
            true,
            equarx::numerics::error::Data::Prior,
            &self.options,
        )
        .ok()?
        .plan;
        // The pass sends the chosen plan's messages as its platform takes
        // them (the modules are before XLA's fusion).
        let stage = Stage::PreFusion;
        let platform =
            Platform::resolve(self.options.platform, stage, self.options.topology.as_ref());
        plan.config.wire = platform.wire(stage, &plan);
        (plan.wire_bytes() < ring_wire_bytes(p, payload)).then_some(plan)
    }

    pub fn device_counts(&self) -> DeviceCounts {
        let (r, p) = self.counts();
        DeviceCounts {
            replica_count: Some(r as i64),
            num_partitions: Some(p as i64),
        }
    }
}

fn dims() -> impl Strategy<Value = Vec<i64>> {
    let dim = || prop_oneof![5 => 1i64..=7, 5 => 8i64..=130, 1 => Just(0i64)];
    prop_oneof![
        1 => prop::collection::vec(dim(), 0..=0),
        8 => prop::collection::vec(dim(), 1..=4),
    ]
}

fn ty() -> impl Strategy<Value = Ty> {
    prop_oneof![
        6 => Just(Ty::Bf16),
        3 => Just(Ty::F32),
        2 => Just(Ty::F16),
        1 => Just(Ty::F64),
        1 => Just(Ty::S32),
        1 => Just(Ty::S8),
        1 => Just(Ty::Pred),
    ]
}

fn operand() -> impl Strategy<Value = Operand> {
    (ty(), dims()).prop_map(|(ty, dims)| Operand { ty, dims })
}

pub fn options() -> impl Strategy<Value = Options> {
    let types = prop_oneof![
        8 => prop::sample::subsequence(vec![Ty::Bf16, Ty::F16, Ty::F32], 2..=3),
        2 => prop::sample::subsequence(vec![Ty::Bf16, Ty::F16, Ty::F32], 0..=1),
    ];
    (
        select(vec![1usize, 1, 2, 3, 4, 5, 8, 16, 32, 64, 100, 128]),
        prop_oneof![8 => 1usize..=4, 1 => Just(16usize)],
        any::<bool>(),
        select(vec![ScaleType::Bf16, ScaleType::F32]),
        select(vec![GatherForm::AllGather, GatherForm::Permute]),
        select(vec![0u64, 0, 0, 0, 64, 4096]),
        types,
        select(vec![FuseMode::Auto, FuseMode::Off]),
        select(vec![
            None,
            Some(Algorithm::Ring),
            Some(Algorithm::TwoShot),
            Some(Algorithm::TwoLevel),
        ]),
        select(vec![None, Some(Rotation::None), Some(Rotation::Hadamard)]),
        any::<bool>(),
    )
        .prop_map(
            |(
                block_size,
                pipeline_depth,
                bidirectional,
                scale_type,
                gather,
                min,
                types,
                fuse,
                algorithm,
                rotation,
                unroll,
            )| {
                // Hadamard needs a power-of-two block (validated): ask for
                // none otherwise.
                let rotation = if block_size.is_power_of_two() {
                    rotation
                } else {
                    Some(Rotation::None)
                };
                Options {
                    block_size,
                    pipeline_depth,
                    bidirectional,
                    scale_type,
                    gather,
                    min_payload_bytes: Some(min),
                    element_types: types.iter().map(|t| t.primitive()).collect(),
                    fuse,
                    algorithm,
                    rotation,
                    unroll,
                    // XLA:CPU runs these modules: the HLO emission (on
                    // XLA:TPU the default writes Mosaic kernels where they
                    // take an op, which only libtpu compiles).
                    kernels: Some(equarx::plan::Kernels::Hlo),
                    ..Options::default()
                }
            },
        )
}

/// A case equarx's own kernels take at the hooks of XLA:GPU (Triton) and
/// XLA:TPU (Mosaic), drawn from [`case`]'s modes, layouts, encodings and
/// strides: one bf16 `add` all-reduce whose last dimension is 128·c and
/// whose other dimensions hold 128·P·m rows (P the participants' group),
/// forced to a two-shot of int8 blocks of 64 with bf16 scales, gathered by
/// an all-gather; the rotation, pipeline depth, direction and fusion stay
/// random, as does a second, integer all-reduce beside it. Groups are those
/// the pass can address, of 2 to 16 ranks.
pub fn kernel_case() -> impl Strategy<Value = Case> {
    // Groups collective-permute can address, of 2 to 16 ranks (the sum
    // kernel's most).
    let group = |c: &Case| c.participant_groups().map_or(0, |g| g[0].len() as i64);
    let kernels_take = move |c: &Case| (2..=16).contains(&group(c));
    (
        case().prop_filter("groups the kernels take", kernels_take),
        1i64..=4,
        1i64..=2,
        0usize..=2,
    )
        .prop_map(move |(mut c, cols, m, split)| {
            let p = group(&c);
            let rows = 128 * p * m;
            let mut dims = match split {
                0 => vec![rows],
                1 => vec![2, rows / 2],
                _ => vec![2, 2, rows / 4],
            };
            dims.push(128 * cols);
            c.operands = vec![Operand { ty: Ty::Bf16, dims }];
            c.reducer = "add";
            let o = &mut c.options;
            o.block_size = 64;
            o.scale_type = ScaleType::Bf16;
            o.quant_format = equarx::plan::QuantFormat::Int8;
            o.element_types = vec![Ty::Bf16.primitive(), Ty::F32.primitive()];
            o.min_payload_bytes = Some(0);
            o.algorithm = Some(Algorithm::TwoShot);
            // The kernels gather with an all-gather.
            o.gather = GatherForm::AllGather;
            // The defaults' kernels: each compiler's own where they take the op.
            o.kernels = None;
            c
        })
}

/// Any case: eligible or not, every mode, layout and encoding.
pub fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(operand(), 1..=3),
        prop_oneof![38 => Just("add"), 1 => Just("maximum"), 1 => Just("multiply")],
        select(vec![
            Mode::CrossReplica,
            Mode::CrossReplicaAndPartition,
            Mode::Flattened,
        ]),
        prop_oneof![3 => Just(Layout::Replicas), 3 => Just(Layout::Partitions), 1 => Just(Layout::Both)],
        select(vec![
            Encoding::List,
            Encoding::Iota,
            Encoding::MeshAxes,
            Encoding::Empty,
        ]),
        1usize..=3,
        prop_oneof![1 => Just(1usize), 6 => 2usize..=5],
        any::<bool>(),
        prop::bool::weighted(0.25),
        options(),
    )
        .prop_map(
            |(operands, reducer, mode, layout, encoding, g, s, strided, ints, options)| {
                let mut c = Case {
                    operands,
                    reducer,
                    mode,
                    layout,
                    encoding,
                    groups: g,
                    size: s,
                    strided,
                    with_integer_all_reduce: ints,
                    options,
                };
                // Keep what is written valid XLA: mesh axes come with global
                // ids, global ids come with groups listed (XLA's verifier,
                // and equarx's), an empty group list is one group, Both
                // needs N = 2·k with k ≥ 2.
                if c.encoding == Encoding::MeshAxes && c.mode != Mode::Flattened {
                    c.encoding = Encoding::Iota;
                }
                if c.encoding == Encoding::Empty && c.mode == Mode::Flattened {
                    c.encoding = Encoding::List;
                }
                if c.encoding == Encoding::Empty {
                    (c.groups, c.size) = (1, c.devices());
                }
                if c.layout == Layout::Both && (c.devices() % 2 != 0 || c.devices() < 4) {
                    c.layout = Layout::Partitions;
                }
                if c.mode == Mode::CrossReplica && c.layout == Layout::Both {
                    // Cross-replica groups name replicas: all N of them.
                    c.layout = Layout::Replicas;
                }
                if c.mode == Mode::CrossReplica && c.layout == Layout::Partitions {
                    c.layout = Layout::Replicas;
                }
                c
            },
        )
}
