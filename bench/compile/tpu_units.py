"""Where XLA:TPU's compile time goes, kernel by kernel: libtpu's own dump of
each unit it lowers (a kernel, or the top-level program `TLP` that launches
them), with its code size, for a program as JAX lowers it or rewritten
before XLA.

    target/compilers/bin/python bench/compile/tpu_units.py --program psum \\
        [--topology v5e:2x2] [--original] [--option NAME=VALUE ...] [--keep DIR]

(EQUARX_LIB names libequarx.so for the rewrite.) libtpu lowers every
distinct kernel to its LLO (a VLIW program) once, and most of a compile is
that lowering: instruction selection, scheduling, register allocation and
bundle packing of a software-pipelined loop whose body is one chunk of the
kernel's arrays, unrolled (`perf` puts 73 % of a rewritten 8 MiB psum's
compile there; BENCHMARKS.md, "Tried: blocks down the columns on
XLA:TPU"). A unit's code size is what that work scales with. Prints one
line per unit, largest first: the bundles of its final schedule (`total
scheduled bundles` of libtpu's schedule analysis), the lines of its first
LLO (before optimization), and the unit's name (its root instruction's);
then the totals and the compile's wall time with the dump on (slower than
without). Units are libtpu's after its deduplication: the 36 identical
all-reduces of Gemma's forward are one set of kernels.
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))

UNIT = re.compile(r"^(\d+)-(.+)-(\d+)-(original\.txt|schedule-analysis_packed-bundles-post-ra\.txt)$")
BUNDLES = re.compile(r"total scheduled bundles:\s+(\d+)")


def units(directory):
    """Per unit name (the last dump of it): (bundles, first LLO lines)."""
    found = {}
    for name in sorted(os.listdir(directory)):
        m = UNIT.match(name)
        if not m:
            continue
        stamp, unit, kind = int(m.group(1)), m.group(2), m.group(4)
        entry = found.setdefault(unit, {"stamp": -1})
        if stamp < entry["stamp"]:
            continue
        if stamp > entry["stamp"]:
            entry.clear()
            entry["stamp"] = stamp
        with open(os.path.join(directory, name), errors="replace") as f:
            text = f.read()
        if kind == "original.txt":
            entry["lines"] = text.count("\n")
        else:
            b = BUNDLES.search(text)
            entry["bundles"] = int(b.group(1)) if b else 0
    return {u: (e.get("bundles", 0), e.get("lines", 0)) for u, e in found.items()
            if not u.startswith("<")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--program", default="psum", help="psum, mlp or gemma (default psum)")
    ap.add_argument("--topology", default="v5e:2x2", help="a TPU topology (default v5e:2x2)")
    ap.add_argument("--original", action="store_true", help="the program as JAX lowers it")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                    help="a pass option on top of the topology's defaults and "
                         "min_payload_bytes=0 (VALUE read as JSON where it parses)")
    ap.add_argument("--keep", metavar="DIR", help="keep libtpu's dump in DIR")
    args = ap.parse_args(argv)
    if args.topology.startswith("h100"):
        ap.error("--topology: a TPU topology (libtpu's dump); XLA:GPU has none of its own")
    dump = args.keep or tempfile.mkdtemp(prefix="tpu-units-")
    os.makedirs(dump, exist_ok=True)
    # libtpu reads its flags once, when it loads: before JAX is imported.
    os.environ["LIBTPU_INIT_ARGS"] = " ".join([
        os.environ.get("LIBTPU_INIT_ARGS", ""), "--xla_jf_dump_to=" + dump,
        "--xla_jf_dump_llo_text=true",
        "--xla_jf_dump_llo_pass_label_regex=^(original|packed-bundles-post-ra)$"]).strip()
    import compilers  # noqa: E402  (after the flags: it loads libtpu)
    try:
        options = compilers.add_options(
            {"topology": args.topology.split(":")[0], "min_payload_bytes": 0}, args.option)
    except ValueError as e:
        ap.error("--option %s" % e)
    topo = compilers.tool.topology("tpu", args.topology)
    devices = sorted(topo.devices, key=lambda d: d.id)
    f, fargs = compilers.program(args.program, devices)
    lowered = f.lower(*fargs)
    if not args.original:
        import equarx.jax
        lowered = equarx.jax.rewrite_lowered(lowered, **options)
    t0 = time.perf_counter()
    compiled = lowered.compile()
    wall = time.perf_counter() - t0
    found = units(dump)
    if not found:
        sys.exit("libtpu wrote no unit dumps to %s: a libtpu other than 0.0.42.1 may name its "
                 "flags or files otherwise" % dump)
    what = "original" if args.original else "rewritten before XLA, options %s" % json.dumps(options)
    print("%s on %s, %s: %d kernels in the compiled module, %d units lowered" % (
        args.program, args.topology, what, compilers.tool.kernels_of(compiled.as_text()),
        len(found)))
    print("%9s %9s  unit" % ("bundles", "LLO lines"))
    for unit, (bundles, lines) in sorted(found.items(), key=lambda kv: -kv[1][0]):
        print("%9d %9d  %s" % (bundles, lines, unit))
    print("%9d %9d  all units; compile %.2f s with the dump on" % (
        sum(b for b, _ in found.values()), sum(n for _, n in found.values()), wall))
    if not args.keep:
        shutil.rmtree(dump, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
