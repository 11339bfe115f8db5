//! The plan of one quantized collective (all-reduce, reduce-scatter,
//! all-gather, all-to-all): who sends what to whom, in what order, how
//! often each value is quantized, and the message layout.
//!
//! A plan is decided before any HLO is emitted, and four readers take
//! their numbers from it and from nothing else:
//!
//! | reader | reads |
//! |---|---|
//! | the emitter (`passes/quantize_collectives/emit/`) | phases, lanes, messages, form |
//! | the time model ([`crate::cost`]) | wire bytes and steps per phase, the work per element |
//! | the error model ([`crate::numerics::error`]) | how often a value is quantized, and with how many contributions |
//! | the simulator ([`crate::numerics::simulate`]) | the same phases, run on numbers |
//!
//! **Data layout.** The flattened payload (`n` elements) is zero-padded to
//! `P·c`, with the per-rank chunk `c` a multiple of the block size `B` (the
//! padding is below `P·B` elements), and seen as `[P chunks, c]`. Rank `t`
//! ends up owning chunk `t`, fully reduced. A group of `P = P1·P2` ranks can
//! also be seen as a grid: rank `r = i·P2 + j` has coordinate `i` on the
//! outer axis and `j` on the inner one, and the payload as `[P1, P2, c]`.
//!
//! **Phases.** An algorithm is a list of phases. Each reduce phase runs over
//! one axis: it splits what the device holds by that axis's coordinate and
//! leaves every device with its own slice, summed over the axis. After the
//! last one the device holds chunk `r`, and a gather phase gives every chunk
//! to everybody:
//!
//! | algorithm | phases | requantizations of a partial sum |
//! |---|---|---|
//! | ring | ring(P), gather | P |
//! | two-shot | exchange(P), gather | 2 |
//! | two-level | ring(P2), ring(P1), gather | (P1−1)+(P2−1)+1 |
//!
//! **Lanes.** A lane is an independent chain of ops over one contiguous
//! sub-chunk of every chunk: `D` lanes per direction, twice that with a
//! bidirectional ring (the second half of the lanes travels the other way).
//! Lanes hold whole blocks, so blocks never straddle lanes or chunks; a
//! ring's chunk is padded to a whole number of blocks per lane, so its
//! lanes are one size (a hop's per-shape constants serve every lane).
//! Ring phases run one chain per lane; the exchange and the gather move a
//! whole chunk.
//!
//! **Messages.** One message per hop: the s8 codes followed by the scales,
//! bit-cast to s8 (`len + (len/B)·scale_bytes` bytes).
//!
//! **Rotation.** An orthonormal Hadamard transform of every block, applied
//! once to each device's input and undone once after the gather; every
//! phase in between runs in the rotated domain (the sum commutes with it).

use std::fmt;

/// Most collective hops (chains × steps) one rewrite may run: a group of
/// thousands of devices would otherwise make one all-reduce into a loop of
/// millions of collectives (or, unrolled, millions of instructions).
pub const MAX_RING_HOPS: u64 = 1 << 14;

crate::choice_enum! {
    /// How the scales travel: f32 (kept to 17 significant bits), or bf16.
    /// The codes are computed against the scale that travels.
    pub enum ScaleType {
        /// f32 bits, rounded to 17 significant bits.
        F32 = "f32",
        /// bf16: 8 significant bits, half the bytes.
        Bf16 = "bf16",
    }
}

impl ScaleType {
    pub fn bytes(self) -> usize {
        match self {
            ScaleType::F32 => 4,
            ScaleType::Bf16 => 2,
        }
    }
}

crate::choice_enum! {
    /// How a message (a step's codes and scales) travels. The same bytes
    /// either way; the compilers differ in which they compile well
    /// ([`crate::passes::Platform`]).
    pub enum Wire {
        /// One s8 array of rows `[blocks, code bytes + scale bytes]`, one
        /// collective per step.
        Packed = "packed",
        /// The codes `[blocks, code bytes]` and the scales' bits `[blocks]`
        /// (u16 for bf16 scales, s32 for f32), a collective each.
        Split = "split",
    }
}

impl Wire {
    /// The arrays a message travels as: a collective each, per step.
    pub fn arrays(self) -> usize {
        match self {
            Wire::Packed => 1,
            Wire::Split => 2,
        }
    }
}

crate::choice_enum! {
    /// Who writes the kernels of a rewrite's compute steps: XLA's fusion,
    /// from the HLO the pass emits; or the pass itself, as Mosaic kernels
    /// XLA:TPU compiles or Triton kernels XLA:GPU compiles (one a step;
    /// `emit/mosaic.rs`, `emit/triton.rs`), where the plan and the operand
    /// allow (the options' default on those compilers, `Options::kernels`).
    pub enum Kernels {
        /// HLO ops, fused by the compiler.
        Hlo = "hlo",
        /// One Mosaic kernel a step (`tpu_custom_call`), XLA:TPU only.
        Mosaic = "mosaic",
        /// One Triton kernel a step (`__gpu$xla.gpu.triton`), XLA:GPU
        /// only, before its fusion.
        Triton = "triton",
    }
}

impl Kernels {
    /// Whether a report leaves it out (the default, which every report
    /// before the field held).
    pub fn is_hlo(&self) -> bool {
        *self == Kernels::Hlo
    }
}

crate::choice_enum! {
    /// What a code is: a small integer or an 8-bit float, times its block's
    /// scale.
    pub enum QuantFormat {
        /// Integers in [-127, 127]: the scale is absmax/127.
        Int8 = "int8",
        /// fp8 e4m3 (no infinities; largest 448): the scale is absmax/448
        /// and the float's own rounding keeps 4 significant bits per value.
        Fp8E4m3 = "fp8-e4m3",
        /// fp8 e5m2 (largest 57344): 3 significant bits, a wider range.
        Fp8E5m2 = "fp8-e5m2",
        /// Integers in [-7, 7], two codes per byte: the scale is absmax/7.
        Int4 = "int4",
    }
}

impl QuantFormat {
    /// The largest code magnitude the scale maps the block's absmax to.
    pub fn qmax(self) -> f32 {
        match self {
            QuantFormat::Int8 => 127.0,
            QuantFormat::Fp8E4m3 => 448.0,
            QuantFormat::Fp8E5m2 => 57344.0,
            QuantFormat::Int4 => 7.0,
        }
    }

    /// Bits one code takes on the wire.
    pub fn bits(self) -> usize {
        match self {
            QuantFormat::Int4 => 4,
            QuantFormat::Int8 | QuantFormat::Fp8E4m3 | QuantFormat::Fp8E5m2 => 8,
        }
    }

    /// Whether two codes share a byte (so a block holds an even number).
    pub fn packs_two_per_byte(self) -> bool {
        match self {
            QuantFormat::Int4 => true,
            QuantFormat::Int8 | QuantFormat::Fp8E4m3 | QuantFormat::Fp8E5m2 => false,
        }
    }

    /// Explicit mantissa bits of a float format; `None` for integers.
    pub fn mantissa_bits(self) -> Option<u32> {
        match self {
            QuantFormat::Fp8E4m3 => Some(3),
            QuantFormat::Fp8E5m2 => Some(2),
            QuantFormat::Int8 | QuantFormat::Int4 => None,
        }
    }
}

/// How one block is quantized: the code format and the scale's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quant {
    pub format: QuantFormat,
    pub scale: ScaleType,
}

crate::choice_enum! {
    /// How the reduced chunks reach every rank.
    pub enum GatherForm {
        /// One `all-gather` (the backend picks its algorithm).
        AllGather = "all-gather",
        /// P−1 `collective-permute` hops round the ring.
        Permute = "permute",
    }
}

crate::choice_enum! {
    /// How repeated steps are emitted.
    pub enum Form {
        /// A `while` loop over the steps: the module does not grow with P.
        Loop = "loop",
        /// Every step written out: P−1 copies of the step's ops.
        Unrolled = "unrolled",
    }
}

crate::choice_enum! {
    /// The reduce algorithm: the one list every door, the chooser, the
    /// report and the simulator name algorithms by.
    pub enum Algorithm {
        /// P−1 requantizing hops round a ring (the paper's algorithm).
        Ring = "ring",
        /// Every chunk quantized once and exchanged by one all-to-all; the
        /// owner sums in f32.
        TwoShot = "two-shot",
        /// A ring on each axis of an outer × inner grid in turn (the
        /// [`Grid`] of the plan's [`Config`]).
        TwoLevel = "two-level",
    }
}

impl Algorithm {
    /// The grid the algorithm reduces over in a group of `p`: none for the
    /// ring and two-shot; for two-level the `given` one (a topology's 2-D
    /// slice), or else the most balanced ([`Grid::balanced`]), and
    /// [`PlanError::NoGrid`] for a group that has none (a prime size).
    pub fn grid(self, p: usize, given: Option<Grid>) -> Result<Option<Grid>, PlanError> {
        match self {
            Algorithm::Ring | Algorithm::TwoShot => Ok(None),
            Algorithm::TwoLevel => given
                .or_else(|| Grid::balanced(p))
                .map(Some)
                .ok_or(PlanError::NoGrid(p)),
        }
    }
}

/// The `outer × inner` grid a two-level plan reduces over: rank
/// `r = i·inner + j` has coordinate `i` on the outer axis, `j` on the inner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Grid {
    pub outer: usize,
    pub inner: usize,
}

impl Grid {
    /// `outer × inner = p` with `outer ≤ inner` as close as possible, both
    /// at least 2; `None` for a prime (or tiny) group.
    pub fn balanced(p: usize) -> Option<Grid> {
        let outer = (2..=p.isqrt()).rev().find(|d| p % d == 0)?;
        Some(Grid {
            outer,
            inner: p / outer,
        })
    }
}

impl fmt::Display for Grid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.outer, self.inner)
    }
}

crate::choice_enum! {
    /// Whether blocks are rotated before quantization.
    pub enum Rotation {
        /// Blocks are quantized as they are.
        None = "none",
        /// The orthonormal Hadamard transform of each block (B a power of
        /// two).
        Hadamard = "hadamard",
    }
}

/// Which collective a plan carries out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Collective {
    /// Every rank ends with the sum of everyone's payload.
    AllReduce,
    /// Rank t ends with the sum of everyone's row t.
    ReduceScatter,
    /// Every rank ends with everyone's payload, in rank order.
    AllGather,
    /// Rank t ends with everyone's row t, in rank order.
    AllToAll,
}

impl Collective {
    /// The HLO opcode (without `-start`).
    pub fn opcode(self) -> &'static str {
        match self {
            Collective::AllReduce => "all-reduce",
            Collective::ReduceScatter => "reduce-scatter",
            Collective::AllGather => "all-gather",
            Collective::AllToAll => "all-to-all",
        }
    }
}

/// One concrete configuration: what the per-op choice picked.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Config {
    pub algorithm: Algorithm,
    /// The grid of a two-level plan (`None` for the others).
    pub grid: Option<Grid>,
    pub rotation: Rotation,
    /// Elements per quantization block (B).
    pub block: usize,
    pub scale_type: ScaleType,
    pub format: QuantFormat,
    /// Independent chains per ring direction (D).
    pub pipeline_depth: usize,
    pub bidirectional: bool,
    pub gather: GatherForm,
    pub form: Form,
    pub wire: Wire,
    #[serde(skip_serializing_if = "Kernels::is_hlo")]
    pub kernels: Kernels,
}

impl Default for Config {
    /// The pass's defaults (the one place they are written;
    /// [`crate::options::Options`] takes its own from here): blocks of 64
    /// int8 codes with bf16 scales, one lane per direction of a
    /// bidirectional ring, one all-gather, the loop form, a message one
    /// array; a ring without rotation (the pass picks those per op).
    fn default() -> Self {
        Config {
            algorithm: Algorithm::Ring,
            grid: None,
            rotation: Rotation::None,
            block: 64,
            scale_type: ScaleType::Bf16,
            format: QuantFormat::Int8,
            pipeline_depth: 1,
            bidirectional: true,
            gather: GatherForm::AllGather,
            form: Form::Loop,
            wire: Wire::Packed,
            kernels: Kernels::Hlo,
        }
    }
}

impl Config {
    /// The algorithm as reports name it: `ring`, `two-shot`,
    /// `two-level 2x4`.
    pub fn algorithm_label(&self) -> String {
        match (self.algorithm, self.grid) {
            (Algorithm::TwoLevel, Some(g)) => format!("{} {g}", self.algorithm),
            (a, _) => a.to_string(),
        }
    }
}

/// What a block size must be for a code format and a rotation: even for
/// int4 (two codes to a byte), a power of two for the Hadamard transform.
/// The plan's rule, which the options check as well.
pub fn check_block(block: usize, format: QuantFormat, rotation: Rotation) -> Result<(), PlanError> {
    if rotation == Rotation::Hadamard && !block.is_power_of_two() {
        return Err(PlanError::RotationBlock(block));
    }
    if format.packs_two_per_byte() && block % 2 != 0 {
        return Err(PlanError::OddInt4Block(block));
    }
    Ok(())
}

/// Quantizations on a final value's way: `count` of them, each of a
/// partial sum of `inputs` device inputs ([`Plan::partials`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partial {
    pub inputs: usize,
    pub count: usize,
}

/// One independent chain of a ring phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lane {
    /// +1: every rank sends to rank + 1 on the axis; −1: to rank − 1.
    pub dir: i64,
    /// Where the lane's sub-chunk starts inside a chunk.
    pub offset: usize,
    /// Elements of the sub-chunk, a multiple of the block size.
    pub len: usize,
}

/// One axis of the group: `size` ranks whose coordinates step `stride`
/// apart in rank order (the inner axis of a grid has stride 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Axis {
    pub size: usize,
    pub stride: usize,
}

/// One phase of an algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Phase {
    /// Reduce-scatter over `axis` by `size − 1` hops round its ring; every
    /// hop requantizes a partial sum.
    Ring { axis: Axis },
    /// Reduce-scatter over `axis` by one all-to-all: every slice is
    /// quantized once, the owner dequantizes and sums in f32.
    Exchange { axis: Axis },
    /// The owned chunk, quantized once, reaches every rank of the group;
    /// everybody (the owner too) dequantizes the same codes.
    Gather,
    /// Every row quantized once and sent to the rank it belongs to by one
    /// all-to-all; nothing is summed.
    Scatter,
}

/// Why no plan can be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("group size 1: nothing to reduce")]
    GroupOfOne,
    #[error("payload too large to index with s32")]
    TooLarge,
    #[error(
        "the ring would run {hops} collective hops (chains × steps), more than the limit of {limit}"
    )]
    TooManyHops { hops: u64, limit: u64 },
    #[error("two-level needs outer × inner = {group}, got {outer}x{inner} (each at least 2)")]
    BadGrid {
        group: usize,
        outer: usize,
        inner: usize,
    },
    #[error("two-level needs a 2-D grid of the group, and a group of {0} has none (a prime size)")]
    NoGrid(usize),
    #[error("int4 codes pack two to a byte: the block size must be even, not {0}")]
    OddInt4Block(usize),
    #[error("Hadamard rotation needs a power-of-two block size, not {0}")]
    RotationBlock(usize),
}

/// The plan of one rewrite.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub config: Config,
    pub collective: Collective,
    /// For the collectives that cut their payload into P rows (one per
    /// rank: reduce-scatter, all-to-all, and all-gather's one row), the
    /// elements of a row; each row is padded to `chunk` on its own. `None`:
    /// the all-reduce's payload, flattened and padded as a whole.
    pub row: Option<usize>,
    /// Group size P.
    pub group_size: usize,
    /// Payload elements (all packed operands).
    pub elements: usize,
    /// Elements per rank chunk, `c`: a multiple of the block size.
    pub chunk: usize,
    /// The chains of the ring phases.
    pub lanes: Vec<Lane>,
    pub phases: Vec<Phase>,
}

impl Plan {
    /// The all-reduce plan for `elements` payload elements over groups of
    /// `p` ranks.
    pub fn new(p: usize, elements: usize, config: &Config) -> Result<Self, PlanError> {
        Self::build(Collective::AllReduce, p, elements, None, config)
    }

    /// The plan of `collective` over groups of `p` ranks whose rows hold
    /// `row` elements each (reduce-scatter, all-to-all: the operand is P
    /// rows; all-gather: the operand is one row).
    pub fn rows(
        collective: Collective,
        p: usize,
        row: usize,
        config: &Config,
    ) -> Result<Self, PlanError> {
        let elements = row.checked_mul(p).ok_or(PlanError::TooLarge)?;
        Self::build(collective, p, elements, Some(row), config)
    }

    fn build(
        collective: Collective,
        p: usize,
        elements: usize,
        row: Option<usize>,
        config: &Config,
    ) -> Result<Self, PlanError> {
        if p < 2 {
            return Err(PlanError::GroupOfOne);
        }
        let b = config.block.max(1);
        check_block(b, config.format, config.rotation)?;
        let per_rank_blocks = match row {
            // Rows are padded one by one.
            Some(m) => m.div_ceil(b).max(1),
            None => elements
                .div_ceil(p.checked_mul(b).ok_or(PlanError::TooLarge)?)
                .max(1),
        };
        // A ring's lanes split each chunk evenly: lanes of one size share
        // every per-shape constant of a hop (half the broadcasts of two
        // lanes that differ by a block), for at most a block of padding per
        // lane.
        let per_rank_blocks = match config.algorithm {
            Algorithm::Ring | Algorithm::TwoLevel => {
                per_rank_blocks.next_multiple_of(lane_count(per_rank_blocks, config))
            }
            Algorithm::TwoShot => per_rank_blocks,
        };
        let chunk = per_rank_blocks.checked_mul(b).ok_or(PlanError::TooLarge)?;
        let padded = chunk.checked_mul(p).ok_or(PlanError::TooLarge)?;
        if i32::try_from(padded).is_err() {
            return Err(PlanError::TooLarge);
        }
        let whole = Axis { size: p, stride: 1 };
        let reduce = match config.algorithm {
            Algorithm::Ring => vec![Phase::Ring { axis: whole }],
            Algorithm::TwoShot => vec![Phase::Exchange { axis: whole }],
            Algorithm::TwoLevel => {
                let Grid { outer, inner } = config.grid.ok_or(PlanError::NoGrid(p))?;
                if outer < 2 || inner < 2 || outer.checked_mul(inner) != Some(p) {
                    return Err(PlanError::BadGrid {
                        group: p,
                        outer,
                        inner,
                    });
                }
                vec![
                    Phase::Ring {
                        axis: Axis {
                            size: inner,
                            stride: 1,
                        },
                    },
                    Phase::Ring {
                        axis: Axis {
                            size: outer,
                            stride: inner,
                        },
                    },
                ]
            }
        };
        let phases = match collective {
            Collective::AllReduce => [reduce, vec![Phase::Gather]].concat(),
            Collective::ReduceScatter => reduce,
            Collective::AllGather => vec![Phase::Gather],
            Collective::AllToAll => vec![Phase::Scatter],
        };
        let lanes = lanes(per_rank_blocks, b, config);
        let plan = Plan {
            config: config.clone(),
            collective,
            row,
            group_size: p,
            elements,
            chunk,
            lanes,
            phases,
        };
        let hops = plan.collective_steps();
        if hops > MAX_RING_HOPS {
            return Err(PlanError::TooManyHops {
                hops,
                limit: MAX_RING_HOPS,
            });
        }
        Ok(plan)
    }

    /// Whether the plan repeats steps (ring hops, relays), so that its form
    /// (loop or unrolled) shows in the module.
    pub fn repeats(&self) -> bool {
        self.phases.iter().any(|p| match p {
            Phase::Ring { .. } => true,
            Phase::Gather => self.config.gather == GatherForm::Permute,
            Phase::Exchange { .. } | Phase::Scatter => false,
        })
    }

    /// How the plan gets its result, for reports: the reduce algorithm for
    /// the reducing collectives, the single exchange otherwise.
    pub fn algorithm_name(&self) -> String {
        match self.collective {
            Collective::AllReduce | Collective::ReduceScatter => self.config.algorithm_label(),
            Collective::AllGather => "gather".into(),
            Collective::AllToAll => "exchange".into(),
        }
    }

    pub fn block(&self) -> usize {
        self.config.block
    }

    pub fn scale_type(&self) -> ScaleType {
        self.config.scale_type
    }

    pub fn quant(&self) -> Quant {
        Quant {
            format: self.config.format,
            scale: self.config.scale_type,
        }
    }

    /// `P·c`, the padded payload.
    pub fn padded(&self) -> usize {
        self.chunk * self.group_size
    }

    /// Bytes of one message carrying `len` elements (codes, then scales).
    pub fn message_len(&self, len: usize) -> usize {
        len * self.config.format.bits() / 8 + len / self.block() * self.scale_type().bytes()
    }

    /// The directions the lanes travel, in lane order (one or both).
    pub fn directions(&self) -> Vec<i64> {
        let mut dirs: Vec<i64> = self.lanes.iter().map(|l| l.dir).collect();
        dirs.dedup();
        dirs
    }

    /// The directions a permute gather's relays travel, each with half of
    /// the chunk's blocks: the lanes' directions, or only the first when
    /// the chunk is one block.
    pub fn relay_directions(&self) -> Vec<i64> {
        let mut dirs = self.directions();
        if self.chunk <= self.block() {
            dirs.truncate(1);
        }
        dirs
    }

    /// How many chunk-sized slices each rank holds when phase `phase`
    /// starts: the product of the axes not yet reduced (P before the first
    /// reduce phase, 1 once every axis is reduced).
    pub fn rows_before(&self, phase: usize) -> usize {
        let reduced: usize = self.phases[..phase]
            .iter()
            .filter_map(Phase::axis)
            .map(|a| a.size)
            .product();
        self.group_size / reduced
    }

    /// Bytes each device sends in `phase`.
    pub fn phase_wire_bytes(&self, phase: usize) -> u64 {
        let p = &self.phases[phase];
        let rows = self.rows_before(phase);
        match p {
            // A ring or exchange over an axis of Q splits the `rows` slices
            // held into Q groups and sends Q−1 of them (each once, as a
            // message of `rows/Q` chunks).
            Phase::Ring { axis } | Phase::Exchange { axis } => {
                (axis.size - 1) as u64 * self.message_len(rows / axis.size * self.chunk) as u64
            }
            Phase::Gather | Phase::Scatter => {
                (self.group_size - 1) as u64 * self.message_len(self.chunk) as u64
            }
        }
    }

    /// Bytes each device sends in all phases.
    pub fn wire_bytes(&self) -> u64 {
        (0..self.phases.len())
            .map(|k| self.phase_wire_bytes(k))
            .sum()
    }

    /// Collective steps one device takes part in, all chains together:
    /// the hops of ring phases per lane, one per exchange, one gather (or
    /// P−1 hops per direction of a permute gather).
    pub fn collective_steps(&self) -> u64 {
        self.phases
            .iter()
            .map(|p| match p {
                Phase::Ring { axis } => (axis.size as u64 - 1) * self.lanes.len() as u64,
                Phase::Exchange { .. } | Phase::Scatter => 1,
                Phase::Gather => match self.config.gather {
                    GatherForm::AllGather => 1,
                    GatherForm::Permute => {
                        (self.group_size as u64 - 1) * self.relay_directions().len() as u64
                    }
                },
            })
            .sum()
    }

    /// The quantizations a final value goes through on its way, each of a
    /// partial sum of some device inputs: what the error model adds up.
    /// The partials hold consecutive ranks (a ring's chain, an axis of a
    /// grid: consecutive ranks in rank order), so statistics measured on
    /// windows of consecutive ranks describe every algorithm.
    ///
    /// | phase | quantizations of a final value |
    /// |---|---|
    /// | ring over Q, after axes of R ranks reduced | `rows/Q` chains, each quantizing partials of k·R inputs, k = 1..Q−1 |
    /// | exchange over Q | every one of the Q contributions (of R inputs) once |
    /// | gather | the complete sum once (all-gather, all-to-all: the input row) |
    pub fn partials(&self) -> Vec<Partial> {
        let mut out = Vec::new();
        let mut reduced = 1usize;
        for (k, phase) in self.phases.iter().enumerate() {
            let rows = self.rows_before(k);
            match *phase {
                Phase::Ring { axis } => {
                    for j in 1..axis.size {
                        out.push(Partial {
                            inputs: j * reduced,
                            count: rows / axis.size,
                        });
                    }
                    reduced *= axis.size;
                }
                Phase::Exchange { axis } => {
                    out.push(Partial {
                        inputs: reduced,
                        count: axis.size,
                    });
                    reduced *= axis.size;
                }
                Phase::Gather | Phase::Scatter => out.push(Partial {
                    inputs: self.sum_inputs(),
                    count: 1,
                }),
            }
        }
        out
    }

    /// How many device inputs a final value sums: the group for the
    /// reducing collectives, one for the gathers and exchanges of rows.
    pub fn sum_inputs(&self) -> usize {
        match self.collective {
            Collective::AllReduce | Collective::ReduceScatter => self.group_size,
            Collective::AllGather | Collective::AllToAll => 1,
        }
    }

    /// Σ over the quantizations a final value went through of the number of
    /// device inputs the quantized value held, divided by those the final
    /// value holds ([`Plan::sum_inputs`]): the factor the error model
    /// multiplies a single quantization's relative noise by when the
    /// inputs are independent. Ring: (P+1)/2; two-shot: 2; two-level:
    /// (P1+P2)/2.
    pub fn noise_weight(&self) -> f64 {
        let total: usize = self.partials().iter().map(|q| q.inputs * q.count).sum();
        total as f64 / self.sum_inputs() as f64
    }

    /// How many times a partial sum is quantized on its way (the plan's
    /// requantization count, as the README's table states it).
    pub fn quantizations(&self) -> usize {
        self.phases
            .iter()
            .map(|p| match p {
                Phase::Ring { axis } => axis.size - 1,
                Phase::Exchange { .. } | Phase::Gather | Phase::Scatter => 1,
            })
            .sum()
    }
}

impl Phase {
    pub fn axis(&self) -> Option<Axis> {
        match self {
            Phase::Ring { axis } | Phase::Exchange { axis } => Some(*axis),
            Phase::Gather | Phase::Scatter => None,
        }
    }
}

/// The directions a chunk of `blocks` blocks travels: both where the ring
/// is bidirectional and there are two blocks to split.
fn directions(blocks: usize, config: &Config) -> &'static [i64] {
    if config.bidirectional && blocks >= 2 {
        &[1, -1]
    } else {
        &[1]
    }
}

/// How many lanes a chunk of `blocks` blocks splits into: D per direction,
/// never more than blocks.
fn lane_count(blocks: usize, config: &Config) -> usize {
    config
        .pipeline_depth
        .max(1)
        .saturating_mul(directions(blocks, config).len())
        .min(blocks)
}

/// Splits a chunk of `blocks` blocks into lanes: D per direction, never
/// more lanes than blocks.
fn lanes(blocks: usize, b: usize, config: &Config) -> Vec<Lane> {
    let directions = directions(blocks, config);
    let count = lane_count(blocks, config);
    let per_dir = count / directions.len();
    let mut lanes = Vec::with_capacity(count);
    let mut offset = 0;
    for l in 0..count {
        let n = blocks / count + usize::from(l < blocks % count);
        let dir = directions[(l / per_dir).min(directions.len() - 1)];
        lanes.push(Lane {
            dir,
            offset,
            len: n * b,
        });
        offset += n * b;
    }
    lanes
}

/// Bytes each device sends in a bandwidth-optimal ring all-reduce of
/// `payload_bytes`: 2·(P−1)/P of the payload.
pub fn ring_wire_bytes(group_size: usize, payload_bytes: u64) -> u64 {
    let p = group_size as u64;
    2 * (p - 1) * payload_bytes / p
}

/// Bytes each device sends for `collective` of an operand of
/// `operand_bytes` in its own type, done the bandwidth-optimal way:
/// all-reduce 2·(P−1)/P, reduce-scatter and all-to-all (P−1)/P of the
/// operand, all-gather P−1 times it.
pub fn baseline_wire_bytes(collective: Collective, group_size: usize, operand_bytes: u64) -> u64 {
    let p = group_size as u64;
    match collective {
        Collective::AllReduce => ring_wire_bytes(group_size, operand_bytes),
        Collective::ReduceScatter | Collective::AllToAll => (p - 1) * operand_bytes / p,
        Collective::AllGather => (p - 1) * operand_bytes,
    }
}

/// A configuration for the unit tests of the plan's readers: `algorithm`
/// (two-level over 2x4) with the pass's default block, scales, format,
/// lanes and form.
#[cfg(test)]
pub(crate) fn test_config(algorithm: Algorithm) -> Config {
    Config {
        algorithm,
        grid: algorithm
            .grid(8, Some(Grid { outer: 2, inner: 4 }))
            .ok()
            .flatten(),
        ..Config::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(algorithm: Algorithm) -> Config {
        test_config(algorithm)
    }

    #[test]
    fn chunks_hold_whole_blocks_and_lanes_split_them_evenly() {
        let c = Config {
            block: 128,
            pipeline_depth: 2,
            ..config(Algorithm::Ring)
        };
        // 10 000 elements over 8 ranks: 1250 each → 10 blocks of 128,
        // padded to 12 so that the 4 lanes are 3 blocks each.
        let plan = Plan::new(8, 10_000, &c).unwrap();
        assert_eq!(plan.chunk, 1536);
        assert_eq!(plan.padded(), 12_288);
        let lens: Vec<usize> = plan.lanes.iter().map(|l| l.len).collect();
        assert_eq!(lens, vec![384, 384, 384, 384]);
        let dirs: Vec<i64> = plan.lanes.iter().map(|l| l.dir).collect();
        assert_eq!(dirs, vec![1, 1, -1, -1]);
        assert_eq!(plan.lanes[3].offset + plan.lanes[3].len, plan.chunk);
        // Two-shot runs no lanes: its chunk is the blocks, unpadded.
        let two_shot = Plan::new(
            8,
            10_000,
            &Config {
                algorithm: Algorithm::TwoShot,
                ..c
            },
        )
        .unwrap();
        assert_eq!(two_shot.chunk, 1280);
    }

    #[test]
    fn lanes_never_outnumber_blocks() {
        let c = Config {
            block: 128,
            pipeline_depth: 64,
            bidirectional: false,
            ..config(Algorithm::Ring)
        };
        let plan = Plan::new(8, 2048, &c).unwrap();
        assert_eq!(plan.lanes.len(), 2);
        assert_eq!(plan.padded(), 2048);
    }

    #[test]
    fn every_algorithm_halves_the_wire_bytes_of_a_bf16_ring() {
        for n in [512 * 1024, 1_000_000, 524_289, 3 * 1024 * 1024 + 17] {
            for algorithm in [Algorithm::Ring, Algorithm::TwoShot, Algorithm::TwoLevel] {
                for (block, scale_type) in [(128, ScaleType::F32), (64, ScaleType::Bf16)] {
                    let c = Config {
                        block,
                        scale_type,
                        ..config(algorithm)
                    };
                    let plan = Plan::new(8, n, &c).unwrap();
                    let ratio = ring_wire_bytes(8, 2 * n as u64) as f64 / plan.wire_bytes() as f64;
                    assert!(
                        (1.93..=1.94).contains(&ratio),
                        "n={n} {algorithm} B={block}: {ratio}"
                    );
                }
            }
        }
    }

    #[test]
    fn noise_weights_follow_the_requantization_counts() {
        let w = |a| Plan::new(8, 1 << 16, &config(a)).unwrap().noise_weight();
        assert_eq!(w(Algorithm::Ring), 4.5);
        assert_eq!(w(Algorithm::TwoShot), 2.0);
        assert_eq!(w(Algorithm::TwoLevel), 3.0);
        let q = |a| Plan::new(8, 1 << 16, &config(a)).unwrap().quantizations();
        assert_eq!(q(Algorithm::Ring), 8);
        assert_eq!(q(Algorithm::TwoShot), 2);
        assert_eq!(q(Algorithm::TwoLevel), 5);
    }

    #[test]
    fn every_collective_halves_the_bytes_of_its_bf16_form() {
        for (collective, row) in [
            (Collective::ReduceScatter, 1 << 17),
            (Collective::AllGather, 1 << 17),
            (Collective::AllToAll, 1 << 17),
        ] {
            let plan = Plan::rows(collective, 8, row, &config(Algorithm::Ring)).unwrap();
            let operand = match collective {
                Collective::AllGather => 2 * row as u64,
                Collective::AllReduce | Collective::ReduceScatter | Collective::AllToAll => {
                    2 * 8 * row as u64
                }
            };
            let ratio =
                baseline_wire_bytes(collective, 8, operand) as f64 / plan.wire_bytes() as f64;
            assert!((1.93..=1.94).contains(&ratio), "{collective:?}: {ratio}");
        }
        // Rows are padded one by one: 100 elements become 2 blocks of 64.
        let plan = Plan::rows(Collective::ReduceScatter, 4, 100, &config(Algorithm::Ring)).unwrap();
        assert_eq!((plan.chunk, plan.padded()), (128, 512));
        assert_eq!(plan.quantizations(), 3);
        assert_eq!(plan.noise_weight(), 1.5);
    }

    #[test]
    fn bad_grids_and_rotation_blocks_are_refused() {
        assert!(matches!(
            Plan::new(
                8,
                4096,
                &Config {
                    grid: Some(Grid { outer: 3, inner: 3 }),
                    ..config(Algorithm::TwoLevel)
                }
            ),
            Err(PlanError::BadGrid { .. })
        ));
        let c = Config {
            block: 96,
            rotation: Rotation::Hadamard,
            ..config(Algorithm::Ring)
        };
        assert_eq!(Plan::new(8, 4096, &c), Err(PlanError::RotationBlock(96)));
        assert_eq!(
            Plan::new(1, 4096, &config(Algorithm::Ring)),
            Err(PlanError::GroupOfOne)
        );
    }
}
