"""The official openai client against the router of a real local deployment."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from fluidpd.cli.drill_cmd import FAST_PROFILE


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


def test_real_kv_bytes_move_between_sidecars(
    stack_factory: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """With the mooncake transport the hand-off moves prompt_len x bytes_per_token real bytes
    between the two sidecar processes, and the decode side verifies them."""
    pytest.importorskip("mooncake.engine", reason="mooncake-transfer-engine not importable")
    profile = tmp_path_factory.mktemp("kv") / "p.yaml"
    profile.write_text(FAST_PROFILE)
    stack = stack_factory(
        "1P1D", "static", "--profile", str(profile), "--kv-transfer", "mooncake",
        "--kv-arena-mib", "64",
    )  # fmt: skip
    client = openai.OpenAI(base_url=f"{stack.endpoint}/v1", api_key="unused")
    for n in (1, 300, 4000):
        r = client.completions.create(model="serving-path", prompt=[3] * n, max_tokens=3)
        assert r.usage is not None and r.usage.completion_tokens == 3

    def counter(url: str, name: str) -> float:
        text = httpx.get(f"{url}/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(name + "{")
        )  # fmt: skip

    assert counter(stack.workers["w0"], "fluidpd_kv_sent_bytes_total") == (1 + 300 + 4000) * 1024
    assert counter(stack.workers["w1"], "fluidpd_kv_corrupted_total") == 0
