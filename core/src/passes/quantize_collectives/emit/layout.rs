//! The payload in and the results out: the operands flattened, padded and
//! (rotated) cut into chunks or rows, and the sums or rows given back in
//! each operand's shape, type and layout.

use super::{Const, Emitter, operands_are_bf16};
use crate::ir::builder::Value;
use crate::ir::shape;
use crate::numerics::{hadamard_norm, hadamard_sign};
use crate::passes::{Platform, Stage};
use crate::plan::{Axis, Collective, Rotation};
use crate::proto::precision_config::Precision;
use crate::proto::{PrimitiveType, ShapeProto};

impl Emitter<'_, '_, '_> {
    /// `x` as blocks, `[elements / B, B]`.
    pub(super) fn blocks(&mut self, x: &Value) -> Value {
        let bl = self.plan().block() as i64;
        let n = shape::element_count(&x.shape).unwrap_or(0) as i64;
        self.b.reshape(x, &[n / bl, bl])
    }

    /// The operands, padded to P·c and rotated if the plan rotates, as
    /// `[axis sizes.., c/B, B]`: the blocks are the minor dimension of
    /// every array the plan's steps read and write, so a backend that
    /// tiles layouts (XLA:TPU) moves no element between tiles from one
    /// step to the next. Kept in the operands' narrow type when they share
    /// one and nothing is rotated: each hop converts the part it reads.
    pub(super) fn payload(&mut self, axes: &[Axis]) -> Value {
        let plan = self.plan();
        let operands = self.inputs.operands;
        let bl = plan.block() as i64;
        let ty = operands[0].element_type();
        let same = operands.iter().all(|x| x.element_type() == ty);
        let rotated = plan.config.rotation == Rotation::Hadamard;
        let sizes: Vec<i64> = operands
            .iter()
            .map(|x| shape::element_count(&x.shape).unwrap_or(0) as i64)
            .collect();
        // Operands of whole blocks are joined and padded as blocks; others
        // as the flat elements they are.
        let whole_blocks = sizes.iter().all(|n| n % bl == 0);
        let pieces: Vec<Value> = operands
            .iter()
            .zip(&sizes)
            .map(|(x, &n)| {
                let x = match (same, rotated) {
                    (true, false) => x.clone(),
                    (true, true) => self.rotation_input(x),
                    (false, _) => self.f32(x),
                };
                let dims: &[i64] = if whole_blocks { &[n / bl, bl] } else { &[n] };
                self.b.reshape(&x, dims)
            })
            .collect();
        let mut payload = if pieces.len() == 1 {
            pieces[0].clone()
        } else {
            self.b.concatenate(&pieces, 0)
        };
        let (padded, elements) = (plan.padded() as i64, plan.elements as i64);
        if padded > elements {
            let ty = PrimitiveType::try_from(payload.element_type()).unwrap_or(PrimitiveType::F32);
            let zero = self.b.zero(ty);
            payload = if whole_blocks {
                self.b
                    .pad(&payload, &zero, &[(0, (padded - elements) / bl), (0, 0)])
            } else {
                self.b.pad(&payload, &zero, &[(0, padded - elements)])
            };
        }
        if rotated {
            payload = self.rotate(&payload, operands_are_bf16(operands));
        }
        let mut dims: Vec<i64> = axes.iter().map(|a| a.size as i64).collect();
        dims.extend([plan.chunk as i64 / bl, bl]);
        let view = self.b.reshape(&payload, &dims);
        if operands.iter().any(|x| x.id == payload.id) || pieces.iter().any(|f| f.id == payload.id)
        {
            self.borrowed.push(view.id);
        }
        view
    }

    /// Every block of B of `x` multiplied by `H_B`, then by `fl(1/√B)`:
    /// `[elements / B, B]`, f32. Inputs that are bf16 values multiply
    /// exactly at any dot precision; other f32 inputs ask for the highest.
    /// `x` is f32, or bf16 where [`Self::rotates_narrow`].
    pub(super) fn rotate(&mut self, x: &Value, bf16_valued: bool) -> Value {
        let blocks = self.blocks(x);
        // Past XLA:CPU's fusion the product widens bf16 values itself.
        let ty = match PrimitiveType::try_from(x.element_type()) {
            Ok(PrimitiveType::Bf16) if self.ynn_products() => PrimitiveType::F32,
            Ok(ty) => ty,
            Err(_) => PrimitiveType::F32,
        };
        let h = self.hadamard(ty);
        let precision = if bf16_valued {
            Precision::Default
        } else {
            Precision::Highest
        };
        // Entries ±1 (or ±2^-k, when the norm is folded in): every product
        // is exact, so a backend's fused multiply-adds change nothing.
        let summed = self.product(&blocks, &h, precision);
        if self.norm_folded() {
            summed
        } else {
            let bl = self.plan().block();
            let norm = self.splat(Const::F32(hadamard_norm(bl).to_bits()), summed.dims());
            self.b.multiply(&summed, &norm)
        }
    }

    /// What the rotation reads of bf16 operands: past XLA:TPU's fusion
    /// ([`Self::rotates_narrow`]) the bf16 values themselves, which the
    /// product takes as they are, where their widening was a kernel of its
    /// own and the relayout into blocks moved twice the bytes; past
    /// XLA:CPU's ([`Self::ynn_products`]) the bf16 values too, which its
    /// YNNPACK fusion widens as it reads them (the widening was a pass of
    /// its own over 6 bytes an element); elsewhere their f32 widening.
    pub(super) fn rotation_input(&mut self, x: &Value) -> Value {
        if (self.rotates_narrow() || self.ynn_products())
            && x.element_type() == PrimitiveType::Bf16 as i32
        {
            x.clone()
        } else {
            self.f32(x)
        }
    }

    /// Whether the rotation's products take their operands narrow, bf16
    /// values as bf16 and int8 codes as s8 (the sums exact in f32 and s32
    /// alike): past XLA:TPU's fusion, where the product is a fused
    /// convolution that libtpu refuses a widening inside, and a widening
    /// outside is a kernel.
    pub(super) fn rotates_narrow(&self) -> bool {
        self.b.tiled_for_tpu()
    }

    /// Whether int8 codes go into the inverse rotation's product as they
    /// are, summed in s32 (exact, as in f32): where the product takes
    /// bf16 narrow ([`Self::rotates_narrow`]), and at XLA:CPU's
    /// pre-scheduler hook ([`Self::ynn_products`]), where the f32 widening
    /// of the codes was a pass of its own over 4 bytes an element.
    pub(super) fn sums_codes_narrow(&self) -> bool {
        self.rotates_narrow() || self.ynn_products()
    }

    /// Whether a product is XLA:CPU's YNNPACK fusion
    /// ([`crate::ir::builder::Builder::ynn_product`]): past XLA:CPU's
    /// fusion in a module not yet scheduled (its pre-scheduler hook, where
    /// nothing fuses the module again), not in a scheduled dump, which a
    /// new compile fuses again through StableHLO (which drops the fusion's
    /// backend config: "Fusion must have backend config").
    pub(super) fn ynn_products(&self) -> bool {
        self.inputs.stage == Stage::Fused
            && self.inputs.platform == Platform::Cpu
            && !self.inputs.scheduled
    }

    /// `rows [m, B]` times the B×B `h`: a `dot`; past XLA:TPU's fusion
    /// ([`Stage::Tiled`]) the fused convolution libtpu makes of one; past
    /// XLA:CPU's, the YNNPACK fusion XLA:CPU makes of one, `rows` widened
    /// to `h`'s type inside it (bf16 values to f32: no widened copy).
    pub(super) fn product(&mut self, rows: &Value, h: &Value, precision: Precision) -> Value {
        match self.inputs.stage {
            Stage::Tiled => self.b.fused_product(rows, h, precision),
            _ if self.ynn_products() => self.b.ynn_product(rows, h),
            _ => self.b.dot(rows, h, 1, 0, precision),
        }
    }

    /// Whether the rotation's matrix holds its norm: for B a power of four,
    /// `1/√B` is a power of two, so `H/√B` has entries `±2^-k`, every
    /// product with them is the product with ±1 scaled exactly, and a sum
    /// of such products is the sum of the ±1 products scaled exactly (no
    /// rounding changes: a power of two commutes with rounding). The
    /// rotation then needs no multiply of its own, forward or back.
    pub(super) fn norm_folded(&self) -> bool {
        crate::numerics::norm_folds(self.plan().block())
    }

    /// The B×B Sylvester Hadamard matrix as `ty`, emitted once per
    /// computation and type: it is symmetric, so the inverse rotation reads
    /// it too. f32 and bf16: ±1, or `±1/√B` when [`Self::norm_folded`]
    /// (exact in either). s8 (for int8 codes): ±1, the norm left to the
    /// caller. An f32 matrix's literal is s8 (a quarter of the bytes in the
    /// module; XLA folds the convert, and the norm's multiply of the small
    /// matrix), but past XLA:TPU's tiling, where nothing folds them any
    /// more, a literal of the values themselves.
    pub(super) fn hadamard(&mut self, ty: PrimitiveType) -> Value {
        if let Some(h) = self.hadamard.get(&(ty as i32)) {
            return h.clone();
        }
        let bl = self.plan().block();
        let dims = [bl as i64, bl as i64];
        let signs: Vec<f32> = (0..bl * bl)
            .map(|i| hadamard_sign(i / bl, i % bl))
            .collect();
        let norm = if self.norm_folded() {
            hadamard_norm(bl)
        } else {
            1.0
        };
        let h = match ty {
            PrimitiveType::S8 => self.b.s8_array(&s8_signs(bl), &dims),
            PrimitiveType::Bf16 => {
                let entries: Vec<f32> = signs.iter().map(|&s| s * norm).collect();
                self.b.bf16_array(&entries, &dims)
            }
            _ if self.inputs.stage != Stage::PreFusion => {
                // Past the compiler's constant folding the widening would
                // be a kernel every op runs: the f32 matrix itself instead.
                let entries: Vec<f32> = signs.iter().map(|&s| s * norm).collect();
                self.b.f32_array(&entries, &dims)
            }
            _ => {
                let sign = self.hadamard(PrimitiveType::S8);
                let h = self.b.convert(&sign, PrimitiveType::F32);
                if self.norm_folded() {
                    let norm = self.splat(Const::F32(norm.to_bits()), &dims);
                    self.b.multiply(&h, &norm)
                } else {
                    h
                }
            }
        };
        self.hadamard.insert(ty as i32, h.clone());
        h
    }

    /// The operand's geometry around the collective's dimension d:
    /// (elements before d, size of d, elements after d). Eligibility gives
    /// every array collective of rows a dimension in range; one without is
    /// an inconsistency the rewrite fails on.
    pub(super) fn around(&mut self, x: &Value) -> (i64, i64, i64) {
        let dims = x.dims().to_vec();
        let d = match self.inputs.dimension.and_then(|d| usize::try_from(d).ok()) {
            Some(d) if d < dims.len() => d,
            other => {
                self.b.fail(format!(
                    "the collective's dimension {other:?} does not fit its operand {dims:?}"
                ));
                return (1, dims.iter().product(), 1);
            }
        };
        let before: i64 = dims[..d].iter().product();
        let after: i64 = dims[d + 1..].iter().product();
        (before, dims[d], after)
    }

    /// The payload of a collective of rows, `[P, c/B, B]` (all-gather:
    /// `[c/B, B]`, its one row; a reduce-scatter: `[axis sizes.., c/B, B]`):
    /// a reduce-scatter's or an array all-to-all's operand cut along d into
    /// P rows (a transpose brings d to the front when dimensions come
    /// before it), a tuple all-to-all's operands stacked, each row padded
    /// to c, rotated when the plan rotates.
    pub(super) fn rows(&mut self, axes: &[Axis]) -> Value {
        let plan = self.plan();
        let (p, c) = (plan.group_size as i64, plan.chunk as i64);
        let m = plan.row.unwrap_or(plan.chunk) as i64;
        let operands = self.inputs.operands;
        let x = &operands[0];
        let rotated = plan.config.rotation == Rotation::Hadamard;
        let (rows, stacked) = match (plan.collective, self.inputs.dimension) {
            (Collective::AllGather, _) => (1, self.b.reshape(x, &[1, m])),
            (_, None) => {
                let flat: Vec<Value> = operands
                    .iter()
                    .map(|o| self.b.reshape(o, &[1, m]))
                    .collect();
                (p, self.b.concatenate(&flat, 0))
            }
            (_, Some(_)) => {
                let (before, size, after) = self.around(x);
                let cut = if before == 1 {
                    x.clone()
                } else {
                    let v = self.b.reshape(x, &[before, p, size / p, after]);
                    self.swap_leading(&v)
                };
                (p, self.b.reshape(&cut, &[p, m]))
            }
        };
        let bl = plan.block() as i64;
        let mut payload = if rotated {
            self.rotation_input(&stacked)
        } else {
            stacked
        };
        if c > m {
            let ty = PrimitiveType::try_from(payload.element_type()).unwrap_or(PrimitiveType::F32);
            let zero = self.b.zero(ty);
            payload = if m % bl == 0 {
                let blocks = self.b.reshape(&payload, &[rows, m / bl, bl]);
                self.b
                    .pad(&blocks, &zero, &[(0, 0), (0, (c - m) / bl), (0, 0)])
            } else {
                self.b.pad(&payload, &zero, &[(0, 0), (0, c - m)])
            };
        }
        if rotated {
            payload = self.rotate(&payload, operands_are_bf16(operands));
        }
        // Blocks as the minor dimension (see `payload`).
        let mut dims: Vec<i64> = match plan.collective {
            Collective::ReduceScatter => axes.iter().map(|a| a.size as i64).collect(),
            Collective::AllReduce | Collective::AllGather | Collective::AllToAll if rows == 1 => {
                vec![]
            }
            Collective::AllReduce | Collective::AllGather | Collective::AllToAll => vec![rows],
        };
        dims.extend([c / bl, bl]);
        self.b.reshape(&payload, &dims)
    }

    /// The all-reduce's sum (f32 blocks of the padded payload, `[P·c/B,
    /// B]`) → each operand's part, in its shape, type and layout.
    pub(super) fn unpack_sum(&mut self, whole: &Value) -> Vec<Value> {
        let padded = self.plan().padded() as i64;
        let mut offset = 0i64;
        let mut out = Vec::new();
        for (x, result) in self.inputs.operands.iter().zip(self.inputs.results) {
            let n = shape::element_count(&x.shape).unwrap_or(0) as i64;
            let part = if n == padded {
                whole.clone()
            } else {
                self.elements(whole, offset, n)
            };
            offset += n;
            out.push(self.as_result(&part, result));
        }
        out
    }

    /// Elements `offset..offset + n` of `x`, in order: whole blocks of
    /// `x`'s `[nb, B]` when they are, else a slice of its flat elements.
    fn elements(&mut self, x: &Value, offset: i64, n: i64) -> Value {
        let bl = self.plan().block() as i64;
        if offset % bl == 0 && n % bl == 0 {
            let blocks = self.blocks(x);
            self.b
                .slice(&blocks, &[offset / bl, 0], &[(offset + n) / bl, bl])
        } else {
            let count = shape::element_count(&x.shape).unwrap_or(0) as i64;
            let flat = self.b.reshape(x, &[count]);
            self.b.slice(&flat, &[offset], &[offset + n])
        }
    }

    /// A reduce-scatter's owned sum (f32 `[c/B, B]`, unquantized; rotated
    /// back when the plan rotates) → the result.
    pub(super) fn unpack_owned(&mut self, owned: &Value) -> Vec<Value> {
        let plan = self.plan();
        let (c, m) = (plan.chunk as i64, plan.row.unwrap_or(plan.chunk) as i64);
        let mut sum = owned.clone();
        if plan.config.rotation == Rotation::Hadamard {
            sum = self.rotate(&sum, false);
        }
        if c > m {
            sum = self.elements(&sum, 0, m);
        }
        let result = &self.inputs.results[0];
        vec![self.as_result(&sum, result)]
    }

    /// An all-gather's or all-to-all's rows (f32 blocks of `[P·c]`, row k
    /// from rank k) → the result: rows laid side by side along d (an array form),
    /// or one row per tuple element.
    pub(super) fn unpack_rows(&mut self, values: &Value) -> Vec<Value> {
        let plan = self.plan();
        let (p, c) = (plan.group_size as i64, plan.chunk as i64);
        let m = plan.row.unwrap_or(plan.chunk) as i64;
        let mut rows = self.b.reshape(values, &[p, c]);
        if c > m {
            rows = self.b.slice(&rows, &[0, 0], &[p, m]);
        }
        let results = self.inputs.results;
        let tuple_all_to_all = match plan.collective {
            Collective::AllToAll => self.inputs.dimension.is_none(),
            Collective::AllReduce | Collective::ReduceScatter | Collective::AllGather => false,
        };
        if tuple_all_to_all {
            return (0..p)
                .zip(results)
                .map(|(k, result)| {
                    let row = self.b.slice(&rows, &[k, 0], &[k + 1, m]);
                    self.as_result(&row, result)
                })
                .collect();
        }
        // Row k holds rank k's piece, [before, size/P, after] (an
        // all-gather's whole operand): side by side along d.
        let (before, size, after) = self.around(&self.inputs.operands[0]);
        let piece = match plan.collective {
            Collective::AllGather => size,
            Collective::AllReduce | Collective::ReduceScatter | Collective::AllToAll => size / p,
        };
        let placed = if before == 1 {
            rows
        } else {
            let v = self.b.reshape(&rows, &[p, before, piece, after]);
            self.swap_leading(&v)
        };
        vec![self.as_result(&placed, &results[0])]
    }

    /// `v` `[a, b, rest..]` → `[b, a, rest..]`. Past XLA:TPU's layout
    /// assignment a transpose is refused ("HLO transpose is not implemented
    /// on TPU": libtpu's own layout passes have turned its transposes into
    /// copies by then), so there the swap is a slice per index of the
    /// shorter of the two dimensions, each reshaped to a unit dimension on
    /// the other side, and one concatenate.
    fn swap_leading(&mut self, v: &Value) -> Value {
        let dims = v.dims().to_vec();
        if self.inputs.stage != Stage::Tiled {
            let mut perm: Vec<i64> = (0..dims.len() as i64).collect();
            perm.swap(0, 1);
            return self.b.transpose(v, &perm);
        }
        let (a, b) = (dims[0], dims[1]);
        // Slice along dimension `from` (the shorter); each piece's unit
        // dimension moves to `to`, the other side, and the pieces are
        // concatenated there.
        let (from, to) = if a <= b { (0, 1) } else { (1, 0) };
        let mut unit = dims.clone();
        unit.swap(0, 1);
        unit[to] = 1;
        let pieces: Vec<Value> = (0..dims[from])
            .map(|k| {
                let mut starts = vec![0; dims.len()];
                let mut limits = dims.clone();
                starts[from] = k;
                limits[from] = k + 1;
                let piece = self.b.slice(v, &starts, &limits);
                self.b.reshape(&piece, &unit)
            })
            .collect();
        self.b.concatenate(&pieces, to as i64)
    }

    /// f32 values → `result` (its dimensions, type and layout).
    pub(super) fn as_result(&mut self, v: &Value, result: &ShapeProto) -> Value {
        let ty = PrimitiveType::try_from(result.element_type).unwrap_or(PrimitiveType::F32);
        if ty == PrimitiveType::F32 {
            self.b.reshape_to(v, result)
        } else if let Some(v) = self
            .b
            .tiled_for_tpu()
            .then(|| self.b.reshaped_source(v).unwrap_or_else(|| v.clone()))
            .filter(|v| v.dims().last().is_some_and(|&n| n >= 64))
        {
            // Narrowed first, before any view of it: under libtpu's tiles
            // the reshape is a relayout, of half the bytes so, and the
            // convert joins the fusion that made the values (blocks, or
            // rows of 128: a narrower minor dimension pads every row to 128
            // lanes, and a convert of that would touch more than the
            // result).
            let v = self.b.convert(&v, ty);
            self.b.reshape_to(&v, result)
        } else if self.inputs.stage == Stage::Fused {
            // Narrowed first past XLA's fusion too: the convert joins the
            // fusion that made the values, and the reshape after it stays
            // a bitcast outside (`outline-fusions`), where inside it the
            // loop emitter would compute every element's index through it.
            let v = self.b.convert(v, ty);
            self.b.reshape_to(&v, result)
        } else {
            let v = self.b.reshape(v, &result.dimensions);
            self.b.convert_to(&v, result)
        }
    }
}

/// H_B's ±1 as s8, `[B, B]` row-major.
fn s8_signs(bl: usize) -> Vec<i8> {
    (0..bl * bl)
        .map(|i| hadamard_sign(i / bl, i % bl) as i8)
        .collect()
}
