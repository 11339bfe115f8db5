#!/usr/bin/env python3
"""Message layouts for one quantized hop, measured in real XLA:CPU on 8 devices.

Issue 12 asked for the cheapest correct way to put a block's codes and its
bf16 scale on the wire. Each candidate is the same hop written as HLO text:
absmax blocks of 64 f32 values, a bf16-rounded scale, s8 codes, one ring
step (a collective-permute to the next device), dequantize. They differ only
in how the scale travels:

  - `shifts`: the scale's f32 bits shifted into 2 bytes, concatenated after
    the codes: one s8 `[nb, 66]` array (what equarx emits);
  - `bitcast`: the scale converted to bf16 and bit-cast to s8 `[nb, 2]` (a
    width-changing bitcast-convert), concatenated: one array;
  - `tuple`: codes and bf16 scales as the two operands of one
    collective-permute (a multi-operand permute, if XLA takes one);
  - `two-permutes`: codes and bf16 scales in two collective-permutes.

Through `tests/xla/xla_tool.py` (XLA's parser, the whole CPU pipeline, 8
devices): the instructions XLA keeps after optimization, the compile's CPU
time, the execution time of the compiled hop (best of the runs), and
whether every candidate's result equals the `shifts` result bit for bit.

Usage: target/pyenv/bin/python bench/micro/message_layouts.py [--blocks NB] [--runs R]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
XLA_TOOL = os.path.join(REPO, "tests", "xla", "xla_tool.py")
P = 8
PAIRS = "{" + ",".join("{%d,%d}" % (d, (d + 1) % P) for d in range(P)) + "}"

HEAD = """HloModule layout_{name}, entry_computation_layout={{(f32[{nb},64]{{1,0}})->f32[{nb},64]{{1,0}}}}, num_partitions=8

%max (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}}

%or (c: s32[], d: s32[]) -> s32[] {{
  %c = s32[] parameter(0)
  %d = s32[] parameter(1)
  ROOT %o = s32[] or(%c, %d)
}}

ENTRY %main (x: f32[{nb},64]) -> f32[{nb},64] {{
  %x = f32[{nb},64]{{1,0}} parameter(0)
  %abs = f32[{nb},64]{{1,0}} abs(%x)
  %floor = f32[] constant(1.5046328e-36)
  %amax = f32[{nb}]{{0}} reduce(%abs, %floor), dimensions={{1}}, to_apply=%max
  %inv = f32[] constant(0.007874016)
  %invb = f32[{nb}]{{0}} broadcast(%inv), dimensions={{}}
  %s0 = f32[{nb}]{{0}} multiply(%amax, %invb)
  %s = f32[{nb}]{{0}} reduce-precision(%s0), exponent_bits=8, mantissa_bits=7
  %one = f32[] constant(1)
  %oneb = f32[{nb}]{{0}} broadcast(%one), dimensions={{}}
  %r = f32[{nb}]{{0}} divide(%oneb, %s)
  %rb = f32[{nb},64]{{1,0}} broadcast(%r), dimensions={{0}}
  %y = f32[{nb},64]{{1,0}} multiply(%x, %rb)
  %lo = f32[] constant(-127)
  %hi = f32[] constant(127)
  %yr = f32[{nb},64]{{1,0}} round-nearest-even(%y)
  %yc = f32[{nb},64]{{1,0}} clamp(%lo, %yr, %hi)
  %codes = s8[{nb},64]{{1,0}} convert(%yc)
"""

TAIL = """  %cf = f32[{nb},64]{{1,0}} convert(%rcodes)
  %sb = f32[{nb},64]{{1,0}} broadcast(%rscale), dimensions={{0}}
  ROOT %out = f32[{nb},64]{{1,0}} multiply(%cf, %sb)
}}
"""

BODIES = {
    "shifts": """  %bits = s32[{nb}]{{0}} bitcast-convert(%s)
  %bb = s32[{nb},2]{{1,0}} broadcast(%bits), dimensions={{0}}
  %sh = s32[2]{{0}} constant({{16, 24}})
  %shb = s32[{nb},2]{{1,0}} broadcast(%sh), dimensions={{1}}
  %srl = s32[{nb},2]{{1,0}} shift-right-logical(%bb, %shb)
  %sbytes = s8[{nb},2]{{1,0}} convert(%srl)
  %msg = s8[{nb},66]{{1,0}} concatenate(%codes, %sbytes), dimensions={{1}}
  %recv = s8[{nb},66]{{1,0}} collective-permute(%msg), channel_id=1, source_target_pairs={pairs}
  %rcodes = s8[{nb},64]{{1,0}} slice(%recv), slice={{[0:{nb}], [0:64]}}
  %rs = s8[{nb},2]{{1,0}} slice(%recv), slice={{[0:{nb}], [64:66]}}
  %u = u8[{nb},2]{{1,0}} bitcast-convert(%rs)
  %w = s32[{nb},2]{{1,0}} convert(%u)
  %pl = s32[{nb},2]{{1,0}} shift-left(%w, %shb)
  %zero = s32[] constant(0)
  %bits2 = s32[{nb}]{{0}} reduce(%pl, %zero), dimensions={{1}}, to_apply=%or
  %rscale = f32[{nb}]{{0}} bitcast-convert(%bits2)
""",
    "bitcast": """  %sbf = bf16[{nb}]{{0}} convert(%s)
  %sbytes = s8[{nb},2]{{1,0}} bitcast-convert(%sbf)
  %msg = s8[{nb},66]{{1,0}} concatenate(%codes, %sbytes), dimensions={{1}}
  %recv = s8[{nb},66]{{1,0}} collective-permute(%msg), channel_id=1, source_target_pairs={pairs}
  %rcodes = s8[{nb},64]{{1,0}} slice(%recv), slice={{[0:{nb}], [0:64]}}
  %rs = s8[{nb},2]{{1,0}} slice(%recv), slice={{[0:{nb}], [64:66]}}
  %rbf = bf16[{nb}]{{0}} bitcast-convert(%rs)
  %rscale = f32[{nb}]{{0}} convert(%rbf)
""",
    "tuple": """  %sbf = bf16[{nb}]{{0}} convert(%s)
  %recv = (s8[{nb},64]{{1,0}}, bf16[{nb}]{{0}}) collective-permute(%codes, %sbf), channel_id=1, source_target_pairs={pairs}
  %rcodes = s8[{nb},64]{{1,0}} get-tuple-element(%recv), index=0
  %rbf = bf16[{nb}]{{0}} get-tuple-element(%recv), index=1
  %rscale = f32[{nb}]{{0}} convert(%rbf)
""",
    "two-permutes": """  %sbf = bf16[{nb}]{{0}} convert(%s)
  %rcodes = s8[{nb},64]{{1,0}} collective-permute(%codes), channel_id=1, source_target_pairs={pairs}
  %rbf = bf16[{nb}]{{0}} collective-permute(%sbf), channel_id=2, source_target_pairs={pairs}
  %rscale = f32[{nb}]{{0}} convert(%rbf)
""",
}


def hlo(name, nb):
    return (HEAD + BODIES[name] + TAIL).format(name=name.replace("-", "_"), nb=nb, pairs=PAIRS)


def run_tool(jobs, work):
    jobs_path = os.path.join(work, "jobs.json")
    results_path = os.path.join(work, "results.json")
    with open(jobs_path, "w") as f:
        json.dump(jobs, f)
    subprocess.run([sys.executable, XLA_TOOL, "--devices", str(P), jobs_path, results_path],
                   check=True, cwd=work)
    with open(results_path) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=32768, help="blocks of 64 per device (default 32768)")
    ap.add_argument("--runs", type=int, default=7, help="executions of each compiled hop (default 7)")
    a = ap.parse_args()
    nb = a.blocks
    names = list(BODIES)
    with tempfile.TemporaryDirectory(prefix="equarx-layouts-") as work:
        rng = np.random.default_rng(0)
        inputs = []
        for d in range(P):
            path = os.path.join(work, f"x{d}.bin")
            x = rng.standard_normal((nb, 64)).astype(np.float32)
            x[:, 5] *= 100  # one outlier channel per block
            x.tofile(path)
            inputs.append([{"path": path, "dtype": "f32", "shape": [nb, 64]}])
        jobs = []
        for n in names:
            with open(os.path.join(work, f"{n}.txt"), "w") as f:
                f.write(hlo(n, nb))
            jobs.append({"kind": "text_to_proto", "text": f"{n}.txt", "out": f"{n}.pb"})
        parsed = run_tool(jobs, work)
        jobs = []
        for n, p in zip(names, parsed):
            if not p["ok"]:
                continue
            jobs.append({"kind": "compile", "module": f"{n}.pb", "num_partitions": P,
                         "num_replicas": 1, "optimized_text_out": f"{n}.opt.txt"})
            for k in range(a.runs):
                jobs.append({"kind": "run", "module": f"{n}.pb", "num_partitions": P,
                             "num_replicas": 1, "inputs": inputs, "outputs_dir": f"out_{n}"})
        results = run_tool(jobs, work) if jobs else []
        print(f"one ring hop on {P} XLA:CPU devices, {nb} blocks of 64 f32 per device, "
              f"best of {a.runs} executions")
        print(f"{'layout':14} {'HLO instr':>9} {'after XLA':>9} {'compile cpu s':>13} "
              f"{'run ms':>8}  result")
        reference = None
        i = 0
        for n, p in zip(names, parsed):
            text = hlo(n, nb)
            emitted = sum(1 for line in text.splitlines() if " = " in line and "ENTRY" not in line)
            if not p["ok"]:
                reason = p["error"].strip().splitlines()[-1][:90]
                print(f"{n:14} {emitted:>9} {'-':>9} {'-':>13} {'-':>8}  XLA's parser refuses it: {reason}")
                continue
            c, runs = results[i], results[i + 1:i + 1 + a.runs]
            i += 1 + a.runs
            if not c["ok"] or not all(r["ok"] for r in runs):
                bad = c if not c["ok"] else next(r for r in runs if not r["ok"])
                lines = [l for l in bad["error"].strip().splitlines() if "error" in l.lower()]
                reason = (lines or bad["error"].strip().splitlines())[0].strip()[:160]
                print(f"{n:14} {emitted:>9} {'-':>9} {'-':>13} {'-':>8}  XLA refuses it: {reason}")
                continue
            with open(os.path.join(work, f"{n}.opt.txt")) as f:
                kept = sum(1 for line in f if " = " in line and not line.lstrip().startswith("ROOT %tuple"))
            out = np.concatenate([np.fromfile(os.path.join(work, f"out_{n}", f"dev{d}_out0.bin"),
                                              np.uint32) for d in range(P)])
            if reference is None:
                reference, same = out, "the reference"
            else:
                same = "bit-identical" if np.array_equal(out, reference) else "DIFFERS"
            best = 1e3 * min(r["run_s"] for r in runs)
            print(f"{n:14} {emitted:>9} {kept:>9} {c['compile_cpu_s']:>13.2f} {best:>8.1f}  {same}")


if __name__ == "__main__":
    main()
