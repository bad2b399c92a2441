"""One request's output on the decode worker: detokenized text, stop conditions, log-probs.

The decode sidecar feeds every output token here as soon as the engine produced it (after each
step), so a request that stops is taken out of the batch at the next iteration boundary and
its KV is freed at once (``DecodeSide.finish_early``). A request stops, with ``finish_reason``
``"stop"``, at the first of:

- a model EOS id (``generation_config.json``), unless ``ignore_eos``, or one of
  ``stop_token_ids``: the token counts as generated (``usage``), its text is not returned;
- a ``stop`` string in the detokenized text: the text returned ends right before it (the
  token that completed it counts as generated);
- a stop the engine reported itself (``SampledToken.finish``; SGLang stops on its own).

Otherwise it ends with ``"length"`` at ``max_new_tokens``. Text that could still become a stop
string (a suffix of the text that is a prefix of one) is held back, so a stream never shows
part of a stop string; ``take`` releases what is safe and everything at the end, so the
concatenation of what ``take`` returned is the request's output text.
"""

from __future__ import annotations

from collections.abc import Iterable

from fluidpd.api.internal import TokenLogprob, TopLogprob
from fluidpd.api.sampling import FinishReason, SampledToken, SamplingParams
from fluidpd.modeldir.detokenize import IncrementalDetokenizer
from fluidpd.modeldir.text import TokenText


def held_suffix(text: str, stops: Iterable[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


class OutputStream:
    __slots__ = (
        "_detok",
        "_end_ids",
        "_ids",
        "_logprob_list",
        "_logprobs",
        "_stops",
        "_tokens",
        "count",
        "finish",
        "output_ids",
        "sent_text",
        "text",
    )

    def __init__(
        self, text: TokenText, sampling: SamplingParams, eos_ids: Iterable[int] = ()
    ) -> None:
        self._tokens = text
        self._detok = IncrementalDetokenizer(text)
        ends = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            ends.update(eos_ids)
        self._end_ids = frozenset(ends)
        self._stops = tuple(s for s in sampling.stop if s)
        self._logprobs = sampling.wants_logprobs
        #: Output tokens fed so far (what ``usage.completion_tokens`` reports).
        self.count = 0
        self.finish: FinishReason | None = None
        #: The output text so far (cut before a stop string once one matched).
        self.text = ""
        #: How much of ``text`` ``take`` has released.
        self.sent_text = 0
        #: Every output id fed so far, in order.
        self.output_ids: list[int] = []
        self._ids: list[int] = []
        self._logprob_list: list[TokenLogprob] = []

    def feed(self, tokens: Iterable[SampledToken]) -> bool:
        """Adds output tokens in order until the request stops; True once it has stopped
        (tokens after the stopping one are not the request's and are dropped)."""
        for tok in tokens:
            if self.finish is not None:
                break
            self.count += 1
            self.output_ids.append(tok.id)
            self._ids.append(tok.id)
            if self._logprobs:
                self._logprob_list.append(self._logprob(tok))
            if tok.id in self._end_ids:
                self._append(self._detok.flush())
                if self.finish is None:
                    self.finish = "stop"
                break
            self._append(self._detok.push(tok.id))
            if tok.finish is not None and self.finish is None:
                self._append(self._detok.flush())
                self.finish = tok.finish
        return self.finish is not None

    def end(self) -> None:
        """The request reached ``max_new_tokens``: release the text still held in the
        detokenizer (a stop string can still match in it)."""
        if self.finish is None:
            self._append(self._detok.flush())

    def _append(self, delta: str) -> None:
        if not delta or self.finish is not None:
            return
        start = len(self.text)
        self.text += delta
        cut = -1
        for stop in self._stops:
            at = self.text.find(stop, max(0, start - len(stop) + 1))
            if at >= 0 and (cut < 0 or at < cut):
                cut = at
        if cut >= 0:
            self.text = self.text[:cut]
            self.finish = "stop"

    def _entry(self, tid: int, logprob: float) -> TopLogprob:
        raw = self._tokens.token_bytes(tid)
        return TopLogprob(
            id=tid, token=raw.decode("utf-8", "replace"), bytes=list(raw), logprob=logprob
        )

    def _logprob(self, tok: SampledToken) -> TokenLogprob:
        chosen = self._entry(tok.id, tok.logprob if tok.logprob is not None else 0.0)
        return TokenLogprob(**chosen.model_dump(), top=[self._entry(t, lp) for t, lp in tok.top])

    def take(self, final: bool = False) -> tuple[list[int], str, list[TokenLogprob] | None]:
        """Ids, text and log-probs not yet taken. Text that may begin a stop string stays
        back unless the request has ended (``final``)."""
        end = len(self.text)
        if not final and self.finish is None and self._stops:
            end -= held_suffix(self.text, self._stops)
        text = self.text[self.sent_text : end] if end > self.sent_text else ""
        self.sent_text = max(self.sent_text, end)
        ids, self._ids = self._ids, []
        logprobs: list[TokenLogprob] | None = None
        if self._logprobs:
            logprobs, self._logprob_list = self._logprob_list, []
        return ids, text, logprobs

    def skip_sent(self) -> None:
        """Everything fed so far was already sent elsewhere (a request migrated in)."""
        self.take()
