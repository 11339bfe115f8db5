//! Why a collective stays as it is: every reason a room of the pass gives
//! ([`SkipReason`]: eligibility, groups, the choice of a plan), and the
//! frontend attribute by which a program forces a rewrite or opts out
//! ([`FORCE_ATTRIBUTE`]). The rooms depend on this file, and it on none of
//! them.

use crate::cost::PredictedTime;
use crate::plan::PlanError;

/// Frontend attribute that forces the rewrite on (`"true"`) or off
/// (`"false"`) for one collective.
pub const FORCE_ATTRIBUTE: &str = "equarx.quantize";

/// Why a collective was left as it is.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SkipReason {
    #[error("not a collective equarx rewrites")]
    NotRewritable,
    #[error("it has no operands")]
    NoOperands,
    #[error("operand {0} is not in its computation")]
    MissingOperand(i64),
    #[error("operand {0} is a tuple (equarx quantizes arrays)")]
    TupleOperand(i64),
    #[error("not supported: {0}")]
    Unsupported(String),
    #[error("reduction is not a sum: {0}")]
    NotSum(String),
    #[error("opted out by frontend attribute {FORCE_ATTRIBUTE}=\"false\"")]
    OptedOut,
    #[error("bad frontend attribute: {0}")]
    BadAttribute(String),
    #[error("inside a fusion computation")]
    InFusion,
    #[error(
        "blocks of {block} past a backend's tiling assignment (XLA:TPU's pre-scheduler hook): \
         libtpu takes blocks of {min} or more there (under that a rotation's matrix fails its \
         layout check, and blocks of 1 abort the compile); use --block-size {min} or more, or \
         rewrite the program before XLA (equarx.jax.rewrite_lowered)"
    )]
    SmallBlockAtTiledStage { block: usize, min: usize },
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
    #[error("element type {0} cannot be quantized")]
    NotQuantizable(String),
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
        "padded to whole blocks, the quantized {collective} ({plan}) sends {after} bytes, \
         not fewer than {before}"
    )]
    NoGain {
        /// The collective's opcode.
        collective: &'static str,
        /// The plan's algorithm, as the report names it.
        plan: String,
        before: u64,
        after: u64,
    },
    #[error(
        "the cost model predicts no gain on {}: {:.2}x ({collective} in its own type {:.1} us, \
         equarx {plan} {:.1} us{padded}; a model, see --topology, or force with --min-payload)",
        .time.topology, .time.speedup, .time.baseline_us, .time.equarx_us,
        padded = if *.padded { ", its codes padded to 128-byte rows past XLA:TPU's tiling: about the original's bytes" } else { "" }
    )]
    NotFaster {
        time: PredictedTime,
        /// The collective's opcode.
        collective: &'static str,
        /// The plan's algorithm, as the report names it.
        plan: String,
        /// Whether the wire's codes travel padded to their tiles' rows
        /// ([`crate::cost::Topology::wire_row_bytes`]).
        padded: bool,
    },
    #[error("{0}")]
    Plan(#[from] PlanError),
    #[error(
        "no configuration meets the error budget of {budget}% (the most exact, {best}, predicts {predicted:.2}%)"
    )]
    OverBudget {
        budget: f64,
        best: String,
        predicted: f64,
    },
    #[error(
        "declined: the most exact configuration, {best}, predicts {predicted:.1}% per op, more than \
         the {limit}% that keeps a model (give --max-error, or fix both --algorithm and --rotation, to take it anyway)"
    )]
    BreaksModel {
        limit: f64,
        best: String,
        predicted: f64,
    },
}
