"""How equarx gets into the compile: the JAX door or an external command.

The JAX door is used exactly as a user would::

    import equarx.jax
    equarx.jax.enable(platforms=("cpu",), types=("bf16", "f32"), **options)
    jax.jit(f).lower(...).compile()
    equarx.jax.last_report()

(XLA:CPU promotes bf16 all-reduces to f32 before the pre-scheduler stage,
hence ``types=("bf16", "f32")``.)

A plan with ``door=before-xla`` (every plan, with ``--before-xla``) goes
through the door before XLA instead: each lowered TP forward is rewritten
with ``equarx.jax.rewrite_lowered(lowered, topology=..., **plan)`` and that
is compiled, what a ``shard_map`` program gets on XLA:TPU, where the pass
emits before libtpu's fusion. With ``platform=tpu`` in the plan, XLA:CPU
runs XLA:TPU's HLO emission (``kernels=hlo`` unless the plan says: the twin
of the Mosaic kernels the pass writes there by default), numbers and all.

The CLI door, ``--rewrite-cmd CMD``, registers a transform of its own with
``jax.extend.xla.register_hlo_module_transformation`` that pipes each
serialized ``HloModuleProto`` through ``CMD`` (a shell command reading the
module on stdin and writing the new one on stdout, e.g.
``target/release/equarx rewrite - -o - --types bf16,f32``) and returns its
stdout. The harness appends the plan's options as flags (``--topology v5e
--quant-format int4 ...``) and ``--report-json FILE``, from which the report
is read.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
import threading

import jax

# A plan: equarx's options as JSON keys ("algorithm": "ring", ...).
Plan = dict


def parse_plan(text: str) -> Plan:
    """``'defaults'`` or ``'algorithm=ring,rotation=none'`` → options.
    Values stay strings except integers (``block_size=32``,
    ``min_payload=0``); equarx judges names and values."""
    text = text.strip()
    if text in ("", "defaults", "default"):
        return {}
    plan = {}
    for item in text.split(","):
        if "=" not in item:
            raise ValueError(f"plan item {item!r} is not NAME=VALUE (plan {text!r})")
        k, v = (s.strip() for s in item.split("=", 1))
        k = k.replace("-", "_")
        plan[k] = int(v) if v.isdigit() else v
    return plan


def plan_label(plan: Plan) -> str:
    return ",".join(f"{k}={v}" for k, v in plan.items()) or "defaults"


class Door:
    """Turns equarx on (for one topology and plan) or off around compiles."""

    name = "door"

    def plain(self) -> None:
        raise NotImplementedError

    def enable(self, topology: str, plan: Plan) -> None:
        raise NotImplementedError

    def report(self) -> list[dict] | None:
        raise NotImplementedError

    def lowered(self, lowered):
        """What is compiled of ``lowered``: itself, but for the door
        before XLA."""
        return lowered


class JaxDoor(Door):
    """``equarx.jax.enable`` / ``disable`` / ``last_report``, or, for a
    plan with ``door=before-xla``, ``equarx.jax.rewrite_lowered`` on the
    lowered program with nothing registered."""

    name = "jax"

    def __init__(self):
        import equarx.jax as ej  # needs PYTHONPATH=python and EQUARX_LIB
        self.ej = ej
        self.before_xla = None  # the options of the door before XLA, when a plan takes it

    def plain(self) -> None:
        self.before_xla = None
        self.ej.disable()
        jax.clear_caches()

    def enable(self, topology: str, plan: Plan) -> None:
        plan = dict(plan)
        door = plan.pop("door", "hook")
        if door not in ("hook", "before-xla"):
            raise ValueError(f"plan door={door!r}: 'hook' or 'before-xla'")
        self.plain()
        if door == "before-xla":
            # XLA:CPU runs the HLO emission: on XLA:TPU the pass's default
            # is its Mosaic kernels where they take an op, which only libtpu
            # compiles (the HLO emission is their twin, bit for bit).
            self.before_xla = dict({"kernels": "hlo"}, topology=topology, **plan)
        else:
            self.ej.enable(platforms=("cpu",), types=("bf16", "f32"), topology=topology, **plan)

    def lowered(self, lowered):
        if self.before_xla is None:
            return lowered
        return self.ej.rewrite_lowered(lowered, **self.before_xla)

    def report(self):
        return self.ej.last_report()

    def library(self) -> str:
        from equarx import _native
        return f"{_native._load()._name} (equarx {_native.version()})"


def plan_flags(topology: str, plan: Plan) -> list[str]:
    flags = ["--topology", topology]
    for k, v in plan.items():
        flags += ["--" + k.replace("_", "-"), str(v)]
    return flags


class CommandDoor(Door):
    """A transform that pipes every module through an external command."""

    name = "cmd"
    _registration = "equarx-model-rewrite-cmd"

    def __init__(self, command: str):
        from jax.extend import xla as jxla
        self.jxla = jxla
        self.command = command
        self.active: list[str] | None = None
        self._report: list[dict] | None = None
        self._lock = threading.Lock()
        self._registered = False
        self._dir = tempfile.mkdtemp(prefix="equarx-model-cmd-")

    def _callback(self, module: bytes) -> bytes | None:
        argv = self.active
        if argv is None:
            return None
        report = os.path.join(self._dir, "report.json")
        if os.path.exists(report):
            os.remove(report)
        cmd = shlex.split(self.command) + argv + ["--report-json", report]
        out = subprocess.run(cmd, input=module, capture_output=True)
        if out.returncode != 0:
            raise RuntimeError(f"--rewrite-cmd failed ({out.returncode}): {shlex.join(cmd)}\n"
                               f"{out.stderr.decode(errors='replace')[-3000:]}")
        if os.path.exists(report):
            with open(report) as f:
                r = json.load(f)
            if r:  # modules without all-reduces keep the last report
                with self._lock:
                    self._report = r
        return out.stdout

    def _register(self) -> None:
        if not self._registered:
            self.jxla.register_hlo_module_transformation(
                self._callback, name=self._registration,
                stage=self.jxla.PipelineStage.PRE_SCHEDULER, platforms="cpu")
            self._registered = True

    def plain(self) -> None:
        self.active = None
        jax.clear_caches()

    def enable(self, topology: str, plan: Plan) -> None:
        self._register()
        self.active = plan_flags(topology, plan)
        with self._lock:
            self._report = None
        # The transform is not part of JAX's cache key: compile afresh.
        jax.clear_caches()

    def report(self):
        with self._lock:
            return None if self._report is None else list(self._report)


def summarize(report: list[dict] | None) -> dict:
    """What a report says was chosen, over all its all-reduces: how many
    were rewritten, the plans (algorithm, rotation, format, block) with
    their counts, the reasons for the others, the predicted error."""
    ops = [r for r in (report or []) if r.get("opcode", "all-reduce") == "all-reduce"]
    rewritten = [r for r in ops if r.get("rewritten")]
    plans: dict[str, int] = {}
    for r in rewritten:
        c = (r.get("plan") or {}).get("config") or {}
        key = "{}/{}/{}/b{}".format(c.get("algorithm"), c.get("rotation"), c.get("format"),
                                    c.get("block"))
        plans[key] = plans.get(key, 0) + 1
    reasons: dict[str, int] = {}
    for r in ops:
        if not r.get("rewritten"):
            reasons[str(r.get("reason"))] = reasons.get(str(r.get("reason")), 0) + 1
    errs = [r["predicted_rel_rms"] for r in rewritten if r.get("predicted_rel_rms") is not None]
    speed = [r["predicted_time"]["speedup"] for r in rewritten
             if (r.get("predicted_time") or {}).get("speedup") is not None]
    return {
        "ops": len(ops),
        "rewritten": len(rewritten),
        "plans": plans,
        "skipped_reasons": reasons,
        "predicted_rel_rms_max": max(errs) if errs else None,
        "predicted_rel_rms_mean": sum(errs) / len(errs) if errs else None,
        "predicted_speedup_mean": sum(speed) / len(speed) if speed else None,
        "payload_bytes": sorted({r.get("payload_bytes") for r in ops} - {None}),
    }
