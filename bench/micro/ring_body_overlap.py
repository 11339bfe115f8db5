#!/usr/bin/env python3
"""Why XLA:CPU runs equarx's ring loop one thunk after another, even where
the data would let a lane's collective run beside the other lane's kernels.

    target/pyenv/bin/python bench/micro/ring_body_overlap.py [--shape 8,1024,1024]
        [--runs 5] [--barrier] [--ready N] [--graph]

One psum of a bf16 `--shape` array per device over 4 XLA:CPU devices in one
process, rewritten by equarx at XLA:CPU's pre-scheduler hook (ring,
Hadamard, the door's other defaults), compiled twice: as equarx emits it,
and with a probe's edits of the loop body's HLO text (never shipped):

- `--barrier`: every temporary of the body (the lanes' scales, codes and
  received messages) goes through one `opt-barrier` before the body's
  result, so each stays live to the body's end and XLA's buffer assignment
  can give its buffer to no other value: no edge of the execution graph is
  then a buffer's reuse, only data (and the collectives' order among
  themselves);
- `--ready N`: N more kernels at the body's start (scalar adds, kept by the
  barrier), so that more thunks are ready at once than XLA:CPU's executor
  runs in one thread (it hands the tail of its ready queue to other
  workers only past 8 ready thunks, `kSplitThreshold` in
  `xla/backends/cpu/runtime/thunk_executor.h`).

For each program it prints the median wall time of `--runs` alternated runs
and, from the JAX profiler (`--runs` more runs), each device's time in
collectives, in other thunks and in both at once (overlap); then whether the
edited program's result is the unedited one's, bit for bit, on every device.
`--graph` prints the loop body's execution graph as XLA:CPU logs it
(`TF_CPP_VMODULE=thunk_executor=6`): each thunk and the thunks it waits for.

The edit goes through the equarx CLI (`cargo build --release`): `equarx print`
to text and `equarx rewrite --format module` back to the proto the hook
returns.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.path.join(REPO, "target", "release", "equarx")
COLLECTIVES = ("collective_permute", "all_to_all", "all_reduce", "all_gather", "reduce_scatter")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8,1024,1024",
                    help="per-device bf16 payload (default 8,1024,1024: 16 MiB)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--barrier", action="store_true",
                    help="keep the body's temporaries live to its end through an opt-barrier")
    ap.add_argument("--ready", type=int, default=0, help="extra ready kernels at the body's start")
    ap.add_argument("--graph", action="store_true", help="print the body's execution graph")
    return ap.parse_args()


def body_bounds(lines):
    start = next(i for i, line in enumerate(lines) if line.startswith("%equarx_ring_body"))
    end = next(i for i in range(start, len(lines)) if lines[i] == "}")
    return start, end


def edit(text, barrier, ready):
    """The loop body of equarx's ring with the probe's edits."""
    lines = text.split("\n")
    start, _ = body_bounds(lines)
    keep = []
    if ready:
        head = next(i for i in range(start, len(lines))
                    if re.match(r"\s+%\S+ = s32\[\] get-tuple-element\(", lines[i]))
        counter = re.match(r"\s+%(\S+) ", lines[head]).group(1)
        extra = []
        for k in range(ready):
            lines.insert(head + 1, "  %%probe.%d = s32[] fusion(%%%s), kind=kLoop, calls=%%probe_fused.%d"
                         % (k, counter, k))
            keep.append("probe.%d" % k)
            extra.append("%%probe_fused.%d (p.%d: s32[]) -> s32[] {\n  %%p.%d = s32[] parameter(0)\n"
                         "  %%c.%d = s32[] constant(%d)\n  ROOT %%a.%d = s32[] add(%%p.%d, %%c.%d)\n}\n"
                         % (k, k, k, k, k + 1, k, k, k))
        lines[start:start] = "\n".join(extra).split("\n")
    start, end = body_bounds(lines)
    body = lines[start:end]
    shapes = {}
    for line in body:
        m = re.match(r"\s+(?:ROOT )?%(\S+) = (\S+|\(.*?\)) \S+\(", line)
        if m:
            shapes[m.group(1)] = m.group(2)
    root = next(i for i, line in enumerate(body) if line.strip().startswith("ROOT"))
    m = re.match(r"\s+ROOT %(\S+) = (\(.*?\)) tuple\((.*?)\)(, metadata=.*)?$", body[root])
    outs = [o.strip().lstrip("%") for o in m.group(3).split(",")]
    if barrier:
        keep += [re.match(r"\s+%(\S+) ", line).group(1) for line in body
                 if re.search(r" (fusion|collective-permute)\(", line)
                 and not line.strip().startswith("ROOT")
                 and re.match(r"\s+%(\S+) ", line).group(1) not in outs + keep]
    if not keep:
        return "\n".join(lines)
    names = outs + [k for k in keep if k not in outs]
    tshape = "(" + ", ".join(shapes[n] for n in names) + ")"
    new = ["  %%probe.keep = %s tuple(%s)" % (tshape, ", ".join("%" + n for n in names)),
           "  %%probe.barrier = %s opt-barrier(%%probe.keep)" % tshape]
    for j, n in enumerate(outs):
        new.append("  %%probe.out.%d = %s get-tuple-element(%%probe.barrier), index=%d"
                   % (j, shapes[n], j))
    new.append("  ROOT %%%s = %s tuple(%s)" % (
        m.group(1), m.group(2), ", ".join("%%probe.out.%d" % j for j in range(len(outs)))))
    body[root:root + 1] = new
    return "\n".join(lines[:start] + body + lines[end:])


def to_text(proto):
    return subprocess.run([CLI, "print", "-", "--input-format", "module"], input=proto,
                          capture_output=True, check=True).stdout.decode()


def to_proto(text):
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "m.hlo"), os.path.join(d, "m.pb")
        with open(src, "w") as f:
            f.write(text)
        r = subprocess.run([CLI, "rewrite", src, "-o", out, "--format", "module"],
                           capture_output=True)
        if r.returncode:
            sys.exit("equarx rewrite refused the edited module: " + r.stderr.decode())
        with open(out, "rb") as f:
            return f.read()


def main():
    a = parse_args()
    if not os.path.exists(CLI):
        sys.exit("needs %s: cargo build --release" % CLI)
    if a.graph:
        os.environ["TF_CPP_VMODULE"] = "thunk_executor=6"
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, os.path.join(REPO, "python"))
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.extend import xla as jxla
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from equarx import _native

    shape = tuple(int(v) for v in a.shape.split(","))
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    spec = P("x")
    host = np.random.default_rng(0).standard_normal((4 * shape[0],) + shape[1:])
    x = jax.device_put(jnp.asarray(host.astype(np.float32), jnp.bfloat16),
                       NamedSharding(mesh, spec))

    def psum(v):
        return jax.shard_map(lambda t: jax.lax.psum(t, "x"), mesh=mesh, in_specs=spec,
                             out_specs=spec)(v)

    options = _native.options_json({"platform": "cpu", "types": ["bf16", "f32"],
                                    "min_payload_bytes": 0, "algorithm": "ring",
                                    "rotation": "hadamard"})
    options = options.decode() if isinstance(options, bytes) else options
    stage = jxla.PipelineStage.PRE_SCHEDULER
    programs = {}
    for name, edited in (("equarx", False), ("equarx, edited", True)):
        def transform(module, edited=edited):
            result = _native.rewrite(module, options)
            if not result.changed:
                return None
            if not edited:
                return result.module
            return to_proto(edit(to_text(result.module), a.barrier, a.ready))

        jxla.register_hlo_module_transformation(transform, name="ring-body-overlap", stage=stage,
                                                platforms=("cpu",))
        jax.clear_caches()
        if a.graph:
            print("--- %s: XLA:CPU's execution graphs follow (stderr)" % name, flush=True)
        programs[name] = jax.jit(psum).lower(x).compile()
        jxla.clear_hlo_module_transformation("ring-body-overlap", stage=stage, platforms=("cpu",))
    times = {k: [] for k in programs}
    for exe in programs.values():
        jax.block_until_ready(exe(x))
    for _ in range(a.runs):
        for name, exe in programs.items():
            t = time.perf_counter()
            jax.block_until_ready(exe(x))
            times[name].append(time.perf_counter() - t)
    print("jax %s, 4 XLA:CPU devices in one process, psum of bf16%s a device, ring + H; edits:"
          " barrier %s, %d extra ready kernels" % (jax.__version__, list(shape),
                                                  "yes" if a.barrier else "no", a.ready))
    from xla_cpu_overlap import split_time, thunk_events
    for name, exe in programs.items():
        events = thunk_events(lambda exe=exe: exe(x), a.runs)
        per = []
        for device, es in sorted(events.items()):
            es = [e for e in es if not e[2].startswith("while")]
            coll, comp, both, _ = split_time(es, lambda n: n.startswith(COLLECTIVES))
            per.append("device %s: collectives %.1f, other %.1f, overlap %.1f ms" % (
                device, coll / a.runs / 1e6, comp / a.runs / 1e6, both / a.runs / 1e6))
        print("%-15s median %.1f ms a run; %s" % (name, 1e3 * statistics.median(times[name]),
                                                 "; ".join(per)))
    outs = {k: [np.asarray(s.data).view(np.uint16) for s in exe(x).addressable_shards]
            for k, exe in programs.items()}
    same = all(np.array_equal(p, q) for p, q in zip(outs["equarx"], outs["equarx, edited"]))
    print("edited result bit for bit the unedited one's on every device: %s"
          % ("yes" if same else "NO"))


if __name__ == "__main__":
    main()
