"""Gemma 3 270M in JAX: one forward, run on one device or tensor-parallel.

The layer (Gemma 3; llama.cpp's ``gemma3`` graph and transformers'
``Gemma3`` agree on these facts)::

    x = embed[tokens] * sqrt(640)
    per layer i (18):
        h = rms(x) * attn_norm
        q, k, v = h Wq, h Wk, h Wv          4 query heads, 1 KV head, dim 256
        q, k = rms(q) * q_norm, rms(k) * k_norm      (per head)
        q, k = rope(q), rope(k)             base 1e6 on global layers (5, 11, 17),
                                            1e4 on the others
        a = softmax(q k^T / 16 + mask) v    causal; local layers also see only
                                            the last 512 positions
        x = x + rms(a Wo) * post_attention_norm
        h = rms(x) * ffn_norm
        x = x + rms((gelu_tanh(h Wgate) * (h Wup)) Wdown) * post_ffw_norm
    out = rms(x) * output_norm;  logits = out embed^T   (tied, no softcap)

The norm weights are stored with Gemma's ``1 +`` already in (see
:mod:`weights`). RoPE rotates the two halves of each head (NEOX order: the
GGUF converter does not permute Gemma's q/k).

Tensor parallelism is Megatron's: ``q`` (by heads), ``gate`` and ``up`` are
column-parallel, ``o`` and ``down`` row-parallel and each followed by a
``psum`` over mesh axis ``'tp'``; ``k``/``v`` (one KV head), embedding,
norms and the head are replicated, every device computing them. So a
forward holds exactly 2 psums per layer, 36 in all. :func:`forward` is the
one description; the single-device program passes an identity for the
reduction, the tensor-parallel one ``lax.psum``.

Precision: matmuls and the residual stream in the program's dtype (f32, or
bf16 as a user would run TP); RMS norms, RoPE and the softmax in f32, cast
back (as transformers does); attention logits accumulate in f32.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .weights import Config

AXIS = "tp"


# -- parameters -------------------------------------------------------------

def model_params(cfg: Config, w: dict[str, np.ndarray]) -> dict:
    """The GGUF tensors (float32 numpy, ``[out, in]``) in the layouts the
    forward uses: per-head ``wq [H, D, hd]``, ``wo [H, hd, D]``; ``wk``,
    ``wv [D, hd]`` (one KV head); ``gate``/``up [D, F]``, ``down [F, D]``."""
    if cfg.kv_heads != 1:
        raise ValueError("this forward is written for one KV head (Gemma 3 270M)")
    D, H, hd = cfg.width, cfg.heads, cfg.head_dim
    layers = []
    for i in range(cfg.layers):
        g = lambda t: np.asarray(w[f"blk.{i}.{t}.weight"], np.float32)  # noqa: E731
        layers.append({
            "attn_norm": g("attn_norm"),
            "wq": g("attn_q").reshape(H, hd, D).transpose(0, 2, 1).copy(),
            "wk": g("attn_k").T.copy(),
            "wv": g("attn_v").T.copy(),
            "q_norm": g("attn_q_norm"),
            "k_norm": g("attn_k_norm"),
            "wo": g("attn_output").reshape(D, H, hd).transpose(1, 2, 0).copy(),
            "post_attn_norm": g("post_attention_norm"),
            "ffn_norm": g("ffn_norm"),
            "gate": g("ffn_gate").T.copy(),
            "up": g("ffn_up").T.copy(),
            "down": g("ffn_down").T.copy(),
            "post_ffn_norm": g("post_ffw_norm"),
        })
    return {"embed": np.asarray(w["token_embd.weight"], np.float32),
            "final_norm": np.asarray(w["output_norm.weight"], np.float32),
            "layers": layers}


def cast_params(params: dict, dtype) -> dict:
    """Matrices and the embedding in ``dtype``; norm weights stay f32 (they
    multiply in the f32 norm)."""
    def leaf(path, a):
        name = path[-1].key if hasattr(path[-1], "key") else ""
        return a if "norm" in name else np.asarray(a).astype(dtype)
    return jax.tree_util.tree_map_with_path(leaf, params)


def param_specs(params: dict) -> dict:
    """Megatron's layout over ``'tp'``: column-parallel q (heads), gate, up;
    row-parallel o (heads), down; the rest replicated."""
    sharded = {"wq": P(AXIS), "wo": P(AXIS), "gate": P(None, AXIS), "up": P(None, AXIS),
               "down": P(AXIS)}

    def spec(path, _):
        name = path[-1].key if hasattr(path[-1], "key") else ""
        return sharded.get(name, P())
    return jax.tree_util.tree_map_with_path(spec, params)


# -- the forward ------------------------------------------------------------

def rope_tables(cfg: Config, seq: int) -> dict[float, tuple[np.ndarray, np.ndarray]]:
    """cos/sin ``[seq, hd/2]`` per RoPE base, computed in f64, stored f32."""
    half = cfg.head_dim // 2
    out = {}
    for base in sorted({cfg.rope_base(i) for i in range(cfg.layers)}):
        inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / cfg.head_dim)
        ang = np.arange(seq, dtype=np.float64)[:, None] * inv[None, :]
        out[base] = (np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32))
    return out


def attention_masks(cfg: Config, seq: int) -> dict[bool, np.ndarray]:
    """``[seq, seq]`` booleans, query by key: causal for global layers,
    causal and within the sliding window for local ones."""
    i = np.arange(seq)[:, None]
    j = np.arange(seq)[None, :]
    causal = j <= i
    return {True: causal, False: causal & (i - j < cfg.sliding_window)}


def _rms(x, w, eps):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return y * w


def _rope(x32, cos, sin):
    half = x32.shape[-1] // 2
    a, b = x32[..., :half], x32[..., half:]
    return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def forward(params: dict, tokens, cfg: Config, reduce=lambda v: v, capture: bool = False):
    """Final hidden states ``[B, S, D]`` (after ``output_norm``) of
    ``tokens [B, S]``; with ``capture``, also the list of every reduction's
    input (this device's operand of each psum), in program order."""
    dtype = params["embed"].dtype
    seq = tokens.shape[1]
    ropes = rope_tables(cfg, seq)
    masks = attention_masks(cfg, seq)
    eps = cfg.rms_eps
    operands = []

    def reduced(v):
        if capture:
            operands.append(v)
        return reduce(v)

    x = jnp.take(params["embed"], tokens, axis=0) * jnp.asarray(math.sqrt(cfg.width), dtype)
    for i, p in enumerate(params["layers"]):
        cos, sin = ropes[cfg.rope_base(i)]
        mask = masks[cfg.is_global(i)]
        h = _rms(x, p["attn_norm"], eps).astype(dtype)
        q = jnp.einsum("bsd,hdk->bhsk", h, p["wq"])
        k = jnp.einsum("bsd,dk->bsk", h, p["wk"])
        v = jnp.einsum("bsd,dk->bsk", h, p["wv"])
        q = _rope(_rms(q, p["q_norm"], eps), cos, sin) * cfg.query_scale
        k = _rope(_rms(k, p["k_norm"], eps), cos, sin)
        s = jnp.einsum("bhsk,btk->bhst", q.astype(dtype), k.astype(dtype),
                       preferred_element_type=jnp.float32)
        s = jnp.where(mask, s, -jnp.inf)
        a = jax.nn.softmax(s, axis=-1).astype(dtype)
        ctx = jnp.einsum("bhst,btk->bhsk", a, v)
        o = reduced(jnp.einsum("bhsk,hkd->bsd", ctx, p["wo"]))
        x = x + _rms(o, p["post_attn_norm"], eps).astype(dtype)
        h = _rms(x, p["ffn_norm"], eps).astype(dtype)
        m = jax.nn.gelu(h @ p["gate"], approximate=True) * (h @ p["up"])
        d = reduced(m @ p["down"])
        x = x + _rms(d, p["post_ffn_norm"], eps).astype(dtype)
    out = _rms(x, params["final_norm"], eps).astype(dtype)
    return (out, operands) if capture else out


# -- programs ---------------------------------------------------------------

def single_device(cfg: Config):
    """The jitted one-device forward: ``f(params, tokens) -> [B, S, D]``."""
    return jax.jit(functools.partial(forward, cfg=cfg))


def mesh_of(tp: int) -> Mesh:
    devices = jax.devices()
    if len(devices) < tp:
        raise RuntimeError(f"T = {tp} needs {tp} devices, JAX has {len(devices)}: set "
                           "XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts")
    return Mesh(np.array(devices[:tp]), (AXIS,))


def tensor_parallel(cfg: Config, mesh: Mesh, params: dict, capture: bool = False):
    """The jitted Megatron forward over ``mesh``: ``f(params, tokens)`` gives
    every device's copy of the final hidden states, ``[T, B, S, D]`` (so that
    replicas can be compared bit for bit); with ``capture``, also every
    device's psum operands, ``[T, 36, B, S, D]``."""
    tp = mesh.shape[AXIS]
    for what, n in (("query heads", cfg.heads), ("FFN width", cfg.ffn)):
        if n % tp:
            raise ValueError(f"T = {tp} does not divide the {what} ({n})")

    def body(p, tokens):
        r = forward(p, tokens, cfg, reduce=lambda v: jax.lax.psum(v, AXIS), capture=capture)
        if capture:
            h, ops = r
            return h[None], jnp.stack(ops)[None]
        return r[None]

    out_specs = (P(AXIS), P(AXIS)) if capture else P(AXIS)
    f = jax.shard_map(body, mesh=mesh, in_specs=(param_specs(params), P()), out_specs=out_specs)
    return jax.jit(f)


def put_sharded(params: dict, mesh: Mesh) -> dict:
    """``params`` placed with Megatron's shardings on ``mesh``."""
    shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), param_specs(params))
    return jax.device_put(params, shardings)


def put_tokens(tokens: np.ndarray, mesh: Mesh):
    return jax.device_put(jnp.asarray(tokens, jnp.int32), NamedSharding(mesh, P()))
