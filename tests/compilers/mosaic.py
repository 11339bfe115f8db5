"""Runs a Mosaic kernel body (the `stable_mosaic` form a `tpu_custom_call`
carries) on the host with numpy, so that the arithmetic of a kernel XLA:TPU
compiles can be checked where no TPU runs.

    outputs = run(body_text, inputs, outputs)   # numpy arrays, whole operands

The kernel's grid is walked in order; each step's windows are the blocks its
`transform_indices` functions name, scaled by `window_bounds`. Only the ops
the kernels under test use are known (`OPS`); any other is an error, not a
guess. The semantics are IEEE's, as numpy computes them in the operands'
own types, with these choices where MLIR leaves it to the target:

- `tpu.matmul` sums its terms in index order, one f32 rounding per term (the
  order XLA:CPU's dot takes at these sizes, `bench/micro/dot_order.py`);
- `arith.fptosi` of NaN is 0 and out-of-range values saturate (XLA's
  `convert`, which the XLA:CPU twin runs).

A TPU may order a product's sums otherwise and treats f32 subnormals as
zero; what is checked here is the kernel's logic (which element goes where,
in which order it is summed), against the HLO twin on XLA:CPU.
"""

import re

import numpy as np


def _dtype(name):
    import ml_dtypes
    return {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "i32": np.int32, "i16": np.int16,
            "i8": np.int8, "i1": np.bool_, "index": np.int64}[name]


def _type(t):
    """`vector<32x128xf32>`, `memref<..>`, `tensor<..>`, `f32`, `index` -> (shape,
    dtype)."""
    t = str(t)
    m = re.fullmatch(r"(?:vector|memref|tensor)<((?:\d+x)*)(\w+)(?:,.*)?>", t)
    if m:
        dims = tuple(int(d) for d in m.group(1).split("x") if d)
        return dims, _dtype(m.group(2))
    return (), _dtype(t)


def _attr(op, name):
    return op.attributes[name] if name in op.attributes else None


def _ints(attr):
    """`array<i32: 1>`, `[0, 1]`, `array<i64: 32, 128>` -> list of ints."""
    return [int(v) for v in re.findall(r"-?\d+", str(attr).split(":", 1)[-1] if "array<" in str(attr) else str(attr))]


def _constant(op, result_type):
    from jax._src.lib.mlir import ir
    shape, dtype = _type(result_type)
    attr = op.attributes["value"]
    text = str(attr)
    if text.startswith("dense<"):
        dense = ir.DenseElementsAttr(attr)
        if dense.is_splat:
            value = _scalar(str(dense.get_splat_value()), dtype)
            return np.full(shape, value, dtype)
        return np.asarray(dense).astype(dtype).reshape(shape)
    return np.asarray(_scalar(text, dtype), dtype)


def _scalar(text, dtype):
    """`64 : i32`, `0.000000e+00 : f32`, `0xFF800000 : f32`, `true` -> value."""
    value = text.split(":")[0].strip()
    if value in ("true", "false"):
        return value == "true"
    if value.startswith("0x"):
        bits = int(value, 16)
        return np.array(bits, np.uint32).view(np.float32) if dtype is np.float32 else bits
    return float(value) if np.issubdtype(np.dtype(dtype), np.floating) or dtype.__name__ == "bfloat16" \
        else int(value)


_CMPI = {0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater,
         5: np.greater_equal}
_CMPF = {1: np.equal, 2: np.greater, 3: np.greater_equal, 4: np.less, 5: np.less_equal}


def _matmul(lhs, rhs, acc):
    out = acc.astype(np.float32).copy()
    lhs, rhs = lhs.astype(np.float32), rhs.astype(np.float32)
    for k in range(lhs.shape[1]):
        out = out + lhs[:, k:k + 1] * rhs[k:k + 1, :]
    return out


def _fptosi(x, dtype):
    info = np.iinfo(dtype)
    x = np.where(np.isnan(x), 0, x)
    return np.clip(np.trunc(x), info.min, info.max).astype(dtype)


def _reduce(op, x, acc):
    kind = re.search(r"<(\w+)>", str(op.attributes["kind"])).group(1)
    dims = tuple(_ints(op.attributes["reduction_dims"]))
    fn = {"maximumf": np.max, "maxsi": np.max, "minimumf": np.min, "minsi": np.min,
          "add": np.sum}[kind]
    combine = {"maximumf": np.maximum, "maxsi": np.maximum, "minimumf": np.minimum,
               "minsi": np.minimum}.get(kind)
    if kind == "add":
        raise NotImplementedError("an add reduction's order is the target's")
    return combine(fn(x, axis=dims), acc)


def _program(func):
    """A `func.func`'s body as steps to run many times: (OPS entry, op,
    result type, operand slots, result slot), its argument count, its slot
    count and its return's slots. Walking MLIR's Python bindings costs a
    failed Python import per op, so each function is walked once, not once
    per grid step."""
    block = func.regions[0].blocks[0]
    slots = {}
    for value in block.arguments:
        slots[value] = len(slots)
    steps = []
    for op in block.operations:
        op = op.operation
        name = op.name.removeprefix("stable_mosaic.")
        ins = [slots[v] for v in op.operands]
        if name == "func.return":
            return steps, len(block.arguments), len(slots), ins
        if name not in OPS:
            raise NotImplementedError("Mosaic op %s is not one this interpreter knows" % name)
        results = list(op.results)
        out = None
        if results:
            out = slots[results[0]] = len(slots)
        steps.append((OPS[name], op, results[0].type if results else None, ins, out))
    raise ValueError("a function without a return")


def _body(program, args):
    """Runs a `_program` on `args`; returns what it returns."""
    steps, arity, size, returned = program
    env = list(args) + [None] * (size - arity)
    for fn, op, rtype, ins, out in steps:
        value = fn(op, [env[k] for k in ins], rtype)
        if out is not None:
            env[out] = value
    return [env[k] for k in returned]


def _load(op, ins, rtype):
    shape, _ = _type(rtype)
    ref, idx = ins[0], [int(i) for i in ins[1:]]
    return ref[tuple(slice(i, i + n) for i, n in zip(idx, shape))].copy()


def _store(op, ins, rtype):
    value, ref, idx = ins[0], ins[1], [int(i) for i in ins[2:]]
    if str(_attr(op, "add")) == "true":
        raise NotImplementedError("a vector_store that adds")
    ref[tuple(slice(i, i + n) for i, n in zip(idx, value.shape))] = value.astype(ref.dtype)


def _iota(op, ins, rtype):
    shape, dtype = _type(rtype)
    (dim,) = _ints(op.attributes["dimensions"])
    return np.indices(shape)[dim].astype(dtype)


def _slice(op, ins, rtype):
    offsets = _ints(op.attributes["offsets"])
    sizes = _ints(op.attributes["sizes"])
    strides = _ints(op.attributes["strides"])
    if any(s != 1 for s in strides):
        raise NotImplementedError("strided slices")
    return ins[0][tuple(slice(o, o + n) for o, n in zip(offsets, sizes))]


def _bitcast(op, ins, rtype):
    shape, dtype = _type(rtype)
    x = ins[0]
    if x.dtype.itemsize != np.dtype(dtype).itemsize:
        raise NotImplementedError("a bitcast that packs")
    return x.view(dtype).reshape(shape)


def _matmul_op(op, ins, rtype):
    dims = str(op.attributes["dimension_numbers"])
    if not dims.startswith("#tpu.dot_dimension_numbers<[1], [0], [0], [1]") or \
            str(_attr(op, "transpose_rhs")) == "true" or str(_attr(op, "transpose_lhs")) == "true":
        raise NotImplementedError("a matmul other than [m, k] x [k, n]: %s" % dims)
    return _matmul(*ins)


def _binary(fn):
    return lambda op, ins, rtype: fn(ins[0], ins[1]).astype(_type(rtype)[1])


def _convert(op, ins, rtype):
    return ins[0].astype(_type(rtype)[1])


OPS = {
    "arith.constant": lambda op, ins, rtype: _constant(op, rtype),
    "arith.addf": _binary(np.add),
    "arith.mulf": _binary(np.multiply),
    "arith.divf": _binary(np.divide),
    "arith.maximumf": _binary(np.maximum),
    "arith.minimumf": _binary(np.minimum),
    "arith.minsi": _binary(np.minimum),
    "arith.maxsi": _binary(np.maximum),
    "arith.andi": _binary(np.bitwise_and),
    "arith.ori": _binary(np.bitwise_or),
    "arith.xori": _binary(np.bitwise_xor),
    "arith.addi": _binary(np.add),
    "arith.subi": _binary(np.subtract),
    "arith.muli": _binary(np.multiply),
    "arith.divsi": _binary(lambda a, b: np.trunc(np.true_divide(a, b)).astype(np.asarray(a).dtype)),
    "arith.remsi": _binary(np.fmod),
    "arith.select": lambda op, ins, rtype: np.where(ins[0], ins[1], ins[2]),
    "arith.cmpi": lambda op, ins, rtype: _CMPI[int(str(op.attributes["predicate"]).split(":")[0])](*ins),
    "arith.cmpf": lambda op, ins, rtype: _CMPF[int(str(op.attributes["predicate"]).split(":")[0])](*ins),
    "arith.extf": _convert,
    "arith.truncf": _convert,  # round to nearest even (ml_dtypes)
    "arith.sitofp": _convert,
    "arith.fptosi": lambda op, ins, rtype: _fptosi(ins[0], _type(rtype)[1]),
    "arith.index_cast": _convert,
    "math.roundeven": lambda op, ins, rtype: np.rint(ins[0]),
    "math.absf": lambda op, ins, rtype: np.abs(ins[0]),
    "tpu.bitcast": _bitcast,
    "tpu.iota": _iota,
    "tpu.matmul": _matmul_op,
    "tpu.concatenate": lambda op, ins, rtype: np.concatenate(
        ins, axis=int(str(op.attributes["dimension"]).split(":")[0])),
    # jnp.roll's direction: element i goes to (i + shift) mod n.
    "tpu.dynamic_rotate": lambda op, ins, rtype: np.roll(
        ins[0], int(ins[1]), axis=int(str(op.attributes["dimension"]).split(":")[0])),
    "tpu.transpose": lambda op, ins, rtype: np.transpose(
        ins[0], _ints(op.attributes["permutation"])).copy(),
    "tpu.vector_store": _store,
    "vector.broadcast": lambda op, ins, rtype: np.broadcast_to(
        ins[0], _type(rtype)[0]).astype(_type(rtype)[1]).copy(),
    "vector.shape_cast": lambda op, ins, rtype: ins[0].reshape(_type(rtype)[0]),
    "vector.extract_strided_slice": _slice,
    "vector.load": _load,
    "vector.multi_reduction": lambda op, ins, rtype: _reduce(op, *ins),
}


def run(body, inputs, outputs):
    """Runs the kernel in `body` (MLIR text or bytecode) over its grid:
    `inputs` and `outputs` are the custom call's whole operands and results
    (numpy arrays; the outputs are written in place and returned)."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib import tpu as dialect
    from jax._src.lib.mlir import ir
    ctx = jax_mlir.make_ir_context()
    dialect.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True
    # NaN and Inf are inputs like any other here (a NaN x 0 is NaN, as on the target).
    with ctx, np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        module = ir.Module.parse(body)
        funcs = {str(op.attributes["sym_name"]).strip('"'): op.operation
                 for op in module.body.operations}
        kernels = [f for f in funcs.values() if "window_params" in f.attributes]
        if len(kernels) != 1:
            raise ValueError("a body with %d kernels" % len(kernels))
        kernel = kernels[0]
        if str(_attr(kernel, "scalar_prefetch")).split(":")[0].strip() not in ("0", "None"):
            raise NotImplementedError("scalar prefetch")
        bounds = _ints(kernel.attributes["iteration_bounds"])
        params = ir.ArrayAttr(kernel.attributes["window_params"])
        operands = list(inputs) + list(outputs)
        if len(params) != len(operands):
            raise ValueError("%d window params for %d operands" % (len(params), len(operands)))
        windows = []
        for param in params:
            param = ir.DictAttr(param)
            window = _ints(param["window_bounds"])
            transform = str(param["transform_indices"]).lstrip("@")
            windows.append((window, _program(funcs[transform])))
        kernel_program = _program(kernel)
        for step in np.ndindex(*bounds):
            grid = [np.asarray(i, np.int32) for i in step]
            views = []
            for array, (window, transform) in zip(operands, windows):
                blocks = [int(b) for b in _body(transform, grid)]
                index = tuple(slice(b * w, (b + 1) * w) for b, w in zip(blocks, window))
                views.append((array, index, array[index].copy()))
            _body(kernel_program, grid + [v for _, _, v in views])
            for array, index, view in views[len(inputs):]:
                array[index] = view
    return outputs
