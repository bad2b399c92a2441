"""Bad input to the router and the sidecar: a 4xx with a clear message, and the process keeps
serving."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

MODEL = "llama-3.1-8b"


@pytest.fixture(scope="module")
def stack(stack_factory: Callable[..., Any]) -> Any:
    return stack_factory("2P2D", "static")


def _message(resp: httpx.Response) -> str:
    body = resp.json()
    if "error" in body:
        return str(body["error"]["message"])
    return str(body["detail"])


ROUTER_CASES = [
    (b"{not json", 400, ""),
    (b'{"prompt": "x", "max_tokens": 3}', 400, "model"),
    (b'{"model": "llama-3.1-8b", "max_tokens": 3}', 400, "prompt"),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "max_tokens": -1}', 400, "max_tokens"),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "max_tokens": 1000000000}', 400, "context limit"),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "n": 3}', 400, "n"),
    (b'{"model": "llama-3.1-8b", "prompt": []}', 400, "prompt"),
    (b'{"model": "nope", "prompt": "x"}', 404, "not served"),
    # Sampling values, unknown and unsupported fields: 400 naming the field.
    (b'{"model": "llama-3.1-8b", "prompt": "x", "temperature": -1}', 400, "temperature"),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "temperature": 3}', 400, "temperature"),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "top_p": 0}', 400, "top_p"),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "top_k": -2}', 400, "top_k"),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "min_p": 1.5}', 400, "min_p"),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "seed": -4}', 400, "seed"),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "frequency_penalty": 9}', 400, "frequency_penalty"),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "presence_penalty": "a"}', 400, "presence_penalty"),
    (
        b'{"model": "llama-3.1-8b", "prompt": "x", "repetition_penalty": 0}',
        400,
        "repetition_penalty",
    ),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "logprobs": 50}', 400, "logprobs"),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "stop": [""]}', 400, "stop"),
    (
        b'{"model": "llama-3.1-8b", "prompt": "x", "stop": ["a","b","c","d","e","f","g","h","i",'
        b'"j","k","l","m","n","o","p","q"]}',
        400,
        "stop",
    ),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "stop_token_ids": [99999]}', 400, "stop_token_ids"),
    (
        b'{"model": "llama-3.1-8b", "prompt": "x", "tools": []}',
        400,
        "tools: unknown or unsupported field",
    ),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "echo": true}', 400, "echo: not supported"),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "best_of": 3}', 400, "best_of"),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "suffix": "y"}', 400, "suffix"),
    (b'{"model": "llama-3.1-8b", "prompt": "x", "logit_bias": {"5": 1}}', 400, "logit_bias"),
    (b'{"model": "llama-3.1-8b", "prompt": [1, 99999]}', 400, "prompt: token id 99999"),
    (b'{"model": "llama-3.1-8b", "prompt": [[1, 2], [3]]}', 400, "prompt: batched"),
    (
        b'{"model": "llama-3.1-8b", "prompt": "x", "stream_options": {"x": 1}}',
        400,
        "stream_options.x",
    ),
]

CHAT_CASES = [
    (b'{"model": "llama-3.1-8b", "messages": []}', "messages"),
    (
        b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "x"}], '
        b'"top_logprobs": 3}',
        "top_logprobs: needs logprobs",
    ),
    (
        b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": [{"type": '
        b'"image_url", "image_url": {"url": "http://x"}}]}]}',
        "messages.0.content",
    ),
    (
        b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "x"}], '
        b'"response_format": {"type": "json_object"}}',
        "response_format",
    ),
    (
        b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "x"}], "n": 2}',
        "n: only n = 1",
    ),
    (
        b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "x"}], '
        b'"max_completion_tokens": 10000000}',
        "context limit",
    ),
]


@pytest.mark.parametrize(("body", "status", "needle"), ROUTER_CASES)
def test_router_rejects(stack: Any, body: bytes, status: int, needle: str) -> None:
    r = httpx.post(
        f"{stack.endpoint}/v1/completions", content=body,
        headers={"content-type": "application/json"}, timeout=10,
    )  # fmt: skip
    assert r.status_code == status, r.text
    assert needle in _message(r)


@pytest.mark.parametrize(("body", "needle"), CHAT_CASES)
def test_router_rejects_chat(stack: Any, body: bytes, needle: str) -> None:
    r = httpx.post(
        f"{stack.endpoint}/v1/chat/completions", content=body,
        headers={"content-type": "application/json"}, timeout=10,
    )  # fmt: skip
    assert r.status_code == 400, r.text
    assert needle in _message(r)
    assert "\n" not in _message(r)


def test_bad_input_loses_nothing(stack: Any) -> None:
    """Valid requests sent among a burst of bad ones all complete, with exact counts."""
    bad = [b for b, status, _ in ROUTER_CASES if status == 400]

    def one(i: int) -> tuple[int, int]:
        if i % 2:
            r = httpx.post(f"{stack.endpoint}/v1/completions", content=bad[i % len(bad)],
                           headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
            return r.status_code, 0
        body = {"model": MODEL, "prompt": [11] * (50 + i), "max_tokens": 3 + i % 5}
        r = httpx.post(f"{stack.endpoint}/v1/completions", json=body, timeout=60)
        return r.status_code, r.json()["usage"]["completion_tokens"]

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, range(60)))
    for i, (status, tokens) in enumerate(got):
        assert (status, tokens) == ((400, 0) if i % 2 else (200, 3 + i % 5)), i


def test_router_prompt_over_context_limit(stack: Any) -> None:
    body = {"model": MODEL, "prompt": [1] * 131073, "max_tokens": 1}
    r = httpx.post(f"{stack.endpoint}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and "context limit" in _message(r)
    chat = {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}
    r = httpx.post(f"{stack.endpoint}/v1/chat/completions", json=chat, timeout=10)
    assert r.status_code == 400 and "role" in _message(r)
    # Still serving.
    ok = httpx.post(
        f"{stack.endpoint}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}
    )
    assert ok.status_code == 200


def test_admin_endpoints_need_the_token(stack: Any) -> None:
    w0 = stack.workers["w0"]
    body = {"role": "decode"}
    r = httpx.post(f"{w0}/role", json=body)
    assert r.status_code == 401 and "token" in _message(r)
    r = httpx.post(f"{w0}/role", json=body, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    r = httpx.post(f"{stack.endpoint}/admin/poll")
    assert r.status_code == 401
    half = {"rid": 1, "prompt_ids": [5] * 5, "sampling": {"max_new_tokens": 2}, "arrival": 0.0,
            "decode_worker": "w2", "decode_url": stack.workers["w2"]}  # fmt: skip
    assert httpx.post(f"{w0}/v1/internal/prefill", json=half).status_code == 401
    assert httpx.get(f"{w0}/pressure").status_code == 200  # read-only signals stay open


def test_sidecar_rejects_bad_role_requests(stack: Any) -> None:
    auth = {"Authorization": f"Bearer {stack.token}"}
    w1 = stack.workers["w1"]
    r = httpx.post(f"{w1}/role", json={"role": "chef"}, headers=auth)
    assert r.status_code == 422 and "role" in r.text
    r = httpx.post(f"{w1}/role", content=b"{", headers={**auth, "content-type": "application/json"})
    assert r.status_code == 422
    # A switch to where the worker already is: nothing to do (idempotent).
    r = httpx.post(f"{w1}/role", json={"role": "prefill"}, headers=auth)
    assert r.status_code == 200 and r.json()["state"] == "active"
    # While a switch is under way, the same request is idempotent, the opposite is refused.
    w3 = stack.workers["w3"]
    half = {"rid": 77, "prompt_ids": [9] * 50, "sampling": {"max_new_tokens": 400},
            "arrival": 0.0, "prefill_worker": "w1", "prefill_url": w1}  # fmt: skip
    with httpx.stream("POST", f"{w3}/v1/internal/decode", json=half, headers=auth, timeout=30):
        r = httpx.post(f"{w3}/role", json={"role": "prefill", "drain": "wait"}, headers=auth)
        assert r.status_code == 200 and r.json()["state"] in ("drain", "switch", "active")
        if r.json()["state"] != "active":
            again = httpx.post(f"{w3}/role", json={"role": "prefill"}, headers=auth)
            assert again.status_code == 200
            back = httpx.post(f"{w3}/role", json={"role": "decode"}, headers=auth)
            assert back.status_code == 409 and "under way" in _message(back)
    # A half for the wrong role, and one over the context limit.
    pre = {"rid": 5, "prompt_ids": [5] * 5, "sampling": {"max_new_tokens": 2}, "arrival": 0.0,
           "decode_worker": "w2", "decode_url": stack.workers["w2"]}  # fmt: skip
    r = httpx.post(f"{stack.workers['w2']}/v1/internal/prefill", json=pre, headers=auth)
    assert r.status_code == 409 and "not prefill" in _message(r)
    big = {**pre, "prompt_ids": [5] * 140_000}
    r = httpx.post(f"{w1}/v1/internal/prefill", json=big, headers=auth, timeout=10)
    assert r.status_code == 400 and "context limit" in _message(r)
    # Ids outside the vocabulary would index past an engine's embedding.
    oov = {**pre, "rid": 6, "prompt_ids": [5, 1 << 20]}
    r = httpx.post(f"{w1}/v1/internal/prefill", json=oov, headers=auth, timeout=10)
    assert r.status_code == 400 and "prompt_ids" in _message(r)
    assert httpx.get(f"{w1}/healthz").status_code == 200
