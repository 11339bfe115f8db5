#!/usr/bin/env python3
"""In which order XLA:CPU sums a dot's terms, per contracting size K.

    target/pyenv/bin/python bench/micro/dot_order.py

For K in 4, 8, 16, 64 and several row counts, one jitted `dot_general` of
heavy-tailed f32 rows with the ±1 Sylvester Hadamard matrix (every product
exact, so only the order of the sums can differ) against numpy sums in
candidate orders: index order (`seq`), and m interleaved accumulators
(term k into accumulator k mod m, combined pairwise, `accm`). It prints how
many outputs differ from each; 0 names the order XLA:CPU used. The
simulator (`core/src/numerics`) must sum a rotation's f32 terms in that
order to stay bit-exact.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402


def pairwise(ts):
    while len(ts) > 1:
        ts = [ts[i] + ts[i + 1] for i in range(0, len(ts), 2)]
    return ts[0]


def main():
    rng = np.random.default_rng(1)
    print("jax", jax.__version__, "outputs that differ from each candidate order")
    for k in (4, 8, 16, 64):
        h = np.array([[1 if bin(i & j).count("1") % 2 == 0 else -1 for j in range(k)]
                      for i in range(k)], np.float32)
        dot = jax.jit(lambda x, h=h: lax.dot_general(x, jnp.asarray(h), (((1,), (0,)), ((), ()))))
        for n in (8, 512, 4096, 65536):
            x = (rng.standard_normal((n, k)) * np.exp(rng.standard_normal((n, k)) * 2)).astype(np.float32)
            got = np.asarray(dot(x))
            terms = [x[:, b, None] * h[b][None, :] for b in range(k)]
            out = {}
            acc = np.zeros_like(got)
            for t in terms:
                acc = acc + t
            out["seq"] = int((acc != got).sum())
            for m in (2, 4, 8):
                if m <= k:
                    accs = [np.zeros_like(got) for _ in range(m)]
                    for b in range(k):
                        accs[b % m] = accs[b % m] + terms[b]
                    out["acc%d" % m] = int((pairwise(accs) != got).sum())
            print("K = %-3d rows = %-6d %s" % (k, n, out))


if __name__ == "__main__":
    main()
