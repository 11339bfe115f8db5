"""Calibration: run a JAX program once, with exact collectives, and record
what equarx's error model needs of every collective's inputs.

    import equarx.jax
    equarx.jax.calibrate(forward, params, tokens, path="gemma.profile.json")
    equarx.jax.enable(platforms=("cpu",), types=("bf16", "f32"),
                      profile="gemma.profile.json")

How (:func:`calibrate`):

1. ``fn`` is compiled as written, with equarx's stage holding a callback
   that asks equarx for the module's collectives (``equarx.sites``): each
   one's profile key (as the pass will compute it), groups and payload.
2. ``fn`` is traced again with JAX's collective primitives (``psum``,
   ``all_gather``, ``psum_scatter``, ``all_to_all``) wrapped: each call
   also hands its operand, and the device's mesh coordinates, to a host
   callback. The traced collectives are paired with the module's by
   collective, source file and line (the frame XLA's metadata names) and
   payload size, in program order; an identity whose count differs
   between the two is left unmeasured rather than guessed.
3. That program runs once on ``args``. For every run of every paired
   collective (a loop body's runs many times), each group's inputs, in
   rank order, are measured by equarx (``equarx.op_stats``), and equarx
   averages them into the profile (``equarx.profile``).

Collectives that cannot be paired (XLA's SPMD partitioner inserted them;
XLA combined several; outside ``shard_map``) are listed in the profile's
``unmeasured`` with the reason, and the pass predicts those with its
prior and says so in its report.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import tempfile
import threading
from typing import Any, Callable

from equarx import _native
from equarx._native import EquarxError

# JAX primitive name -> the HLO collective it lowers to.
_COLLECTIVES = {
    "psum": "all-reduce",
    "psum_invariant": "all-reduce",
    "reduce_scatter": "reduce-scatter",
    "all_gather": "all-gather",
    "all_gather_invariant": "all-gather",
    "all_to_all": "all-to-all",
}

_HERE = os.path.dirname(os.path.abspath(__file__))


def _module_sites(fn, args, platforms, options) -> list[dict[str, Any]]:
    """Step 1: the collectives of ``fn``'s module at equarx's stage."""
    import jax
    from jax.extend import xla as jxla

    seen: list[list[dict[str, Any]]] = []
    errors: list[BaseException] = []

    def capture(module: bytes):
        try:
            found = _native.sites(module, options)
        except BaseException as e:  # reported after the compile
            errors.append(e)
            return None
        if found:
            seen.append(found)
        return None

    name = "equarx-calibrate"
    stage = jxla.PipelineStage.PRE_SCHEDULER
    jxla.register_hlo_module_transformation(capture, name=name, stage=stage, platforms=platforms)
    try:
        jax.clear_caches()
        jax.jit(fn).lower(*args).compile()
    finally:
        jxla.clear_hlo_module_transformation(name, stage=stage, platforms=platforms)
    if errors:
        raise errors[0]
    if not seen:
        raise EquarxError(
            "equarx.jax.calibrate: the compiled program has no collective equarx looks at "
            f"(platforms {list(platforms)}); nothing to calibrate"
        )
    if len(seen) > 1:
        raise EquarxError(
            f"equarx.jax.calibrate: compiling the program gave {len(seen)} modules with "
            "collectives; calibrate one jitted function at a time"
        )
    return seen[0]


class _Recorder:
    """Step 2 and 3: the traced collectives, and what their runs measure."""

    def __init__(self):
        self.lock = threading.Lock()
        self.traced: list[dict[str, Any]] = []
        # traced index -> the module site it is paired with
        self.paired: dict[int, dict[str, Any]] = {}
        # (traced index, run number) -> {device: payload}
        self.pending: dict[tuple[int, int], dict[int, Any]] = {}
        self.runs: dict[tuple[int, int], int] = {}
        self.stats: dict[int, list[dict[str, Any]]] = {}
        self.nonfinite: dict[int, list[int]] = {}
        self.errors: list[BaseException] = []
        self.source = ""

    # -- tracing
    def wrap(self, prim):
        import jax
        from jax._src import debugging
        from jax._src import mesh as mesh_lib
        from jax._src import source_info_util

        bind = prim.bind
        recorder = self

        def traced_bind(*operands, **params):
            mesh = mesh_lib.get_abstract_mesh()
            names = tuple(getattr(mesh, "axis_names", ()) or ())
            if not names:
                # Outside shard_map (pmap, or an unmapped trace): not paired.
                return bind(*operands, **params)
            frame = _user_frame(source_info_util.current().traceback)
            index = len(recorder.traced)
            recorder.traced.append({
                "collective": _COLLECTIVES[prim.name],
                "file": frame[0],
                "line": frame[1],
                "elements": sum(int(_size(o)) for o in operands),
                "axis_sizes": tuple(int(s) for s in mesh.axis_sizes),
            })
            coords = [jax.lax.axis_index(n) for n in names]

            def host(*flat, index=index, k=len(coords)):
                recorder.record(index, flat[:k], flat[k:])

            host._equarx_calibration = True
            debugging.debug_callback_p.bind(
                *coords, *operands, callback=host, effect=debugging.debug_effect,
                partitioned=False,
            )
            return bind(*operands, **params)

        return bind, traced_bind

    # -- running
    def record(self, index: int, coords, values) -> None:
        import numpy as np

        try:
            site = self.paired.get(index)
            if site is None:
                return
            sizes = self.traced[index]["axis_sizes"]
            device = int(np.ravel_multi_index(tuple(int(np.asarray(c)) for c in coords), sizes))
            payload = np.concatenate([np.asarray(v, np.float32).reshape(-1) for v in values])
            with self.lock:
                run = self.runs.get((index, device), 0)
                self.runs[(index, device)] = run + 1
                bucket = self.pending.setdefault((index, run), {})
                bucket[device] = payload
                complete = len(bucket) == int(np.prod(sizes))
                if complete:
                    del self.pending[(index, run)]
            if complete:
                self.measure(index, site, bucket)
        except BaseException as e:  # raised after the run
            with self.lock:
                self.errors.append(e)

    def measure(self, index: int, site: dict[str, Any], by_device: dict[int, Any]) -> None:
        import numpy as np

        groups = site["groups"]["Ok"]
        moved = site["inputs"] == "moved"
        out = []
        bad = 0
        for g in groups["groups"]:
            rows = np.stack([by_device[int(i)] for i in g])
            bad += int(np.size(rows) - np.count_nonzero(np.isfinite(rows)))
            out.append(_native.op_stats(rows, moved=moved, source=self.source))
        total = sum(np.size(v) for v in by_device.values())
        with self.lock:
            self.stats.setdefault(index, []).extend(out)
            n = self.nonfinite.setdefault(index, [0, 0])
            n[0] += bad
            n[1] += int(total)


@contextlib.contextmanager
def _host_values():
    """While it holds, the recorder's callbacks get XLA's host buffers as
    they are. JAX's own callback path first copies them onto CPU device 0,
    which waits for that device, which (in a collective) waits for the
    device whose thread is in the callback: a deadlock with several CPU
    devices."""
    from jax._src import debugging

    prim = debugging.debug_callback_p
    impl = prim.impl

    def direct(*args, callback, **params):
        if getattr(callback, "_equarx_calibration", False):
            callback(*args)
            return ()
        return impl(*args, callback=callback, **params)

    prim.impl = direct
    try:
        yield
    finally:
        prim.impl = impl


def _size(x) -> int:
    import numpy as np

    return int(np.prod(getattr(x, "shape", ()), dtype=np.int64))


def _user_frame(traceback) -> tuple[str, int]:
    """The innermost frame of the user's code: JAX's own frames are left
    out (as in XLA's metadata), and so are this package's."""
    from jax._src import source_info_util

    for f in source_info_util.user_frames(traceback):
        if not os.path.abspath(f.file_name).startswith(_HERE + os.sep):
            return f.file_name, int(f.start_line)
    return "", 0


def _pair(sites: list[dict[str, Any]], traced: list[dict[str, Any]]):
    """Pairs module sites with traced collectives of the same identity in
    program order; returns ({traced index: site}, [unmeasured entries])."""
    def identity(collective, file, line, elements):
        return (collective, file, int(line), int(elements))

    by_id: dict[tuple, list[int]] = {}
    for i, t in enumerate(traced):
        by_id.setdefault(identity(t["collective"], t["file"], t["line"], t["elements"]), []).append(i)
    site_ids: dict[tuple, list[dict[str, Any]]] = {}
    for s in sites:
        k = s["key"]
        site_ids.setdefault(
            identity(s["collective"], k["source_file"], k["source_line"], s["elements"]), []
        ).append(s)
    paired: dict[int, dict[str, Any]] = {}
    unmeasured: list[dict[str, Any]] = []
    for ident, group in site_ids.items():
        mine = by_id.get(ident, [])
        where = f"{ident[0]} at {ident[1] or '(no source location)'}:{ident[2]} of {ident[3]} elements"
        if not mine:
            reason = (f"no traced collective matches ({where}): inserted by XLA (SPMD "
                      "partitioning, combining) or outside shard_map")
        elif len(mine) != len(group):
            reason = (f"{len(group)} such ops in the module, {len(mine)} traced ({where}); "
                      "pairing them by order could misapply one's statistics to another")
        else:
            reason = None
        for s, t in zip(group, mine if reason is None else [None] * len(group)):
            if reason is not None:
                unmeasured.append({"key": s["key"], "reason": reason})
                continue
            groups = s.get("groups", {})
            if "Ok" not in groups:
                unmeasured.append({"key": s["key"], "reason": f"groups: {groups.get('Err')}"})
                continue
            want = 1
            for n in traced[t]["axis_sizes"]:
                want *= n
            if groups["Ok"]["space"] != "partition" or groups["Ok"]["ids"] != want:
                unmeasured.append({"key": s["key"], "reason": (
                    f"its groups are over {groups['Ok']['ids']} {groups['Ok']['space']} ids, "
                    f"the traced mesh has {want} devices")})
                continue
            paired[t] = s
    return paired, unmeasured


def calibrate(
    fn: Callable[..., Any],
    *args: Any,
    path: str | os.PathLike[str] | None = None,
    platforms: tuple[str, ...] | list[str] | str = ("cpu",),
    source: str | None = None,
    **pass_options: Any,
) -> dict[str, Any]:
    """Runs ``fn(*args)`` once with exact collectives and returns the
    calibration profile of its collectives (and writes it to ``path`` when
    given, atomically). ``platforms`` and ``pass_options`` (e.g. device
    counts) are as for :func:`equarx.jax.enable`; the profile's keys are
    those the pass computes at that stage. While it runs, a registration
    made by :func:`equarx.jax.enable` is set aside (the run must be exact),
    and JAX's persistent compilation cache is off.

    Use the profile with ``enable(..., profile=path)`` (or the profile
    itself: ``profile=calibrate(...)``), or ``equarx rewrite --profile``.
    """
    import jax
    from jax._src.lax import parallel

    from equarx import jax as ej

    platforms = [platforms] if isinstance(platforms, str) else list(platforms)
    options = ej.options(**pass_options)
    _native.check_options(options)
    with ej._lock:
        before = None if ej._registered is None else dict(ej._registered)
    cache = jax.config.jax_enable_compilation_cache
    recorder = _Recorder()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    shapes = ", ".join(f"{getattr(a, 'dtype', type(a).__name__)}{list(getattr(a, 'shape', []))}"
                       for a in jax.tree_util.tree_leaves(args))
    recorder.source = source or f"equarx.jax.calibrate({name}) on {shapes}, {when}"
    prims = [getattr(parallel, n + "_p") for n in _COLLECTIVES if hasattr(parallel, n + "_p")]
    saved = []
    try:
        if before is not None:
            ej.disable()
        jax.config.update("jax_enable_compilation_cache", False)
        sites = _module_sites(fn, args, platforms, options)
        jax.clear_caches()
        try:
            for p in prims:
                bind, wrapped = recorder.wrap(p)
                saved.append((p, bind))
                p.bind = wrapped
            lowered = jax.jit(fn).lower(*args)
        finally:
            for p, bind in saved:
                p.bind = bind
        recorder.paired, unmeasured = _pair(sites, recorder.traced)
        with _host_values():
            out = lowered.compile()(*args)
            jax.block_until_ready(out)
            jax.effects_barrier()
    finally:
        jax.config.update("jax_enable_compilation_cache", cache)
        jax.clear_caches()
        if before is not None:
            ej._activate(before)  # the registration as it was, profile included
    if recorder.errors:
        raise recorder.errors[0]
    if recorder.pending:
        raise EquarxError(
            f"equarx.jax.calibrate: {len(recorder.pending)} runs of collectives did not report "
            "from every device"
        )
    ops = []
    for t, site in recorder.paired.items():
        stats = recorder.stats.get(t)
        if not stats:
            unmeasured.append({"key": site["key"], "reason": "it never ran on these inputs"})
            continue
        bad, total = recorder.nonfinite[t]
        ops.append({"key": site["key"], "stats": stats,
                    "nonfinite_fraction": bad / total if total else 0.0})
    profile = _native.profile({
        "source": recorder.source,
        "ops": ops,
        "unmeasured": unmeasured,
    })
    if path is not None:
        _write_atomically(os.fspath(path), json.dumps(profile, indent=1) + "\n")
    return profile


def _write_atomically(path: str, text: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".equarx-profile-", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
