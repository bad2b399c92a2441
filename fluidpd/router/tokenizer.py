"""A deterministic toy tokenizer for the ``sim`` engine (real engines bring their own).

Words and punctuation become ids by a stable hash; ids decode to short pseudo-words, so a
generated stream reads as text and its length in tokens is exact.
"""

from __future__ import annotations

import re
import zlib

VOCAB = 32000
_TOKEN = re.compile(r"\w+|[^\w\s]")


def encode(text: str) -> list[int]:
    return [zlib.crc32(t.encode()) % VOCAB for t in _TOKEN.findall(text)]


def decode(ids: list[int]) -> str:
    return "".join(f" t{i}" for i in ids)
