//! What the pass says about every collective: what it is ([`describe`], the
//! same rows `equarx analyze` lists), why it stayed (the reason's text, from
//! [`super::skip::SkipReason`]), and what it became ([`OpReport`], with the
//! plan the rewrite carries out).

use super::eligibility::Candidate;
use super::skip::FORCE_ATTRIBUTE;
use crate::cost::PredictedTime;
use crate::ir::groups::{GroupMode, ReplicaGroups};
use crate::ir::{Computation, InstrId, shape};
use crate::numerics::error::{Data, predicted};
use crate::passes::{Platform, Stage};
use crate::plan::{Config, Form, Plan, Rotation, baseline_wire_bytes};
use crate::proto::HloInstructionProto;

/// A collective instruction as it stands: what `equarx analyze` lists, and
/// the first columns of every [`OpReport`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CollectiveOp {
    pub name: String,
    pub computation: String,
    pub opcode: String,
    pub shape: String,
    /// The operands' element types, in order, repeats merged.
    pub element_types: Vec<String>,
    /// Devices per group (for collective-permute: the number of pairs).
    pub group_size: Option<usize>,
    pub groups: Option<usize>,
    pub mode: String,
    /// How the groups are written (`list`, `iota`, `mesh-axes`); `None`
    /// for a collective-permute, or groups that do not read.
    pub encoding: Option<String>,
    pub channel_id: Option<i64>,
    /// Bytes of the operands.
    pub payload_bytes: u64,
}

/// The pass's decision for one collective.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct OpReport {
    #[serde(flatten)]
    pub op: CollectiveOp,
    /// The pipeline stage the module was taken to be at.
    pub stage: Stage,
    /// The XLA backend the rewrite was emitted for.
    pub platform: Platform,
    pub rewritten: bool,
    /// Why it was skipped (or, when rewritten, notes such as a forced op).
    pub reason: Option<String>,
    /// Bytes each device sends for the quantized operands: the collective
    /// done the bandwidth-optimal way in their own type (an all-reduce's
    /// ring: 2·(P−1)/P·payload).
    pub wire_bytes_before: Option<u64>,
    /// Bytes each device sends in the emitted collectives.
    pub wire_bytes_after: Option<u64>,
    /// Predicted relative RMS error against the exact result, on the op's
    /// data as far as it is known (see `prediction`).
    pub predicted_rel_rms: Option<f64>,
    /// What the predictions assumed of the data, in a word.
    pub basis: Option<Basis>,
    /// The same in full: the statistic used, and where it came from (or why
    /// the profile held nothing for the op).
    pub prediction: Option<String>,
    /// The cost model's times (a model, not a measurement).
    pub predicted_time: Option<PredictedTime>,
    pub plan: Option<PlanSummary>,
}

/// What an op's predicted error assumed of its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Basis {
    /// The prior fitted to a real LLM's all-reduce inputs; no profile given.
    Prior,
    /// The op's own inputs, measured by calibration (`--profile`).
    Profile,
    /// The prior, although a profile was given: it holds nothing for this
    /// op or this plan's block size (`prediction` says which).
    PriorUnmatched,
}

impl Basis {
    /// The report table's word for it.
    pub fn word(self) -> &'static str {
        match self {
            Basis::Prior => "prior",
            Basis::Profile => "profile",
            Basis::PriorUnmatched => "prior*",
        }
    }
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

/// How much the emitter and the splice made for one op (the counts its
/// [`PlanSummary`] shows).
pub struct EmittedCounts {
    pub collectives: usize,
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

    /// The entry of an op not decided yet.
    pub fn new(op: CollectiveOp, stage: Stage, platform: Platform) -> Self {
        OpReport {
            op,
            stage,
            platform,
            rewritten: false,
            reason: None,
            wire_bytes_before: None,
            wire_bytes_after: None,
            predicted_rel_rms: None,
            basis: None,
            prediction: None,
            predicted_time: None,
            plan: None,
        }
    }

    /// Fills in what a rewrite of `c` by `plan` did, predicted on `data`.
    pub fn rewritten(&mut self, c: &Candidate, plan: &Plan, emitted: &EmittedCounts, data: Data) {
        let p = plan.group_size;
        self.rewritten = true;
        self.op.group_size = Some(p);
        self.op.groups = Some(c.participants.groups.len());
        self.op.payload_bytes = c.payload_bytes;
        self.wire_bytes_before = Some(baseline_wire_bytes(c.collective, p, c.payload_bytes));
        self.wire_bytes_after = Some(plan.wire_bytes());
        self.predicted_rel_rms = Some(predicted(plan, data, c.mantissa_bits()));
        // What the prediction assumed, now that the plan says which
        // statistic it read; a profile's miss (said already) stays.
        if self.basis != Some(Basis::PriorUnmatched) {
            self.prediction = Some(data.describe_for(plan));
            if matches!(data, Data::Measured(s) if !s.holds(plan)) {
                self.basis = Some(Basis::PriorUnmatched);
            }
        }
        if c.forced {
            self.reason = Some(format!("forced by {FORCE_ATTRIBUTE}=\"true\""));
        }
        self.plan = Some(PlanSummary {
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
}

/// What `instr`, a collective of computation `c`, is.
pub fn describe(c: &Computation, instr: &HloInstructionProto) -> CollectiveOp {
    let operands: Vec<_> = instr
        .operand_ids
        .iter()
        .filter_map(|&o| c.get(InstrId(o)).and_then(|o| o.shape.as_ref()))
        .collect();
    let mut types: Vec<String> = operands
        .iter()
        .map(|s| shape::type_name(s.element_type).unwrap_or("?").to_string())
        .collect();
    types.dedup();
    let permute = instr.opcode.starts_with("collective-permute");
    let groups = if permute {
        None
    } else {
        ReplicaGroups::of(instr).ok()
    };
    CollectiveOp {
        name: instr.name.clone(),
        computation: c.name().to_string(),
        opcode: instr.opcode.clone(),
        shape: instr
            .shape
            .as_ref()
            .map(shape::describe)
            .unwrap_or_default(),
        element_types: types,
        group_size: if permute {
            Some(instr.source_target_pairs.len())
        } else {
            groups.as_ref().and_then(ReplicaGroups::uniform_size)
        },
        groups: groups.as_ref().map(|g| g.groups.len()),
        mode: GroupMode::of(instr).as_str().to_string(),
        encoding: groups.map(|g| g.encoding.as_str().to_string()),
        channel_id: (instr.channel_id > 0).then_some(instr.channel_id),
        payload_bytes: operands
            .iter()
            .filter_map(|s| shape::byte_size(s))
            .fold(0u64, u64::saturating_add),
    }
}
