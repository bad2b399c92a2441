"""The OpenAI request shapes the router accepts (validated; unknown fields are ignored as
OpenAI-compatible servers do)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    ignore_eos: bool = False


class CompletionRequest(_Common):
    #: Text, or token ids (what benchmark clients send to get exact prompt lengths).
    prompt: str | list[int] | list[str] = Field(min_length=1)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, object]] | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
