#!/usr/bin/env python3
"""Whether XLA:CPU takes a region of fused kernels as one kernel, from its
pre-scheduler hook (where equarx's JAX door sits): a `call` with the
frontend attribute `xla_cpu_small_call="true"`, which XLA:CPU's thunk
emitter compiles as one kernel of its legacy emitter (XLA's own
`SmallWhileLoopHoistingPass` makes such calls of small loops).

    target/pyenv/bin/python bench/micro/xla_cpu_small_call.py [--rows 81920] [--runs 30]

One block quantization's shape of work, x / max|x| over rows of 64 f32
(a reduce, then a broadcasting divide: two kernels when fused the usual
way), written twice as a module after fusion: the two fusions in the entry,
and the same two fusions inside a region call. A transformation registered
at the pre-scheduler stage hands XLA:CPU each module in place of JAX's own;
the script checks the results against numpy, then prints compile time and
the median and lowest run time of each, alternated, and the entry's kernels.
A region with a `dot` inside compiles and runs as well (`--dot`: the
Hadamard product's place, here an identity matrix).

The equarx CLI (`target/release/equarx`, `cargo build --release`) turns the
HLO text into the module proto the hook takes.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def module_text(rows, region, dot):
    shape = "f32[%d,64]{1,0}" % rows
    red = "f32[%d]{0}" % rows
    h = ""
    if dot:
        eye = ", ".join("{ " + ", ".join("1" if i == j else "0" for j in range(64)) + " }"
                        for i in range(64))
        h = "  %%h = f32[64,64]{1,0} constant({ %s })\n" % eye
    fusions = """%max_f32 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

%fused_reduce (p: SHAPE) -> RED {
  %p = SHAPE parameter(0)
  %abs = SHAPE abs(%p)
  %zero = f32[] constant(0)
  ROOT %r = RED reduce(%abs, %zero), dimensions={1}, to_apply=%max_f32
}

%fused_scale (q: SHAPE, s: RED) -> SHAPE {
  %q = SHAPE parameter(0)
  %s = RED parameter(1)
  %bb = SHAPE broadcast(%s), dimensions={0}
  ROOT %d = SHAPE divide(%q, %bb)
}
""".replace("SHAPE", shape).replace("RED", red)
    body = "%s  %%y = %s %s\n  %%red = %s fusion(%%y), kind=kLoop, calls=%%fused_reduce\n" \
           "  ROOT %%sc = %s fusion(%%y, %%red), kind=kLoop, calls=%%fused_scale\n" % (
               h, shape, "dot(%x, %h), lhs_contracting_dims={1}, rhs_contracting_dims={0}"
               if dot else "copy(%x)", red, shape)
    head = "HloModule probe, entry_computation_layout={(%s)->%s}\n\n" % (shape, shape)
    if not region:
        return head + fusions + "\nENTRY %%main (x: %s) -> %s {\n  %%x = %s parameter(0)\n%s}\n" % (
            shape, shape, shape, body)
    return head + fusions + (
        "\n%%region (x: %s) -> %s {\n  %%x = %s parameter(0)\n%s}\n\n"
        "ENTRY %%main (arg: %s) -> %s {\n  %%arg = %s parameter(0)\n"
        "  ROOT %%c = %s call(%%arg), to_apply=%%region, "
        "frontend_attributes={xla_cpu_small_call=\"true\"}\n}\n") % (
        shape, shape, shape, body, shape, shape, shape, shape)


def to_proto(text, tmp, name):
    src, out = os.path.join(tmp, name + ".hlo"), os.path.join(tmp, name + ".pb")
    with open(src, "w") as f:
        f.write(text)
    cli = os.path.join(REPO, "target", "release", "equarx")
    if not os.path.exists(cli):
        sys.exit("needs %s: cargo build --release" % cli)
    subprocess.run([cli, "rewrite", src, "-o", out, "--format", "module"], check=True)
    with open(out, "rb") as f:
        return f.read()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=81920, help="rows of 64 (default 81920: 20 MiB)")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--dot", action="store_true", help="a dot before the reduce, in the region")
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.extend import xla as jxla

    with tempfile.TemporaryDirectory() as tmp:
        modules = {name: to_proto(module_text(args.rows, region, args.dot), tmp, name)
                   for name, region in (("two kernels", False), ("one region", True))}
    handed = {"module": None}
    jxla.register_hlo_module_transformation(
        lambda m: handed["module"], name="xla-cpu-small-call-probe",
        stage=jxla.PipelineStage.PRE_SCHEDULER, platforms=("cpu",))
    x = np.random.default_rng(0).standard_normal((args.rows, 64)).astype(np.float32)
    want = x / np.max(np.abs(x), axis=1, keepdims=True)
    xd = jax.device_put(x)
    compiled, compile_s, times = {}, {}, {name: [] for name in modules}
    for name, proto in modules.items():
        handed["module"] = proto
        jax.clear_caches()
        f = jax.jit(lambda v: v / jnp.max(jnp.abs(v), axis=1, keepdims=True))
        t0 = time.perf_counter()
        compiled[name] = f.lower(x).compile()
        compile_s[name] = time.perf_counter() - t0
        got = np.asarray(compiled[name](xd))
        if not np.array_equal(got, want):
            sys.exit("%s: XLA:CPU's result differs from numpy's" % name)
    for _ in range(args.runs):
        for name, c in compiled.items():
            t0 = time.perf_counter()
            c(xd).block_until_ready()
            times[name].append(time.perf_counter() - t0)
    for name, c in compiled.items():
        entry = c.as_text().split("\nENTRY ")[1].split("\n}")[0]
        kernels = sum(1 for line in entry.splitlines() if " fusion(" in line or " call(" in line
                      or " dot(" in line)
        print("%-12s compile %.3f s  run median %.2f ms (lowest %.2f)  entry kernels %d  results "
              "as numpy's" % (name, compile_s[name], 1e3 * float(np.median(times[name])),
                              1e3 * min(times[name]), kernels))


if __name__ == "__main__":
    main()
