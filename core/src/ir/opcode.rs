//! The HLO opcodes, from one table: every opcode XLA's `StringToHloOpcode`
//! knows, each with its text, how many operands it takes and its class.
//! Every opcode list in equarx is derived from it (shape inference by
//! class, the collectives that `analyze` lists and the pass examines, what
//! a loop fusion may hold, which attributes the text reader and printer
//! handle, which `-start`/`-done` names are real opcodes rather than
//! XLA's async sugar), and the builder takes an [`Opcode`], so a misspelt
//! opcode does not compile.
//!
//! Instructions keep their opcode as text (`HloInstructionProto::opcode`):
//! a module may hold opcodes this table does not know (a newer XLA's), and
//! those are kept and printed as they are ([`Opcode::of`] is `None` for
//! them).

use crate::proto::HloInstructionProto;

/// How many operands an opcode takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    Exactly(usize),
    /// Any number (tuple, concatenate, collectives of tuples, ...).
    Any,
}

/// What kind of operation an opcode is: shape inference, fusion and the
/// pass's eligibility go by class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Elementwise on one array, the result shaped like it.
    Unary,
    /// Elementwise on two arrays of one shape, the result shaped like them.
    Binary,
    /// Elementwise with a result of another element type (`compare`,
    /// `is-finite`, `convert`, `bitcast-convert`, `reduce-precision`,
    /// `select`, `clamp`).
    Elementwise,
    /// Moves or repeats elements without computing on them (reshape,
    /// broadcast, slices, concatenate, pad, transpose, iota, constant).
    DataMovement,
    /// Reductions and contractions (`reduce`, `dot`).
    Reduction,
    /// Tuples and their elements.
    Tuple,
    /// Communication between devices.
    Collective,
    /// The device's own id.
    DeviceId,
    /// Calls, loops, fusions, parameters: structure.
    Control,
    /// Known to XLA, not modelled by equarx: its shape is taken as
    /// declared, it is never fused into an emitted loop, and only the text
    /// reader and printer look at it (for its name and attributes).
    Unmodelled,
}

macro_rules! opcodes {
    ($($variant:ident = $text:literal, $arity:expr, $class:ident;)+) => {
        /// An HLO opcode equarx knows.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Opcode {
            $($variant),+
        }

        impl Opcode {
            /// Every opcode of the table.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$variant),+];

            /// The opcode's text, as HLO writes it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Opcode::$variant => $text),+
                }
            }

            pub fn arity(self) -> Arity {
                match self {
                    $(Opcode::$variant => $arity),+
                }
            }

            pub fn class(self) -> Class {
                match self {
                    $(Opcode::$variant => Class::$class),+
                }
            }

            /// The opcode written `text`, if equarx knows it.
            pub fn parse(text: &str) -> Option<Opcode> {
                match text {
                    $($text => Some(Opcode::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

use Arity::{Any, Exactly};

opcodes! {
    Abs = "abs", Exactly(1), Unary;
    Negate = "negate", Exactly(1), Unary;
    Exponential = "exponential", Exactly(1), Unary;
    ExponentialMinusOne = "exponential-minus-one", Exactly(1), Unary;
    Log = "log", Exactly(1), Unary;
    LogPlusOne = "log-plus-one", Exactly(1), Unary;
    Sqrt = "sqrt", Exactly(1), Unary;
    Rsqrt = "rsqrt", Exactly(1), Unary;
    Cbrt = "cbrt", Exactly(1), Unary;
    Tanh = "tanh", Exactly(1), Unary;
    Logistic = "logistic", Exactly(1), Unary;
    Floor = "floor", Exactly(1), Unary;
    Ceil = "ceil", Exactly(1), Unary;
    Sign = "sign", Exactly(1), Unary;
    RoundNearestEven = "round-nearest-even", Exactly(1), Unary;
    RoundNearestAfz = "round-nearest-afz", Exactly(1), Unary;
    Not = "not", Exactly(1), Unary;
    Copy = "copy", Exactly(1), Unary;
    Cosine = "cosine", Exactly(1), Unary;
    Sine = "sine", Exactly(1), Unary;
    Tan = "tan", Exactly(1), Unary;
    Popcnt = "popcnt", Exactly(1), Unary;
    CountLeadingZeros = "count-leading-zeros", Exactly(1), Unary;
    Erf = "erf", Exactly(1), Unary;

    Add = "add", Exactly(2), Binary;
    Subtract = "subtract", Exactly(2), Binary;
    Multiply = "multiply", Exactly(2), Binary;
    Divide = "divide", Exactly(2), Binary;
    Maximum = "maximum", Exactly(2), Binary;
    Minimum = "minimum", Exactly(2), Binary;
    Remainder = "remainder", Exactly(2), Binary;
    Power = "power", Exactly(2), Binary;
    And = "and", Exactly(2), Binary;
    Or = "or", Exactly(2), Binary;
    Xor = "xor", Exactly(2), Binary;
    Atan2 = "atan2", Exactly(2), Binary;
    ShiftLeft = "shift-left", Exactly(2), Binary;
    ShiftRightArithmetic = "shift-right-arithmetic", Exactly(2), Binary;
    ShiftRightLogical = "shift-right-logical", Exactly(2), Binary;

    Compare = "compare", Exactly(2), Elementwise;
    IsFinite = "is-finite", Exactly(1), Elementwise;
    Convert = "convert", Exactly(1), Elementwise;
    BitcastConvert = "bitcast-convert", Exactly(1), Elementwise;
    ReducePrecision = "reduce-precision", Exactly(1), Elementwise;
    Select = "select", Exactly(3), Elementwise;
    Clamp = "clamp", Exactly(3), Elementwise;

    Constant = "constant", Exactly(0), DataMovement;
    Iota = "iota", Exactly(0), DataMovement;
    Broadcast = "broadcast", Exactly(1), DataMovement;
    Reshape = "reshape", Exactly(1), DataMovement;
    Bitcast = "bitcast", Exactly(1), DataMovement;
    Transpose = "transpose", Exactly(1), DataMovement;
    Slice = "slice", Exactly(1), DataMovement;
    DynamicSlice = "dynamic-slice", Any, DataMovement;
    DynamicUpdateSlice = "dynamic-update-slice", Any, DataMovement;
    Concatenate = "concatenate", Any, DataMovement;
    Pad = "pad", Exactly(2), DataMovement;

    Reduce = "reduce", Any, Reduction;
    Dot = "dot", Exactly(2), Reduction;

    Tuple = "tuple", Any, Tuple;
    GetTupleElement = "get-tuple-element", Exactly(1), Tuple;

    AllReduce = "all-reduce", Any, Collective;
    AllReduceStart = "all-reduce-start", Any, Collective;
    AllReduceDone = "all-reduce-done", Exactly(1), Collective;
    ReduceScatter = "reduce-scatter", Any, Collective;
    AllGather = "all-gather", Any, Collective;
    AllGatherStart = "all-gather-start", Any, Collective;
    AllGatherDone = "all-gather-done", Exactly(1), Collective;
    AllToAll = "all-to-all", Any, Collective;
    RaggedAllToAll = "ragged-all-to-all", Any, Collective;
    CollectivePermute = "collective-permute", Any, Collective;
    CollectivePermuteStart = "collective-permute-start", Any, Collective;
    CollectivePermuteDone = "collective-permute-done", Exactly(1), Collective;
    CollectiveBroadcast = "collective-broadcast", Any, Collective;

    ReplicaId = "replica-id", Exactly(0), DeviceId;
    PartitionId = "partition-id", Exactly(0), DeviceId;

    Parameter = "parameter", Exactly(0), Control;
    While = "while", Exactly(1), Control;
    Conditional = "conditional", Any, Control;
    Call = "call", Any, Control;
    Fusion = "fusion", Any, Control;
    CustomCall = "custom-call", Any, Control;

    // The rest of XLA's opcodes: named, so the text reader and printer can
    // match on them, but not modelled (see `Class::Unmodelled`).
    Acos = "acos", Any, Unmodelled;
    Acosh = "acosh", Any, Unmodelled;
    AddDependency = "add-dependency", Any, Unmodelled;
    AfterAll = "after-all", Any, Unmodelled;
    Asin = "asin", Any, Unmodelled;
    Asinh = "asinh", Any, Unmodelled;
    AsyncDone = "async-done", Any, Unmodelled;
    AsyncStart = "async-start", Any, Unmodelled;
    AsyncUpdate = "async-update", Any, Unmodelled;
    Atanh = "atanh", Any, Unmodelled;
    BatchNormGrad = "batch-norm-grad", Any, Unmodelled;
    BatchNormInference = "batch-norm-inference", Any, Unmodelled;
    BatchNormTraining = "batch-norm-training", Any, Unmodelled;
    Cholesky = "cholesky", Any, Unmodelled;
    Complex = "complex", Any, Unmodelled;
    Convolution = "convolution", Any, Unmodelled;
    CopyDone = "copy-done", Any, Unmodelled;
    CopyStart = "copy-start", Any, Unmodelled;
    Cosh = "cosh", Any, Unmodelled;
    Domain = "domain", Any, Unmodelled;
    DynamicReshape = "dynamic-reshape", Any, Unmodelled;
    Fft = "fft", Any, Unmodelled;
    Gather = "gather", Any, Unmodelled;
    GetDimensionSize = "get-dimension-size", Any, Unmodelled;
    Imag = "imag", Any, Unmodelled;
    Infeed = "infeed", Any, Unmodelled;
    Map = "map", Any, Unmodelled;
    OptBarrier = "opt-barrier", Any, Unmodelled;
    OptimizationBarrier = "optimization-barrier", Any, Unmodelled;
    Outfeed = "outfeed", Any, Unmodelled;
    RaggedDot = "ragged-dot", Any, Unmodelled;
    Real = "real", Any, Unmodelled;
    Recv = "recv", Any, Unmodelled;
    RecvDone = "recv-done", Any, Unmodelled;
    ReduceWindow = "reduce-window", Any, Unmodelled;
    Reverse = "reverse", Any, Unmodelled;
    Rng = "rng", Any, Unmodelled;
    RngBitGenerator = "rng-bit-generator", Any, Unmodelled;
    RngGetAndUpdateState = "rng-get-and-update-state", Any, Unmodelled;
    Scan = "scan", Any, Unmodelled;
    ScaledDot = "scaled-dot", Any, Unmodelled;
    Scatter = "scatter", Any, Unmodelled;
    SelectAndScatter = "select-and-scatter", Any, Unmodelled;
    Send = "send", Any, Unmodelled;
    SendDone = "send-done", Any, Unmodelled;
    SetDimensionSize = "set-dimension-size", Any, Unmodelled;
    Sinh = "sinh", Any, Unmodelled;
    Sort = "sort", Any, Unmodelled;
    StochasticConvert = "stochastic-convert", Any, Unmodelled;
    Topk = "topk", Any, Unmodelled;
    TriangularSolve = "triangular-solve", Any, Unmodelled;
}

impl Opcode {
    /// The opcode of `instr`, if equarx knows it.
    pub fn of(instr: &HloInstructionProto) -> Option<Opcode> {
        Opcode::parse(&instr.opcode)
    }

    /// Elementwise: every output element depends on the same element of
    /// each operand.
    pub fn is_elementwise(self) -> bool {
        matches!(
            self.class(),
            Class::Unary | Class::Binary | Class::Elementwise
        )
    }

    /// A collective op that `equarx analyze` lists. The `-done` half of an
    /// async pair is listed with its `-start`.
    pub fn is_listed_collective(self) -> bool {
        self.class() == Class::Collective
            && !matches!(
                self,
                Opcode::AllReduceDone | Opcode::AllGatherDone | Opcode::CollectivePermuteDone
            )
    }

    /// Whether the op carries `use_global_device_ids` (so a channel id
    /// without it means cross-replica-and-partition).
    pub fn has_global_device_ids(self) -> bool {
        matches!(
            self,
            Opcode::AllReduce
                | Opcode::AllReduceStart
                | Opcode::AllGather
                | Opcode::AllGatherStart
                | Opcode::ReduceScatter
        )
    }
}

impl std::fmt::Display for Opcode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether `text` is a collective `equarx analyze` lists.
pub fn is_collective(text: &str) -> bool {
    Opcode::parse(text).is_some_and(Opcode::is_listed_collective)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_opcode_reads_back_from_its_text_once() {
        let mut seen = std::collections::BTreeSet::new();
        for &op in Opcode::ALL {
            assert_eq!(Opcode::parse(op.as_str()), Some(op));
            assert!(seen.insert(op.as_str()), "{op} twice");
        }
        assert_eq!(Opcode::parse("all_reduce"), None);
    }
}
