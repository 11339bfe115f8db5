"""Kernels XLA:GPU (h100, deviceless) makes of one block quantization in
several forms: which of them its Triton rewriter fuses into one kernel
(absmax reduce, broadcast and codes together).

    target/compilers/bin/python bench/compile/gpu_quantize_forms.py [--rows 20480]

Every form computes equarx's int8 codes of f32 [rows, 64] blocks: the
absmax on |x|'s bits with a floor (the reduce's init) and a cap at +Inf,
the bf16-rounded scale absmax/127, codes = clamp(round(x / scale)); the
last two rotate the blocks first, by the Hadamard product (what equarx
emits) or by an elementwise butterfly.
Prints one line per form: the kernels of the compiled module and their
fusion kinds (kCustom is a Triton fusion).

Then the dequantize of a gathered message, s8 [rows, 66] (64 codes, then
the bf16 scale's two bytes), rotated back by the Hadamard product into bf16:
the scale applied after the product (equarx today, `(H·q)·s`) or to the
codes inside the product's operand (`H·(q·s)`, the same f32 values for
int8 codes and normal scales: every term and sum is exact), the scale
decoded by shifts and an or or by one bitcast of its two bytes.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compilers  # noqa: E402  (the compile-only topologies and the kernel census)

FLOOR, INF_BITS = 67108864, 2139095040


def forms():
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    def absmax(y, cap_before):
        bits = lax.bitcast_convert_type(y, jnp.int32) & 0x7FFFFFFF
        if cap_before:
            bits = jnp.minimum(bits, INF_BITS)
        m = jnp.max(bits, axis=1, keepdims=True, initial=FLOOR)
        return m if cap_before else jnp.minimum(m, INF_BITS)

    def scale(m):
        return lax.reduce_precision(lax.bitcast_convert_type(m, jnp.float32) * (1 / 127), 8, 7)

    def codes(y, s):
        return jnp.clip(jnp.round(y * (1.0 / s)), -127, 127)

    def codes_cap_after(y):
        return codes(y, scale(absmax(y, False))).astype(jnp.int8)

    def codes_cap_before(y):
        return codes(y, scale(absmax(y, True))).astype(jnp.int8)

    def codes_and_scale_bits(y):
        s = scale(absmax(y, True))
        hi = lax.shift_right_logical(lax.bitcast_convert_type(s, jnp.int32), 16)
        return codes(y, s).astype(jnp.int8), hi.astype(jnp.uint16)

    def row_of_codes_then_scale(y):
        s = scale(absmax(y, True))
        hi = lax.shift_right_logical(lax.bitcast_convert_type(s, jnp.int32), 16)
        tail = jnp.concatenate([hi & 0xFF, hi >> 8], axis=1).astype(jnp.int8)
        return jnp.concatenate([codes(y, s).astype(jnp.int8), tail], axis=1)

    def codes_selected_by_column(y):
        s = scale(absmax(y, True))
        j = lax.broadcasted_iota(jnp.int32, y.shape, 1)
        return jnp.where(j < 62, codes(y, s), 0.0).astype(jnp.int8)

    def codes_then_scales_by_a_second_reduce(y):
        # Capped after, the second reduce is not the first's twin, so CSE
        # keeps both and the first keeps its one use.
        c = codes(y, scale(absmax(y, True))).astype(jnp.int8)
        hi = lax.shift_right_logical(lax.bitcast_convert_type(scale(absmax(y, False)), jnp.int32), 16)
        return c, hi.astype(jnp.uint16)

    hadamard = np.array([[(-1) ** bin(i & j).count("1") for j in range(64)]
                         for i in range(64)], np.float32) / 8

    def butterfly(y):
        # H_64 as six add/subtract stages of halves (the order of the sums
        # fixed by the program, not by a dot's kernel).
        n, h = y.shape[0], 1
        while h < 64:
            v = y.reshape(n, 64 // (2 * h), 2, h)
            a, b = v[:, :, 0, :], v[:, :, 1, :]
            y = jnp.stack([a + b, a - b], axis=2).reshape(n, 64)
            h *= 2
        return y * 0.125

    def rotated_by_the_product(y):
        return row_of_codes_then_scale(jnp.dot(y, hadamard, precision=lax.Precision.DEFAULT))

    def rotated_by_a_butterfly(y):
        return row_of_codes_then_scale(butterfly(y))

    def a_hop(y):
        # A ring hop: what arrived dequantized and added to the local part
        # (y's halves stand in for the two), then both quantizations.
        arrived = jnp.round(y[:, :32]).astype(jnp.int8).astype(jnp.float32) * y[:, 32:33]
        return codes_then_scales_by_a_second_reduce(jnp.concatenate([arrived, arrived], 1) + y)

    return [
        ("codes, cap after the reduce (equarx today)", codes_cap_after),
        ("codes, cap on each element before the reduce", codes_cap_before),
        ("codes and the scales' bits, two outputs", codes_and_scale_bits),
        ("one row: codes then the scale's bytes (XLA:GPU's wire)", row_of_codes_then_scale),
        ("codes with a select on the column (iota)", codes_selected_by_column),
        ("codes, then the scales' bits by a second reduce", codes_then_scales_by_a_second_reduce),
        ("a ring hop: dequantize-add, then the line above", a_hop),
        ("rotated by the 64x64 product, then one row (equarx)", rotated_by_the_product),
        ("rotated by a six-stage butterfly, then one row", rotated_by_a_butterfly),
    ]


def dequantize_forms():
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    hadamard = np.array([[(-1) ** bin(i & j).count("1") for j in range(64)]
                         for i in range(64)], np.float32) / 8

    def by_shifts(m):
        b = lax.bitcast_convert_type(m[:, 64:66], jnp.uint8).astype(jnp.int32)
        return lax.bitcast_convert_type((b[:, 0] << 16) | (b[:, 1] << 24), jnp.float32)[:, None]

    def by_bitcast(m):
        return lax.bitcast_convert_type(m[:, 64:66], jnp.bfloat16).astype(jnp.float32)[:, None]

    def product(x):
        return jnp.dot(x, hadamard, precision=lax.Precision.HIGHEST)

    def after(decode):
        return lambda m: (product(m[:, :64].astype(jnp.float32)) * decode(m)).astype(jnp.bfloat16)

    def inside(decode):
        return lambda m: product(m[:, :64].astype(jnp.float32) * decode(m)).astype(jnp.bfloat16)

    return [
        ("(H.q).s, the scale by shifts (equarx today)", after(by_shifts)),
        ("H.(q.s), the scale by shifts", inside(by_shifts)),
        ("(H.q).s, the scale by a bitcast", after(by_bitcast)),
        ("H.(q.s), the scale by a bitcast", inside(by_bitcast)),
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20480, help="blocks of 64 (default 20480: Gemma's op)")
    args = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding
    topo = compilers.tool.topology("gpu", "h100x4")
    device = sorted(topo.devices, key=lambda d: d.id)[0]
    y = jax.ShapeDtypeStruct((args.rows, 64), jnp.float32, sharding=SingleDeviceSharding(device))
    message = jax.ShapeDtypeStruct((args.rows, 66), jnp.int8,
                                   sharding=SingleDeviceSharding(device))
    for name, f, arg in ([(n, f, y) for n, f in forms()]
                         + [(n, f, message) for n, f in dequantize_forms()]):
        text = jax.jit(f).lower(arg).compile().as_text()
        entry = text.split("\nENTRY ")[1]
        kinds = [line.split("kind=")[1].split(",")[0] for line in entry.splitlines() if " fusion(" in line]
        print("%-56s %d kernels  %s" % (name, compilers.tool.kernels_of(text), " ".join(kinds)))


if __name__ == "__main__":
    main()
