//! Two-shot's three compute steps as Mosaic kernels for XLA:TPU (the
//! `stable_mosaic` text a `tpu_custom_call` carries, which libtpu compiles):
//! quantize, dequantize-sum-requantize, dequantize. Three kernels an op,
//! where libtpu makes 9.75 to 14 of the same arithmetic in HLO. An
//! all-gather along its rows is the first and the last: a rank quantizes
//! its rows as one part (a slab of its own), and the gathered message is
//! the two-shot's gather, so the dequantize kernel reads it as it is. A
//! reduce-scatter is the first two, the sum writing the result (rotated
//! back, where the plan rotates) instead of requantizing it.
//!
//! The payload is seen as `[R, C]` (its rows and last dimension, C a
//! multiple of 128): each 128 lanes of a row are two blocks of 64, so a
//! block is 64 consecutive elements of the flattened payload, as in the HLO
//! emission, and no element moves between TPU tiles. A grid step takes
//! [`ROWS_PER_STEP`] rows of one group of columns ([`GROUP_COLS`], or the
//! whole row where it does not split into them) and unrolls the group's
//! 128-lane chunks: the grid is the groups by the row steps.
//!
//! The scales travel as slabs `[nb, m]`, one per destination rank (its m
//! rows along the lanes): stored as rows `[m, nb]` (nb < 128 lanes), libtpu
//! relayouted them around every all-to-all, two more kernels an op. A step
//! writes its rows' scales into its lanes of the slab (transposed, rotated
//! there, the other steps' lanes kept) and reads them back the same way.
//!
//! The arithmetic is the HLO emission's op for op (`codes.rs`,
//! `exchange.rs`; [`crate::numerics`]): the absmax from the bits of |x| and
//! the floor, capped at +Inf's; the bf16 scale `absmax · fl(1/127)`; codes
//! against its reciprocal, rounded to nearest even, clamped; the exchange's
//! sum of halves; `(H·q)·scale` back. `tests/compilers.rs` runs these
//! kernels' text on the host (`tests/compilers/mosaic.py`) against the HLO
//! emission on XLA:CPU, bit for bit.

use std::fmt::Write;

use base64::Engine;

use super::Emitter;
use crate::ir::builder::Value;
use crate::ir::shape;
use crate::numerics::{absmax_floor, hadamard_sign, inv_qmax};
use crate::options::Options;
use crate::passes::Stage;
use crate::passes::quantize_collectives::groups::IdSpace;
use crate::plan::{
    Algorithm, Collective, GatherForm, Phase, Plan, QuantFormat, Rotation, ScaleType,
};
use crate::proto::{PrimitiveType, ShapeProto};

/// The largest group whose parts the sum kernel adds one by one (its body
/// grows with P × a step's chunks).
const MAX_PARTS: i64 = 8;

/// A rank's rows are a multiple of this: its scales travel as a slab
/// `[nb, rows]`, the rows along TPU's 128 lanes (Mosaic refuses the slab's
/// transposes and rotations on fewer: "unsupported unaligned shape").
const SLAB_LANES: i64 = 128;

/// The widest row the kernels unroll whole (32 chunks of 128 lanes); a
/// row of whole [`GROUP_COLS`] groups may be any width.
const MAX_COLS: i64 = 4096;

/// Whether `options` leave the kernels their plans: int8 codes, B = 64,
/// bf16 scales, gathered by one all-gather; or why not. A forced algorithm
/// other than two-shot rules out only the all-reduces and reduce-scatters
/// (their plan then is not the kernels', [`takes_plan`]); an all-gather
/// has no algorithm and keeps the kernels.
pub(in crate::passes::quantize_collectives) fn takes_options(o: &Options) -> Result<(), String> {
    takes_knobs(o.quant_format, o.scale_type, o.block_size, o.gather)
}

fn takes_knobs(
    format: QuantFormat,
    scale_type: ScaleType,
    block: usize,
    gather: GatherForm,
) -> Result<(), String> {
    if format != QuantFormat::Int8 || scale_type != ScaleType::Bf16 || block != 64 {
        return Err("they quantize int8, B = 64, bf16 scales".into());
    }
    if gather != GatherForm::AllGather {
        return Err("they gather by one all-gather".into());
    }
    Ok(())
}

/// Whether the kernels write `plan`: two-shot's all-reduce over one axis
/// (quantize, sum, dequantize), its reduce-scatter (quantize, sum) or an
/// all-gather (quantize, dequantize), int8 codes, B = 64, bf16 scales, one
/// all-gather; or why not.
pub(in crate::passes::quantize_collectives) fn takes_plan(plan: &Plan) -> Result<(), String> {
    let c = &plan.config;
    let two_shot = plan.collective == Collective::AllReduce
        && c.algorithm == Algorithm::TwoShot
        && matches!(plan.phases[..], [Phase::Exchange { .. }, Phase::Gather]);
    let gather = plan.collective == Collective::AllGather && plan.phases[..] == [Phase::Gather];
    let scatter = plan.collective == Collective::ReduceScatter
        && c.algorithm == Algorithm::TwoShot
        && matches!(plan.phases[..], [Phase::Exchange { .. }]);
    if !two_shot && !gather && !scatter {
        return Err(
            "only a two-shot all-reduce or reduce-scatter over one axis, or an all-gather, has \
             them"
                .into(),
        );
    }
    takes_knobs(c.format, c.scale_type, c.block, c.gather)
}

/// The one bf16 operand of `plan`, where equarx's own kernels (Mosaic's,
/// Triton's) write the plan ([`takes_plan`]); or why not.
pub(super) fn the_bf16_operand<'a>(
    plan: &Plan,
    operands: &[&'a ShapeProto],
) -> Result<&'a ShapeProto, String> {
    takes_plan(plan)?;
    let [operand] = operands else {
        return Err(format!("{} operands, not one", operands.len()));
    };
    if operand.element_type != PrimitiveType::Bf16 as i32 {
        return Err("the operand is not bf16".into());
    }
    Ok(operand)
}

/// Whether the kernels take `plan` on its one bf16 operand `operands`
/// (an all-gather's gathered, a reduce-scatter's scattered, along
/// `dimension`) at `stage`: the shape they are written for, or why not.
pub(in crate::passes::quantize_collectives) fn fits(
    plan: &Plan,
    operands: &[&ShapeProto],
    stage: Stage,
    dimension: Option<i64>,
) -> Result<Shape, String> {
    let p = plan.group_size as i64;
    if stage == Stage::Fused {
        return Err(format!("the module is past XLA's fusion ({stage})"));
    }
    let operand = the_bf16_operand(plan, operands)?;
    let dims = &operand.dimensions;
    let cols = dims.last().copied().unwrap_or(1);
    let mut rows: i64 = dims.iter().rev().skip(1).product();
    if cols % 128 != 0 || (cols > MAX_COLS && cols % GROUP_COLS != 0) {
        return Err(format!(
            "the last dimension, {cols}, is neither a multiple of 128 up to {MAX_COLS} nor of \
             {GROUP_COLS}"
        ));
    }
    let gather = plan.collective == Collective::AllGather;
    if plan.collective != Collective::AllReduce {
        // Ranks' rows one after another: a dimension before the last with
        // only 1s before it.
        let d = dimension.unwrap_or(0);
        let keeps_rows = usize::try_from(d)
            .is_ok_and(|d| d + 1 < dims.len() && dims[..d].iter().all(|&n| n == 1));
        if !keeps_rows {
            return Err(format!(
                "the {}'s dimension {d} of {dims:?} does not keep a rank's rows together (the \
                 kernels move whole rows)",
                plan.collective.opcode()
            ));
        }
    }
    if gather {
        rows *= p;
    }
    // A rank's rows are the lanes of its scales' slab: whole vregs of 128.
    // Only the sum kernel adds the parts one by one.
    let most = if gather { i64::MAX } else { MAX_PARTS };
    if p > most || rows % (SLAB_LANES * p) != 0 {
        return Err(format!(
            "{} rows over {p} ranks: the kernels take rows a multiple of {SLAB_LANES} per \
             rank{}",
            if gather { rows / p } else { rows },
            if gather {
                String::new()
            } else {
                format!(" and up to {MAX_PARTS} ranks")
            }
        ));
    }
    // Past libtpu's layout assignment the kernel reads the operand as it is
    // laid out: `[R, C]` tiled as the kernel's operand must be, which a
    // row-major operand tiled so is when its rows are whole tiles.
    if stage == Stage::Tiled && !reads_as_tiled_rows(operand) {
        return Err(format!(
            "past XLA:TPU's layout assignment the operand {} is not laid out as the kernel's \
             (row-major, T(8,128)(2,1), rows a multiple of 8)",
            crate::text::print_shape(operand)
        ));
    }
    Ok(Shape {
        collective: plan.collective,
        rows,
        cols,
        parts: p,
        rotation: plan.config.rotation == Rotation::Hadamard,
    })
}

/// Whether `s` (an array of rank 2 or more) is row-major with XLA:TPU's
/// tiles and its second-minor dimension a multiple of the tile's 8 rows,
/// so that seeing it as `[R, C]` moves no element.
fn reads_as_tiled_rows(s: &ShapeProto) -> bool {
    let rank = s.dimensions.len();
    let Some(layout) = s.layout.as_deref() else {
        return false;
    };
    rank >= 2
        && s.dimensions[rank - 2] % 8 == 0
        && layout.minor_to_major == shape::default_layout(rank).minor_to_major
        && layout.tiles == shape::tpu_tiles(s.element_type, 8)
}

impl Emitter<'_, '_, '_> {
    /// The plan's collective of the one operand through the kernels
    /// ([`fits`] said yes): two-shot's all-reduce as quantize, all-to-all of
    /// codes and scales, sum, all-gather of both, dequantize; its
    /// reduce-scatter as the first three; an all-gather as quantize,
    /// all-gather of both, dequantize. Past libtpu's layout
    /// assignment every array of it carries libtpu's tiles.
    pub(super) fn mosaic_kernels(&mut self, s: Shape) -> Value {
        let tiled = self.inputs.stage == Stage::Tiled;
        let was = self.b.tile_for_tpu(tiled);
        let y = self.mosaic_steps(s);
        // The result keeps the layout the op's result has.
        self.b.tile_for_tpu(false);
        let result = &self.inputs.results[0];
        let y = if shape::same_array(&y.shape, result) {
            y
        } else if tiled && reads_as_tiled_rows(result) {
            self.b.bitcast_to(&y, result)
        } else {
            self.b.reshape_to(&y, result)
        };
        self.b.tile_for_tpu(was);
        y
    }

    /// `x` (rows whole tiles of 8) as the array `dims` of the same rows
    /// and last dimension: past libtpu's layout assignment a bitcast of
    /// the same bytes (a reshape there is a kernel of its own), a reshape
    /// before it.
    fn view(&mut self, x: &Value, dims: &[i64]) -> Value {
        if self.inputs.stage == Stage::Tiled {
            self.b.bitcast_to(x, &shape::with_dims(&x.shape, dims))
        } else {
            self.b.reshape(x, dims)
        }
    }

    /// The kernels and collectives of [`Self::mosaic_kernels`]: the
    /// result as `[R, C]`.
    fn mosaic_steps(&mut self, s: Shape) -> Value {
        let (rows, cols, p) = (s.rows, s.cols, s.parts);
        // Every block of a row: the slabs' rows (a step's group takes some).
        let (nb, m) = (s.cols / 64, s.rows / s.parts);
        let h = s
            .rotation
            .then(|| self.b.f32_array(&rotation_matrix(), &[128, 128]));
        // A message: the codes `[rows, C]` and the scales as slabs `[P', nb,
        // m]`, a destination's scales with its rows along the lanes, which
        // libtpu moves without relayouts (rows of nb < 128 scales it
        // relayouted around every all-to-all).
        let message = |r: i64| {
            shape::tuple(vec![
                shape::array(PrimitiveType::S8, &[r, cols]),
                shape::array(PrimitiveType::Bf16, &[r / m, nb, m]),
            ])
        };
        // The quantize kernel over `r` rows of the operand: the payload, or
        // the rank's rows an all-gather sends.
        let quantized = |e: &mut Self, quantize: &str, r: i64| {
            let operand = &e.inputs.operands[0];
            // Already `[r, C]` (and, past libtpu's layout assignment, tiled
            // as the kernel reads it: `fits`), the operand needs no reshape.
            let x = if operand.dims() == [r, cols] {
                operand.clone()
            } else {
                e.view(operand, &[r, cols])
            };
            let mut ins = vec![&x];
            ins.extend(h.as_ref());
            e.kernel(quantize, &ins, message(r))
        };
        match kernels(s) {
            Steps::AllGather {
                quantize,
                dequantize,
            } => {
                let q = quantized(self, &quantize, m);
                self.gather_kernels(&dequantize, &q, h.as_ref(), s)
            }
            Steps::ReduceScatter { quantize, sum } => {
                let q = quantized(self, &quantize, rows);
                let sent = self.exchange_kernels(&q, [p, m, cols]);
                // Its sum is the result, rotated back there.
                let mut ins = vec![&sent[0], &sent[1]];
                ins.extend(h.as_ref());
                let out = shape::array(PrimitiveType::Bf16, &[m, cols]);
                self.kernel(&sum, &ins, out)
            }
            Steps::AllReduce {
                quantize,
                sum,
                dequantize,
            } => {
                let q = quantized(self, &quantize, rows);
                let sent = self.exchange_kernels(&q, [p, m, cols]);
                let summed = self.kernel(&sum, &[&sent[0], &sent[1]], message(m));
                self.gather_kernels(&dequantize, &summed, h.as_ref(), s)
            }
        }
    }

    /// The all-to-alls of a message's codes (seen as `parts`: `[P, m, C]`)
    /// and scales (`message`, a tuple): every destination's part.
    fn exchange_kernels(&mut self, message: &Value, parts: [i64; 3]) -> [Value; 2] {
        self.exchange_message(message, [Some(&parts), None])
    }

    /// The all-to-alls of a message's codes and scales (`message`, a tuple
    /// of both), each first seen as `dims` where given ([`Self::view`]):
    /// every destination's part, equarx's own kernels' exchange.
    pub(super) fn exchange_message(
        &mut self,
        message: &Value,
        dims: [Option<&[i64]>; 2],
    ) -> [Value; 2] {
        let groups = self.inputs.participants.groups.clone();
        [0, 1].map(|i| {
            let v = self.b.get_tuple_element(message, i);
            let v = match dims[i as usize] {
                Some(d) => self.view(&v, d),
                None => v,
            };
            let channel = self.channel();
            self.b.all_to_all(&v, 0, &groups, channel)
        })
    }

    /// The all-gathers of a message's codes and scales (`message`, a
    /// tuple of both), equarx's own kernels' gather.
    pub(super) fn gather_message(&mut self, message: &Value) -> [Value; 2] {
        let groups = self.inputs.participants.groups.clone();
        let partitions = self.inputs.participants.space == IdSpace::Partition;
        [0, 1].map(|i| {
            let v = self.b.get_tuple_element(message, i);
            let channel = self.channel();
            self.b.all_gather(&v, 0, &groups, channel, partitions)
        })
    }

    /// The all-gathers of a message's codes and scales (`message`, a
    /// tuple), and the dequantize kernel over what they gathered.
    fn gather_kernels(
        &mut self,
        dequantize: &str,
        message: &Value,
        h: Option<&Value>,
        s: Shape,
    ) -> Value {
        let all = self.gather_message(message);
        let mut ins = vec![&all[0], &all[1]];
        ins.extend(h);
        let out = shape::array(PrimitiveType::Bf16, &[s.rows, s.cols]);
        self.kernel(dequantize, &ins, out)
    }

    /// A `tpu_custom_call` of the kernel `body`, as JAX lowers a Pallas
    /// call: the body base64 in the backend config, layout passes asked for.
    fn kernel(&mut self, body: &str, operands: &[&Value], result: ShapeProto) -> Value {
        let body = base64::engine::general_purpose::STANDARD.encode(body);
        let config = format!(
            "{{\"custom_call_config\": {{\"body\": \"{body}\", \"serialization_format\": 1, \
             \"needs_layout_passes\": true}}}}"
        );
        // API_VERSION_ORIGINAL, what JAX gives a `tpu_custom_call`.
        self.b
            .custom_call("tpu_custom_call", operands, result, config.into_bytes(), 1)
    }
}

/// Rows a kernel's grid step takes: s8's tile on TPU (32 × 128), the least
/// that a block of codes may have.
pub(super) const ROWS_PER_STEP: i64 = 32;

/// The widest group of columns a grid step unrolls (chunks of 128 lanes):
/// Mosaic's compile time grows with the unrolled body, so a wider row is
/// split into groups of this many, each its own column of the grid. A
/// group's scales are a window of whole bf16 tiles in the slab.
const GROUP_COLS: i64 = 512;

/// The `stable_mosaic` version the text is written in: what jax 0.10.2
/// writes, which libtpu 0.0.42.1 reads.
const VERSION: u32 = 15;

/// The payload and plan the kernels are written for.
#[derive(Clone, Copy, Debug)]
pub(in crate::passes::quantize_collectives) struct Shape {
    /// An all-reduce (two-shot), a reduce-scatter or an all-gather.
    pub collective: Collective,
    /// Rows of the payload `[R, C]` on one device (an all-gather's result).
    pub rows: i64,
    /// Its last dimension, a multiple of 128.
    pub cols: i64,
    /// The group size P; R is a multiple of P · [`SLAB_LANES`].
    pub parts: i64,
    pub rotation: bool,
}

impl Shape {
    /// The columns a grid step takes: the row's whole width, or a group of
    /// [`GROUP_COLS`] where it splits into them.
    fn group(&self) -> i64 {
        if self.cols > GROUP_COLS && self.cols % GROUP_COLS == 0 {
            GROUP_COLS
        } else {
            self.cols
        }
    }
    /// The blocks of 64 a step takes, a group's rows of a scales slab.
    fn blocks(&self) -> i64 {
        self.group() / 64
    }
    /// The chunks of 128 lanes a step unrolls.
    fn chunks(&self) -> i64 {
        self.group() / 128
    }
    /// The grid: column groups outer, row steps (of `rows`) inner, so a
    /// slab's window is every one of its steps in a row.
    fn grid(&self, rows: i64) -> [i64; 2] {
        [self.cols / self.group(), rows / ROWS_PER_STEP]
    }
}

/// The kernels' bodies, as text, per collective.
#[derive(Debug)]
pub(super) enum Steps {
    AllReduce {
        quantize: String,
        sum: String,
        dequantize: String,
    },
    /// Its sum writes the result.
    ReduceScatter { quantize: String, sum: String },
    /// A rank quantizes its m rows as one part of its own.
    AllGather {
        quantize: String,
        dequantize: String,
    },
}

impl Steps {
    /// The bodies in the order they run.
    #[cfg(test)]
    pub(super) fn into_texts(self) -> Vec<String> {
        match self {
            Steps::AllReduce {
                quantize,
                sum,
                dequantize,
            } => vec![quantize, sum, dequantize],
            Steps::ReduceScatter { quantize, sum } => vec![quantize, sum],
            Steps::AllGather {
                quantize,
                dequantize,
            } => vec![quantize, dequantize],
        }
    }
}

/// The 128 × 128 matrix the kernels rotate by: two 64-blocks' Hadamard
/// matrices (entries ±1/8, the norm folded in) on the diagonal. Row-major.
pub(super) fn rotation_matrix() -> Vec<f32> {
    (0..128 * 128)
        .map(|i| {
            let (k, j) = (i / 128, i % 128);
            if k / 64 == j / 64 {
                hadamard_sign(k % 64, j % 64) / 8.0
            } else {
                0.0
            }
        })
        .collect()
}

pub(super) fn kernels(shape: Shape) -> Steps {
    match shape.collective {
        Collective::AllGather => Steps::AllGather {
            quantize: quantize_kernel(Shape {
                rows: shape.rows / shape.parts,
                parts: 1,
                ..shape
            }),
            dequantize: dequantize_kernel(shape),
        },
        Collective::ReduceScatter => Steps::ReduceScatter {
            quantize: quantize_kernel(shape),
            sum: sum_kernel(shape),
        },
        // (`takes_plan` admits no all-to-all.)
        Collective::AllReduce | Collective::AllToAll => Steps::AllReduce {
            quantize: quantize_kernel(shape),
            sum: sum_kernel(shape),
            dequantize: dequantize_kernel(shape),
        },
    }
}

/// An SSA value and its type.
#[derive(Clone)]
struct V {
    name: String,
    ty: String,
}

fn vector(dims: &[i64], ty: &str) -> String {
    let dims: Vec<String> = dims.iter().map(i64::to_string).collect();
    format!("vector<{}x{ty}>", dims.join("x"))
}

fn memref(dims: &[i64], ty: &str) -> String {
    let dims: Vec<String> = dims.iter().map(i64::to_string).collect();
    format!("memref<{}x{ty}, #tpu.memory_space<vmem>>", dims.join("x"))
}

/// One kernel's body, written op by op in MLIR's generic form.
struct Body {
    text: String,
    next: usize,
    args: Vec<V>,
}

impl Body {
    /// A body whose block takes the grid's two indices (the column group,
    /// then the row step: [`ROW_STEP`]) and `refs` (memref types).
    fn new(refs: &[String]) -> Self {
        let types = ["i32".to_string(), "i32".to_string()];
        let args = types
            .iter()
            .chain(refs)
            .enumerate()
            .map(|(k, ty)| V {
                name: format!("%arg{k}"),
                ty: ty.clone(),
            })
            .collect();
        Body {
            text: String::new(),
            next: 0,
            args,
        }
    }

    fn arg(&self, k: usize) -> V {
        self.args[k + 2].clone()
    }

    /// `op` on `operands` with `attrs`, of type `result` ("" for none).
    fn op(&mut self, op: &str, operands: &[&V], attrs: &str, result: &str) -> V {
        let names: Vec<&str> = operands.iter().map(|v| v.name.as_str()).collect();
        let types: Vec<&str> = operands.iter().map(|v| v.ty.as_str()).collect();
        let attrs = if attrs.is_empty() {
            String::new()
        } else {
            format!(" {{{attrs}}}")
        };
        let (lhs, out) = if result.is_empty() {
            (String::new(), "()".to_string())
        } else {
            self.next += 1;
            (format!("%{} = ", self.next - 1), result.to_string())
        };
        let _ = writeln!(
            self.text,
            "    {lhs}\"stable_mosaic.{op}\"({}){attrs} : ({}) -> {out}",
            names.join(", "),
            types.join(", ")
        );
        V {
            name: lhs.trim_end_matches(" = ").to_string(),
            ty: out,
        }
    }

    fn index(&mut self, i: i64) -> V {
        self.op(
            "arith.constant",
            &[],
            &format!("value = {i} : index"),
            "index",
        )
    }

    fn i32(&mut self, v: i64) -> V {
        self.op("arith.constant", &[], &format!("value = {v} : i32"), "i32")
    }

    fn f32(&mut self, v: f32) -> V {
        let attr = format!("value = 0x{:08X} : f32", v.to_bits());
        self.op("arith.constant", &[], &attr, "f32")
    }

    fn splat(&mut self, scalar: &V, dims: &[i64]) -> V {
        let ty = vector(dims, &scalar.ty);
        self.op("vector.broadcast", &[scalar], "", &ty)
    }

    /// `dims` of `ty` from `memref` at `at` (a vector of the same rank as
    /// the memref, then cast to `shape`).
    fn load(&mut self, memref: &V, at: &[i64], dims: &[i64], shape: &[i64], ty: &str) -> V {
        let idx: Vec<V> = at.iter().map(|&i| self.index(i)).collect();
        let mut operands = vec![memref];
        operands.extend(idx.iter());
        let v = self.op("vector.load", &operands, "", &vector(dims, ty));
        self.op("vector.shape_cast", &[&v], "", &vector(shape, ty))
    }

    fn store(&mut self, value: &V, memref: &V, at: &[i64]) {
        let idx: Vec<V> = at.iter().map(|&i| self.index(i)).collect();
        let mut operands = vec![value, memref];
        operands.extend(idx.iter());
        let attrs = format!(
            "add = false, operandSegmentSizes = array<i32: 1, 1, {}, 0>, strides = array<i32>",
            at.len()
        );
        self.op("tpu.vector_store", &operands, &attrs, "");
    }

    fn unary(&mut self, op: &str, x: &V, ty: &str) -> V {
        let ty = retype(&x.ty, ty);
        self.op(op, &[x], "", &ty)
    }

    fn float(&mut self, op: &str, a: &V, b: &V) -> V {
        let ty = a.ty.clone();
        self.op(op, &[a, b], "fastmath = #arith.fastmath<none>", &ty)
    }

    fn int(&mut self, op: &str, a: &V, b: &V) -> V {
        let ty = a.ty.clone();
        self.op(op, &[a, b], "", &ty)
    }

    /// i32 lane numbers `[.., n]`: `tpu.iota` along the last dimension.
    fn lanes(&mut self, dims: &[i64]) -> V {
        let attr = format!("dimensions = array<i32: {}>", dims.len() - 1);
        self.op("tpu.iota", &[], &attr, &vector(dims, "i32"))
    }

    /// A 2-D f32 vector transposed.
    fn transpose(&mut self, x: &V, dims: [i64; 2]) -> V {
        let ty = vector(&[dims[1], dims[0]], "f32");
        self.op("tpu.transpose", &[x], "permutation = array<i64: 1, 0>", &ty)
    }

    /// `x` rotated along its lanes by `shift` (i32): lane i to lane i + shift.
    fn rotate(&mut self, x: &V, shift: &V) -> V {
        let ty = x.ty.clone();
        self.op(
            "tpu.dynamic_rotate",
            &[x, shift],
            "dimension = 1 : si32",
            &ty,
        )
    }

    /// `arith.cmpi` of `a` and `b` by MLIR's predicate number (0 eq, 2 slt,
    /// 5 sge), an i1 of their shape.
    fn cmpi(&mut self, predicate: i64, a: &V, b: &V) -> V {
        let ty = retype(&a.ty, "i1");
        self.op(
            "arith.cmpi",
            &[a, b],
            &format!("predicate = {predicate} : i64"),
            &ty,
        )
    }

    /// i32 index arithmetic (`arith.addi`, `subi`, `muli`), no overflow
    /// flags.
    fn index_op(&mut self, op: &str, a: &V, b: &V) -> V {
        self.op(op, &[a, b], "overflowFlags = #arith.overflow<none>", "i32")
    }

    fn select(&mut self, pred: &V, a: &V, b: &V) -> V {
        let ty = a.ty.clone();
        self.op("arith.select", &[pred, a, b], "", &ty)
    }

    /// `acc + lhs·rhs`.
    fn matmul(&mut self, lhs: &V, rhs: &V, acc: &V) -> V {
        let attrs = "dimension_numbers = #tpu.dot_dimension_numbers<[1], [0], [0], [1], \
                     [0, 0, 1, 1], [], []>, transpose_lhs = false, transpose_lhs_hint = false, \
                     transpose_rhs = false";
        let ty = acc.ty.clone();
        self.op("tpu.matmul", &[lhs, rhs, acc], attrs, &ty)
    }

    /// Column `k` of `x` (`[rows, n]`), broadcast to `[rows, 128]`.
    fn column(&mut self, x: &V, k: i64, rows: i64) -> V {
        let attrs = format!("offsets = [0, {k}], sizes = [{rows}, 1], strides = [1, 1]");
        let c = self.op(
            "vector.extract_strided_slice",
            &[x],
            &attrs,
            &vector(&[rows, 1], "f32"),
        );
        self.op("vector.broadcast", &[&c], "", &vector(&[rows, 128], "f32"))
    }

    /// The kernel function around the body.
    fn finish(mut self, name: &str, grid: [i64; 2], windows: &[(Vec<i64>, Transform)]) -> String {
        self.op("func.return", &[], "", "");
        let arg_decls: Vec<String> = self
            .args
            .iter()
            .map(|a| format!("{}: {}", a.name, a.ty))
            .collect();
        let arg_types: Vec<&str> = self.args.iter().map(|a| a.ty.as_str()).collect();
        let params: Vec<String> = windows
            .iter()
            .enumerate()
            .map(|(k, (bounds, _))| {
                let b: Vec<String> = bounds.iter().map(i64::to_string).collect();
                format!(
                    "{{transform_indices = @transform_{k}, window_bounds = array<i64: {}>}}",
                    b.join(", ")
                )
            })
            .collect();
        let mut out = format!("module attributes {{stable_mosaic.version = {VERSION} : i64}} {{\n");
        let _ = write!(
            out,
            "  \"stable_mosaic.func.func\"() ({{\n  ^bb0({}):\n{}  }}) {{dimension_semantics = \
             [#tpu.dimension_semantics<arbitrary>, #tpu.dimension_semantics<arbitrary>], \
             function_type = ({}) -> (), iteration_bounds = array<i64: {}, {}>, scalar_prefetch = 0 : i64, scratch_operands = 0 : i64, \
             sym_name = \"{name}\", tpu.core_type = #tpu.core_type<tc>, window_params = [{}]}} : \
             () -> ()\n",
            arg_decls.join(", "),
            self.text,
            arg_types.join(", "),
            grid[0],
            grid[1],
            params.join(", ")
        );
        for (k, (bounds, transform)) in windows.iter().enumerate() {
            out.push_str(&transform_func(k, bounds.len(), *transform));
        }
        out.push_str("}\n");
        out
    }
}

/// `ty` with its element type replaced by `element` (a vector's), or
/// `element` for a scalar.
fn retype(ty: &str, element: &str) -> String {
    match ty.rfind('x') {
        Some(k) if ty.starts_with("vector<") => format!("{}x{element}>", &ty[..k]),
        _ => element.to_string(),
    }
}

/// Which block of its operand the grid step (`g`, `i`) takes: column
/// group `g`, row step `i`.
#[derive(Clone, Copy)]
enum Transform {
    /// Of a 2-D operand: `(i, g)`.
    Rows,
    /// Of a 3-D one, its parts whole: `(0, i, g)`.
    MiddleRows,
    /// The whole operand: `(0, 0)`.
    Whole,
    /// Group `g`'s rows of the slab of step `i`'s destination, `per` steps
    /// to one: `(i / per, g, 0)`.
    Slab(i64),
}

/// The grid's index arguments in a body and in a transform function: the
/// column group, then the row step.
const GROUP: &str = "%arg0";
const ROW_STEP: &str = "%arg1";

fn transform_func(k: usize, rank: usize, transform: Transform) -> String {
    let mut ops =
        "    %0 = \"stable_mosaic.arith.constant\"() {value = 0 : i32} : () -> i32\n".to_string();
    let results: Vec<&str> = match transform {
        Transform::Rows => vec![ROW_STEP, GROUP],
        Transform::MiddleRows => vec!["%0", ROW_STEP, GROUP],
        Transform::Whole => vec!["%0"; rank],
        Transform::Slab(per) => {
            ops.push_str(&format!(
                "    %1 = \"stable_mosaic.arith.constant\"() {{value = {per} : i32}} : () -> i32\n    \
                 %2 = \"stable_mosaic.arith.divsi\"({ROW_STEP}, %1) : (i32, i32) -> i32\n"
            ));
            vec!["%2", GROUP, "%0"]
        }
    };
    debug_assert_eq!(results.len(), rank);
    let types = vec!["i32"; rank].join(", ");
    format!(
        "  \"stable_mosaic.func.func\"() ({{\n  ^bb0({GROUP}: i32, {ROW_STEP}: i32):\n{ops}    \
         \"stable_mosaic.func.return\"({}) : ({types}) -> ()\n  }}) {{function_type = (i32, i32) \
         -> ({types}), sym_name = \"transform_{k}\"}} : () -> ()\n",
        results.join(", ")
    )
}

/// Values a kernel computes with, made once at its top.
struct Common {
    /// i1 `[tm, 128]`: the lanes of the first block of each 128.
    low: V,
    high: V,
    /// f32 `[tm, 128]` zeros.
    zeros: V,
}

fn common(body: &mut Body) -> Common {
    let tm = ROWS_PER_STEP;
    let lanes = body.lanes(&[tm, 128]);
    let half = body.i32(64);
    let half = body.splat(&half, &[tm, 128]);
    let low = body.cmpi(2, &lanes, &half);
    let high = body.cmpi(5, &lanes, &half);
    let zero = body.f32(0.0);
    let zeros = body.splat(&zero, &[tm, 128]);
    Common { low, high, zeros }
}

/// f32 `[tm, 128]`, two blocks → s8 codes `[tm, 128]` and the two blocks'
/// bf16 scales `[tm, 1]` (the HLO emission's `quantize`, op for op).
/// The constants [`quantize`] reads, made once a kernel.
struct Limits {
    /// i32 `[tm, 128]`: the sign bit cleared.
    mask: V,
    /// i32 `[tm, 128]`: the absmax floor's bits.
    floors: V,
    /// i32 `[tm]`: the least i32, the neutral value Mosaic requires of a
    /// maximum's accumulator.
    least: V,
    /// i32 `[tm, 1]`: +Inf's bits.
    inf: V,
    /// f32 `[tm, 1]`: fl(1/127).
    inv: V,
    /// f32 `[tm, 128]`: 1, and the codes' bounds ±127.
    ones: V,
    hi: V,
    lo: V,
}

fn limits(body: &mut Body) -> Limits {
    let tm = ROWS_PER_STEP;
    let format = QuantFormat::Int8;
    let mask = body.i32(0x7fff_ffff);
    let mask = body.splat(&mask, &[tm, 128]);
    let floor = body.i32(absmax_floor(format).to_bits() as i64);
    let floors = body.splat(&floor, &[tm, 128]);
    let least = body.op(
        "arith.constant",
        &[],
        &format!("value = dense<{}> : {}", i32::MIN, vector(&[tm], "i32")),
        &vector(&[tm], "i32"),
    );
    let inf = body.i32(f32::INFINITY.to_bits() as i64);
    let inf = body.splat(&inf, &[tm, 1]);
    let inv = body.f32(inv_qmax(format));
    let inv = body.splat(&inv, &[tm, 1]);
    let one = body.f32(1.0);
    let ones = body.splat(&one, &[tm, 128]);
    let qmax = body.f32(format.qmax());
    let hi = body.splat(&qmax, &[tm, 128]);
    let lo = body.f32(-format.qmax());
    let lo = body.splat(&lo, &[tm, 128]);
    Limits {
        mask,
        floors,
        least,
        inf,
        inv,
        ones,
        hi,
        lo,
    }
}

fn quantize(body: &mut Body, c: &Common, k: &Limits, y: &V) -> (V, [V; 2]) {
    let tm = ROWS_PER_STEP;
    let bits = body.op("tpu.bitcast", &[y], "", &vector(&[tm, 128], "i32"));
    let magnitude = body.int("arith.andi", &bits, &k.mask);
    let mut scales = Vec::new();
    let mut wide = Vec::new();
    for half in [&c.low, &c.high] {
        // The floor is among the elements (the other block's lanes), so
        // the reduction may start from the least i32.
        let held = body.select(half, &magnitude, &k.floors);
        let largest = body.op(
            "vector.multi_reduction",
            &[&held, &k.least],
            "kind = #vector.kind<maxsi>, reduction_dims = array<i64: 1>",
            &vector(&[tm], "i32"),
        );
        let largest = body.op(
            "vector.shape_cast",
            &[&largest],
            "",
            &vector(&[tm, 1], "i32"),
        );
        let capped = body.int("arith.minsi", &largest, &k.inf);
        let absmax = body.op("tpu.bitcast", &[&capped], "", &vector(&[tm, 1], "f32"));
        let raw = body.float("arith.mulf", &absmax, &k.inv);
        let scale = body.unary("arith.truncf", &raw, "bf16");
        let back = body.unary("arith.extf", &scale, "f32");
        wide.push(body.op("vector.broadcast", &[&back], "", &vector(&[tm, 128], "f32")));
        scales.push(scale);
    }
    let scale = body.select(&c.low, &wide[0], &wide[1]);
    let recip = body.float("arith.divf", &k.ones, &scale);
    let ratio = body.float("arith.mulf", y, &recip);
    let rounded = body.op(
        "math.roundeven",
        &[&ratio],
        "fastmath = #arith.fastmath<none>",
        &ratio.ty,
    );
    let clamped = body.float("arith.maximumf", &rounded, &k.lo);
    let clamped = body.float("arith.minimumf", &clamped, &k.hi);
    let codes = body.unary("arith.fptosi", &clamped, "i8");
    let [a, b]: [V; 2] = scales.try_into().unwrap_or_else(|_| unreachable!());
    (codes, [a, b])
}

/// Where this grid step's rows begin in its destination's `m` rows (i32):
/// `(i mod m/tm)·tm`.
fn step_offset(body: &mut Body, m: i64) -> V {
    let per = m / ROWS_PER_STEP;
    if per == 1 {
        return body.i32(0);
    }
    let grid = V {
        name: ROW_STEP.into(),
        ty: "i32".into(),
    };
    let per = body.i32(per);
    let step = body.int("arith.remsi", &grid, &per);
    let tm = body.i32(ROWS_PER_STEP);
    body.index_op("arith.muli", &step, &tm)
}

/// A step's f32 scales `[tm, nb]` from its destination's slab (`slab`, a
/// `[1, nb, m]` window; `part` its first index): the step's lanes rotated
/// to the front, taken, transposed.
fn load_slab(body: &mut Body, slab: &V, part: i64, nb: i64, m: i64, at: &V) -> V {
    let tm = ROWS_PER_STEP;
    let s = body.load(slab, &[part, 0, 0], &[1, nb, m], &[nb, m], "bf16");
    let mut s = body.unary("arith.extf", &s, "f32");
    if m > tm {
        let lanes = body.i32(m);
        let back = body.index_op("arith.subi", &lanes, at);
        let shift = body.int("arith.remsi", &back, &lanes);
        s = body.rotate(&s, &shift);
        let attrs = format!("offsets = [0, 0], sizes = [{nb}, {tm}], strides = [1, 1]");
        s = body.op(
            "vector.extract_strided_slice",
            &[&s],
            &attrs,
            &vector(&[nb, tm], "f32"),
        );
    }
    body.transpose(&s, [nb, tm])
}

/// A step's scales (a pair of bf16 `[tm, 1]` columns a chunk) into its
/// lanes of its destination's `[1, nb, m]` slab window: the step's scales
/// as rows, padded to m, transposed, rotated to the step's lanes, the
/// other steps' lanes kept.
fn store_slab(body: &mut Body, slab: &V, nb: i64, m: i64, at: &V, pairs: &[[V; 2]]) {
    let tm = ROWS_PER_STEP;
    let lane = body.lanes(&[tm, nb]);
    let zero = body.f32(0.0);
    let mut rows = body.splat(&zero, &[tm, nb]);
    for (k, column) in pairs.iter().flatten().enumerate() {
        let k = body.i32(k as i64);
        let k = body.splat(&k, &[tm, nb]);
        let here = body.cmpi(0, &lane, &k);
        let c = body.unary("arith.extf", column, "f32");
        let c = body.op("vector.broadcast", &[&c], "", &vector(&[tm, nb], "f32"));
        rows = body.select(&here, &c, &rows);
    }
    let mut t;
    if m > tm {
        let pad = body.splat(&zero, &[m - tm, nb]);
        let ty = vector(&[m, nb], "f32");
        let all = body.op(
            "tpu.concatenate",
            &[&rows, &pad],
            "dimension = 0 : i32",
            &ty,
        );
        t = body.transpose(&all, [m, nb]);
        t = body.rotate(&t, at);
        let lanes = body.lanes(&[nb, m]);
        let from = body.splat(at, &[nb, m]);
        let tm_c = body.i32(tm);
        let end = body.index_op("arith.addi", at, &tm_c);
        let to = body.splat(&end, &[nb, m]);
        let ge = body.cmpi(5, &lanes, &from);
        let lt = body.cmpi(2, &lanes, &to);
        let mine = body.int("arith.andi", &ge, &lt);
        let old = body.load(slab, &[0, 0, 0], &[1, nb, m], &[nb, m], "bf16");
        let old = body.unary("arith.extf", &old, "f32");
        t = body.select(&mine, &t, &old);
    } else {
        t = body.transpose(&rows, [tm, nb]);
    }
    let t = body.unary("arith.truncf", &t, "bf16");
    let t = body.op("vector.shape_cast", &[&t], "", &vector(&[1, nb, m], "bf16"));
    body.store(&t, slab, &[0, 0, 0]);
}

/// Chunk `j`'s scales `[tm, 128]` from a step's f32 scales `[tm, nb]`.
fn chunk_scales(body: &mut Body, c: &Common, scales: &V, j: i64) -> V {
    let a = body.column(scales, 2 * j, ROWS_PER_STEP);
    let b = body.column(scales, 2 * j + 1, ROWS_PER_STEP);
    body.select(&c.low, &a, &b)
}

/// `y` (`[rows, 128]` f32, two blocks) with each block rotated by its own
/// product, the other block's lanes zeroed: in one product of both a
/// NaN's zero terms (NaN × 0) would spill into the other block.
fn rotated(body: &mut Body, c: &Common, y: &V, h: &V) -> V {
    let low = body.select(&c.low, y, &c.zeros);
    let high = body.select(&c.low, &c.zeros, y);
    let low = body.matmul(&low, h, &c.zeros);
    let high = body.matmul(&high, h, &c.zeros);
    body.select(&c.low, &low, &high)
}

fn quantize_kernel(s: Shape) -> String {
    let tm = ROWS_PER_STEP;
    let (width, nb, m) = (s.group(), s.blocks(), s.rows / s.parts);
    let mut refs = vec![memref(&[tm, width], "bf16")];
    if s.rotation {
        refs.push(memref(&[128, 128], "f32"));
    }
    refs.push(memref(&[tm, width], "i8"));
    refs.push(memref(&[1, nb, m], "bf16"));
    let mut body = Body::new(&refs);
    let c = common(&mut body);
    let lim = limits(&mut body);
    let at = step_offset(&mut body, m);
    let x = body.arg(0);
    let h = s.rotation.then(|| {
        let h = body.arg(1);
        body.load(&h, &[0, 0], &[128, 128], &[128, 128], "f32")
    });
    let out = usize::from(s.rotation) + 1;
    let (codes, scales) = (body.arg(out), body.arg(out + 1));
    let mut pairs = Vec::new();
    for j in 0..s.chunks() {
        let chunk = body.load(&x, &[0, 128 * j], &[tm, 128], &[tm, 128], "bf16");
        let mut y = body.unary("arith.extf", &chunk, "f32");
        if let Some(h) = &h {
            y = rotated(&mut body, &c, &y, h);
        }
        let (q, pair) = quantize(&mut body, &c, &lim, &y);
        body.store(&q, &codes, &[0, 128 * j]);
        pairs.push(pair);
    }
    store_slab(&mut body, &scales, nb, m, &at, &pairs);
    let mut windows = vec![(vec![tm, width], Transform::Rows)];
    if s.rotation {
        windows.push((vec![128, 128], Transform::Whole));
    }
    windows.push((vec![tm, width], Transform::Rows));
    windows.push((vec![1, nb, m], Transform::Slab(m / tm)));
    body.finish("equarx_quantize", s.grid(s.rows), &windows)
}

/// The exchange's sum of what arrived, requantized for the gather, or for
/// a reduce-scatter rotated back (where the plan rotates) and written as
/// the bf16 result.
fn sum_kernel(s: Shape) -> String {
    let tm = ROWS_PER_STEP;
    let (width, nb, p) = (s.group(), s.blocks(), s.parts);
    let m = s.rows / p;
    let scatter = s.collective == Collective::ReduceScatter;
    let mut refs = vec![memref(&[p, tm, width], "i8"), memref(&[p, nb, m], "bf16")];
    if scatter {
        if s.rotation {
            refs.push(memref(&[128, 128], "f32"));
        }
        refs.push(memref(&[tm, width], "bf16"));
    } else {
        refs.push(memref(&[tm, width], "i8"));
        refs.push(memref(&[1, nb, m], "bf16"));
    }
    let mut body = Body::new(&refs);
    let c = common(&mut body);
    // The gather's requantize needs the codes' limits; a reduce-scatter's
    // sum is the result.
    let lim = (!scatter).then(|| limits(&mut body));
    let at = step_offset(&mut body, m);
    let (codes_in, scales_in) = (body.arg(0), body.arg(1));
    let h = (scatter && s.rotation).then(|| {
        let h = body.arg(2);
        body.load(&h, &[0, 0], &[128, 128], &[128, 128], "f32")
    });
    // What it writes: the codes (then their slab), or the result.
    let out = body.arg(2 + usize::from(h.is_some()));
    let part_scales: Vec<V> = (0..p)
        .map(|k| load_slab(&mut body, &scales_in, k, nb, m, &at))
        .collect();
    let mut pairs = Vec::new();
    for j in 0..s.chunks() {
        let mut parts: Vec<V> = (0..p)
            .map(|k| {
                let q = body.load(&codes_in, &[k, 0, 128 * j], &[1, tm, 128], &[tm, 128], "i8");
                let q = body.unary("arith.sitofp", &q, "f32");
                let scale = chunk_scales(&mut body, &c, &part_scales[k as usize], j);
                body.float("arith.mulf", &q, &scale)
            })
            .collect();
        // Halves added, the odd one out carried (`Emitter::exchange`).
        while parts.len() > 1 {
            let h = parts.len() / 2;
            let mut sums: Vec<V> = (0..h)
                .map(|k| body.float("arith.addf", &parts[k], &parts[k + h]))
                .collect();
            sums.extend(parts.get(2 * h).cloned());
            parts = sums;
        }
        let y = match &lim {
            Some(lim) => {
                let (q, pair) = quantize(&mut body, &c, lim, &parts[0]);
                pairs.push(pair);
                q
            }
            None => {
                let y = match &h {
                    Some(h) => rotated(&mut body, &c, &parts[0], h),
                    None => parts[0].clone(),
                };
                body.unary("arith.truncf", &y, "bf16")
            }
        };
        body.store(&y, &out, &[0, 128 * j]);
    }
    // A destination's scales are its whole slab: one, every step.
    let mut windows = vec![
        (vec![p, tm, width], Transform::MiddleRows),
        (vec![p, nb, m], Transform::Slab(m / tm)),
    ];
    if h.is_some() {
        windows.push((vec![128, 128], Transform::Whole));
    }
    windows.push((vec![tm, width], Transform::Rows));
    if scatter {
        return body.finish("equarx_sum_scatter", s.grid(m), &windows);
    }
    let slab = body.arg(3);
    store_slab(&mut body, &slab, nb, m, &at, &pairs);
    windows.push((vec![1, nb, m], Transform::Slab(m / tm)));
    body.finish("equarx_sum", s.grid(m), &windows)
}

fn dequantize_kernel(s: Shape) -> String {
    let tm = ROWS_PER_STEP;
    let (width, nb, m) = (s.group(), s.blocks(), s.rows / s.parts);
    let mut refs = vec![memref(&[tm, width], "i8"), memref(&[1, nb, m], "bf16")];
    if s.rotation {
        refs.push(memref(&[128, 128], "f32"));
    }
    refs.push(memref(&[tm, width], "bf16"));
    let mut body = Body::new(&refs);
    let c = common(&mut body);
    let (codes, scales_in) = (body.arg(0), body.arg(1));
    let h = s.rotation.then(|| {
        let h = body.arg(2);
        body.load(&h, &[0, 0], &[128, 128], &[128, 128], "f32")
    });
    let out = body.arg(if s.rotation { 3 } else { 2 });
    let at = step_offset(&mut body, m);
    let scales = load_slab(&mut body, &scales_in, 0, nb, m, &at);
    for j in 0..s.chunks() {
        let q = body.load(&codes, &[0, 128 * j], &[tm, 128], &[tm, 128], "i8");
        let mut q = body.unary("arith.sitofp", &q, "f32");
        if let Some(h) = &h {
            // (H·q)·scale: the integer sums are exact.
            q = body.matmul(&q, h, &c.zeros);
        }
        let scale = chunk_scales(&mut body, &c, &scales, j);
        let y = body.float("arith.mulf", &q, &scale);
        let y = body.unary("arith.truncf", &y, "bf16");
        body.store(&y, &out, &[0, 128 * j]);
    }
    let mut windows = vec![
        (vec![tm, width], Transform::Rows),
        (vec![1, nb, m], Transform::Slab(m / tm)),
    ];
    if s.rotation {
        windows.push((vec![128, 128], Transform::Whole));
    }
    windows.push((vec![tm, width], Transform::Rows));
    body.finish("equarx_dequantize", s.grid(s.rows), &windows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_is_defined_before_use_and_the_windows_match_the_arguments() {
        for rotation in [false, true] {
            // 640 columns are one step's; 1024 two groups of the grid.
            let texts: Vec<String> = [
                (Collective::AllReduce, 256, 640),
                (Collective::ReduceScatter, 256, 1024),
                (Collective::AllGather, 512, 1024),
                (Collective::AllReduce, 256, 1024),
            ]
            .into_iter()
            .flat_map(|(collective, rows, cols)| {
                kernels(Shape {
                    collective,
                    rows,
                    cols,
                    parts: 4,
                    rotation,
                })
                .into_texts()
            })
            .collect();
            assert_eq!(texts.len(), 10);
            for text in &texts {
                let kernel = text.split("\"stable_mosaic.func.func\"").nth(1).unwrap();
                let mut defined = std::collections::HashSet::new();
                for line in kernel.lines() {
                    let line = line.trim();
                    if let Some((lhs, _)) = line.split_once(" = \"") {
                        defined.insert(lhs.to_string());
                    }
                    if let Some(args) = line.split_once("\"(").map(|(_, r)| r) {
                        let args = args.split(')').next().unwrap();
                        for a in args
                            .split(", ")
                            .filter(|a| a.starts_with('%') && !a.starts_with("%arg"))
                        {
                            assert!(defined.contains(a), "{a} used before it is defined: {line}");
                        }
                    }
                }
                let params = text.matches("transform_indices = @transform_").count();
                let args = kernel
                    .split("^bb0(")
                    .nth(1)
                    .unwrap()
                    .split("):")
                    .next()
                    .unwrap();
                // The grid's two indices, then a window a memref.
                assert_eq!(params + 2, args.matches("%arg").count(), "{args}");
                assert!(text.contains("iteration_bounds = array<i64: "), "{text}");
            }
        }
    }

    #[test]
    fn the_matrix_rotates_each_block_of_64_alone() {
        let h = rotation_matrix();
        assert_eq!(h[0], 0.125);
        assert_eq!(h[64], 0.0); // row 0, column 64: the other block
        assert_eq!(h[64 * 128 + 64], 0.125);
        assert_eq!(h[128 + 1], -0.125); // H[1][1] = -1
    }
}
