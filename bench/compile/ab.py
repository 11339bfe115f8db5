"""Compile time of rewrites side by side in one process: the same program,
rewritten before XLA by one or more equarx checkouts (each with its own
Python door and libequarx.so), compiled in alternation with the original in
the real XLA:TPU or XLA:GPU, deviceless.

    target/compilers/bin/python bench/compile/ab.py --program psum --topology v5e:2x2 \\
        --side before=/tmp/old-checkout:/tmp/libequarx-old.so --side after=.:target/debug/libequarx.so \\
        [--rounds 5] [--option NAME=VALUE ...]

A side may add options of its own after a second colon,
`NAME=CHECKOUT:LIBRARY:OPTION=VALUE,...` (`--side b128=.:target/release/libequarx.so:block_size=128`),
on top of `--option`: two plans of one library side by side.

`bench/compile/compilers.py` compiles every row in a process of its own,
and on a shared machine the ratio of two such rows moves by more than most
changes do. Here each side rewrites the program in a process of its own
(its checkout's `python/` on PYTHONPATH, its library in EQUARX_LIB: a
registration and a loaded library cannot be undone), the rewrites are
saved as StableHLO, and this process compiles the original and every side
in turn, `--rounds` times after a warm-up round, the order rotated each
round. It prints, per program, the kernels of the compiled module and the
median, lowest and highest compile time, and the median as a multiple of
the original's. Programs and options are `bench/compile/compilers.py`'s
(the topology's defaults with `min_payload_bytes=0`, then `--option`).
"""

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compilers  # noqa: E402  (the programs, topologies and the census of kernels)


def rewrite(args):
    """In a side's own process: lower the program, rewrite it with that
    side's door, write the StableHLO (and the original's) to `args.out`."""
    import equarx.jax
    topo = compilers.tool.topology(compilers.platform(args.topology), args.topology)
    devices = sorted(topo.devices, key=lambda d: d.id)
    f, fargs = compilers.program(args.program, devices)
    lowered = f.lower(*fargs)
    options = json.loads(args.options)
    rewritten = equarx.jax.rewrite_lowered(lowered, **options)
    with open(args.out, "w") as out:
        out.write(str(rewritten.compiler_ir("stablehlo")))
    with open(args.out + ".original", "w") as out:
        out.write(str(lowered.compiler_ir("stablehlo")))


def compile_all(args, texts):
    """In this process: every text compiled in alternation; returns, per
    name, the kernels and the compile times of the measured rounds."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir
    topo = compilers.tool.topology(compilers.platform(args.topology), args.topology)
    devices = sorted(topo.devices, key=lambda d: d.id)
    kernels = {}

    def compile_one(name):
        f, fargs = compilers.program(args.program, devices)
        lowered = f.lower(*fargs)
        with jax_mlir.make_ir_context():
            module = ir.Module.parse(texts[name])
        lowering = copy.copy(lowered._lowering)
        lowering._hlo, lowering._executable = module, None
        lowered = copy.copy(lowered)
        lowered._lowering = lowering
        t0 = time.perf_counter()
        compiled = lowered.compile()
        wall = time.perf_counter() - t0
        kernels[name] = compilers.tool.kernels_of(compiled.as_text())
        return wall

    times = compilers.alternate(list(texts), args.rounds, compile_one)
    return kernels, times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--program", default="psum", help="psum, mlp, gemma, allgather or reducescatter (default psum)")
    ap.add_argument("--topology", default="v5e:2x2", help="e.g. v5e:2x2, v5e:8x8, h100x4")
    ap.add_argument("--side", action="append", default=[],
                    metavar="NAME=CHECKOUT:LIBRARY[:OPTION=VALUE,...]",
                    help="a checkout whose python/ door rewrites, with its libequarx.so and "
                         "options of its own (repeatable, at least one)")
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                    help="a pass option on top of the topology's defaults (VALUE read as JSON "
                         "where it parses)")
    ap.add_argument("--rewrite", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--options", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rewrite:
        return rewrite(args)
    if not args.side:
        ap.error("give at least one --side NAME=CHECKOUT:LIBRARY")
    options = {"topology": "h100" if compilers.platform(args.topology) == "gpu"
               else args.topology.split(":")[0], "min_payload_bytes": 0}
    def add_options(into, items, flag):
        try:
            return compilers.add_options(into, items)
        except ValueError as e:
            ap.error("%s %s" % (flag, e))

    add_options(options, args.option, "--option")
    texts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for side in args.side:
            name, _, where = side.partition("=")
            checkout, _, rest = where.partition(":")
            library, _, own = rest.partition(":")
            if not (name and checkout and library):
                ap.error("--side %r: give NAME=CHECKOUT:LIBRARY[:OPTION=VALUE,...]" % side)
            side_options = add_options(dict(options), [o for o in own.split(",") if o],
                                       "--side %s" % name)
            out = os.path.join(tmp, name + ".mlir")
            env = dict(os.environ, EQUARX_LIB=os.path.abspath(library),
                       PYTHONPATH=os.path.join(os.path.abspath(checkout), "python"),
                       JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1", TF_CPP_MIN_LOG_LEVEL="3")
            subprocess.run([sys.executable, os.path.abspath(__file__), "--rewrite",
                            "--program", args.program, "--topology", args.topology,
                            "--options", json.dumps(side_options), "--out", out],
                           env=env, check=True)
            if "original" not in texts:
                with open(out + ".original") as f:
                    texts["original"] = f.read()
            with open(out) as f:
                texts[name] = f.read()
    kernels, times = compile_all(args, texts)
    base = statistics.median(times["original"])
    print("%s on %s, %d alternated rounds in one process, options %s" % (
        args.program, args.topology, args.rounds, json.dumps(options)))
    for name in texts:
        ts = times[name]
        print("%-10s kernels %5d   compile median %6.2f s  (%.2f-%.2f)   %6.2fx the original" % (
            name, kernels[name], statistics.median(ts), min(ts), max(ts),
            statistics.median(ts) / base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
