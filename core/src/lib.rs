//! equarx: EQuARX (Efficient Quantized AllReduce in XLA) as an HLO pass.
//!
//! The flow follows the layout of `src/`: [`io`] decodes a module (any XLA
//! container, every field kept) → [`ir`] opens it for editing → [`passes`]
//! rewrite it, with [`verify`] after each → [`io`] / [`text`] write it out.
//! The front doors (CLI, C ABI, cxx bridge, Python) all call [`rewrite`].

pub mod calibrate;
pub mod choice;
pub mod cost;
pub mod ffi;
pub mod io;
pub mod ir;
pub mod numerics;
pub mod options;
pub mod passes;
pub mod plan;
pub mod proto;
pub mod text;
pub mod verify;

pub use ir::DeviceCounts;
pub use options::{FuseMode, Options, RewriteOptions};
pub use passes::Stage;
pub use passes::quantize_collectives::report::OpReport;
pub use plan::{GatherForm, ScaleType};

use passes::outline_fusions::OutlineFusions;
use passes::quantize_collectives::QuantizeCollectives;
use passes::remove_dead_widenings::RemoveDeadWidenings;
use passes::{Pass, PassRun, Pipeline, PipelineError};
use proto::HloModuleProto;

/// The result of [`rewrite`].
#[derive(Clone, Debug)]
pub struct Rewritten {
    pub module: HloModuleProto,
    pub changed: bool,
    /// One entry per collective the pass looked at.
    pub report: Vec<OpReport>,
    pub passes: Vec<PassRun>,
    /// The stage in XLA's pipeline the module was taken to be at (the
    /// `stage` option, or detected).
    pub stage: Stage,
    /// The device counts the module runs with: the module's, with the
    /// options' overrides (what a text output's header names).
    pub counts: DeviceCounts,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid options: {0}")]
    Options(String),
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
}

/// Runs equarx's pass pipeline over `module`, whose device counts (as far as
/// its container says) are `module_counts`.
pub fn rewrite(
    module: HloModuleProto,
    module_counts: DeviceCounts,
    options: &RewriteOptions,
) -> Result<Rewritten, Error> {
    rewrite_with(module, module_counts, options, &mut Pipeline::new())
}

/// [`rewrite`] with a caller-configured pipeline (dumps).
pub fn rewrite_with(
    module: HloModuleProto,
    module_counts: DeviceCounts,
    options: &RewriteOptions,
    pipeline: &mut Pipeline,
) -> Result<Rewritten, Error> {
    options::validate(options).map_err(Error::Options)?;
    let counts = module_counts.overridden_by(options.counts);
    let mut m = ir::Module::from_proto(module);
    let stage = options.pass.stage.unwrap_or_else(|| Stage::detect(&m));
    let mut quantize = QuantizeCollectives::new(options.pass.clone(), counts, stage);
    let mut widenings = RemoveDeadWidenings;
    let mut fusions = OutlineFusions {
        fuse: options.pass.fuse,
        stage,
    };
    for name in &options.disabled_passes {
        pipeline.disable(name);
    }
    let passes = match stage {
        Stage::PreFusion | Stage::Fused => pipeline.run(
            &mut m,
            &mut [&mut quantize as &mut dyn Pass, &mut widenings, &mut fusions],
        )?,
        // Past a backend's tiling assignment the module holds that backend's
        // own forms (XLA:TPU's reshapes that change the element type, its
        // layouts), which equarx's verifier does not know. The pass rewrites
        // nothing there, so it only reports, and the module goes back as
        // XLA gave it: a compile must never fail on what equarx leaves alone.
        Stage::Tiled => {
            let name = quantize.name();
            let disabled = options
                .disabled_passes
                .iter()
                .any(|d| d == name || quantize.aliases().contains(&d.as_str()));
            let changed = !disabled
                && quantize
                    .run(&mut m)
                    .map_err(|error| PipelineError::Pass { pass: name, error })?;
            vec![PassRun {
                pass: name,
                ran: !disabled,
                changed,
            }]
        }
    };
    let changed = passes.iter().any(|p| p.changed);
    Ok(Rewritten {
        module: m.into_proto(),
        changed,
        report: quantize.into_report(),
        passes,
        stage,
        counts,
    })
}
