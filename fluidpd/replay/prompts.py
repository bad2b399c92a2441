"""Deterministic prompts and OpenAI request bodies for a replayed workload.

A trace gives only token counts, so prompts are synthesized:

``ids``
    A list of token ids of exactly the trace's prompt length, for ``/v1/completions`` (FluidPD,
    SGLang and vLLM accept ``prompt`` as a list of ints). The prompt length the server sees is
    therefore the trace's, independent of the tokenizer.
``text``
    N space-separated common English words (N = the trace's prompt length). Most BPE tokenizers
    encode `` word`` as one token, so the length is close to, not exactly, the trace's; chat
    templates add a few tokens more. This is the only form ``/v1/chat/completions`` takes.

Request ``i`` is drawn from ``numpy.random.default_rng((seed, i))``: the same request gets the same
prompt whatever ``--num-requests`` cuts off, and nothing depends on the order bodies are built in.
Repeating a replay with the same seed sends identical prompts, so a server with a prefix cache
(SGLang's radix cache) must be flushed or restarted between replays that are to be compared.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import numpy as np

Api = Literal["completions", "chat"]
PromptFormat = Literal["ids", "text"]

API_PATHS: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

# Ids of ordinary tokens in every vocabulary served: past the special and byte tokens at the
# low end of most vocabularies (Llama-2's byte-fallback tokens end at 258, a byte-level BPE's
# 256 base bytes come first) and below 1,000, so inside the smallest vocabulary FluidPD serves
# (the embedded default's 1,024 ids) as well as Llama's and Qwen's. Servers check prompt ids
# against their vocabulary, so ids beyond it would be refused.
TOKEN_ID_LOW = 300
TOKEN_ID_HIGH = 1000

# One-token words in the common BPE vocabularies (GPT-2/Llama-3/Qwen encode " word" as one token).
# fmt: off
_WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at",
    "from", "his", "her", "he", "she", "it", "they", "we", "you", "this", "are", "be", "had",
    "not", "but", "have", "were", "which", "one", "all", "their", "there", "been", "has", "when",
    "who", "will", "more", "no", "if", "out", "so", "said", "what", "up", "its", "about", "into",
    "than", "them", "can", "only", "other", "new", "some", "could", "time", "these", "two", "may",
    "then", "do", "first", "any", "my", "now", "such", "like", "our", "over", "man", "me", "even",
    "most", "made", "after", "also", "did", "many", "before", "must", "through", "back", "years",
    "where", "much", "your", "way", "well", "down", "should", "because", "each", "just", "those",
    "people", "how", "too", "little", "state", "good", "very", "make", "world", "still", "own",
    "see", "men", "work", "long", "get", "here", "between", "both", "life", "being", "under",
    "never", "day", "same", "another", "know", "while", "last", "might", "us", "great", "old",
    "year", "off", "come", "since", "against", "go", "came", "right", "used", "take", "three",
)
# fmt: on
_WORD_ARRAY = np.array(_WORDS)


def _rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng((seed, index))


def prompt_ids(seed: int, index: int, length: int) -> list[int]:
    """``length`` token ids for request ``index`` (deterministic in ``seed`` and ``index``)."""
    ids: list[int] = _rng(seed, index).integers(TOKEN_ID_LOW, TOKEN_ID_HIGH, size=length).tolist()
    return ids


def prompt_text(seed: int, index: int, length: int) -> str:
    """``length`` space-separated words for request ``index`` (deterministic)."""
    picks = _rng(seed, index).integers(0, len(_WORDS), size=length)
    return " ".join(_WORD_ARRAY[picks].tolist())


def request_body(
    *,
    api: Api,
    model: str,
    prompt_format: PromptFormat,
    seed: int,
    index: int,
    prompt_len: int,
    max_tokens: int,
) -> bytes:
    """The JSON body of request ``index``, already encoded so that the send path only copies
    bytes (bodies are built ahead of their send time, off the latency-critical path)."""
    body: dict[str, Any] = {"model": model}
    if api == "chat":
        # Chat has no token-id form; the caller rejects ids + chat before any request is built.
        body["messages"] = [{"role": "user", "content": prompt_text(seed, index, prompt_len)}]
    elif prompt_format == "ids":
        body["prompt"] = prompt_ids(seed, index, prompt_len)
    else:
        body["prompt"] = prompt_text(seed, index, prompt_len)
    body.update(
        {
            "max_tokens": max_tokens,
            # Greedy, as sglang.bench_serving sends it: the output length is forced anyway.
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            # SGLang and vLLM honour it, so the output length is the trace's; others ignore it.
            "ignore_eos": True,
        }
    )
    return json.dumps(body, separators=(",", ":")).encode()
