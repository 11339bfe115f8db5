"""Runs a Triton kernel (the IR text an XLA:GPU `__gpu$xla.gpu.triton` call
carries) on the host with numpy, so that the arithmetic of a kernel XLA:GPU
compiles can be checked where no GPU runs.

    outputs = run(ir_text, grid_x, inputs, outputs)   # numpy arrays, whole operands

The kernel's arguments are pointers to the call's operands, then to its
results, each seen flat. Programs run one after another, `tt.get_program_id
x` from 0 to `grid_x - 1`. Only the ops equarx's kernels use are known
(`OPS`); any other is an error, not a guess. The semantics are IEEE's, as
numpy computes them in the operands' own types, with these choices where
the IR leaves it to the target, each what Triton 3 lowers the op to for
NVIDIA:

- `tt.dot` of integers (s8 into s32) is exact, in any order;
- `tt.dot` at `inputPrecision = ieee` (f32 operands) is FMAs over the shared
  index in order, from the accumulator (Triton's FMA dot; no tensor core
  takes IEEE f32). An FMA is computed in f64 and rounded once to f32, which
  is the FMA's value where the product is exact in f64 (it is: both factors
  are f32);
- `tt.precise_divf` is the IEEE quotient (`div.rn.f32`);
- `tt.elementwise_inline_asm` knows one instruction, `cvt.rni.f32.f32`:
  round to nearest integer, ties to even;
- `arith.fptosi` of NaN or of a value out of range is an error here (LLVM
  calls it poison): the kernels must clamp and clear NaN before it.

What is checked is the kernel's logic (which element goes where, in which
order it is summed), against equarx's HLO twin on XLA:CPU.
"""

import re

import numpy as np

import mosaic
from mosaic import _binary, _type


class _Pointers:
    """A tensor of pointers: an argument and element offsets into it."""

    def __init__(self, arg, offsets):
        self.arg, self.offsets = arg, offsets


def _shape(rtype):
    """The dimensions of `tensor<32x64x..>`, pointers' included."""
    return tuple(int(d) for d in re.findall(r"(\d+)x", str(rtype).split("!")[0]))


def _splat(op, ins, rtype):
    x = ins[0]
    if isinstance(x, _Pointers):
        return _Pointers(x.arg, np.full(_shape(rtype), x.offsets, np.int64))
    shape, dtype = _type(rtype)
    return np.full(shape, x, dtype)


def _addptr(op, ins, rtype):
    p, offsets = ins
    return _Pointers(p.arg, p.offsets + offsets.astype(np.int64))


def _broadcast(op, ins, rtype):
    return np.broadcast_to(ins[0], _type(rtype)[0]).copy()


def _make_range(op, ins, rtype):
    start = int(str(op.attributes["start"]).split(":")[0])
    end = int(str(op.attributes["end"]).split(":")[0])
    return np.arange(start, end, dtype=np.int32)


def _expand_dims(op, ins, rtype):
    return np.expand_dims(ins[0], int(str(op.attributes["axis"]).split(":")[0]))


def _dot(op, ins, rtype):
    if all(np.issubdtype(x.dtype, np.integer) for x in ins):
        # Integers: exact in any order (s8 x s8 into s32 that cannot overflow here).
        a, b, acc = (x.astype(np.int64) for x in ins)
        out = a @ b + acc
        if np.abs(out).max(initial=0) >= 2 ** 31:
            raise ValueError("an integer dot overflows s32")
        return out.astype(np.int32)
    # Triton's InputPrecision: 0 tf32, 1 tf32x3, 2 ieee.
    if str(op.attributes["inputPrecision"]).split(":")[0].strip() not in ("2", "ieee"):
        raise NotImplementedError("a dot below IEEE precision: its sums are the target's")
    a, b, acc = (x.astype(np.float64) for x in ins)
    out = acc.astype(np.float32)
    for k in range(a.shape[1]):
        out = (a[:, k:k + 1] * b[k:k + 1, :] + out.astype(np.float64)).astype(np.float32)
    return out


def _inline_asm(op, ins, rtype):
    asm = str(op.attributes["asm_string"]).strip('"')
    if asm != "cvt.rni.f32.f32 $0, $1;":
        raise NotImplementedError("inline PTX %r" % asm)
    return np.rint(ins[0]).astype(np.float32)


def _fptosi(op, ins, rtype):
    _, dtype = _type(rtype)
    x, info = ins[0], np.iinfo(dtype)
    if np.isnan(x).any() or (x < info.min).any() or (x > info.max).any():
        raise ValueError("fptosi of NaN or of a value out of %s's range (poison)" % dtype.__name__)
    return np.trunc(x).astype(dtype)


def _reduce(op, ins, rtype):
    body = [inner.operation.name for inner in op.regions[0].blocks[0].operations]
    combine = {"arith.maxsi": np.max, "arith.minsi": np.min, "arith.maximumf": np.max,
               "arith.minimumf": np.min}.get(body[0])
    if len(body) != 2 or combine is None:
        raise NotImplementedError("a reduce of %s: its order is the target's" % body)
    return combine(ins[0], axis=int(str(op.attributes["axis"]).split(":")[0]))


# The arith ops mean here what they mean to the Mosaic interpreter (NaN in,
# NaN out for maximumf and minimumf; truncf rounds to nearest even).
OPS = {name: mosaic.OPS[name] for name in (
    "arith.constant", "arith.addi", "arith.muli", "arith.andi", "arith.maxsi", "arith.minsi",
    "arith.addf", "arith.mulf", "arith.maximumf", "arith.minimumf", "arith.cmpf",
    "arith.select", "arith.extf", "arith.truncf", "arith.sitofp")}
OPS.update({
    "tt.precise_divf": _binary(np.divide),
    "arith.fptosi": _fptosi,
    "tt.bitcast": mosaic.OPS["tpu.bitcast"],
    "tt.make_range": _make_range,
    "tt.splat": _splat,
    "tt.expand_dims": _expand_dims,
    "tt.broadcast": _broadcast,
    "tt.addptr": _addptr,
    "tt.dot": _dot,
    "tt.elementwise_inline_asm": _inline_asm,
    "tt.reduce": _reduce,
})


def run(text, grid_x, inputs, outputs):
    """Runs the kernel in `text` over `grid_x` programs: `inputs` and
    `outputs` are the call's whole operands and results (numpy arrays; the
    outputs are written in place and returned)."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.triton import dialect
    from jax._src.lib.mlir import ir
    ctx = jax_mlir.make_ir_context()
    dialect.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True
    buffers = [a.reshape(-1) for a in list(inputs) + list(outputs)]
    with ctx, np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        module = ir.Module.parse(text)
        funcs = [op.operation for op in module.body.operations if op.operation.name == "tt.func"]
        if len(funcs) != 1:
            raise ValueError("a module with %d kernels" % len(funcs))
        block = funcs[0].regions[0].blocks[0]
        if len(block.arguments) != len(buffers):
            raise ValueError("%d arguments for %d operands and results" % (
                len(block.arguments), len(buffers)))
        # Walked once: MLIR's bindings are slow per op.
        slots = {v: k for k, v in enumerate(block.arguments)}
        steps = []
        for op in block.operations:
            op = op.operation
            ins = [slots[v] for v in op.operands]
            if op.name == "tt.return":
                break
            if op.name == "tt.get_program_id":
                if str(op.attributes["axis"]).split(":")[0].strip() != "0":
                    raise NotImplementedError("a program id other than x's (a grid of one axis)")
                slots[op.results[0]] = len(slots)
                steps.append(("pid", None, None, ins, slots[op.results[0]]))
                continue
            if op.name == "tt.load" or op.name == "tt.store":
                if len(op.operands) != (1 if op.name == "tt.load" else 2):
                    raise NotImplementedError("a masked %s" % op.name)
                out = None
                if op.results:
                    out = slots[op.results[0]] = len(slots)
                steps.append((op.name, op, op.results[0].type if op.results else None, ins, out))
                continue
            if op.name not in OPS:
                raise NotImplementedError("Triton op %s is not one this interpreter knows" % op.name)
            out = slots[op.results[0]] = len(slots)
            steps.append((OPS[op.name], op, op.results[0].type, ins, out))
        for pid in range(grid_x):
            env = [_Pointers(k, np.int64(0)) for k in range(len(buffers))] + \
                [None] * (len(slots) - len(buffers))
            for fn, op, rtype, ins, out in steps:
                args = [env[k] for k in ins]
                if fn == "pid":
                    env[out] = np.int32(pid)
                elif fn == "tt.load":
                    p = args[0]
                    env[out] = buffers[p.arg][p.offsets]
                elif fn == "tt.store":
                    p, value = args
                    buf = buffers[p.arg]
                    buf[p.offsets] = value.astype(buf.dtype)
                else:
                    env[out] = fn(op, args, rtype)
    return outputs

