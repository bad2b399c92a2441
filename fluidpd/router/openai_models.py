"""The OpenAI request shapes the router accepts, and their sampling parameters.

Validated strictly: a field the router does not know, or knows and does not implement
(``tools``, ``response_format``, ``echo``, ``n > 1``, ...), is a 400 naming the field rather
than being silently ignored, since ignoring it would return something the client did not ask
for. Besides OpenAI's fields, the sampling extensions vLLM and SGLang accept (``top_k``,
``min_p``, ``repetition_penalty``, ``stop_token_ids``, ``ignore_eos``) are taken, so benchmark
clients written for them work unchanged.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fluidpd.api.sampling import MAX_SEED, MAX_STOP, MAX_TOP_LOGPROBS, SamplingParams


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False
    #: Accepted for compatibility; usage is reported only at the end either way.
    continuous_usage_stats: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, json_schema_extra={"const": 1})
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    #: -1 or 0: off (vLLM and SGLang clients send -1).
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, le=10)
    stop: str | list[str] | None = Field(default=None, json_schema_extra={"anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": MAX_STOP},
        {"type": "null"},
    ]})  # fmt: skip
    stop_token_ids: list[int] | None = Field(default=None, max_length=1024)
    ignore_eos: bool = False
    #: vLLM's extension: log-prob entries name tokens as ``token_id:<id>`` (exact ids).
    return_tokens_as_token_ids: bool = False
    #: Accepted and ignored, as OpenAI uses it only for abuse monitoring.
    user: str | None = None
    logit_bias: dict[str, float] | None = Field(default=None, json_schema_extra={
        "anyOf": [{"type": "object", "maxProperties": 0}, {"type": "null"}]
    })  # fmt: skip

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n = 1 is supported")
        return n

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        items = [stop] if isinstance(stop, str) else stop or []
        if len(items) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        if any(not s for s in items):
            raise ValueError("stop strings must not be empty")
        return stop

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, ids: list[int] | None) -> list[int] | None:
        if ids and min(ids) < 0:
            raise ValueError("token ids are non-negative")
        return ids

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        if bias:
            raise ValueError("not supported")
        return bias

    def sampling(self, max_new_tokens: int, logprobs: bool, top_logprobs: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        given: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "seed": self.seed,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "repetition_penalty": self.repetition_penalty,
        }
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            top_k=max(0, self.top_k or 0),
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            **{k: v for k, v in given.items() if v is not None},
        )


class CompletionRequest(_Common):
    #: Text, or token ids (what benchmark clients send to get exact prompt lengths); a batch
    #: of one is taken, larger batches are refused.
    prompt: str | list[int] | list[str] | list[list[int]] = Field(min_length=1, json_schema_extra={
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "integer"}, "minItems": 1},
            {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
            {"type": "array", "minItems": 1, "maxItems": 1,
             "items": {"type": "array", "items": {"type": "integer"}, "minItems": 1}},
        ]
    })  # fmt: skip
    #: Legacy completions: return this many top alternatives (and each token's log-prob).
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = Field(default=False, json_schema_extra={"const": False})
    best_of: int | None = Field(default=None, json_schema_extra={"enum": [1, None]})
    suffix: str | None = Field(default=None, json_schema_extra={
        "anyOf": [{"type": "string", "maxLength": 0}, {"type": "null"}]
    })  # fmt: skip

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, echo: bool) -> bool:
        if echo:
            raise ValueError("not supported")
        return echo

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, best_of: int | None) -> int | None:
        if best_of not in (None, 1):
            raise ValueError("only best_of = 1 is supported")
        return best_of

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, suffix: str | None) -> str | None:
        if suffix:
            raise ValueError("not supported")
        return suffix


_TEXT_PART: Any = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}


class ChatMessage(BaseModel):
    #: Further keys (``name``, ``tool_calls``, ...) go to the chat template as they are.
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, object]] | None = Field(default=None, json_schema_extra={
        "anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}, {"type": "null"}]
    })  # fmt: skip

    @field_validator("content")
    @classmethod
    def _text_parts(
        cls, content: str | list[dict[str, object]] | None
    ) -> str | list[dict[str, object]] | None:
        if isinstance(content, list):
            for part in content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError("only text content parts are supported")
        return content


class ChatCompletionRequest(_Common):
    #: OpenAI's rule: ``top_logprobs`` (above 0) only with ``logprobs: true``.
    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
        {"properties": {"top_logprobs": {"enum": [0, None]}}},
    ]})  # fmt: skip

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
