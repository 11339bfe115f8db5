"""ctypes binding of equarx's C ABI (cpp_shim/include/equarx.h).

The shared library is found, in order, at:

1. ``$EQUARX_LIB`` (a path to ``libequarx.so``): when set it wins, and a
   path that is no file is an error rather than a fallback;
2. ``libequarx.so`` next to this package: the one an installed package
   (``pip install .``, the wheel) carries;
3. ``<repo>/target/release/libequarx.so``, ``<repo>/target/debug/libequarx.so``
   (and the same under ``$CARGO_TARGET_DIR``), for a source checkout on
   ``PYTHONPATH=python``.

Calls release the GIL (ctypes does so for ``CDLL`` functions), so XLA may
compile modules on several threads while equarx rewrites one.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import pathlib
import threading
from typing import Any, Mapping

# Status codes (equarx_status).
OK = 0
INVALID_ARGUMENT = 1
INVALID_OPTIONS = 2
INVALID_MODULE = 3
REWRITE_FAILED = 4
INTERNAL = 5

_STATUS_NAMES = {
    INVALID_ARGUMENT: "invalid argument",
    INVALID_OPTIONS: "invalid options",
    INVALID_MODULE: "invalid module",
    REWRITE_FAILED: "rewrite failed",
    INTERNAL: "internal error",
}


class EquarxError(RuntimeError):
    """An error reported by equarx; the message is the library's own."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class _Result(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("module", ctypes.c_void_p),
        ("module_len", ctypes.c_size_t),
        ("changed", ctypes.c_int),
        ("report_json", ctypes.c_void_p),
        ("error", ctypes.c_void_p),
    ]


@dataclasses.dataclass(frozen=True)
class RewriteResult:
    """What :func:`rewrite` returns."""

    changed: bool
    #: The rewritten module (same container as the input); ``None`` when
    #: unchanged.
    module: bytes | None
    #: One dict per all-reduce: name, rewritten, reason, group_size, mode,
    #: wire_bytes_before/after, predicted_rel_rms, ...
    report: list[dict[str, Any]]


_lib = None
_lib_lock = threading.Lock()


def _candidates() -> list[pathlib.Path]:
    here = pathlib.Path(__file__).resolve().parent
    found = [here / "libequarx.so"]
    roots = []
    if os.environ.get("CARGO_TARGET_DIR"):
        roots.append(pathlib.Path(os.environ["CARGO_TARGET_DIR"]))
    roots.append(here.parents[1] / "target")
    for root in roots:
        found += [root / "release" / "libequarx.so", root / "debug" / "libequarx.so"]
    return found


def library_path() -> pathlib.Path:
    """The ``libequarx.so`` this process uses: once loaded (by the first
    call into it), that one; before, the one it would load, in the order
    above."""
    if _lib is not None:
        return pathlib.Path(_lib._name)
    env = os.environ.get("EQUARX_LIB")
    if env:
        p = pathlib.Path(env)
        if not p.is_file():
            raise EquarxError(f"EQUARX_LIB={env} is not a file")
        return p
    for p in _candidates():
        if p.is_file():
            return p
    tried = ", ".join(str(p) for p in _candidates())
    raise EquarxError(
        "cannot find libequarx.so: install the package (`pip install .` in a "
        "checkout), build it with `cargo build --release --lib`, "
        f"or set EQUARX_LIB to its path (looked at {tried})"
    )


def _load():
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        lib = ctypes.CDLL(str(library_path()))
        lib.equarx_version.restype = ctypes.c_char_p
        lib.equarx_version.argtypes = []
        lib.equarx_rewrite.restype = ctypes.c_int
        lib.equarx_rewrite.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_char_p,
            ctypes.POINTER(_Result),
        ]
        lib.equarx_free_result.restype = None
        lib.equarx_free_result.argtypes = [ctypes.POINTER(_Result)]
        for fn in ("equarx_check_options", "equarx_pjrt_configure"):
            getattr(lib, fn).restype = ctypes.c_int
            getattr(lib, fn).argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.equarx_free_string.restype = None
        lib.equarx_free_string.argtypes = [ctypes.c_void_p]
        lib.equarx_op_stats.restype = ctypes.c_int
        lib.equarx_op_stats.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_void_p),
        ]
        lib.equarx_sites.restype = ctypes.c_int
        lib.equarx_sites.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_char_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_void_p),
        ]
        lib.equarx_profile.restype = ctypes.c_int
        lib.equarx_profile.argtypes = [
            ctypes.c_char_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_void_p),
        ]
        lib.equarx_pjrt_register.restype = ctypes.c_int
        lib.equarx_pjrt_register.argtypes = [
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.POINTER(ctypes.c_void_p),
        ]
        _lib = lib
        return lib


def _error(status: int, message: str) -> EquarxError:
    # equarx's messages already say what kind of failure they are.
    return EquarxError(f"equarx: {message or _STATUS_NAMES.get(status, f'status {status}')}", status)


def options_json(options: Mapping[str, Any] | str | None) -> bytes:
    """Options as the C ABI takes them: a JSON object (see equarx.h)."""
    if options is None:
        return b""
    if isinstance(options, str):
        return options.encode()
    return json.dumps(dict(options)).encode()


def version() -> str:
    """The library's version."""
    return _load().equarx_version().decode()


def _string_call(fn, *args) -> None:
    err = ctypes.c_void_p()
    status = fn(*args, ctypes.byref(err))
    if status != OK:
        message = ctypes.string_at(err.value).decode(errors="replace") if err.value else ""
        _load().equarx_free_string(err)
        raise _error(status, message)


def check_options(options: Mapping[str, Any] | str | None) -> None:
    """Raises :class:`EquarxError` (with equarx's message) if the options are
    invalid."""
    lib = _load()
    _string_call(lib.equarx_check_options, options_json(options))


def rewrite(module: bytes, options: Mapping[str, Any] | str | None = None) -> RewriteResult:
    """Rewrites a serialized module (bare ``HloModuleProto``, ``HloProto`` or
    ``HloModuleProtoWithConfig``). Raises :class:`EquarxError` on failure."""
    lib = _load()
    data = bytes(module)
    result = _Result(struct_size=ctypes.sizeof(_Result))
    status = lib.equarx_rewrite(data, len(data), options_json(options), ctypes.byref(result))
    try:
        if status != OK:
            message = (
                ctypes.string_at(result.error).decode(errors="replace") if result.error else ""
            )
            raise _error(status, message)
        out = ctypes.string_at(result.module, result.module_len) if result.module else None
        report = json.loads(ctypes.string_at(result.report_json)) if result.report_json else []
        return RewriteResult(changed=bool(result.changed), module=out, report=report)
    finally:
        lib.equarx_free_result(ctypes.byref(result))


def pjrt_register(
    pjrt_api: int, name: str, stage: int, options: Mapping[str, Any] | str | None
) -> None:
    """Registers equarx's native callback with a PJRT plugin's XLA-transform
    extension (experimental); ``pjrt_api`` is the plugin's ``PJRT_Api*``."""
    lib = _load()
    _string_call(
        lib.equarx_pjrt_register,
        ctypes.c_void_p(pjrt_api),
        name.encode(),
        stage,
        options_json(options),
    )


def _json_out(fn, *args) -> Any:
    """Calls a C function whose last two arguments are ``char** out`` (JSON)
    and ``char** error``; returns the parsed JSON."""
    lib = _load()
    out = ctypes.c_void_p()
    _string_call(fn, *args, ctypes.byref(out))
    try:
        return json.loads(ctypes.string_at(out.value).decode())
    finally:
        lib.equarx_free_string(out)


def sites(module: bytes, options: Mapping[str, Any] | str | None = None) -> list[dict[str, Any]]:
    """The module's collectives as calibration sees them (the C ABI's
    ``equarx_sites``): per collective its profile ``key``, ``instruction``,
    ``computation``, ``in_entry``, ``collective``, ``inputs`` ("summed" or
    "moved"), ``elements`` per device and ``groups``."""
    data = bytes(module)
    return _json_out(_load().equarx_sites, data, len(data), options_json(options))


def profile(measurements: Mapping[str, Any]) -> dict[str, Any]:
    """The calibration profile of ``measurements`` (the C ABI's
    ``equarx_profile``): ``{"source", "ops": [{"key", "stats": [...],
    "nonfinite_fraction"}], "unmeasured": [{"key", "reason"}]}``, each op's
    statistics averaged, as the ``profile`` option reads it."""
    return _json_out(_load().equarx_profile, json.dumps(measurements).encode())


def op_stats(inputs: Any, moved: bool = False, source: str = "") -> dict[str, Any]:
    """The error model's statistics of one collective's inputs (the C ABI's
    ``equarx_op_stats``): ``inputs`` is a 2-D array, device d's payload in
    row d (rank order, flattened as the collective's operand). ``moved`` for
    a collective that moves its inputs (all-gather, all-to-all) instead of
    summing them. Returns the statistics as a dict (block sizes, rotations,
    partial sums' block absmax² and mean square over the sum's)."""
    import numpy as np

    a = np.ascontiguousarray(np.asarray(inputs, dtype=np.float32))
    if a.ndim != 2:
        raise ValueError(f"inputs must be [devices, elements], got shape {a.shape}")
    return _json_out(
        _load().equarx_op_stats,
        a.ctypes.data,
        a.shape[0],
        a.shape[1],
        1 if moved else 0,
        source.encode(),
    )
