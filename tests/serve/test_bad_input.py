"""Bad input to the router and the sidecar: a 4xx with a clear message, and the process keeps
serving."""

from __future__ import annotations

from collections.abc import Callable
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
]


@pytest.mark.parametrize(("body", "status", "needle"), ROUTER_CASES)
def test_router_rejects(stack: Any, body: bytes, status: int, needle: str) -> None:
    r = httpx.post(
        f"{stack.endpoint}/v1/completions", content=body,
        headers={"content-type": "application/json"}, timeout=10,
    )  # fmt: skip
    assert r.status_code == status, r.text
    assert needle in _message(r)


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
    half = {"rid": 1, "prompt_len": 5, "max_new_tokens": 2, "arrival": 0.0,
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
    half = {"rid": 77, "prompt_len": 50, "max_new_tokens": 400, "arrival": 0.0,
            "prefill_worker": "w1", "prefill_url": w1}  # fmt: skip
    with httpx.stream("POST", f"{w3}/v1/internal/decode", json=half, headers=auth, timeout=30):
        r = httpx.post(f"{w3}/role", json={"role": "prefill", "drain": "wait"}, headers=auth)
        assert r.status_code == 200 and r.json()["state"] in ("drain", "switch", "active")
        if r.json()["state"] != "active":
            again = httpx.post(f"{w3}/role", json={"role": "prefill"}, headers=auth)
            assert again.status_code == 200
            back = httpx.post(f"{w3}/role", json={"role": "decode"}, headers=auth)
            assert back.status_code == 409 and "under way" in _message(back)
    # A half for the wrong role, and one over the context limit.
    pre = {"rid": 5, "prompt_len": 5, "max_new_tokens": 2, "arrival": 0.0,
           "decode_worker": "w2", "decode_url": stack.workers["w2"]}  # fmt: skip
    r = httpx.post(f"{stack.workers['w2']}/v1/internal/prefill", json=pre, headers=auth)
    assert r.status_code == 409 and "not prefill" in _message(r)
    big = {**pre, "prompt_len": 10**6}
    r = httpx.post(f"{w1}/v1/internal/prefill", json=big, headers=auth, timeout=10)
    assert r.status_code == 400 and "context limit" in _message(r)
    assert httpx.get(f"{w1}/healthz").status_code == 200
