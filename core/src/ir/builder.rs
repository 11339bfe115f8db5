//! Emits new instructions into a computation, with result shapes (and
//! layouts) filled in by [`super::infer`].
//!
//! Instructions are collected in emission order (operands before users) and
//! handed back by [`Builder::finish`], for the caller to place (see
//! [`super::Edits`]).
//! A builder never panics on a malformed request: the first inconsistency is
//! remembered and returned when the instructions are inserted.

use super::groups::ReplicaGroups;
use super::opcode::Opcode;
use super::{CompId, InstrId, Module, infer, shape};
use crate::proto::hlo_instruction_proto::{ReplicaGroupList, SliceDimensions};
use crate::proto::{
    CollectiveDeviceListProto, DotDimensionNumbers, HloComputationProto, HloInstructionProto,
    LayoutProto, LiteralProto, OpMetadata, PaddingConfig, PrecisionConfig, PrimitiveType,
    ProgramShapeProto, ReplicaGroup, ShapeProto, SourceTarget,
    padding_config::PaddingConfigDimension, precision_config::Precision,
};

/// An emitted (or existing) instruction and its shape.
#[derive(Clone, Debug)]
pub struct Value {
    pub id: InstrId,
    pub shape: ShapeProto,
}

impl Value {
    pub fn dims(&self) -> &[i64] {
        &self.shape.dimensions
    }

    pub fn element_type(&self) -> i32 {
        self.shape.element_type
    }
}

pub struct Builder<'m> {
    module: &'m mut Module,
    comp: CompId,
    out: Vec<HloInstructionProto>,
    metadata: Option<OpMetadata>,
    error: Option<String>,
    /// Every array of rank 2 or more it makes gets XLA:TPU's tiles
    /// ([`Builder::tile_for_tpu`]).
    tpu_tiled: bool,
}

impl<'m> Builder<'m> {
    /// A builder for computation `comp`; every instruction gets `metadata`.
    pub fn new(module: &'m mut Module, comp: CompId, metadata: Option<OpMetadata>) -> Self {
        Builder {
            module,
            comp,
            // A rewrite emits about a hundred instructions: room for them at once.
            out: Vec::with_capacity(128),
            metadata,
            error: None,
            tpu_tiled: false,
        }
    }

    /// While on, every array of rank 2 or more this builder makes is laid
    /// out row-major with XLA:TPU's tiles ([`shape::tile_for_tpu`]), and a
    /// custom call holds its operands to the layouts they have: past
    /// libtpu's layout assignment a Mosaic kernel's operands, results and
    /// the collectives between them must carry them, and so must what a
    /// loop fusion there holds (untiled, libtpu aborts on a `CHECK`).
    /// Returns whether it was on, so a caller can put it back. The
    /// computations it builds ([`Builder::computation`]) are tiled alike.
    pub fn tile_for_tpu(&mut self, on: bool) -> bool {
        std::mem::replace(&mut self.tpu_tiled, on)
    }

    /// Whether what this builder makes is tiled for XLA:TPU
    /// ([`Builder::tile_for_tpu`]).
    pub fn tiled_for_tpu(&self) -> bool {
        self.tpu_tiled
    }

    pub fn fresh_channel_id(&mut self) -> i64 {
        self.module.fresh_channel_id()
    }

    /// Builds a new computation `name(params...)` with `f`, placed before
    /// the one this builder emits into (callees come first). `f` gets a
    /// builder for the new computation and its parameters, and returns its
    /// root. The new instructions carry this builder's metadata.
    pub fn computation(
        &mut self,
        name: &str,
        params: &[ShapeProto],
        f: impl FnOnce(&mut Builder<'_>, Vec<Value>) -> Value,
    ) -> CompId {
        let (comp, error) = build_computation(
            self.module,
            name,
            params,
            Some(self.comp),
            self.metadata.clone(),
            self.tpu_tiled,
            f,
        );
        if let Some(e) = error {
            self.error.get_or_insert(e);
        }
        comp
    }

    /// Records an inconsistency met while emitting (the first one is what
    /// [`Builder::finish`] reports): for emitters that find an input they
    /// cannot handle, so that the rewrite fails with the reason instead of
    /// emitting something wrong.
    pub fn fail(&mut self, message: impl Into<String>) {
        self.error.get_or_insert_with(|| message.into());
    }

    /// The instructions emitted so far, operands before users.
    pub fn instructions(&self) -> &[HloInstructionProto] {
        &self.out
    }

    /// The module it emits into (the computations it has added included).
    pub fn module(&self) -> &Module {
        self.module
    }

    /// How many instructions have been emitted so far.
    pub fn len(&self) -> usize {
        self.out.len()
    }

    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    /// The emitted instructions, operands before users; the first
    /// inconsistency met while emitting is the error.
    pub fn finish(self) -> Result<Vec<HloInstructionProto>, String> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.out),
        }
    }

    /// [`Builder::finish`] without the emitted instructions that neither
    /// `keep` nor any other kept instruction reads (what a reshape folded
    /// away, a constant no longer needed). Emitted ops have no side effects
    /// but the collectives, and every collective is read.
    pub fn finish_keeping(self, keep: &[InstrId]) -> Result<Vec<HloInstructionProto>, String> {
        let out = self.finish()?;
        let mut live: rustc_hash::FxHashSet<i64> = keep.iter().map(|k| k.0).collect();
        for i in out.iter().rev() {
            if live.contains(&i.id) {
                live.extend(i.operand_ids.iter().copied());
            }
        }
        Ok(out.into_iter().filter(|i| live.contains(&i.id)).collect())
    }

    /// Adds `instr` (opcode and attributes set; shape set where the result
    /// type or dimensions are not implied by the operands).
    fn add(&mut self, instr: HloInstructionProto, operands: &[&Value]) -> Value {
        let base = instr.opcode.replace('-', "_");
        self.add_named(instr, operands, &base)
    }

    fn add_named(
        &mut self,
        mut instr: HloInstructionProto,
        operands: &[&Value],
        base: &str,
    ) -> Value {
        instr.operand_ids = operands.iter().map(|v| v.id.0).collect();
        instr.id = self.module.fresh_instr_id(self.comp).0;
        instr.name = self.module.fresh_name(base);
        if instr.metadata.is_none() {
            instr.metadata = self.metadata.clone();
        }
        let shapes: Vec<&ShapeProto> = operands.iter().map(|v| &v.shape).collect();
        let shape = match infer::expected_shape(&instr, &shapes) {
            // A declared shape that agrees with the inferred one keeps its
            // layout (results that must match an existing instruction's).
            Ok(Some(s))
                if instr
                    .shape
                    .as_ref()
                    .is_some_and(|d| shape::compatible(d, &s) && d.layout.is_some()) =>
            {
                instr.shape.clone().unwrap_or(s)
            }
            Ok(Some(mut s)) => {
                with_layouts(&mut s);
                s
            }
            Ok(None) => instr.shape.clone().unwrap_or_default(),
            Err(e) => {
                self.error
                    .get_or_insert_with(|| format!("building {}: {e}", instr.opcode));
                instr.shape.clone().unwrap_or_default()
            }
        };
        let mut shape = shape;
        if self.tpu_tiled {
            shape::tile_for_tpu(&mut shape);
        }
        instr.shape = Some(shape.clone());
        let id = InstrId(instr.id);
        self.out.push(instr);
        Value { id, shape }
    }

    fn op(opcode: Opcode) -> HloInstructionProto {
        HloInstructionProto {
            opcode: opcode.as_str().to_string(),
            ..Default::default()
        }
    }

    fn op_with_shape(opcode: Opcode, shape: ShapeProto) -> HloInstructionProto {
        HloInstructionProto {
            opcode: opcode.as_str().to_string(),
            shape: Some(shape),
            ..Default::default()
        }
    }

    pub fn constant(&mut self, mut literal: LiteralProto) -> Value {
        if self.tpu_tiled
            && let Some(s) = literal.shape.as_mut()
        {
            shape::tile_for_tpu(s);
        }
        let shape = literal.shape.clone().unwrap_or_default();
        let mut i = Self::op_with_shape(Opcode::Constant, shape);
        i.literal = Some(Box::new(literal));
        self.add(i, &[])
    }

    /// An f32 array constant of `dims` (row-major values).
    pub fn f32_array(&mut self, v: &[f32], dims: &[i64]) -> Value {
        self.constant(LiteralProto {
            shape: Some(shape::array(PrimitiveType::F32, dims)),
            f32s: v.to_vec(),
            ..Default::default()
        })
    }

    /// A bf16 array constant of `v` (each rounded to bf16).
    pub fn bf16_array(&mut self, v: &[f32], dims: &[i64]) -> Value {
        self.constant(LiteralProto {
            shape: Some(shape::array(PrimitiveType::Bf16, dims)),
            bf16s: v
                .iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect(),
            ..Default::default()
        })
    }

    pub fn f32_scalar(&mut self, v: f32) -> Value {
        self.constant(LiteralProto {
            shape: Some(shape::scalar(PrimitiveType::F32)),
            f32s: vec![v],
            ..Default::default()
        })
    }

    pub fn s32_scalar(&mut self, v: i32) -> Value {
        self.s32_constant(&[v], shape::scalar(PrimitiveType::S32))
    }

    pub fn s8_scalar(&mut self, v: i8) -> Value {
        self.constant(LiteralProto {
            shape: Some(shape::scalar(PrimitiveType::S8)),
            s8s: vec![v as u8],
            ..Default::default()
        })
    }

    pub fn s8_array(&mut self, v: &[i8], dims: &[i64]) -> Value {
        self.constant(LiteralProto {
            shape: Some(shape::array(PrimitiveType::S8, dims)),
            s8s: v.iter().map(|&x| x as u8).collect(),
            ..Default::default()
        })
    }

    pub fn s32_array(&mut self, v: &[i32]) -> Value {
        self.s32_array_laid_out(v, shape::default_layout(1))
    }

    /// An s32 vector constant laid out as `layout` (a backend's own, past
    /// its layout assignment).
    pub fn s32_array_laid_out(&mut self, v: &[i32], layout: LayoutProto) -> Value {
        let mut shape = shape::array(PrimitiveType::S32, &[v.len() as i64]);
        shape.layout = Some(Box::new(layout));
        self.s32_constant(v, shape)
    }

    fn s32_constant(&mut self, v: &[i32], shape: ShapeProto) -> Value {
        self.constant(LiteralProto {
            shape: Some(shape),
            s32s: v.to_vec(),
            ..Default::default()
        })
    }

    /// A scalar zero of any array element type equarx emits.
    pub fn zero(&mut self, ty: PrimitiveType) -> Value {
        let mut lit = LiteralProto {
            shape: Some(shape::scalar(ty)),
            ..Default::default()
        };
        match ty {
            PrimitiveType::F32 => lit.f32s = vec![0.0],
            PrimitiveType::S32 => lit.s32s = vec![0],
            PrimitiveType::U32 => lit.u32s = vec![0],
            PrimitiveType::S8 => lit.s8s = vec![0],
            PrimitiveType::U16 => lit.u16s = vec![0, 0],
            PrimitiveType::Bf16 => lit.bf16s = vec![0, 0],
            PrimitiveType::F16 => lit.f16s = vec![0, 0],
            PrimitiveType::Pred => lit.preds = vec![false],
            other => {
                self.error
                    .get_or_insert_with(|| format!("no zero constant for {other:?}"));
            }
        }
        self.constant(lit)
    }

    /// Adds a copy of `proto` (an existing instruction's attributes) with new
    /// operands and shape; id and name are fresh.
    pub fn clone_with(
        &mut self,
        proto: &HloInstructionProto,
        operands: &[&Value],
        shape: ShapeProto,
    ) -> Value {
        let mut i = proto.clone();
        i.shape = Some(shape);
        i.control_predecessor_ids.clear();
        self.add_named(i, operands, &proto.name)
    }

    /// `convert` whose result is exactly `result` (type, dims and layout).
    pub fn convert_to(&mut self, x: &Value, result: &ShapeProto) -> Value {
        self.add(Self::op_with_shape(Opcode::Convert, result.clone()), &[x])
    }

    /// `copy` of `x` into `result`'s layout (its dims and type are `x`'s).
    pub fn copy_to(&mut self, x: &Value, result: &ShapeProto) -> Value {
        self.add(Self::op_with_shape(Opcode::Copy, result.clone()), &[x])
    }

    /// `bitcast` of `x` to `result`: the same bytes seen as another array,
    /// which only a module past layout assignment holds, and only where
    /// both layouts place every element at the same byte.
    pub fn bitcast_to(&mut self, x: &Value, result: &ShapeProto) -> Value {
        self.add(Self::op_with_shape(Opcode::Bitcast, result.clone()), &[x])
    }

    /// `reshape` whose result is exactly `result` (type, dims and layout).
    pub fn reshape_to(&mut self, x: &Value, result: &ShapeProto) -> Value {
        self.add(Self::op_with_shape(Opcode::Reshape, result.clone()), &[x])
    }

    pub fn convert(&mut self, x: &Value, ty: PrimitiveType) -> Value {
        self.add(
            Self::op_with_shape(Opcode::Convert, shape::scalar(ty)),
            &[x],
        )
    }

    pub fn bitcast_convert(&mut self, x: &Value, ty: PrimitiveType) -> Value {
        self.add(
            Self::op_with_shape(Opcode::BitcastConvert, shape::scalar(ty)),
            &[x],
        )
    }

    /// `reshape(x)` to `dims`: `x` itself when it has them already, and a
    /// reshape of what `x` reshapes when `x` is a reshape this builder made
    /// (the one left unused is dropped by [`Builder::finish_keeping`]).
    pub fn reshape(&mut self, x: &Value, dims: &[i64]) -> Value {
        if x.dims() == dims && x.shape.layout == shape::array(PrimitiveType::F32, dims).layout {
            return x.clone();
        }
        let source = self.reshaped_source(x);
        let x = source.as_ref().unwrap_or(x);
        if x.dims() == dims {
            return x.clone();
        }
        self.add(
            Self::op_with_shape(Opcode::Reshape, shape::with_dims(&x.shape, dims)),
            &[x],
        )
    }

    /// What `x` reshapes, when `x` is a reshape this builder made.
    pub fn reshaped_source(&self, x: &Value) -> Option<Value> {
        self.out
            .iter()
            .rev()
            .find(|i| i.id == x.id.0)
            .filter(|i| Opcode::of(i) == Some(Opcode::Reshape))
            .and_then(|i| i.operand_ids.first().copied())
            .and_then(|o| {
                self.out
                    .iter()
                    .find(|i| i.id == o)
                    .or_else(|| self.module.computation(self.comp)?.get(InstrId(o)))
            })
            .and_then(|i| {
                i.shape.clone().map(|s| Value {
                    id: InstrId(i.id),
                    shape: s,
                })
            })
    }

    /// `transpose(x)`: output dimension i is operand dimension `perm[i]`.
    pub fn transpose(&mut self, x: &Value, perm: &[i64]) -> Value {
        let dims: Vec<i64> = perm.iter().map(|&p| x.dims()[p as usize]).collect();
        let mut i = Self::op_with_shape(Opcode::Transpose, shape::with_dims(&x.shape, &dims));
        i.dimensions = perm.to_vec();
        self.add(i, &[x])
    }

    /// Broadcast `x` into `dims`; operand dim i becomes output dim `map[i]`.
    pub fn broadcast(&mut self, x: &Value, dims: &[i64], map: &[i64]) -> Value {
        let mut i = Self::op_with_shape(Opcode::Broadcast, shape::with_dims(&x.shape, dims));
        i.dimensions = map.to_vec();
        self.add(i, &[x])
    }

    pub fn unary(&mut self, opcode: Opcode, x: &Value) -> Value {
        self.add(Self::op(opcode), &[x])
    }

    pub fn binary(&mut self, opcode: Opcode, a: &Value, b: &Value) -> Value {
        self.add(Self::op(opcode), &[a, b])
    }

    pub fn add_op(&mut self, a: &Value, b: &Value) -> Value {
        self.binary(Opcode::Add, a, b)
    }

    pub fn multiply(&mut self, a: &Value, b: &Value) -> Value {
        self.binary(Opcode::Multiply, a, b)
    }

    pub fn divide(&mut self, a: &Value, b: &Value) -> Value {
        self.binary(Opcode::Divide, a, b)
    }

    /// `clamp(lo, x, hi)`. HLO lets the bounds be scalars; the emitter
    /// gives them x's shape (XLA:GPU's ReshapeMover CHECK-fails on scalar
    /// bounds).
    pub fn clamp(&mut self, lo: &Value, x: &Value, hi: &Value) -> Value {
        self.add(Self::op(Opcode::Clamp), &[lo, x, hi])
    }

    /// `compare(a, b), direction=dir` (EQ, NE, LT, LE, GT, GE).
    pub fn compare(&mut self, a: &Value, b: &Value, dir: &str) -> Value {
        let mut i = Self::op(Opcode::Compare);
        i.comparison_direction = dir.to_string();
        self.add(i, &[a, b])
    }

    pub fn select(&mut self, pred: &Value, on_true: &Value, on_false: &Value) -> Value {
        self.add(Self::op(Opcode::Select), &[pred, on_true, on_false])
    }

    /// Reduces `x` over `dims` with the scalar computation `reducer`.
    pub fn reduce(&mut self, x: &Value, init: &Value, dims: &[i64], reducer: CompId) -> Value {
        let mut i = Self::op(Opcode::Reduce);
        i.dimensions = dims.to_vec();
        i.called_computation_ids = vec![reducer.0];
        self.add(i, &[x, init])
    }

    pub fn iota(&mut self, ty: PrimitiveType, dims: &[i64], dim: i64) -> Value {
        let mut i = Self::op_with_shape(Opcode::Iota, shape::array(ty, dims));
        i.dimensions = vec![dim];
        self.add(i, &[])
    }

    pub fn slice(&mut self, x: &Value, starts: &[i64], limits: &[i64]) -> Value {
        let mut i = Self::op(Opcode::Slice);
        i.slice_dimensions = starts
            .iter()
            .zip(limits)
            .map(|(&start, &limit)| SliceDimensions {
                start,
                limit,
                stride: 1,
            })
            .collect();
        self.add(i, &[x])
    }

    pub fn dynamic_slice(&mut self, x: &Value, starts: &[Value], sizes: &[i64]) -> Value {
        let mut i = Self::op(Opcode::DynamicSlice);
        i.dynamic_slice_sizes = sizes.to_vec();
        let mut ops = vec![x];
        ops.extend(starts);
        self.add(i, &ops)
    }

    pub fn dynamic_update_slice(&mut self, x: &Value, update: &Value, starts: &[Value]) -> Value {
        let mut ops = vec![x, update];
        ops.extend(starts);
        self.add(Self::op(Opcode::DynamicUpdateSlice), &ops)
    }

    pub fn concatenate(&mut self, xs: &[Value], dim: i64) -> Value {
        let mut i = Self::op(Opcode::Concatenate);
        i.dimensions = vec![dim];
        let ops: Vec<&Value> = xs.iter().collect();
        self.add(i, &ops)
    }

    /// Edge padding only: `(low, high)` per dimension.
    pub fn pad(&mut self, x: &Value, value: &Value, edges: &[(i64, i64)]) -> Value {
        let mut i = Self::op(Opcode::Pad);
        i.padding_config = Some(Box::new(PaddingConfig {
            dimensions: edges
                .iter()
                .map(|&(lo, hi)| PaddingConfigDimension {
                    edge_padding_low: lo,
                    edge_padding_high: hi,
                    interior_padding: 0,
                })
                .collect(),
        }));
        self.add(i, &[x, value])
    }

    pub fn tuple(&mut self, xs: &[Value]) -> Value {
        let ops: Vec<&Value> = xs.iter().collect();
        self.add(Self::op(Opcode::Tuple), &ops)
    }

    /// `values` through one `opt-barrier`: the same values, which XLA may
    /// not fuse or simplify across.
    pub fn opt_barrier(&mut self, values: &[Value]) -> Vec<Value> {
        let t = self.tuple(values);
        let shape = t.shape.clone();
        let o = self.add(Self::op_with_shape(Opcode::OptBarrier, shape), &[&t]);
        (0..values.len() as i64)
            .map(|k| self.get_tuple_element(&o, k))
            .collect()
    }

    pub fn get_tuple_element(&mut self, x: &Value, index: i64) -> Value {
        let mut i = Self::op(Opcode::GetTupleElement);
        i.tuple_index = index;
        self.add(i, &[x])
    }

    pub fn parameter(&mut self, number: i64, shape: ShapeProto) -> Value {
        let mut i = Self::op_with_shape(Opcode::Parameter, shape);
        i.parameter_number = number;
        self.add_named(i, &[], "param")
    }

    /// `while(init), condition=condition, body=body`.
    pub fn while_loop(&mut self, init: &Value, condition: CompId, body: CompId) -> Value {
        let mut i = Self::op_with_shape(Opcode::While, init.shape.clone());
        // XLA stores a while's computations as [body, condition].
        i.called_computation_ids = vec![body.0, condition.0];
        self.add(i, &[init])
    }

    /// `dot(lhs, rhs)` contracting one dimension of each, no batch
    /// dimensions; the result is lhs's free dimensions, then rhs's.
    pub fn dot(
        &mut self,
        lhs: &Value,
        rhs: &Value,
        lhs_contracting: i64,
        rhs_contracting: i64,
        precision: Precision,
    ) -> Value {
        let mut i = Self::op_with_shape(Opcode::Dot, shape::scalar(PrimitiveType::F32));
        i.dot_dimension_numbers = Some(Box::new(DotDimensionNumbers {
            lhs_contracting_dimensions: vec![lhs_contracting],
            rhs_contracting_dimensions: vec![rhs_contracting],
            ..Default::default()
        }));
        i.precision_config = precision_of_both(precision);
        self.add(i, &[lhs, rhs])
    }

    /// `lhs [rows, k]` times `rhs [k, n]` as XLA:CPU holds a matrix
    /// product past its fusion: a `kCustom` fusion that its YNNPACK library
    /// runs (`"fusion_config":{"kind":"__ynn_fusion"}`, the form XLA:CPU's
    /// own pipeline gives a dot; a bare s8 `dot` there is Eigen's, 20 times
    /// slower). s8 operands sum in s32, exact in any order, so the
    /// library's kernels give the same bits on every host. An f32 `rhs`
    /// takes `lhs` of a narrower type through a `convert` inside the
    /// fusion, which YNNPACK applies as it reads `lhs`; the product is its
    /// f32 one (the sums in index order at k = 64, as XLA:CPU's own f32
    /// products and the simulator: `tests/jax_door.rs` holds it to the
    /// door before XLA's product bit for bit). `lhs` may have more columns
    /// than `rhs` has rows: its first `k` are the operand, sliced inside
    /// the fusion, which YNNPACK reads in place.
    pub fn ynn_product(&mut self, lhs: &Value, rhs: &Value) -> Value {
        let compute = PrimitiveType::try_from(rhs.element_type()).unwrap_or(PrimitiveType::F32);
        let widen = rhs.element_type() != lhs.element_type();
        let ty = if compute == PrimitiveType::S8 {
            PrimitiveType::S32
        } else {
            PrimitiveType::F32
        };
        let out = shape::array(ty, &[lhs.dims()[0], rhs.dims()[1]]);
        let (ls, rs) = (lhs.shape.clone(), rhs.shape.clone());
        let k = rhs.dims()[0];
        let o2 = out.clone();
        let comp = self.computation("equarx_product", &[ls, rs], move |b, p| {
            let mut i = Self::op_with_shape(Opcode::Dot, o2);
            i.dot_dimension_numbers = Some(Box::new(DotDimensionNumbers {
                lhs_contracting_dimensions: vec![1],
                rhs_contracting_dimensions: vec![0],
                ..Default::default()
            }));
            let mut l = if widen {
                b.convert(&p[0], compute)
            } else {
                p[0].clone()
            };
            if l.dims()[1] != k {
                let rows = l.dims()[0];
                l = b.slice(&l, &[0, 0], &[rows, k]);
            }
            b.add(i, &[&l, &p[1]])
        });
        let mut f = Self::op_with_shape(Opcode::Fusion, out);
        f.fusion_kind = "kCustom".into();
        f.called_computation_ids = vec![comp.0];
        f.backend_config = br#"{"fusion_config":{"kind":"__ynn_fusion"}}"#.to_vec();
        self.add(f, &[lhs, rhs])
    }

    /// `lhs [rows, k]` times `rhs [k, n]` as XLA:TPU holds a matrix
    /// product past its fusion: a `kOutput` fusion of one `convolution`
    /// (`dim_labels=bf_io->bf`, no window). libtpu's own pipeline turns
    /// every dot into that form before its fusion and its TPU lowering
    /// refuses a bare `dot` after it; this one compiles at its
    /// pre-scheduler hook (`tests/compilers.rs`).
    pub fn fused_product(&mut self, lhs: &Value, rhs: &Value, precision: Precision) -> Value {
        use crate::proto::{ConvolutionDimensionNumbers, Window};
        let (rows, n) = (lhs.dims()[0], rhs.dims()[1]);
        // Integer operands sum in s32, floating ones in f32.
        let ty = if lhs.element_type() == PrimitiveType::S8 as i32 {
            PrimitiveType::S32
        } else {
            PrimitiveType::F32
        };
        let out = shape::array(ty, &[rows, n]);
        let (ls, rs) = (lhs.shape.clone(), rhs.shape.clone());
        let o2 = out.clone();
        let comp = self.computation("equarx_product", &[ls, rs], move |b, p| {
            let mut i = Self::op_with_shape(Opcode::Convolution, o2);
            i.convolution_dimension_numbers = Some(Box::new(ConvolutionDimensionNumbers {
                input_batch_dimension: 0,
                input_feature_dimension: 1,
                kernel_input_feature_dimension: 0,
                kernel_output_feature_dimension: 1,
                output_batch_dimension: 0,
                output_feature_dimension: 1,
                ..Default::default()
            }));
            i.window = Some(Box::new(Window::default()));
            i.feature_group_count = 1;
            i.batch_group_count = 1;
            i.precision_config = precision_of_both(precision);
            b.add(i, &[&p[0], &p[1]])
        });
        let mut f = Self::op_with_shape(Opcode::Fusion, out);
        f.fusion_kind = "kOutput".into();
        f.called_computation_ids = vec![comp.0];
        self.add(f, &[lhs, rhs])
    }

    /// `reduce-precision(x)` to f32's exponent and `mantissa_bits`.
    pub fn reduce_precision(&mut self, x: &Value, mantissa_bits: i32) -> Value {
        let mut i = Self::op(Opcode::ReducePrecision);
        i.exponent_bits = 8;
        i.mantissa_bits = mantissa_bits;
        self.add(i, &[x])
    }

    /// An array all-to-all: `x` is split along `dim` into one piece per
    /// group member, piece k goes to member k, and the received pieces are
    /// concatenated along `dim` in member order.
    pub fn all_to_all(
        &mut self,
        x: &Value,
        dim: i64,
        groups: &[Vec<i64>],
        channel: Option<i64>,
    ) -> Value {
        let mut i = Self::op(Opcode::AllToAll);
        i.dimensions = vec![dim];
        i.channel_id = channel.unwrap_or(0);
        i.replica_group_list = Some(Self::group_list(groups));
        self.add(i, &[x])
    }

    /// A tuple all-to-all: piece k of `pieces` goes to group member k, and
    /// element k of the result comes from member k.
    pub fn all_to_all_tuple(
        &mut self,
        pieces: &[Value],
        groups: &[Vec<i64>],
        channel: Option<i64>,
    ) -> Value {
        let shape = shape::tuple(pieces.iter().map(|v| v.shape.clone()).collect());
        let mut i = Self::op_with_shape(Opcode::AllToAll, shape);
        i.channel_id = channel.unwrap_or(0);
        i.replica_group_list = Some(Self::group_list(groups));
        let ops: Vec<&Value> = pieces.iter().collect();
        self.add(i, &ops)
    }

    pub fn replica_id(&mut self) -> Value {
        self.add(Self::op(Opcode::ReplicaId), &[])
    }

    pub fn partition_id(&mut self) -> Value {
        self.add(Self::op(Opcode::PartitionId), &[])
    }

    /// A collective-permute over `pairs` (source → target ids). With a
    /// channel id the ids are partition ids, without one replica ids.
    pub fn collective_permute(
        &mut self,
        x: &Value,
        pairs: &[(i64, i64)],
        channel: Option<i64>,
    ) -> Value {
        self.add(
            Self::with_pairs(Self::op(Opcode::CollectivePermute), pairs, channel),
            &[x],
        )
    }

    fn with_pairs(
        mut i: HloInstructionProto,
        pairs: &[(i64, i64)],
        channel: Option<i64>,
    ) -> HloInstructionProto {
        i.source_target_pairs = pairs
            .iter()
            .map(|&(source, target)| SourceTarget { source, target })
            .collect();
        i.channel_id = channel.unwrap_or(0);
        i
    }

    /// The async form of [`Builder::collective_permute`]: a start whose
    /// shape is `(input, output, u32[], u32[])`, as XLA's async collective
    /// creator makes it, and the matching done.
    pub fn collective_permute_start(
        &mut self,
        x: &Value,
        pairs: &[(i64, i64)],
        channel: Option<i64>,
    ) -> Value {
        let u32s = shape::scalar(PrimitiveType::U32);
        let shape = shape::tuple(vec![x.shape.clone(), x.shape.clone(), u32s.clone(), u32s]);
        let i = Self::op_with_shape(Opcode::CollectivePermuteStart, shape);
        self.add(Self::with_pairs(i, pairs, channel), &[x])
    }

    pub fn collective_permute_done(&mut self, start: &Value) -> Value {
        self.add(Self::op(Opcode::CollectivePermuteDone), &[start])
    }

    /// An all-gather along `dim` over explicit `groups`.
    pub fn all_gather(
        &mut self,
        x: &Value,
        dim: i64,
        groups: &[Vec<i64>],
        channel: Option<i64>,
        use_global_device_ids: bool,
    ) -> Value {
        let mut i = Self::op(Opcode::AllGather);
        i.dimensions = vec![dim];
        i.channel_id = channel.unwrap_or(0);
        i.use_global_device_ids = use_global_device_ids;
        i.replica_group_list = Some(Self::group_list(groups));
        debug_assert!(ReplicaGroups::of(&i).is_ok());
        self.add(i, &[x])
    }

    /// A `custom-call` to `target` with `backend_config`, of `result`
    /// (an array or a tuple), every operand and result laid out row-major
    /// and held to it (`constrain_layout`), as JAX lowers a kernel's call;
    /// `api_version` is the proto's `CustomCallApiVersion` (1, the
    /// original, for a `tpu_custom_call`; 4, typed FFI, for XLA:GPU's
    /// Triton call).
    pub fn custom_call(
        &mut self,
        target: &str,
        operands: &[&Value],
        mut result: ShapeProto,
        backend_config: Vec<u8>,
        api_version: i32,
    ) -> Value {
        with_layouts(&mut result);
        let mut i = Self::op_with_shape(Opcode::CustomCall, result);
        i.custom_call_target = target.to_string();
        i.backend_config = backend_config;
        i.constrain_layout = true;
        let tiled = self.tpu_tiled;
        i.operand_shapes_with_layout = operands
            .iter()
            .map(|v| {
                let mut s = v.shape.clone();
                if !tiled {
                    s.layout = None;
                }
                with_layouts(&mut s);
                s
            })
            .collect();
        i.custom_call_api_version = api_version;
        self.add(i, operands)
    }

    fn group_list(groups: &[Vec<i64>]) -> ReplicaGroupList {
        ReplicaGroupList::CollectiveDeviceList(CollectiveDeviceListProto {
            replica_groups: groups
                .iter()
                .map(|g| ReplicaGroup {
                    replica_ids: g.clone(),
                })
                .collect(),
            iota_replica_group_list: None,
        })
    }
}

/// `precision` for both operands of a product.
fn precision_of_both(precision: Precision) -> Option<Box<PrecisionConfig>> {
    Some(Box::new(PrecisionConfig {
        operand_precision: vec![precision as i32; 2],
        ..Default::default()
    }))
}

/// Builds computation `name(params...)` into `module` with `f` (as
/// [`Builder::computation`]), before computation `before` or in front of
/// all others; returns it and the first inconsistency met, if any.
pub fn build_computation(
    module: &mut Module,
    name: &str,
    params: &[ShapeProto],
    before: Option<CompId>,
    metadata: Option<OpMetadata>,
    tpu_tiled: bool,
    f: impl FnOnce(&mut Builder<'_>, Vec<Value>) -> Value,
) -> (CompId, Option<String>) {
    let header = HloComputationProto {
        name: name.to_string(),
        program_shape: Some(ProgramShapeProto {
            parameters: params.to_vec(),
            result: None,
            parameter_names: vec![],
        }),
        ..Default::default()
    };
    let comp = module.add_computation(header, false, before);
    let mut inner = Builder::new(module, comp, metadata);
    inner.tpu_tiled = tpu_tiled;
    let args: Vec<Value> = params
        .iter()
        .enumerate()
        .map(|(n, s)| inner.parameter(n as i64, s.clone()))
        .collect();
    let root = f(&mut inner, args);
    // Parameters stay, read or not: they are the computation's signature.
    let mut keep: Vec<InstrId> = vec![root.id];
    keep.extend(
        inner
            .out
            .iter()
            .filter(|i| Opcode::of(i) == Some(Opcode::Parameter))
            .map(|i| InstrId(i.id)),
    );
    match inner.finish_keeping(&keep) {
        Ok(instrs) => {
            module.append(comp, instrs, root.id, root.shape);
            (comp, None)
        }
        Err(e) => (comp, Some(e)),
    }
}

/// Gives every array in `s` XLA's default layout if it has none.
fn with_layouts(s: &mut ShapeProto) {
    if shape::is_tuple(s) {
        s.tuple_shapes.iter_mut().for_each(with_layouts);
    } else if shape::is_array(s) && s.layout.is_none() {
        s.layout = Some(Box::new(shape::default_layout(s.dimensions.len())));
        s.is_dynamic_dimension = vec![false; s.dimensions.len()];
    }
}
