#!/usr/bin/env python3
"""XLA:CPU's time for the rotation's product by its size: where the host's
allocator starts to cost.

    target/pyenv/bin/python bench/micro/product_size.py [--elements 1M,4M,8M] [--runs 15]

For each size n, one jitted program on one XLA:CPU device: n bf16 values
seen as `[n/64, 64]`, widened to f32 and multiplied by a 64 x 64 matrix
of ±1 (the form of equarx's forward rotation; XLA:CPU makes it a YNNPACK
fusion). It prints the median wall and CPU time of `--runs` runs (after a
warm-up) and both per element. The f32 result is 4n bytes: from 32 MiB
(n = 8M) glibc maps the buffer afresh on every run, and its pages fault
in again; run it once more with `MALLOC_MMAP_THRESHOLD_=4294967296
MALLOC_TRIM_THRESHOLD_=4294967296` to see the difference.
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def elements(text):
    units = {"K": 1 << 10, "M": 1 << 20}
    out = []
    for tok in text.split(","):
        tok = tok.strip().upper()
        scale = units.get(tok[-1:], 1)
        out.append(int(tok[:-1] if tok[-1:] in units else tok) * scale)
    if any(n <= 0 or n % 64 for n in out):
        raise argparse.ArgumentTypeError("sizes must be positive multiples of 64")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elements", type=elements, default=elements("1M,4M,8M"),
                    help="comma-separated sizes, K and M suffixes allowed (default 1M,4M,8M)")
    ap.add_argument("--runs", type=int, default=15)
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    h = jnp.asarray(rng.choice([-1.0, 1.0], size=(64, 64)).astype(np.float32))

    def product(x):
        return jnp.dot(x.reshape(-1, 64).astype(jnp.float32), h)

    print("jax %s, one XLA:CPU device; MALLOC_MMAP_THRESHOLD_=%s" % (
        jax.__version__, os.environ.get("MALLOC_MMAP_THRESHOLD_", "unset")))
    for n in a.elements:
        x = jnp.asarray(rng.standard_normal(n).astype(np.float32), jnp.bfloat16)
        exe = jax.jit(product).lower(x).compile()
        jax.block_until_ready(exe(x))
        wall, cpu = [], []
        for _ in range(a.runs):
            t, c = time.perf_counter(), time.process_time()
            jax.block_until_ready(exe(x))
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        w, c = statistics.median(wall), statistics.median(cpu)
        print("%9d elements (f32 result %6.1f MiB): %7.2f ms wall %7.2f ms CPU, "
              "%.2f / %.2f ns an element" % (n, 4 * n / 2**20, w * 1e3, c * 1e3,
                                             w / n * 1e9, c / n * 1e9))


if __name__ == "__main__":
    main()
