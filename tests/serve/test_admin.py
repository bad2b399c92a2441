"""Admin calls that cannot wedge a live deployment, on a real ``fluidpd up`` (issue #15):
the token gates every ``/admin/*`` route, a worker set the router cannot use is refused, a
retirement can be called off, and a client that disconnects frees both halves."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from fluidpd.drills.stack import LocalStack

TIMEOUT = aiohttp.ClientTimeout(total=10)


@pytest.fixture(scope="module")
def stack(stack_factory: Callable[..., LocalStack]) -> LocalStack:
    return stack_factory("1P1D", "static")


def _call(
    stack: LocalStack, method: str, url: str, body: Any = None, token: bool = True
) -> tuple[int, Any]:
    req = urllib.request.Request(url, method=method)
    if body is not None:
        req.data = json.dumps(body).encode()
        req.add_header("content-type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {stack.token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def _completion(stack: LocalStack, max_tokens: int = 4) -> int:
    body = {"model": "llama-3.1-8b", "prompt": [7] * 50, "max_tokens": max_tokens}
    status, answer = _call(stack, "POST", f"{stack.endpoint}/v1/completions", body, token=False)
    assert status == 200, answer
    return int(answer["usage"]["completion_tokens"])


def test_up_writes_its_admin_token(stack: LocalStack) -> None:
    path = stack.run_dir / "admin-token"
    assert path.read_text().strip() == stack.token
    assert path.stat().st_mode & 0o077 == 0  # only its owner can read it


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("GET", "/admin/stats", None), ("POST", "/admin/poll", None),
     ("PUT", "/admin/workers", {"workers": {"w9": "http://127.0.0.1:9"}})],
)  # fmt: skip
def test_every_admin_route_needs_the_token(
    stack: LocalStack, method: str, path: str, body: Any
) -> None:
    status, answer = _call(stack, method, stack.endpoint + path, body, token=False)
    assert status == 401, answer
    assert "token" in answer["error"]["message"]


@pytest.mark.parametrize(
    ("body", "field"),
    [({}, "workers"), ({"workers": {}}, "workers"), ({"workers": {"w0": "ftp://x"}}, "workers"),
     ({"workers": {"w0": "http://127.0.0.1:1"}, "extra": 1}, "extra"),
     ({"workers": {"bad id!": "http://127.0.0.1:1"}}, "workers"),
     ({"workers": {"a": "http://127.0.0.1:1", "b": "http://127.0.0.1:1/"}}, "URL")],
)  # fmt: skip
def test_invalid_worker_lists_are_refused(stack: LocalStack, body: Any, field: str) -> None:
    status, answer = _call(stack, "PUT", f"{stack.endpoint}/admin/workers", body)
    assert status == 400, answer
    assert field in answer["error"]["message"]
    assert _completion(stack) == 4  # still serving


def test_an_unusable_worker_set_is_refused_and_serving_goes_on(stack: LocalStack) -> None:
    # Valid, but nothing answers there: the router would have no pair to serve with.
    body = {"workers": {"w7": "http://127.0.0.1:9", "w8": "http://127.0.0.1:11"}}
    status, answer = _call(stack, "PUT", f"{stack.endpoint}/admin/workers", body)
    assert status == 409, answer
    assert "current set is kept" in answer["error"]["message"]
    _, stats = _call(stack, "GET", f"{stack.endpoint}/admin/stats")
    assert {w["worker"] for w in stats["workers"]} == set(stack.workers)
    assert _completion(stack) == 4
    # The same workers put back (what the operator does) are accepted.
    status, _ = _call(stack, "PUT", f"{stack.endpoint}/admin/workers", {"workers": stack.workers})
    assert status == 200


def test_retirement_can_be_called_off(stack: LocalStack) -> None:
    url = stack.workers["w1"]  # the decode worker
    status, role = _call(stack, "POST", f"{url}/retire", {"drain": "wait"})
    assert status == 200 and role["retiring"] is True
    status, role = _call(stack, "DELETE", f"{url}/retire")
    assert status == 200, role
    assert (role["retiring"], role["state"], role["role"]) == (False, "active", "decode")
    for _ in range(100):  # the router's next poll sees it Active again
        with urllib.request.urlopen(f"{url}/readyz", timeout=5) as resp:
            if resp.status == 200:
                break
    assert _completion(stack) == 4


async def _disconnect_mid_request(stack: LocalStack, stream: bool) -> dict[str, Any]:
    body = {"model": "llama-3.1-8b", "prompt": [7] * 200, "max_tokens": 20_000, "stream": stream}
    async with aiohttp.ClientSession() as session:
        with pytest.raises(TimeoutError):
            async with session.post(
                f"{stack.endpoint}/v1/completions", json=body,
                timeout=aiohttp.ClientTimeout(total=3.0),
            ) as resp:  # fmt: skip
                await resp.read()  # a 20,000-token answer: the client gives up first
        pressure: dict[str, Any] = {}
        for _ in range(200):
            async with session.get(f"{stack.workers['w1']}/pressure", timeout=TIMEOUT) as r:
                pressure = await r.json()
            if pressure["batch"] == 0 and pressure["kv_used"] == 0:
                break
            await asyncio.sleep(0.1)
        return pressure


@pytest.mark.parametrize("stream", [False, True])
def test_client_disconnect_frees_the_decode_worker(stack: LocalStack, stream: bool) -> None:
    pressure = asyncio.run(_disconnect_mid_request(stack, stream))
    assert pressure["batch"] == 0 and pressure["kv_used"] == 0, pressure


def test_calling_off_a_retirement_needs_the_token(stack: LocalStack) -> None:
    status, answer = _call(stack, "DELETE", f"{stack.workers['w0']}/retire", token=False)
    assert status == 401, answer
