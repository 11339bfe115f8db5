"""Runs the tensor-parallel block fixture and its equarx rewrite in XLA:CPU
on 8 devices with the same inputs and compares them.

The inputs are sharded as the fixture's program shards them
(tests/fixtures/generate.py, tp_block): x replicated, wqkv and w1 split
column-wise (heads / MLP features), wo and w2 row-wise.
"""

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, S, D, H, HD, F, N = 2, 16, 256, 8, 32, 1024, 8


def shards(rng):
    bf16 = ml_dtypes.bfloat16
    x = rng.standard_normal((B, S, D)).astype(bf16)
    wqkv = (rng.standard_normal((D, 3, H, HD)) / np.sqrt(D)).astype(bf16)
    wo = (rng.standard_normal((H, HD, D)) / np.sqrt(H * HD)).astype(bf16)
    w1 = (rng.standard_normal((D, F)) / np.sqrt(D)).astype(bf16)
    w2 = (rng.standard_normal((F, D)) / np.sqrt(F)).astype(bf16)
    f = F // N
    return [[x, wqkv[:, :, d:d + 1], wo[d:d + 1], w1[:, d * f:(d + 1) * f], w2[d * f:(d + 1) * f]]
            for d in range(N)]


def main(original, rewritten, out):
    per_device = shards(np.random.default_rng(0))
    inputs = []
    for d, arrays in enumerate(per_device):
        row = []
        for k, a in enumerate(arrays):
            path = os.path.join(out, f"in_d{d}_p{k}.bin")
            np.ascontiguousarray(a).view(np.uint16).tofile(path)
            row.append({"path": path, "dtype": "bf16", "shape": list(a.shape)})
        inputs.append(row)
    jobs = [{"kind": "run", "module": m, "num_partitions": N, "num_replicas": 1,
             "inputs": inputs, "outputs_dir": os.path.join(out, name)}
            for name, m in (("original", original), ("rewritten", rewritten))]
    jobs_path, results_path = os.path.join(out, "jobs.json"), os.path.join(out, "results.json")
    with open(jobs_path, "w") as f:
        json.dump(jobs, f)
    subprocess.run([sys.executable, os.path.join(REPO, "tests/xla/xla_tool.py"), jobs_path,
                    results_path], check=True)
    results = json.load(open(results_path))
    for r in results:
        if not r["ok"]:
            sys.exit("XLA failed: " + r["error"])

    def outputs(name):
        return [np.fromfile(os.path.join(out, name, f"dev{d}_out0.bin"), np.uint16)
                .view(ml_dtypes.bfloat16).astype(np.float64) for d in range(N)]
    orig, new = outputs("original"), outputs("rewritten")
    identical = all(np.array_equal(new[0].view(np.uint64), o.view(np.uint64)) for o in new)
    err = np.sqrt(np.mean((new[0] - orig[0]) ** 2) / np.mean(orig[0] ** 2))
    print(f"XLA compiled and ran both modules on {N} CPU devices "
          f"(compile {results[1]['compile_s']:.2f} s)")
    print(f"  all 8 devices hold bit-identical outputs: {'yes' if identical else 'NO'}")
    print(f"  block output vs the unquantized run: relative RMS {err:.4%}, "
          f"max |diff| {np.max(np.abs(new[0] - orig[0])):.4f} (outputs ~{np.sqrt(np.mean(orig[0]**2)):.2f} RMS)")
    if not identical:
        sys.exit(1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
