"""The installed wheel, as a user has it (run by tests/wheel.rs with the
fresh venv's python, from a temporary directory, with no PYTHONPATH and no
EQUARX_LIB, and XLA_FLAGS=--xla_force_host_platform_device_count=8).

A tensor-parallel MLP block (two layers: column-parallel up, row-parallel
down, so two all-reduces) on 8 CPU devices, compiled without equarx and
then inside ``with equarx.jax.enable(...)`` on JAX's default backend.
Reports which library and package were used, what the rewrite did, whether
every device holds the same bits, the report table, and what EQUARX_LIB
does in a child process.

Prints one line ``WHEEL_RESULT <json>``; the Rust test asserts on it.
"""

import io
import json
import os
import re
import shutil
import subprocess
import sys

if "--xla_force_host_platform_device_count=8" not in os.environ.get("XLA_FLAGS", ""):
    sys.exit("set XLA_FLAGS=--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import equarx
import equarx.jax as ej

WIDTH, HIDDEN = 256, 1024
# An s8 collective, whichever algorithm the pass chose.
S8_COLLECTIVE = re.compile(r"= \(?s8\[.*? (collective-permute|all-to-all|all-gather)\(")


def block(params, x):
    for w_up, w_down in params:
        x = x + jax.nn.gelu(x @ w_up) @ w_down
    return x


def child(env_lib):
    """What a new process with EQUARX_LIB=env_lib loads."""
    code = "import equarx; print(equarx.version()); print(equarx.library_path())"
    env = {**os.environ, "EQUARX_LIB": env_lib}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return {"returncode": out.returncode, "stdout": out.stdout.splitlines(),
            "stderr": out.stderr.strip().splitlines()[-1:] if out.stderr else []}


def main():
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    rng = np.random.default_rng(0)

    def put(shape, scale, spec):
        a = jnp.asarray(rng.standard_normal(shape) * scale, jnp.bfloat16)
        return jax.device_put(a, NamedSharding(mesh, spec))

    params = [
        (put((WIDTH, HIDDEN), WIDTH**-0.5, P(None, "tp")),
         put((HIDDEN, WIDTH), HIDDEN**-0.5, P("tp", None)))
        for _ in range(2)
    ]
    x = put((2, 64, WIDTH), 1.0, P())
    f = jax.jit(block, out_shardings=NamedSharding(mesh, P()))

    result = {
        "python": sys.executable,
        "package": equarx.__file__,
        "library_before_load": str(equarx.library_path()),
    }
    reference = np.asarray(f(params, x), np.float32)

    with ej.enable(types=("bf16", "f32"), min_payload=0) as on:
        result["platforms"] = on.registration["platforms"]
        compiled = f.lower(params, x).compile()
        out = compiled(params, x)
        report = ej.last_report() or []
        table = io.StringIO()
        ej.print_report(file=table)
    result["enabled_after_block"] = ej.enabled()
    got = np.asarray(out, np.float32)
    shards = [np.asarray(s.data) for s in out.addressable_shards]
    result.update({
        "library": str(equarx.library_path()),
        "version": equarx.version(),
        "all_reduces": sum(1 for r in report if r["opcode"] == "all-reduce"),
        "rewritten_all_reduces": sum(
            1 for r in report if r["opcode"] == "all-reduce" and r["rewritten"]),
        "s8_collectives": sum(
            1 for line in compiled.as_text().splitlines() if S8_COLLECTIVE.search(line)),
        "shards": len(shards),
        "devices_bit_identical": all(s.tobytes() == shards[0].tobytes() for s in shards[1:]),
        "finite": bool(np.isfinite(got).all()),
        "rel_rms": float(np.sqrt(np.mean((got - reference) ** 2))
                         / np.sqrt(np.mean(reference**2))),
        "report_table": table.getvalue(),
    })

    # EQUARX_LIB still wins over the bundled library, and a wrong one is an
    # error, not a silent fallback.
    copy = os.path.abspath("libequarx-copy.so")
    shutil.copyfile(result["library"], copy)
    result["override"] = child(copy)
    result["override_copy"] = copy
    result["override_missing"] = child(os.path.abspath("no-such-libequarx.so"))
    print("WHEEL_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
