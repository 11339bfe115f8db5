"""A float64 numpy forward of Gemma 3, written apart from :mod:`gemma`.

It reads the GGUF tensors directly (``[out, in]`` matrices, no re-layout)
and spells every step out per head, so that a mistake in the JAX forward's
layouts or einsums does not repeat here. Used on a short window only, as
the sanity check that the JAX f32 forward computes this model.
"""

from __future__ import annotations

import math

import numpy as np

from .weights import Config


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _rope(x, base):
    """x ``[S, hd]``: rotate pairs (j, j + hd/2) by position * base^(-2j/hd)."""
    seq, hd = x.shape
    half = hd // 2
    theta = np.arange(seq)[:, None] * base ** (-2.0 * np.arange(half)[None, :] / hd)
    c, s = np.cos(theta), np.sin(theta)
    x1, x2 = x[:, :half], x[:, half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=1)


def forward(cfg: Config, w: dict[str, np.ndarray], tokens: list[int]) -> np.ndarray:
    """Final hidden states ``[S, D]`` (after ``output_norm``), float64."""
    f = lambda name: np.asarray(w[name], np.float64)  # noqa: E731
    seq, hd, eps = len(tokens), cfg.head_dim, cfg.rms_eps
    x = np.asarray(w["token_embd.weight"][np.asarray(tokens)], np.float64)
    x = x * math.sqrt(cfg.width)
    for i in range(cfg.layers):
        b = f"blk.{i}."
        h = _rms(x, f(b + "attn_norm.weight"), eps)
        q_all = h @ f(b + "attn_q.weight").T          # [S, H*hd]
        k = _rms(h @ f(b + "attn_k.weight").T, f(b + "attn_k_norm.weight"), eps)
        v = h @ f(b + "attn_v.weight").T               # [S, hd], the one KV head
        base = cfg.rope_base(i)
        k = _rope(k, base)
        heads = []
        for head in range(cfg.heads):
            q = _rms(q_all[:, head * hd:(head + 1) * hd], f(b + "attn_q_norm.weight"), eps)
            q = _rope(q, base)
            scores = (q @ k.T) * cfg.query_scale
            s_pos, t_pos = np.indices((seq, seq))  # query, key
            hidden = t_pos > s_pos
            if not cfg.is_global(i):
                hidden |= s_pos - t_pos >= cfg.sliding_window
            scores[hidden] = -np.inf
            scores -= scores.max(axis=1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=1, keepdims=True)
            heads.append(p @ v)
        attn = np.concatenate(heads, axis=1) @ f(b + "attn_output.weight").T
        x = x + _rms(attn, f(b + "post_attention_norm.weight"), eps)
        h = _rms(x, f(b + "ffn_norm.weight"), eps)
        m = _gelu_tanh(h @ f(b + "ffn_gate.weight").T) * (h @ f(b + "ffn_up.weight").T)
        x = x + _rms(m @ f(b + "ffn_down.weight").T, f(b + "post_ffw_norm.weight"), eps)
    return _rms(x, f("output_norm.weight"), eps)


def log_probs(w: dict[str, np.ndarray], hidden: np.ndarray, chunk: int = 16384) -> np.ndarray:
    """``log_softmax(hidden @ embed^T)`` in float64, ``[S, V]`` (for a short
    window; the embedding is converted a slice at a time)."""
    embed = w["token_embd.weight"]
    logits = np.concatenate(
        [hidden @ np.asarray(embed[i:i + chunk], np.float64).T
         for i in range(0, embed.shape[0], chunk)], axis=1)
    logits -= logits.max(axis=1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
