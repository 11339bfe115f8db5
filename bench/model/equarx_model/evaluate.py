"""Next-token scoring on the Lee corpus, against two baselines.

Text: the whole corpus (300 articles, one per line) tokenized as one
string, without BOS; cut into consecutive windows of ``W - 1`` tokens, each
given a BOS in front, so a window is ``W`` tokens and scores its ``W - 1``
next-token predictions. No window sees another's text.

Each program (the f32 single-device reference, the bf16 TP program
without equarx, every equarx plan) ends at the final norm; its hidden
states ``[W, D]`` are kept (tiny), and all of them are scored together,
one chunk of positions at a time, so that the 262 144-wide logits of a
whole window never exist at once. The tied head is
``logits = h @ embed^T`` accumulated in f32: for the f32 reference with the
f32 embedding, for bf16 programs with their bf16 hidden states and the
bf16-rounded embedding (a bf16 matmul with f32 accumulation, as a user
runs the head; products of bf16 values are exact in f32).

Per program x and baseline b (the bf16 TP program of the same T, and the
f32 reference): perplexity ``exp(mean nll)``, Δppl % ``100 (ppl_x / ppl_b
- 1)`` (with its standard error from the per-token differences), top-1 agreement (``argmax`` equal), and the mean
``KL(b ‖ x) = Σ_v p_b (log p_b - log p_x)`` in nats per token.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np


def windows(ids: list[int], width: int, count: int, bos: int, skip: int = 0) -> np.ndarray:
    """``[count, width]`` windows: BOS then ``width - 1`` tokens of the
    stream ``ids`` (which must not start with BOS), the first ``skip``
    windows' worth of text skipped."""
    body = width - 1
    need = (skip + count) * body
    if len(ids) < need:
        raise ValueError(f"{count} windows of {width} (after skipping {skip}) need {need} "
                         f"tokens of text; the corpus has {len(ids)}")
    out = np.empty((count, width), np.int32)
    for n in range(count):
        start = (skip + n) * body
        out[n, 0] = bos
        out[n, 1:] = ids[start:start + body]
    return out


@functools.partial(jax.jit, static_argnames=("chunk",))
def _score(h_ref, h_prog, base_of, embed32, embed16, targets, chunk):
    """Per position: the reference's and every program's nll and argmax,
    and KL(ref ‖ prog), KL(base ‖ prog) where ``base_of[m]`` is program m's
    bf16 baseline (an index into the programs)."""
    S = h_ref.shape[0]
    pad = (-S) % chunk
    h_ref = jnp.pad(h_ref, ((0, pad), (0, 0)))
    h_prog = jnp.pad(h_prog, ((0, 0), (0, pad), (0, 0)))
    tg = jnp.pad(targets, (0, pad))
    n = (S + pad) // chunk
    h_ref = h_ref.reshape(n, chunk, -1)
    h_prog = h_prog.reshape(h_prog.shape[0], n, chunk, -1).transpose(1, 0, 2, 3)
    tg = tg.reshape(n, chunk)

    def one(args):
        hr, hp, t = args
        lr = jax.nn.log_softmax(hr @ embed32.T, axis=-1)              # [C, V]
        lp = jax.nn.log_softmax(jnp.einsum("mcd,vd->mcv", hp, embed16), axis=-1)
        def pick(l):  # log p of the target, [..., C]
            idx = jnp.broadcast_to(t, l.shape[:-1])[..., None]
            return jnp.take_along_axis(l, idx, axis=-1)[..., 0]

        kl_ref = jnp.sum(jnp.exp(lr) * (lr - lp), axis=-1)            # [M, C]
        lb = lp[base_of]
        kl_base = jnp.sum(jnp.exp(lb) * (lb - lp), axis=-1)
        return (-pick(lr), jnp.argmax(lr, -1), -pick(lp), jnp.argmax(lp, -1), kl_ref, kl_base)

    nll_r, top_r, nll_p, top_p, kl_r, kl_b = jax.lax.map(one, (h_ref, h_prog, tg))
    flat = lambda a: a.reshape(-1)[:S]  # noqa: E731
    per_prog = lambda a: a.transpose(1, 0, 2).reshape(a.shape[1], -1)[:, :S]  # noqa: E731
    return (flat(nll_r), flat(top_r), per_prog(nll_p), per_prog(top_p), per_prog(kl_r),
            per_prog(kl_b))


class Scorer:
    """Scores hidden states of many programs on one window at a time."""

    def __init__(self, embed: np.ndarray, positions_per_call: int = 256):
        self.embed32 = jnp.asarray(embed, jnp.float32)
        self.embed16 = jnp.asarray(jnp.asarray(embed, jnp.bfloat16), jnp.float32)
        self.budget = positions_per_call

    def window(self, tokens: np.ndarray, h_ref: np.ndarray, h_prog: np.ndarray,
               base_of: list[int]) -> dict[str, np.ndarray]:
        """``tokens [W]``, ``h_ref [W, D]`` (f32), ``h_prog [M, W, D]``
        (bf16 programs' states, any float type): per-position statistics
        of the ``W - 1`` predictions."""
        M = h_prog.shape[0]
        chunk = max(1, min(64, self.budget // (M + 1)))
        out = _score(jnp.asarray(h_ref[:-1], jnp.float32),
                     jnp.asarray(np.asarray(h_prog[:, :-1], np.float32)),
                     jnp.asarray(base_of, jnp.int32), self.embed32, self.embed16,
                     jnp.asarray(tokens[1:], jnp.int32), chunk=chunk)
        names = ("ref_nll", "ref_top", "nll", "top", "kl_ref", "kl_base")
        return {k: np.asarray(v) for k, v in zip(names, out)}


def metrics(stats: list[dict[str, np.ndarray]], m: int, base: int) -> dict:
    """Program ``m``'s metrics over all windows' statistics, against the f32
    reference and against program ``base`` (its bf16 TP baseline)."""
    cat = lambda k: np.concatenate([s[k] for s in stats], axis=-1)  # noqa: E731
    nll, top = cat("nll")[m], cat("top")[m]
    ref_nll, ref_top = cat("ref_nll"), cat("ref_top")
    base_nll, base_top = cat("nll")[base], cat("top")[base]
    ppl = math.exp(float(np.mean(nll.astype(np.float64))))
    ppl_ref = math.exp(float(np.mean(ref_nll.astype(np.float64))))
    ppl_base = math.exp(float(np.mean(base_nll.astype(np.float64))))
    per_window = [math.exp(float(np.mean(s["nll"][m].astype(np.float64)))) for s in stats]

    def dppl_se(other_nll):
        # Standard error of Δppl % from the per-token differences (as if
        # tokens were independent, which neighbours are not quite): how
        # finely this many predictions can resolve a perplexity change.
        d = nll.astype(np.float64) - other_nll.astype(np.float64)
        return 100.0 * math.exp(float(np.mean(d))) * float(np.std(d)) / math.sqrt(d.size)

    return {
        "tokens_scored": int(nll.size),
        "ppl": ppl,
        "ppl_per_window": per_window,
        "vs_tp_bf16": {
            "ppl": ppl_base,
            "dppl_pct": 100.0 * (ppl / ppl_base - 1.0),
            "dppl_pct_se": dppl_se(base_nll),
            "top1_agreement": float(np.mean(top == base_top)),
            "kl_mean": float(np.mean(cat("kl_base")[m].astype(np.float64))),
        },
        "vs_ref_f32": {
            "ppl": ppl_ref,
            "dppl_pct": 100.0 * (ppl / ppl_ref - 1.0),
            "dppl_pct_se": dppl_se(ref_nll),
            "top1_agreement": float(np.mean(top == ref_top)),
            "kl_mean": float(np.mean(cat("kl_ref")[m].astype(np.float64))),
        },
    }


def reference_ppl(stats: list[dict[str, np.ndarray]]) -> float:
    return math.exp(float(np.mean(np.concatenate([s["ref_nll"] for s in stats]).astype(np.float64))))
