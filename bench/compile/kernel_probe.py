"""What XLA:TPU and XLA:GPU (deviceless) make of a two-shot quantized psum
whose three compute steps are one hand-written kernel each (Pallas: Mosaic
on TPU, Triton on GPU): kernels and compile time against the plain program,
side by side in one process (and, with `--equarx`, equarx's own rewrite).

    target/compilers/bin/python bench/compile/kernel_probe.py --program psum|mlp|gemma \\
        [--topology v5e:2x2|h100x4] [--rounds 3] [--rows-per-step N] [--scales rows|lanes] \\
        [--no-rotation] [--text-bodies] [--equarx]
    EQUARX_LIB=target/release/libequarx.so PYTHONPATH=python \\
        target/compilers/bin/python bench/compile/kernel_probe.py --check [--shape 256,640] ...

A probe of a form, not equarx's emission: the programs are
`bench/compile/compilers.py`'s, every `jax.lax.psum` replaced by a two-shot
written in Pallas, int8, B = 64, the Hadamard rotation a product in the
kernel:

1. quantize: rotate, each block's absmax, codes (s8) and scales;
2. all-to-all of codes and scales;
3. dequantize the P messages, sum, requantize;
4. all-gather of codes and scales;
5. dequantize and rotate back.

Steps 1, 3 and 5 are one kernel each, `--rows-per-step` rows a grid step.

- XLA:TPU (Mosaic): the payload as `[rows, C]` (C a multiple of 128), each
  128 lanes two blocks, unrolled over the row. The arithmetic is equarx's
  int8 contract op for op (`docs/numerics.md`: the absmax from the bits of
  |x| and a floor, capped at +Inf; the bf16 scale; codes against its
  reciprocal; the exchange's sum in equarx's order; `(H·q)·scale` back),
  and `--check` holds it to equarx's own XLA:TPU emission bit for bit,
  run two ways: in Pallas's interpreter on P XLA:CPU devices, and as the
  Mosaic text libtpu compiles (lowered for TPU, each body run on the host
  by `tests/compilers/mosaic.py`, the collectives in numpy); equarx's
  rewrite (`platform=tpu`, the same plan) runs on the same devices, on a
  heavy-tailed input with a NaN, an Inf and a zero block. Each block is
  rotated by its own product (the other block's lanes zeroed), since in one
  block-diagonal product of both a NaN's zero terms spill into its
  neighbour. `--scales rows` (the default) keeps a step's scales
  `[rows, C/64]`, which libtpu relayouts around the scales' collectives (a
  copy each side of the all-to-all); `--scales lanes` stores them
  transposed, `[P, C/64, rows/P]`, which it moves as they are (a step is
  then a multiple of 128 rows, the lanes of the scales' block); `--scales
  slab` stores them so too but keeps 32-row steps: a destination's slab
  `[C/64, rows/P]` is one window that its steps revisit, each writing its
  rows' scales into its lanes (transposed, rotated there by a dynamic
  rotate, the other lanes kept) and reading them back the same way; rows/P
  a multiple of 128. `slab` is what equarx's own kernels (`kernels=mosaic`)
  do. s8's tile is 32 rows, the least step.
- XLA:GPU (Triton): the payload as block rows `[n, 64]`, a step 64 rows
  (the default), f32 scales `[n]`; the numerics only near equarx's
  (absmax / 127, round half up, since Pallas's Triton lowering has no
  `round`): what is measured there is what such kernels cost to compile.

Nothing runs on a device.

`--text-bodies` re-serializes every kernel's body as MLIR text before the
compile (jax writes bytecode): `stable_mosaic` generic text on TPU, Triton
text on GPU. A pass could write those without MLIR's libraries.
"""

import argparse
import base64
import copy
import os
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compilers  # noqa: E402  (the programs, topologies and the census of kernels)


def hadamard(n):
    import numpy as np
    return np.array([[1 - 2 * (bin(i & j).count("1") % 2) for j in range(n)] for i in range(n)],
                    np.float32) / np.sqrt(n)


# Where equarx's own kernels (`kernels=mosaic`) keep the scales.
EQUARX_FORM = "slab"
FLOOR_BITS = 0x04000000  # 2^-119, int8's absmax floor (equarx::numerics::absmax_floor)
INF_BITS = 0x7F800000


def pairwise(parts):
    """equarx's order for a sum of parts: halves added, the odd one carried."""
    while len(parts) > 1:
        h = len(parts) // 2
        parts = [parts[k] + parts[k + h] for k in range(h)] + parts[2 * h:]
    return parts[0]


def mosaic_psum(tm, form, rotation, interpret=False):
    """`qpsum(x, axis, n)` over three Mosaic kernels, equarx's int8 contract
    (B = 64, bf16 scales) op for op; `form`, where the scales go: rows, lanes or slab (the
    module's docstring)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    scales_in_lanes = form == "lanes"
    slab = form == "slab"
    # Two blocks per 128 lanes; entries +-1/8, the norm folded in (exact).
    h128 = np.kron(np.eye(2, dtype=np.float32), hadamard(64))
    inv_qmax = np.float32(1) / np.float32(127)

    def low_half(shape):
        return jax.lax.broadcasted_iota(jnp.int32, shape, len(shape) - 1) < 64

    def quantize(y):
        """f32 [tm, 128], two blocks -> s8 codes and the two bf16 scales [tm, 1]."""
        lo = low_half(y.shape)
        # The largest bits of |x| from the floor, capped at +Inf's: the
        # absmax, +Inf where a block holds a NaN or an Inf.
        bits = jax.lax.bitcast_convert_type(y, jnp.int32) & 0x7FFFFFFF
        scales = []
        for half in (lo, ~lo):
            m = jnp.max(jnp.where(half, bits, FLOOR_BITS), axis=-1, keepdims=True)
            absmax = jax.lax.bitcast_convert_type(jnp.minimum(m, INF_BITS), jnp.float32)
            scales.append((absmax * inv_qmax).astype(jnp.bfloat16))
        scale = jnp.where(lo, scales[0].astype(jnp.float32), scales[1].astype(jnp.float32))
        ratio = y * (1.0 / scale)
        return jnp.clip(jnp.round(ratio), -127.0, 127.0).astype(jnp.int8), scales

    def rotate(y, h):
        """Both blocks of f32 [tm, 128] rotated, each by its own product with
        the other block's lanes zeroed: in one product a NaN's zero terms
        (NaN x 0) would spill into the other block."""
        lo = low_half(y.shape)
        low = jnp.dot(jnp.where(lo, y, 0.0), h, preferred_element_type=jnp.float32)
        high = jnp.dot(jnp.where(lo, 0.0, y), h, preferred_element_type=jnp.float32)
        return jnp.where(lo, low, high)

    def as_rows(columns):
        """[tm, 1] columns -> f32 [tm, k], column k the k-th."""
        lane = jax.lax.broadcasted_iota(jnp.int32, (columns[0].shape[0], len(columns)), 1)
        acc = jnp.zeros((columns[0].shape[0], len(columns)), jnp.float32)
        for k, c in enumerate(columns):
            acc = jnp.where(lane == k, c.astype(jnp.float32), acc)
        return acc

    def offset(s_ref):
        """Slab: where this grid step's rows sit in its destination's lanes."""
        m = s_ref.shape[-1]
        return jax.lax.rem(pl.program_id(0), m // tm) * tm

    def load_scales(s_ref):
        """A step's scales as f32 [tm, nb] (read transposed where they are stored so)."""
        s = s_ref[...].astype(jnp.float32)
        if slab:  # the step's lanes rotated to the front, then its rows
            m = s.shape[-1]
            if m > tm:
                s = pltpu.roll(s, jax.lax.rem(m - offset(s_ref), m), 1)
            return s[:, :tm].T
        return s.T if scales_in_lanes else s

    def store_scales(s_ref, columns):
        if slab:  # the step's scales into its lanes of the [nb, m] slab
            m, nb = s_ref.shape[-1], len(columns)
            rows = as_rows(columns)
            if m > tm:
                rows = jnp.concatenate([rows, jnp.zeros((m - tm, nb), jnp.float32)], axis=0)
            t = rows.T
            if m > tm:
                at = offset(s_ref)
                t = pltpu.roll(t, at, 1)
                lane = jax.lax.broadcasted_iota(jnp.int32, t.shape, 1)
                t = jnp.where((lane >= at) & (lane < at + tm), t, s_ref[...].astype(jnp.float32))
            s_ref[...] = t.astype(jnp.bfloat16)
        elif scales_in_lanes:
            s_ref[...] = as_rows(columns).T.astype(jnp.bfloat16)
        else:
            for k, c in enumerate(columns):
                s_ref[:, k:k + 1] = c

    def chunk_scales(s, j, lo):
        return jnp.where(lo, s[:, 2 * j:2 * j + 1], s[:, 2 * j + 1:2 * j + 2])

    def quantize_kernel(x_ref, h_ref, c_ref, s_ref):
        columns = []
        for j in range(x_ref.shape[1] // 128):
            y = x_ref[:, j * 128:(j + 1) * 128].astype(jnp.float32)
            if rotation:
                y = rotate(y, h_ref[...])
            q, s = quantize(y)
            c_ref[:, j * 128:(j + 1) * 128] = q
            columns += s
        store_scales(s_ref if form == "rows" else s_ref.at[0], columns)

    def sum_kernel(c_ref, s_ref, co_ref, so_ref):
        n = c_ref.shape[0]
        lo = low_half((c_ref.shape[1], 128))
        scales = [load_scales(s_ref.at[p]) for p in range(n)]
        columns = []
        for j in range(c_ref.shape[2] // 128):
            parts = [c_ref[p, :, j * 128:(j + 1) * 128].astype(jnp.float32) * chunk_scales(scales[p], j, lo)
                     for p in range(n)]
            q, s = quantize(pairwise(parts))
            co_ref[:, j * 128:(j + 1) * 128] = q
            columns += s
        store_scales(so_ref if form == "rows" else so_ref.at[0], columns)

    def dequantize_kernel(c_ref, s_ref, h_ref, o_ref):
        lo = low_half((c_ref.shape[0], 128))
        scales = load_scales(s_ref if form == "rows" else s_ref.at[0])
        for j in range(c_ref.shape[1] // 128):
            q = c_ref[:, j * 128:(j + 1) * 128].astype(jnp.float32)
            if rotation:  # (H.q).scale: the integer sums are exact
                q = jnp.dot(q, h_ref[...], preferred_element_type=jnp.float32)
            o_ref[:, j * 128:(j + 1) * 128] = (q * chunk_scales(scales, j, lo)).astype(o_ref.dtype)

    def qpsum(x, axis, n):
        shape, dtype = x.shape, x.dtype
        x = x.reshape(-1, shape[-1])
        r, cols = x.shape
        if cols % 128 or r % (n * tm):
            raise SystemExit("psum operand %s: the TPU probe needs a last dimension of a multiple "
                             "of 128 and rows a multiple of %d" % (shape, n * tm))
        nb, m = cols // 64, r // n
        per = m // tm  # a destination's steps
        h = jnp.asarray(h128)
        row = lambda w: pl.BlockSpec((tm, w), lambda i: (i, 0))  # noqa: E731
        hs = pl.BlockSpec((128, 128), lambda i: (0, 0))
        codes = lambda k: (row(cols), jax.ShapeDtypeStruct((k, cols), jnp.int8))  # noqa: E731
        if slab:  # a destination's [nb, m] slab, revisited by its steps
            spec = pl.BlockSpec((1, nb, m), lambda i: (jax.lax.div(i, per), 0, 0))
            scale = lambda k: (spec, jax.ShapeDtypeStruct((k // m, nb, m), jnp.bfloat16))  # noqa: E731
            sums_in = pl.BlockSpec((n, nb, m), lambda i: (0, 0, 0))
        elif scales_in_lanes:
            spec = pl.BlockSpec((1, nb, tm), lambda i: (jax.lax.div(i, per), 0, jax.lax.rem(i, per)))
            scale = lambda k: (spec, jax.ShapeDtypeStruct((k // m, nb, m), jnp.bfloat16))  # noqa: E731
            sums_in = pl.BlockSpec((n, nb, tm), lambda i: (0, 0, i))
        else:
            scale = lambda k: (row(nb), jax.ShapeDtypeStruct((k, nb), jnp.bfloat16))  # noqa: E731
            sums_in = pl.BlockSpec((n, tm, nb), lambda i: (0, i, 0))

        def call(kernel, rows, ins, in_specs, outs):
            return pl.pallas_call(kernel, grid=(rows // tm,), in_specs=in_specs,
                                  out_specs=[o for o, _ in outs], out_shape=[s for _, s in outs],
                                  interpret=interpret)(*ins)

        c, s = call(quantize_kernel, r, (x, h), [row(cols), hs], [codes(r), scale(r)])
        c = jax.lax.all_to_all(c.reshape(n, m, cols), axis, 0, 0, tiled=False)
        s = jax.lax.all_to_all(s if form != "rows" else s.reshape(n, m, nb), axis, 0, 0, tiled=False)
        c, s = call(sum_kernel, m, (c, s), [pl.BlockSpec((n, tm, cols), lambda i: (0, i, 0)), sums_in],
                    [codes(m), scale(m)])
        c = jax.lax.all_gather(c, axis, tiled=True)
        s = jax.lax.all_gather(s, axis, tiled=True)
        (y,) = call(dequantize_kernel, r, (c, s, h), [row(cols), scale(r)[0], hs],
                    [(row(cols), jax.ShapeDtypeStruct((r, cols), dtype))])
        return y.reshape(shape)

    return qpsum


def triton_psum(tm, rotation):
    """`qpsum(x, axis, n)` over three Triton kernels, the payload as block rows."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pltriton

    params = pltriton.CompilerParams(num_warps=4, num_stages=1)

    def quantize(y):
        s = jnp.max(jnp.abs(y), axis=-1, keepdims=True) / 127.0
        inv = jnp.where(s > 0, 1.0 / s, 0.0)
        return jnp.clip(jnp.floor(y * inv + 0.5), -127, 127).astype(jnp.int8), s[:, 0]

    def quantize_kernel(x_ref, h_ref, c_ref, s_ref):
        y = x_ref[...].astype(jnp.float32)
        if rotation:
            y = jnp.dot(y, h_ref[...], preferred_element_type=jnp.float32)
        c_ref[...], s_ref[...] = quantize(y)

    def sum_kernel(c_ref, s_ref, co_ref, so_ref):
        acc = None
        for p in range(c_ref.shape[0]):
            term = c_ref[p].astype(jnp.float32) * s_ref[p][:, None]
            acc = term if acc is None else acc + term
        co_ref[...], so_ref[...] = quantize(acc)

    def dequantize_kernel(c_ref, s_ref, h_ref, o_ref):
        y = c_ref[...].astype(jnp.float32) * s_ref[...][:, None]
        if rotation:
            y = jnp.dot(y, h_ref[...], preferred_element_type=jnp.float32)
        o_ref[...] = y.astype(o_ref.dtype)

    def qpsum(x, axis, n):
        shape, dtype = x.shape, x.dtype
        x = x.reshape(-1, 64)
        r = x.shape[0]
        if r % (n * tm):
            raise SystemExit("psum operand %s: the GPU probe needs %d-element blocks in rows of "
                             "a multiple of %d" % (shape, 64, n * tm))
        m = r // n
        h = jnp.asarray(hadamard(64))
        row = pl.BlockSpec((tm, 64), lambda i: (i, 0))
        sc = pl.BlockSpec((tm,), lambda i: (i,))
        hs = pl.BlockSpec((64, 64), lambda i: (0, 0))
        message = lambda k: [(row, jax.ShapeDtypeStruct((k, 64), jnp.int8)),  # noqa: E731
                             (sc, jax.ShapeDtypeStruct((k,), jnp.float32))]

        def call(kernel, rows, ins, in_specs, outs):
            return pl.pallas_call(kernel, grid=(rows // tm,), in_specs=in_specs,
                                  out_specs=[o for o, _ in outs], out_shape=[s for _, s in outs],
                                  compiler_params=params)(*ins)

        c, s = call(quantize_kernel, r, (x, h), [row, hs], message(r))
        c = jax.lax.all_to_all(c.reshape(n, m, 64), axis, 0, 0, tiled=False)
        s = jax.lax.all_to_all(s.reshape(n, m), axis, 0, 0, tiled=False)
        c, s = call(sum_kernel, m, (c, s), [pl.BlockSpec((n, tm, 64), lambda i: (0, i, 0)),
                                            pl.BlockSpec((n, tm), lambda i: (0, i))], message(m))
        c = jax.lax.all_gather(c, axis, tiled=True)
        s = jax.lax.all_gather(s, axis, tiled=True)
        (y,) = call(dequantize_kernel, r, (c, s, h), [row, sc, hs],
                    [(row, jax.ShapeDtypeStruct((r, 64), dtype))])
        return y.reshape(shape)

    return qpsum


def with_text_bodies(lowered, platform):
    """`lowered` with every kernel's body re-serialized as MLIR text."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir
    ctx = jax_mlir.make_ir_context()
    ctx.allow_unregistered_dialects = True
    if platform == "tpu":
        from jax._src.lib import tpu as dialect
        text = str(lowered.compiler_ir("stablehlo"))
        dialect.register_dialect(ctx)
        with ctx:
            for body in set(re.findall(r'\\22body\\22: \\22([A-Za-z0-9+/=]+)\\22', text)):
                printed = str(ir.Module.parse(base64.b64decode(body)))
                assert printed.startswith("module attributes {stable_mosaic.version"), printed[:80]
                text = text.replace(body, base64.b64encode(printed.encode()).decode())
        with jax_mlir.make_ir_context():
            module = ir.Module.parse(text)
    else:
        from jax._src.lib.triton import dialect
        dialect.register_dialect(ctx)
        module = lowered.compiler_ir("stablehlo")
        with module.context:
            for op in walk(module.operation):
                if op.name != "stablehlo.custom_call":
                    continue
                key = "mhlo.backend_config" if "mhlo.backend_config" in op.attributes else "backend_config"
                config = ir.DictAttr(op.attributes[key])
                fields = {config[i].name: config[i].attr for i in range(len(config))}
                with ctx:
                    printed = str(ir.Module.parse(ir.StringAttr(fields["ir"]).value_bytes))
                assert "tt.func" in printed, printed[:80]
                fields["ir"] = ir.StringAttr.get(printed)
                op.attributes[key] = ir.DictAttr.get(fields)
    lowering = copy.copy(lowered._lowering)
    lowering._hlo, lowering._executable = module, None
    lowered = copy.copy(lowered)
    lowered._lowering = lowering
    return lowered


def walk(op):
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from walk(inner.operation)


def check_input(rows, cols, n):
    """The mesh of `n` XLA:CPU devices and the checks' input, `[n·rows,
    cols]` bf16 sharded by rows: heavy tails, a few outlier channels, a NaN
    and an Inf in one block each, an all-zero block."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices("cpu")[:n]), ("x",))
    rng = np.random.default_rng(0)
    x = rng.standard_t(3, (n * rows, cols)).astype(np.float32)
    x[:, rng.choice(cols, 4, replace=False)] *= 100
    x[3, 5], x[rows + 7, 70] = np.nan, np.inf
    x[2 * rows:2 * rows + 1, :64] = 0  # an all-zero block
    return mesh, jax.device_put(jnp.asarray(x, jnp.bfloat16), NamedSharding(mesh, P("x")))


def check(rows, cols, tm, form, rotation, n):
    """The Mosaic kernels against equarx's own rewrite (XLA:TPU's emission,
    `platform=tpu`, the same plan) of the same psum on `n` XLA:CPU devices,
    every device's result bit for bit, run two ways: by Pallas's interpreter
    (the kernels as written), and as the Mosaic text libtpu compiles (lowered
    for TPU, run by `tests/compilers/mosaic.py`, the collectives between
    them in numpy). Returns the count of elements that differ."""
    import jax
    import numpy as np
    import equarx.jax
    from jax.sharding import PartitionSpec as P
    mesh, x = check_input(rows, cols, n)

    def shard_mapped(body):
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                     check_vma=False))

    options = dict(platform="tpu", algorithm="two-shot", quant_format="int8", block_size=64,
                   scale_type="bf16", rotation="hadamard" if rotation else "none",
                   min_payload_bytes=0)
    # The HLO emission (XLA:TPU's default is the Mosaic kernels, which
    # XLA:CPU cannot run): the kernels' twin.
    rewritten = equarx.jax.rewrite_lowered(
        shard_mapped(lambda a: jax.lax.psum(a, "x")).lower(x), kernels="hlo", **options)
    print("equarx's plan: %s" % json_plan(equarx.jax.last_report()))
    results = {"equarx": np.asarray(rewritten.compile()(x))}
    interpreted = mosaic_psum(tm, form, rotation, interpret=True)
    results["Pallas interpreter"] = np.asarray(shard_mapped(lambda a: interpreted(a, "x", n))(x))
    qpsum = mosaic_psum(tm, form, rotation)
    lowered = shard_mapped(lambda a: qpsum(a, "x", n)).trace(x).lower(lowering_platforms=("tpu",))
    bodies = re.findall(r'\\22body\\22: \\22([A-Za-z0-9+/=]+)\\22', str(lowered.compiler_ir("stablehlo")))
    results["Mosaic text"] = mosaic_text_psum([base64.b64decode(b) for b in bodies],
                                              np.asarray(x), n, tm, form, True)
    # equarx's own kernels (`kernels=mosaic`), their text as the door wrote it.
    emitted = equarx.jax.rewrite_lowered(
        shard_mapped(lambda a: jax.lax.psum(a, "x")).lower(x), kernels="mosaic", **options)
    report = equarx.jax.last_report()
    if json_plan(report).find('"kernels": "mosaic"') < 0:
        raise SystemExit("equarx did not write Mosaic kernels: %s" % report)
    bodies = re.findall(r'\\22body\\22: \\22([A-Za-z0-9+/=]+)\\22', str(emitted.compiler_ir("stablehlo")))
    results["equarx's kernels"] = mosaic_text_psum([base64.b64decode(b) for b in bodies],
                                                   np.asarray(x), n, 32, EQUARX_FORM, rotation)
    theirs = results.pop("equarx").astype(np.float32)
    differ = 0
    for name, mine in results.items():
        mine = mine.astype(np.float32)
        bits = mine.view(np.uint32) != theirs.view(np.uint32)
        values = bits & ~(np.isnan(mine) & np.isnan(theirs))
        replicas = all(np.array_equal(m.view(np.uint32), mine.reshape(n, rows, cols)[0].view(np.uint32))
                       for m in mine.reshape(n, rows, cols))
        print("%-18s elements %d, differing bits %d (NaN payloads aside: %d), non-finite %d "
              "(equarx %d), replicas identical %s" % (
                  name, mine.size, bits.sum(), values.sum(), (~np.isfinite(mine)).sum(),
                  (~np.isfinite(theirs)).sum(), replicas))
        differ += int(values.sum())
    return differ


def check_collective(collective, rows, cols, rotation, n):
    """equarx's Mosaic kernels of an all-gather (quantize, dequantize) or a
    reduce-scatter (quantize, sum) of each device's `[rows, C]` along its
    rows (the collective between the kernels done here in numpy, each body
    run by `tests/compilers/mosaic.py`) against equarx's HLO emission of the
    same plan for XLA:TPU on `n` XLA:CPU devices, bit for bit, every
    device's result. Returns the count of elements that differ."""
    import jax
    import ml_dtypes
    import numpy as np
    import equarx.jax
    from jax.sharding import PartitionSpec as P
    sys.path.insert(0, os.path.join(compilers.REPO, "tests/compilers"))
    import mosaic
    mesh, x = check_input(rows, cols, n)
    if collective == "all-gather":
        body = lambda a: jax.lax.all_gather(a, "x", tiled=True)  # noqa: E731
    else:
        body = lambda a: jax.lax.psum_scatter(a, "x", tiled=True)  # noqa: E731
    program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                    check_vma=False))
    options = dict(platform="tpu", quant_format="int8", block_size=64, scale_type="bf16",
                   rotation="hadamard" if rotation else "none", min_payload_bytes=0)
    if collective == "reduce-scatter":
        options["algorithm"] = "two-shot"
    rewritten = equarx.jax.rewrite_lowered(program.lower(x), kernels="hlo", **options)
    print("equarx's plan: %s" % json_plan(equarx.jax.last_report()))
    theirs = np.asarray(rewritten.compile()(x)).astype(np.float32)
    emitted = equarx.jax.rewrite_lowered(program.lower(x), kernels="mosaic", **options)
    report = equarx.jax.last_report()
    if json_plan(report).find('"kernels": "mosaic"') < 0:
        raise SystemExit("equarx did not write Mosaic kernels: %s" % report)
    text = str(emitted.compiler_ir("stablehlo"))
    bodies = [base64.b64decode(b) for b in re.findall(r'\\22body\\22: \\22([A-Za-z0-9+/=]+)\\22', text)]
    if len(bodies) != 2:
        raise SystemExit("equarx wrote %d kernels for the %s, not 2" % (len(bodies), collective))
    h = [np.kron(np.eye(2, dtype=np.float32), hadamard(64))] if rotation else []
    nb, xs, bf16 = cols // 64, np.asarray(x), ml_dtypes.bfloat16
    if collective == "all-gather":
        quantize, dequantize = bodies
        sent = [mosaic.run(quantize, [xs[d * rows:(d + 1) * rows]] + h,
                           [np.zeros((rows, cols), np.int8), np.zeros((1, nb, rows), bf16)])
                for d in range(n)]
        codes = np.concatenate([c for c, _ in sent])
        scales = np.concatenate([s for _, s in sent])
        out = mosaic.run(dequantize, [codes, scales] + h, [np.zeros((n * rows, cols), bf16)])[0]
        mine = np.concatenate([out] * n).astype(np.float32)
    else:
        quantize, summed = bodies
        m = rows // n
        sent = [mosaic.run(quantize, [xs[d * rows:(d + 1) * rows]] + h,
                           [np.zeros((rows, cols), np.int8), np.zeros((n, nb, m), bf16)])
                for d in range(n)]
        mine = np.concatenate([
            mosaic.run(summed, [np.stack([c.reshape(n, m, cols)[d] for c, _ in sent]),
                                np.stack([s[d] for _, s in sent])] + h,
                       [np.zeros((m, cols), bf16)])[0]
            for d in range(n)]).astype(np.float32)
    # An all-gather's every device holds the same; a reduce-scatter's its own.
    return differing("equarx's kernels", mine, theirs, n, collective == "all-gather")


def differing(name, mine, theirs, n, replicated):
    """Prints and returns how many elements of `mine` differ from `theirs`
    (f32 arrays of every device's result) in their bits, two NaNs counted
    alike; with `replicated`, whether every device's part of `theirs` is
    the same too."""
    import numpy as np
    bits = mine.view(np.uint32) != theirs.view(np.uint32)
    values = bits & ~(np.isnan(mine) & np.isnan(theirs))
    replicas = not replicated or all(
        np.array_equal(r.view(np.uint32), theirs.reshape(n, -1)[0].view(np.uint32))
        for r in theirs.reshape(n, -1))
    print("%-18s elements %d, differing bits %d (NaN payloads aside: %d), non-finite %d "
          "(equarx %d), replicas identical %s" % (
              name, mine.size, bits.sum(), values.sum(), (~np.isfinite(mine)).sum(),
              (~np.isfinite(theirs)).sum(), replicas))
    return int(values.sum())


def triton_calls(lowered):
    """The Triton calls of a lowered module, in program order: (IR text,
    grid_x) each."""
    from jax._src.lib.mlir import ir
    module = lowered.compiler_ir("stablehlo")
    calls = []
    with module.context:
        for op in walk(module.operation):
            if op.name != "stablehlo.custom_call" or \
                    "__gpu$xla.gpu.triton" not in str(op.attributes["call_target_name"]):
                continue
            key = "mhlo.backend_config" if "mhlo.backend_config" in op.attributes else "backend_config"
            config = ir.DictAttr(op.attributes[key])
            fields = {config[i].name: config[i].attr for i in range(len(config))}
            calls.append((ir.StringAttr(fields["ir"]).value,
                          int(str(fields["grid_x"]).split(":")[0])))
    return calls


def check_triton(collective, rows, cols, rotation, n):
    """equarx's Triton kernels (`kernels=triton`, written for XLA:GPU) of a
    psum, an all-gather or a reduce-scatter of each device's `[rows, C]`
    (along its rows), each run by `tests/compilers/triton.py`, the
    collectives between them done here in numpy, against equarx's HLO
    emission of the same plan for XLA:GPU on `n` XLA:CPU devices, bit for
    bit, every device's result. Returns the count of elements that differ."""
    import jax
    import ml_dtypes
    import numpy as np
    import equarx.jax
    from jax.sharding import PartitionSpec as P
    sys.path.insert(0, os.path.join(compilers.REPO, "tests/compilers"))
    import triton as interpreter
    mesh, x = check_input(rows, cols, n)
    body = {"psum": lambda a: jax.lax.psum(a, "x"),
            "all-gather": lambda a: jax.lax.all_gather(a, "x", tiled=True),
            "reduce-scatter": lambda a: jax.lax.psum_scatter(a, "x", tiled=True)}[collective]
    program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                    check_vma=False))
    options = dict(platform="gpu", quant_format="int8", block_size=64, scale_type="bf16",
                   rotation="hadamard" if rotation else "none", min_payload_bytes=0)
    if collective != "all-gather":
        options["algorithm"] = "two-shot"
    rewritten = equarx.jax.rewrite_lowered(program.lower(x), kernels="hlo", **options)
    print("equarx's plan: %s" % json_plan(equarx.jax.last_report()))
    theirs = np.asarray(rewritten.compile()(x)).astype(np.float32)
    emitted = equarx.jax.rewrite_lowered(program.lower(x), kernels="triton", **options)
    if json_plan(equarx.jax.last_report()).find('"kernels": "triton"') < 0:
        raise SystemExit("equarx did not write Triton kernels: %s" % equarx.jax.last_report())
    calls = triton_calls(emitted)
    want = 3 if collective == "psum" else 2
    if len(calls) != want:
        raise SystemExit("equarx wrote %d Triton kernels for the %s, not %d" % (
            len(calls), collective, want))
    h = [hadamard(64)] if rotation else []
    # The dequantize rotates by the matrix's signs, in s8.
    signs = [np.sign(hadamard(64)).astype(np.int8)] if rotation else []
    xs, bf16 = np.asarray(x), ml_dtypes.bfloat16
    nb = rows * cols // 64  # a device's block rows

    def call(k, inputs, outputs):
        ir_text, grid = calls[k]
        return interpreter.run(ir_text, grid, inputs, outputs)

    def quantize(d, r):
        return call(0, [xs[d * rows:(d + 1) * rows].reshape(r, 64)] + h,
                    [np.zeros((r, 64), np.int8), np.zeros((r,), bf16)])

    if collective == "all-gather":
        sent = [quantize(d, nb) for d in range(n)]
        codes = np.concatenate([c for c, _ in sent])
        scales = np.concatenate([s for _, s in sent])
        out = call(1, [codes, scales] + signs, [np.zeros((n * nb, 64), bf16)])[0]
        mine = np.concatenate([out.reshape(n * rows, cols)] * n).astype(np.float32)
    else:
        m = nb // n
        sent = [quantize(d, nb) for d in range(n)]
        summed = []
        for d in range(n):
            codes = np.stack([c.reshape(n, m, 64)[d] for c, _ in sent])
            scales = np.stack([s.reshape(n, m)[d] for _, s in sent])
            if collective == "psum":
                summed.append(call(1, [codes, scales], [np.zeros((m, 64), np.int8),
                                                        np.zeros((m,), bf16)]))
            else:
                summed.append(call(1, [codes, scales] + h, [np.zeros((m, 64), bf16)])[0])
        if collective == "psum":
            codes = np.concatenate([c for c, _ in summed])
            scales = np.concatenate([s for _, s in summed])
            out = call(2, [codes, scales] + signs, [np.zeros((nb, 64), bf16)])[0]
            mine = np.concatenate([out.reshape(rows, cols)] * n).astype(np.float32)
        else:
            mine = np.concatenate(summed).reshape(rows, cols).astype(np.float32)
    # A reduce-scatter's every device holds its own part.
    return differing("equarx's Triton", mine, theirs, n, collective != "reduce-scatter")


def mosaic_text_psum(bodies, x, n, tm, form, matrix):
    """The two-shot psum of `x` (`[n·rows, C]`, device k's rows the k-th
    run) from the three kernels' Mosaic bodies (quantize, sum, dequantize),
    each run by `tests/compilers/mosaic.py`, the all-to-all and the
    all-gather done here; returns every device's result, `[n·rows, C]`.
    `matrix`: the quantize and dequantize kernels take the rotation's."""
    import ml_dtypes
    import numpy as np
    sys.path.insert(0, os.path.join(compilers.REPO, "tests/compilers"))
    import mosaic
    quantize, summed, dequantize = bodies
    r, cols = x.shape[0] // n, x.shape[1]
    m, nb = r // n, cols // 64
    h = np.kron(np.eye(2, dtype=np.float32), hadamard(64))
    bf16 = ml_dtypes.bfloat16

    def scales(rows):
        return np.zeros((rows, nb) if form == "rows" else (max(rows // m, 1), nb, m), bf16)

    def parts(array):
        """A device's array as its n parts, part k for rank k."""
        return array if form != "rows" and array.ndim == 3 else array.reshape(n, m, -1)

    h = [h] if matrix else []
    sent = [mosaic.run(quantize, [x[d * r:(d + 1) * r]] + h,
                       [np.zeros((r, cols), np.int8), scales(r)]) for d in range(n)]
    owned = []
    for d in range(n):
        codes = np.stack([parts(c)[d] for c, _ in sent])
        scale = np.stack([parts(s)[d] for _, s in sent])
        owned.append(mosaic.run(summed, [codes, scale], [np.zeros((m, cols), np.int8), scales(m)]))
    codes = np.concatenate([c for c, _ in owned])
    scale = np.concatenate([s for _, s in owned])
    out = mosaic.run(dequantize, [codes, scale] + h, [np.zeros((r, cols), bf16)])[0]
    return np.concatenate([out] * n)


def json_plan(report):
    """The rewritten op's plan, in a line, from equarx's report."""
    import json
    ops = [op for op in report or [] if op.get("rewritten")]
    if len(ops) != 1:
        raise SystemExit("equarx rewrote %d ops, not the one psum: %s" % (len(ops), report))
    return json.dumps(ops[0].get("plan"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--program", default="psum", help="psum, mlp or gemma (default psum)")
    ap.add_argument("--topology", default="v5e:2x2", help="a TPU topology or h100xN (default v5e:2x2)")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    ap.add_argument("--rows-per-step", type=int,
                    help="rows a kernel's grid step takes (default on TPU 32, s8's tile, or 128 "
                         "with --scales lanes; on GPU 64)")
    ap.add_argument("--scales", choices=["rows", "lanes", "slab"], default="rows",
                    help="TPU: a step's scales stored [rows, C/64], transposed in 128-row steps, "
                         "or transposed into a destination's slab (default rows)")
    ap.add_argument("--no-rotation", action="store_true", help="leave the Hadamard product out")
    ap.add_argument("--text-bodies", action="store_true",
                    help="compile the kernels' bodies as MLIR text instead of bytecode")
    ap.add_argument("--equarx", action="store_true",
                    help="a third side: equarx's own rewrite before XLA (the topology's defaults, "
                         "min_payload_bytes=0; python/ on PYTHONPATH, EQUARX_LIB its library)")
    ap.add_argument("--triton", action="store_true",
                    help="--check: equarx's Triton kernels for XLA:GPU (kernels=triton) against "
                         "its XLA:GPU emission, instead of the TPU kernels")
    ap.add_argument("--check", action="store_true",
                    help="instead of compiling: run the TPU kernels in Pallas's interpreter on P "
                         "XLA:CPU devices against equarx's XLA:TPU emission, bit for bit (python/ on "
                         "PYTHONPATH, EQUARX_LIB its library)")
    ap.add_argument("--devices", type=int, default=4,
                    help="--check: XLA:CPU devices, the group size P (default 4)")
    ap.add_argument("--shape", default="512,640",
                    help="--check: a device's psum operand, ROWS,COLS (default 512,640)")
    ap.add_argument("--collective", choices=["psum", "all-gather", "reduce-scatter"],
                    default="psum",
                    help="--check: the psum (the probe's kernels and equarx's), or an all-gather "
                         "or a reduce-scatter of the operand along its rows (equarx's kernels "
                         "alone)")
    args = ap.parse_args(argv)
    rotation = not args.no_rotation
    platform = "tpu" if args.check else compilers.platform(args.topology)
    if platform == "tpu":
        tm = args.rows_per_step or (128 if args.scales == "lanes" else 32)
        if tm % 32 or (args.scales == "lanes" and tm % 128):
            ap.error("--rows-per-step: a multiple of 32 (s8's tile), of 128 with --scales lanes")
    else:
        tm = args.rows_per_step or 64
    if args.check:
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_force_host_platform_device_count=%d" % args.devices)
        rows, cols = (int(v) for v in args.shape.split(","))
        if args.triton:
            differ = check_triton(args.collective, rows, cols, rotation, args.devices)
        elif args.collective != "psum":
            differ = check_collective(args.collective, rows, cols, rotation, args.devices)
        else:
            differ = check(rows, cols, tm, args.scales, rotation, args.devices)
        raise SystemExit(1 if differ else 0)
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    import jax
    topo = compilers.tool.topology(platform, args.topology)
    devices = sorted(topo.devices, key=lambda d: d.id)
    if platform == "tpu":
        qpsum = mosaic_psum(tm, args.scales, rotation)
        target = "tpu_custom_call"
    else:
        qpsum = triton_psum(tm, rotation)
        target = "__gpu$xla.gpu.triton"
    psum, shard_map = jax.lax.psum, jax.shard_map
    sides = ["original", "kernels"] + (["equarx"] if args.equarx else [])
    times, census = {side: [] for side in sides}, {}
    for r in range(args.rounds + 1):
        for side in sides[r % len(sides):] + sides[:r % len(sides)]:
            if side == "kernels":
                # Pallas outputs carry no varying-axes type, so shard_map's check is off.
                jax.lax.psum = lambda v, axis: qpsum(v, axis, len(devices))
                jax.shard_map = lambda *a, **k: shard_map(*a, **{**k, "check_vma": False})
            try:
                f, fargs = compilers.program(args.program, devices)
                lowered = f.lower(*fargs)
            finally:
                jax.lax.psum, jax.shard_map = psum, shard_map
            if side == "kernels" and args.text_bodies:
                lowered = with_text_bodies(lowered, platform)
            if side == "equarx":
                import equarx.jax
                lowered = equarx.jax.rewrite_lowered(
                    lowered, topology="h100" if platform == "gpu" else args.topology.split(":")[0],
                    min_payload_bytes=0)
            t0 = time.perf_counter()
            compiled = lowered.compile()
            wall = time.perf_counter() - t0
            if r > 0:  # round 0 warms the compiler up
                times[side].append(wall)
            text = compiled.as_text()
            census[side] = (compilers.tool.kernels_of(text), text.count('custom_call_target="%s"' % target))
    base = statistics.median(times["original"])
    print("%s %s, %d rounds, rows per step %d%s, rotation %s%s" % (
        args.program, args.topology, args.rounds, tm,
        ", scales in %s" % args.scales if platform == "tpu" else "", rotation,
        ", bodies as text" if args.text_bodies else ""))
    for side, ts in times.items():
        med = statistics.median(ts)
        print("%-9s kernels %4d (hand-written %3d)  compile median %.3f s (%.3f-%.3f)  %.2fx" % (
            side, census[side][0], census[side][1], med, min(ts), max(ts), med / base))


if __name__ == "__main__":
    main()
