"""Compile time through the pre-scheduler hook, plans side by side in one
process: one libequarx.so registered at the real XLA:TPU's or XLA:GPU's
hook (deviceless), reconfigured before every compile, the original (the
pass disabled) and each side compiled in alternation.

    EQUARX_LIB=target/release/libequarx.so target/compilers/bin/python \\
        bench/compile/hook_ab.py --program gemma --topology v5e:2x2 \\
        --side hlo= --side mosaic=kernels=mosaic [--rounds 5] [--option NAME=VALUE ...]

A side is `NAME=OPTION=VALUE,...` (options on top of `--option` and the
topology's defaults with `min_payload_bytes=0`, as in
`bench/compile/compilers.py`). `bench/compile/ab.py` does the same for the
door before XLA, where each side may be another checkout; here a
registration cannot be undone, so the sides are plans of one library.
Prints, per side, the kernels of the compiled module, how many ops equarx
rewrote there and with which kernels, and the median, lowest and highest
compile time, the median as a multiple of the original's.
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compilers  # noqa: E402  (the programs, topologies and the census of kernels)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--program", default="psum", help="psum, mlp, gemma, allgather or reducescatter (default psum)")
    ap.add_argument("--topology", default="v5e:2x2", help="e.g. v5e:2x2, v5e:8x8, h100x4")
    ap.add_argument("--side", action="append", default=[], metavar="NAME=[OPTION=VALUE,...]",
                    help="a plan of the library: options on top of --option (repeatable, at "
                         "least one)")
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                    help="a pass option for every side (VALUE read as JSON where it parses)")
    args = ap.parse_args(argv)
    if not args.side:
        ap.error("give at least one --side NAME=[OPTION=VALUE,...]")
    if "EQUARX_LIB" not in os.environ:
        ap.error("set EQUARX_LIB to the libequarx.so to register")
    plat = compilers.platform(args.topology)
    base = {"topology": "h100" if plat == "gpu" else args.topology.split(":")[0],
            "min_payload_bytes": 0}
    try:
        compilers.add_options(base, args.option)
        sides = {"original": {"disabled_passes": ["quantize-collectives"]}}
        for side in args.side:
            name, eq, own = side.partition("=")
            if not name or not eq or name in sides:
                ap.error("--side %r: give NAME=[OPTION=VALUE,...], each NAME once, not "
                         "'original'" % side)
            sides[name] = compilers.add_options(dict(base), [o for o in own.split(",") if o])
    except ValueError as e:
        ap.error(str(e))
    equarx = compilers.tool.Equarx(os.environ["EQUARX_LIB"], plat)
    topo = compilers.tool.topology(plat, args.topology)
    devices = sorted(topo.devices, key=lambda d: d.id)
    names = list(sides)
    kernels, rewritten = {}, {}

    def compile_one(name):
        equarx.configure(sides[name])
        f, fargs = compilers.program(args.program, devices)
        lowered = f.lower(*fargs)
        t0 = time.perf_counter()
        compiled = lowered.compile()
        wall = time.perf_counter() - t0
        kernels[name] = compilers.tool.kernels_of(compiled.as_text())
        report = equarx.last_report() if name != "original" else None
        done = [op for op in (report or []) if op.get("plan")]
        by = sorted({(op["plan"].get("config") or {}).get("kernels", "hlo") for op in done})
        rewritten[name] = "%d ops rewritten (%s)" % (len(done), ",".join(by) or "-")
        return wall

    times = compilers.alternate(names, args.rounds, compile_one)
    first = statistics.median(times["original"])
    print("%s on %s at the hook, %d alternated rounds in one process, options %s" % (
        args.program, args.topology, args.rounds, json.dumps(base)))
    for name in names:
        ts = times[name]
        print("%-10s kernels %5d   compile median %6.2f s  (%.2f-%.2f)   %6.2fx the original   %s"
              % (name, kernels[name], statistics.median(ts), min(ts), max(ts),
                 statistics.median(ts) / first, rewritten.get(name) or ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
