#!/usr/bin/env python3
"""XLA:CPU compute of one rewritten all-reduce against one elementwise pass
over the same payload, side by side in one process.

    target/pyenv/bin/python bench/micro/op_cost.py [--devices 4] [--shape 4,512,640]
        [--runs 30] [--option NAME=VALUE ...] [--hlo-dir DIR]

Three jitted programs over `--devices` XLA:CPU devices (one process, so the
collectives are memory copies and what differs is compute), each on a
bf16 array of `--shape` per device:

- `psum`: the plain bf16 all-reduce (XLA:CPU sums it in f32);
- `equarx`: the same program compiled with equarx through the JAX door
  (`equarx.jax.enable`, the pre-scheduler stage, as a user runs it; options
  from `--option`, the door's defaults otherwise);
- `convert`: one elementwise pass per device, bf16 to f32 and back
  (a convert each way: read 2 bytes, write 4, read 4, write 2 per element).

It prints the median wall and CPU time (all threads of the process) of
each over `--runs` alternated rounds (each after a warm-up), equarx's added
time (equarx - psum) and that as a multiple of the convert pass (CPU time
is the steadier figure on a shared machine), the entry-level kernels (fusions, collectives,
loops, other ops) XLA:CPU keeps in each executable, and whether every device
of the rewrite holds bit-identical results. `--hlo-dir` writes each
optimized module there.
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--shape", default="4,512,640",
                    help="per-device bf16 payload (default: Gemma-3-270m's prefill, 4 x 512 tokens)")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--option", action="append", default=[],
                    help="an equarx option for the door, NAME=VALUE (repeatable)")
    ap.add_argument("--hlo-dir", default=None)
    ap.add_argument("--json", default=None, help="also write the figures as JSON here")
    return ap.parse_args()


def main():
    a = parse_args()
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=%d" % a.devices)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import equarx.jax as ejax

    shape = tuple(int(x) for x in a.shape.split(","))
    devices = jax.devices()[: a.devices]
    mesh = Mesh(np.array(devices), ("x",))
    spec = P("x")
    sharding = NamedSharding(mesh, spec)
    rng = np.random.default_rng(0)
    host = rng.standard_normal((a.devices * shape[0],) + shape[1:]).astype(np.float32)
    x = jax.device_put(jnp.asarray(host, jnp.bfloat16), sharding)

    def psum_fn(v):
        return jax.shard_map(lambda t: jax.lax.psum(t, "x"), mesh=mesh, in_specs=spec,
                             out_specs=spec)(v)

    def convert_fn(v):
        return jax.shard_map(lambda t: t.astype(jnp.float32).astype(jnp.bfloat16) + t,
                             mesh=mesh, in_specs=spec, out_specs=spec)(v)

    def compiled(fn):
        return jax.jit(fn).lower(x).compile()

    plain = compiled(psum_fn)
    conv = compiled(convert_fn)
    options = {}
    for o in a.option:
        k, _, v = o.partition("=")
        options[k.replace("-", "_")] = v
    ejax.enable(platforms=("cpu",), types=("bf16", "f32"), **options)
    try:
        rewritten = compiled(psum_fn)
        report = ejax.last_report() or []
    finally:
        ejax.disable()

    programs = {"psum": plain, "equarx": rewritten, "convert": conv}
    kernels = {}
    for name, exe in programs.items():
        text = exe.as_text()
        kernels[name] = entry_kernels(text)
        if a.hlo_dir:
            os.makedirs(a.hlo_dir, exist_ok=True)
            with open(os.path.join(a.hlo_dir, name + ".txt"), "w") as f:
                f.write(text)
    times = {k: [] for k in programs}
    cpu = {k: [] for k in programs}
    for exe in programs.values():
        jax.block_until_ready(exe(x))
    for _ in range(a.runs):
        for name, exe in programs.items():
            c, t = time.process_time(), time.perf_counter()
            jax.block_until_ready(exe(x))
            times[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    med_cpu = {k: statistics.median(v) * 1e3 for k, v in cpu.items()}
    out = rewritten(x)
    shards = [np.asarray(s.data) for s in out.addressable_shards]
    identical = all(np.array_equal(shards[0].view(np.uint16), s.view(np.uint16)) for s in shards)
    want = np.asarray(plain(x)).astype(np.float32)
    got = np.asarray(out).astype(np.float32)
    rel = float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2)))
    added = med["equarx"] - med["psum"]
    added_cpu = med_cpu["equarx"] - med_cpu["psum"]
    plan = [r.get("plan") or {} for r in report]
    row = {
        "devices": a.devices, "shape": shape, "options": options,
        "median_ms": med, "added_ms": added, "added_over_convert": added / med["convert"],
        "median_cpu_ms": med_cpu, "added_cpu_ms": added_cpu,
        "added_cpu_over_convert": added_cpu / med_cpu["convert"],
        "kernels": kernels, "identical": identical, "rel_rms_vs_psum": rel,
        "plan": [(p.get("algorithm"), p.get("rotation"), p.get("instructions")) for p in plan],
        "rewritten": sum(1 for r in report if r.get("rewritten")),
    }
    print("jax %s, %d XLA:CPU devices in one process, bf16%s per device, median of %d alternated runs"
          % (jax.__version__, a.devices, list(shape), a.runs))
    print("plan: %s" % row["plan"])
    for name in programs:
        k = kernels[name]
        print("%-8s %9.2f ms wall %9.2f ms CPU   entry: %3d fusions, %2d collectives, %2d loops, %3d other"
              % (name, med[name], med_cpu[name], k["fusions"], k["collectives"], k["loops"], k["other"]))
    print("equarx adds %.2f ms wall per all-reduce = %.2fx the convert pass (%.2f ms); "
          "%.2f ms CPU = %.2fx the convert pass's CPU (%.2f ms); "
          "replicas bit-identical: %s; rel. RMS vs psum %.3f%%"
          % (added, added / med["convert"], med["convert"], added_cpu,
             added_cpu / med_cpu["convert"], med_cpu["convert"],
             "yes" if identical else "NO", 100 * rel))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(row, f, indent=1)


def entry_kernels(text):
    """Counts of the entry computation's instructions by kind, in XLA's
    optimized text."""
    lines = text.split("\n")
    start = next(i for i, l in enumerate(lines) if l.startswith("ENTRY"))
    counts = {"fusions": 0, "collectives": 0, "loops": 0, "other": 0}
    free = ("parameter(", "get-tuple-element(", "tuple(", "bitcast(", "constant(")
    for l in lines[start + 1:]:
        if l.startswith("}"):
            break
        op = l.split("=", 1)[-1]
        if " fusion(" in op:
            counts["fusions"] += 1
        elif any(c in op for c in (" all-reduce", " all-gather", " all-to-all", " collective-permute",
                                   " reduce-scatter")):
            counts["collectives"] += 1
        elif " while(" in op:
            counts["loops"] += 1
        elif not any(f in op for f in free):
            counts["other"] += 1
    return counts


if __name__ == "__main__":
    main()
