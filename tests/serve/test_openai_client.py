"""The official openai client against the router of a real local deployment (sim engine, the
embedded default tokenizer: counts and texts are the real tokenizer's)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fluidpd.cli.drill_cmd import FAST_PROFILE
from fluidpd.modeldir.embedded import EMBEDDED_DIR

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tok() -> Any:
    return transformers.AutoTokenizer.from_pretrained(str(EMBEDDED_DIR))


@pytest.fixture(scope="module")
def client(stack_factory: Callable[..., Any]) -> openai.OpenAI:
    stack = stack_factory("1P1D", "static")
    return openai.OpenAI(base_url=f"{stack.endpoint}/v1", api_key="unused")


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["llama-3.1-8b"]


def test_completions(client: openai.OpenAI, tok: Any) -> None:
    prompt = "the quick brown fox 😀 東京"
    r = client.completions.create(model="llama-3.1-8b", prompt=prompt, max_tokens=7)
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 7
    assert r.usage.prompt_tokens == len(tok(prompt)["input_ids"])
    assert r.choices[0].text  # the sim engine's tokens are real vocabulary, decoded
    # Token ids as the prompt (what benchmark clients send).
    r = client.completions.create(model="llama-3.1-8b", prompt=list(range(300)), max_tokens=2)
    assert r.usage is not None and r.usage.prompt_tokens == 300


def test_completions_stream(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": "llama-3.1-8b", "prompt": "hello", "max_tokens": 12,
                              "temperature": 0}  # fmt: skip
    whole = client.completions.create(**kwargs).choices[0].text
    stream = client.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    )
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert text == whole and finish == "length"  # greedy: the same tokens both times
    assert usage is not None and usage.completion_tokens == 12


def test_chat(client: openai.OpenAI, tok: Any) -> None:
    messages: list[Any] = [{"role": "user", "content": "hi there"}]
    r = client.chat.completions.create(model="llama-3.1-8b", messages=messages, max_tokens=5)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.usage is not None and r.usage.completion_tokens == 5
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert r.usage.prompt_tokens == len(ids)


def test_chat_stream(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": "llama-3.1-8b", "max_tokens": 9, "temperature": 0,
                              "messages": [{"role": "user", "content": "count"}]}  # fmt: skip
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    stream = client.chat.completions.create(**kwargs, stream=True)
    chunks = [c for c in stream if c.choices]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason == "length"


def test_errors_are_4xx_with_messages(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.completions.create(model="gpt-17", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="context limit"):
        client.completions.create(model="llama-3.1-8b", prompt="x", max_tokens=10**7)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="llama-3.1-8b", prompt="x", max_tokens=-3)
    with pytest.raises(openai.BadRequestError, match="400 - n: only n = 1 is supported"):
        client.completions.create(model="llama-3.1-8b", prompt="x", max_tokens=1, n=2)
    # The server keeps serving after bad input.
    assert client.completions.create(model="llama-3.1-8b", prompt="x", max_tokens=1).choices


@pytest.mark.parametrize("transport", ["mooncake", "shm"])
def test_real_kv_bytes_move_between_sidecars(
    stack_factory: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory, transport: str
) -> None:
    """The hand-off moves prompt_len x bytes_per_token real bytes between the two sidecar
    processes and the decode side verifies them, also when a burst's KV is larger than the
    decode side's arena: reservations wait for room (none is sent without a destination), and
    room goes back as soon as the engine has loaded it."""
    if transport == "mooncake":
        pytest.importorskip("mooncake.engine", reason="mooncake-transfer-engine not importable")
    profile = tmp_path_factory.mktemp("kv") / "p.yaml"
    # A 4 MiB arena holds one request at the context limit, and one 3,000-token prompt at once.
    profile.write_text(FAST_PROFILE.replace("context_limit: 32768", "context_limit: 4096"))
    stack = stack_factory(
        "1P1D", "static", "--profile", str(profile), "--kv-transfer", transport,
        "--kv-arena-mib", "4",
    )  # fmt: skip
    client = openai.OpenAI(base_url=f"{stack.endpoint}/v1", api_key="unused")

    def ask(n: int) -> int:
        r = client.completions.create(model="serving-path", prompt=[3] * n, max_tokens=3)
        assert r.usage is not None
        return r.usage.completion_tokens

    lengths = [1, 300, 4000, *[3000] * 12]
    with ThreadPoolExecutor(len(lengths)) as pool:
        assert list(pool.map(ask, lengths)) == [3] * len(lengths)

    def counter(url: str, name: str) -> float:
        text = httpx.get(f"{url}/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith((name + "{", name + " "))
        )  # fmt: skip

    moved = sum(lengths) * 1024
    assert counter(stack.workers["w0"], "fluidpd_kv_sent_bytes_total") == moved
    assert counter(stack.workers["w1"], "fluidpd_kv_received_bytes_total") == moved
    assert counter(stack.workers["w1"], "fluidpd_kv_corrupted_total") == 0
    assert counter(stack.endpoint, "fluidpd_router_repairings") == 0  # no prefill was redone


SIDECAR_METRICS = {
    "fluidpd_ttft_seconds", "fluidpd_tpot_seconds", "fluidpd_e2e_seconds",
    "fluidpd_queue_time_seconds", "fluidpd_queue_length", "fluidpd_running_batch",
    "fluidpd_kv_used_tokens", "fluidpd_kv_reserved_tokens", "fluidpd_kv_capacity_tokens",
    "fluidpd_ppi", "fluidpd_dpi_load", "fluidpd_dpi_adm", "fluidpd_stolen_tokens",
    "fluidpd_worker_role", "fluidpd_role_switches", "fluidpd_drain_seconds",
    "sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage",
}  # fmt: skip


def test_prometheus_metrics(stack_factory: Callable[..., Any]) -> None:
    stack = stack_factory("1P1D", "static")
    openai.OpenAI(base_url=f"{stack.endpoint}/v1", api_key="x").completions.create(
        model="llama-3.1-8b", prompt="measure me", max_tokens=4
    )
    families = {}
    for url in stack.workers.values():
        for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
            families.setdefault(fam.name, []).extend(fam.samples)
    assert set(families) >= SIDECAR_METRICS, SIDECAR_METRICS - set(families)
    ttft = [s for s in families["fluidpd_ttft_seconds"] if s.name.endswith("_count")]
    assert sum(s.value for s in ttft) == 1
    roles = {
        s.labels["role"]: s.value
        for s in families["fluidpd_worker_role"]
        if s.labels["worker"] == "w0"
    }
    assert roles == {"prefill": 1.0, "decode": 0.0}
    router = {
        f.name for f in text_string_to_metric_families(httpx.get(f"{stack.endpoint}/metrics").text)
    }
    assert {
        "fluidpd_router_requests",
        "fluidpd_router_ttft_seconds",
        "fluidpd_router_inflight",
    } <= router
