"""The JAX door end to end (run by tests/jax_door.rs; needs
XLA_FLAGS=--xla_force_host_platform_device_count=8, PYTHONPATH=python and
EQUARX_LIB pointing at libequarx.so).

A Megatron-style tensor-parallel transformer block in bf16 over 8 CPU
devices is compiled and run without equarx, then with
``equarx.jax.enable(...)``. Checks: the compiled HLO holds s8
collectives, the result matches the unquantized run, all devices
hold the same bits, errors in the pass come back as Python exceptions with
equarx's message, ``disable()`` restores the plain compile, a scan over
MLP layers whose activations pass 1e19 keeps every device's bits equal,
and the hook's integer product rotates back the same bits as the door
before XLA's f32 one.

Prints one line ``JAX_DOOR_RESULT <json>``; the Rust test asserts on it.
"""

import ctypes
import io
import json
import os
import re
import sys
import tempfile
import time

if "--xla_force_host_platform_device_count=8" not in os.environ.get("XLA_FLAGS", ""):
    sys.exit("set XLA_FLAGS=--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import equarx
import equarx.jax as ej

# An s8 collective, whichever algorithm the pass chose: ring permutes, a
# two-shot all-to-all (a tuple of s8 pieces past XLA's decomposer), the
# gather.
S8_COLLECTIVE = re.compile(r"= \(?s8\[.*? (collective-permute|all-to-all|all-gather)\(")

BATCH, SEQ, WIDTH, HEADS, MLP = 2, 64, 256, 8, 1024
HEAD = WIDTH // HEADS


def layer_norm(x):
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = ((x32 - mean) ** 2).mean(-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + 1e-5)).astype(x.dtype)


def tp_block(p, x):
    """LN → QKV (column-parallel over heads) → attention → out-projection
    (row-parallel: all-reduce) → residual → LN → MLP up (column-parallel)
    → gelu → down (row-parallel: all-reduce) → residual."""
    h = layer_norm(x)
    q = jnp.einsum("bsd,dhk->bhsk", h, p["wq"])
    k = jnp.einsum("bsd,dhk->bhsk", h, p["wk"])
    v = jnp.einsum("bsd,dhk->bhsk", h, p["wv"])
    logits = jnp.einsum("bhsk,bhtk->bhst", q, k) / np.sqrt(HEAD).astype(np.float32)
    attn = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(x.dtype)
    ctx = jnp.einsum("bhst,bhtk->bhsk", attn, v)
    x = x + jnp.einsum("bhsk,hkd->bsd", ctx, p["wo"])
    h = layer_norm(x)
    up = jax.nn.gelu(h @ p["w1"])
    return x + up @ p["w2"]


def count_s8_collectives(text):
    return sum(1 for line in text.splitlines() if S8_COLLECTIVE.search(line))


def sp_mlp(x, w1, w2):
    full = jax.lax.all_gather(x, "tp", axis=0, tiled=True)
    h = jax.nn.gelu(full @ w1)
    return jax.lax.psum_scatter(h @ w2, "tp", scatter_dimension=0, tiled=True)


def sequence_parallel(mesh):
    """The all-gather and reduce-scatter of Megatron-SP, with and without
    equarx; the error against the unquantized run and what was rewritten."""
    from jax import shard_map

    seq, width, mlp = 512, 256, 1024
    rng = np.random.default_rng(2)

    def put(shape, scale, spec):
        a = jnp.asarray(rng.standard_normal(shape) * scale, jnp.bfloat16)
        return jax.device_put(a, NamedSharding(mesh, spec))

    x = put((seq, width), 1.0, P("tp", None))
    w1 = put((width, mlp), width ** -0.5, P(None, "tp"))
    w2 = put((mlp, width), mlp ** -0.5, P("tp", None))
    f = shard_map(sp_mlp, mesh=mesh, in_specs=(P("tp", None), P(None, "tp"), P("tp", None)),
                  out_specs=P("tp", None))
    ej.disable()
    jax.clear_caches()
    reference = np.asarray(jax.jit(f)(x, w1, w2), np.float32)
    ej.enable(platforms=("cpu",), types=("bf16", "f32"), min_payload=0)
    compiled = jax.jit(f).lower(x, w1, w2).compile()
    got = np.asarray(compiled(x, w1, w2), np.float32)
    report = ej.last_report() or []
    ej.disable()
    return {
        "rewritten": sorted(r["opcode"] for r in report if r["rewritten"]),
        "s8_collectives": count_s8_collectives(compiled.as_text()),
        "rel_rms": float(np.sqrt(np.mean((got - reference) ** 2)) / np.sqrt(np.mean(reference ** 2))),
        "finite": bool(np.isfinite(got).all()),
    }


def calibration(mesh, tp_block_args):
    """equarx.jax.calibrate on the sequence-parallel MLP (shard_map: both
    collectives measured) and on the GSPMD block (XLA inserts its
    all-reduces: unmeasured, with the reason); the profile then steers the
    rewrite, and a profile of another program is not applied. The profile
    file lives in a temporary folder, removed after."""
    with tempfile.TemporaryDirectory(prefix="equarx-calibrate-") as folder:
        return calibrate_into(mesh, tp_block_args, os.path.join(folder, "sp.profile.json"))


def calibrate_into(mesh, tp_block_args, path):
    from jax import shard_map

    rng = np.random.default_rng(3)

    def put(shape, scale, spec):
        a = jnp.asarray(rng.standard_normal(shape) * scale, jnp.bfloat16)
        return jax.device_put(a, NamedSharding(mesh, spec))

    x = put((512, 256), 1.0, P("tp", None))
    w1 = put((256, 1024), 256 ** -0.5, P(None, "tp"))
    w2 = put((1024, 256), 1024 ** -0.5, P("tp", None))
    f = shard_map(sp_mlp, mesh=mesh, in_specs=(P("tp", None), P(None, "tp"), P("tp", None)),
                  out_specs=P("tp", None))
    ej.enable(platforms=("cpu",), types=("bf16", "f32"), min_payload=0)
    profile = ej.calibrate(f, x, w1, w2, path=path, types=("bf16", "f32"))
    still_enabled = ej.enabled() is not None
    with open(path) as fh:
        on_disk = json.load(fh)
    ej.enable(platforms=("cpu",), types=("bf16", "f32"), min_payload=0, profile=path)
    jax.clear_caches()
    jax.jit(f).lower(x, w1, w2).compile()
    with_profile = ej.last_report() or []
    gspmd = ej.calibrate(tp_block, *tp_block_args, types=("bf16", "f32"))
    # The block's profile on the SP program: nothing in it fits.
    ej.enable(platforms=("cpu",), types=("bf16", "f32"), min_payload=0, profile=gspmd)
    jax.clear_caches()
    jax.jit(f).lower(x, w1, w2).compile()
    misfit = ej.last_report() or []
    ej.disable()
    return {
        "ops": [{"op_name": o["key"]["op_name"], "group_size": o["key"]["group_size"],
                 "blocks": len(o["stats"]["blocks"])} for o in profile["ops"]],
        "unmeasured": profile["unmeasured"],
        "file_matches": on_disk == profile,
        "still_enabled": still_enabled,
        "with_profile": [{"opcode": r["opcode"], "rewritten": r["rewritten"], "basis": r["basis"],
                          "prediction": r["prediction"]} for r in with_profile],
        "gspmd_ops": len(gspmd["ops"]),
        "gspmd_unmeasured": [u["reason"] for u in gspmd["unmeasured"]],
        "misfit": [{"basis": r["basis"], "prediction": r["prediction"]} for r in misfit],
    }


def main():
    devices = jax.devices()
    assert len(devices) == 8, devices
    mesh = Mesh(np.array(devices), ("tp",))
    rng = np.random.default_rng(0)

    def put(shape, scale, spec):
        a = jnp.asarray(rng.standard_normal(shape) * scale, jnp.bfloat16)
        return jax.device_put(a, NamedSharding(mesh, spec))

    params = {
        "wq": put((WIDTH, HEADS, HEAD), WIDTH**-0.5, P(None, "tp", None)),
        "wk": put((WIDTH, HEADS, HEAD), WIDTH**-0.5, P(None, "tp", None)),
        "wv": put((WIDTH, HEADS, HEAD), WIDTH**-0.5, P(None, "tp", None)),
        "wo": put((HEADS, HEAD, WIDTH), WIDTH**-0.5, P("tp", None, None)),
        "w1": put((WIDTH, MLP), WIDTH**-0.5, P(None, "tp")),
        "w2": put((MLP, WIDTH), MLP**-0.5, P("tp", None)),
    }
    x = put((BATCH, SEQ, WIDTH), 1.0, P())
    replicated = NamedSharding(mesh, P())
    result = {"library": str(equarx.library_path()), "version": equarx.version()}

    def compile_block():
        jax.clear_caches()
        t = time.time()
        compiled = jax.jit(tp_block, out_shardings=replicated).lower(params, x).compile()
        return compiled, time.time() - t

    # 1. Without equarx.
    compiled, secs = compile_block()
    reference = compiled(params, x)
    result["plain"] = {
        "compile_s": secs,
        "s8_collectives": count_s8_collectives(compiled.as_text()),
    }

    # 2. With equarx: XLA:CPU promotes bf16 all-reduces to f32 before this
    # stage, so f32 is enabled too.
    ej.enable(platforms=("cpu",), types=("bf16", "f32"), min_payload=0, pipeline_depth=1)
    result["enabled"] = {k: v for k, v in ej.enabled().items() if k != "stage"}
    compiled, secs = compile_block()
    text = compiled.as_text()
    out = compiled(params, x)
    ref = np.asarray(reference, np.float32)
    got = np.asarray(out, np.float32)
    shards = [np.asarray(s.data) for s in out.addressable_shards]
    report = ej.last_report() or []
    result["equarx"] = {
        "compile_s": secs,
        "s8_collectives": count_s8_collectives(text),
        # The hook runs after XLA's fusion: equarx outlines its ops into
        # loop fusions of its own (fuse="auto").
        "equarx_fusions": len(re.findall(r"fusion\(.*calls=%?equarx_fused", text)),
        "s8_collective_example": next(
            (l.strip()[:160] for l in text.splitlines() if S8_COLLECTIVE.search(l)), None
        ),
        "rel_rms": float(np.sqrt(np.mean((got - ref) ** 2)) / np.sqrt(np.mean(ref**2))),
        "max_abs_ref": float(np.abs(ref).max()),
        "devices_bit_identical": all(
            s.tobytes() == shards[0].tobytes() for s in shards[1:]
        ),
        "shards": len(shards),
        "rewritten": sum(1 for r in report if r["rewritten"]),
        "report": report,
    }

    # 2b. Every code format through the door, on the same block.
    result["formats"] = {}
    # int4 under the pass's own choice is declined (its error model says
    # every int4 plan would break a model); the user may still ask for one.
    ej.enable(platforms=("cpu",), types=("bf16", "f32"), min_payload=0,
              quant_format="int4")
    compile_block()
    result["int4_auto"] = [
        {"rewritten": r["rewritten"], "reason": r.get("reason", "")}
        for r in ej.last_report() or []
    ]
    for fmt in ("int8", "fp8-e4m3", "fp8-e5m2", "int4"):
        fixed = {"algorithm": "two-shot", "rotation": "hadamard"} if fmt == "int4" else {}
        ej.enable(platforms=("cpu",), types=("bf16", "f32"), min_payload=0,
                  quant_format=fmt, **fixed)
        compiled, _ = compile_block()
        text = compiled.as_text()
        out = compiled(params, x)
        got = np.asarray(out, np.float32)
        shards = [np.asarray(s.data) for s in out.addressable_shards]
        result["formats"][fmt] = {
            "s8_collectives": count_s8_collectives(text),
            "rewritten": sum(1 for r in ej.last_report() or [] if r["rewritten"]),
            "finite": bool(np.isfinite(got).all()),
            "rel_rms": float(np.sqrt(np.mean((got - ref) ** 2)) / np.sqrt(np.mean(ref**2))),
            "devices_bit_identical": all(
                s.tobytes() == shards[0].tobytes() for s in shards[1:]
            ),
        }
    # 2c. enable() with no platforms (JAX's default backend) as a context
    # manager, and the report as the CLI's table: inside the block the
    # block compiles with equarx; leaving it puts back the int4
    # registration of the loop above.
    with ej.enable(types=("bf16", "f32"), min_payload=0) as on:
        compiled, _ = compile_block()
        table = io.StringIO()
        ej.print_report(file=table)
        result["with_default_backend"] = {
            "default_backend": jax.default_backend(),
            "platforms": on.registration["platforms"],
            "s8_collectives": count_s8_collectives(compiled.as_text()),
            "report_table": table.getvalue(),
        }
    result["with_default_backend"]["restored_options"] = (ej.enabled() or {}).get("options")

    # Back to section 2's options, which section 3 expects enabled.
    ej.enable(platforms=("cpu",), types=("bf16", "f32"), min_payload=0, pipeline_depth=1)

    # 3. Invalid options are refused by enable(), with equarx's message.
    try:
        ej.enable(platforms=("cpu",), block_size=0)
        result["bad_options"] = None
    except equarx.EquarxError as e:
        result["bad_options"] = {"type": type(e).__name__, "message": str(e)}
    result["still_enabled_after_bad_options"] = ej.enabled() is not None

    # 4. An error inside the pass, during compilation: an option only the
    # pipeline can check (a pass name), so enable() accepts it.
    ej.enable(platforms=("cpu",), types=("bf16", "f32"), min_payload=0,
              disabled_passes=["no-such-pass"])
    try:
        compile_block()
        result["pass_error"] = None
    except Exception as e:  # JAX's compile error wrapping ours
        result["pass_error"] = {"type": type(e).__name__, "message": str(e)[:2000]}

    # 5. disable() restores the plain compile.
    result["disable_returned"] = ej.disable()
    compiled, secs = compile_block()
    result["after_disable"] = {
        "s8_collectives": count_s8_collectives(compiled.as_text()),
        "disable_again": ej.disable(),
    }

    # 6. The experimental native registration: a PJRT_Api without the
    # XLA-transform extension (no plugin here has it) is refused clearly;
    # a capsule is accepted as the pointer.
    class FakeApi(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                    ("version", ctypes.c_size_t * 3), ("fns", ctypes.c_void_p * 2)]

    api = FakeApi(struct_size=ctypes.sizeof(FakeApi))
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    capsule = new_capsule(ctypes.addressof(api), b"pjrt_c_api", None)
    try:
        ej.register_native(capsule, min_payload=0)
        result["native"] = None
    except equarx.EquarxError as e:
        result["native"] = {"message": str(e)}

    # 7. Huge finite activations keep replicas bit-identical: a scan over 4
    # tensor-parallel MLP layers (the psum in the while body) with every
    # 64th channel of every input 100x larger, so the activations pass 1e19.
    result["huge_activations"] = huge_activations(mesh)

    # 8. Sequence parallelism through the door: an all-gather, the MLP, a
    # reduce-scatter, no all-reduce; both collectives quantized.
    result["sequence_parallel"] = sequence_parallel(mesh)

    # 9. Calibration: a profile measured on the program's own inputs.
    result["calibration"] = calibration(mesh, (params, x))

    # 10. The hook's integer product is the HLO emission's f32 one, bit
    # for bit.
    result["hook_product"] = hook_product(mesh)

    print("JAX_DOOR_RESULT " + json.dumps(result), flush=True)


def hook_product(mesh):
    """At XLA:CPU's hook the rotated plans' products are XLA:CPU's
    YNNPACK fusions: forward, the bf16 values widened inside it; back, the
    int8 codes summed in s32. The sum comes out narrowed by equarx's last
    fusion (XLA's own narrowing folded in), and equarx's fusions run as
    tasks as XLA's do. The door before XLA emits the f32 products the
    filetests hold to the simulator. An exchange's parts are fusions,
    not bare slices. The psums must agree bit for bit,
    per plan, on heavy-tailed inputs with outlier channels, a NaN and an
    Inf."""
    spec = P("tp")
    rng = np.random.default_rng(10)
    # 512 rows a device: enough bytes that XLA:CPU splits its own widening
    # into tasks, which equarx's fusions then match.
    host = rng.standard_t(3, (8 * 512, 640)).astype(np.float32)
    host[:, ::64] *= 100.0
    host[3, 5], host[200, 7] = np.nan, np.inf
    x = jax.device_put(jnp.asarray(host, jnp.bfloat16), NamedSharding(mesh, spec))

    def f(v):
        return jax.shard_map(lambda t: jax.lax.psum(t, "tp"), mesh=mesh, in_specs=spec,
                             out_specs=spec)(v)

    out = {}
    for algorithm in ("two-shot", "ring"):
        opts = {"algorithm": algorithm, "rotation": "hadamard", "min_payload": 0,
                "types": ("bf16", "f32")}
        jax.clear_caches()
        with ej.enable(platforms=("cpu",), **opts):
            hook = jax.jit(f).lower(x).compile()
        before = ej.rewrite_lowered(jax.jit(f).lower(x), platform="cpu", **opts).compile()
        a, b = np.asarray(hook(x)), np.asarray(before(x))
        text = hook.as_text()
        entry = text[text.index("\nENTRY"):]
        out[algorithm] = {
            "ynn_products": text.count("__ynn_fusion"),
            # XLA's own narrowing of the promoted f32 sum, folded into
            # equarx's last fusion: no f32 array of the result's size left.
            "f32_results": entry.count("f32[512,640]"),
            "tasks": sum(1 for line in text.splitlines()
                         if "equarx_fusion" in line and "outer_dimension_partitions" in line),
            # Each part an exchange sends is a fusion of its own: no bare
            # slice, an op XLA:CPU compiles anew for every rewritten op.
            "bare_slices": sum(1 for line in entry.splitlines()
                               if " slice(" in line and "equarx[" in line),
            "differing_bits": int((a.view(np.uint16) != b.view(np.uint16)).sum()),
            "elements": int(a.size),
            "nan": int(np.isnan(a.astype(np.float32)).sum()),
        }
    return out


def huge_activations(mesh):
    def scan_mlp(x, w_up, w_down):
        def layer(c, w):
            return c + jax.lax.psum(jax.nn.gelu(c @ w[0]) @ w[1], "tp"), None
        return jax.lax.scan(layer, x, (w_up, w_down))[0]

    specs = (P(), P(None, None, "tp"), P(None, "tp", None))
    f = jax.jit(jax.shard_map(scan_mlp, mesh=mesh, in_specs=specs, out_specs=P(),
                              check_vma=False))
    rng = np.random.default_rng(15)

    def heavy(shape, spec, shard_last):
        a = rng.standard_normal(shape)
        a[..., np.arange(shape[-1]) % shard_last % 64 == 5] *= 100
        return jax.device_put(jnp.asarray(a, jnp.bfloat16), NamedSharding(mesh, spec))

    args = (heavy((16, 128), specs[0], 128), heavy((4, 128, 512), specs[1], 64),
            heavy((4, 512, 128), specs[2], 128))

    def run():
        jax.clear_caches()
        out = f(*args)
        shards = [np.asarray(s.data).view(np.uint16) for s in out.addressable_shards]
        values = np.asarray(out, np.float32)
        return {
            "devices_bit_identical": all((s == shards[0]).all() for s in shards[1:]),
            "differing_elements": int(np.any([s != shards[0] for s in shards], axis=0).sum()),
            "absmax": float(np.abs(values).max()),
            "finite": bool(np.isfinite(values).all()),
        }

    plain = run()
    ej.enable(platforms=("cpu",), types=("bf16", "f32"), min_payload=0)
    rewritten = run()
    rewritten["rewritten"] = sum(1 for r in ej.last_report() or [] if r["rewritten"])
    ej.disable()
    return {"plain": plain, "equarx": rewritten}


if __name__ == "__main__":
    main()
