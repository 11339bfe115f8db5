#!/usr/bin/env python3
"""Fit the error model's prior to a real LLM's all-reduce inputs.

    target/pyenv/bin/python bench/model/prior.py CAPTURE.npz [CAPTURE.npz ...] \\
        [--out core/src/numerics/prior.json] [--json per-op.json]

Each CAPTURE.npz is what `bench/model/run --capture` writes: every psum's
per-device inputs of one TP run. For every op, equarx's own statistics
(`equarx.op_stats`, the calibration's definition) give, per block size and
rotation, the crest factor κ² = E[block absmax²] / E[square] of partial
sums of k consecutive ranks, k = 1..T, and per code format one
quantization's relative error² E[(x − Q(x))²] / E[square] of the same
partials. The prior's figures at a block size and rotation are the largest
over every op and every k of every capture, so that the error model
predicts at or above what these inputs err. `--out`
writes it where the library reads it (core/src/numerics/prior.json, built
in); the per-op figures go to `--json`.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))
import equarx  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("captures", nargs="+")
    ap.add_argument("--out", default=None, help="the prior file to write (core/src/numerics/prior.json)")
    ap.add_argument("--json", default=None, help="per-op statistics to write")
    a = ap.parse_args()
    per_op = []
    table = {}
    rounding = {}
    for path in a.captures:
        z = np.load(path)
        meta = json.loads(str(z["meta"]))
        for name in meta["ops"]:
            x = np.asarray(z[name], np.float32)  # [T, tokens, width]
            rows = x.reshape(x.shape[0], -1)
            stats = equarx.op_stats(rows, source=f"{os.path.basename(path)}:{name}")
            entry = {"capture": os.path.basename(path), "op": name, "T": rows.shape[0], "blocks": []}
            for b in stats["blocks"]:
                kappa = [a_ / m for a_, m in zip(b["absmax_sq"], b["mean_sq"]) if m > 0]
                entry["blocks"].append({"block": b["block"], "rotation": b["rotation"], "crest_sq": kappa})
                key = (b["block"], b["rotation"])
                table.setdefault(key, []).extend(kappa)
                for r in b.get("rounding", []):
                    rel = [e / m for e, m in zip(r["err_sq"], b["mean_sq"]) if m > 0]
                    rounding.setdefault((r["format"],) + key, []).extend(rel)
            per_op.append(entry)
    blocks = sorted({k[0] for k in table})
    print("κ² of partial sums over %d ops (largest, mean), by block size and rotation" % len(per_op))
    print("%6s %20s %20s" % ("B", "unrotated", "hadamard"))
    rows = []
    for b in blocks:
        un, rot = table[(b, "none")], table[(b, "hadamard")]
        print("%6d %9.2f (%7.2f) %9.2f (%7.2f)" % (b, max(un), np.mean(un), max(rot), np.mean(rot)))
        rows.append([b, round(float(max(un)), 3), round(float(max(rot)), 3)])
    formats = sorted({k[0] for k in rounding})
    rounding_rows = []
    for f in formats:
        print("one %s quantization's relative RMS error (largest, mean)" % f)
        rel = []
        for b in blocks:
            un, rot = rounding[(f, b, "none")], rounding[(f, b, "hadamard")]
            print("%6d %8.3f%% (%7.3f%%) %8.3f%% (%7.3f%%)" % (
                b, 100 * max(un) ** 0.5, 100 * np.mean(un) ** 0.5,
                100 * max(rot) ** 0.5, 100 * np.mean(rot) ** 0.5))
            rel.append([b, float(max(un)), float(max(rot))])
        rounding_rows.append({"format": f, "rel_sq": rel})
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    commit += "+dirty" if dirty else ""
    prior = {
        "source": "gemma-3-270m (Q4_K_M dequantized, bf16) tensor-parallel, %s, the largest κ² "
                  "and rounding errors of %d all-reduces' partial sums" % (
                      ", ".join("T=%d" % t for t in sorted({e["T"] for e in per_op})), len(per_op)),
        "command": "bench/model/prior.py " + " ".join(os.path.basename(c) for c in a.captures),
        "commit": commit,
        "date": datetime.date.today().isoformat(),
        "crest_sq": rows,
        "rounding": rounding_rows,
    }
    if a.out:
        with open(a.out, "w") as f:
            json.dump(prior, f, indent=1)
            f.write("\n")
        print("wrote", a.out)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"prior": prior, "ops": per_op}, f, indent=1)
        print("wrote", a.json)


if __name__ == "__main__":
    main()
