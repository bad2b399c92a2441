"""How a request's tokens are chosen and when it stops: what travels with both halves.

``SamplingParams`` is built by the router from the OpenAI request and sent with the prefill
half (which samples the first output token when it computes the whole prompt) and with the
decode half (which samples the rest and decides when to stop). Engines sample; the decode
sidecar stops (EOS, ``stop_token_ids``, ``stop`` strings on the detokenized text) unless an
engine reports a stop of its own (``SampledToken.finish``).

Semantics every engine implements (the same as vLLM's and SGLang's, so a request behaves the
same on every backend):

- ``temperature == 0``: greedy (argmax); every other field that shapes the distribution is
  then irrelevant, except the penalties, which change the logits before the argmax.
- Otherwise the logits are, in order: penalised (``repetition_penalty`` on every token of the
  prompt and the output so far, as Hugging Face does: positive logits divided, negative ones
  multiplied; ``frequency_penalty`` times the token's count in the output and
  ``presence_penalty`` once for any token in the output, subtracted, as OpenAI does), divided by
  ``temperature``, cut by ``top_k`` (0: off), ``top_p`` (1: off) and ``min_p`` (0: off; tokens
  below ``min_p`` times the top token's probability are dropped), and sampled.
- ``seed``: the randomness for output position ``k`` depends only on ``(seed, k)``, so a split
  between workers, a re-pairing or a migration does not change a seeded output, and the same
  seed on the same prompt gives the same output. ``None``: fresh randomness.
- Log-probabilities (``logprobs``, ``top_logprobs``) are those of the model's distribution
  before any of the transformations above (vLLM's ``raw_logprobs``): ``log_softmax(logits)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

FinishReason = Literal["stop", "length"]

#: OpenAI's bound on ``top_logprobs``.
MAX_TOP_LOGPROBS = 20
#: Stop strings per request (OpenAI allows 4; vLLM and SGLang more).
MAX_STOP = 16
#: JSON's exact integers (RFC 8259 section 6): a larger one is rounded by many clients' parsers.
MAX_SEED = (1 << 53) - 1


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Output tokens at most (the request then finishes with ``"length"``).
    max_new_tokens: int = Field(ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    #: Keep the ``top_k`` most likely tokens; 0 keeps all.
    top_k: int = Field(default=0, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    #: Stop strings, matched on the detokenized output; the text returned ends before the
    #: first match (the stop string itself is not returned, as OpenAI does).
    stop: list[str] = Field(default_factory=list, max_length=MAX_STOP)
    #: Token ids that end the request (like EOS; the token counts as generated, its text is not
    #: returned).
    stop_token_ids: list[int] = Field(default_factory=list, max_length=1024)
    #: Keep generating through the model's EOS ids (benchmarks: the output length is forced).
    ignore_eos: bool = False
    #: Return each output token's log-probability.
    logprobs: bool = False
    #: And the ``top_logprobs`` most likely alternatives at each position.
    top_logprobs: int = Field(default=0, ge=0, le=MAX_TOP_LOGPROBS)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs or self.top_logprobs > 0


@dataclass(frozen=True, slots=True)
class SampledToken:
    """One output token as an engine produced it.

    ``logprob`` and ``top`` are filled when the request asked for them (``logprobs``,
    ``top_logprobs``): the chosen token's log-probability and the ``top_logprobs`` most likely
    ``(id, logprob)`` pairs, most likely first. ``finish`` is set only by an engine that stops
    requests itself (SGLang does its own stopping): this token is the request's last.
    """

    #: Read by pydantic where a model holds one (``Handoff.first``): as strict as the models.
    __pydantic_config__ = ConfigDict(extra="forbid")

    id: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()
    finish: FinishReason | None = None
