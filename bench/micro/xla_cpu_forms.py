#!/usr/bin/env python3
"""XLA:CPU run time of alternative HLO forms of two steps the emitter writes.

    target/pyenv/bin/python bench/micro/xla_cpu_forms.py [--elements N] [--runs R]

1. The block absmax with non-finite values counted as +Inf (the numerics
   contract), over f32 [N/64, 64]:
   - `reducer`: one reduce whose reducer maps |x| / +Inf itself (the
     emitter before d2796f9);
   - `select`: select(is-finite, |x|, +Inf), then a plain max reduce;
   - `sum-check`: max |x| plus a sum of x - x (0, or NaN) and a select of
     +Inf on the blocks (the emitter since d2796f9);
   - `abs-only`: max |x| alone (drops NaN on XLA:CPU: not a candidate,
     the floor).
2. The forward Hadamard rotation of [N/64, 64] f32 blocks:
   - `dense`: one dot with the 64x64 ±1 matrix (the emitter);
   - `kronecker`: H64 = H8 (x) H8 as two dots of 8;
   - `butterfly`: log2(64) = 6 add/subtract stages.

Prints the best of R timed runs (after one warm-up) of each form, in ms.
One process, one device: run it on a quiet machine; compare within a run.
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def hadamard(n):
    return np.array([[(-1) ** bin(i & j).count("1") for j in range(n)] for i in range(n)],
                    np.float32)


def magnitude(v):
    return jnp.where(jnp.isfinite(v), jnp.abs(v), jnp.inf)


def absmax_reducer(x):
    return lax.reduce(x, np.float32(0), lambda a, b: jnp.maximum(magnitude(a), magnitude(b)), (1,))


def absmax_select(x):
    return jnp.max(magnitude(x), axis=1)


def absmax_sum_check(x):
    finite = jnp.isfinite(jnp.sum(x - x, axis=1))
    return jnp.where(finite, jnp.max(jnp.abs(x), axis=1), jnp.inf)


def absmax_abs_only(x):
    return jnp.max(jnp.abs(x), axis=1)


H64 = jnp.asarray(hadamard(64))
H8 = jnp.asarray(hadamard(8))


def rotate_dense(x):
    return jnp.dot(x, H64, precision="highest") * np.float32(0.125)


def rotate_kronecker(x):
    y = x.reshape(-1, 8, 8)
    y = lax.dot_general(y, H8, (((1,), (0,)), ((), ())), precision="highest")
    y = lax.dot_general(y, H8, (((1,), (0,)), ((), ())), precision="highest")
    return y.reshape(-1, 64) * np.float32(0.125)


def rotate_butterfly(x):
    y, h = x, 32
    while h >= 1:
        y = y.reshape(-1, 64 // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = jnp.stack([a + b, a - b], axis=2)
        h //= 2
    return y.reshape(-1, 64) * np.float32(0.125)


def best_ms(f, x, runs):
    g = jax.jit(f)
    g(x).block_until_ready()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        g(x).block_until_ready()
        times.append(time.perf_counter() - t)
    return 1e3 * min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--elements", type=int, default=8 << 20, help="f32 elements (default 8 Mi)")
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    x = jnp.asarray(np.random.default_rng(0).standard_normal((a.elements // 64, 64), np.float32))
    # The candidates must agree with the contract on non-finite blocks.
    probe = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    probe[1, 3], probe[2, 5], probe[3, 7] = np.nan, -np.inf, np.nan
    want = np.where(np.isfinite(probe).all(axis=1), np.abs(probe).max(axis=1), np.inf)
    print(f"jax {jax.__version__}, {a.elements} f32 elements as [{a.elements // 64}, 64], "
          f"best of {a.runs}")
    for name, f in [("reducer", absmax_reducer), ("select", absmax_select),
                    ("sum-check", absmax_sum_check), ("abs-only", absmax_abs_only)]:
        got = np.asarray(jax.jit(f)(probe))
        ok = "keeps the contract" if np.array_equal(got, want) else "breaks the contract"
        print(f"absmax   {name:10} {best_ms(f, x, a.runs):8.2f} ms  ({ok})")
    ref = np.asarray(jax.jit(rotate_dense)(x))
    for name, f in [("dense", rotate_dense), ("kronecker", rotate_kronecker),
                    ("butterfly", rotate_butterfly)]:
        diff = float(np.abs(np.asarray(jax.jit(f)(x)) - ref).max())
        print(f"rotation {name:10} {best_ms(f, x, a.runs):8.2f} ms  (max |diff| vs dense {diff:.1e})")


if __name__ == "__main__":
    main()
