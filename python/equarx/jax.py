"""Register equarx with JAX's compiler in one call.

A tensor-parallel matmul whose partial sums are all-reduced, on 8 CPU
devices (run with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``)::

    import jax, jax.numpy as jnp, equarx.jax
    P, mesh = jax.P, jax.sharding.Mesh(jax.devices(), ("x",))
    f = jax.jit(jax.shard_map(lambda a, w: jax.lax.psum(a @ w, "x"), mesh=mesh,
                              in_specs=(P(None, "x"), P("x")), out_specs=P()))
    with equarx.jax.enable(types=("bf16", "f32"), min_payload=0):
        f(jnp.ones((64, 1024), jnp.bfloat16), jnp.ones((1024, 256), jnp.bfloat16))
        equarx.jax.print_report()      # the all-reduce: rewritten, its plan, bytes, error

:func:`enable` with no arguments registers equarx for JAX's default
backend (``jax.default_backend()``) with equarx's default options; name
platforms to choose (``enable(platforms=("tpu",))``). Called plainly it
stays registered until :func:`disable`; used in a ``with`` statement it is
undone at the block's end, exceptions included, back to whatever was
registered before (another ``enable``'s registration, or none). XLA:CPU
promotes bf16 all-reduces to f32 before equarx's stage, hence
``types=("bf16", "f32")`` there; TPU keeps bf16. ``min_payload=0`` rewrites
every eligible op, where by default the time model (``topology``: h100 on
a GPU, else v5e) skips those too small to pay.

:func:`enable` registers a callback with
``jax.extend.xla.register_hlo_module_transformation`` at the pre-scheduler
stage: every module XLA compiles for those platforms from then on passes
through equarx. On CPU the callback runs in-process; on TPU/GPU JAX
registers it through the PJRT XLA-transform extension. The library is the
one :func:`equarx.library_path` names: ``$EQUARX_LIB`` when set, else the
one installed with this package.

Compilation caches. JAX keeps compiled executables in memory and, with
``jax_compilation_cache_dir`` set, on disk, keyed by the program and
compiler settings; a registered HLO transformation is not part of that key.
So equarx puts its state into it: :func:`enable`, :func:`disable` and
:func:`register_native` change what JAX's cache-key hook
(``jax._src.cache_key.custom_hook``, hashed into every persistent-cache
key) returns, and clear JAX's in-memory caches (``jax.clear_caches()``), so
the next compile of any function is the equarx state's own:

- enabled: the key holds the platforms, stage, options and the loaded
  ``libequarx.so`` (version and SHA-256), so another option or another
  build never gets an executable compiled with the old one;
- disabled, or never imported: the key is JAX's own, so a rewritten
  executable is never served to a plain process, and plain entries are
  shared with processes that never import equarx.

The key does not say which platform a compile is for: with
``platforms=("tpu",)`` a CPU compile also gets a key of its own (a cache
miss, never a wrong hit). This relies on jax 0.10.2's ``cache_key.get``
calling ``custom_hook``; if a jax version stops doing so, :func:`enable`
refuses while the persistent cache is on (``jax_enable_compilation_cache``,
on by default), and a compile refuses if something replaced the hook
without calling equarx's.

XLA:CPU promotes bf16 all-reduces to f32 before this stage, so CPU runs
need ``types=("bf16", "f32")``; TPU keeps bf16.

An error inside the pass fails the compilation: JAX raises its compile error
with equarx's message in it. :func:`last_report` tells what the last rewrite
did to every collective, :func:`print_report` prints that as the CLI's
``--report`` table.

Experimental: :func:`register_native` registers equarx's C callback with a
PJRT plugin's XLA-transform extension directly, with no Python callback (a
Python callback needs the GIL on the compiler thread, which can deadlock
TPU ahead-of-time compiles, jax-ml/jax#38829). jaxlib 0.10.2 has no call
that takes a native callback; this goes through the plugin's ``PJRT_Api*``.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
import threading
from types import TracebackType
from typing import Any, Iterable, Mapping, Sequence, TextIO

from equarx import _native
from equarx._native import EquarxError
from equarx.report import format_report

#: The pass's name in XLA's pipeline (and the registration's).
PASS_NAME = "equarx-quantize-collectives"

_lock = threading.Lock()
_registered: dict[str, Any] | None = None
_native_registrations: list[dict[str, Any]] = []
_last_report: list[dict[str, Any]] | None = None
# What equarx adds to JAX's compilation-cache key: "" while nothing is
# registered, so the key is then JAX's own.
_cache_key_part = ""
_library_digests: dict[tuple[str, int, int], str] = {}


def _library_identity() -> dict[str, str]:
    """The loaded ``libequarx.so``: version and the SHA-256 of its bytes (a
    rebuilt library may rewrite differently under the same version)."""
    path = str(_native._load()._name)
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    with _lock:
        digest = _library_digests.get(key)
    if digest is None:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digest = h.hexdigest()
        with _lock:
            _library_digests[key] = digest
    return {"version": _native.version(), "sha256": digest}


def _cache_hook_module():
    """jax's cache-key module, if its ``get`` still hashes ``custom_hook()``
    (jax 0.10.2); ``None`` if that has moved."""
    try:
        from jax._src import cache_key
    except ImportError:
        return None
    get = getattr(cache_key, "get", None)
    if not callable(getattr(cache_key, "custom_hook", None)) or get is None:
        return None
    names: set[str] = set()
    codes = [getattr(get, "__code__", None)]
    while codes:
        code = codes.pop()
        if code is None:
            continue
        names.update(code.co_names)
        codes.extend(c for c in code.co_consts if hasattr(c, "co_names"))
    return cache_key if "custom_hook" in names else None


def _install_cache_key_hook() -> None:
    """Chains equarx's part into ``jax._src.cache_key.custom_hook`` (once
    per process), or refuses if that hook has moved while JAX's persistent
    cache is on."""
    import jax

    cache_key = _cache_hook_module()
    if cache_key is None:
        if not jax.config.jax_enable_compilation_cache:
            return  # no persistent cache: nothing to key
        raise EquarxError(
            f"equarx: this jax ({jax.__version__}) no longer hashes "
            "jax._src.cache_key.custom_hook() into its persistent compilation "
            "cache key (equarx is pinned to jax 0.10.2), so equarx cannot keep "
            "rewritten and plain executables apart in that cache. Use jax "
            "0.10.2, or turn the persistent cache off with "
            "jax.config.update('jax_enable_compilation_cache', False)"
        )
    if getattr(cache_key.custom_hook, "_equarx", False):
        return
    previous = cache_key.custom_hook

    def custom_hook() -> str:
        theirs = previous()
        return theirs + _cache_key_part if _cache_key_part else theirs

    custom_hook._equarx = True  # type: ignore[attr-defined]
    cache_key.custom_hook = custom_hook


def _state_changed() -> None:
    """Recomputes equarx's part of the cache key from the registrations and
    drops JAX's in-memory executables, which were compiled in the old state."""
    global _cache_key_part
    import jax

    with _lock:
        state = {}
        if _registered is not None:
            state["jax"] = {
                "name": _registered["name"],
                "stage": _registered["stage"].name,
                "platforms": _registered["platforms"],
                "options": _registered["options"],
                "profile": _registered.get("profile_sha256"),
            }
        if _native_registrations:
            state["native"] = list(_native_registrations)
        library = _registered["library"] if _registered is not None else None
    if state:
        state["library"] = library or _library_identity()
        part = "\nequarx:" + json.dumps(state, sort_keys=True)
    else:
        part = ""
    with _lock:
        _cache_key_part = part
    jax.clear_caches()


def _check_cache_key_hook() -> None:
    """At compile time: equarx's part must still be in JAX's cache key, or
    the rewritten executable would be cached under a plain key."""
    import jax

    if not (jax.config.jax_enable_compilation_cache and jax.config.jax_compilation_cache_dir):
        return
    cache_key = _cache_hook_module()
    part = _cache_key_part
    if cache_key is None or (part and part not in cache_key.custom_hook()):
        raise EquarxError(
            "equarx: its state is missing from JAX's persistent compilation cache "
            "key (jax._src.cache_key.custom_hook was replaced without calling the "
            "previous hook, or jax stopped hashing it); refusing to compile, as the "
            "rewritten executable would be cached as a plain one"
        )


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
    equarx's own: ``core/src/options/schema.rs``, the README's "Options", ``equarx
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
    if isinstance(v, dict) and v.get("version") is not None and "ops" in v:
        return json.dumps(v)  # a calibration profile itself: the option's JSON form
    if isinstance(v, (str, bytes, bool, int, float, dict)):
        return v
    if isinstance(v, Iterable):
        return list(v)
    return v


def _callback(options_json: bytes):
    def equarx_transform(module: bytes) -> bytes | None:
        global _last_report
        _check_cache_key_hook()
        result = _native.rewrite(module, options_json.decode())
        if result.report:  # modules without all-reduces keep the last report
            with _lock:
                _last_report = result.report
        return result.module if result.changed else None

    return equarx_transform


class Enabled:
    """What :func:`enable` returns: its registration and, as a context
    manager, the way back.

    Leaving the ``with`` block, normally or by an exception (which goes on),
    puts back what was registered before the :func:`enable` call: that
    registration, through the same path :func:`enable` takes, or none,
    through :func:`disable`. Either way JAX's cache key and in-memory caches
    follow, as for any state change (see the module's docs). Whatever
    happened inside the block, the state after it is the state before it.

    Example::

        import equarx.jax
        with equarx.jax.enable(min_payload=0) as on:
            print(on.registration["platforms"])   # e.g. ['cpu']
        assert equarx.jax.enabled() is None       # if nothing was enabled before
    """

    def __init__(self, previous: dict[str, Any] | None, registration: dict[str, Any]):
        self._previous = previous
        #: What :func:`enabled` said right after the :func:`enable` call.
        self.registration = registration

    def __enter__(self) -> "Enabled":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._previous is None:
            disable()
        else:
            _activate(self._previous)

    def __repr__(self) -> str:
        return f"<equarx.jax.Enabled {self.registration!r}>"


def enable(
    platforms: Sequence[str] | str | None = None,
    *,
    name: str = PASS_NAME,
    stage: Any = "pre_scheduler",
    **pass_options: Any,
) -> Enabled:
    """Registers equarx with JAX for ``platforms``; by default JAX's
    default backend (``jax.default_backend()``: ``"cpu"``, ``"gpu"``,
    ``"tpu"``...).

    ``pass_options`` are equarx's options, as for :func:`options`. At
    XLA:CPU's pre-scheduler stage XLA has fused the module, so
    ``fuse="auto"`` (the default) outlines equarx's ops into loop fusions of
    their own; XLA:GPU's hook sits before its fusion, which then fuses them,
    and XLA:TPU's after its tiling and fusion. There equarx writes
    two-shot's steps as Mosaic kernels of its own by default (``kernels``
    auto: 3 kernels an op, the codes unpadded) wherever they take the op;
    in HLO, equarx outlines only the fusions libtpu's emitter takes and a
    block's int8 codes sit in padded tile rows (about the original's bytes
    on the wire), so the cost model skips such an op unless forced
    (``min_payload=0``). On XLA:GPU equarx writes the same steps as Triton
    kernels of its own by default (3 kernels an op, where XLA:GPU makes 9
    of the HLO emission). With one
    platform and no ``platform`` option, equarx emits for that platform. They are
    checked now: invalid ones raise :class:`equarx.EquarxError` with
    equarx's message, and what was registered stays.
    Enabling again replaces the previous registration.

    Returns an :class:`Enabled`: ignore it to stay enabled until
    :func:`disable`, or use it in a ``with`` statement to enable equarx for
    a block only::

        with equarx.jax.enable(types=("bf16", "f32"), min_payload=0):
            y = jax.jit(f)(x)              # compiled with equarx
        z = jax.jit(f)(x)                  # compiled as before the block

    The registration enters JAX's compilation-cache key and JAX's in-memory
    caches are cleared (see the module's docs): functions jitted before
    compile again, with equarx.
    """
    import jax

    opts = options(**pass_options)
    _native.check_options(opts)
    if platforms is None:
        platforms = [jax.default_backend()]
    platforms = [platforms] if isinstance(platforms, str) else list(platforms)
    if len(platforms) == 1 and "platform" not in opts and _platform_of(platforms[0]):
        opts["platform"] = _platform_of(platforms[0])
    pipeline_stage = _stage(stage)
    _install_cache_key_hook()
    library = _library_identity()
    # A profile file is read once, here: what the key holds is what every
    # compile uses, even if the file is rewritten later.
    profile_text = _profile_text(opts.get("profile"))
    with _lock:
        previous = None if _registered is None else dict(_registered)
    _activate(
        {
            "name": name,
            "stage": pipeline_stage,
            "platforms": platforms,
            "options": opts,
            "library": library,
            "profile_text": profile_text,
            "profile_sha256": (hashlib.sha256(profile_text.encode()).hexdigest()
                               if profile_text is not None else None),
        }
    )
    return Enabled(previous, enabled() or {})


def _platform_of(name: str) -> str | None:
    """equarx's ``platform`` option for a JAX platform or backend name
    (``"cuda"`` and ``"rocm"`` are XLA:GPU), or ``None`` for one equarx
    does not know (its ``auto`` then decides)."""
    return {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}.get(
        str(name).lower())


def _activate(registration: dict[str, Any]) -> None:
    """Makes ``registration`` (what :func:`enable` builds) the one
    registered: the old one is cleared from JAX, this one registered, and
    the state change recorded (cache key, in-memory caches)."""
    global _registered
    from jax.extend import xla as jxla

    _unregister()
    given = registration["options"]
    if registration.get("profile_text") is not None:
        given = dict(given, profile=registration["profile_text"])
    options_json = _native.options_json(given)
    jxla.register_hlo_module_transformation(
        _callback(options_json),
        name=registration["name"],
        stage=registration["stage"],
        platforms=registration["platforms"],
    )
    with _lock:
        _registered = dict(registration)
    _state_changed()


def _profile_text(profile: Any) -> str | None:
    """The JSON of a ``profile`` option given as a file's path (``None``
    for none, or for a profile given as JSON)."""
    if not isinstance(profile, str) or profile.lstrip().startswith("{"):
        return None
    try:
        with open(profile, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise EquarxError(f"invalid options: profile: cannot read {profile}: {e}") from None


def _unregister() -> bool:
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


def disable() -> bool:
    """Removes the registration made by :func:`enable`; ``True`` if there
    was one. JAX's compilation-cache key is then JAX's own again and its
    in-memory caches are cleared, so no rewritten executable is served."""
    if not _unregister():
        return False
    _state_changed()
    return True


def enabled() -> dict[str, Any] | None:
    """The current registration (name, stage, platforms, options), if any."""
    with _lock:
        if _registered is None:
            return None
        return {k: v for k, v in _registered.items() if k not in ("library", "profile_text", "profile_sha256")}


def last_report() -> list[dict[str, Any]] | None:
    """The report of the last module with collectives that equarx saw in
    this process (modules without any, which JAX compiles plenty of, leave
    it alone): one dict per collective (name, opcode, shape, rewritten,
    reason, group_size, mode, wire_bytes_before, wire_bytes_after,
    predicted_rel_rms, predicted_time, plan, ...); ``None`` before any."""
    with _lock:
        return None if _last_report is None else list(_last_report)


def print_report(
    report: Iterable[Mapping[str, Any]] | None = None, file: TextIO | None = None
) -> None:
    """Prints ``report`` (default: :func:`last_report`) as the CLI's
    ``--report`` table (:func:`equarx.format_report`; the columns are
    explained in :mod:`equarx.report`) to ``file`` (default: stdout)::

        collective       op         shape       P mode          plan              decision  wire before wire after ratio rel.err model reason
        psum_invariant.8 all-reduce f32[64,256] 8 flattened ids two-shot+hadamard rewritten      114688      29568 3.879   0.85% 0.97x
        1 of 1 collectives rewritten, the module taken to be fused (option stage); model: ...

    (the module docstring's example, on 8 CPU devices)
    """
    if report is None:
        report = last_report()
        if report is None:
            print("equarx has rewritten no module in this process yet", file=file or sys.stdout)
            return
    print(format_report(report), end="", file=file or sys.stdout)


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
    :class:`equarx.EquarxError` naming the extensions it has. A registration
    enters JAX's compilation-cache key like :func:`enable`'s (it cannot be
    undone).
    """
    stages = {"pre_scheduler": 0, "post_scheduler": 1}
    if stage not in stages:
        raise ValueError(f"stage must be one of {sorted(stages)}, not {stage!r}")
    opts = options(**pass_options)
    pointer = _capsule_pointer(pjrt_api)
    _install_cache_key_hook()
    _native.pjrt_register(pointer, name, stages[stage], opts)
    with _lock:
        _native_registrations.append({"name": name, "stage": stage, "options": opts})
    _state_changed()


def rewrite_lowered(lowered: Any, **pass_options: Any) -> Any:
    """The door before XLA: rewrites a lowered JAX program
    (``jax.jit(f).lower(...)``) and returns a new ``Lowered`` whose
    ``.compile()`` compiles the rewrite; the report is in
    :func:`last_report`.

    For programs whose collectives exist before XLA partitions them: those
    written with ``jax.shard_map`` (``psum``, ``psum_scatter``,
    ``all_gather``, ``all_to_all``). The module goes to HLO, through equarx
    at the ``pre-fusion`` stage, and back to StableHLO, so XLA's own layout
    assignment, fusion and copy insertion handle what equarx emits: on
    XLA:TPU libtpu lays the codes out unpadded (half the original's bytes
    on the wire) and fuses the rotation's products with their neighbours,
    where at its pre-scheduler hook the module is already tiled and fused,
    and an op equarx's Mosaic kernels cannot take is emitted in HLO whose
    codes fill padded tile rows. Collectives
    that XLA's SPMD partitioner inserts (plain ``jit`` with shardings) do
    not exist yet at this point: they reach equarx only through
    :func:`enable` (the hook). ``num_partitions`` defaults to the
    program's device count.

    Works on any backend, compile-only (deviceless) ones included; it needs
    no registration, and the original ``lowered`` stays as it was. The
    ``platform`` option defaults to the backend ``lowered`` is for, so the
    rewrite takes the forms that compiler compiles best.
    """
    import copy

    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib import _jax
    from jax._src.lib.mlir import ir

    global _last_report
    lowering = getattr(lowered, "_lowering", None)
    if lowering is None or not hasattr(lowering, "_hlo"):
        raise TypeError(
            f"expected the result of jax.jit(f).lower(...) (jax 0.10.2), got {type(lowered)!r}"
        )
    text = str(lowered.compiler_ir("stablehlo"))
    hlo = _jax.mlir.mlir_module_to_xla_computation(text, use_tuple_args=False, return_tuple=False)
    opts = {"stage": "pre-fusion", "replica_count": 1,
            "num_partitions": lowering.compile_args.get("num_devices", 1)}
    platform = _platform_of(getattr(lowering.compile_args.get("backend"), "platform", ""))
    if platform:
        opts["platform"] = platform
    opts.update(options(**pass_options))
    result = _native.rewrite(hlo.as_serialized_hlo_module_proto(), opts)
    with _lock:
        _last_report = result.report
    if not result.changed:
        return lowered
    stablehlo = _jax.mlir.hlo_to_stablehlo(result.module)
    with jax_mlir.make_ir_context():
        module = ir.Module.parse(stablehlo)
    new_lowering = copy.copy(lowering)
    new_lowering._hlo = module
    new_lowering._executable = None  # a compile of the original is not this one's
    new_lowered = copy.copy(lowered)
    new_lowered._lowering = new_lowering
    return new_lowered


from equarx.calibration import calibrate  # noqa: E402  (it imports this module lazily)

__all__ = [
    "Enabled",
    "EquarxError",
    "PASS_NAME",
    "calibrate",
    "disable",
    "enable",
    "enabled",
    "last_report",
    "options",
    "print_report",
    "register_native",
    "rewrite_lowered",
]
