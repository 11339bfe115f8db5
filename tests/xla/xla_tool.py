#!/usr/bin/env python3
"""xla_tool.py -- run batches of jobs through real XLA (jaxlib) for equarx tests.

Usage:
    python tests/xla/xla_tool.py [--devices N] JOBS.json RESULTS.json
    python tests/xla/xla_tool.py [--devices N] --self-test

Run it with the pinned venv (`scripts/pyenv` prints its python).

JOBS.json is a JSON list of jobs. RESULTS.json receives a JSON list with one
result per job, in the same order. Every job is independent: a failing job
gives {"ok": false, "error": "..."} and the batch goes on. Relative paths in
jobs are resolved against the current working directory.

Job kinds (module files may be a bare HloModuleProto or an HloProto wrapper as
written by --xla_dump_hlo_as_proto; the wrapper is detected and unwrapped,
the result's "input_kind" says which it was):

  {"kind": "text_to_proto", "text": "m.txt", "out": "m.pb"}
      XLA's HLO text parser -> bare HloModuleProto bytes.
  {"kind": "proto_to_text", "module": "m.pb", "out": "m.txt"}
      XLA's printer (default HloPrintOptions + print_large_constants=True).
  {"kind": "compile", "module": "m.pb", "num_partitions": P, "num_replicas": R,
   "optimized_text_out": "opt.txt"  (optional)}
      num_partitions / num_replicas default to the module's device_assignment
      (HloModuleProto field 15) when present, else 1.
      Compile only: XLA's HloVerifier and the whole CPU pipeline run. The
      optimized module of the executable is written to optimized_text_out.
  {"kind": "run", "module": "m.pb", "num_partitions": P, "num_replicas": R,
   "inputs": [[{"path": "x.bin", "dtype": "bf16", "shape": [8, 128]}, ...]  # device 0
              , ...],                                                       # device 1..
   "outputs_dir": "out/"}
      Compile, execute on R*P devices (device d = partition d, or replica d),
      write output k of device d as raw little-endian bytes to
      outputs_dir/dev{d}_out{k}.bin. Inputs are raw little-endian bytes
      (bf16 as its 16-bit pattern). The result lists each output's dtype and
      shape, and whether it is bit-identical across devices.

Optional fields on compile/run jobs:
  "debug_options": {"xla_field_name": value, ...}  extra DebugOptions fields
  "timeout_s": seconds (default 600) before the job is killed.

Every result carries "ok", "error" (full exception text) when not ok, and
"compile_s" / "run_s" timings where they apply (wall clock), plus
"compile_cpu_s": the CPU time of all the worker's threads during the
compile, which other load on the machine inflates far less. A run job whose
module, counts and debug options an earlier run job of the batch had
compiled reuses that executable ("compile_cached": true, "compile_s" and
"compile_cpu_s": 0); compile jobs always compile.

Crash isolation: the jobs run in a worker subprocess (one jax import per
batch). If XLA aborts the process (fatal CHECK) or a job times out, that job
gets {"ok": false, "error": "... worker died ..."} and a fresh worker carries
on with the next job.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SELF_TEST_FIXTURE = os.path.join(REPO, "tests", "fixtures", "psum_bf16_p8.pb")
DEFAULT_TIMEOUT_S = 600.0
DISABLED_PASSES_FOR_PARTITIONED = "sharding-propagation,spmd-partitioning,shardy-xla"

# HLO element type name -> numpy dtype name (ml_dtypes for the narrow floats).
DTYPES = {
    "pred": "bool", "s8": "int8", "s16": "int16", "s32": "int32", "s64": "int64",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
    "c64": "complex64", "c128": "complex128",
    "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2",
}
NP_TO_HLO = {v: k for k, v in DTYPES.items()}


# --------------------------------------------------------------------------
# protobuf wire-format helpers (no protobuf dependency)

def _varint(buf, pos):
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def proto_fields(buf):
    """Yields (field_number, wire_type, value) of one message's top level.
    value is the int for varints/fixed, the bytes for length-delimited."""
    pos = 0
    n = len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        field, wt = key >> 3, key & 7
        if field == 0:
            raise ValueError("field number 0")
        if wt == 0:
            val, pos = _varint(buf, pos)
        elif wt == 1:
            if pos + 8 > n:
                raise ValueError("truncated fixed64")
            val, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wt == 2:
            ln, pos = _varint(buf, pos)
            if pos + ln > n:
                raise ValueError("truncated length-delimited field")
            val, pos = bytes(buf[pos:pos + ln]), pos + ln
        elif wt == 5:
            if pos + 4 > n:
                raise ValueError("truncated fixed32")
            val, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        else:
            raise ValueError("unsupported wire type %d" % wt)
        yield field, wt, val


def device_assignment(module_pb):
    """(replica_count, computation_count) from a bare HloModuleProto's
    device_assignment (field 15), or None when it has none."""
    try:
        for fno, wt, val in proto_fields(module_pb):
            if fno == 15 and wt == 2:
                d = {f: v for f, w, v in proto_fields(val) if w == 0}
                return d.get(1, 1), d.get(2, 1)
    except ValueError:
        pass
    return None


def unwrap_module(data):
    """Returns (bare HloModuleProto bytes, "hlo_module" | "hlo_proto").

    An HloProto (dump wrapper) has hlo_module as field 1 and no field 2; a bare
    HloModuleProto always has field 2 (entry_computation_name)."""
    try:
        fields = list(proto_fields(data))
    except ValueError:
        return data, "hlo_module"
    numbers = {f for f, _, _ in fields}
    ones = [v for f, wt, v in fields if f == 1 and wt == 2]
    if 2 not in numbers and len(ones) == 1:
        inner = ones[0]
        try:
            inner_numbers = {f for f, _, _ in proto_fields(inner)}
        except ValueError:
            return data, "hlo_module"
        if 2 in inner_numbers:
            return inner, "hlo_proto"
    return data, "hlo_module"


# --------------------------------------------------------------------------
# worker: imports jax, runs jobs

class Worker:
    def __init__(self, devices):
        import numpy as np
        import ml_dtypes  # noqa: F401  (registers bfloat16 & co with numpy)
        import jax
        from jax._src.lib import xla_client as xc
        from jaxlib import _hlo, _jax

        self.np = np
        self.jax = jax
        self.xc = xc
        self._hlo = _hlo
        self._jax = _jax
        self.devices = sorted(jax.devices("cpu"), key=lambda d: d.id)
        if len(self.devices) < devices:
            raise RuntimeError("asked for %d CPU devices, jax has %d (XLA_FLAGS=%r)"
                               % (devices, len(self.devices), os.environ.get("XLA_FLAGS")))
        self.client = self.devices[0].client
        # Executables by (module bytes, counts, debug options): a batch that
        # runs one module on several inputs compiles it once. Jobs that ask
        # for the optimized text always compile.
        self.executables = {}

    # -- helpers
    def np_dtype(self, name):
        import ml_dtypes
        key = DTYPES.get(name, name)
        if hasattr(ml_dtypes, key) and key in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            return self.np.dtype(getattr(ml_dtypes, key))
        return self.np.dtype(key)

    def hlo_dtype(self, dt):
        name = self.np.dtype(dt).name
        return NP_TO_HLO.get(name, name)

    def print_options(self):
        opts = self._hlo.HloPrintOptions()
        opts.print_large_constants = True
        return opts

    def read_module(self, path):
        with open(path, "rb") as f:
            data = f.read()
        return unwrap_module(data)

    def compile(self, job, res):
        np, xc = self.np, self.xc
        pb, kind = self.read_module(job["module"])
        res["input_kind"] = kind
        da = device_assignment(pb)
        nparts = job.get("num_partitions")
        nreps = job.get("num_replicas")
        nparts = int(nparts) if nparts is not None else (da[1] if da else 1)
        nreps = int(nreps) if nreps is not None else (da[0] if da else 1)
        res["num_partitions"], res["num_replicas"] = nparts, nreps
        ndev = nparts * nreps
        if nparts < 1 or nreps < 1:
            raise ValueError("num_partitions and num_replicas must be >= 1")
        if ndev > len(self.devices):
            raise ValueError("job needs %d devices, the tool has %d (use --devices)"
                             % (ndev, len(self.devices)))
        out = job.get("optimized_text_out")
        key = (pb, nparts, nreps, json.dumps(job.get("debug_options") or {}, sort_keys=True))
        if not out and key in self.executables:
            res["compile_s"] = 0.0
            res["compile_cpu_s"] = 0.0
            res["compile_cached"] = True
            return self.executables[key], self.devices[:ndev]
        t0, c0 = time.perf_counter(), time.process_time()
        comp = xc.XlaComputation(pb)
        mlir_module = self._jax.mlir.xla_computation_to_mlir_module(comp)
        opts = xc.CompileOptions()
        opts.num_replicas = nreps
        opts.num_partitions = nparts
        opts.device_assignment = xc.DeviceAssignment.create(
            np.arange(ndev).reshape(nreps, nparts))
        ebo = opts.executable_build_options
        if nparts > 1:
            ebo.use_spmd_partitioning = True
            ebo.debug_options.xla_disable_hlo_passes = DISABLED_PASSES_FOR_PARTITIONED
        for k, v in (job.get("debug_options") or {}).items():
            setattr(ebo.debug_options, k, v)
        devs = self.devices[:ndev]
        exe = self.client.compile_and_load(
            mlir_module, executable_devices=xc.DeviceList(tuple(devs)),
            compile_options=opts)
        res["compile_s"] = round(time.perf_counter() - t0, 4)
        res["compile_cpu_s"] = round(time.process_time() - c0, 4)
        if not out and job.get("kind") == "run":
            self.executables[key] = exe
        if out:
            mods = exe.hlo_modules()
            text = "\n".join(m.to_string(self.print_options()) for m in mods)
            with open(out, "w") as f:
                f.write(text)
            res["optimized_text_out"] = out
            res["optimized_modules"] = len(mods)
        return exe, devs

    # -- job kinds
    def job_text_to_proto(self, job, res):
        with open(job["text"]) as f:
            text = f.read()
        pb = self._hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()
        with open(job["out"], "wb") as f:
            f.write(pb)
        res["bytes"] = len(pb)

    def job_proto_to_text(self, job, res):
        pb, kind = self.read_module(job["module"])
        res["input_kind"] = kind
        mod = self._hlo.HloModule.from_serialized_hlo_module_proto(pb)
        text = mod.to_string(self.print_options())
        with open(job["out"], "w") as f:
            f.write(text)
        res["chars"] = len(text)

    def job_compile(self, job, res):
        self.compile(job, res)

    def job_run(self, job, res):
        np, jax = self.np, self.jax
        inputs = job["inputs"]
        exe, devs = self.compile(job, res)
        ndev = len(devs)
        if len(inputs) != ndev:
            raise ValueError("inputs has %d device entries, the job runs on %d devices"
                             % (len(inputs), ndev))
        nparams = len(inputs[0])
        if any(len(d) != nparams for d in inputs):
            raise ValueError("every device needs the same number of parameters")
        mesh = jax.sharding.Mesh(np.array(devs), ("d",))
        repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        args = []
        for p in range(nparams):
            shards = []
            shape0 = None
            for d in range(ndev):
                spec = inputs[d][p]
                dt = self.np_dtype(spec["dtype"])
                shape = tuple(int(s) for s in spec["shape"])
                raw = np.fromfile(spec["path"], dtype=np.uint8)
                want = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
                if raw.size != want:
                    raise ValueError("%s: %d bytes, %s%s needs %d"
                                     % (spec["path"], raw.size, spec["dtype"], list(shape), want))
                arr = raw.view(dt).reshape(shape)
                if shape0 is None:
                    shape0 = (shape, dt)
                elif (shape, dt) != shape0:
                    raise ValueError("parameter %d: devices disagree on shape/dtype" % p)
                shards.append(jax.device_put(arr, devs[d]))
            # Per-device data under a "replicated" sharding: every shard has the
            # parameter's full (per-device) shape; the data may differ.
            args.append(jax.make_array_from_single_device_arrays(shape0[0], repl, shards))
        t0 = time.perf_counter()
        out = exe.execute_sharded(args)
        per_output = out.disassemble_into_single_device_arrays()
        host = [[np.asarray(a) for a in outs] for outs in per_output]
        res["run_s"] = round(time.perf_counter() - t0, 4)
        odir = job["outputs_dir"]
        os.makedirs(odir, exist_ok=True)
        outputs = []
        for k, outs in enumerate(host):
            if len(outs) != ndev:
                raise RuntimeError("output %d has %d shards, expected %d" % (k, len(outs), ndev))
            for d, a in enumerate(outs):
                with open(os.path.join(odir, "dev%d_out%d.bin" % (d, k)), "wb") as f:
                    f.write(np.ascontiguousarray(a).tobytes())
            first = outs[0]
            outputs.append({
                "dtype": self.hlo_dtype(first.dtype),
                "shape": list(first.shape),
                "identical_across_devices": all(
                    a.shape == first.shape and a.tobytes() == first.tobytes() for a in outs),
            })
        res["outputs"] = outputs
        res["num_devices"] = ndev

    def run_job(self, job):
        res = {"ok": False}
        t0 = time.perf_counter()
        try:
            if not isinstance(job, dict):
                raise ValueError("a job must be a JSON object")
            kind = job.get("kind")
            fn = getattr(self, "job_%s" % kind, None) if isinstance(kind, str) else None
            if fn is None:
                raise ValueError("unknown job kind %r (text_to_proto, proto_to_text, compile, run)"
                                 % (kind,))
            res["kind"] = kind
            fn(job, res)
            res["ok"] = True
        except Exception as e:  # noqa: BLE001 -- every job error becomes a result
            res["ok"] = False
            res["error"] = "%s: %s" % (type(e).__name__, e)
            res["traceback"] = traceback.format_exc()
        res["total_s"] = round(time.perf_counter() - t0, 4)
        return res


def worker_main(jobs_path, progress_path, start, devices):
    with open(jobs_path) as f:
        jobs = json.load(f)
    prog = open(progress_path, "a")

    def emit(obj):
        prog.write(json.dumps(obj) + "\n")
        prog.flush()

    t0 = time.perf_counter()
    try:
        w = Worker(devices)
    except Exception as e:  # noqa: BLE001
        emit({"fatal": "worker start-up failed: %s: %s\n%s"
              % (type(e).__name__, e, traceback.format_exc())})
        return 3
    emit({"ready": round(time.perf_counter() - t0, 3)})
    for i in range(start, len(jobs)):
        emit({"start": i})
        emit({"index": i, "result": w.run_job(jobs[i])})
    return 0


# --------------------------------------------------------------------------
# supervisor: no jax import; spawns workers and collects results

def set_xla_env(env, devices):
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    flags.append("--xla_force_host_platform_device_count=%d" % devices)
    env["XLA_FLAGS"] = " ".join(flags)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    return env


def _tail(path, n=4000):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def run_batch(jobs, devices, log=sys.stderr):
    """Runs jobs (list) in worker subprocesses; returns the list of results."""
    n = len(jobs)
    results = [None] * n
    tmp = tempfile.mkdtemp(prefix="xla_tool_")
    jobs_path = os.path.join(tmp, "jobs.json")
    with open(jobs_path, "w") as f:
        json.dump(jobs, f)
    env = set_xla_env(dict(os.environ), devices)
    nxt = 0
    attempt = 0
    while nxt < n:
        attempt += 1
        prog_path = os.path.join(tmp, "progress%d.jsonl" % attempt)
        err_path = os.path.join(tmp, "stderr%d.txt" % attempt)
        open(prog_path, "w").close()
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", jobs_path, prog_path,
                 "--start", str(nxt), "--devices", str(devices)],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)
        current = None
        started_at = None
        consumed = 0
        fatal = None
        timed_out = False
        while True:
            rc = proc.poll()
            with open(prog_path) as f:
                lines = f.read().split("\n")
            complete = lines[:-1]  # last element is a partial line or ""
            for line in complete[consumed:]:
                msg = json.loads(line)
                if "start" in msg:
                    current, started_at = msg["start"], time.monotonic()
                elif "index" in msg:
                    results[msg["index"]] = msg["result"]
                    nxt = msg["index"] + 1
                    current = None
                elif "fatal" in msg:
                    fatal = msg["fatal"]
            consumed = len(complete)
            if rc is not None:
                break
            if current is not None:
                job = jobs[current] if isinstance(jobs[current], dict) else {}
                limit = float(job.get("timeout_s", DEFAULT_TIMEOUT_S))
                if time.monotonic() - started_at > limit:
                    timed_out = True
                    proc.kill()
                    proc.wait()
                    rc = proc.returncode
                    break
            time.sleep(0.02)
        if nxt >= n:
            break
        # The worker stopped before finishing the batch.
        if fatal is not None:
            for i in range(nxt, n):
                results[i] = {"ok": False, "error": fatal}
            break
        i = current if current is not None else nxt
        kind = jobs[i].get("kind") if isinstance(jobs[i], dict) else None
        if timed_out:
            why = "timed out after %ss (killed)" % jobs[i].get("timeout_s", DEFAULT_TIMEOUT_S)
        elif rc < 0:
            try:
                why = "died with signal %s" % signal.Signals(-rc).name
            except ValueError:
                why = "died with signal %d" % -rc
        else:
            why = "exited with code %d" % rc
        results[i] = {
            "ok": False, "kind": kind, "crashed": True,
            "error": "xla_tool worker %s while running job #%d (%s); stderr tail:\n%s"
                     % (why, i, kind, _tail(err_path)),
        }
        print("xla_tool: job #%d (%s): worker %s; continuing with a fresh worker"
              % (i, kind, why), file=log)
        nxt = i + 1
    for i in range(n):
        if results[i] is None:
            results[i] = {"ok": False, "error": "internal: no result recorded for this job"}
    shutil.rmtree(tmp, ignore_errors=True)
    return results


def self_test(devices):
    import struct
    if not os.path.exists(SELF_TEST_FIXTURE):
        print("self-test: missing %s (run tests/fixtures/generate.py)" % SELF_TEST_FIXTURE,
              file=sys.stderr)
        return 1
    # psum_bf16_p8: one parameter bf16[8,128] per device; psum over 8 devices.
    shape = [8, 128]
    ndev = 8
    tmp = tempfile.mkdtemp(prefix="xla_tool_selftest_")
    one_bf16 = struct.pack("<H", 0x3F80)  # 1.0
    path = os.path.join(tmp, "ones.bin")
    with open(path, "wb") as f:
        f.write(one_bf16 * (shape[0] * shape[1]))
    jobs = [{
        "kind": "run", "module": SELF_TEST_FIXTURE, "num_partitions": ndev, "num_replicas": 1,
        "inputs": [[{"path": path, "dtype": "bf16", "shape": shape}] for _ in range(ndev)],
        "outputs_dir": os.path.join(tmp, "out"),
    }]
    res = run_batch(jobs, max(devices, ndev))[0]
    if not res.get("ok"):
        print("self-test FAILED: %s" % res.get("error"), file=sys.stderr)
        return 1
    eight = struct.pack("<H", 0x4100)  # bf16 8.0
    for d in range(ndev):
        with open(os.path.join(tmp, "out", "dev%d_out0.bin" % d), "rb") as f:
            data = f.read()
        if data != eight * (shape[0] * shape[1]):
            print("self-test FAILED: device %d result is not all 8.0" % d, file=sys.stderr)
            return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print("self-test OK: psum of ones over 8 devices = 8 (compile %.3fs, run %.3fs)"
          % (res.get("compile_s", -1), res.get("run_s", -1)))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("jobs", nargs="?", help="JOBS.json (list of jobs)")
    ap.add_argument("results", nargs="?", help="RESULTS.json (written)")
    ap.add_argument("--devices", type=int, default=8,
                    help="number of virtual CPU devices (default 8)")
    ap.add_argument("--self-test", action="store_true",
                    help="run psum_bf16_p8 with ones and check the sum is 8")
    ap.add_argument("--worker", nargs=2, metavar=("JOBS", "PROGRESS"), help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker_main(a.worker[0], a.worker[1], a.start, a.devices)
    if a.self_test:
        return self_test(a.devices)
    if not a.jobs or not a.results:
        ap.error("JOBS.json and RESULTS.json are required (or --self-test)")
    try:
        with open(a.jobs) as f:
            jobs = json.load(f)
        if not isinstance(jobs, list):
            raise ValueError("JOBS.json must hold a JSON list")
    except Exception as e:  # noqa: BLE001
        with open(a.results, "w") as f:
            json.dump([], f)
        print("xla_tool: cannot read %s: %s" % (a.jobs, e), file=sys.stderr)
        return 2
    results = run_batch(jobs, a.devices)
    tmp_out = a.results + ".tmp"
    with open(tmp_out, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp_out, a.results)
    bad = sum(1 for r in results if not r.get("ok"))
    print("xla_tool: %d jobs, %d ok, %d failed" % (len(results), len(results) - bad, bad),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
