"""Incremental detokenization: text deltas that add up to ``decode(all ids)``, byte for byte.

A token need not end on a character boundary (byte-level BPE splits UTF-8 characters between
tokens; byte-fallback tokenizers spell characters as ``<0xAB>`` byte tokens), and decoders
are not additive (Metaspace/Strip decoders treat the first token of a sequence specially),
so decoding each token alone is wrong. This is the prefix/read-offset algorithm of vLLM's
detokenizer and of ``tokenizers``' ``DecodeStream``: keep a short window of ids starting at
the last point where the text was complete (``prefix``), decode the window with and without
the ids not yet emitted (``read``), and emit the difference once it no longer ends in an
incomplete character (U+FFFD). ``flush`` emits what is still held at the end of the output,
replacement characters included, exactly as a one-shot decode renders it.

One addition makes it exact where those two are not: a byte-fallback decoder renders a run of
``<0xAB>`` tokens as a whole, and a later byte that makes the run invalid UTF-8 turns the
whole run into replacement characters, text already valid included (and a skipped special
token does not end a run). Text is therefore held while the output ends in a byte or special
token, so the window only ever starts after a token that ends a run.
"""

from __future__ import annotations

from fluidpd.modeldir.text import TokenText

_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    __slots__ = ("_prefix", "_prefix_text", "_read", "_text", "ids")

    def __init__(self, text: TokenText) -> None:
        self._text = text
        self.ids: list[int] = []
        #: ids[_prefix:_read] were emitted and decode to ``_prefix_text``; context for the rest.
        self._prefix = 0
        self._read = 0
        self._prefix_text = ""

    def push(self, tid: int) -> str:
        """Adds one token; returns the text it completes (often empty, e.g. for part of a
        character or a special token)."""
        self.ids.append(tid)
        if tid in self._text.run_ids:
            return ""
        window = self._text.decode(self.ids[self._prefix :])
        if len(window) <= len(self._prefix_text) or window.endswith(_INCOMPLETE):
            return ""
        delta = window[len(self._prefix_text) :]
        self._prefix, self._read = self._read, len(self.ids)
        self._prefix_text = self._text.decode(self.ids[self._prefix : self._read])
        return delta

    def flush(self) -> str:
        """The text still held back (the output ended inside a character, or on tokens that
        never completed one); afterwards everything pushed has been emitted."""
        if self._read == len(self.ids):
            return ""
        window = self._text.decode(self.ids[self._prefix :])
        delta = window[len(self._prefix_text) :]
        self._prefix = self._read = len(self.ids)
        self._prefix_text = ""
        return delta
