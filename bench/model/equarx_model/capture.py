"""The inputs of the 36 all-reduces, for measuring what equarx quantizes.

:func:`gemma.tensor_parallel` with ``capture=True`` also returns every
device's operand of every psum (``[T, 36, B, S, D]``, program order: layer
0 attention output, layer 0 MLP down, layer 1 ...). :func:`write_npz`
saves them, one array per op ``[T, B*S, D]`` named
``L{layer:02d}_{attn_out|mlp_down}``, with the tokens and a JSON note; the
statistics equarx's error model cares about come with them
(:func:`block_stats`).
"""

from __future__ import annotations

import json

import numpy as np

from . import gemma


def op_names(layers: int) -> list[str]:
    return [f"L{i:02d}_{kind}" for i in range(layers) for kind in ("attn_out", "mlp_down")]


def block_stats(x: np.ndarray, block: int = 64) -> dict:
    """Over blocks of ``block`` consecutive elements of the last axis (the
    blocks equarx scales): the crest factor squared ``κ² = max² / mean²``
    (mean over blocks, and its 50/90/99 % quantiles) and the excess
    kurtosis of the values."""
    v = np.asarray(x, np.float64)
    b = v.reshape(-1, block)
    ms = np.mean(b * b, axis=1)
    ok = ms > 0
    k2 = (np.max(b * b, axis=1)[ok] / ms[ok])
    flat = v.reshape(-1)
    c = flat - flat.mean()
    kurt = float(np.mean(c ** 4) / np.mean(c ** 2) ** 2 - 3.0)
    q = np.quantile(k2, [0.5, 0.9, 0.99]) if k2.size else [np.nan] * 3
    return {"crest_sq_mean": float(np.mean(k2)) if k2.size else float("nan"),
            "crest_sq_p50": float(q[0]), "crest_sq_p90": float(q[1]),
            "crest_sq_p99": float(q[2]), "excess_kurtosis": kurt,
            "rms": float(np.sqrt(np.mean(flat ** 2)))}


def run(cfg, mesh, params_dtype, sharded, tokens: np.ndarray):
    """Every device's final hidden states and psum operands for ``tokens``."""
    f = gemma.tensor_parallel(cfg, mesh, params_dtype, capture=True)
    h, ops = f(sharded, gemma.put_tokens(tokens, mesh))
    return np.asarray(h), np.asarray(ops)


def write_npz(path: str, cfg, operands: np.ndarray, tokens: np.ndarray, note: dict) -> dict:
    """Saves ``operands [T, 36, B, S, D]``; returns per-op statistics (also
    stored, as JSON in ``stats``)."""
    names = op_names(cfg.layers)
    if operands.shape[1] != len(names):
        raise ValueError(f"expected {len(names)} psum operands, got {operands.shape[1]}")
    arrays, stats = {}, {}
    T = operands.shape[0]
    for k, name in enumerate(names):
        # f32 holds every bf16 value exactly (and .npz has no bf16 type).
        a = np.asarray(operands[:, k], np.float32).reshape(T, -1, cfg.width)
        arrays[name] = a
        stats[name] = block_stats(a)
    meta = dict(note, ops=names, layout="[T, B*S, D] per op; device-major",
                dtype=f"{operands.dtype} (stored as f32, exactly)")
    np.savez(path, tokens=tokens, meta=json.dumps(meta), stats=json.dumps(stats), **arrays)
    return stats
