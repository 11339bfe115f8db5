"""What libtpu itself spends compiling a quantized two-shot psum: the
algorithm equarx emits (int8, B = 64, bf16 scales as u16 bits, codes and
scales apart, the exchange's halves added pairwise), written in JAX as a
`shard_map` and fused by libtpu before XLA, against the plain psum and
against its parts. No equarx: the floor any HLO emission of the algorithm
meets, whoever fuses it.

    target/compilers/bin/python bench/compile/libtpu_floor.py \\
        [--variant psum|two-shot|collectives|plain-two-shot|quantize] [--topology v5e:2x2] [--runs 2]

Each compile runs in a fresh process (libtpu keeps state between compiles
in one), and the line printed is the variant, its compile time (the
`compile()` call alone) and the fusions in the compiled module:

- `psum`: one 8 MiB bf16 `psum` over 4 devices, the baseline;
- `two-shot`: rotation left out, the quantized two-shot (quantize, the
  all-to-alls of codes and u16 scales, the dequantized halves added, the
  sum quantized, the all-gathers, the dequantize);
- `collectives`: the four collectives with one small fusion each, no
  arithmetic around them;
- `plain-two-shot`: the bf16 two-shot, one all-to-all and one all-gather;
- `quantize`: the quantize and the dequantize, no collective.
"""

import argparse
import os
import subprocess
import sys
import time

VARIANTS = ["psum", "two-shot", "collectives", "plain-two-shot", "quantize"]


def one(variant, topology):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "compilers"))
    import compile as tool  # the suite's deviceless topologies
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    devices = sorted(tool.topology("tpu", topology).devices, key=lambda d: d.id)[:4]
    mesh = Mesh(np.array(devices), ("x",))

    def quantize(x):
        bits = jax.lax.bitcast_convert_type(x, jnp.int32) & 0x7FFFFFFF
        largest = jnp.minimum(jnp.max(bits, axis=-1), 0x7F800000)
        scale = jax.lax.bitcast_convert_type(largest, jnp.float32) * (1 / 127)
        scale = jax.lax.reduce_precision(scale, 8, 7)
        codes = jnp.clip(jnp.round(x * (1.0 / scale)[..., None]), -127, 127).astype(jnp.int8)
        wire = (jax.lax.bitcast_convert_type(scale, jnp.int32) >> 16).astype(jnp.uint16)
        return codes, wire

    def dequantize(codes, wire):
        scale = jax.lax.bitcast_convert_type(wire.astype(jnp.int32) << 16, jnp.float32)
        return codes.astype(jnp.float32) * scale[..., None]

    def body(a):
        if variant == "psum":
            return jax.lax.psum(a, "x")
        if variant == "plain-two-shot":
            got = jax.lax.all_to_all(a.reshape(4, 512, 2048), "x", 0, 0, tiled=True)
            half = got[0:2] + got[2:4]
            return jax.lax.all_gather(half[0] + half[1], "x", axis=0, tiled=True)
        blocks = a.astype(jnp.float32).reshape(4, 128, 128, 64)
        codes, wire = quantize(blocks)
        if variant == "quantize":
            return dequantize(codes, wire).astype(jnp.bfloat16).reshape(2048, 2048)
        got_codes = jax.lax.all_to_all(codes, "x", 0, 0, tiled=True)
        got_wire = jax.lax.all_to_all(wire, "x", 0, 0, tiled=True)
        if variant == "collectives":
            all_codes = jax.lax.all_gather(got_codes[0], "x", axis=0, tiled=True)
            all_wire = jax.lax.all_gather(got_wire[0], "x", axis=0, tiled=True)
            spread = all_wire.astype(jnp.bfloat16)[..., None]
            return (all_codes.astype(jnp.bfloat16) + spread).reshape(2048, 2048)
        parts = dequantize(got_codes, got_wire)
        half = parts[0:2] + parts[2:4]
        codes, wire = quantize(half[0] + half[1])
        all_codes = jax.lax.all_gather(codes, "x", axis=0, tiled=True)
        all_wire = jax.lax.all_gather(wire, "x", axis=0, tiled=True)
        return dequantize(all_codes, all_wire).astype(jnp.bfloat16).reshape(2048, 2048)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    arg = jax.ShapeDtypeStruct((4 * 2048, 2048), jnp.bfloat16, sharding=NamedSharding(mesh, P("x")))
    lowered = f.lower(arg)
    start = time.perf_counter()
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    print("%s %.2f s, %d fusions" % (variant, seconds, compiled.as_text().count(" fusion(")))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=VARIANTS, action="append",
                        help="the programs to compile (repeatable; default: all)")
    parser.add_argument("--topology", default="v5e:2x2", help="a TPU topology of 4 chips or more")
    parser.add_argument("--runs", type=int, default=2, help="compiles a variant, alternated")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one, args.topology)
        return
    for _ in range(args.runs):
        for variant in args.variant or VARIANTS:
            out = subprocess.run([sys.executable, __file__, "--one", variant, "--topology", args.topology],
                                 capture_output=True, text=True)
            lines = out.stdout.strip().splitlines()
            if out.returncode != 0 or not lines:
                sys.exit("%s failed:\n%s" % (variant, out.stderr[-2000:]))
            print(lines[-1], flush=True)


if __name__ == "__main__":
    main()
