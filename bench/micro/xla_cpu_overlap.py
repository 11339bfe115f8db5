#!/usr/bin/env python3
"""Whether XLA:CPU runs a collective at the same time as compute that does
not depend on it.

    target/pyenv/bin/python bench/micro/xla_cpu_overlap.py [--kernels 8] [--runs 5]

One jitted program over 4 XLA:CPU devices in one process: an all-reduce of
one f32[1024, 2048] array a device, and beside it `--kernels` elementwise
kernels over slices of another array, each an output of its own (so XLA
keeps them apart), none reading the all-reduce. Under the JAX profiler it
sums, per device, the time of the all-reduce's events, of the kernels'
events, and of their overlap. An overlap of 0 means the runtime ran them
one after another although nothing ordered them, so no emission that
leaves independent work beside a collective buys overlap there.
"""
import argparse
import collections
import glob
import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=int, default=8, help="independent kernels (default 8)")
    ap.add_argument("--runs", type=int, default=5, help="profiled runs (default 5)")
    a = ap.parse_args()
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    spec = P("x")
    sharding = NamedSharding(mesh, spec)
    rows = 128 * a.kernels
    x = jax.device_put(jnp.ones((4 * 1024, 2048), jnp.float32), sharding)
    y = jax.device_put(jnp.ones((4 * rows, 2048), jnp.float32), sharding)

    def body(x, y):
        parts = [jnp.tanh(jnp.sin(y[k * 128:(k + 1) * 128]) * 3.0 + jnp.cos(y[k * 128:(k + 1) * 128]) * k)
                 for k in range(a.kernels)]
        return (jax.lax.psum(x, "x"),) + tuple(parts)

    exe = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, spec),
                                out_specs=tuple([spec] * (a.kernels + 1)))).lower(x, y).compile()
    for _ in range(3):
        jax.block_until_ready(exe(x, y))
    events = thunk_events(lambda: exe(x, y), a.runs)
    print("jax %s, 4 XLA:CPU devices in one process, %d kernels beside one all-reduce, %d runs"
          % (jax.__version__, a.kernels, a.runs))
    for device, es in sorted(events.items()):
        coll, comp, overlap, kernels = split_time(es, lambda name: name.startswith("psum"))
        print("device %s: all-reduce %.1f ms, kernels %.1f ms (%d events), overlap %.1f ms"
              % (device, coll / 1e6, comp / 1e6, kernels, overlap / 1e6))


def thunk_events(run, runs):
    """Calls `run()` `runs` times under the JAX profiler (each result
    waited for): each device's XLA:CPU thunk events, as (start ns, end ns,
    name), by device ordinal."""
    from jax._src.lib import _profile_data
    trace = tempfile.mkdtemp(prefix="xla_cpu_overlap.")
    try:
        jax.profiler.start_trace(trace)
        for _ in range(runs):
            jax.block_until_ready(run())
        jax.profiler.stop_trace()
        data = _profile_data.ProfileData.from_file(
            glob.glob(os.path.join(trace, "**", "*.xplane.pb"), recursive=True)[0])
    finally:
        shutil.rmtree(trace, ignore_errors=True)
    events = collections.defaultdict(list)
    for plane in data.planes:
        for line in plane.lines:
            for e in line.events:
                stats = dict(e.stats)
                if "hlo_op" in stats:
                    events[stats.get("device_ordinal")].append(
                        (e.start_ns, e.start_ns + e.duration_ns, e.name))
    return events


def split_time(events, is_collective):
    """One device's [`thunk_events`]: the ns its collectives' events cover,
    the ns its other events cover, the ns covered by both at once, and how
    many other events there were."""
    coll = [(s, t) for s, t, name in events if is_collective(name)]
    comp = [(s, t) for s, t, name in events if not is_collective(name)]
    both = sum(max(0, min(t1, t2) - max(s1, s2)) for s1, t1 in coll for s2, t2 in comp)
    return (sum(t - s for s, t in coll), sum(t - s for s, t in comp), both, len(comp))

if __name__ == "__main__":
    main()
