"""Where one run's time goes, from a JAX profiler trace of one process.

XLA:CPU's thunk runtime records one trace event per executed HLO
instruction (the event's name is the instruction's name). Against the
compiled module's text, each event is a collective (all-reduce,
collective-permute, all-gather, ...: its time includes the transfer and the
wait for the peers) or compute (everything else). The summary gives, for
one run: wall time, the union of the time covered by collective events,
by compute events, and by both at once (the overlap the schedule achieved),
the summed durations per opcode, and the costliest instructions.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import time

INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(?:\([^=]*\)|[\w\[\],{}:\s]*?)\s([a-z][a-z\-]*)\(")
COLLECTIVE_OPS = {"all-reduce", "all-reduce-start", "all-reduce-done", "collective-permute",
                  "collective-permute-start", "collective-permute-done", "all-gather",
                  "all-gather-start", "all-gather-done", "reduce-scatter", "all-to-all"}


def opcodes(hlo_text: str) -> dict[str, str]:
    """Instruction name → opcode, for every instruction of the module."""
    out = {}
    for line in hlo_text.splitlines():
        m = INSTR.match(line)
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
    coll, comp = [], []
    per_op: dict[str, float] = {}
    per_instr: dict[str, float] = {}
    count = 0
    for e in trace_events:
        if e.get("ph") != "X" or e.get("name") not in ops:
            continue
        name, t0, dur = e["name"], float(e["ts"]), float(e.get("dur", 0))
        op = ops[name]
        (coll if op in COLLECTIVE_OPS else comp).append((t0, t0 + dur))
        per_op[op] = per_op.get(op, 0.0) + dur
        per_instr[name] = per_instr.get(name, 0.0) + dur
        count += 1
    cu, pu = union(coll), union(comp)
    return {
        "events": count,
        "collective_ms": length(cu) / 1e3,
        "compute_ms": length(pu) / 1e3,
        "overlap_ms": intersect(cu, pu) / 1e3,
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
            "overlap ms", "instructions run", "costliest opcodes (rank 0, ms)"]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        profs = [p for p in r.get("profile") or [] if p]
        if not profs:
            continue

        def med(key):
            return statistics.median(p[key] for p in profs)

        ops = ", ".join(f"{k} {v:.0f}" for k, v in list(profs[0]["by_opcode_ms"].items())[:5])
        out.append("| " + " | ".join([
            r["rate"], r["workload"], r["size"], r["variant"], f"{med('wall_ms'):.0f}",
            f"{med('compute_ms'):.0f}", f"{med('collective_ms'):.0f}", f"{med('overlap_ms'):.1f}",
            str(profs[0]["events"]), ops]) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: trace_summary.py RESULTS.json   (from cluster.py run --profile --json)")
    with open(sys.argv[1]) as f:
        print(table(json.load(f)["rows"]))
