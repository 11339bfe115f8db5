"""Register equarx with JAX's compiler in one call.

    import equarx.jax
    equarx.jax.enable(platforms=("tpu",))          # TPU keeps bf16 all-reduces
    equarx.jax.enable(platforms=("cpu",), types=("bf16", "f32"), min_payload=0)

:func:`enable` registers a callback with
``jax.extend.xla.register_hlo_module_transformation`` at the pre-scheduler
stage: every module XLA compiles for those platforms from then on passes
through equarx (compilations already cached are not redone; use a new
``jax.jit`` or ``jax.clear_caches()``). On CPU the callback runs in-process;
on TPU/GPU JAX registers it through the PJRT XLA-transform extension.

XLA:CPU promotes bf16 all-reduces to f32 before this stage, so CPU runs
need ``types=("bf16", "f32")``; TPU keeps bf16.

An error inside the pass fails the compilation: JAX raises its compile error
with equarx's message in it. :func:`last_report` tells what the last rewrite
did to every all-reduce.

Experimental: :func:`register_native` registers equarx's C callback with a
PJRT plugin's XLA-transform extension directly, with no Python callback (a
Python callback needs the GIL on the compiler thread, which can deadlock
TPU ahead-of-time compiles, jax-ml/jax#38829). jaxlib 0.10.2 has no call
that takes a native callback; this goes through the plugin's ``PJRT_Api*``.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Iterable, Sequence

from equarx import _native
from equarx._native import EquarxError

#: The pass's name in XLA's pipeline (and the registration's).
PASS_NAME = "equarx-quantized-all-reduce"

_lock = threading.Lock()
_registered: dict[str, Any] | None = None
_last_report: list[dict[str, Any]] | None = None


def _stage(stage: Any):
    from jax.extend import xla as jxla

    if isinstance(stage, jxla.PipelineStage):
        return stage
    names = {"pre_scheduler": jxla.PipelineStage.PRE_SCHEDULER,
             "post_scheduler": jxla.PipelineStage.POST_SCHEDULER}
    try:
        return names[str(stage).lower()]
    except KeyError:
        raise ValueError(
            f"stage must be 'pre_scheduler', 'post_scheduler' or a PipelineStage, not {stage!r}"
        ) from None


def options(**pass_options: Any) -> dict[str, Any]:
    """The options :func:`enable` passes to equarx: keyword arguments named
    as equarx's options, with the values its JSON takes (the one list is
    equarx's own: ``src/options.rs``, the README's "Options", ``equarx
    rewrite --help``). E.g. ``block_size=32``, ``min_payload_bytes=0`` (also
    ``"1MiB"``; alias ``min_payload``), ``types=("bf16", "f32")``,
    ``fuse="off"``.

    Nothing is checked or renamed here, so this package cannot drift from
    the library: equarx judges every name and value (:func:`enable` asks it
    at once, :func:`equarx.check_options` on demand) and refuses an unknown
    one with the same message as its other doors. Lists may be any
    iterable; ``None`` leaves an option at equarx's default.
    """
    return {k: _json_value(v) for k, v in pass_options.items() if v is not None}


def _json_value(v: Any) -> Any:
    if isinstance(v, (str, bytes, bool, int, float, dict)):
        return v
    if isinstance(v, Iterable):
        return list(v)
    return v


def _callback(options_json: bytes):
    def equarx_transform(module: bytes) -> bytes | None:
        global _last_report
        result = _native.rewrite(module, options_json.decode())
        if result.report:  # modules without all-reduces keep the last report
            with _lock:
                _last_report = result.report
        return result.module if result.changed else None

    return equarx_transform


def enable(
    platforms: Sequence[str] | str = ("cpu",),
    *,
    name: str = PASS_NAME,
    stage: Any = "pre_scheduler",
    **pass_options: Any,
) -> None:
    """Registers equarx with JAX for ``platforms``.

    ``pass_options`` are equarx's options, as for :func:`options`. At the
    pre-scheduler stage XLA has fused the module, so ``fuse="auto"`` (the
    default) outlines equarx's ops into loop fusions of their own. They are
    checked now: invalid ones raise :class:`equarx.EquarxError` with
    equarx's message.
    Enabling again replaces the previous registration.
    """
    global _registered
    from jax.extend import xla as jxla

    opts = options(**pass_options)
    _native.check_options(opts)
    platforms = [platforms] if isinstance(platforms, str) else list(platforms)
    pipeline_stage = _stage(stage)
    disable()
    options_json = _native.options_json(opts)
    jxla.register_hlo_module_transformation(
        _callback(options_json), name=name, stage=pipeline_stage, platforms=platforms
    )
    with _lock:
        _registered = {
            "name": name,
            "stage": pipeline_stage,
            "platforms": platforms,
            "options": opts,
        }


def disable() -> bool:
    """Removes the registration made by :func:`enable`; ``True`` if there
    was one."""
    global _registered
    from jax.extend import xla as jxla

    with _lock:
        reg, _registered = _registered, None
    if reg is None:
        return False
    jxla.clear_hlo_module_transformation(
        reg["name"], stage=reg["stage"], platforms=reg["platforms"]
    )
    return True


def enabled() -> dict[str, Any] | None:
    """The current registration (name, stage, platforms, options), if any."""
    with _lock:
        return None if _registered is None else dict(_registered)


def last_report() -> list[dict[str, Any]] | None:
    """The report of the last module with all-reduces that equarx saw in
    this process (modules without any, which JAX compiles plenty of, leave
    it alone): one dict per all-reduce (name, rewritten, reason, group_size,
    mode, wire_bytes_before, wire_bytes_after, predicted_rel_rms, ...)."""
    with _lock:
        return None if _last_report is None else list(_last_report)


def _capsule_pointer(obj: Any) -> int:
    if isinstance(obj, int):
        return obj
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_IsValid.restype = ctypes.c_int
    api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    name = api.PyCapsule_GetName(obj)
    if not api.PyCapsule_IsValid(obj, name):
        raise TypeError(f"expected a PJRT_Api* capsule or an address, got {obj!r}")
    return api.PyCapsule_GetPointer(obj, name)


def register_native(
    pjrt_api: Any,
    *,
    name: str = PASS_NAME,
    stage: str = "pre_scheduler",
    **pass_options: Any,
) -> None:
    """**Experimental.** Registers equarx's C callback with a PJRT plugin's
    XLA-transform extension, without a Python callback.

    ``pjrt_api`` is the plugin's ``PJRT_Api*``: the capsule jaxlib returns
    from ``jax._src.xla_bridge.register_plugin`` / ``load_pjrt_plugin``, or
    an address (e.g. from ``ctypes.CDLL(libtpu_path).GetPjrtApi()``). The
    options are process-wide. A plugin without the extension raises
    :class:`equarx.EquarxError` naming the extensions it has.
    """
    stages = {"pre_scheduler": 0, "post_scheduler": 1}
    if stage not in stages:
        raise ValueError(f"stage must be one of {sorted(stages)}, not {stage!r}")
    _native.pjrt_register(
        _capsule_pointer(pjrt_api), name, stages[stage], options(**pass_options)
    )


__all__ = [
    "EquarxError",
    "PASS_NAME",
    "disable",
    "enable",
    "enabled",
    "last_report",
    "options",
    "register_native",
]
