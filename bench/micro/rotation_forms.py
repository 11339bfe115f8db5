#!/usr/bin/env python3
"""XLA:CPU's time for forms of the B = 64 Hadamard rotation, side by side.

    target/pyenv/bin/python bench/micro/rotation_forms.py [--runs 15]

On f32[20480, 64] (Gemma's 4 x 512 x 640 payload as blocks), jitted and
alternated, medians:

- `dot`: one dot with the 64x64 matrix `±1/8` (what equarx emits);
- `butterfly`: six stages `y·[1, -1] + reverse(y)` over a `[n, 2, ..., 2]`
  view, the sums in a fixed order that XLA does not choose (XLA:CPU fuses
  all six into one kernel);
- `butterfly staged`: the same stages, each materialized
  (`optimization_barrier` between them);
- `convert`: one elementwise pass, f32 -> bf16 -> f32, as a yardstick.

It also checks that both butterflies give the same bits, and how far they
are from the dot (their sums' order differs).
"""
import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

ROWS, B, STAGES = 20480, 64, 6


def forms():
    h = np.array([[1 if bin(i & j).count("1") % 2 == 0 else -1 for j in range(B)]
                  for i in range(B)], np.float32) / 8

    def dot(x):
        return lax.dot_general(x, jnp.asarray(h), (((1,), (0,)), ((), ())))

    def butterfly(x, staged=False):
        y = (x * 0.125).reshape((ROWS,) + (2,) * STAGES)
        for s in range(STAGES):
            d = 1 + s
            sign = jnp.array([1.0, -1.0], jnp.float32).reshape([1] * d + [2] + [1] * (STAGES - d))
            y = y * sign + lax.rev(y, (d,))
            if staged:
                y = lax.optimization_barrier(y)
        return y.reshape(ROWS, B)

    def convert(x):
        return x.astype(jnp.bfloat16).astype(jnp.float32)

    return {"dot": dot, "butterfly": butterfly,
            "butterfly staged": lambda x: butterfly(x, True), "convert": convert}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    a = ap.parse_args()
    x = jnp.asarray(np.random.default_rng(0).standard_normal((ROWS, B)).astype(np.float32))
    fs = {k: jax.jit(f) for k, f in forms().items()}
    out = {k: np.asarray(f(x)) for k, f in fs.items()}
    times = {k: [] for k in fs}
    for _ in range(a.runs):
        for k, f in fs.items():
            t = time.perf_counter()
            f(x).block_until_ready()
            times[k].append(time.perf_counter() - t)
    print("jax", jax.__version__, "f32[%d, %d], median of %d alternated runs" % (ROWS, B, a.runs))
    for k, v in times.items():
        print("%-17s %7.2f ms" % (k, 1e3 * sorted(v)[len(v) // 2]))
    print("butterflies bit-identical: %s; max |butterfly - dot| %.3g"
          % ((out["butterfly"] == out["butterfly staged"]).all(),
             float(np.abs(out["butterfly"] - out["dot"]).max())))


if __name__ == "__main__":
    main()
