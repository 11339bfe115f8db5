#!/usr/bin/env python3
"""The Python door of tests/options.rs: every job's keyword arguments go
through ``equarx.jax.options(**kwargs)`` (what ``equarx.jax.enable`` sends),
then ``equarx.check_options`` and ``equarx.rewrite`` on one module, all in
one interpreter (JAX itself is not needed for these calls).

Usage: options.py MODULE.pb JOBS.json RESULTS.json
JOBS.json: [{"what": ..., "kwargs": {name: value, ...}}, ...]
RESULTS.json gets one entry per job: {"ok": true} or {"ok": false, "type":
exception class, "message": rewrite's message, "check": check_options's}.
"""

import json
import sys

import equarx
import equarx.jax


def main(module_path, jobs_path, results_path):
    with open(module_path, "rb") as f:
        module = f.read()
    with open(jobs_path) as f:
        jobs = json.load(f)
    results = []
    for job in jobs:
        opts = equarx.jax.options(**job["kwargs"])
        try:
            equarx.rewrite(module, opts)
            results.append({"ok": True})
        except Exception as e:  # noqa: BLE001 -- every outcome is recorded
            result = {"ok": False, "type": type(e).__name__, "message": str(e)}
            try:
                equarx.check_options(opts)
                result["check"] = None
            except Exception as c:  # noqa: BLE001
                result["check"] = str(c)
            results.append(result)
    with open(results_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
