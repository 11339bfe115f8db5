"""JAX's compilation caches and equarx (run by tests/jax_cache.rs; needs
XLA_FLAGS=--xla_force_host_platform_device_count=8, PYTHONPATH=python and
EQUARX_LIB pointing at libequarx.so).

One process compiles one 8-way psum program and says what it got:

    jax_cache.py persistent DIR plain           never imports equarx
    jax_cache.py persistent DIR equarx [K=V..]  equarx.jax.enable(...) first
    jax_cache.py persistent DIR enable-disable  enable() then disable()
    jax_cache.py persistent DIR with-block      `with enable(): pass`, then compile
    jax_cache.py persistent DIR with-restores   enable(), then `with enable(other
                                                options): pass`, then compile
    jax_cache.py in-process                     no persistent cache: one jitted
                                                function across enable/disable
    jax_cache.py guards DIR                     what equarx does when JAX's
                                                cache-key hook is lost

``persistent`` turns JAX's persistent compilation cache on in DIR with
``jax_persistent_cache_min_compile_time_secs = 0``, so every executable is
written to it and a later process with the same key is served from it.
JAX's own monitoring events (a public API) count the cache hits and misses.

Prints one line ``JAX_CACHE_RESULT <json>``; the Rust test asserts on it.
"""

import json
import os
import re
import sys

if "--xla_force_host_platform_device_count=8" not in os.environ.get("XLA_FLAGS", ""):
    sys.exit("set XLA_FLAGS=--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

S8_PERMUTE = re.compile(r"= s8\[[^\]]*\](\{[^}]*\})? collective-permute\(")

# The options every equarx process uses unless the command line adds some:
# XLA:CPU has promoted the bf16 psum to f32 by the hook's stage.
# The ring with two lanes a way: one lane a way (an option change) writes
# fewer permutes into the loop body.
BASE_OPTIONS = {"types": ("bf16", "f32"), "min_payload": 0, "algorithm": "ring",
                "pipeline_depth": 2}

events: list[str] = []
jax.monitoring.register_event_listener(lambda event, **_: events.append(event))


def cache_counts():
    return {
        "hits": events.count("/jax/compilation_cache/cache_hits"),
        "misses": events.count("/jax/compilation_cache/cache_misses"),
    }


def program():
    mesh = Mesh(np.array(jax.devices()), ("tp",))

    def psum(x):
        return jax.shard_map(
            lambda a: jax.lax.psum(a, "tp"), mesh=mesh, in_specs=P("tp"), out_specs=P()
        )(x)

    x = jax.device_put(
        jnp.arange(8 * 2048, dtype=jnp.float32) / 1000.0, NamedSharding(mesh, P("tp"))
    )
    return jax.jit(psum), x


def s8_permutes(compiled):
    return sum(1 for line in compiled.as_text().splitlines() if S8_PERMUTE.search(line))


def parse_options(args):
    opts = dict(BASE_OPTIONS)
    for a in args:
        k, _, v = a.partition("=")
        opts[k] = int(v)
    return opts


def persistent(cache_dir, state, extra):
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    result = {"state": state}
    if state != "plain":
        import equarx.jax as ej

        if state == "with-block":
            with ej.enable(platforms=("cpu",), **parse_options(extra)):
                result["enabled_inside"] = ej.enabled() is not None
        else:
            ej.enable(platforms=("cpu",), **parse_options(extra))
        if state == "enable-disable":
            result["disable_returned"] = ej.disable()
        if state == "with-restores":
            with ej.enable(platforms=("cpu",), **{**parse_options(extra), "pipeline_depth": 1}):
                result["options_inside"] = ej.enabled()["options"]
            result["options_after"] = ej.enabled()["options"]
        result["enabled"] = ej.enabled() is not None
    fn, x = program()
    # Only the program's own compile counts (device_put compiles too).
    before = cache_counts()
    compiled = fn.lower(x).compile()
    after = cache_counts()
    result["s8_collective_permutes"] = s8_permutes(compiled)
    result["cache"] = {k: after[k] - before[k] for k in after}
    result["output_sum"] = float(np.asarray(compiled(x), np.float64).sum())
    return result


def in_process():
    """No persistent cache: JAX's in-memory caches hold executables by the
    program too. One jitted function, compiled and called across enable,
    an option change and disable."""
    import equarx.jax as ej

    fn, x = program()
    steps = []

    def step(name):
        # The call path first (jit's dispatch cache), then an explicit
        # compile: both must give the executable of the current state.
        called = np.asarray(fn(x))
        compiled = fn.lower(x).compile()
        steps.append({
            "step": name,
            "s8_collective_permutes": s8_permutes(compiled),
            "call_matches_compile": called.tobytes() == np.asarray(compiled(x)).tobytes(),
            "call_sum": float(called.astype(np.float64).sum()),
        })

    step("plain")
    ej.enable(platforms=("cpu",), **BASE_OPTIONS)
    step("enabled")
    ej.enable(platforms=("cpu",), **{**BASE_OPTIONS, "pipeline_depth": 1})
    step("pipeline_depth=1")
    ej.disable()
    step("disabled")

    # The context manager takes the same paths: entering is enable(),
    # leaving restores the previous registration (or none) with its key.
    keys = {"plain": ej._cache_key_part}
    with ej.enable(platforms=("cpu",), **BASE_OPTIONS):
        step("with")
        keys["with"] = ej._cache_key_part
        try:
            with ej.enable(platforms=("cpu",), **{**BASE_OPTIONS, "pipeline_depth": 1}):
                step("nested with")
                keys["nested with"] = ej._cache_key_part
                raise KeyError("raised inside the block")
        except KeyError:
            pass
        step("after nested with")
        keys["after nested with"] = ej._cache_key_part
    step("after with")
    keys["after with"] = ej._cache_key_part
    return {
        "steps": steps,
        "key_parts_equal": {
            "after nested with = with": keys["after nested with"] == keys["with"],
            "after with = plain": keys["after with"] == keys["plain"] == "",
            "nested with != with": keys["nested with"] != keys["with"],
        },
        "enabled_after_with": ej.enabled(),
    }


def guards(cache_dir):
    """equarx relies on jax 0.10.2's cache_key.get hashing custom_hook().
    Where that is lost it must refuse, not cache a rewritten executable
    under a plain key."""
    from jax._src import cache_key
    import equarx.jax as ej

    def error(fn):
        try:
            fn()
            return None
        except Exception as e:  # equarx's error, or JAX's compile error around it
            return {"type": type(e).__name__, "message": str(e)[:1500]}

    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    fn, x = program()
    result = {}

    # 1. Something replaces the hook without calling equarx's: the compile
    # (a cache miss) refuses.
    ej.enable(platforms=("cpu",), **BASE_OPTIONS)
    ours = cache_key.custom_hook
    cache_key.custom_hook = lambda: ""
    result["hook_replaced"] = error(lambda: fn.lower(x).compile())
    cache_key.custom_hook = ours
    result["hook_restored_s8"] = s8_permutes(fn.lower(x).compile())
    ej.disable()

    # 2. A jax whose cache_key.get no longer calls custom_hook: enable()
    # refuses while the persistent cache is on, and says how to go on.
    real_get = cache_key.get
    cache_key.get = lambda *args, **kwargs: real_get(*args, **kwargs)
    result["hook_moved"] = error(lambda: ej.enable(platforms=("cpu",), **BASE_OPTIONS))
    result["enabled_after_refusal"] = ej.enabled() is not None
    jax.config.update("jax_enable_compilation_cache", False)
    result["hook_moved_cache_off"] = error(lambda: ej.enable(platforms=("cpu",), **BASE_OPTIONS))
    result["cache_off_s8"] = s8_permutes(fn.lower(x).compile())
    cache_key.get = real_get
    return result


def main():
    if sys.argv[1] == "persistent":
        result = persistent(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif sys.argv[1] == "guards":
        result = guards(sys.argv[2])
    elif sys.argv[1] == "in-process":
        result = in_process()
    else:
        sys.exit(f"unknown mode {sys.argv[1]!r}")
    print("JAX_CACHE_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
