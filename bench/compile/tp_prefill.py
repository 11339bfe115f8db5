#!/usr/bin/env python3
"""Writes an L-layer tensor-parallel prefill as XLA holds it right after SPMD
partitioning (a bare HloModuleProto), for bench/compile.

    python bench/compile/tp_prefill.py --layers 16 --out m.pb

The program is a Megatron-style transformer prefill in shard_map over 8 CPU
devices (one mesh axis "x"): per layer, attention with its heads split over
the devices, then an MLP with its hidden width split; each half ends in a
row-parallel bf16 matmul whose per-device partial sum is psum'd. Each psum
is bf16[512,2048] = 2 MiB per device, so a module has 2*L all-reduces. The
layers are unrolled (a Python loop, not lax.scan), like a jitted model
whose layers are separate parameters.

The stage is the one tests/fixtures/generate.py takes: the last dump of
XLA's spmd-partitioner pipeline (per-device shapes, bf16 all-reduces with
channel_id and use_global_device_ids, no fusions yet), the stage where
equarx's C++ pass sits. Only that pipeline is dumped, so 62 layers dump in
seconds.
"""

import argparse
import glob
import os
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
NDEV = 8

# Per-device shapes: tokens x width is the psum payload (512 * 2048 bf16 = 2 MiB).
TOKENS, WIDTH, HEADS, HEAD_DIM, MLP = 512, 2048, 16, 128, 8192


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, required=True, help="transformer layers (>= 1)")
    ap.add_argument("--out", required=True, help="where to write the bare HloModuleProto")
    a = ap.parse_args(argv)
    if a.layers < 1:
        ap.error("--layers must be at least 1")

    dump = tempfile.mkdtemp(prefix="equarx_bench_compile_")
    try:
        pb = generate(a.layers, dump)
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(pb)
    os.replace(tmp, a.out)
    return 0


def generate(layers, dump):
    os.environ["XLA_FLAGS"] = " ".join([
        "--xla_force_host_platform_device_count=%d" % NDEV,
        "--xla_dump_to=%s" % dump,
        "--xla_dump_hlo_as_proto",
        "--xla_dump_hlo_pass_re=.*",
        "--xla_dump_hlo_pipeline_re=spmd-partitioner",
        "--xla_dump_hlo_module_re=^jit_tp_prefill$",
    ])
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax import shard_map
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    # Stack-frame file names relative to the repo: the module does not
    # depend on where the checkout lives.
    jax.config.update("jax_hlo_source_file_canonicalization_regex",
                      "^" + re.escape(REPO + os.sep))
    sys.path.insert(0, os.path.join(REPO, "tests", "xla"))
    sys.dont_write_bytecode = True
    from xla_tool import unwrap_module

    bf16, f32 = jnp.bfloat16, jnp.float32
    devs = np.array(sorted(jax.devices(), key=lambda d: d.id))
    if len(devs) < NDEV:
        raise SystemExit("jax has %d CPU devices, need %d" % (len(devs), NDEV))
    mesh = Mesh(devs[:NDEV], ("x",))
    L, S, D, H, HD, F = layers, TOKENS, WIDTH, HEADS, HEAD_DIM, MLP

    def layer_norm(v):
        v32 = v.astype(f32)
        m = jnp.mean(v32, -1, keepdims=True)
        var = jnp.mean((v32 - m) ** 2, -1, keepdims=True)
        return ((v32 - m) * jax.lax.rsqrt(var + 1e-5)).astype(bf16)

    def tp_prefill(x, wqkv, wo, w1, w2):
        # Inside shard_map: x is the whole bf16[S, D]; the weights are this
        # device's slices (H/8 heads, F/8 hidden units) of every layer.
        causal = jnp.tril(jnp.ones((S, S), bool))
        for i in range(L):
            h = layer_norm(x)
            qkv = jnp.einsum("sd,dthk->thsk", h, wqkv[i])         # column-parallel
            s = jnp.einsum("hqk,hsk->hqs", qkv[0], qkv[1]).astype(f32) * (HD ** -0.5)
            p = jax.nn.softmax(jnp.where(causal, s, -1e30), axis=-1).astype(bf16)
            o = jnp.einsum("hqs,hsk->hqk", p, qkv[2])
            x = x + jax.lax.psum(jnp.einsum("hqk,hkd->qd", o, wo[i]), "x")  # row-parallel
            h = layer_norm(x)
            u = jax.nn.gelu(h @ w1[i])                             # column-parallel
            x = x + jax.lax.psum(u @ w2[i], "x")                   # row-parallel
        return x

    specs = (P(), P(None, None, None, "x", None), P(None, "x", None, None),
             P(None, None, "x"), P(None, "x", None))
    shapes = [(S, D), (L, D, 3, H, HD), (L, H, HD, D), (L, D, F), (L, F, D)]
    args = [jax.ShapeDtypeStruct(s, bf16, sharding=NamedSharding(mesh, sp))
            for s, sp in zip(shapes, specs)]
    f = jax.jit(shard_map(tp_prefill, mesh=mesh, in_specs=specs, out_specs=P()))
    f.lower(*args).compile()

    dumps = sorted(glob.glob(os.path.join(dump, "module_*.jit_tp_prefill.*.spmd-partitioner.*.hlo.pb")))
    if not dumps:
        raise SystemExit("XLA wrote no spmd-partitioner dump into %s (files: %s)"
                         % (dump, sorted(os.listdir(dump))[:20]))
    with open(dumps[-1], "rb") as fh:
        pb, _ = unwrap_module(fh.read())
    return pb


if __name__ == "__main__":
    sys.exit(main())
