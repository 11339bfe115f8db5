#!/usr/bin/env python3
"""bench/model: equarx on a real LLM (Gemma 3 270M, tensor-parallel, XLA:CPU).

Run it through bench/model/run (the pinned venv, the built libequarx.so).
"""

import argparse
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

EPILOG = """\
what it does:
  Downloads (once, into target/model-cache/) Gemma 3 270M as llama.cpp's
  Q4_K_M GGUF, dequantizes it to f32 (so the model measured is the
  dequantized Q4_K_M weights), tokenizes the Lee corpus (300 news articles)
  with the GGUF's own vocabulary, and cuts it into windows of W tokens, each
  starting with BOS. Then, on XLA:CPU devices:
    - the f32 single-device forward (the reference),
    - per T, the Megatron tensor-parallel forward in bf16 without equarx
      (36 psums = all-reduces: attention out and MLP down of 18 layers),
    - the same program with equarx, once per (topology, plan), through the
      JAX door (equarx.jax.enable(platforms=("cpu",), types=("bf16","f32"),
      topology=..., **plan)), with --before-xla through the door before XLA
      (equarx.jax.rewrite_lowered on the lowered program, which is how a
      shard_map program meets XLA:TPU: add platform=tpu to a plan to run
      XLA:TPU's emission), or, with --rewrite-cmd, through a command,
  and prints one row per (T, topology, plan): what equarx's report says it
  chose and how many of the 36 all-reduces it rewrote, its predicted error,
  perplexity, Δppl %, top-1 agreement and mean KL (nats/token) against the
  bf16 TP program and against the f32 reference, and whether all T devices
  hold bit-identical results.

  Sanity checks fail the run (non-zero exit): tokenizer round trip on the
  whole corpus; JAX f32 forward vs a float64 numpy forward (32 tokens);
  TP f32 vs one device; 36 all-reduces in every compiled TP module;
  reference perplexity within [8, 40].

plans:
  A plan is a comma-separated list of equarx options (their JSON names,
  `equarx rewrite --help` lists them): `defaults` is none (the pass's cost
  model decides); `algorithm=ring,rotation=none`; `quant_format=int4`;
  `min_payload=0` rewrites every eligible all-reduce whatever the cost
  model says. Each --plan adds one; each --topology (v5e, v6e, v5p, h100,
  h200, slices like v5e:2x2) runs every plan again for that machine model.

examples:
  bench/model/run                                    # T=4,2; v5e; defaults; 4 x 512
  bench/model/run --tp 4 --windows 8 --topology v5e --topology h100 \\
      --plan defaults --plan 'algorithm=ring,rotation=none' \\
      --plan 'algorithm=ring,rotation=hadamard' --plan 'quant_format=int4' \\
      --json bench/model/results/run.json
  bench/model/run --rewrite-cmd 'target/release/equarx rewrite - -o - --types bf16,f32'
  bench/model/run --compile-time --tp 4 --repeats 5  # compile wall/CPU, original vs equarx
  bench/model/run --capture /tmp/psum_inputs.npz     # the 36 psums' per-device inputs
"""


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="bench/model/run", description=__doc__.splitlines()[1],
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, action="append", metavar="T",
                    help="tensor-parallel degree (repeatable; default: 4 and 2, every T "
                         "the 4 query heads allow besides 1)")
    ap.add_argument("--window", type=int, default=512, metavar="W",
                    help="tokens per window, BOS included (default 512 = the sliding window)")
    ap.add_argument("--windows", type=int, default=4, metavar="N",
                    help="number of windows scored (default 4; the corpus holds 144 of 512)")
    ap.add_argument("--skip", type=int, default=0, metavar="K",
                    help="start after the first K windows' worth of text (default 0)")
    ap.add_argument("--plan", action="append", metavar="OPTS",
                    help="equarx options for one row, 'defaults' or NAME=VALUE,... (repeatable)")
    ap.add_argument("--topology", action="append", metavar="TOPO",
                    help="the machine equarx's cost model predicts for (repeatable; default v5e)")
    ap.add_argument("--json", metavar="FILE",
                    help="write every number (and the checks, the commit and the host CPU) here")
    ap.add_argument("--rewrite-cmd", metavar="CMD",
                    help="instead of the JAX door, pipe each compiled module (HloModuleProto "
                         "bytes on stdin, the rewritten module on stdout) through CMD, with "
                         "--topology T, the plan's options as flags and --report-json FILE "
                         "appended; e.g. 'target/release/equarx rewrite - -o - --types bf16,f32'")
    ap.add_argument("--before-xla", action="store_true",
                    help="instead of the JAX door's registration, rewrite each lowered program "
                         "with equarx.jax.rewrite_lowered (the door before XLA; door=before-xla in "
                         "one plan does it for that plan); platform=tpu in a plan runs XLA:TPU's "
                         "emission on XLA:CPU")
    ap.add_argument("--compile-time", action="store_true",
                    help="instead of evaluating: XLA:CPU compile wall and CPU time of the TP "
                         "forward, original vs with equarx (first --tp, --topology, --plan), "
                         "alternated, --repeats each; medians")
    ap.add_argument("--repeats", type=int, default=5, help="compile-time repeats (default 5)")
    ap.add_argument("--capture", metavar="FILE.npz",
                    help="instead of evaluating: write every device's input of each of the 36 "
                         "psums (bf16 TP, first --tp, first window) with per-op block statistics")
    a = ap.parse_args(argv)
    a.tp = a.tp or [4, 2]
    a.plan = a.plan or ["defaults"]
    a.topology = a.topology or ["v5e"]
    return a


def setup_jax(tps):
    need = max(max(tps), 4)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={max(need, 8)}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def chosen(summary):
    if summary is None:
        return "(no equarx)", "-"
    plans = summary["plans"]
    text = " ".join(f"{k}" + (f" x{n}" if len(plans) > 1 else "") for k, n in plans.items()) or "none"
    return text, f"{summary['rewritten']}/{summary['ops']}"


def table(res):
    head = (f"Gemma 3 270M — {res['weights']} — Lee corpus, {res['windows']} windows x "
            f"{res['window']} tokens ({res['rows'][0]['tokens_scored']} predictions) — "
            f"XLA:CPU, door: {res['door']} — f32 reference ppl {res['ref']['ppl']:.3f}")
    cols = ["prog", "T", "topology", "plan", "chosen (alg/rot/fmt/block)", "rewr", "pred.err",
            "ppl", "Δppl% tp", "top1 tp", "KL tp", "Δppl% f32", "top1 f32", "KL f32", "replicas"]
    rows = []
    for r in res["rows"]:
        ch, n = chosen(r["summary"])
        s = r["summary"] or {}
        same = "identical" if all(r["replicas_identical"]) else \
            f"DIFFER ({sum(1 for x in r['replicas_identical'] if not x)} win)"
        t, f = r["vs_tp_bf16"], r["vs_ref_f32"]
        rows.append([f"#{r['program']}", str(r["T"]), r["topology"] or "-", r["label"], ch, n,
                     fmt(s.get("predicted_rel_rms_max"), ".2%"), f"{r['ppl']:.3f}",
                     f"{t['dppl_pct']:+.3f}±{t['dppl_pct_se']:.3f}", f"{t['top1_agreement']:.4f}",
                     f"{t['kl_mean']:.5f}", f"{f['dppl_pct']:+.3f}±{f['dppl_pct_se']:.3f}",
                     f"{f['top1_agreement']:.4f}", f"{f['kl_mean']:.5f}", same])
    widths = [max(len(c), *(len(x[i]) for x in rows)) for i, c in enumerate(cols)]
    line = lambda xs: "  ".join(x.ljust(w) for x, w in zip(xs, widths))  # noqa: E731
    out = [head, line(cols), line(["-" * w for w in widths])] + [line(x) for x in rows]
    skipped = {}
    for r in res["rows"]:
        for reason, n in ((r["summary"] or {}).get("skipped_reasons") or {}).items():
            skipped.setdefault((r["T"], r["topology"], r["label"]), []).append(f"{n} x {reason}")
    for (T, topo, label), reasons in skipped.items():
        out.append(f"not rewritten (T={T} {topo} {label}): " + "; ".join(reasons))
    out.append("prog: rows with the same # compiled to the same module (run and scored once). "
               "tp = vs the bf16 TP program without equarx (same T), f32 = vs the f32 "
               "single-device reference; Δppl ± its standard error (per-token differences); "
               "KL(baseline || row) in nats/token; pred.err: the "
               "report's largest predicted relative RMS error of one all-reduce (Gaussian data)")
    return "\n".join(out)


def _host():
    """The machine's CPU, its vector extensions and core count: XLA:CPU's
    f32 results (and so a bf16 program's perplexity in its last digits) can
    differ between CPUs, so a table compares rows of one host only."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = info.get("flags", "").split()
    return {"cpu": info.get("model name") or platform.processor() or platform.machine(),
            "vector": sorted(f for f in flags if f.startswith(("avx", "amx", "fma"))),
            "cores": os.cpu_count()}


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    setup_jax(a.tp)
    sys.path.insert(0, HERE)
    from equarx_model import doors, harness

    plans = [doors.parse_plan(p) for p in a.plan]
    if a.rewrite_cmd and a.before_xla:
        raise SystemExit("bench/model/run: give --rewrite-cmd or --before-xla, not both")
    if a.before_xla:
        plans = [dict(p, door="before-xla") for p in plans]
    door = doors.CommandDoor(a.rewrite_cmd) if a.rewrite_cmd else doors.JaxDoor()
    t0 = time.time()
    h = harness.Harness(door)
    if a.compile_time:
        res = harness.compile_times(h, a.tp[0], a.topology[0], plans[0], a.repeats, a.window)
        m = res["median"]
        print(f"XLA:CPU compile of the bf16 TP forward (T={res['T']}, W={a.window}, "
              f"{res['topology']}, {res['plan']}; {a.repeats} alternated repeats, medians; "
              f"equarx rewrote {res['report']['rewritten']}/{res['report']['ops']})")
        print(f"{'':10}{'compile wall':>14}{'compile CPU':>14}{'lower+compile wall':>20}"
              f"{'lower+compile CPU':>19}")
        for v in ("original", "equarx"):
            print(f"{v:10}{m[v]['compile_wall_s']:>13.2f}s{m[v]['compile_cpu_s']:>13.2f}s"
                  f"{m[v]['lower_compile_wall_s']:>19.2f}s{m[v]['lower_compile_cpu_s']:>18.2f}s")
        r = res["ratio"]
        print(f"{'ratio':10}{r['compile_wall_s']:>13.2f}x{r['compile_cpu_s']:>13.2f}x"
              f"{r['lower_compile_wall_s']:>19.2f}x{r['lower_compile_cpu_s']:>18.2f}x")
    elif a.capture:
        import jax.numpy as jnp
        from equarx_model import capture, evaluate
        T = a.tp[0]
        mesh, p, sharded, _ = h.tp(T, jnp.bfloat16)
        wins = evaluate.windows(h.ids, a.window, 1, h.cfg.bos, a.skip)
        _, ops = capture.run(h.cfg, mesh, p, sharded, wins)
        stats = capture.write_npz(a.capture, h.cfg, ops, wins,
                                  {"model": "gemma-3-270m Q4_K_M dequantized to f32, run in bf16",
                                   "T": T, "window": a.window, "skip": a.skip})
        print(f"wrote {a.capture}: {ops.shape[1]} psum operands, each [T={T}, {a.window}, "
              f"{h.cfg.width}] (block 64 statistics per op)")
        print(f"{'op':16}{'κ² mean':>10}{'κ² p99':>10}{'kurtosis':>10}{'rms':>10}")
        for k, s in stats.items():
            print(f"{k:16}{s['crest_sq_mean']:>10.2f}{s['crest_sq_p99']:>10.2f}"
                  f"{s['excess_kurtosis']:>10.1f}{s['rms']:>10.3g}")
        res = {"capture": a.capture, "stats": stats}
    else:
        res = harness.evaluate_plans(h, a.tp, a.topology, plans, a.window, a.windows, a.skip)
        print(table(res))
        c = res["checks"]
        print(f"checks: tokenizer round trip on {c['tokenizer']['tokens']} tokens "
              f"({c['tokenizer']['tokens_per_word']:.3f}/word); f32 vs float64 hidden rel RMS "
              f"{c['float64']['hidden_rel_rms']:.2e} (<= {harness.TOL_F64_HIDDEN:g}), max |Δlog p| "
              f"{c['float64']['logp_max_abs_diff']:.2e} (<= {harness.TOL_F64_LOGP:g}); TP f32 "
              f"T={c['tp_f32']['T']} vs one device {c['tp_f32']['rel_rms']:.2e} "
              f"(<= {harness.TOL_TP_F32:g}); {harness.ALL_REDUCES} all-reduces per TP module; "
              f"ref ppl {res['ref']['ppl']:.3f} in {list(harness.PPL_BAND)}")
    res["argv"] = sys.argv[1:] if argv is None else argv
    res["git"] = _git_state()
    res["host"] = _host()
    res["wall_s"] = time.time() - t0
    if isinstance(door, doors.JaxDoor):
        res["library"] = door.library()
    else:
        res["rewrite_cmd"] = a.rewrite_cmd
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=_plain)
        print(f"wrote {a.json}")
    print(f"total {res['wall_s']:.0f} s", file=sys.stderr)


def _git_state():
    import subprocess
    def git(*args):
        r = subprocess.run(["git", "-C", HERE, *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    return {"commit": git("rev-parse", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--", ".", "../../src", "../../python"))}


def _plain(o):
    import numpy as np
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(type(o))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - the point is a loud, readable failure
        name = type(e).__name__
        print(f"bench/model: FAILED ({name}): {e}", file=sys.stderr)
        raise
