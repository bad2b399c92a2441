"""The official openai client against the router of a real local deployment."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest


@pytest.fixture(scope="module")
def client(stack_factory: Callable[..., Any]) -> openai.OpenAI:
    stack = stack_factory("1P1D", "static")
    return openai.OpenAI(base_url=f"{stack.endpoint}/v1", api_key="unused")


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["llama-3.1-8b"]


def test_completions(client: openai.OpenAI) -> None:
    r = client.completions.create(model="llama-3.1-8b", prompt="the quick brown fox", max_tokens=7)
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 7 and r.usage.prompt_tokens == 4
    assert len(r.choices[0].text.split()) == 7
    # Token ids as the prompt (what benchmark clients send).
    r = client.completions.create(model="llama-3.1-8b", prompt=list(range(300)), max_tokens=2)
    assert r.usage is not None and r.usage.prompt_tokens == 300


def test_completions_stream(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model="llama-3.1-8b", prompt="hello", max_tokens=12, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert len(text.split()) == 12 and finish == "length"
    assert usage is not None and usage.completion_tokens == 12


def test_chat(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="llama-3.1-8b", messages=[{"role": "user", "content": "hi there"}], max_tokens=5
    )
    assert r.choices[0].message.role == "assistant"
    assert len((r.choices[0].message.content or "").split()) == 5


def test_chat_stream(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="llama-3.1-8b", messages=[{"role": "user", "content": "count"}], max_tokens=9,
        stream=True,
    )  # fmt: skip
    parts = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len("".join(parts).split()) == 9


def test_errors_are_4xx_with_messages(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.completions.create(model="gpt-17", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="context limit"):
        client.completions.create(model="llama-3.1-8b", prompt="x", max_tokens=10**7)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="llama-3.1-8b", prompt="x", max_tokens=-3)
    # The server keeps serving after bad input.
    assert client.completions.create(model="llama-3.1-8b", prompt="x", max_tokens=1).choices
