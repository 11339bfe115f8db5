"""Compile time, kernels and memory in the real XLA:TPU and XLA:GPU, deviceless:
the original program against equarx's rewrite, through each door, side by side.

    target/compilers/bin/python bench/compile/compilers.py [--runs N] [--programs psum,mlp,gemma]
        [--topologies v5e:2x2,h100x4,v5e:8x8] [--timeout S] [--option NAME=VALUE ...]

(`scripts/pyenv compilers` makes the venv; EQUARX_LIB names libequarx.so.) Each
row runs in a process of its own, since a registration at the hook cannot be
undone and libtpu reads LIBTPU_INIT_ARGS once. Rows per topology:

- original: the program as JAX lowers it;
- hook: equarx registered at the compiler's pre-scheduler hook with the
  topology's defaults and `min_payload_bytes=0` (every eligible op); on
  XLA:TPU the module is tiled and fused there: every emitted op is a kernel
  of its own but the rotation's product, a fused convolution;
- hook-unrot (TPU only): the hook with `rotation=none`, for the rotation's
  share of the kernels there;
- before: `equarx.jax.rewrite_lowered`, the same options;
- libtpu QAR: libtpu's own quantized all-reduce
  (--xla_tpu_quantized_all_reduce_level=1, size threshold 0), TPU only.

`--option` adds pass options to every rewriting row (`hook`, `hook-unrot`,
`before`), on top of the topology's defaults: a plan forced, say.

A row compiles a fresh lowering `--runs` times and keeps the lowest wall
time. Programs: `psum`, one 8 MiB bf16 psum per device (2048 x 2048); `mlp`,
a 4-layer tensor-parallel MLP (width 2048, hidden 8192, 512 tokens), one psum
of 2 MiB per layer; `gemma`, Gemma 3 270M's Megatron forward from
`bench/model` (bf16, one 512-token window, 36 psums of 640 KiB; the config
from the model's GGUF, which `bench/model` fetches once; shapes only, no
weights), at most 4-way (the model has 4 query heads). Prints one line per
row: compile seconds (min of runs), the ratio to the original, fusions in the
compiled module, its kernels (fusions and the ops left unfused, past views,
control flow and collectives), how many of those are in `while` loops (run
once per iteration: a ring's hops), the collectives' wire types, and the
temp memory.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests/compilers"))
import compile as tool  # noqa: E402  (the suite's driver: topologies, plugins, the compiled text's census)


def platform(topology_name):
    return "gpu" if topology_name.startswith("h100") else "tpu"


def gemma(devices):
    """Gemma 3 270M's tensor-parallel forward over `devices`, with its
    parameters and tokens as shapes."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    sys.path.insert(0, os.path.join(REPO, "bench/model"))
    from equarx_model import gemma as model, weights
    cfg = weights.config()
    D, F, H, hd = cfg.width, cfg.ffn, cfg.heads, cfg.head_dim
    f32, bf16 = jnp.float32, jnp.bfloat16
    layer = {"attn_norm": ((D,), f32), "wq": ((H, D, hd), bf16), "wk": ((D, hd), bf16),
             "wv": ((D, hd), bf16), "q_norm": ((hd,), f32), "k_norm": ((hd,), f32),
             "wo": ((H, hd, D), bf16), "post_attn_norm": ((D,), f32), "ffn_norm": ((D,), f32),
             "gate": ((D, F), bf16), "up": ((D, F), bf16), "down": ((F, D), bf16),
             "post_ffn_norm": ((D,), f32)}
    params = {"embed": ((cfg.vocab, D), bf16), "final_norm": ((D,), f32),
              "layers": [layer] * cfg.layers}
    params = jax.tree_util.tree_map(lambda t: jax.ShapeDtypeStruct(*t), params,
                                    is_leaf=lambda t: isinstance(t, tuple) and isinstance(t[0], tuple))
    mesh = Mesh(np.array(devices), (model.AXIS,))
    shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), model.param_specs(params))
    params = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), params, shardings)
    tokens = jax.ShapeDtypeStruct((1, 512), jnp.int32, sharding=NamedSharding(mesh, P()))
    return model.tensor_parallel(cfg, mesh, params), [params, tokens]


def add_options(into, items):
    """`NAME=VALUE` pass options (VALUE read as JSON where it parses) added
    to the dict `into`, which is returned; ValueError names one without
    `=`."""
    for option in items:
        if "=" not in option:
            raise ValueError("%r: give NAME=VALUE" % option)
        name, value = option.split("=", 1)
        try:
            into[name] = json.loads(value)
        except ValueError:
            into[name] = value
    return into


def program(name, devices):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    if name == "gemma":
        return gemma(devices)
    mesh = Mesh(np.array(devices), ("x",))
    n = mesh.devices.size
    if name == "psum":
        f = jax.shard_map(lambda a: jax.lax.psum(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())
        args = [jax.ShapeDtypeStruct((n * 2048, 2048), jnp.bfloat16, sharding=NamedSharding(mesh, P("x")))]
        return jax.jit(f), args
    if name == "reducescatter":
        # 8 MiB a device, reduce-scattered along its rows (psum's operand).
        f = jax.shard_map(lambda a: jax.lax.psum_scatter(a, "x", tiled=True), mesh=mesh,
                          in_specs=P("x"), out_specs=P("x"))
        args = [jax.ShapeDtypeStruct((n * 2048, 2048), jnp.bfloat16, sharding=NamedSharding(mesh, P("x")))]
        return jax.jit(f), args
    if name == "allgather":
        # 2 MiB a rank, all-gathered along its rows: 8 MiB a device at P = 4.
        f = jax.shard_map(lambda a: jax.lax.all_gather(a, "x", tiled=True), mesh=mesh,
                          in_specs=P("x"), out_specs=P(), check_vma=False)
        args = [jax.ShapeDtypeStruct((n * 512, 2048), jnp.bfloat16, sharding=NamedSharding(mesh, P("x")))]
        return jax.jit(f), args
    d, h, s = 2048, 8192, 512

    def mlp(x, w1, w2):
        for layer in range(4):
            y = jax.nn.gelu(x @ w1[layer])
            x = x + jax.lax.psum(y @ w2[layer], "x")
        return x

    f = jax.shard_map(mlp, mesh=mesh, in_specs=(P(), P(None, None, "x"), P(None, "x", None)),
                      out_specs=P())
    args = [jax.ShapeDtypeStruct((s, d), jnp.bfloat16, sharding=NamedSharding(mesh, P())),
            jax.ShapeDtypeStruct((4, d, h), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, None, "x"))),
            jax.ShapeDtypeStruct((4, h, d), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, "x", None)))]
    return jax.jit(f), args


def alternate(names, rounds, compile_one):
    """Compiles every name in turn, `rounds` times after a warm-up round,
    the order rotated each round (`compile_one(name)` compiles one and
    returns its wall seconds): per name, the seconds of the measured
    rounds."""
    times = {name: [] for name in names}
    for r in range(rounds + 1):
        for name in names[r % len(names):] + names[:r % len(names)]:
            wall = compile_one(name)
            if r > 0:  # round 0 warms the compiler up
                times[name].append(wall)
    return times


def one(args):
    """One row, in this process."""
    import ctypes
    topo_name, prog, door, runs = args.topology, args.program, args.door, args.runs
    # The topology's defaults, every eligible op rewritten (on h100 the time
    # model declines these sizes, and a row that rewrites nothing says
    # nothing about what a rewrite costs).
    defaults = {"topology": "h100" if platform(topo_name) == "gpu" else topo_name.split(":")[0],
                "min_payload_bytes": 0}
    add_options(defaults, args.option)
    if door == "hook-unrot":
        defaults["rotation"] = "none"
        door = "hook"
    topo = tool.topology(platform(topo_name), topo_name)
    devices = sorted(topo.devices, key=lambda d: d.id)
    if door == "hook":
        lib = ctypes.CDLL(os.environ["EQUARX_LIB"])
        plugin = ctypes.CDLL(tool.plugin_path(platform(topo_name)))
        plugin.GetPjrtApi.restype = ctypes.c_void_p
        lib.equarx_pjrt_register.restype = ctypes.c_int
        err = ctypes.c_void_p()
        status = lib.equarx_pjrt_register(ctypes.c_void_p(plugin.GetPjrtApi()), None, 0,
                                          json.dumps(defaults).encode(), ctypes.byref(err))
        if status:
            raise SystemExit("register failed: " + ctypes.string_at(err.value).decode())
    best, compiled = None, None
    for _ in range(runs):
        f, fargs = program(prog, devices)
        lowered = f.lower(*fargs)
        if door == "before":
            import equarx.jax
            lowered = equarx.jax.rewrite_lowered(lowered, **defaults)
        t0 = time.perf_counter()
        compiled = lowered.compile()
        wall = time.perf_counter() - t0
        best = wall if best is None else min(best, wall)
    text = compiled.as_text()
    collectives, fusions, _ = tool.collectives_of(text)
    mem = compiled.memory_analysis()
    print(json.dumps({"compile_s": best, "fusions": fusions, "kernels": tool.kernels_of(text),
                      "in_loop": tool.loop_kernels_of(text),
                      "wire": sorted({t for _, ts in collectives for t in ts}),
                      "temp_bytes": mem.temp_size_in_bytes if mem else None}))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--programs", default="psum,mlp")
    ap.add_argument("--topologies", default="v5e:2x2,h100x4")
    ap.add_argument("--timeout", type=float, default=900,
                    help="seconds a row may take before it is reported as timed out (default 900)")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                    help="a pass option on top of the rows' defaults (repeatable; the door's JSON "
                         "names: --option algorithm=ring --option rotation=none); VALUE is read "
                         "as JSON where it parses (0, true), else as a string")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--topology", help=argparse.SUPPRESS)
    ap.add_argument("--program", help=argparse.SUPPRESS)
    ap.add_argument("--door", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for option in args.option:
        if "=" not in option:
            ap.error("--option %r: give NAME=VALUE, e.g. --option algorithm=ring" % option)
    if args.one:
        return one(args)
    print("%-9s %-5s %-11s %9s %7s %8s %8s %7s %-14s %s" % (
        "topology", "prog", "row", "compile_s", "ratio", "fusions", "kernels", "in_loop", "wire",
        "temp_MiB"))
    for topo in args.topologies.split(","):
        doors = ["original", "hook", "before"] + (
            ["hook-unrot", "libtpu-qar"] if platform(topo) == "tpu" else [])
        for prog in args.programs.split(","):
            base = None
            for door in doors:
                env = dict(os.environ, JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1", TF_CPP_MIN_LOG_LEVEL="3",
                           PYTHONPATH=os.path.join(REPO, "python"))
                if door == "libtpu-qar":
                    env["LIBTPU_INIT_ARGS"] = ("--xla_tpu_quantized_all_reduce_level=1 "
                                               "--xla_tpu_quantized_all_reduce_size_threshold_mib=0")
                cmd = [sys.executable, __file__, "--one", "--topology", topo, "--program", prog,
                       "--door", "original" if door == "libtpu-qar" else door, "--runs", str(args.runs)]
                cmd += [a for option in args.option for a in ("--option", option)]
                try:
                    run = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                         timeout=args.timeout)
                except subprocess.TimeoutExpired:
                    print("%-9s %-5s %-11s timed out after %.0f s" % (topo, prog, door, args.timeout),
                          flush=True)
                    continue
                lines = [l for l in run.stdout.splitlines() if l.startswith("{")]
                if run.returncode or not lines:
                    print("%-9s %-5s %-11s failed: %s" % (topo, prog, door, run.stderr.strip()[-300:]))
                    continue
                r = json.loads(lines[-1])
                base = r["compile_s"] if door == "original" else base
                print("%-9s %-5s %-11s %9.2f %6.2fx %8d %8d %7d %-14s %.1f" % (
                    topo, prog, door, r["compile_s"],
                    r["compile_s"] / base if base else float("nan"),
                    r["fusions"], r["kernels"], r["in_loop"], ",".join(r["wire"]),
                    (r["temp_bytes"] or 0) / 2**20), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
