"""Where one run's time goes, from a JAX profiler trace of one process.

XLA:CPU's thunk runtime records one trace event per executed HLO
instruction (the event's name is the instruction's name). Against the
compiled module's text, each event is a collective (all-reduce,
collective-permute, all-gather, ...: its time includes the transfer and the
wait for the peers), control flow (while, conditional, call: its event
spans the events of the instructions its body runs) or compute (everything
else). The summary gives, for one run: wall time; the union of the time covered by
collective events, by compute events, and by both at once (the overlap the
schedule achieved); the loop time, what control-flow events cover that no
instruction of theirs does (condition, induction variable, dispatch); the
gaps, the time between the first and the last instruction event that no
instruction event covers (the loop time is part of it, and so is the work
of a thunk whose event marks only its launch: XLA:CPU's dot runs on the
intra-op pool after its event ends); the summed durations per opcode, and
the costliest instructions. Control-flow events are left out of those sums,
so that they add up to instruction time.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import sys
import time

INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(?:\([^=]*\)|[\w\[\],{}:\s]*?)\s([a-z][a-z\-]*)\(")
COLLECTIVE_OPS = {"all-reduce", "all-reduce-start", "all-reduce-done", "collective-permute",
                  "collective-permute-start", "collective-permute-done", "all-gather",
                  "all-gather-start", "all-gather-done", "reduce-scatter", "all-to-all"}
# Their trace event encloses the events of the instructions they run.
CONTROL_OPS = {"while", "conditional", "call"}
COMMENT = re.compile(r"/\*.*?\*/")


def opcodes(hlo_text: str) -> dict[str, str]:
    """Instruction name → opcode, for every instruction of the module."""
    out = {}
    for line in hlo_text.splitlines():
        # Long tuple shapes carry /*index=5*/ comments, whose '=' would
        # stop the shape pattern.
        m = INSTR.match(COMMENT.sub("", line))
        if m:
            out[m.group(1)] = m.group(2)
    return out


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def intersect(x, y) -> float:
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            total += b - a
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarize(trace_events: list[dict], ops: dict[str, str], top: int = 12) -> dict:
    coll, comp, ctrl = [], [], []
    per_op: dict[str, float] = {}
    per_instr: dict[str, float] = {}
    count = 0
    for e in trace_events:
        if e.get("ph") != "X" or e.get("name") not in ops:
            continue
        name, t0, dur = e["name"], float(e["ts"]), float(e.get("dur", 0))
        op = ops[name]
        count += 1
        if op in CONTROL_OPS:
            # Its span is its body's instructions (counted on their own)
            # plus the loop's own cost, which is what is left uncovered.
            ctrl.append((t0, t0 + dur))
            continue
        (coll if op in COLLECTIVE_OPS else comp).append((t0, t0 + dur))
        per_op[op] = per_op.get(op, 0.0) + dur
        per_instr[name] = per_instr.get(name, 0.0) + dur
    cu, pu, ku = union(coll), union(comp), union(ctrl)
    leaves = union(coll + comp)
    span = (leaves[-1][1] - leaves[0][0]) if leaves else 0.0
    return {
        "events": count,
        "collective_ms": length(cu) / 1e3,
        "compute_ms": length(pu) / 1e3,
        "overlap_ms": intersect(cu, pu) / 1e3,
        "control_ms": (length(ku) - intersect(ku, leaves)) / 1e3,
        "gap_ms": (span - length(leaves)) / 1e3,
        "collective_events": len(coll),
        "compute_events": len(comp),
        "compute_sum_ms": sum(b - a for a, b in comp) / 1e3,
        "by_opcode_ms": {k: round(v / 1e3, 2) for k, v in sorted(per_op.items(), key=lambda kv: -kv[1])},
        "top_instructions_ms": [(k, ops[k], round(v / 1e3, 2)) for k, v in
                                sorted(per_instr.items(), key=lambda kv: -kv[1])[:top]],
    }


def profile_run(run, hlo_text: str, outdir: str) -> dict:
    """Runs ``run()`` once under the JAX profiler; the summary of its trace."""
    import jax

    os.makedirs(outdir, exist_ok=True)
    jax.profiler.start_trace(outdir, create_perfetto_trace=True)
    t = time.perf_counter()
    try:
        run()
        wall = time.perf_counter() - t
    finally:
        jax.profiler.stop_trace()
    traces = sorted(glob.glob(os.path.join(outdir, "**", "perfetto_trace.json.gz"), recursive=True),
                    key=os.path.getmtime)
    with gzip.open(traces[-1]) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    s = summarize(events, opcodes(hlo_text))
    s["wall_ms"] = wall * 1e3
    s["trace"] = traces[-1]
    return s


def table(rows: list[dict]) -> str:
    """The profiled rows of a results JSON (``cluster.py run --profile
    --json``) as a markdown table: per program, the median over ranks."""
    import statistics

    head = ["rate", "workload", "size", "variant", "wall ms", "compute ms", "collectives ms",
            "overlap ms", "loop ms", "gaps ms", "instructions run", "costliest opcodes (rank 0, ms)"]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        profs = [p for p in r.get("profile") or [] if p]
        if not profs:
            continue

        def med(key):
            return statistics.median(p.get(key, float("nan")) for p in profs)

        ops = ", ".join(f"{k} {v:.0f}" for k, v in list(profs[0]["by_opcode_ms"].items())[:5])
        out.append("| " + " | ".join([
            r["rate"], r["workload"], r["size"], r["variant"], f"{med('wall_ms'):.0f}",
            f"{med('compute_ms'):.0f}", f"{med('collective_ms'):.0f}", f"{med('overlap_ms'):.1f}",
            f"{med('control_ms'):.1f}", f"{med('gap_ms'):.1f}", str(profs[0]["events"]), ops]) + " |")
    return "\n".join(out)


def hlo_file(hlo_dir: str, row: dict) -> str:
    """Where ``cluster.py run --dump-hlo`` put a row's optimized HLO."""
    fn = f"{row['workload']}-{row['size']}-{row['variant']}".replace(" ", "_").replace(":", "_")
    return os.path.join(hlo_dir, fn + ".hlo.txt")


def resummarize(rows: list[dict], hlo_dir: str) -> int:
    """Summarizes the rows' traces again (this file's summary, rank 0's HLO
    from ``--dump-hlo``: every rank compiles the same module); the number
    of profiles redone. A trace or HLO file that is gone is an error."""
    done = 0
    for r in rows:
        profs = r.get("profile") or []
        if not any(profs):
            continue
        with open(hlo_file(hlo_dir, r)) as f:
            ops = opcodes(f.read())
        for p in profs:
            if not p:
                continue
            with gzip.open(p["trace"]) as f:
                data = json.load(f)
            events = data["traceEvents"] if isinstance(data, dict) else data
            p.update(summarize(events, ops))
            done += 1
    return done


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="the profile table of a results JSON "
                                 "(cluster.py run --profile --json)")
    ap.add_argument("results")
    ap.add_argument("--hlo", help="summarize the traces again against this --dump-hlo "
                    "directory (the run's workdir/hlo)")
    ap.add_argument("--json", help="with --hlo: write the results with the new summaries here")
    args = ap.parse_args(argv)
    if args.json and not args.hlo:
        ap.error("--json needs --hlo")
    try:
        with open(args.results) as f:
            results = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"trace_summary.py: {args.results}: {e}")
    if args.hlo:
        try:
            n = resummarize(results["rows"], args.hlo)
        except OSError as e:
            sys.exit(f"trace_summary.py: {e} (traces stay in the run's workdir; --hlo wants "
                     "the workdir's hlo/ of a --dump-hlo run)")
        print(f"{n} profiles summarized again from their traces", file=sys.stderr)
        if args.json:
            tmp = args.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump(results, f, indent=1)
            os.replace(tmp, args.json)
    print(table(results["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
