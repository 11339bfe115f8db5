"""Gemma 3's tokenizer, from the GGUF's own vocabulary.

``tokenizer.ggml.model = "llama"``: a SentencePiece BPE vocabulary with a
score per piece (higher merges first), token types, and 256 byte-fallback
pieces ``<0x00>``..``<0xFF>``. Encoding, as SentencePiece does it:

1. user-defined pieces (type 4: ``"\\n"``, ``"\\n\\n"``, runs of literal
   spaces and tabs, a few HTML tags) are cut out of the raw text first,
   leftmost and longest first, and become their own tokens;
2. in the rest, a space becomes U+2581 (no space is prefixed:
   ``add_space_prefix`` is false for Gemma 3);
3. each piece of text starts as one symbol per character; the adjacent
   pair whose concatenation is a normal piece with the best score is merged,
   again and again (ties: leftmost), until no pair is a piece;
4. a symbol that is not a piece (a character outside the vocabulary) is
   sent as its UTF-8 bytes, one ``<0xXX>`` token each.

Control pieces (``<bos>``, ``<eos>``, ``<start_of_turn>``, the unused ones)
never come out of text: a literal ``"<bos>"`` in the text is spelled with
normal pieces. Decoding is the inverse: pieces to text (U+2581 → space),
byte pieces to bytes, control pieces to nothing, then UTF-8.
"""

from __future__ import annotations

import heapq
import re

import numpy as np

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"


class Tokenizer:
    def __init__(self, pieces: list[str], scores: np.ndarray, types: np.ndarray,
                 bos: int, eos: int, add_bos: bool, add_space_prefix: bool):
        self.pieces = pieces
        self.types = np.asarray(types)
        self.bos, self.eos = bos, eos
        self.add_bos, self.add_space_prefix = add_bos, add_space_prefix
        self._merge = {p: (float(scores[i]), i) for i, p in enumerate(pieces)
                       if self.types[i] == NORMAL}
        self._user = {p: i for i, p in enumerate(pieces) if self.types[i] == USER_DEFINED}
        self._byte = {}
        for i, p in enumerate(pieces):
            if self.types[i] == BYTE:
                self._byte[int(p[3:5], 16)] = i
        if len(self._byte) != 256:
            raise ValueError(f"expected 256 byte-fallback pieces, found {len(self._byte)}")
        alternatives = sorted(self._user, key=len, reverse=True)
        self._user_re = re.compile("|".join(re.escape(p) for p in alternatives))

    @classmethod
    def from_vocab(cls, v: dict) -> "Tokenizer":
        """From :func:`weights.metadata`'s ``vocab`` (the GGUF's
        ``tokenizer.ggml.*`` fields)."""
        if v["model"] != "llama":
            raise ValueError(f"expected a SentencePiece ('llama') vocabulary, got {v['model']!r}")
        return cls(pieces=v["pieces"], scores=np.asarray(v["scores"], dtype=np.float64),
                   types=np.asarray(v["types"]), bos=v["bos"], eos=v["eos"],
                   add_bos=v["add_bos"], add_space_prefix=v["add_space_prefix"])

    # -- encoding -----------------------------------------------------------

    def encode(self, text: str, bos: bool | None = None) -> list[int]:
        """Token ids of ``text`` (with BOS first if ``bos``, by default the
        vocabulary's ``add_bos``)."""
        ids = [self.bos] if (self.add_bos if bos is None else bos) else []
        if self.add_space_prefix and text and not text.startswith(" "):
            text = " " + text
        pos = 0
        for m in self._user_re.finditer(text):
            if m.start() > pos:
                ids += self._encode_piece(text[pos:m.start()])
            ids.append(self._user[m.group()])
            pos = m.end()
        if pos < len(text):
            ids += self._encode_piece(text[pos:])
        return ids

    def _encode_piece(self, text: str) -> list[int]:
        sym = list(text.replace(" ", SPACE))
        n = len(sym)
        if n == 0:
            return []
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap: list[tuple[float, int, str, str]] = []

        def push(left: int) -> None:
            right = nxt[left]
            if left < 0 or right < 0:
                return
            hit = self._merge.get(sym[left] + sym[right])
            if hit is not None:
                # Best score first, then leftmost.
                heapq.heappush(heap, (-hit[0], left, sym[left], sym[right]))

        for i in range(n - 1):
            push(i)
        while heap:
            _, left, a, b = heapq.heappop(heap)
            right = nxt[left]
            # Stale if either side has changed since this pair was queued.
            if right < 0 or sym[left] != a or sym[right] != b:
                continue
            sym[left] = a + b
            sym[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            push(prev[left])
            push(left)
        out: list[int] = []
        i = 0
        while i >= 0:
            s = sym[i]
            hit = self._merge.get(s)
            if hit is not None:
                out.append(hit[1])
            else:
                out += [self._byte[b] for b in s.encode("utf-8")]
            i = nxt[i]
        return out

    # -- decoding -----------------------------------------------------------

    def decode(self, ids) -> str:
        buf = bytearray()
        for i in ids:
            i = int(i)
            t = self.types[i]
            if t == BYTE:
                buf.append(int(self.pieces[i][3:5], 16))
            elif t in (NORMAL, USER_DEFINED):
                buf += self.pieces[i].replace(SPACE, " ").encode("utf-8")
            # control / unknown / unused pieces spell nothing
        text = buf.decode("utf-8", errors="replace")
        if self.add_space_prefix and text.startswith(" "):
            text = text[1:]
        return text


def load() -> Tokenizer:
    from . import weights
    return Tokenizer.from_vocab(weights.metadata()["vocab"])
