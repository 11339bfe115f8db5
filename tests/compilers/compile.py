"""Compiles HLO modules in the real XLA:TPU (libtpu) or XLA:GPU (the CUDA
plugin), deviceless, with equarx registered at the compiler's pre-scheduler
hook through its native PJRT callback; or, for a JAX program, rewritten
before XLA by `equarx.jax.rewrite_lowered`.

    python compile.py JOBS.json RESULTS.json

runs in the venv `scripts/pyenv compilers` makes. Every job of one batch uses
one compiler and topology (equarx registers once per process and cannot be
unregistered; the options change per job through `equarx_pjrt_configure`):

    {"platform": "tpu" | "gpu", "topology": "v5e:2x2" | "h100x4" | ...,
     "library": "/path/libequarx.so",
     "jobs": [{"name": ..., "module": "case.hlo" (HLO text) | "m.pb",
               "replicas": R, "partitions": P, "door": "hook", "options": {...}}
              | {"name": ..., "program": "psum" | "all_gather" | "reduce_scatter", "devices": N,
                 "rows": R, "cols": C,
                 "door": "hook" | "before", "options": {...}}]}

The result per job (JSON lines, one per job, flushed as each ends):

    {"name", "ok", "error" (the compiler's message), "compile_s", "compile_cpu_s",
     "report" (equarx's per-op report at that door), "fusions", "kernels",
     "entry_fusions", "collectives": [[opcode, operand types]],
     "wire_types" (element types every collective carries), "temp_bytes",
     "generated_code_bytes", "flops", "bytes_accessed"}

A job that aborts the process (a compiler CHECK) ends the batch; the driver
(tests/compilers.rs) sees the missing results and names the job that was
running, from the progress line written before each job starts.
"""

import ctypes
import json
import os
import re
import sys
import time

os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Deviceless compiles touch no TPU, so several processes may hold libtpu at
# once (the suite's batches run in parallel); without this, every process but
# one fails on libtpu's lockfile in /tmp.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
DISABLED_PASSES_FOR_PARTITIONED = "sharding-propagation,spmd-partitioning,shardy-xla"
COLLECTIVES = ("all-reduce", "all-reduce-start", "reduce-scatter", "all-gather",
               "all-gather-start", "all-to-all", "all-to-all-start", "collective-permute",
               "collective-permute-start", "ragged-all-to-all", "reduce-scatter-start")


def topology(platform, name):
    """The compile-only devices of a topology: a TPU name (`v5e:2x2`), or
    `h100xN` for N H100s of one host (the checked-in target config)."""
    from jax.experimental import topologies
    if platform == "tpu":
        return topologies.get_topology_desc(topology_name=name, platform="tpu")
    m = re.fullmatch(r"h100x(\d+)", name)
    if not m:
        raise ValueError("a GPU topology is h100xN, not %r" % name)
    with open(os.path.join(HERE, "h100.txtpb")) as f:
        config = f.read()
    return topologies.get_topology_desc(
        topology_name="h100", platform="cuda", topology="1x1x%s" % m.group(1),
        target_config=config)


def plugin_path(platform):
    if platform == "tpu":
        import libtpu
        return os.path.join(os.path.dirname(libtpu.__file__), "libtpu.so")
    import jax_plugins.xla_cuda12 as plugin
    return os.path.join(os.path.dirname(plugin.__file__), "xla_cuda_plugin.so")


class Equarx:
    """libequarx's native PJRT door: registered once, configured per job."""

    def __init__(self, library, platform):
        self.lib = ctypes.CDLL(library)
        for fn in ("equarx_pjrt_register", "equarx_pjrt_configure", "equarx_pjrt_last_report"):
            getattr(self.lib, fn).restype = ctypes.c_int
        self.lib.equarx_free_string.argtypes = [ctypes.c_void_p]
        self.lib.equarx_free_string.restype = None
        self.platform = platform
        self.registered = False

    def _check(self, status, err):
        if status != 0:
            msg = ctypes.string_at(err.value).decode() if err.value else "status %d" % status
            if err.value:
                self.lib.equarx_free_string(err)
            raise RuntimeError("equarx: " + msg)

    def configure(self, options):
        # Registration goes through the plugin's PJRT_Api, the one the
        # compile-only client loaded (dlopen returns the same library).
        opts = json.dumps(options).encode()
        err = ctypes.c_void_p()
        if not self.registered:
            plugin = ctypes.CDLL(plugin_path(self.platform))
            plugin.GetPjrtApi.restype = ctypes.c_void_p
            api = plugin.GetPjrtApi()
            status = self.lib.equarx_pjrt_register(
                ctypes.c_void_p(api), b"equarx-quantize-collectives", 0, opts, ctypes.byref(err))
            self._check(status, err)
            self.registered = True
        else:
            self._check(self.lib.equarx_pjrt_configure(opts, ctypes.byref(err)), err)

    def last_report(self):
        out, err = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(self.lib.equarx_pjrt_last_report(ctypes.byref(out), ctypes.byref(err)), err)
        if not out.value:
            return None
        text = ctypes.string_at(out.value).decode()
        self.lib.equarx_free_string(out)
        return json.loads(text)


def parse_instruction(line):
    """(name, shape, opcode, rest) of one instruction line of HLO text, or
    None; a tuple shape may hold spaces."""
    m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ", line)
    if not m:
        return None
    rest = line[m.end():]
    if rest.startswith("("):
        depth = 0
        for k, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                break
        shape, rest = rest[:k + 1], rest[k + 1:].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    op = re.match(r"([\w\-]+)\((.*)", rest)
    if not op:
        return None
    return m.group(1), shape, op.group(1), op.group(2)


def collectives_of(text):
    """[opcode, [operand element types]] for every collective in compiled
    text, and the number of fusion instructions (all, and in the entry)."""
    shapes = {}
    found = []
    fusions = entry_fusions = 0
    in_entry = False
    for line in text.splitlines():
        if line.startswith("ENTRY "):
            in_entry = True
        elif line.startswith("}"):
            in_entry = False
        parsed = parse_instruction(line)
        if not parsed:
            continue
        name, shape, opcode, rest = parsed
        shapes[name] = shape
        if opcode == "fusion":
            fusions += 1
            entry_fusions += in_entry
        if opcode in COLLECTIVES:
            args = re.findall(r"%([\w.\-]+)", rest.split(")")[0])
            types = sorted({re.match(r"\(?([a-z0-9]+)", shapes[a]).group(1)
                            for a in args if a in shapes})
            found.append([opcode, types])
    return found, fusions, entry_fusions


class Compiler:
    def __init__(self, platform, topo_name):
        import numpy as np
        import jax  # noqa: F401
        from jax._src.lib import xla_client as xc
        from jax._src.interpreters import mlir as jmlir
        from jax._src.lib.mlir import ir
        from jaxlib import _hlo, _jax
        self.np, self.xc, self.jmlir, self.ir, self._hlo, self._jax = np, xc, jmlir, ir, _hlo, _jax
        self.platform = platform
        self.devices = sorted(topology(platform, topo_name).devices, key=lambda d: d.id)
        self.client = self.devices[0].client

    def proto(self, path):
        with open(path, "rb") as f:
            data = f.read()
        if path.endswith(".pb"):
            return data
        text = data.decode()
        # StableHLO has no `copy`: a copy in the *input* (JAX's partitioned
        # modules have them) becomes the identity bitcast-convert, which
        # XLA folds. equarx's own emission never needs this.
        text = re.sub(r"\bcopy\(", "bitcast-convert(", text)
        return self._hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()

    def compile(self, pb, replicas, partitions):
        np, xc = self.np, self.xc
        n = replicas * partitions
        if n > len(self.devices):
            raise ValueError("the module needs %d devices, the topology has %d" % (n, len(self.devices)))
        devs = self.devices[:n]
        mlir = self._jax.mlir.xla_computation_to_mlir_module(xc.XlaComputation(pb))
        opts = xc.CompileOptions()
        opts.num_replicas = replicas
        opts.num_partitions = partitions
        opts.device_assignment = xc.DeviceAssignment.create(
            np.array([d.id for d in devs]).reshape(replicas, partitions))
        ebo = opts.executable_build_options
        if os.environ.get("EQUARX_COMPILERS_DUMP"):
            ebo.debug_options.xla_dump_to = os.environ["EQUARX_COMPILERS_DUMP"]
            ebo.debug_options.xla_dump_hlo_pass_re = ".*"
        if partitions > 1:
            ebo.use_spmd_partitioning = True
            ebo.debug_options.xla_disable_hlo_passes = DISABLED_PASSES_FOR_PARTITIONED
        with self.jmlir.make_ir_context():
            module = self.ir.Module.parse(mlir)
            t0, c0 = time.perf_counter(), time.process_time()
            exe = self.client.compile(module, executable_devices=xc.DeviceList(tuple(devs)),
                                      compile_options=opts)
            return exe, time.perf_counter() - t0, time.process_time() - c0


def compile_program(compiler, equarx_hook, job):
    """A `shard_map` psum of `rows x cols` per device (bf16) over the
    topology's first `devices` devices (program `all_gather` or
    `reduce_scatter`: those rows all-gathered or reduce-scattered along
    their rows), lowered by JAX; with door `before`,
    rewritten by `equarx.jax.rewrite_lowered` with the job's options,
    through the hook (`equarx_hook`, configured) otherwise. Returns the
    executable, compile wall and CPU seconds, and the door's report."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import numpy as np
    import equarx.jax
    n = job["devices"]
    mesh = Mesh(np.array(compiler.devices[:n]), ("x",))
    if job["program"] == "all_gather":
        # Every rank holds the gathered rows; shard_map cannot infer that.
        f = jax.shard_map(lambda a: jax.lax.all_gather(a, "x", tiled=True), mesh=mesh,
                          in_specs=P("x"), out_specs=P(), check_vma=False)
    elif job["program"] == "reduce_scatter":
        f = jax.shard_map(lambda a: jax.lax.psum_scatter(a, "x", tiled=True), mesh=mesh,
                          in_specs=P("x"), out_specs=P("x"))
    else:
        f = jax.shard_map(lambda a: jax.lax.psum(a, "x"), mesh=mesh, in_specs=P("x"),
                          out_specs=P())
    f = jax.jit(f)
    arg = jax.ShapeDtypeStruct((n * job["rows"], job["cols"]), jnp.bfloat16,
                               sharding=NamedSharding(mesh, P("x")))
    lowered = f.lower(arg)
    report = None
    if job.get("door") == "before":
        lowered = equarx.jax.rewrite_lowered(lowered, **(job.get("options") or {}))
        report = equarx.jax.last_report()
    t0, c0 = time.perf_counter(), time.process_time()
    compiled = lowered.compile()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if report is None:
        report = equarx_hook.last_report()
    return compiled.runtime_executable(), wall, cpu, report


def main(argv):
    with open(argv[1]) as f:
        batch = json.load(f)
    out = open(argv[2], "a", buffering=1)
    progress = argv[2] + ".running"
    compiler = Compiler(batch["platform"], batch["topology"])
    equarx = Equarx(batch["library"], batch["platform"])
    for job in batch["jobs"]:
        with open(progress, "w") as p:
            p.write(job["name"])
        res = {"name": job["name"], "ok": False}
        try:
            door = job.get("door", "hook")
            # The hook stays registered in every job: disabled unless the
            # job goes through it.
            equarx.configure((job.get("options") or {}) if door == "hook"
                             else {"disabled_passes": ["quantize-collectives"]})
            if "program" in job:
                exe, wall, cpu, res["report"] = compile_program(compiler, equarx, job)
                finish(exe, wall, cpu, job, res)
                out.write(json.dumps(res) + "\n")
                continue
            # A case file goes through the hook: the door before XLA takes
            # a JAX program (`compile_program`), not a module.
            pb = compiler.proto(job["module"])
            exe, wall, cpu = compiler.compile(pb, job["replicas"], job["partitions"])
            res["report"] = equarx.last_report()
            finish(exe, wall, cpu, job, res)
        except Exception as e:  # the compiler's error, quoted whole
            res["error"] = "%s: %s" % (type(e).__name__, e)
        out.write(json.dumps(res) + "\n")
    if os.path.exists(progress):
        os.unlink(progress)
    return 0


# Instructions that run no kernel of their own: views, plumbing, control
# flow (whose bodies are counted), and the collectives themselves.
NOT_KERNELS = ("parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while",
               "conditional", "call", "after-all", "opt-barrier", "partition-id", "replica-id",
               "all-reduce-done", "all-gather-done", "collective-permute-done",
               "all-to-all-done", "reduce-scatter-done", "copy-start", "copy-done",
               "send", "send-done", "recv", "recv-done") + COLLECTIVES


def kernels_by_computation(text):
    """The kernels of compiled text per computation: every instruction
    outside fusion bodies and reducers (a fusion is one kernel, so is an op
    left unfused) that is neither a view, plumbing, control flow nor a
    collective."""
    inner = set(re.findall(r"(?:calls|to_apply)=%([\w.\-]+)", text))
    counts = {}
    computation = None
    for line in text.splitlines():
        head = re.match(r"(?:ENTRY )?%([\w.\-]+) ", line)
        if head and line.rstrip().endswith("{"):
            computation = head.group(1)
            continue
        parsed = parse_instruction(line)
        if parsed and computation not in inner and parsed[2] not in NOT_KERNELS:
            counts[computation] = counts.get(computation, 0) + 1
    return counts


def kernels_of(text):
    """The kernels of compiled text, every computation's together."""
    return sum(kernels_by_computation(text).values())


def loop_kernels_of(text):
    """The kernels of compiled text inside `while` loops (their bodies and
    conditions): each runs once per iteration, not once per program."""
    loops = set(re.findall(r"(?:body|condition)=%([\w.\-]+)", text))
    return sum(n for c, n in kernels_by_computation(text).items() if c in loops)


def finish(exe, wall, cpu, job, res):
    """What the compiler made: its collectives' wire types, fusions,
    memory, cost and compile time."""
    text = "\n".join(m.to_string() for m in exe.hlo_modules())
    res["collectives"], res["fusions"], res["entry_fusions"] = collectives_of(text)
    res["kernels"] = kernels_of(text)
    res["wire_types"] = sorted({t for _, ts in res["collectives"] for t in ts})
    mem = exe.get_compiled_memory_stats()
    res["temp_bytes"] = mem.temp_size_in_bytes
    res["generated_code_bytes"] = mem.generated_code_size_in_bytes
    try:
        cost = exe.cost_analysis() or {}
    except Exception:  # XLA:GPU's compile-only executable has none
        cost = {}
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    res["flops"] = cost.get("flops")
    res["bytes_accessed"] = cost.get("bytes accessed")
    res["compile_s"], res["compile_cpu_s"] = round(wall, 4), round(cpu, 4)
    if job.get("text_out"):
        with open(job["text_out"], "w") as f:
            f.write(text)
    res["ok"] = True


if __name__ == "__main__":
    sys.exit(main(sys.argv))
