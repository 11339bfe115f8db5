//! `quantized-all-reduce`: EQuARX. Sum all-reduces become a ring of int8
//! collective-permutes with block-wise dynamic quantization, so the wire
//! carries about one byte per element instead of two (bf16).
//!
//! ```text
//! before                                after (one lane, P ranks)
//!
//! x = bf16[S] ...                       x  = bf16[S] ...
//! y = bf16[S] all-reduce(x),            f  = f32[P,L,c/L] reshape(pad(convert(x)))
//!     to_apply=add                      r  = s32[] rank(partition-id())       table lookup
//! use(y)                                p0 = own part of chunk (r-1) mod P
//!                                       ┌ repeat P-1 times (reduce-scatter):
//!                                       │ m  = s8[c/L + 4·c/L/B] quantize(p)   codes ++ scales
//!                                       │ m' = collective-permute(m), r → r+1
//!                                       │ p  = dequantize(m') + own part of next chunk
//!                                       └
//!                                       g  = s8[P, msg] all-gather(quantize(p))
//!                                       v  = f32[P·c] dequantize(g)           every rank, owner too
//!                                       y' = bf16[S] convert(reshape(slice(v)))
//!                                       use(y')
//! ```
//!
//! `L` lanes (the pipeline depth D, twice that for a bidirectional ring) are
//! independent chains over sub-chunks, so the scheduler can overlap one
//! lane's transfer with another's quantize and add.
//!
//! Why it is sound: a ring reduce-scatter followed by an all-gather computes
//! the sum of every group member's contribution for every element (each
//! chunk visits every rank once); quantization changes values only within
//! the error model of [`crate::numerics`]; all participants dequantize the
//! same codes with the same op, so they agree bit for bit. What it assumes:
//! the module is not scheduled for async collectives other than the pair it
//! rewrites, and the replica/partition counts it was given are true.
//!
//! Pieces: [`eligibility`] decides, [`groups`] maps groups to ids
//! collective-permute can name, [`plan`] sizes the ring, [`emit`] writes the
//! HLO.

pub mod eligibility;
pub mod emit;
pub mod fuse;
pub mod groups;
pub mod plan;

use rustc_hash::FxHashMap as HashMap;

use eligibility::Candidate;
use emit::{RingInputs, emit_ring};
use plan::{RingPlan, ring_wire_bytes};

use super::{Pass, PassError};
use crate::cost::{Topology, predict};
use crate::io::DeviceCounts;
use crate::ir::builder::{Builder, Value};
use crate::ir::groups::{GroupMode, ReplicaGroups};
use crate::ir::{CompId, Edits, InstrId, Module, shape};
pub use crate::numerics::ScaleType;
use crate::numerics::error::predicted_rel_rms;
use crate::proto::{HloInstructionProto, OpMetadata, PrimitiveType, ShapeProto};

/// How the reduced chunks reach every rank.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum GatherForm {
    /// One `all-gather` per lane (the backend picks its algorithm).
    AllGather,
    /// P−1 `collective-permute` hops per lane round the same ring.
    Permute,
}

/// Whether the emitted ops are outlined into loop fusions.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum FuseMode {
    /// When the module already holds fusions (the compiler's fusion pass
    /// has run, as at XLA's pre-scheduler hook); not before.
    #[default]
    Auto,
    /// Always: for a pass position after fusion in a module without any.
    On,
    /// Never: leave fusion to the compiler.
    Off,
}

/// The pass's options.
///
/// Defaults, from `equarx simulate` (65 536 bf16 elements per device, P = 8;
/// numbers in BENCHMARKS.md): B = 64 with bf16 scales sends the same bytes
/// as B = 128 with f32 scales (1.94x fewer than a bf16 ring) and errs less:
/// 1.28 % instead of 1.38 % relative RMS on Gaussian data and 3.7 % instead
/// of 4.8 % on LLM-like activations whose outlier channels are 100x the rest
/// (a large block lets one outlier flatten its neighbours). D = 2 lanes per
/// direction give the scheduler a second chain to overlap. The ring is
/// bidirectional: on a torus, and against an XLA all-reduce that uses both
/// directions of its links, a one-way ring has half the bandwidth and never
/// pays (`equarx model`). Which all-reduces are worth it is the cost model's
/// call ([`crate::cost`], TPU v5e unless told otherwise); a minimum payload
/// replaces the model when given.
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
    pub gather: GatherForm,
    /// Outline the quantize / dequantize chains into loop fusions.
    pub fuse: FuseMode,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            block_size: 64,
            pipeline_depth: 2,
            bidirectional: true,
            min_payload_bytes: None,
            topology: Topology::parse(DEFAULT_TOPOLOGY).unwrap_or_else(|e| unreachable!("{e}")),
            element_types: vec![PrimitiveType::Bf16],
            scale_type: ScaleType::Bf16,
            gather: GatherForm::AllGather,
            fuse: FuseMode::Auto,
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
    #[error("not an all-reduce")]
    NotAllReduce,
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
    #[error("all-reduce-start without a single all-reduce-done user")]
    AsyncShape,
    #[error("dynamic shapes")]
    DynamicShape,
    #[error("element type {0} is not floating point (integer sums must stay exact)")]
    NotFloat(String),
    #[error("element type {0} is not enabled (see --types)")]
    TypeNotEnabled(String),
    #[error("groups have different sizes")]
    UnevenGroups,
    #[error("group size 1: nothing to reduce")]
    GroupOfOne,
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
    #[error("payload too large to index with s32")]
    TooLarge,
    #[error(
        "the ring would emit {hops} collective hops (lanes × 2·(P−1)), more than the limit of {limit}"
    )]
    TooManyHops { hops: u64, limit: u64 },
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

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PlanSummary {
    pub block_size: usize,
    pub lanes: usize,
    pub padding_elements: usize,
    pub collective_permutes: usize,
    pub all_gathers: usize,
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
        let fuse = match self.options.fuse {
            FuseMode::On => true,
            FuseMode::Off => false,
            FuseMode::Auto => module
                .computations()
                .iter()
                .any(|c| c.instructions().iter().any(|i| i.opcode == "fusion")),
        };
        let mut dead_comps: Vec<CompId> = Vec::new();
        for comp_id in comp_ids {
            let Some(comp) = module.computation(comp_id) else {
                continue;
            };
            let mut edits = Edits::default();
            let all_reduces: Vec<HloInstructionProto> = comp
                .instructions()
                .iter()
                .filter(|i| i.opcode == "all-reduce" || i.opcode == "all-reduce-start")
                .cloned()
                .collect();
            for instr in all_reduces {
                let comp = module
                    .computation(comp_id)
                    .ok_or_else(|| fail("computation vanished"))?;
                let mut entry = describe(comp.name(), &instr, comp);
                let decision =
                    eligibility::examine(module, comp, &instr, &self.options, &self.counts)
                        .and_then(|c| plan_for(&c, &self.options).map(|p| (c, p)));
                match decision {
                    Err(reason) => {
                        if let SkipReason::NotFaster(time) = &reason {
                            entry.predicted_time = Some(time.clone());
                        }
                        entry.reason = Some(reason.to_string());
                        self.report.push(entry);
                    }
                    Ok((candidate, (plan, time))) => {
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
                        });
                        let emitted = rewrite(
                            module,
                            &candidate,
                            &plan,
                            &self.options,
                            reducers,
                            &mut edits,
                            &mut dead_comps,
                        )?;
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

/// The ring plan, or why the ring would not pay: with a minimum payload,
/// the bytes must shrink; without one, the cost model must predict a gain.
fn plan_for(c: &Candidate, options: &Options) -> Result<(RingPlan, PredictedTime), SkipReason> {
    let elements: usize = c
        .operands
        .iter()
        .filter(|o| o.2)
        .map(|o| shape::element_count(&o.1).unwrap_or(u64::MAX) as usize)
        .fold(0usize, usize::saturating_add);
    let plan = RingPlan::new(c.participants.group_size(), elements, options)?;
    let before = ring_wire_bytes(plan.group_size, c.payload_bytes);
    if plan.wire_bytes() >= before && !c.forced {
        return Err(SkipReason::NoGain {
            before,
            after: plan.wire_bytes(),
        });
    }
    let elem_bytes = c.payload_bytes / elements.max(1) as u64;
    let prediction = predict(
        &options.topology,
        &plan,
        c.payload_bytes,
        elem_bytes,
        options.bidirectional,
    );
    let time = PredictedTime {
        topology: options.topology.name.clone(),
        bf16_us: prediction.bf16_us,
        equarx_us: prediction.equarx_us,
        speedup: prediction.speedup(),
    };
    if options.min_payload_bytes.is_none() && !c.forced && time.speedup < 1.0 {
        return Err(SkipReason::NotFaster(time));
    }
    Ok((plan, time))
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

/// The scalar computations the ring's reductions call.
#[derive(Clone, Copy)]
struct Reducers {
    max_f32: CompId,
    or_s32: CompId,
}

/// What was emitted for one all-reduce, counted from the instructions.
struct Emitted {
    wire_bytes: u64,
    collective_permutes: usize,
    all_gathers: usize,
}

fn fill_rewritten(entry: &mut OpReport, c: &Candidate, plan: &RingPlan, emitted: &Emitted) {
    let p = plan.group_size;
    entry.rewritten = true;
    entry.group_size = Some(p);
    entry.groups = Some(c.participants.groups.len());
    entry.payload_bytes = c.payload_bytes;
    entry.wire_bytes_before = Some(ring_wire_bytes(p, c.payload_bytes));
    entry.wire_bytes_after = Some(emitted.wire_bytes);
    let mantissa = c
        .operands
        .iter()
        .filter(|o| o.2)
        .map(|o| mantissa_bits(o.1.element_type))
        .min()
        .unwrap_or(23);
    entry.predicted_rel_rms = Some(predicted_rel_rms(p, plan.block, mantissa));
    if c.forced {
        entry.reason = Some(format!(
            "forced by {}=\"true\"",
            eligibility::FORCE_ATTRIBUTE
        ));
    }
    entry.plan = Some(PlanSummary {
        block_size: plan.block,
        lanes: plan.lanes.len(),
        padding_elements: plan.padded() - plan.elements,
        collective_permutes: emitted.collective_permutes,
        all_gathers: emitted.all_gathers,
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
    plan: &RingPlan,
    options: &Options,
    reducers: Reducers,
    edits: &mut Edits,
    dead_comps: &mut Vec<CompId>,
) -> Result<Emitted, PassError> {
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
    let sums = emit_ring(
        &mut b,
        &RingInputs {
            plan,
            participants: &c.participants,
            operands: &packed,
            results: &results,
            max_f32: reducers.max_f32,
            or_s32: reducers.or_s32,
            gather: options.gather,
            async_permutes: c.done.is_some(),
        },
    );

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
    let emitted = b.finish().map_err(fail)?;
    let stats = count_emitted(&emitted, plan.group_size);

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

/// Bytes each device sends in the emitted collectives, counted from them.
fn count_emitted(emitted: &[HloInstructionProto], group_size: usize) -> Emitted {
    let shapes: HashMap<i64, &ShapeProto> = emitted
        .iter()
        .filter_map(|i| i.shape.as_ref().map(|s| (i.id, s)))
        .collect();
    let operand_bytes = |i: &HloInstructionProto| {
        i.operand_ids
            .first()
            .and_then(|o| shapes.get(o))
            .and_then(|s| shape::byte_size(s))
            .unwrap_or(0)
    };
    let mut e = Emitted {
        wire_bytes: 0,
        collective_permutes: 0,
        all_gathers: 0,
    };
    for i in emitted {
        match i.opcode.as_str() {
            "collective-permute" | "collective-permute-start" => {
                e.collective_permutes += 1;
                e.wire_bytes += operand_bytes(i);
            }
            "all-gather" => {
                e.all_gathers += 1;
                e.wire_bytes += (group_size as u64 - 1) * operand_bytes(i);
            }
            _ => {}
        }
    }
    e
}
