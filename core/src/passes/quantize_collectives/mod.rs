//! `quantize-collectives`: EQuARX. Sum all-reduces, reduce-scatters,
//! all-gathers and all-to-alls become block-wise dynamically quantized
//! transfers (int8, fp8 or int4 codes) with f32 accumulation, so the wire
//! carries about one byte per element instead of two (bf16), or half.
//!
//! ```text
//! before                          after (ring, loop form, one lane per direction)
//!
//! x = bf16[S] ...                 x  = bf16[S] ...
//! y = bf16[S] all-reduce(x),      f  = bf16[P,c/B,B] reshape(pad(x))        (rotated: f32, H·block)
//!     to_apply=add                r  = s32[] rank(partition-id())          table lookup
//! use(y)                          p0 = own part of chunk (r-1) mod P
//!                                 w  = while s < P-1:                      (reduce-scatter)
//!                                 │ m  = s8[nb, B+2] quantize(p)            codes | scale bytes, a row a block
//!                                 │ m' = collective-permute(m), r → r+1
//!                                 │ p  = dequantize(m') + own part of chunk (r-s-2) mod P
//!                                 g  = s8[P·nb, B+2] all-gather(quantize(p))
//!                                 v  = f32[P·c] dequantize(g)              every rank, owner too
//!                                 y' = bf16[S] convert(reshape(slice(v)))
//!                                 use(y')
//! ```
//!
//! The rooms, in the order an op goes through them: [`eligibility`] decides
//! whether it may be rewritten, [`groups`] maps its groups to ids
//! collective-permute can name, [`choose`] picks its [`crate::plan::Plan`]
//! (which the emitter, the time model and the error model all read),
//! [`emit`] writes the plan as HLO, [`splice`] puts that in the op's place,
//! and [`report`] says what happened; [`skip`] holds the reasons an op
//! stays, which every room may give.
//!
//! Why it is sound: every reduce phase sums each chunk over every member of
//! its axis exactly once, and the phases' axes cover the group; the gather
//! gives every rank every chunk; quantization changes values only within
//! the error model of [`crate::numerics`]; all participants dequantize the
//! same codes with the same op, so they agree bit for bit. What it assumes:
//! the module is not scheduled for async collectives other than the pair it
//! rewrites, and the replica/partition counts it was given are true.

pub mod choose;
pub mod eligibility;
pub mod emit;
pub mod groups;
pub mod report;
pub mod skip;
pub mod splice;

use std::borrow::Cow;

use choose::{Choice, DEFAULT_BUDGET_PCT, choose};
use report::{Basis, OpReport, describe};
use skip::SkipReason;
use splice::{Reducers, Site, splice};

use super::{Pass, PassError, Platform, Stage};
use crate::ir::opcode::Opcode;
use crate::ir::{CompId, DeviceCounts, Edits, Module};
use crate::numerics::error::Data;
use crate::numerics::profile::{KeyMaker, OpKey};
use crate::options::Options;
use crate::plan::Rotation;
use crate::proto::HloInstructionProto;

/// The pass's name, and the name it had when it rewrote all-reduces only.
pub const NAME: &str = "quantize-collectives";
pub const OLD_NAME: &str = "quantized-all-reduce";

/// The pass. After it ran, [`QuantizeCollectives::report`] says what it did
/// to every collective it looked at.
pub struct QuantizeCollectives {
    options: Options,
    counts: DeviceCounts,
    stage: Stage,
    platform: Platform,
    report: Vec<OpReport>,
}

impl QuantizeCollectives {
    /// The pass with checked options (`crate::options::validate`), the
    /// module's device counts and its stage in XLA's pipeline; the platform
    /// the options leave to `auto` is resolved here, once.
    pub fn new(options: Options, counts: DeviceCounts, stage: Stage) -> Self {
        let platform = Platform::resolve(options.platform, stage, &options.topology);
        QuantizeCollectives {
            options,
            counts,
            stage,
            platform,
            report: Vec::new(),
        }
    }

    /// The XLA backend the pass emits for.
    pub fn platform(&self) -> Platform {
        self.platform
    }

    pub fn report(&self) -> &[OpReport] {
        &self.report
    }

    pub fn into_report(self) -> Vec<OpReport> {
        self.report
    }
}

impl Pass for QuantizeCollectives {
    fn name(&self) -> &'static str {
        NAME
    }

    fn aliases(&self) -> &'static [&'static str] {
        &[OLD_NAME]
    }

    fn run(&mut self, module: &mut Module) -> Result<bool, PassError> {
        self.report.clear();
        let mut reducers = None;
        let mut keys = KeyMaker::default();
        let comp_ids: Vec<CompId> = module.computations().iter().map(|c| c.id()).collect();
        for comp_id in comp_ids {
            let Some(comp) = module.computation(comp_id) else {
                continue;
            };
            let collectives: Vec<(HloInstructionProto, OpKey)> = comp
                .instructions()
                .iter()
                .filter(|i| Opcode::of(i).and_then(eligibility::rewritable).is_some())
                .map(|i| (i.clone(), keys.key(module, comp, i)))
                .collect();
            let mut edits = Edits::default();
            for (instr, key) in collectives {
                let entry =
                    self.decide(module, comp_id, &instr, &key, &mut reducers, &mut edits)?;
                self.report.push(entry);
            }
            module.apply(comp_id, edits);
        }
        Ok(self.report.iter().any(|r| r.rewritten))
    }
}

impl QuantizeCollectives {
    /// The options the chooser works with at the module's stage. Past a
    /// backend's tiling assignment (XLA:TPU's hook) a rotation's `dot`
    /// would reach TPU lowering bare, which refuses it: `auto` there means
    /// unrotated, and a rotation asked for is a skip that says so. Without
    /// the rotation the defaults' error grows past their budget (on
    /// gemma-3-270m the unrotated plans cost +0.5 to +0.6 % perplexity,
    /// BENCHMARKS.md), so there the budget binds: an op no unrotated plan
    /// keeps within it is left with the budget's reason, unless the options
    /// fix the rotation (`none`) or give a budget of their own.
    fn stage_options(&self) -> Result<Cow<'_, Options>, SkipReason> {
        if self.stage != Stage::Tiled {
            return Ok(Cow::Borrowed(&self.options));
        }
        match self.options.rotation {
            Some(Rotation::Hadamard) => Err(SkipReason::RotationAtTiledStage),
            Some(Rotation::None) => Ok(Cow::Borrowed(&self.options)),
            None => {
                let mut options = self.options.clone();
                options.rotation = Some(Rotation::None);
                if self.budget_binds_here() {
                    options.max_error_pct = Some(DEFAULT_BUDGET_PCT);
                }
                Ok(Cow::Owned(options))
            }
        }
    }

    /// Whether [`Self::stage_options`] made the default budget binding: at
    /// the tiled stage, with neither the rotation nor a budget given.
    fn budget_binds_here(&self) -> bool {
        self.stage == Stage::Tiled
            && self.options.rotation.is_none()
            && self.options.max_error_pct.is_none()
    }

    /// `reason` as the stage explains it: a budget the tiled stage made
    /// binding says so.
    fn at_stage(&self, reason: SkipReason) -> SkipReason {
        match reason {
            SkipReason::OverBudget {
                budget,
                best,
                predicted,
            } if self.budget_binds_here() => SkipReason::UnrotatedOverBudget {
                budget,
                best,
                predicted,
            },
            other => other,
        }
    }

    /// Examines, chooses for and (if it pays) rewrites one collective of
    /// computation `comp_id`; returns its report entry.
    fn decide(
        &self,
        module: &mut Module,
        comp_id: CompId,
        instr: &HloInstructionProto,
        key: &OpKey,
        reducers: &mut Option<Reducers>,
        edits: &mut Edits,
    ) -> Result<OpReport, PassError> {
        let comp = module
            .computation(comp_id)
            .ok_or_else(|| PassError::Failed("computation vanished".into()))?;
        let mut entry = OpReport::new(describe(comp, instr), self.stage, self.platform());
        // What is known of the op's data: its profile entry, or the prior.
        let (data, basis, said) = match self.options.profile.as_ref().map(|p| p.profile.find(key)) {
            Some(Ok(op)) => (
                Data::Measured(&op.stats),
                Basis::Profile,
                Data::Measured(&op.stats).describe(),
            ),
            Some(Err(why)) => (
                Data::Prior,
                Basis::PriorUnmatched,
                format!("{}: {why}", Data::Prior.describe()),
            ),
            None => (Data::Prior, Basis::Prior, Data::Prior.describe()),
        };
        entry.basis = Some(basis);
        entry.prediction = Some(said);
        let decision = self.stage_options().and_then(|options| {
            let c = eligibility::examine(module, comp, instr, &options, &self.counts)?;
            choose(&c, data, &options)
                .map(|choice| (c, choice))
                .map_err(|reason| self.at_stage(reason))
        });
        match decision {
            Err(reason) => {
                if let SkipReason::NotFaster { time, .. } = &reason {
                    entry.predicted_time = Some(time.clone());
                }
                entry.reason = Some(reason.to_string());
            }
            Ok((candidate, Choice { mut plan, time })) => {
                plan.config.wire = self.platform.wire(self.stage, &plan);
                let reducers =
                    *reducers.get_or_insert_with(|| Reducers::add_to(module, self.stage));
                let site = Site {
                    stage: self.stage,
                    platform: self.platform,
                    before_xla: self.options.stage == Some(Stage::PreFusion),
                };
                let spliced = splice(module, &candidate, &plan, site, reducers, edits)?;
                entry.rewritten(&candidate, &plan, &spliced.emitted, data);
                entry.predicted_time = Some(time);
            }
        }
        Ok(entry)
    }
}
