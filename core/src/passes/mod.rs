//! The pass manager, in the rustc style: passes are named, pure
//! transformations `&mut Module -> Result<changed>`; the manager owns the
//! cross-cutting work — verify the input, verify after every pass (naming the
//! pass that broke the module), before/after dumps on request, and
//! enabling/disabling passes by name.
//!
//! equarx's pipeline ([`crate::rewrite`]) runs, in order:
//!
//! | pass | what it does |
//! |---|---|
//! | [`quantize_collectives`] | every eligible collective becomes its quantized plan |
//! | [`remove_dead_widenings`] | drops the widening converts the rewrite read past |
//! | [`outline_fusions`] | in a fused module, outlines the emitted chains into loop fusions |
//!
//! The [`Stage`] of the module in XLA's pipeline is an input of the whole
//! pipeline: it decides the forms the rewrite emits and whether the
//! emitted chains are fused.

pub mod outline_fusions;
pub mod quantize_collectives;
pub mod remove_dead_widenings;

use std::collections::BTreeSet;

use crate::cost::Topology;
use crate::ir::Module;
use crate::ir::opcode::Opcode;
use crate::plan::{Phase, Plan, Wire};
use crate::verify::{VerifyError, verify};

/// A module transformation.
pub trait Pass {
    /// Kebab-case name, used to disable the pass and to name dumps.
    fn name(&self) -> &'static str;
    /// Older names the pass answers to (for disabling it).
    fn aliases(&self) -> &'static [&'static str] {
        &[]
    }
    /// Transforms `module`; `Ok(true)` if anything changed.
    fn run(&mut self, module: &mut Module) -> Result<bool, PassError>;
}

crate::choice_enum! {
    /// Where in XLA's pipeline a module is when equarx sees it. The
    /// compilers' pre-scheduler hooks sit at different depths of their
    /// pipelines (jaxlib 0.10.2, libtpu 0.0.42.1, measured from their
    /// dumps): XLA:GPU's runs inside its optimization pipeline, before
    /// fusion ([`Stage::PreFusion`]); XLA:CPU's after fusion
    /// ([`Stage::Fused`]); XLA:TPU's after fusion, tiling assignment, copy
    /// insertion and scheduling ([`Stage::Tiled`]).
    pub enum Stage {
        /// After SPMD partitioning, before XLA's fusion: XLA still fuses,
        /// simplifies and decomposes what the pass emits, and inserts the
        /// copies a loop needs.
        PreFusion = "pre-fusion",
        /// After XLA's fusion (XLA:CPU's pre-scheduler hook; a dump after
        /// optimizations): XLA will not fuse or decompose what the pass
        /// emits any more, so the pass does.
        Fused = "fused",
        /// After a backend gave every shape a tiled layout and a memory
        /// space (XLA:TPU's pre-scheduler hook: `{1,0:T(8,128)(2,1)S(1)}`).
        /// Layout assignment, fusion and copy insertion have run: what the
        /// pass inserts must be what that backend's later passes take there.
        /// Every array it emits carries libtpu's tiles, and its loop
        /// fusions hold only what libtpu's fusion emitter takes there
        /// (elementwise ops over one shape, scalars, a reduce as the root:
        /// `outline-fusions`; a reshape, slice, concatenate or a
        /// broadcast along new dimensions inside one aborts libtpu or is
        /// refused). It emits the rotation's product as the fused convolution
        /// libtpu makes of a dot (a bare `dot` fails TPU lowering), and no
        /// transpose (TPU lowers only layout-changing copies by then); its
        /// vector constants are in libtpu's own layout, its all-to-alls in
        /// the tuple form, and copies bring an operand or result laid out
        /// otherwise than row-major to and from the row-major arrays the
        /// plan works on.
        Tiled = "tiled",
    }
}

impl Stage {
    /// The stage a module shows: tiled if any shape carries tiles or a
    /// memory space, else fused if any computation holds a fusion.
    pub fn detect(module: &Module) -> Stage {
        let instructions = || module.computations().iter().flat_map(|c| c.instructions());
        if instructions().any(|i| i.shape.as_ref().is_some_and(shape_is_tiled)) {
            Stage::Tiled
        } else if instructions().any(|i| Opcode::of(i) == Some(Opcode::Fusion)) {
            Stage::Fused
        } else {
            Stage::PreFusion
        }
    }
}

crate::choice_enum! {
    /// Which XLA backend compiles the rewrite. Where the compilers differ
    /// in what they compile well, the pass emits each its own form of the
    /// same arithmetic (measured in the real compilers, BENCHMARKS.md
    /// "Codes and scales apart on XLA:TPU"): a message is one s8 array of
    /// rows, a block's codes then its scale's bytes, for XLA:CPU (whose
    /// compile time grows with the collectives in a module) and XLA:GPU
    /// (one collective launch a step); XLA:TPU gets the codes and the
    /// scales' bits as two arrays, a collective each, since rows of B + 2
    /// bytes cost it relayout kernels around every collective
    /// ([`Platform::wire`]).
    pub enum Platform {
        /// XLA:CPU.
        Cpu = "cpu",
        /// XLA:GPU.
        Gpu = "gpu",
        /// XLA:TPU (libtpu).
        Tpu = "tpu",
    }
}

impl Platform {
    /// How `plan`'s messages travel when this platform compiles a module at
    /// `stage`: XLA:TPU gets the codes and the scales apart (no
    /// concatenate to send them, no slices to read them), except where an
    /// all-to-all takes the tuple form (XLA:CPU's stage past fusion, which
    /// the CLI can name for a TPU module), whose pieces, P per array, a
    /// second array would double. Past XLA:TPU's tiling assignment the
    /// all-to-all of a tiled array is libtpu's own array form (a scale
    /// array of rank 2 and the untiled fallback still go as tuples).
    pub fn wire(self, stage: Stage, plan: &Plan) -> Wire {
        let tuple_all_to_all = stage == Stage::Fused
            && plan
                .phases
                .iter()
                .any(|p| matches!(p, Phase::Exchange { .. } | Phase::Scatter));
        match self {
            Platform::Tpu if !tuple_all_to_all => Wire::Split,
            Platform::Tpu | Platform::Cpu | Platform::Gpu => Wire::Packed,
        }
    }

    /// Whether a rewrite's results pass through an `opt-barrier` when this
    /// platform compiles a module at `stage`. Only XLA:TPU before its
    /// fusion: a collective's result is a boundary it does not fuse
    /// across, but a rewrite's dequantize is not, and libtpu's reshape
    /// moving carries the `[blocks, B]` view into the program's own ops
    /// after it. Gemma 3 270M's RMSNorm reduces then split at the block
    /// edges and stay unfused: 1194 kernels of the program's own against
    /// 404 unrewritten, 1088 in all with the barrier against 1734 without
    /// (BENCHMARKS.md, "The rewrite's results behind a barrier"). Mosaic
    /// kernels' results need it as much: without it libtpu fused 32 of
    /// Gemma's dequantized results into one fusion that recomputes the
    /// residual stream of every layer (1.30x the original's compile
    /// against 1.19x with it). XLA:GPU
    /// compiled Gemma slower with it (1.23x against 0.95x the original)
    /// and the MLP with one more kernel per op; past fusion there is
    /// nothing left to fence.
    pub fn fences_results(self, stage: Stage) -> bool {
        match self {
            Platform::Tpu => stage == Stage::PreFusion,
            Platform::Cpu | Platform::Gpu => false,
        }
    }

    /// The compiler whose pre-scheduler hook shows a module at `stage`:
    /// XLA:TPU's past its tiling assignment, XLA:CPU's past fusion, and
    /// XLA:GPU's before fusion.
    pub fn at_hook(stage: Stage) -> Platform {
        match stage {
            Stage::Tiled => Platform::Tpu,
            Stage::Fused => Platform::Cpu,
            Stage::PreFusion => Platform::Gpu,
        }
    }

    /// The platform the pass emits for: `given`, or the one the stage
    /// shows (past a tiling assignment XLA:TPU, past fusion XLA:CPU, whose
    /// hook sits there), or else the one of the topology given for the
    /// cost model (a switched fabric is a GPU node; the others, and none
    /// given, are TPU slices).
    pub fn resolve(given: Option<Platform>, stage: Stage, topology: Option<&Topology>) -> Platform {
        match (given, stage) {
            (Some(p), _) => p,
            (None, Stage::Tiled) => Platform::Tpu,
            (None, Stage::Fused) => Platform::Cpu,
            (None, Stage::PreFusion) if topology.is_some_and(Topology::switched) => Platform::Gpu,
            (None, Stage::PreFusion) => Platform::Tpu,
        }
    }
}

/// Whether `shape` or one of its elements has a layout with tiles or a
/// memory space: what only a backend's layout assignment writes.
fn shape_is_tiled(shape: &crate::proto::ShapeProto) -> bool {
    shape
        .layout
        .as_ref()
        .is_some_and(|l| !l.tiles.is_empty() || l.memory_space != 0)
        || shape.tuple_shapes.iter().any(shape_is_tiled)
}

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("{0}")]
    Failed(String),
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("input module is malformed: {0}")]
    InvalidInput(VerifyError),
    #[error("pass {pass} failed: {error}")]
    Pass {
        pass: &'static str,
        error: PassError,
    },
    #[error("pass {pass} produced a malformed module (a bug in equarx, please report it): {error}")]
    BrokeModule {
        pass: &'static str,
        error: VerifyError,
    },
    #[error("dump: {0}")]
    Dump(String),
    #[error("unknown pass {0:?} (known: {1})")]
    UnknownPass(String, String),
}

/// When a dump is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpStage {
    Before,
    After,
}

/// Receives a module before and after each pass that runs.
pub type Dumper<'a> = dyn FnMut(&str, DumpStage, &Module) -> Result<(), String> + 'a;

/// What happened to one pass.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PassRun {
    pub pass: &'static str,
    pub ran: bool,
    pub changed: bool,
}

#[derive(Default)]
pub struct Pipeline<'a> {
    disabled: BTreeSet<String>,
    dumper: Option<Box<Dumper<'a>>>,
}

impl<'a> Pipeline<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Skips the pass called `name` (checked against the passes at run time).
    pub fn disable(&mut self, name: &str) -> &mut Self {
        self.disabled.insert(name.to_string());
        self
    }

    pub fn dump_with(&mut self, dumper: Box<Dumper<'a>>) -> &mut Self {
        self.dumper = Some(dumper);
        self
    }

    /// Verifies `module`, then runs each enabled pass and verifies after each
    /// that changed it.
    pub fn run(
        &mut self,
        module: &mut Module,
        passes: &mut [&mut dyn Pass],
    ) -> Result<Vec<PassRun>, PipelineError> {
        let known: Vec<&str> = passes.iter().map(|p| p.name()).collect();
        let answers = |p: &dyn Pass, d: &str| p.name() == d || p.aliases().contains(&d);
        if let Some(unknown) = self
            .disabled
            .iter()
            .find(|d| !passes.iter().any(|p| answers(&**p, d)))
        {
            return Err(PipelineError::UnknownPass(
                unknown.clone(),
                known.join(", "),
            ));
        }
        verify(module).map_err(PipelineError::InvalidInput)?;
        let mut runs = Vec::new();
        for pass in passes.iter_mut() {
            let name = pass.name();
            if self.disabled.iter().any(|d| answers(&**pass, d)) {
                runs.push(PassRun {
                    pass: name,
                    ran: false,
                    changed: false,
                });
                continue;
            }
            self.dump(name, DumpStage::Before, module)?;
            let changed = pass
                .run(module)
                .map_err(|error| PipelineError::Pass { pass: name, error })?;
            // A pass that changed nothing hands back the module verified
            // before it: verifying it again is the largest part of a
            // rewrite that declines every op (the defaults, often).
            if changed {
                verify(module).map_err(|error| PipelineError::BrokeModule { pass: name, error })?;
            }
            self.dump(name, DumpStage::After, module)?;
            runs.push(PassRun {
                pass: name,
                ran: true,
                changed,
            });
        }
        Ok(runs)
    }

    fn dump(&mut self, pass: &str, stage: DumpStage, module: &Module) -> Result<(), PipelineError> {
        match &mut self.dumper {
            Some(d) => d(pass, stage, module).map_err(PipelineError::Dump),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Algorithm, test_config};

    #[test]
    fn the_platform_is_the_given_one_else_the_stages_else_the_topologys() {
        let (v5e, h100) = (
            Topology::parse("v5e").unwrap(),
            Topology::parse("h100").unwrap(),
        );
        let resolve = |given, stage, t| Platform::resolve(given, stage, t);
        assert_eq!(
            resolve(Some(Platform::Gpu), Stage::Tiled, Some(&v5e)),
            Platform::Gpu
        );
        assert_eq!(resolve(None, Stage::Tiled, Some(&h100)), Platform::Tpu);
        assert_eq!(resolve(None, Stage::Fused, Some(&v5e)), Platform::Cpu);
        assert_eq!(resolve(None, Stage::PreFusion, Some(&v5e)), Platform::Tpu);
        assert_eq!(resolve(None, Stage::PreFusion, None), Platform::Tpu);
        assert_eq!(resolve(None, Stage::PreFusion, Some(&h100)), Platform::Gpu);
    }

    /// A pass that breaks the module is named by the verifier after it; one
    /// that reports no change is taken at its word (not verified again).
    #[test]
    fn the_pipeline_verifies_after_each_pass_that_changed_the_module() {
        struct Breaks(bool);
        impl Pass for Breaks {
            fn name(&self) -> &'static str {
                "breaks"
            }
            fn run(&mut self, module: &mut Module) -> Result<bool, PassError> {
                let mut proto = module.to_proto();
                proto.computations[0].root_id = 999;
                *module = Module::from_proto(proto);
                Ok(self.0)
            }
        }
        let text = "HloModule m\n\nENTRY e {\n  ROOT p = f32[4] parameter(0)\n}\n";
        let fresh = || Module::from_proto(crate::text::parse(text).unwrap().proto);
        let err = Pipeline::new()
            .run(&mut fresh(), &mut [&mut Breaks(true)])
            .unwrap_err();
        assert!(
            matches!(err, PipelineError::BrokeModule { pass: "breaks", .. }),
            "{err}"
        );
        let runs = Pipeline::new()
            .run(&mut fresh(), &mut [&mut Breaks(false)])
            .unwrap();
        assert!(runs[0].ran && !runs[0].changed);
    }

    #[test]
    fn xla_tpu_gets_codes_and_scales_apart_but_where_an_all_to_all_is_a_tuple_past_fusion() {
        let plan = |a| Plan::new(8, 1 << 16, &test_config(a)).unwrap();
        let (ring, two_shot) = (plan(Algorithm::Ring), plan(Algorithm::TwoShot));
        for stage in [Stage::PreFusion, Stage::Fused, Stage::Tiled] {
            for p in [&ring, &two_shot] {
                assert_eq!(Platform::Cpu.wire(stage, p), Wire::Packed);
                assert_eq!(Platform::Gpu.wire(stage, p), Wire::Packed);
            }
        }
        assert_eq!(Platform::Tpu.wire(Stage::PreFusion, &ring), Wire::Split);
        assert_eq!(Platform::Tpu.wire(Stage::PreFusion, &two_shot), Wire::Split);
        assert_eq!(Platform::Tpu.wire(Stage::Tiled, &ring), Wire::Split);
        assert_eq!(Platform::Tpu.wire(Stage::Tiled, &two_shot), Wire::Split);
        assert_eq!(Platform::Tpu.wire(Stage::Fused, &ring), Wire::Split);
        assert_eq!(Platform::Tpu.wire(Stage::Fused, &two_shot), Wire::Packed);
    }
}
