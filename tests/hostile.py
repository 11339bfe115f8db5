#!/usr/bin/env python3
"""The Python ctypes door (python/equarx/_native.py) over the hostile inputs
of tests/hostile.rs, all in one interpreter.

Usage: hostile.py JOBS.json RESULTS.json
JOBS.json: [{"name": ..., "input": path, "options": JSON string}, ...]
RESULTS.json gets one entry per job: {"ok": true, "changed", "report"} or
{"ok": false, "type": exception class, "message"}. An exception other than
EquarxError is recorded (and fails the Rust test); a crash of the
interpreter fails it too.
"""

import json
import sys

from equarx import _native


def main(jobs_path, results_path):
    with open(jobs_path) as f:
        jobs = json.load(f)
    results = []
    for job in jobs:
        with open(job["input"], "rb") as f:
            data = f.read()
        try:
            r = _native.rewrite(data, job["options"])
            results.append({"name": job["name"], "ok": True, "changed": r.changed,
                            "report": r.report})
        except Exception as e:  # noqa: BLE001 -- every outcome is recorded
            results.append({"name": job["name"], "ok": False, "type": type(e).__name__,
                            "message": str(e)})
    with open(results_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
