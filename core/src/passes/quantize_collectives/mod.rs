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

use choose::{Choice, choose};
use report::{Basis, OpReport, describe};
use skip::SkipReason;
use splice::{Reducers, Site, splice};

use super::{Pass, PassError, Platform, Stage, outline_fusions};
use crate::cost::{
    MOSAIC_KERNELS, TILED_WIRE_ROW_BYTES, TPU_HOOK_KERNELS, TRITON_KERNELS, Topology,
};
use crate::ir::opcode::Opcode;
use crate::ir::{CompId, DeviceCounts, Edits, Module};
use crate::numerics::error::Data;
use crate::numerics::profile::{KeyMaker, OpKey};
use crate::options::Options;
use crate::plan::{Algorithm, Kernels, Plan};
use crate::proto::{HloInstructionProto, ShapeProto};

/// The pass's name, and the name it had when it rewrote all-reduces only.
pub const NAME: &str = "quantize-collectives";
pub const OLD_NAME: &str = "quantized-all-reduce";

/// The pass. After it ran, [`QuantizeCollectives::report`] says what it did
/// to every collective it looked at.
pub struct QuantizeCollectives {
    options: Options,
    /// equarx's own kernels and the options whose time model charges them,
    /// where it writes them (XLA:TPU's Mosaic, XLA:GPU's Triton; `kernels`
    /// auto or that kind): see [`QuantizeCollectives::choose_emitted`].
    own: Option<(Kernels, Options)>,
    counts: DeviceCounts,
    stage: Stage,
    platform: Platform,
    report: Vec<OpReport>,
}

/// `topology` as the time model charges a rewrite at `stage`: past XLA:TPU's
/// tiling nothing fuses what the pass emits, so the kernels are those
/// libtpu makes of a rewrite there, and the wire's codes travel in the
/// 128-byte rows of their tiles.
fn charged_at(topology: &Topology, stage: Stage) -> Topology {
    let mut t = topology.clone();
    if stage == Stage::Tiled {
        t.kernels = TPU_HOOK_KERNELS;
        t.wire_row_bytes = TILED_WIRE_ROW_BYTES;
    }
    t
}

/// The kernels equarx writes itself for `platform`'s compiler: Mosaic for
/// XLA:TPU, Triton for XLA:GPU; none for XLA:CPU.
fn own_kernels(platform: Platform) -> Option<Kernels> {
    match platform {
        Platform::Tpu => Some(Kernels::Mosaic),
        Platform::Gpu => Some(Kernels::Triton),
        Platform::Cpu => None,
    }
}

/// The options under which the time model charges equarx's own kernels
/// (`emit/mosaic.rs` on XLA:TPU, `emit/triton.rs` on XLA:GPU): `options`
/// (as [`charged_at`] left them) with two-shot, the one algorithm of the
/// all-reduces and reduce-scatters the kernels write, where the options
/// leave the algorithm to the pass (a forced one stays: it keeps those
/// ops' plans from the kernels, not an all-gather's, which has none), the
/// kernels' counts ([`MOSAIC_KERNELS`], [`TRITON_KERNELS`]) and the codes
/// in unpadded rows. An error says why the kernels are not in play: XLA:CPU,
/// `kernels=hlo` or the other compiler's kind, or options that rule out
/// the plan they take.
fn own_charges(options: &Options, platform: Platform) -> Result<(Kernels, Options), String> {
    let Some(kind) = own_kernels(platform) else {
        return Err(format!(
            "equarx writes kernels of its own for XLA:TPU (mosaic) and XLA:GPU (triton), not \
             for {platform}"
        ));
    };
    match options.kernels {
        Some(Kernels::Hlo) => return Err("kernels=hlo".into()),
        Some(asked) if asked != kind => {
            return Err(format!(
                "{asked} kernels are not {platform}'s (its own are {kind})"
            ));
        }
        _ => {}
    }
    emit::mosaic::takes_options(options)?;
    let mut topology = options.topology_for(platform);
    topology.kernels = match kind {
        Kernels::Triton => TRITON_KERNELS,
        _ => MOSAIC_KERNELS,
    };
    // The kernels' codes are unpadded rows.
    topology.wire_row_bytes = 0;
    Ok((
        kind,
        Options {
            algorithm: Some(options.algorithm.unwrap_or(Algorithm::TwoShot)),
            topology: Some(topology),
            ..options.clone()
        },
    ))
}

/// What the time model charges a rewrite at `stage`, the pass and `equarx
/// model` alike: the platform the options resolve to there, the options
/// charging the HLO emission (`charged_at`) and, where equarx's own
/// kernels are in play, their kind and the options charging them
/// (`own_charges`). Both name their topology: the one given, else the
/// platform's ([`Options::topology_for`]).
pub struct Charges {
    pub platform: Platform,
    pub hlo: Options,
    pub own: Option<(Kernels, Options)>,
}

pub fn charges(options: &Options, stage: Stage) -> Charges {
    let platform = Platform::resolve(options.platform, stage, options.topology.as_ref());
    let hlo = Options {
        topology: Some(charged_at(&options.topology_for(platform), stage)),
        ..options.clone()
    };
    let own = own_charges(&hlo, platform).ok();
    Charges { platform, hlo, own }
}

/// Of the HLO emission's choice and equarx's own kernels' (`kind`, where
/// they take the op), the one predicted faster; when neither pays, the
/// reason quotes the better prediction. The kernels' plan says their kind.
pub fn faster(
    hlo: Result<Choice, SkipReason>,
    kernels: Result<Choice, SkipReason>,
    kind: Kernels,
) -> Result<Choice, SkipReason> {
    let kernels = kernels.map(|mut k| {
        k.plan.config.kernels = kind;
        k
    });
    match (hlo, kernels) {
        (Ok(h), Ok(k)) if h.time.equarx_us < k.time.equarx_us => Ok(h),
        (_, Ok(k)) => Ok(k),
        (Err(h @ SkipReason::NotFaster { .. }), Err(k @ SkipReason::NotFaster { .. })) => {
            let speedup = |r: &SkipReason| match r {
                SkipReason::NotFaster { time, .. } => time.speedup,
                _ => 0.0,
            };
            Err(if speedup(&h) > speedup(&k) { h } else { k })
        }
        (hlo, Err(_)) => hlo,
    }
}

/// Whether equarx's own kernels of `kind` take `plan` on `operands` at
/// `stage` (an all-gather's or reduce-scatter's `dimension`), or why not.
fn own_fits(
    kind: Kernels,
    plan: &Plan,
    operands: &[&ShapeProto],
    stage: Stage,
    dimension: Option<i64>,
) -> Result<(), String> {
    match kind {
        Kernels::Triton => emit::triton::fits(plan, operands, stage, dimension).map(|_| ()),
        _ => emit::mosaic::fits(plan, operands, stage, dimension).map(|_| ()),
    }
}

impl QuantizeCollectives {
    /// The pass with checked options (`crate::options::validate`), the
    /// module's device counts and its stage in XLA's pipeline; the platform
    /// the options leave to `auto` is resolved here, once.
    pub fn new(options: Options, counts: DeviceCounts, stage: Stage) -> Self {
        let Charges {
            platform,
            hlo: options,
            own,
        } = charges(&options, stage);
        QuantizeCollectives {
            options,
            own,
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

    /// [`choose`], the time model charging the kernels that will be
    /// emitted: on XLA:TPU and XLA:GPU, unless `kernels=hlo`, the faster of
    /// the HLO emission's plan and equarx's own kernels' ([`faster`]), the
    /// kernels' only where they take the operand.
    fn choose_emitted(&self, c: &eligibility::Candidate, data: Data) -> Result<Choice, SkipReason> {
        let hlo = choose(c, data, &self.options);
        let Some((kind, options)) = &self.own else {
            return hlo;
        };
        let shapes: Vec<&ShapeProto> = c.quantized().map(|o| &o.shape).collect();
        let kernels = choose(c, data, options).and_then(|k| {
            own_fits(*kind, &k.plan, &shapes, self.stage, c.dimension)
                .map(|_| k)
                .map_err(SkipReason::Unsupported)
        });
        faster(hlo, kernels, *kind)
    }

    /// Why an op rewritten as `plan` by HLO did not get equarx's own
    /// kernels, where the report should say so: always when `kernels`
    /// asked for them; with auto, on XLA:TPU and XLA:GPU, when the plan is
    /// the kernels' own (a two-shot all-reduce or reduce-scatter, an
    /// all-gather) and only the operand kept them out. Returns the kind
    /// and the reason.
    fn why_not_own(&self, c: &eligibility::Candidate, plan: &Plan) -> Option<(Kernels, String)> {
        let asked = self.options.kernels.filter(|k| *k != Kernels::Hlo);
        let Some((kind, _)) = &self.own else {
            // Not in play: say why only to whom asked for them.
            let asked = asked?;
            return own_charges(&self.options, self.platform)
                .err()
                .map(|why| (asked, why));
        };
        let kernels_plan = emit::mosaic::takes_plan(plan).is_ok();
        let shapes: Vec<&ShapeProto> = c.quantized().map(|o| &o.shape).collect();
        let why = match own_fits(*kind, plan, &shapes, self.stage, c.dimension) {
            Err(why) => why,
            Ok(()) => "the time model predicts the HLO emission's plan faster".into(),
        };
        (asked.is_some() || kernels_plan).then_some((*kind, why))
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
        let before = module.computations().len();
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
            let mut changes = Changes::default();
            for (instr, key) in collectives {
                let entry =
                    self.decide(module, comp_id, &instr, &key, &mut reducers, &mut changes)?;
                self.report.push(entry);
            }
            module.apply(comp_id, changes.edits);
            for dead in changes.dead {
                module.remove_computation(dead);
            }
        }
        // Computations added or removed are a change even where no op says
        // it was rewritten (the pipeline verifies only what changed).
        Ok(self.report.iter().any(|r| r.rewritten) || module.computations().len() != before)
    }
}

/// What the rewrites of one computation change: its instructions, and the
/// computations nothing calls once those edits are applied.
#[derive(Default)]
struct Changes {
    edits: Edits,
    dead: Vec<CompId>,
}

/// The smallest block XLA:TPU takes past its tiling assignment, measured
/// with libtpu 0.0.42.1 at its hook: under 8 a rotation's B×B matrix
/// constant fails its layout check (`data_emitter.cc`: the literal is
/// smaller than its tiled allocation; B = 2 and 4), and blocks of 1 abort
/// the process (`lowering_util.cc`, a `[1, 1]` reshaped into a tiled
/// `[1]`); B = 8, 16, 32, 64 and 128 compiled, ring and two-shot, rotated
/// or not, and the case files and random modules compile there
/// (tests/compilers.rs, `scripts/compiler-campaign`).
const MIN_TILED_BLOCK: usize = 8;

impl QuantizeCollectives {
    /// Examines, chooses for and (if it pays) rewrites one collective of
    /// computation `comp_id`; returns its report entry.
    fn decide(
        &self,
        module: &mut Module,
        comp_id: CompId,
        instr: &HloInstructionProto,
        key: &OpKey,
        reducers: &mut Option<Reducers>,
        changes: &mut Changes,
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
        let block = self.options.block_size;
        let decision = if self.stage == Stage::Tiled && block < MIN_TILED_BLOCK {
            Err(SkipReason::SmallBlockAtTiledStage {
                block,
                min: MIN_TILED_BLOCK,
            })
        } else {
            eligibility::examine(module, comp, instr, &self.options, &self.counts)
                .and_then(|c| self.choose_emitted(&c, data).map(|choice| (c, choice)))
        };
        match decision {
            Err(reason) => {
                if let SkipReason::NotFaster { time, .. } = &reason {
                    entry.predicted_time = Some(time.clone());
                }
                entry.reason = Some(reason.to_string());
            }
            Ok((candidate, Choice { mut plan, time })) => {
                plan.config.wire = self.platform.wire(self.stage, &plan);
                let note = (plan.config.kernels == Kernels::Hlo)
                    .then(|| self.why_not_own(&candidate, &plan))
                    .flatten();
                let reducers =
                    *reducers.get_or_insert_with(|| Reducers::add_to(module, self.stage));
                let site = Site {
                    stage: self.stage,
                    platform: self.platform,
                    before_xla: self.options.stage == Some(Stage::PreFusion),
                    outlined: outline_fusions::outlines(self.options.fuse, self.stage),
                };
                let spliced = splice(
                    module,
                    &candidate,
                    &plan,
                    site,
                    reducers,
                    &mut changes.edits,
                )?;
                changes.dead.extend(spliced.dead);
                entry.rewritten(&candidate, &plan, &spliced.emitted, data);
                if let Some((kind, why)) = note {
                    let said = entry
                        .reason
                        .take()
                        .map(|r| format!("{r}; "))
                        .unwrap_or_default();
                    let kind = match kind {
                        Kernels::Triton => "Triton",
                        _ => "Mosaic",
                    };
                    entry.reason = Some(format!("{said}HLO kernels, not {kind}: {why}"));
                }
                entry.predicted_time = Some(time);
            }
        }
        Ok(entry)
    }
}
