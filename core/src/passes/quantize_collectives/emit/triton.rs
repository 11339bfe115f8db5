//! Two-shot's three compute steps as Triton kernels for XLA:GPU (the
//! `__gpu$xla.gpu.triton` custom call, whose backend config carries the
//! kernel as Triton IR text, which XLA:GPU compiles through LLVM and
//! ptxas): quantize, dequantize-sum-requantize, dequantize. Three kernels
//! an op, where XLA:GPU makes 9 of the HLO emission's two-shot. The plans
//! they take are the Mosaic kernels' ([`mosaic::takes_plan`]): two-shot's
//! all-reduce, its reduce-scatter (the sum writes the result) and an
//! all-gather (quantize, dequantize).
//!
//! The payload is seen as block rows `[n, 64]`: a block is 64 consecutive
//! elements of the flattened payload, as in the HLO emission, and rank
//! k's part of the exchange is the k-th run of `n/P` rows. A program (one
//! index of the grid) takes [`ROWS_PER_PROGRAM`] block rows. A message is
//! the codes `[rows, 64]` (s8) and one bf16 scale a row, the two sent by
//! their own collectives.
//!
//! The arithmetic is the HLO emission's op for op (`codes.rs`,
//! `exchange.rs`; [`crate::numerics`]): the absmax from the bits of |x|,
//! at least the floor's, capped at +Inf's; the bf16 scale
//! `absmax · fl(1/127)`; codes against its reciprocal (`tt.precise_divf`,
//! the IEEE quotient: `arith.divf` is an approximate one on NVIDIA),
//! rounded to nearest even (`cvt.rni`, as inline PTX: Triton lowers no
//! `math.roundeven`), clamped, NaN to 0; the exchange's sum of halves;
//! `(H·q)·scale` back. Products of values by the rotation's matrix are
//! `tt.dot`s at IEEE precision, which Triton lowers to FMAs over the
//! shared index in order, not to tensor cores: the terms `x·(±1/8)` are
//! exact, so each FMA is the contract's one rounded add. The codes' product
//! back is an s8 `tt.dot` by the matrix's signs into s32 (tensor cores:
//! `mma.sync ... s32.s8.s8.s32`), exact in any order, then times 1/8. `tests/compilers/triton.py`
//! runs the kernels' text on the host against the HLO emission on XLA:CPU,
//! bit for bit.

use std::fmt::Write;

use super::Emitter;
use super::mosaic::{self, Steps};
use crate::ir::builder::Value;
use crate::ir::shape;
use crate::numerics::{absmax_floor, hadamard_sign, inv_qmax};
use crate::passes::Stage;
use crate::plan::{Collective, Plan, QuantFormat, Rotation};
use crate::proto::{PrimitiveType, ShapeProto};

/// Block rows a program takes (1024 elements), by 8 warps: what XLA:GPU
/// compiles fastest of 16 and 32 rows by 4, 8 and 16 warps (the rotation's
/// FMA product unrolls its 64 terms for every output a thread holds;
/// BENCHMARKS.md, "equarx's own Triton kernels on XLA:GPU").
pub(super) const ROWS_PER_PROGRAM: i64 = 16;

/// The largest group whose parts the sum kernel adds one by one (its
/// body grows with P).
const MAX_PARTS: i64 = 16;

/// The payload and plan the kernels are written for.
#[derive(Clone, Copy, Debug)]
pub(in crate::passes::quantize_collectives) struct Shape {
    /// An all-reduce (two-shot), a reduce-scatter or an all-gather.
    pub collective: Collective,
    /// Block rows of the payload on one device (an all-gather's result).
    pub rows: i64,
    /// The group size P; `rows` is a multiple of P · [`ROWS_PER_PROGRAM`].
    pub parts: i64,
    pub rotation: bool,
}

/// Whether the kernels take `plan` on its one bf16 operand `operands` (an
/// all-gather's gathered, a reduce-scatter's scattered, along `dimension`)
/// at `stage`: the shape they are written for, or why not.
pub(in crate::passes::quantize_collectives) fn fits(
    plan: &Plan,
    operands: &[&ShapeProto],
    stage: Stage,
    dimension: Option<i64>,
) -> Result<Shape, String> {
    if stage != Stage::PreFusion {
        return Err(format!(
            "the module is past XLA's fusion ({stage}); XLA:GPU's hook is before it"
        ));
    }
    let operand = mosaic::the_bf16_operand(plan, operands)?;
    let p = plan.group_size as i64;
    let dims = &operand.dimensions;
    let elements: i64 = dims.iter().product();
    if plan.collective != Collective::AllReduce {
        // Ranks' runs one after another: a dimension with only 1s before
        // it.
        let d = dimension.unwrap_or(0);
        let keeps_runs =
            usize::try_from(d).is_ok_and(|d| d < dims.len() && dims[..d].iter().all(|&n| n == 1));
        if !keeps_runs {
            return Err(format!(
                "the {}'s dimension {d} of {dims:?} does not keep a rank's elements together \
                 (the kernels move whole runs)",
                plan.collective.opcode()
            ));
        }
    }
    let gather = plan.collective == Collective::AllGather;
    let elements = if gather { elements * p } else { elements };
    // The kernels' offsets are i32 (elements of the largest buffer, the
    // payload or the gathered result).
    if elements > i64::from(i32::MAX) {
        return Err(format!(
            "{elements} elements: the kernels address at most {} (i32 offsets)",
            i32::MAX
        ));
    }
    let unit = 64 * ROWS_PER_PROGRAM * p;
    if elements % unit != 0 || (!gather && p > MAX_PARTS) {
        return Err(format!(
            "{elements} elements over {p} ranks: the kernels take a multiple of {unit} (blocks \
             of 64 in programs of {ROWS_PER_PROGRAM} a rank){}",
            if gather {
                String::new()
            } else {
                format!(", up to {MAX_PARTS} ranks")
            }
        ));
    }
    Ok(Shape {
        collective: plan.collective,
        rows: elements / 64,
        parts: p,
        rotation: plan.config.rotation == Rotation::Hadamard,
    })
}

impl Emitter<'_, '_, '_> {
    /// The plan's collective of the one operand through the kernels
    /// ([`fits`] said yes): two-shot's all-reduce as quantize, all-to-all
    /// of codes and scales, sum, all-gather of both, dequantize; its
    /// reduce-scatter as the first three; an all-gather as quantize,
    /// all-gather of both, dequantize.
    pub(super) fn triton_kernels(&mut self, s: Shape) -> Value {
        let (rows, p) = (s.rows, s.parts);
        let m = rows / p;
        // The rotation's matrix: ±1/8 in f32 for the products of bf16
        // values; ±1 in s8 for the codes' (an exact integer product).
        let h = s.rotation.then(|| self.b.f32_array(&matrix(), &[64, 64]));
        let signs = s.rotation.then(|| self.b.s8_array(&signs(), &[64, 64]));
        let message = |r: i64| {
            shape::tuple(vec![
                shape::array(PrimitiveType::S8, &[r, 64]),
                shape::array(PrimitiveType::Bf16, &[r]),
            ])
        };
        // The kernels read and write the operand and the result as they
        // are shaped (a kernel sees flat row-major buffers): a reshape to
        // or from block rows beside them would be fused into the op's
        // neighbours, and keeps XLA:GPU's normalization fusions off them.
        let quantized = |e: &mut Self, body: &str, r: i64| {
            let x = e.inputs.operands[0].clone();
            let mut ins = vec![&x];
            ins.extend(h.as_ref());
            e.triton_call(body, "equarx_quantize", r, &ins, message(r))
        };
        // (A result laid out otherwise than row-major gets XLA's copy.)
        let out = shape::array(PrimitiveType::Bf16, &self.inputs.results[0].dimensions);
        match kernels(s) {
            Steps::AllGather {
                quantize,
                dequantize,
            } => {
                let q = quantized(self, &quantize, m);
                self.triton_gather(&dequantize, &q, signs.as_ref(), rows, out)
            }
            Steps::ReduceScatter { quantize, sum } => {
                let q = quantized(self, &quantize, rows);
                let sent = self.exchange_message(&q, [Some(&[p, m, 64]), Some(&[p, m])]);
                let mut ins = vec![&sent[0], &sent[1]];
                ins.extend(h.as_ref());
                self.triton_call(&sum, "equarx_sum_scatter", m, &ins, out)
            }
            Steps::AllReduce {
                quantize,
                sum,
                dequantize,
            } => {
                let q = quantized(self, &quantize, rows);
                let sent = self.exchange_message(&q, [Some(&[p, m, 64]), Some(&[p, m])]);
                let summed =
                    self.triton_call(&sum, "equarx_sum", m, &[&sent[0], &sent[1]], message(m));
                self.triton_gather(&dequantize, &summed, signs.as_ref(), rows, out)
            }
        }
    }

    /// The all-gathers of a message's codes and scales, and the dequantize
    /// kernel over what they gathered (`rows` block rows) into `out`.
    fn triton_gather(
        &mut self,
        body: &str,
        message: &Value,
        h: Option<&Value>,
        rows: i64,
        out: ShapeProto,
    ) -> Value {
        let all = self.gather_message(message);
        let mut ins = vec![&all[0], &all[1]];
        ins.extend(h);
        self.triton_call(body, "equarx_dequantize", rows, &ins, out)
    }

    /// XLA:GPU's Triton call of the kernel `ir` named `name` over `rows`
    /// block rows (a program each [`ROWS_PER_PROGRAM`]): the backend
    /// config is the MLIR dictionary JAX writes for a Pallas call, the IR
    /// as text.
    fn triton_call(
        &mut self,
        ir: &str,
        name: &str,
        rows: i64,
        operands: &[&Value],
        result: ShapeProto,
    ) -> Value {
        let config = format!(
            "{{debug = false, grid_x = {} : i32, grid_y = 1 : i32, grid_z = 1 : i32, ir = \
             \"{}\", name = \"{name}\", num_stages = 1 : i32, num_warps = 8 : i32}}",
            rows / ROWS_PER_PROGRAM,
            mlir_string(ir)
        );
        // API_VERSION_TYPED_FFI, what JAX gives a Triton call.
        self.b.custom_call(
            "__gpu$xla.gpu.triton",
            operands,
            result,
            config.into_bytes(),
            4,
        )
    }
}

/// `s` as the body of an MLIR string literal: quotes, backslashes and
/// control characters as `\XX` escapes.
fn mlir_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + s.len() / 8);
    for c in s.chars() {
        match c {
            '"' | '\\' | '\0'..='\x1f' => {
                let _ = write!(out, "\\{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// The 64 × 64 matrix the kernels rotate by: a block's Hadamard matrix,
/// entries ±1/8 (the norm folded in). Row-major.
fn matrix() -> Vec<f32> {
    (0..64 * 64)
        .map(|i| hadamard_sign(i / 64, i % 64) / 8.0)
        .collect()
}

/// The same matrix's signs, ±1: the codes' product in integers.
fn signs() -> Vec<i8> {
    (0..64 * 64)
        .map(|i| hadamard_sign(i / 64, i % 64) as i8)
        .collect()
}

/// The kernels' text per collective.
fn kernels(s: Shape) -> Steps {
    match s.collective {
        Collective::AllGather => Steps::AllGather {
            quantize: quantize_kernel(s.rotation),
            dequantize: dequantize_kernel(s.rotation),
        },
        Collective::ReduceScatter => Steps::ReduceScatter {
            quantize: quantize_kernel(s.rotation),
            sum: sum_kernel(s, true),
        },
        // (`takes_plan` admits no all-to-all.)
        Collective::AllReduce | Collective::AllToAll => Steps::AllReduce {
            quantize: quantize_kernel(s.rotation),
            sum: sum_kernel(s, false),
            dequantize: dequantize_kernel(s.rotation),
        },
    }
}

/// `[TM, 64]` and `[TM]` tensors of `ty`.
fn t2(ty: &str) -> String {
    format!("tensor<{ROWS_PER_PROGRAM}x64x{ty}>")
}

fn t1(ty: &str) -> String {
    format!("tensor<{ROWS_PER_PROGRAM}x{ty}>")
}

/// One kernel's body in Triton's textual IR, value by value.
struct Ir {
    text: String,
    next: usize,
    /// The kernel's pointer arguments: name and element type.
    args: Vec<(String, String)>,
    /// The program's block rows `[TM]` (i32) and its elements' offsets
    /// `[TM, 64]` in an array of block rows.
    rows: String,
    offsets: String,
}

impl Ir {
    /// A kernel of pointer arguments of the element types `args`, with
    /// the program's rows and offsets made.
    fn new(args: &[&str]) -> Ir {
        let mut ir = Ir {
            text: String::new(),
            next: 0,
            args: args
                .iter()
                .enumerate()
                .map(|(k, ty)| (format!("%arg{k}"), ty.to_string()))
                .collect(),
            rows: String::new(),
            offsets: String::new(),
        };
        let tm = ROWS_PER_PROGRAM;
        let pid = ir.op("tt.get_program_id x : i32");
        let step = ir.op(&format!("arith.constant {tm} : i32"));
        let base = ir.op(&format!("arith.muli {pid}, {step} : i32"));
        let range = ir.op(&format!(
            "tt.make_range {{end = {tm} : i32, start = 0 : i32}} : {}",
            t1("i32")
        ));
        let base = ir.op(&format!("tt.splat {base} : i32 -> {}", t1("i32")));
        ir.rows = ir.op(&format!("arith.addi {range}, {base} : {}", t1("i32")));
        let column = ir.expand(&ir.rows.clone(), 1, &[tm], "i32");
        let width = ir.op(&format!("arith.constant dense<64> : tensor<{tm}x1xi32>"));
        let starts = ir.op(&format!(
            "arith.muli {column}, {width} : tensor<{tm}x1xi32>"
        ));
        let starts = ir.op(&format!(
            "tt.broadcast {starts} : tensor<{tm}x1xi32> -> {}",
            t2("i32")
        ));
        let lanes = ir.lanes(tm);
        ir.offsets = ir.op(&format!("arith.addi {starts}, {lanes} : {}", t2("i32")));
        ir
    }

    /// `name = rhs`, a fresh name.
    fn op(&mut self, rhs: &str) -> String {
        let name = format!("%{}", self.next);
        self.next += 1;
        let _ = writeln!(self.text, "    {name} = {rhs}");
        name
    }

    fn stmt(&mut self, s: &str) {
        let _ = writeln!(self.text, "    {s}");
    }

    /// `x` (`dims` of `ty`) with a new dimension of 1 at `axis`.
    fn expand(&mut self, x: &str, axis: usize, dims: &[i64], ty: &str) -> String {
        let mut out = dims.to_vec();
        out.insert(axis, 1);
        self.op(&format!(
            "tt.expand_dims {x} {{axis = {axis} : i32}} : {} -> {}",
            tensor(dims, ty),
            tensor(&out, ty)
        ))
    }

    /// The lane numbers 0..64, broadcast to `[rows, 64]` (i32).
    fn lanes(&mut self, rows: i64) -> String {
        let lane = self.op("tt.make_range {end = 64 : i32, start = 0 : i32} : tensor<64xi32>");
        let lane = self.expand(&lane, 0, &[64], "i32");
        self.op(&format!(
            "tt.broadcast {lane} : tensor<1x64xi32> -> {}",
            tensor(&[rows, 64], "i32")
        ))
    }

    /// A constant tensor of `dims` and `ty`, every element `value` (an
    /// MLIR literal).
    fn splat(&mut self, value: &str, dims: &[i64], ty: &str) -> String {
        let t = tensor(dims, ty);
        self.op(&format!("arith.constant dense<{value}> : {t}"))
    }

    /// An f32 constant tensor, exact: by its bits.
    fn f32s(&mut self, v: f32, dims: &[i64]) -> String {
        self.splat(&format!("0x{:08X}", v.to_bits()), dims, "f32")
    }

    /// Pointers `[dims]` into argument `arg`, at `offsets` plus `shift`
    /// elements.
    fn pointers(&mut self, arg: usize, offsets: &str, shift: i64, dims: &[i64]) -> String {
        let (name, ty) = self.args[arg].clone();
        let mut offsets = offsets.to_string();
        if shift != 0 {
            let s = self.splat(&shift.to_string(), dims, "i32");
            offsets = self.op(&format!(
                "arith.addi {offsets}, {s} : {}",
                tensor(dims, "i32")
            ));
        }
        let ptr = format!("!tt.ptr<{ty}>");
        let ptrs = tensor(dims, &ptr);
        let base = self.op(&format!("tt.splat {name} : {ptr} -> {ptrs}"));
        self.op(&format!(
            "tt.addptr {base}, {offsets} : {ptrs}, {}",
            tensor(dims, "i32")
        ))
    }

    /// This program's `[TM, 64]` of argument `arg`, from element `shift`.
    fn load_rows(&mut self, arg: usize, shift: i64) -> String {
        let offsets = self.offsets.clone();
        let tm = ROWS_PER_PROGRAM;
        let p = self.pointers(arg, &offsets, shift, &[tm, 64]);
        let ty = self.args[arg].1.clone();
        self.op(&format!(
            "tt.load {p} : {}",
            tensor(&[tm, 64], &format!("!tt.ptr<{ty}>"))
        ))
    }

    /// This program's `[TM]` of argument `arg` (one per row), from element
    /// `shift`.
    fn load_column(&mut self, arg: usize, shift: i64) -> String {
        let rows = self.rows.clone();
        let tm = ROWS_PER_PROGRAM;
        let p = self.pointers(arg, &rows, shift, &[tm]);
        let ty = self.args[arg].1.clone();
        self.op(&format!(
            "tt.load {p} : {}",
            tensor(&[tm], &format!("!tt.ptr<{ty}>"))
        ))
    }

    fn store_rows(&mut self, arg: usize, value: &str) {
        let offsets = self.offsets.clone();
        let tm = ROWS_PER_PROGRAM;
        let p = self.pointers(arg, &offsets, 0, &[tm, 64]);
        let ty = self.args[arg].1.clone();
        self.stmt(&format!(
            "tt.store {p}, {value} : {}",
            tensor(&[tm, 64], &format!("!tt.ptr<{ty}>"))
        ));
    }

    fn store_column(&mut self, arg: usize, value: &str) {
        let rows = self.rows.clone();
        let tm = ROWS_PER_PROGRAM;
        let p = self.pointers(arg, &rows, 0, &[tm]);
        let ty = self.args[arg].1.clone();
        self.stmt(&format!(
            "tt.store {p}, {value} : {}",
            tensor(&[tm], &format!("!tt.ptr<{ty}>"))
        ));
    }

    /// The rotation's matrix `[64, 64]` from argument `arg` (f32, or the
    /// s8 signs).
    fn load_matrix(&mut self, arg: usize) -> String {
        let row = self.op("tt.make_range {end = 64 : i32, start = 0 : i32} : tensor<64xi32>");
        let row = self.expand(&row, 1, &[64], "i32");
        let width = self.op("arith.constant dense<64> : tensor<64x1xi32>");
        let row = self.op(&format!("arith.muli {row}, {width} : tensor<64x1xi32>"));
        let row = self.op(&format!(
            "tt.broadcast {row} : tensor<64x1xi32> -> tensor<64x64xi32>"
        ));
        let lanes = self.lanes(64);
        let offsets = self.op(&format!("arith.addi {row}, {lanes} : tensor<64x64xi32>"));
        let p = self.pointers(arg, &offsets, 0, &[64, 64]);
        let ty = self.args[arg].1.clone();
        self.op(&format!("tt.load {p} : tensor<64x64x!tt.ptr<{ty}>>"))
    }

    /// `[TM, 64]` f32 `y` times the matrix `h`: FMAs in index order.
    fn rotate(&mut self, y: &str, h: &str) -> String {
        let zeros = self.f32s(0.0, &[ROWS_PER_PROGRAM, 64]);
        let t = t2("f32");
        self.op(&format!(
            "tt.dot {y}, {h}, {zeros}, inputPrecision = ieee : {t} * tensor<64x64xf32> -> {t}"
        ))
    }

    /// A `[TM]` column `c` of `ty` broadcast along the rows' 64 lanes.
    fn spread(&mut self, c: &str, ty: &str) -> String {
        let tm = ROWS_PER_PROGRAM;
        let c = self.expand(c, 1, &[tm], ty);
        self.op(&format!(
            "tt.broadcast {c} : {} -> {}",
            tensor(&[tm, 1], ty),
            t2(ty)
        ))
    }

    /// `op` of two `ty` values of type `t`.
    fn binary(&mut self, op: &str, a: &str, b: &str, t: &str) -> String {
        self.op(&format!("{op} {a}, {b} : {t}"))
    }

    fn convert(&mut self, op: &str, x: &str, from: &str, to: &str) -> String {
        self.op(&format!("{op} {x} : {from} to {to}"))
    }

    /// f32 `[TM, 64]` → s8 codes `[TM, 64]` and the rows' bf16 scales
    /// `[TM]` (the HLO emission's `quantize`, op for op).
    fn quantize(&mut self, y: &str) -> (String, String) {
        let tm = ROWS_PER_PROGRAM;
        let format = QuantFormat::Int8;
        let (f2, i2, f1, i1) = (t2("f32"), t2("i32"), t1("f32"), t1("i32"));
        let bits = self.op(&format!("tt.bitcast {y} : {f2} -> {i2}"));
        let mask = self.splat("2147483647", &[tm, 64], "i32");
        let magnitude = self.binary("arith.andi", &bits, &mask, &i2);
        let (a, b, m) = (self.next, self.next + 1, self.next + 2);
        self.next += 3;
        let largest = self.op(&format!(
            "\"tt.reduce\"({magnitude}) <{{axis = 1 : i32}}> ({{\n    ^bb0(%{a}: i32, %{b}: \
             i32):\n      %{m} = arith.maxsi %{a}, %{b} : i32\n      tt.reduce.return %{m} : \
             i32\n    }}) : ({i2}) -> {i1}"
        ));
        let floor = absmax_floor(format).to_bits().to_string();
        let floor = self.splat(&floor, &[tm], "i32");
        let held = self.binary("arith.maxsi", &largest, &floor, &i1);
        let inf = self.splat(&f32::INFINITY.to_bits().to_string(), &[tm], "i32");
        let capped = self.binary("arith.minsi", &held, &inf, &i1);
        let absmax = self.op(&format!("tt.bitcast {capped} : {i1} -> {f1}"));
        let inv = self.f32s(inv_qmax(format), &[tm]);
        let raw = self.binary("arith.mulf", &absmax, &inv, &f1);
        let scale = self.convert("arith.truncf", &raw, &f1, &t1("bf16"));
        let back = self.convert("arith.extf", &scale, &t1("bf16"), &f1);
        let one = self.f32s(1.0, &[tm]);
        let recip = self.binary("tt.precise_divf", &one, &back, &f1);
        let recip = self.spread(&recip, "f32");
        let ratio = self.binary("arith.mulf", y, &recip, &f2);
        let rounded = self.op(&format!(
            "tt.elementwise_inline_asm \"cvt.rni.f32.f32 $0, $1;\" {{constraints = \"=r,r\", \
             packed_element = 1 : i32, pure = true}} {ratio} : {f2} -> {f2}"
        ));
        let lo = self.f32s(-format.qmax(), &[tm, 64]);
        let hi = self.f32s(format.qmax(), &[tm, 64]);
        let clamped = self.binary("arith.maximumf", &rounded, &lo, &f2);
        let clamped = self.binary("arith.minimumf", &clamped, &hi, &f2);
        // NaN's code is 0, as XLA's convert gives it.
        let number = self.op(&format!("arith.cmpf oeq, {clamped}, {clamped} : {f2}"));
        let zeros = self.f32s(0.0, &[tm, 64]);
        let clamped = self.op(&format!(
            "arith.select {number}, {clamped}, {zeros} : {}, {f2}",
            t2("i1")
        ));
        let codes = self.convert("arith.fptosi", &clamped, &f2, &t2("i8"));
        (codes, scale)
    }

    /// Codes `q` (s8 `[TM, 64]`) times their rows' bf16 scales `s` (`[TM]`):
    /// f32 `[TM, 64]`, rotated back by the matrix's `signs` (s8) before the
    /// scale where given: `(H·q/8)·scale`, the integer product exact on
    /// the tensor cores in any order, and its eighth exact in f32 (|H·q| ≤
    /// 127·64), so the contract's f32 sums of `q·(±1/8)` to the bit.
    fn dequantize(&mut self, q: &str, s: &str, signs: Option<&str>) -> String {
        let f2 = t2("f32");
        let q = match signs {
            Some(signs) => {
                let i2 = t2("i32");
                let zeros = self.splat("0", &[ROWS_PER_PROGRAM, 64], "i32");
                let hq = self.op(&format!(
                    "tt.dot {q}, {signs}, {zeros} : {} * tensor<64x64xi8> -> {i2}",
                    t2("i8")
                ));
                let hq = self.convert("arith.sitofp", &hq, &i2, &f2);
                let eighth = self.f32s(0.125, &[ROWS_PER_PROGRAM, 64]);
                self.binary("arith.mulf", &hq, &eighth, &f2)
            }
            None => self.convert("arith.sitofp", q, &t2("i8"), &f2),
        };
        let s = self.convert("arith.extf", s, &t1("bf16"), &t1("f32"));
        let s = self.spread(&s, "f32");
        self.binary("arith.mulf", &q, &s, &f2)
    }

    /// The kernel function `name` around the body.
    fn finish(mut self, name: &str) -> String {
        self.stmt("tt.return");
        let args: Vec<String> = self
            .args
            .iter()
            .map(|(n, ty)| format!("{n}: !tt.ptr<{ty}> {{tt.divisibility = 16 : i32}}"))
            .collect();
        format!(
            "module {{\n  tt.func public @{name}({}) {{\n{}  }}\n}}\n",
            args.join(", "),
            self.text
        )
    }
}

fn tensor(dims: &[i64], ty: &str) -> String {
    let dims: Vec<String> = dims.iter().map(i64::to_string).collect();
    format!("tensor<{}x{ty}>", dims.join("x"))
}

/// Quantize: `x` (bf16 block rows), [the matrix], → codes, scales.
fn quantize_kernel(rotation: bool) -> String {
    let mut args = vec!["bf16"];
    if rotation {
        args.push("f32");
    }
    args.extend(["i8", "bf16"]);
    let mut ir = Ir::new(&args);
    let x = ir.load_rows(0, 0);
    let mut y = ir.convert("arith.extf", &x, &t2("bf16"), &t2("f32"));
    if rotation {
        let h = ir.load_matrix(1);
        y = ir.rotate(&y, &h);
    }
    let out = usize::from(rotation) + 1;
    let (codes, scales) = ir.quantize(&y);
    ir.store_rows(out, &codes);
    ir.store_column(out + 1, &scales);
    ir.finish("equarx_quantize")
}

/// The exchange's sum of the P parts that arrived (codes `[P, m, 64]`,
/// scales `[P, m]`), requantized for the gather; or, for a reduce-scatter,
/// rotated back where the plan rotates and written as the bf16 result.
fn sum_kernel(s: Shape, scatter: bool) -> String {
    let (p, m) = (s.parts, s.rows / s.parts);
    let mut args = vec!["i8", "bf16"];
    if scatter {
        if s.rotation {
            args.push("f32");
        }
        args.push("bf16");
    } else {
        args.extend(["i8", "bf16"]);
    }
    let mut ir = Ir::new(&args);
    let f2 = t2("f32");
    let mut parts: Vec<String> = (0..p)
        .map(|k| {
            let q = ir.load_rows(0, k * m * 64);
            let scale = ir.load_column(1, k * m);
            ir.dequantize(&q, &scale, None)
        })
        .collect();
    // Halves added, the odd one out carried (`Emitter::exchange`).
    while parts.len() > 1 {
        let h = parts.len() / 2;
        let mut sums: Vec<String> = (0..h)
            .map(|k| ir.binary("arith.addf", &parts[k], &parts[k + h], &f2))
            .collect();
        sums.extend(parts.get(2 * h).cloned());
        parts = sums;
    }
    let sum = parts.remove(0);
    if scatter {
        let y = if s.rotation {
            let h = ir.load_matrix(2);
            ir.rotate(&sum, &h)
        } else {
            sum
        };
        let y = ir.convert("arith.truncf", &y, &f2, &t2("bf16"));
        let out = 2 + usize::from(s.rotation);
        ir.store_rows(out, &y);
        return ir.finish("equarx_sum_scatter");
    }
    let (codes, scales) = ir.quantize(&sum);
    ir.store_rows(2, &codes);
    ir.store_column(3, &scales);
    ir.finish("equarx_sum")
}

/// Dequantize: codes, scales (the gathered message), [the matrix's signs]
/// → bf16 block rows.
fn dequantize_kernel(rotation: bool) -> String {
    let mut args = vec!["i8", "bf16"];
    if rotation {
        args.push("i8");
    }
    args.push("bf16");
    let mut ir = Ir::new(&args);
    let q = ir.load_rows(0, 0);
    let s = ir.load_column(1, 0);
    let h = rotation.then(|| ir.load_matrix(2));
    let y = ir.dequantize(&q, &s, h.as_deref());
    let y = ir.convert("arith.truncf", &y, &t2("f32"), &t2("bf16"));
    ir.store_rows(2 + usize::from(rotation), &y);
    ir.finish("equarx_dequantize")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_is_defined_before_use() {
        for rotation in [false, true] {
            for collective in [
                Collective::AllReduce,
                Collective::ReduceScatter,
                Collective::AllGather,
            ] {
                let s = Shape {
                    collective,
                    rows: 1024,
                    parts: 4,
                    rotation,
                };
                let texts = kernels(s).into_texts();
                for text in texts {
                    let mut defined = std::collections::HashSet::new();
                    for line in text.lines() {
                        let line = line.trim();
                        // The reduce's block arguments.
                        if let Some(args) = line.strip_prefix("^bb0(") {
                            for a in args.split(", ") {
                                defined.insert(a.split(':').next().unwrap().to_string());
                            }
                            continue;
                        }
                        let (lhs, rhs) = match line.split_once(" = ") {
                            Some((l, r)) if l.starts_with('%') => (Some(l), r),
                            _ => (None, line),
                        };
                        for word in rhs.split([' ', ',', '(', ')', ':']) {
                            let used = word.starts_with('%')
                                && word[1..].chars().all(|c| c.is_ascii_digit());
                            assert!(
                                !used || defined.contains(word),
                                "{word} used before it is defined: {line}"
                            );
                        }
                        if let Some(l) = lhs {
                            defined.insert(l.to_string());
                        }
                    }
                    assert!(text.contains("tt.func public @equarx_"), "{text}");
                }
            }
        }
    }

    #[test]
    fn a_payload_past_i32_offsets_is_refused() {
        use crate::plan::{Algorithm, Config};
        let config = Config {
            algorithm: Algorithm::TwoShot,
            ..Config::default()
        };
        let plan = Plan::new(4, 1 << 30, &config).unwrap();
        let small = shape::array(PrimitiveType::Bf16, &[1 << 20, 1024]);
        assert!(fits(&plan, &[&small], Stage::PreFusion, None).is_ok());
        let huge = shape::array(PrimitiveType::Bf16, &[1 << 21, 1024]);
        let why = fits(&plan, &[&huge], Stage::PreFusion, None).unwrap_err();
        assert!(why.contains("i32 offsets"), "{why}");
    }

    #[test]
    fn the_matrix_is_a_blocks_hadamard_matrix_over_8() {
        let h = matrix();
        assert_eq!(h[0], 0.125);
        assert_eq!(h[64 + 1], -0.125); // H[1][1] = -1
        assert_eq!(h[63 * 64 + 63], 0.125); // 63 & 63 has six bits
    }

    #[test]
    fn an_mlir_string_escapes_quotes_backslashes_and_newlines() {
        assert_eq!(mlir_string("a\"b\\c\nd"), "a\\22b\\5Cc\\0Ad");
    }
}
