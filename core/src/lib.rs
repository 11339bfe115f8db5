//! equarx: EQuARX (Efficient Quantized AllReduce in XLA) as an HLO pass.
//!
//! The flow follows the layout of `src/`: [`io`] decodes a module (any XLA
//! container, every field kept) → [`ir`] opens it for editing → [`passes`]
//! rewrite it, with [`verify`] after each → [`io`] / [`text`] write it out.
//! The front doors (CLI, C ABI, cxx bridge, Python) all call [`rewrite`].
//! To snapshot-test a rewrite, [`Rewritten::canonical_text`] gives its
//! canonical HLO text, the text the suite's own snapshots hold
//! (`docs/snapshots.md`).

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
pub use passes::quantize_collectives::report::OpReport;
pub use passes::{Platform, Stage};
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
    /// The XLA backend the rewrite was emitted for (the `platform` option,
    /// or resolved from the stage and the topology).
    pub platform: Platform,
    /// The device counts the module runs with: the module's, with the
    /// options' overrides (what a text output's header names).
    pub counts: DeviceCounts,
}

impl Rewritten {
    /// The rewritten module as canonical HLO text: what
    /// [`text::print_module`] prints under [`Rewritten::counts`], with every
    /// instruction renamed `base.N`, N counting up in print order per base
    /// (`add.12` → `add.0`), so that a change elsewhere in the module that
    /// shifts ids does not churn the text. XLA's parser reads it back.
    ///
    /// This is the text to snapshot-test a rewrite with. The suite's own
    /// snapshots (`tests/cases/snapshots/`) are this text, and
    /// `tests/user_snapshot.rs` is the recipe with
    /// [insta](https://insta.rs) (`docs/snapshots.md`):
    ///
    /// ```
    /// let module = equarx::text::parse(
    ///     "HloModule m, num_partitions=8
    ///
    ///      %sum (a: bf16[], b: bf16[]) -> bf16[] {
    ///        %a = bf16[] parameter(0)
    ///        %b = bf16[] parameter(1)
    ///        ROOT %add = bf16[] add(%a, %b)
    ///      }
    ///
    ///      ENTRY %main (x: bf16[8,128]) -> bf16[8,128] {
    ///        %x = bf16[8,128]{1,0} parameter(0)
    ///        ROOT %psum = bf16[8,128]{1,0} all-reduce(%x), channel_id=1,
    ///          replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%sum
    ///      }",
    /// )?;
    /// let options = equarx::options::from_json(r#"{"min_payload_bytes": 0}"#)?;
    /// let rewritten = equarx::rewrite(module.proto, module.counts, &options)?;
    /// let text = rewritten.canonical_text()?;
    /// assert!(text.contains("s8["), "the all-reduce moves int8 codes");
    /// // In a test: insta::assert_snapshot!(text);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn canonical_text(&self) -> Result<String, text::PrintError> {
        text::print_module_with(
            &self.module,
            &self.counts,
            text::PrintOptions {
                canonical_names: true,
            },
        )
    }
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
    let mut pass = options.pass.clone();
    if options.at_hook {
        pass.platform = pass.platform.or(Some(Platform::at_hook(stage)));
    }
    let mut quantize = QuantizeCollectives::new(pass, counts, stage);
    let platform = quantize.platform();
    let mut widenings = RemoveDeadWidenings;
    let mut fusions = OutlineFusions {
        fuse: options.pass.fuse,
        stage,
        platform,
        tasks: match (platform, stage) {
            (Platform::Cpu, Stage::Fused) => passes::outline_fusions::module_tasks(&m),
            _ => 1,
        },
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
        // layouts), which equarx's verifier does not know: the quantize pass
        // and the fusions libtpu's emitter takes there run unverified,
        // emitting what that stage takes (see `Stage::Tiled`); the
        // compilers' own verifiers and the suite's real compiles
        // (tests/compilers.rs) judge it.
        Stage::Tiled => {
            let mut runs = Vec::with_capacity(2);
            for pass in [&mut quantize as &mut dyn Pass, &mut fusions] {
                let name = pass.name();
                let disabled = options
                    .disabled_passes
                    .iter()
                    .any(|d| d == name || pass.aliases().contains(&d.as_str()));
                let changed = !disabled
                    && pass
                        .run(&mut m)
                        .map_err(|error| PipelineError::Pass { pass: name, error })?;
                runs.push(PassRun {
                    pass: name,
                    ran: !disabled,
                    changed,
                });
            }
            runs
        }
    };

    let changed = passes.iter().any(|p| p.changed);
    Ok(Rewritten {
        module: m.into_proto(),
        changed,
        report: quantize.into_report(),
        passes,
        stage,
        platform,
        counts,
    })
}
