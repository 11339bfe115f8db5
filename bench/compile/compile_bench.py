#!/usr/bin/env python3
"""bench/compile: how much longer XLA:CPU takes to compile a tensor-parallel
prefill after `equarx rewrite`, and what the rewrite adds to the module.

Run it through bench/compile/run (the pinned venv); `--help` lists the
options, bench/compile/README.md explains the columns.

For each layer count L it
  1. generates the L-layer prefill right after SPMD partitioning
     (tp_prefill.py; cached under the work directory, keyed by L and the
     generator's source);
  2. rewrites it with the `equarx` binary once per variant
     (`--min-payload 0` plus the variant's flags), keeping its JSON report;
  3. counts the instructions of every computation of both modules;
  4. compiles the original and every rewrite on 8 XLA:CPU devices through
     tests/xla/xla_tool.py (the tests' path: MLIR conversion +
     compile_and_load; only that is timed), N rounds, each in a fresh
     process that first compiles a small module to warm up, the modules in
     a rotated order each round, so that machine noise hits all alike;
     a compile over --timeout is killed, reported as "> T", and not retried;
  5. times the whole in-memory rewrite (decode, verify, pass, verify,
     encode) against a prost decode + encode of its output, with
     benches/pass.rs in file mode (given the same flags), after checking
     that the library's rewrite reproduces the CLI's output byte for byte.
"""

import argparse
import datetime
import hashlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True  # no __pycache__ in tests/xla
sys.path.insert(0, os.path.join(REPO, "tests", "xla"))
import xla_tool  # noqa: E402

GENERATOR = os.path.join(HERE, "tp_prefill.py")
WARMUP_MODULE = os.path.join(REPO, "tests", "fixtures", "psum_bf16_p8.pb")
NDEV = 8
# Flags the script sets itself; a variant may not.
RESERVED = {"-o", "--output", "--format", "--input-format", "--report", "--report-json",
            "--dump-dir"}


class BenchError(Exception):
    pass


def log(msg):
    print("bench/compile: %s" % msg, file=sys.stderr, flush=True)


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="bench/compile/run",
        description="XLA:CPU compile time and module size of an L-layer tensor-parallel "
                    "prefill, before and after `equarx rewrite`.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  bench/compile/run\n"
               "  bench/compile/run --layers 16 --runs 5\n"
               "  bench/compile/run --layers 16,62 --variant default "
               "--variant '--algorithm ring' --variant '--algorithm ring --unroll'\n"
               "  bench/compile/run --layers 16 --variant default --variant=--unroll\n"
               "  bench/compile/run --layers 1 --runs 1 --pass-runs 1 --profile dev   # smoke\n")
    ap.add_argument("--layers", default="16,62",
                    help="comma-separated layer counts (default 16,62)")
    ap.add_argument("--runs", type=int, default=3,
                    help="compiles of each module; the table shows the median (default 3)")
    ap.add_argument("--variant", action="append", metavar="FLAGS",
                    help="`equarx rewrite` flags of one variant, in one string; `default` (or "
                         "'') for none; repeat to compare variants side by side (default: "
                         "one variant, `default`). `--min-payload 0` is added unless given. "
                         "A single flag without a value needs the = form: --variant=--unroll")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds one compile may take before it is killed and shown as "
                         "'> T' (default 600)")
    ap.add_argument("--pass-runs", type=int, default=3,
                    help="timed runs of the pass (rewrite vs decode+encode of its output); "
                         "0 skips that table (default 3)")
    ap.add_argument("--profile", choices=("release", "dev"), default="release",
                    help="cargo profile of the equarx binary and of benches/pass.rs "
                         "(default release; dev only for smoke runs: its pass times mean "
                         "nothing)")
    ap.add_argument("--equarx", metavar="PATH",
                    help="use this equarx binary instead of building one")
    ap.add_argument("--workdir", default=os.path.join(REPO, "target", "bench-compile"),
                    help="modules, rewrites and reports go here (default target/bench-compile)")
    ap.add_argument("--json", metavar="FILE", help="also write every measurement as JSON")
    a = ap.parse_args(argv)
    try:
        a.layers = [int(x) for x in a.layers.split(",") if x.strip()]
    except ValueError:
        ap.error("--layers wants comma-separated integers, got %r" % a.layers)
    if not a.layers or any(n < 1 for n in a.layers):
        ap.error("--layers wants layer counts >= 1")
    if a.runs < 1:
        ap.error("--runs must be at least 1")
    if a.pass_runs < 0:
        ap.error("--pass-runs must be 0 or more")
    if a.timeout <= 0:
        ap.error("--timeout must be positive")
    a.variants = []
    for v in a.variant or ["default"]:
        try:
            flags = [] if v.strip() in ("", "default") else shlex.split(v)
        except ValueError as e:
            ap.error("--variant %r: %s" % (v, e))
        if flags and not flags[0].startswith("--"):
            ap.error("--variant %r: want equarx rewrite flags (--name [value] ...) or default"
                     % v)
        bad = sorted({f.split("=")[0] for f in flags} & RESERVED)
        if bad:
            ap.error("--variant %r: %s is set by the benchmark itself" % (v, ", ".join(bad)))
        label = "default" if not flags else " ".join(flags)
        if any(label == w["label"] for w in a.variants):
            ap.error("--variant %r given twice" % v)
        a.variants.append({"label": label, "flags": flags})
    return a


# ------------------------------------------------------------------ building

def cargo_executables(args, what):
    """Runs `cargo ARGS --message-format=json` in the repo; the executables
    it built, by target name."""
    cargo = os.environ.get("CARGO", "cargo")
    cmd = [cargo] + args + ["--message-format=json-render-diagnostics"]
    log("$ %s" % " ".join(cmd))
    p = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise BenchError("%s failed (exit %d):\n%s" % (what, p.returncode,
                                                         p.stderr.decode(errors="replace")[-4000:]))
    exes = {}
    for line in p.stdout.decode(errors="replace").splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("executable"):
            exes[msg["target"]["name"]] = msg["executable"]
    return exes


def build(a):
    release = a.profile == "release"
    if a.equarx:
        equarx = os.path.abspath(a.equarx)
        if not os.access(equarx, os.X_OK):
            raise BenchError("--equarx %s is not an executable" % a.equarx)
    else:
        exes = cargo_executables(["build", "--bin", "equarx"] + (["--release"] if release else []),
                                 "building equarx")
        equarx = exes.get("equarx")
        if not equarx:
            raise BenchError("cargo built no equarx executable")
    bench = None
    if a.pass_runs:
        exes = cargo_executables(["bench", "--bench", "pass", "--no-run"]
                                 + ([] if release else ["--profile", "dev"]),
                                 "building benches/pass.rs")
        bench = exes.get("pass")
        if not bench:
            raise BenchError("cargo built no executable for benches/pass.rs")
    return equarx, bench


# ------------------------------------------------------------------ modules

def generator_key():
    """The cache key besides L: the generator and the pinned Python packages."""
    h = hashlib.sha256()
    for p in (GENERATOR, os.path.join(REPO, "python", "requirements.txt")):
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:12]


def module_for(layers, workdir):
    d = os.path.join(workdir, "modules")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tp_prefill_L%d_%s.pb" % (layers, generator_key()))
    if os.path.exists(path):
        log("L=%d: cached %s" % (layers, os.path.relpath(path)))
        return path
    log("L=%d: generating the module with JAX (tp_prefill.py)" % layers)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, GENERATOR, "--layers", str(layers), "--out", path],
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if p.returncode != 0 or not os.path.exists(path):
        raise BenchError("tp_prefill.py --layers %d failed (exit %d):\n%s"
                         % (layers, p.returncode, p.stderr.decode(errors="replace")[-4000:]))
    log("L=%d: generated in %.1f s" % (layers, time.perf_counter() - t0))
    return path


def count_instructions(path):
    """(instructions, computations) over every computation of a bare
    HloModuleProto (computations = field 3, their instructions = field 2)."""
    with open(path, "rb") as f:
        pb, _ = xla_tool.unwrap_module(f.read())
    instructions = computations = 0
    for fno, wt, comp in xla_tool.proto_fields(pb):
        if fno == 3 and wt == 2:
            computations += 1
            instructions += sum(1 for f2, w2, _ in xla_tool.proto_fields(comp)
                                if f2 == 2 and w2 == 2)
    return instructions, computations


MIN_PAYLOAD_FLAGS = ("--min-payload", "--min-payload-bytes", "--min_payload", "--min_payload_bytes")


def rewrite_flags(variant):
    flags = list(variant["flags"])
    if not any(f.split("=")[0] in MIN_PAYLOAD_FLAGS for f in flags):
        flags = ["--min-payload", "0"] + flags
    return flags


def rewrite(equarx, module, out, report, flags):
    cmd = [equarx, "rewrite", module, "-o", out, "--report-json", report] + flags
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    if p.returncode != 0:
        raise BenchError("$ %s\nfailed (exit %d):\n%s" % (
            " ".join(shlex.quote(c) for c in cmd), p.returncode,
            p.stderr.decode(errors="replace")[-4000:]))
    with open(report) as f:
        rep = json.load(f)
    return sum(1 for r in rep if r.get("rewritten")), len(rep)


# ------------------------------------------------------------------ the pass's own time

def flags_to_options(flags):
    """`equarx rewrite` flags (`--name value`, `--name=value`, a bare
    `--name` for true) as the JSON options object every door reads."""
    options, k = {}, 0
    while k < len(flags):
        name, eq, value = flags[k][2:].partition("=")
        if not eq:
            nxt = flags[k + 1] if k + 1 < len(flags) else None
            if nxt is not None and not nxt.startswith("--"):
                value, k = nxt, k + 1
            else:
                value = "true"
        options[name.replace("-", "_")] = value
        k += 1
    return options


def time_pass(bench, module, expect, flags, runs, timeout):
    env = dict(os.environ)
    env.update({
        "EQUARX_BENCH_MODULE": module,
        "EQUARX_BENCH_OPTIONS": json.dumps(flags_to_options(flags)),
        "EQUARX_BENCH_EXPECT": expect,
        "EQUARX_BENCH_RUNS": str(runs),
    })
    try:
        p = subprocess.run([bench], env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError("benches/pass.rs on %s took over %.0f s" % (module, timeout))
    if p.returncode != 0:
        raise BenchError("benches/pass.rs (file mode) on %s failed (exit %d):\n%s"
                         % (module, p.returncode, p.stderr.decode(errors="replace")[-4000:]))
    lines = p.stdout.decode(errors="replace").strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        raise BenchError("benches/pass.rs printed no JSON result: %r" % p.stdout[-1000:])


# ------------------------------------------------------------------ compiling

def compile_rounds(modules, runs, timeout):
    """modules: {key: path}. Returns {key: {"times": [wall s, ...], "cpu_times":
    [CPU s of all threads, ...], "timed_out": bool}}."""
    out = {k: {"times": [], "cpu_times": [], "timed_out": False} for k in modules}
    keys = list(modules)
    warm = {"kind": "compile", "module": WARMUP_MODULE, "num_partitions": NDEV,
            "num_replicas": 1, "timeout_s": 300}
    for r in range(runs):
        order = keys[r % len(keys):] + keys[:r % len(keys)]
        pending = [k for k in order if not out[k]["timed_out"]]
        while pending:
            jobs = [warm] + [{"kind": "compile", "module": modules[k], "num_partitions": NDEV,
                              "num_replicas": 1, "timeout_s": timeout} for k in pending]
            with open(os.devnull, "w") as quiet:
                res = xla_tool.run_batch(jobs, NDEV, log=quiet)
            if not res[0].get("ok"):
                raise BenchError("the warm-up compile failed: %s" % res[0].get("error"))
            rest = []
            for i, (k, rr) in enumerate(zip(pending, res[1:])):
                if rr.get("ok"):
                    out[k]["times"].append(rr["compile_s"])
                    out[k]["cpu_times"].append(rr["compile_cpu_s"])
                    log("round %d/%d: %s compiled in %.2f s (CPU %.2f s)"
                        % (r + 1, runs, k, rr["compile_s"], rr["compile_cpu_s"]))
                    continue
                if rr.get("crashed") and "timed out" in rr.get("error", ""):
                    out[k]["timed_out"] = True
                    log("round %d/%d: %s: compile killed after %.0f s" % (r + 1, runs, k, timeout))
                    # Later jobs of this batch ran in a fresh worker without
                    # the warm-up: compile them again, warmed.
                    rest = pending[i + 1:]
                    break
                raise BenchError("XLA could not compile %s:\n%s" % (modules[k], rr.get("error")))
            pending = rest
    return out


# ------------------------------------------------------------------ output

def fmt_s(c, timeout, key="times"):
    if c["timed_out"]:
        return "> %.0f" % timeout if key == "times" else "-"
    return "%.2f" % statistics.median(c[key])


def fmt_ratio(orig, rw, timeout, key="times"):
    if orig["timed_out"]:
        return "-"
    o = statistics.median(orig[key])
    if rw["timed_out"]:
        return "> %.1fx" % (timeout / o) if key == "times" else "-"
    return "%.1fx" % (statistics.median(rw[key]) / o)


def markdown(headers, rows):
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(  # noqa: E731
        c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"
    sep = "|" + "|".join("-" * (w + 2) if i < 2 else "-" * (w + 1) + ":"
                         for i, w in enumerate(widths)) + "|"
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def commit():
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(a)
    except BenchError as e:
        print("bench/compile/run: %s" % e, file=sys.stderr)
        return 1


def run(a):
    started = time.time()
    load0 = os.getloadavg()
    equarx, bench = build(a)
    workdir = os.path.abspath(a.workdir)
    results = {"commit": commit(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "argv": sys.argv[1:], "profile": a.profile, "runs": a.runs,
               "pass_runs": a.pass_runs, "timeout_s": a.timeout, "cpus": os.cpu_count(),
               "rows": []}
    for layers in a.layers:
        orig = module_for(layers, workdir)
        d = os.path.join(workdir, "L%d" % layers)
        if os.path.isdir(d):
            shutil.rmtree(d)
        os.makedirs(d)
        before, comps_before = count_instructions(orig)
        modules = {"original": orig}
        rows = []
        for n, v in enumerate(a.variants):
            out = os.path.join(d, "variant%d.pb" % n)
            flags = rewrite_flags(v)
            rewritten, all_reduces = rewrite(equarx, orig, out,
                                             os.path.join(d, "variant%d.report.json" % n), flags)
            after, comps_after = count_instructions(out)
            modules[v["label"]] = out
            rows.append({"layers": layers, "variant": v["label"], "flags": flags,
                         "module": out, "all_reduces": all_reduces, "rewritten": rewritten,
                         "instructions_before": before, "instructions_after": after,
                         "computations_before": comps_before, "computations_after": comps_after,
                         "instructions_per_rewritten": ((after - before) / rewritten
                                                        if rewritten else None)})
            log("L=%d %s: %d of %d all-reduces rewritten, %d -> %d instructions"
                % (layers, v["label"], rewritten, all_reduces, before, after))
        compiled = compile_rounds(modules, a.runs, a.timeout)
        for row in rows:
            row["compile_original"] = compiled["original"]
            row["compile_rewrite"] = compiled[row["variant"]]
            if bench:
                log("L=%d %s: timing the pass (%d runs)" % (layers, row["variant"], a.pass_runs))
                row["pass"] = time_pass(bench, orig, row["module"], row["flags"], a.pass_runs,
                                        timeout=max(600.0, 60.0 * (2 * a.pass_runs + 2)))
        results["rows"].extend(rows)
    results["load_average"] = {"start": load0, "end": os.getloadavg()}
    results["wall_s"] = round(time.time() - started, 1)

    print("# bench/compile: %d-device XLA:CPU compile of an L-layer tensor-parallel prefill "
          "before and after equarx rewrite" % NDEV)
    print("# commit %s, %s, %s profile, %d CPUs, load average %.2f at start, %.2f at end, "
          "%.0f s in all" % (results["commit"], results["date"], a.profile, os.cpu_count(),
                             load0[0], results["load_average"]["end"][0], results["wall_s"]))
    print()
    print("compile: median of %d runs (MLIR conversion + compile_and_load; wall clock, and CPU "
          "time of all threads); instructions over every computation" % a.runs)
    print()
    t = []
    for r in results["rows"]:
        per = r["instructions_per_rewritten"]
        co, cr = r["compile_original"], r["compile_rewrite"]
        t.append([str(r["layers"]), r["variant"], fmt_s(co, a.timeout), fmt_s(cr, a.timeout),
                  fmt_ratio(co, cr, a.timeout), fmt_s(co, a.timeout, "cpu_times"),
                  fmt_s(cr, a.timeout, "cpu_times"), fmt_ratio(co, cr, a.timeout, "cpu_times"),
                  str(r["instructions_before"]), str(r["instructions_after"]),
                  "%d/%d" % (r["rewritten"], r["all_reduces"]),
                  "-" if per is None else "%.0f" % per])
    print(markdown(["layers", "variant", "original s", "rewrite s", "ratio", "original cpu s",
                    "rewrite cpu s", "cpu ratio", "instr original",
                    "instr rewrite", "rewritten", "instr/rewritten"], t))
    if bench:
        print()
        print("the pass: median of %d runs; rewrite = decode, verify, pass, verify, encode; "
              "d+e = prost decode + encode of the rewritten module" % a.pass_runs)
        print()
        t = []
        for r in results["rows"]:
            p = r["pass"]
            rw = statistics.median(p["rewrite_s"])
            de = statistics.median(p["decode_encode_output_s"])
            t.append([str(r["layers"]), r["variant"], "%.1f" % (rw * 1e3), "%.1f" % (de * 1e3),
                      "%.2fx" % (rw / de), "%.2f" % (p["output_bytes"] / 1e6)])
        print(markdown(["layers", "variant", "rewrite ms", "d+e output ms", "rewrite/d+e",
                        "output MB"], t))
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1)
        os.replace(tmp, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
