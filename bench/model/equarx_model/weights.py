"""The GGUF's hyper-parameters and its tensors as float32 numpy arrays.

The checkpoint is llama.cpp's Q4_K_M quantization of Gemma 3 270M (a mix
of Q4_K, Q5_0, Q6_K, Q8_0 and F32 tensors). Every tensor is dequantized to
float32 once with ``gguf.quants.dequantize`` and cached as ``.npy`` under
``target/model-cache/weights-f32-<gguf sha prefix>/``; later runs memory-map
those. So the model evaluated here is *the dequantized Q4_K_M weights*, not
the original bf16 release: every table says so.

Layouts as stored: a matrix ``blk.N.attn_q.weight`` is ``[out, in]``
(ggml's ``ne0`` is the input dimension; the reader reverses the dims), so a
projection is ``x @ W.T``. Norm weights already hold Gemma's ``1 +``
(llama.cpp's converter adds it to every ``*norm.weight``); :func:`load`
checks that they look like it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from . import artifacts

WEIGHTS_NOTE = "weights: Q4_K_M GGUF dequantized to f32"
# Bump when the cached arrays would come out differently.
_CACHE_FORMAT = 1

LAYER_TENSORS = (
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm",
    "attn_output", "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up",
    "ffn_down", "post_ffw_norm",
)


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int
    width: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rms_eps: float
    rope_global: float
    rope_local: float
    sliding_window: int
    global_every: int
    query_scale: float
    bos: int
    eos: int

    def is_global(self, layer: int) -> bool:
        """Gemma 3: every 6th layer (5, 11, 17 here) attends globally."""
        return (layer + 1) % self.global_every == 0

    def rope_base(self, layer: int) -> float:
        return self.rope_global if self.is_global(layer) else self.rope_local


def _field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        raise ValueError(f"GGUF has no {key}")
    return f.contents()


def read_config(reader) -> Config:
    arch = _field(reader, "general.architecture")
    if arch != "gemma3":
        raise ValueError(f"expected a gemma3 GGUF, got {arch!r}")
    k, v = _field(reader, "gemma3.attention.key_length"), _field(reader, "gemma3.attention.value_length")
    if k != v:
        raise ValueError(f"key_length {k} != value_length {v}")
    return Config(
        layers=_field(reader, "gemma3.block_count"),
        width=_field(reader, "gemma3.embedding_length"),
        ffn=_field(reader, "gemma3.feed_forward_length"),
        heads=_field(reader, "gemma3.attention.head_count"),
        kv_heads=_field(reader, "gemma3.attention.head_count_kv"),
        head_dim=k,
        vocab=len(reader.fields["tokenizer.ggml.tokens"].data),
        rms_eps=float(np.float32(_field(reader, "gemma3.attention.layer_norm_rms_epsilon"))),
        rope_global=float(_field(reader, "gemma3.rope.freq_base")),
        # Not in the GGUF: Gemma 3's local layers use base 10 000
        # (rope_local_base_freq), and every 6th layer is global.
        rope_local=10_000.0,
        sliding_window=_field(reader, "gemma3.attention.sliding_window"),
        global_every=6,
        # query_pre_attn_scalar = head_dim = 256 for this model.
        query_scale=float(k) ** -0.5,
        bos=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos=_field(reader, "tokenizer.ggml.eos_token_id"),
    )


def tensor_names(cfg: Config) -> list[str]:
    names = ["token_embd.weight", "output_norm.weight"]
    for i in range(cfg.layers):
        names += [f"blk.{i}.{t}.weight" for t in LAYER_TENSORS]
    return names


def reader():
    gguf_reader, _ = artifacts.gguf_modules()
    return gguf_reader.GGUFReader(str(artifacts.model_gguf()))


def _dequantize_all(r, cfg: Config, out: Path) -> dict:
    _, quants = artifacts.gguf_modules()
    tensors = {t.name: t for t in r.tensors}
    missing = [n for n in tensor_names(cfg) if n not in tensors]
    if missing:
        raise ValueError(f"GGUF lacks tensors {missing[:5]}...")
    tmp = out.parent / (out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    kinds = {}
    for name in tensor_names(cfg):
        t = tensors[name]
        a = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        want = tuple(int(d) for d in reversed(t.shape.tolist()))
        a = a.reshape(want)
        np.save(tmp / f"{name}.npy", a)
        kinds[name] = t.tensor_type.name
    manifest = {"format": _CACHE_FORMAT, "gguf_sha256": artifacts.MODEL_SHA256,
                "gguf_lib": artifacts.GGUF_LIB.version, "types": kinds}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    tmp.replace(out)
    return manifest


def _cache_dir() -> Path:
    return artifacts.CACHE / f"weights-f32-{artifacts.MODEL_SHA256[:12]}"


def metadata() -> dict:
    """What the harness needs from the GGUF besides tensors: the config and
    the vocabulary (pieces, scores, types, flags), cached as JSON because
    parsing the GGUF's 262 144 strings takes the reader ~12 s."""
    path = artifacts.CACHE / f"metadata-{artifacts.MODEL_SHA256[:12]}.json"
    if path.is_file():
        meta = json.loads(path.read_text())
        if meta.get("format") == _CACHE_FORMAT:
            return meta
    r = reader()
    f = r.fields
    meta = {
        "format": _CACHE_FORMAT,
        "config": dataclasses.asdict(read_config(r)),
        "vocab": {
            "model": f["tokenizer.ggml.model"].contents(),
            "pieces": f["tokenizer.ggml.tokens"].contents(),
            "scores": [float(x) for x in f["tokenizer.ggml.scores"].contents()],
            "types": [int(x) for x in f["tokenizer.ggml.token_type"].contents()],
            "bos": f["tokenizer.ggml.bos_token_id"].contents(),
            "eos": f["tokenizer.ggml.eos_token_id"].contents(),
            "add_bos": bool(f["tokenizer.ggml.add_bos_token"].contents()),
            "add_space_prefix": bool(f["tokenizer.ggml.add_space_prefix"].contents()),
        },
    }
    tmp = path.with_suffix(".partial")
    tmp.write_text(json.dumps(meta))
    tmp.replace(path)
    return meta


def config() -> Config:
    return Config(**metadata()["config"])


def load() -> tuple[Config, dict[str, np.ndarray], dict]:
    """The config and every tensor as float32 (memory-mapped from the cache),
    plus the cache manifest (each tensor's GGUF type)."""
    cfg = config()
    out = _cache_dir()
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else None
    if manifest is None or manifest.get("format") != _CACHE_FORMAT:
        artifacts._log(f"dequantizing the GGUF to f32 into {out} (once)")
        import shutil
        shutil.rmtree(out, ignore_errors=True)
        manifest = _dequantize_all(reader(), cfg, out)
    w = {n: np.load(out / f"{n}.npy", mmap_mode="r") for n in tensor_names(cfg)}
    _check_shapes(cfg, w)
    return cfg, w, manifest


def _check_shapes(cfg: Config, w: dict[str, np.ndarray]) -> None:
    D, H, K, hd, F = cfg.width, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn
    want = {"token_embd.weight": (cfg.vocab, D), "output_norm.weight": (D,)}
    for i in range(cfg.layers):
        p = f"blk.{i}."
        want.update({
            p + "attn_norm.weight": (D,), p + "attn_q.weight": (H * hd, D),
            p + "attn_k.weight": (K * hd, D), p + "attn_v.weight": (K * hd, D),
            p + "attn_q_norm.weight": (hd,), p + "attn_k_norm.weight": (hd,),
            p + "attn_output.weight": (D, H * hd), p + "post_attention_norm.weight": (D,),
            p + "ffn_norm.weight": (D,), p + "ffn_gate.weight": (F, D),
            p + "ffn_up.weight": (F, D), p + "ffn_down.weight": (D, F),
            p + "post_ffw_norm.weight": (D,),
        })
    bad = {n: (w[n].shape, s) for n, s in want.items() if w[n].shape != s}
    if bad:
        raise ValueError(f"unexpected tensor shapes (got, want): {bad}")
    # Gemma's RMSNorm multiplies by (1 + w); llama.cpp's converter stores
    # 1 + w. Stored weights near 0 would mean a converter that did not.
    for n in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"):
        if not float(np.mean(w[n])) > 0.5:
            raise ValueError(f"{n} has mean {np.mean(w[n]):.3f}: expected norm weights "
                             "that already include Gemma's +1 (llama.cpp's converter)")
