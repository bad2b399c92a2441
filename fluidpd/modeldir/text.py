"""Token ids to text, the way the model's own tokenizer does it (decode side and logprobs).

``decode`` is ``transformers``' ``tokenizer.decode(ids, skip_special_tokens=True)`` for the
fast (``tokenizers``) tokenizers that every supported model ships: transformers calls the same
``tokenizers`` decoder and, for BPE models, skips its space clean-up. It is loaded from
``tokenizer.json`` alone, so a sidecar never imports transformers.

``token_bytes`` gives one token's exact bytes, which OpenAI's ``logprobs`` report (a byte-level
or byte-fallback token can hold part of a UTF-8 character, so its text alone would lose them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property, lru_cache
from typing import Any

from tokenizers import Tokenizer

from fluidpd.modeldir.model_dir import ModelDir, ModelDirError


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: printable stand-in character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _decoder_types(spec: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not spec:
        return []
    if spec.get("type") == "Sequence":
        return [d for sub in spec.get("decoders", []) for d in _decoder_types(sub)]
    return [spec]


def load_tokenizer(model: ModelDir) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(model.tokenizer_file))
    except Exception as exc:  # tokenizers raises a bare Exception on a bad file
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelDirError(f"{model.tokenizer_file}: cannot be loaded ({first})") from None


class TokenText:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        added = tokenizer.get_added_tokens_decoder()
        self._added = {int(i): t.content for i, t in added.items()}
        self.special_ids = frozenset(int(i) for i, t in added.items() if t.special)
        self.size = int(tokenizer.get_vocab_size(with_added_tokens=True))
        decoders = _decoder_types(json.loads(tokenizer.to_str()).get("decoder"))
        kinds = {d.get("type") for d in decoders}
        self._bytelevel = "ByteLevel" in kinds
        self._bytefallback = "ByteFallback" in kinds
        self._replace = [
            (d["pattern"]["String"], d["content"])
            for d in decoders
            if d.get("type") == "Replace" and "String" in d.get("pattern", {})
        ]
        if "Metaspace" in kinds:
            self._replace.append(("▁", " "))
        self._bytes: dict[int, bytes] = {}
        #: Byte-fallback ``<0xAB>`` tokens: the decoder renders a run of them as one UTF-8
        #: string, or as one U+FFFD per byte if the run is invalid, so a run's text is known
        #: only once a token that is neither a byte nor a (skipped, so invisible to the
        #: decoder) special token ends it.
        self.run_ids: frozenset[int] = frozenset()
        if self._bytefallback:
            self.run_ids = self.special_ids | frozenset(
                i for b in range(256) if (i := tokenizer.token_to_id(f"<0x{b:02X}>")) is not None
            )

    @classmethod
    def from_model_dir(cls, model: ModelDir) -> TokenText:
        return cls(load_tokenizer(model))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` without special tokens (transformers' ``decode``)."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def ordinary_ids(self) -> list[int]:
        """Every id that is not a special token (what a ``sim`` engine may emit)."""
        return [i for i in range(self.size) if i not in self.special_ids]

    def text_ids(self) -> list[int]:
        """Ordinary ids whose bytes alone are non-empty valid UTF-8: each adds text by itself,
        so a ``sim`` engine drawing from them streams text at every token (and client-side
        TTFT, taken at the first text, is the first token's time)."""
        out = []
        for i in self.ordinary_ids():
            if i in self.run_ids:
                continue
            raw = self.token_bytes(i)
            try:
                if raw and raw.decode("utf-8"):
                    out.append(i)
            except UnicodeDecodeError:
                continue
        return out

    @cached_property
    def text_id_set(self) -> frozenset[int]:
        """``text_ids`` as a set, computed once (membership tests per output id)."""
        return frozenset(self.text_ids())

    def token_bytes(self, tid: int) -> bytes:
        cached = self._bytes.get(tid)
        if cached is None:
            cached = self._bytes[tid] = self._token_bytes(tid)
        return cached

    def _token_bytes(self, tid: int) -> bytes:
        if tid in self._added:
            return str(self._added[tid]).encode()
        piece = self.tokenizer.id_to_token(tid)
        if piece is None:
            return b""
        if self._bytelevel:
            table = _byte_decoder()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        if self._bytefallback and len(piece) == 6 and piece.startswith("<0x") and piece[-1] == ">":
            return bytes([int(piece[3:5], 16)])
        if self._replace:
            for old, new in self._replace:
                piece = piece.replace(old, new)
            return str(piece).encode()
        return self.decode([tid]).encode()
