"""OpenAI response bodies and stream chunks for completions and chat, from decode events.

The decode worker sends text deltas and, when asked, per-token log-probabilities
(``fluidpd.api.internal.TokenLogprob`` as JSON); this turns them into OpenAI's two formats:
chat's ``logprobs.content`` list (token, logprob, bytes, top_logprobs) and legacy completions'
parallel lists (tokens, token_logprobs, top_logprobs as dicts, text_offset).
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

Api = Literal["chat", "completions"]


def _as_ids(lp: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``return_tokens_as_token_ids``: every token named ``token_id:<id>``."""
    top = [{**t, "token": f"token_id:{t['id']}"} for t in lp["top"]]
    return {**lp, "token": f"token_id:{lp['id']}", "top": top}


def _chat_entry(lp: dict[str, Any]) -> dict[str, Any]:
    return {
        "token": lp["token"],
        "logprob": lp["logprob"],
        "bytes": lp["bytes"],
        "top_logprobs": [
            {"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]} for t in lp["top"]
        ],
    }


class Reply:
    """One request's response: stream chunks as events arrive, or the whole body at the end."""

    def __init__(
        self,
        api: Api,
        rid: str,
        created: int,
        model: str,
        logprobs: bool,
        prompt_tokens: int,
        token_ids: bool = False,
    ) -> None:
        self.api = api
        self.rid = rid
        self.created = created
        self.model = model
        self.logprobs = logprobs
        self.token_ids = token_ids
        self.prompt_tokens = prompt_tokens
        self._offset = 0  # completions' text_offset of the next token
        self._text: list[str] = []
        self._lps: list[dict[str, Any]] = []

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _logprobs(self, lps: list[dict[str, Any]]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        if self.token_ids:
            lps = [_as_ids(lp) for lp in lps]
        if self.api == "chat":
            return {"content": [_chat_entry(lp) for lp in lps], "refusal": None}
        tokens, offsets = [], []
        for lp in lps:
            tokens.append(lp["token"])
            offsets.append(self._offset)
            self._offset += len(lp["token"])
        return {
            "tokens": tokens,
            "token_logprobs": [lp["logprob"] for lp in lps],
            "top_logprobs": [
                {lp["token"]: lp["logprob"], **{t["token"]: t["logprob"] for t in lp["top"]}}
                for lp in lps
            ],
            "text_offset": offsets,
        }

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        }

    # -- streaming -------------------------------------------------------------------------------
    def chunk(
        self,
        text: str,
        lps: list[dict[str, Any]] | None,
        finish: str | None,
        first: bool = False,
    ) -> bytes | None:
        """An SSE ``data:`` line, or None when there is nothing to tell the client."""
        lps = lps or []
        if not (text or lps or finish or (first and self.api == "chat")):
            return None
        logprobs = self._logprobs(lps) if lps else None
        if self.api == "chat":
            delta: dict[str, Any] = {"content": text} if text or not finish else {}
            if first:
                delta["role"] = "assistant"
            choice: dict[str, Any] = {"index": 0, "delta": delta}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text}
            obj = "text_completion"
        choice["logprobs"] = logprobs
        choice["finish_reason"] = finish
        return b"data: " + orjson.dumps(self._envelope(obj, [choice])) + b"\n\n"

    def usage_chunk(self, completion_tokens: int) -> bytes:
        obj = "chat.completion.chunk" if self.api == "chat" else "text_completion"
        body = {**self._envelope(obj, []), "usage": self.usage(completion_tokens)}
        return b"data: " + orjson.dumps(body) + b"\n\n"

    # -- whole response --------------------------------------------------------------------------
    def add(self, text: str, lps: list[dict[str, Any]] | None) -> None:
        self._text.append(text)
        if lps:
            self._lps.extend(lps)

    def body(self, finish: str, completion_tokens: int) -> dict[str, Any]:
        text = "".join(self._text)
        logprobs = self._logprobs(self._lps)
        if self.api == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": finish,
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
            obj = "text_completion"
        return {**self._envelope(obj, [choice]), "usage": self.usage(completion_tokens)}
