//! equarx: EQuARX (Efficient Quantized AllReduce in XLA) as an HLO pass.
//!
//! The flow follows the layout of `src/`: [`io`] decodes a module (any XLA
//! container, every field kept) → [`ir`] opens it for editing → [`passes`]
//! rewrite it, with [`verify`] after each → [`io`] / [`text`] write it out.
//! The front doors (CLI, C ABI, cxx bridge, Python) all call [`rewrite`].

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
pub use passes::quantized_all_reduce::{
    AlgorithmOption, FuseMode, GatherForm, OpReport, Options, RotationOption, ScaleType,
};

use passes::quantized_all_reduce::QuantizedAllReduce;
use passes::{Pass, PassRun, Pipeline, PipelineError};
use proto::HloModuleProto;

/// Everything [`rewrite`] needs besides the module. The doors build it
/// from [`options::OPTIONS`], the one list of options.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RewriteOptions {
    pub pass: Options,
    /// Replica / partition counts; a set value overrides what the module says.
    pub counts: DeviceCounts,
    /// Pass names to skip.
    pub disabled_passes: Vec<String>,
}

impl RewriteOptions {
    /// The pass's own checks plus the device counts.
    pub fn validate(&self) -> Result<(), String> {
        self.pass.validate()?;
        for (name, v) in [
            ("replica_count", self.counts.replica_count),
            ("num_partitions", self.counts.num_partitions),
        ] {
            if v.is_some_and(|v| v < 1) {
                return Err(format!("{name} must be at least 1, is {}", v.unwrap_or(0)));
            }
        }
        Ok(())
    }
}

/// The result of [`rewrite`].
#[derive(Clone, Debug)]
pub struct Rewritten {
    pub module: HloModuleProto,
    pub changed: bool,
    /// One entry per all-reduce of the module.
    pub report: Vec<OpReport>,
    pub passes: Vec<PassRun>,
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
    let counts = module_counts.overridden_by(options.counts);
    let mut pass = QuantizedAllReduce::new(options.pass.clone(), counts).map_err(Error::Options)?;
    for name in &options.disabled_passes {
        pipeline.disable(name);
    }
    let mut m = ir::Module::from_proto(module);
    let passes = pipeline.run(&mut m, &mut [&mut pass as &mut dyn Pass])?;
    let changed = passes.iter().any(|p| p.changed);
    Ok(Rewritten {
        module: m.into_proto(),
        changed,
        report: pass.into_report(),
        passes,
        counts,
    })
}
