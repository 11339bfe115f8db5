//! `quantized-all-reduce`: EQuARX. Sum all-reduces become block-wise
//! dynamically quantized int8 transfers with f32 accumulation, so the wire
//! carries about one byte per element instead of two (bf16).
//!
//! ```text
//! before                          after (ring, loop form, one lane per direction)
//!
//! x = bf16[S] ...                 x  = bf16[S] ...
//! y = bf16[S] all-reduce(x),      f  = bf16[P,c] reshape(pad(x))            (rotated: f32, H·block)
//!     to_apply=add                r  = s32[] rank(partition-id())          table lookup
//! use(y)                          p0 = own part of chunk (r-1) mod P
//!                                 w  = while s < P-1:                      (reduce-scatter)
//!                                 │ m  = s8[nb, B+2] quantize(p)            codes ++ scale bytes
//!                                 │ m' = collective-permute(m), r → r+1
//!                                 │ p  = dequantize(m') + own part of chunk (r-s-2) mod P
//!                                 g  = s8[P, msg] all-gather(quantize(p))
//!                                 v  = f32[P·c] dequantize(g)              every rank, owner too
//!                                 y' = bf16[S] convert(reshape(slice(v)))
//!                                 use(y')
//! ```
//!
//! The algorithm (ring, two-shot, two-level), the rotation and every size
//! are decided per op as a [`Plan`] ([`crate::plan`]), which the emitter,
//! the time model and the error model all read; [`choose`] picks the plan.
//!
//! Why it is sound: every reduce phase sums each chunk over every member of
//! its axis exactly once, and the phases' axes cover the group; the gather
//! gives every rank every chunk; quantization changes values only within
//! the error model of [`crate::numerics`]; all participants dequantize the
//! same codes with the same op, so they agree bit for bit. What it assumes:
//! the module is not scheduled for async collectives other than the pair it
//! rewrites, and the replica/partition counts it was given are true.
//!
//! Pieces: [`eligibility`] decides, [`groups`] maps groups to ids
//! collective-permute can name, [`choose`] plans, [`emit`] writes the HLO,
//! [`fuse`] outlines loop fusions in an already fused module.

pub mod eligibility;
pub mod emit;
pub mod fuse;
pub mod groups;

use eligibility::Candidate;
use emit::{EmitInputs, emit};

use super::{Pass, PassError};
use crate::cost::{Topology, predict};
use crate::io::DeviceCounts;
use crate::ir::builder::{Builder, Value};
use crate::ir::groups::{GroupMode, ReplicaGroups};
use crate::ir::{CompId, Edits, InstrId, Module, shape};
pub use crate::numerics::ScaleType;
use crate::numerics::error::predicted_rel_rms;
use crate::numerics::simulate::balanced_grid;
use crate::plan::{Algorithm, Collective, Config, Plan, PlanError, baseline_wire_bytes};
pub use crate::plan::{Form, GatherForm, QuantFormat, Rotation};
use crate::proto::{HloInstructionProto, OpMetadata, PrimitiveType, ShapeProto};

crate::choice_enum! {
    /// Which reduce algorithm `--algorithm` asks for.
    pub enum AlgorithmOption {
        /// The time model picks per op among those that apply.
        Auto = "auto",
        /// The paper's ring: P−1 requantizing hops.
        Ring = "ring",
        /// Quantize once, one all-to-all, the owner sums in f32.
        TwoShot = "two-shot",
        /// A ring per axis of a 2-D grid: the topology's slice shape when
        /// it has P devices, else the most balanced factorization of P.
        TwoLevel = "two-level",
    }
}

crate::choice_enum! {
    /// Whether `--rotation` rotates blocks before quantizing.
    pub enum RotationOption {
        /// Hadamard wherever the time model says it costs at most 5 % (and
        /// the block size is a power of two).
        Auto = "auto",
        /// Never rotate.
        None = "none",
        /// Always rotate.
        Hadamard = "hadamard",
    }
}

crate::choice_enum! {
    /// Whether the emitted ops are outlined into loop fusions.
    pub enum FuseMode {
        /// When the module already holds fusions (the compiler's fusion
        /// pass has run, as at XLA's pre-scheduler hook); not before.
        Auto = "auto",
        /// Always: for a pass position after fusion in a module without any.
        On = "on",
        /// Never: leave fusion to the compiler.
        Off = "off",
    }
}

/// The pass's options.
///
/// Defaults, from measurements (BENCHMARKS.md): B = 64 with bf16 scales
/// sends the same bytes as B = 128 with f32 scales (1.94x fewer than a bf16
/// ring) and errs less on outlier-heavy activations (a large block lets one
/// outlier flatten its neighbours). Rotation is on wherever it is cheap: it
/// cuts the error on such activations several times and changes nothing on
/// Gaussian data. The ring is bidirectional: on a torus, and against an XLA
/// all-reduce that uses both directions of its links, a one-way ring has
/// half the bandwidth (`equarx model`). One lane per direction and the loop
/// form keep a rewritten all-reduce under 200 instructions for any P, so
/// XLA compiles the module about as fast as the original. Which all-reduces
/// are worth it, and with which algorithm, is the cost model's call
/// ([`crate::cost`], TPU v5e unless told otherwise); a minimum payload
/// replaces the model when given, an error budget restricts it.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Elements per quantization block (B).
    pub block_size: usize,
    /// Independent sub-chunk chains per ring direction (D).
    pub pipeline_depth: usize,
    /// Send half of every chunk each way round the ring.
    pub bidirectional: bool,
    /// All-reduces with a smaller payload (bytes, in their own type) stay;
    /// `None`: the cost model decides, on [`Options::topology`].
    pub min_payload_bytes: Option<u64>,
    /// The machine the cost model predicts for.
    pub topology: Topology,
    /// Element types that are quantized.
    pub element_types: Vec<PrimitiveType>,
    pub scale_type: ScaleType,
    /// What a code is: int8 (the default), fp8 e4m3 / e5m2, or int4.
    pub quant_format: QuantFormat,
    pub gather: GatherForm,
    /// Outline the quantize / dequantize chains into loop fusions.
    pub fuse: FuseMode,
    pub algorithm: AlgorithmOption,
    pub rotation: RotationOption,
    /// Write every ring step out instead of a `while` loop over them.
    pub unroll: bool,
    /// The largest predicted relative RMS error (on Gaussian data, in
    /// percent) a rewrite may have: the fastest configuration within it
    /// is taken, and an op with none is skipped.
    pub max_error_pct: Option<f64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            block_size: 64,
            pipeline_depth: 1,
            bidirectional: true,
            min_payload_bytes: None,
            topology: Topology::parse(DEFAULT_TOPOLOGY).unwrap_or_else(|e| unreachable!("{e}")),
            element_types: vec![PrimitiveType::Bf16],
            scale_type: ScaleType::Bf16,
            quant_format: QuantFormat::Int8,
            gather: GatherForm::AllGather,
            fuse: FuseMode::Auto,
            algorithm: AlgorithmOption::Auto,
            rotation: RotationOption::Auto,
            unroll: false,
            max_error_pct: None,
        }
    }
}

/// The topology the cost model assumes unless told: the paper's TPU.
pub const DEFAULT_TOPOLOGY: &str = "v5e";

/// The element types that can be quantized, by their HLO names.
pub fn parse_element_types<S: AsRef<str>>(names: &[S]) -> Result<Vec<PrimitiveType>, String> {
    names
        .iter()
        .map(|n| match n.as_ref().trim() {
            "bf16" => Ok(PrimitiveType::Bf16),
            "f16" => Ok(PrimitiveType::F16),
            "f32" => Ok(PrimitiveType::F32),
            other => Err(format!(
                "element type {other:?} is not one of bf16, f16, f32"
            )),
        })
        .collect()
}

/// Largest accepted block size and pipeline depth: far beyond any useful
/// value, small enough that size arithmetic cannot overflow.
pub const MAX_BLOCK_SIZE: usize = 1 << 20;
pub const MAX_PIPELINE_DEPTH: usize = 256;

impl Options {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_BLOCK_SIZE).contains(&self.block_size) {
            return Err(format!(
                "block size must be in 1..={MAX_BLOCK_SIZE}, is {}",
                self.block_size
            ));
        }
        if !(1..=MAX_PIPELINE_DEPTH).contains(&self.pipeline_depth) {
            return Err(format!(
                "pipeline depth must be in 1..={MAX_PIPELINE_DEPTH}, is {}",
                self.pipeline_depth
            ));
        }
        if self.rotation == RotationOption::Hadamard && !self.block_size.is_power_of_two() {
            return Err(format!(
                "--rotation hadamard needs a power-of-two block size, not {}",
                self.block_size
            ));
        }
        if self.quant_format == QuantFormat::Int4 && self.block_size % 2 != 0 {
            return Err(format!(
                "int4 codes pack two to a byte: the block size must be even, not {}",
                self.block_size
            ));
        }
        if let Some(e) = self.max_error_pct.filter(|e| !(e.is_finite() && *e > 0.0)) {
            return Err(format!(
                "the error budget must be a positive percentage, is {e}"
            ));
        }
        let quantizable = [PrimitiveType::Bf16, PrimitiveType::F16, PrimitiveType::F32];
        if let Some(t) = self.element_types.iter().find(|t| !quantizable.contains(t)) {
            return Err(format!(
                "element type {t:?} cannot be quantized (bf16, f16, f32 can)"
            ));
        }
        Ok(())
    }
}

/// Why an all-reduce was left as it is.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SkipReason {
    #[error("not a collective equarx rewrites")]
    NotAllReduce,
    #[error("not supported: {0}")]
    Unsupported(String),
    #[error("reduction is not a sum: {0}")]
    NotSum(String),
    #[error(
        "opted out by frontend attribute {}=\"false\"",
        eligibility::FORCE_ATTRIBUTE
    )]
    OptedOut,
    #[error("bad frontend attribute: {0}")]
    BadAttribute(String),
    #[error("inside a fusion computation")]
    InFusion,
    #[error("has control dependencies")]
    ControlDependencies,
    #[error("a -start without a single -done user")]
    AsyncShape,
    #[error("dynamic shapes")]
    DynamicShape,
    #[error("element type {0} is not floating point (integer sums must stay exact)")]
    NotFloat(String),
    #[error("element type {0} is not enabled (see --types)")]
    TypeNotEnabled(String),
    #[error("groups have different sizes")]
    UnevenGroups,
    #[error("replica groups: {0}")]
    BadGroups(String),
    #[error("not expressible with collective-permute: {0}")]
    ModeNotExpressible(String),
    #[error(
        "{0}; give the counts (--replica-count / --num-partitions), e.g. --replica-count 1 for JAX SPMD programs"
    )]
    CountsUnknown(String),
    #[error("payload of {bytes} bytes is below the minimum of {min} (see --min-payload)")]
    BelowThreshold { bytes: u64, min: u64 },
    #[error(
        "padding to P·L·B makes the quantized ring send {after} bytes, not fewer than {before}"
    )]
    NoGain { before: u64, after: u64 },
    #[error(
        "the cost model predicts no gain on {}: {:.2}x (bf16 ring {:.1} us, equarx {:.1} us; \
         a model, see --topology, or force with --min-payload)",
        .0.topology, .0.speedup, .0.bf16_us, .0.equarx_us
    )]
    NotFaster(PredictedTime),
    #[error("{0}")]
    Plan(#[from] PlanError),
    #[error(
        "no configuration meets the error budget of {budget}% (the most exact, {best}, predicts {predicted:.2}% on Gaussian data)"
    )]
    OverBudget {
        budget: f64,
        best: String,
        predicted: f64,
    },
}

/// The pass's decision for one all-reduce.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct OpReport {
    pub name: String,
    pub computation: String,
    pub opcode: String,
    pub shape: String,
    pub element_types: Vec<String>,
    pub group_size: Option<usize>,
    pub groups: Option<usize>,
    pub mode: String,
    pub encoding: String,
    pub rewritten: bool,
    /// Why it was skipped (or, when rewritten, notes such as a forced op).
    pub reason: Option<String>,
    /// Bytes of the quantized operands in their own type.
    pub payload_bytes: u64,
    /// Bytes each device sends for those operands: a ring all-reduce in
    /// their own type, 2·(P−1)/P·payload.
    pub wire_bytes_before: Option<u64>,
    /// Bytes each device sends in the emitted collectives.
    pub wire_bytes_after: Option<u64>,
    /// Predicted relative RMS error against the exact sum (Gaussian data).
    pub predicted_rel_rms: Option<f64>,
    /// The cost model's times (a model, not a measurement).
    pub predicted_time: Option<PredictedTime>,
    pub plan: Option<PlanSummary>,
}

/// The cost model's view of one rewrite.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PredictedTime {
    pub topology: String,
    pub bf16_us: f64,
    pub equarx_us: f64,
    pub speedup: f64,
}

/// The plan of a rewrite, as the report shows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PlanSummary {
    /// The configuration chosen (`Plan::new(P, elements, &config)` gives
    /// the plan back).
    pub config: Config,
    pub algorithm: String,
    pub rotation: Rotation,
    /// How repeated steps are emitted; `None` when the plan has none.
    pub form: Option<Form>,
    pub block_size: usize,
    pub lanes: usize,
    pub padding_elements: usize,
    /// How often a partial sum is quantized on its way.
    pub quantizations: usize,
    /// Collective ops in the emitted HLO (a loop body's count once).
    pub collectives: usize,
    /// Collective steps each device runs (a loop's every iteration).
    pub collective_steps: u64,
    /// Instructions the rewrite emitted, its loop computations included
    /// (before any outlining into loop fusions; the module's scalar
    /// reducers, shared by every op, not counted).
    pub instructions: usize,
}

impl OpReport {
    /// before / after, when rewritten.
    pub fn wire_ratio(&self) -> Option<f64> {
        match (self.wire_bytes_before, self.wire_bytes_after) {
            (Some(b), Some(a)) if a > 0 => Some(b as f64 / a as f64),
            _ => None,
        }
    }
}

/// The pass. Construct with [`QuantizedAllReduce::new`]; after it ran,
/// [`QuantizedAllReduce::report`] says what it did to every all-reduce.
pub struct QuantizedAllReduce {
    options: Options,
    counts: DeviceCounts,
    report: Vec<OpReport>,
}

impl QuantizedAllReduce {
    pub fn new(options: Options, counts: DeviceCounts) -> Result<Self, String> {
        options.validate()?;
        Ok(QuantizedAllReduce {
            options,
            counts,
            report: Vec::new(),
        })
    }

    pub fn report(&self) -> &[OpReport] {
        &self.report
    }

    pub fn into_report(self) -> Vec<OpReport> {
        self.report
    }
}

impl Pass for QuantizedAllReduce {
    fn name(&self) -> &'static str {
        "quantized-all-reduce"
    }

    fn run(&mut self, module: &mut Module) -> Result<bool, PassError> {
        self.report.clear();
        let mut reducers = None;
        let mut changed = false;
        let comp_ids: Vec<CompId> = module.computations().iter().map(|c| c.id()).collect();
        // A module that holds fusions is past XLA's optimizations.
        let late = module
            .computations()
            .iter()
            .any(|c| c.instructions().iter().any(|i| i.opcode == "fusion"));
        let fuse = match self.options.fuse {
            FuseMode::On => true,
            FuseMode::Off => false,
            FuseMode::Auto => late,
        };
        let mut dead_comps: Vec<CompId> = Vec::new();
        for comp_id in comp_ids {
            let Some(comp) = module.computation(comp_id) else {
                continue;
            };
            let mut edits = Edits::default();
            let mut bodies: Vec<CompId> = Vec::new();
            let all_reduces: Vec<HloInstructionProto> = comp
                .instructions()
                .iter()
                .filter(|i| eligibility::OPCODES.contains(&i.opcode.as_str()))
                .cloned()
                .collect();
            for instr in all_reduces {
                let comp = module
                    .computation(comp_id)
                    .ok_or_else(|| fail("computation vanished"))?;
                let mut entry = describe(comp.name(), &instr, comp);
                let decision =
                    eligibility::examine(module, comp, &instr, &self.options, &self.counts)
                        .and_then(|c| choose(&c, &self.options).map(|p| (c, p)));
                match decision {
                    Err(reason) => {
                        if let SkipReason::NotFaster(time) = &reason {
                            entry.predicted_time = Some(time.clone());
                        }
                        entry.reason = Some(reason.to_string());
                        self.report.push(entry);
                    }
                    Ok((candidate, Choice { plan, time })) => {
                        let reducers = *reducers.get_or_insert_with(|| Reducers {
                            max_f32: module.add_scalar_reducer(
                                "equarx_max_f32",
                                "maximum",
                                PrimitiveType::F32,
                            ),
                            or_s32: module.add_scalar_reducer(
                                "equarx_or_s32",
                                "or",
                                PrimitiveType::S32,
                            ),
                            add_f32: module.add_scalar_reducer(
                                "equarx_add_f32",
                                "add",
                                PrimitiveType::F32,
                            ),
                        });
                        let emitted = rewrite(
                            module,
                            &candidate,
                            &plan,
                            late,
                            reducers,
                            &mut edits,
                            &mut dead_comps,
                        )?;
                        bodies.extend(emitted.computations.iter().copied());
                        fill_rewritten(&mut entry, &candidate, &plan, &emitted);
                        entry.predicted_time = Some(time);
                        self.report.push(entry);
                        changed = true;
                    }
                }
            }
            let emitted: rustc_hash::FxHashSet<i64> = edits
                .insert_before
                .values()
                .flatten()
                .map(|i| i.id)
                .collect();
            module.apply(comp_id, edits);
            if fuse && !emitted.is_empty() {
                fuse::fuse_emitted(module, comp_id, &emitted);
                for body in bodies {
                    let all = module.computation(body).map(|c| {
                        c.instructions()
                            .iter()
                            .map(|i| i.id)
                            .collect::<rustc_hash::FxHashSet<i64>>()
                    });
                    if let Some(all) = all {
                        fuse::fuse_emitted(module, body, &all);
                    }
                }
            }
        }
        for dead in dead_comps {
            module.remove_computation(dead);
        }
        Ok(changed)
    }
}

fn fail(message: impl Into<String>) -> PassError {
    PassError::Failed(message.into())
}

/// The plan an op gets, with the time model's view of it.
pub struct Choice {
    pub plan: Plan,
    pub time: PredictedTime,
}

/// The configurations `options` allow for a group of `p`: every allowed
/// algorithm, each without and (where allowed) with rotation.
fn configurations(p: usize, options: &Options) -> Vec<Config> {
    let grid = || match options.topology.slice.as_slice() {
        &[outer, inner] if (outer * inner) as usize == p && outer >= 2 && inner >= 2 => {
            Some(Algorithm::TwoLevel {
                outer: outer as usize,
                inner: inner as usize,
            })
        }
        _ => None,
    };
    let algorithms: Vec<Algorithm> = match options.algorithm {
        AlgorithmOption::Ring => vec![Algorithm::Ring],
        AlgorithmOption::TwoShot => vec![Algorithm::TwoShot],
        AlgorithmOption::TwoLevel => grid().or_else(|| balanced_grid(p)).into_iter().collect(),
        // Two-level only where the machine is a 2-D slice of the group.
        AlgorithmOption::Auto => [Some(Algorithm::Ring), Some(Algorithm::TwoShot), grid()]
            .into_iter()
            .flatten()
            .collect(),
    };
    // Rotation evens out a block's magnitudes: it helps an integer code,
    // whose step follows the block's largest value, and hurts a float
    // code, which would otherwise hold that largest value exactly.
    let rotations: &[Rotation] = match options.rotation {
        RotationOption::None => &[Rotation::None],
        RotationOption::Hadamard => &[Rotation::Hadamard],
        RotationOption::Auto
            if options.block_size.is_power_of_two()
                && options.quant_format.mantissa_bits().is_none() =>
        {
            &[Rotation::None, Rotation::Hadamard]
        }
        RotationOption::Auto => &[Rotation::None],
    };
    let mut out = Vec::new();
    for &algorithm in &algorithms {
        for &rotation in rotations {
            out.push(Config {
                algorithm,
                rotation,
                block: options.block_size,
                scale_type: options.scale_type,
                format: options.quant_format,
                pipeline_depth: options.pipeline_depth,
                bidirectional: options.bidirectional,
                gather: options.gather,
                form: if options.unroll {
                    Form::Unrolled
                } else {
                    Form::Loop
                },
            });
        }
    }
    out
}

/// How much slower than the same plan unrotated a rotated plan may be for
/// `--rotation auto` to take it, and how close to the fastest algorithm
/// another must come for the choice to go by error instead.
const CHEAP: f64 = 1.05;

/// Picks the plan for candidate `c`, or says why none pays.
///
/// Per op: every configuration the options allow is planned, timed by the
/// cost model and given its predicted error (Gaussian data). With
/// `--rotation auto`, a rotated plan replaces its unrotated twin when it is
/// at most 5 % slower. Among what is left, an error budget drops what it
/// cannot afford; then the fastest plan wins, except that plans within 5 %
/// of it go by predicted error. Without a minimum payload the winner must
/// also beat XLA's all-reduce in the model; with one, it must send fewer
/// bytes.
pub fn choose(c: &Candidate, options: &Options) -> Result<Choice, SkipReason> {
    let elements: usize = c
        .operands
        .iter()
        .filter(|o| o.2)
        .map(|o| shape::element_count(&o.1).unwrap_or(u64::MAX) as usize)
        .fold(0usize, usize::saturating_add);
    let mantissa = c
        .operands
        .iter()
        .filter(|o| o.2)
        .map(|o| mantissa_bits(o.1.element_type))
        .min()
        .unwrap_or(23);
    let p = c.participants.group_size();
    // Rows: a reduce-scatter's or all-to-all's operand is P of them, an
    // all-gather's operand one.
    let row = match c.collective {
        Collective::AllReduce => None,
        Collective::AllGather => Some(elements),
        Collective::ReduceScatter | Collective::AllToAll => Some(elements / p.max(1)),
    };
    let payload = Payload {
        collective: c.collective,
        elements,
        row,
        bytes: c.payload_bytes,
        mantissa_bits: mantissa,
    };
    choose_plan(p, &payload, c.forced, options)
}

/// What a collective moves, as far as the choice cares.
#[derive(Clone, Copy, Debug)]
pub struct Payload {
    pub collective: Collective,
    pub elements: usize,
    /// Elements per row, for the collectives of rows ([`Plan::rows`]).
    pub row: Option<usize>,
    /// Bytes in the operands' own types.
    pub bytes: u64,
    /// Explicit mantissa bits of the narrowest operand type (bf16: 7).
    pub mantissa_bits: u32,
}

/// [`choose`] for a payload over groups of `p`; `forced` waives the
/// requirement that the rewrite pay.
pub fn choose_plan(
    p: usize,
    payload: &Payload,
    forced: bool,
    options: &Options,
) -> Result<Choice, SkipReason> {
    let (elements, mantissa) = (payload.elements, payload.mantissa_bits);
    let elem_bytes = payload.bytes / elements.max(1) as u64;
    // (plan, µs, predicted error %)
    let mut scored: Vec<(Plan, crate::cost::Prediction, f64)> = Vec::new();
    let mut first_error = None;
    let mut configs = configurations(p, options);
    // The gather and the exchange of rows have no reduce algorithm to pick.
    if matches!(
        payload.collective,
        Collective::AllGather | Collective::AllToAll
    ) {
        if let Some(first) = configs.first().map(|c| c.algorithm) {
            configs.retain(|c| c.algorithm == first);
        }
        configs
            .iter_mut()
            .for_each(|c| c.algorithm = Algorithm::Ring);
    }
    for config in configs {
        let planned = match payload.row {
            None => Plan::new(p, elements, &config),
            Some(row) => Plan::rows(payload.collective, p, row, &config),
        };
        match planned {
            Ok(plan) => {
                let time = predict(&options.topology, &plan, payload.bytes, elem_bytes);
                let err = 100.0 * predicted_rel_rms(&plan, mantissa);
                scored.push((plan, time, err));
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if scored.is_empty() {
        // Only an asked-for two-level can leave nothing to plan: a group
        // whose size has no grid.
        let why = first_error.unwrap_or(if p < 2 {
            PlanError::GroupOfOne
        } else {
            PlanError::NoGrid(p)
        });
        return Err(SkipReason::Plan(why));
    }
    if options.rotation == RotationOption::Auto {
        // Per algorithm: is its rotated plan at most 5 % slower?
        let time_of = |a: Algorithm, r: Rotation, scored: &[(Plan, _, f64)]| {
            scored
                .iter()
                .find(|s: &&(Plan, crate::cost::Prediction, f64)| {
                    s.0.config.algorithm == a && s.0.config.rotation == r
                })
                .map(|s| s.1.equarx_us)
        };
        let cheap: Vec<(Algorithm, bool)> = scored
            .iter()
            .map(|s| s.0.config.algorithm)
            .map(|a| {
                let plain = time_of(a, Rotation::None, &scored);
                let rotated = time_of(a, Rotation::Hadamard, &scored);
                let yes = match (plain, rotated) {
                    (Some(p), Some(r)) => r <= CHEAP * p,
                    (None, Some(_)) => true,
                    _ => false,
                };
                (a, yes)
            })
            .collect();
        scored.retain(|s| {
            let rotate = cheap
                .iter()
                .any(|&(a, yes)| a == s.0.config.algorithm && yes);
            (s.0.config.rotation == Rotation::Hadamard) == rotate
        });
    }
    if let Some(budget) = options.max_error_pct {
        let best = scored
            .iter()
            .min_by(|a, b| a.2.total_cmp(&b.2))
            .map(|s| (describe_config(&s.0.config), s.2));
        scored.retain(|s| s.2 <= budget);
        if scored.is_empty() {
            let (best, predicted) = best.unwrap_or_default();
            return Err(SkipReason::OverBudget {
                budget,
                best,
                predicted,
            });
        }
    }
    let fastest = scored
        .iter()
        .map(|s| s.1.equarx_us)
        .fold(f64::INFINITY, f64::min);
    let (plan, prediction, _) = scored
        .into_iter()
        .filter(|s| s.1.equarx_us <= CHEAP * fastest)
        .min_by(|a, b| {
            a.2.total_cmp(&b.2)
                .then(a.1.equarx_us.total_cmp(&b.1.equarx_us))
        })
        .ok_or(SkipReason::Plan(PlanError::GroupOfOne))?;
    let before = baseline_wire_bytes(payload.collective, p, payload.bytes);
    if plan.wire_bytes() >= before && !forced {
        return Err(SkipReason::NoGain {
            before,
            after: plan.wire_bytes(),
        });
    }
    let time = PredictedTime {
        topology: options.topology.name.clone(),
        bf16_us: prediction.bf16_us,
        equarx_us: prediction.equarx_us,
        speedup: prediction.speedup(),
    };
    if options.min_payload_bytes.is_none() && !forced && time.speedup < 1.0 {
        return Err(SkipReason::NotFaster(time));
    }
    Ok(Choice { plan, time })
}

/// The plan the pass chooses for a bf16 all-reduce of `bytes` over `p`
/// ranks on topology `t` (the rewrite forced, so a plan comes back even
/// where it would not pay), and its predicted times: `equarx model`'s rows.
pub fn model_bf16(
    p: usize,
    bytes: u64,
    options: &Options,
    t: &Topology,
) -> Result<(Plan, crate::cost::Prediction), SkipReason> {
    let options = Options {
        topology: t.clone(),
        ..options.clone()
    };
    let payload = Payload {
        collective: Collective::AllReduce,
        elements: (bytes / 2) as usize,
        row: None,
        bytes,
        mantissa_bits: 7,
    };
    let choice = choose_plan(p, &payload, true, &options)?;
    let prediction = predict(t, &choice.plan, bytes, 2);
    Ok((choice.plan, prediction))
}

/// `ring + hadamard`, for messages.
fn describe_config(c: &Config) -> String {
    match c.rotation {
        Rotation::None => c.algorithm.to_string(),
        Rotation::Hadamard => format!("{} + hadamard", c.algorithm),
    }
}

/// The report fields known before deciding.
fn describe(comp: &str, instr: &HloInstructionProto, c: &crate::ir::Computation) -> OpReport {
    let shape = instr.shape.clone().unwrap_or_default();
    let mut types: Vec<String> = instr
        .operand_ids
        .iter()
        .filter_map(|&o| c.get(InstrId(o)).and_then(|o| o.shape.as_ref()))
        .map(|s| shape::type_name(s.element_type).unwrap_or("?").to_string())
        .collect();
    types.dedup();
    let groups = ReplicaGroups::of(instr).ok();
    let payload_bytes = instr
        .operand_ids
        .iter()
        .filter_map(|&o| c.get(InstrId(o)).and_then(|o| o.shape.as_ref()))
        .filter_map(shape::byte_size)
        .fold(0u64, u64::saturating_add);
    OpReport {
        name: instr.name.clone(),
        computation: comp.to_string(),
        opcode: instr.opcode.clone(),
        shape: shape::describe(&shape),
        element_types: types,
        group_size: groups.as_ref().and_then(ReplicaGroups::uniform_size),
        groups: groups.as_ref().map(|g| g.groups.len()),
        mode: GroupMode::of(instr).as_str().to_string(),
        encoding: groups
            .map_or("invalid", |g| g.encoding.as_str())
            .to_string(),
        rewritten: false,
        reason: None,
        payload_bytes,
        wire_bytes_before: None,
        wire_bytes_after: None,
        predicted_rel_rms: None,
        predicted_time: None,
        plan: None,
    }
}

/// The scalar computations the emitted reductions call.
#[derive(Clone, Copy)]
struct Reducers {
    max_f32: CompId,
    or_s32: CompId,
    add_f32: CompId,
}

/// What was emitted for one all-reduce.
struct Rewrite {
    collectives: usize,
    instructions: usize,
    computations: Vec<CompId>,
}

fn fill_rewritten(entry: &mut OpReport, c: &Candidate, plan: &Plan, emitted: &Rewrite) {
    let p = plan.group_size;
    entry.rewritten = true;
    entry.group_size = Some(p);
    entry.groups = Some(c.participants.groups.len());
    entry.payload_bytes = c.payload_bytes;
    entry.wire_bytes_before = Some(baseline_wire_bytes(c.collective, p, c.payload_bytes));
    entry.wire_bytes_after = Some(plan.wire_bytes());
    let mantissa = c
        .operands
        .iter()
        .filter(|o| o.2)
        .map(|o| mantissa_bits(o.1.element_type))
        .min()
        .unwrap_or(23);
    entry.predicted_rel_rms = Some(predicted_rel_rms(plan, mantissa));
    if c.forced {
        entry.reason = Some(format!(
            "forced by {}=\"true\"",
            eligibility::FORCE_ATTRIBUTE
        ));
    }
    entry.plan = Some(PlanSummary {
        config: plan.config.clone(),
        algorithm: plan.algorithm_name(),
        rotation: plan.config.rotation,
        form: plan.repeats().then_some(plan.config.form),
        block_size: plan.block(),
        lanes: plan.lanes.len(),
        padding_elements: plan.padded() - plan.elements,
        quantizations: plan.quantizations(),
        collectives: emitted.collectives,
        collective_steps: plan.collective_steps(),
        instructions: emitted.instructions,
    });
}

fn mantissa_bits(ty: i32) -> u32 {
    match PrimitiveType::try_from(ty) {
        Ok(PrimitiveType::Bf16) => 7,
        Ok(PrimitiveType::F16) => 10,
        _ => 23,
    }
}

/// Metadata for the new instructions: named after the all-reduce, with its
/// source location.
fn metadata_for(instr: &HloInstructionProto) -> OpMetadata {
    // Short on purpose: a rewrite emits ~1000 instructions per all-reduce,
    // and each carries this. The stack frame and source line still lead to
    // the program line that made the all-reduce.
    let source = instr.metadata.clone().unwrap_or_default();
    OpMetadata {
        op_name: format!("equarx[{}]", instr.name),
        source_file: source.source_file,
        source_line: source.source_line,
        stack_frame_id: source.stack_frame_id,
        ..Default::default()
    }
}

/// Emits the quantized ring for the candidate and records, in `edits`, how
/// it replaces the all-reduce (applied for the whole computation at once).
fn rewrite(
    module: &mut Module,
    c: &Candidate,
    plan: &Plan,
    late: bool,
    reducers: Reducers,
    edits: &mut Edits,
    dead_comps: &mut Vec<CompId>,
) -> Result<Rewrite, PassError> {
    let comp = module
        .computation(c.comp)
        .ok_or_else(|| fail("computation vanished"))?;
    let get = |id: InstrId| {
        comp.get(id)
            .cloned()
            .ok_or_else(|| fail("instruction vanished"))
    };
    let instr = get(c.instr)?;
    let done = c.done.map(get).transpose()?;
    let target = c.done.unwrap_or(c.instr);
    let result = done
        .as_ref()
        .unwrap_or(&instr)
        .shape
        .clone()
        .unwrap_or_default();
    let tuple = shape::is_tuple(&result);
    let element_shapes: Vec<ShapeProto> = if tuple {
        result.tuple_shapes.clone()
    } else {
        vec![result.clone()]
    };
    // A tuple result is taken apart by get-tuple-elements, which are
    // forwarded to the parts; the tuple itself is built only if something
    // else uses it.
    let (gtes, other_uses) = if tuple {
        let mut gtes = Vec::new();
        let mut other = comp.root_id() == target;
        for i in comp
            .instructions()
            .iter()
            .filter(|i| i.operand_ids.contains(&target.0))
        {
            if i.opcode == "get-tuple-element" && i.operand_ids.len() == 1 {
                gtes.push((InstrId(i.id), i.tuple_index));
            } else {
                other = true;
            }
        }
        (gtes, other)
    } else {
        (vec![], false)
    };
    let value = |(id, s, _): &(InstrId, ShapeProto, bool)| Value {
        id: *id,
        shape: s.clone(),
    };

    // An f32 operand that is only a widening of bf16 / f16 (XLA:CPU
    // promotes bf16 all-reduces so before its pre-scheduler stage) is read
    // in its narrow type: the chain converts it to f32 where it reads it,
    // with the same values, and the widened copy is never made.
    let mut packed: Vec<Value> = Vec::new();
    for o in c.operands.iter().filter(|o| o.2) {
        match widened_from(module, comp, o.0, c.instr) {
            Some((narrow, convert, wrapped)) => {
                packed.push(narrow);
                edits.remove.insert(convert);
                dead_comps.extend(wrapped);
            }
            None => packed.push(value(o)),
        }
    }
    let mut b = Builder::new(module, c.comp, Some(metadata_for(&instr)));
    let results: Vec<ShapeProto> = c
        .operands
        .iter()
        .zip(&element_shapes)
        .filter(|(o, _)| o.2)
        .map(|(_, s)| s.clone())
        .collect();
    let emitted = emit(
        &mut b,
        &EmitInputs {
            plan,
            participants: &c.participants,
            operands: &packed,
            results: &results,
            max_f32: reducers.max_f32,
            or_s32: reducers.or_s32,
            add_f32: reducers.add_f32,
            async_permutes: c.done.is_some(),
            late,
            dimension: c.dimension,
        },
    );
    let sums = emitted.values;

    // Operands that are not quantized keep a plain all-reduce of their own.
    let rest: Vec<Value> = c.operands.iter().filter(|o| !o.2).map(value).collect();
    let rest_shapes: Vec<ShapeProto> = c
        .operands
        .iter()
        .zip(&element_shapes)
        .filter(|(o, _)| !o.2)
        .map(|(_, s)| s.clone())
        .collect();
    let residual = if rest.is_empty() {
        None
    } else {
        let s = if rest.len() == 1 {
            rest_shapes[0].clone()
        } else {
            shape::tuple(rest_shapes)
        };
        let refs: Vec<&Value> = rest.iter().collect();
        let start = b.clone_with(&instr, &refs, s.clone());
        Some(match &done {
            Some(d) => b.clone_with(d, &[&start], s),
            None => start,
        })
    };
    let mut parts = Vec::new();
    let (mut quantized, mut r) = (sums.iter(), 0i64);
    for o in &c.operands {
        if o.2 {
            parts.push(
                quantized
                    .next()
                    .cloned()
                    .ok_or_else(|| fail("ring returned too few values"))?,
            );
        } else {
            let res = residual
                .as_ref()
                .ok_or_else(|| fail("residual all-reduce missing"))?;
            parts.push(if rest.len() == 1 {
                res.clone()
            } else {
                b.get_tuple_element(res, r)
            });
            r += 1;
        }
    }
    let whole = if !tuple {
        Some(parts[0].clone())
    } else if other_uses {
        Some(b.tuple(&parts))
    } else {
        None
    };
    let mut keep: Vec<InstrId> = parts.iter().map(|p| p.id).collect();
    keep.extend(whole.iter().map(|w| w.id));
    let instrs = b.finish_keeping(&keep).map_err(fail)?;
    let mut stats = Rewrite {
        collectives: 0,
        instructions: instrs.len(),
        computations: emitted.computations,
    };
    for i in instrs.iter().chain(
        stats
            .computations
            .iter()
            .filter_map(|&id| module.computation(id))
            .flat_map(|c| c.instructions()),
    ) {
        stats.collectives += usize::from(is_collective(&i.opcode));
    }
    stats.instructions += stats
        .computations
        .iter()
        .filter_map(|&id| module.computation(id))
        .map(|c| c.instructions().len())
        .sum::<usize>();
    let emitted = instrs;

    edits.insert_before.insert(c.instr, emitted);
    if let Some(whole) = whole {
        edits.replace.insert(target, whole.id);
    }
    for (g, index) in gtes {
        let part = usize::try_from(index).ok().and_then(|i| parts.get(i));
        let part = part.ok_or_else(|| fail("get-tuple-element index out of range"))?;
        edits.replace.insert(g, part.id);
        edits.remove.insert(g);
    }
    edits.remove.insert(c.instr);
    edits.remove.extend(c.done);
    Ok(stats)
}

/// `operand` = convert(x) from bf16 / f16 to f32, or XLA's wrapped form
/// (a kLoop fusion of that one convert), used by `user` alone: x as a
/// value, the convert to drop, and the wrapped computation to drop.
fn widened_from(
    module: &Module,
    comp: &crate::ir::Computation,
    operand: InstrId,
    user: InstrId,
) -> Option<(Value, InstrId, Option<CompId>)> {
    let narrow = |t: i32| t == PrimitiveType::Bf16 as i32 || t == PrimitiveType::F16 as i32;
    let ty = |i: &HloInstructionProto| i.shape.as_ref().map(|s| s.element_type);
    let widening = |from: &HloInstructionProto, to: &HloInstructionProto| {
        from.shape.as_ref().map(|s| &s.dimensions) == to.shape.as_ref().map(|s| &s.dimensions)
            && ty(from).is_some_and(narrow)
            && ty(to) == Some(PrimitiveType::F32 as i32)
    };
    let convert = comp.get(operand)?;
    let source = comp.get(InstrId(*convert.operand_ids.first()?))?;
    let wrapped = match convert.opcode.as_str() {
        "convert" => None,
        "fusion" if convert.fusion_kind == "kLoop" && convert.operand_ids.len() == 1 => {
            let called = CompId(*convert.called_computation_ids.first()?);
            let body = module.computation(called)?;
            let root = body.get(body.root_id())?;
            let param = body.get(InstrId(*root.operand_ids.first()?))?;
            let only_convert = body.instructions().len() == 2
                && root.opcode == "convert"
                && param.opcode == "parameter";
            only_convert.then_some(Some(called))?
        }
        _ => return None,
    };
    if !widening(source, convert)
        || convert.operand_ids.len() != 1
        || comp.root_id() == operand
        || !convert.control_predecessor_ids.is_empty()
        || comp.instructions().iter().any(|i| {
            (i.id != user.0 && i.operand_ids.contains(&operand.0))
                || i.control_predecessor_ids.contains(&operand.0)
        })
    {
        return None;
    }
    // The wrapped computation must be this fusion's alone.
    if let Some(called) = wrapped {
        let callers = module
            .computations()
            .iter()
            .flat_map(|c| c.instructions())
            .filter(|i| i.called_computation_ids.contains(&called.0))
            .count();
        if callers != 1 {
            return None;
        }
    }
    let value = Value {
        id: InstrId(source.id),
        shape: source.shape.clone()?,
    };
    Some((value, operand, wrapped))
}

/// Collectives the emitted HLO holds (an async pair counts once).
fn is_collective(opcode: &str) -> bool {
    matches!(
        opcode,
        "collective-permute" | "collective-permute-start" | "all-gather" | "all-to-all"
    )
}
