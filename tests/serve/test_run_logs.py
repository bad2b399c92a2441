"""``fluidpd up``'s run directory is enough to trace a request (issue #16): from the id the
client got back, the router's log gives the internal request id, and with it the router's and
both sidecars' logs tell the request's life cycle at the default level; a role switch is in
the switching sidecar's log and in the router's (when it stopped and started sending work)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from fluidpd.drills.admin import admin_session
from fluidpd.drills.stack import LocalStack
from fluidpd.drills.switches import switch_once


@pytest.fixture(scope="module")
def stack(stack_factory: Callable[..., LocalStack]) -> LocalStack:
    # Every prompt steals half its tokens, so "stolen" has something to say.
    return stack_factory("1P2D", "static", "--force-steal", "0.5", "--noise", "0")


def _logs(run_dir: Path) -> dict[str, str]:
    return {p.stem: p.read_text(errors="replace") for p in run_dir.glob("*.log")}


def _lines(text: str, pattern: str) -> list[str]:
    return [line for line in text.splitlines() if re.search(pattern, line)]


def test_a_request_is_traced_from_its_client_id_through_every_log(stack: LocalStack) -> None:
    body = {"model": "llama-3.1-8b", "prompt": [7] * 64, "max_tokens": 3}
    req = urllib.request.Request(
        f"{stack.endpoint}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        public_id = json.loads(resp.read())["id"]

    logs = _logs(stack.run_dir)
    admitted = _lines(logs["router"], rf"INFO request (\d+) admitted \({public_id}\)")
    assert len(admitted) == 1, logs["router"][-3000:]
    m = re.search(r"request (\d+) admitted \(\S+\): 64 prompt tokens, prefill (w\d), decode (w\d)",
                  admitted[0])  # fmt: skip
    assert m, admitted[0]
    rid, prefill, decode = m.groups()
    expected = [
        ("router", rf"INFO request {rid} finished: length, 3 tokens"),
        (prefill, rf"INFO request {rid} admitted for prefill .* decode on {decode}"),
        (prefill, rf"INFO request {rid} prefill done: .*, 32 stolen"),
        (decode, rf"INFO request {rid} admitted for decode .* prefill on {prefill}"),
        (decode, rf"INFO request {rid} finished \(length, 3 tokens\)"),
    ]
    # The prefill sidecar hears its hand-off answered after the decode side may have streamed
    # every token: on a loaded machine its line can come after the client's answer.
    deadline = time.monotonic() + 30
    while any(not _lines(logs[n], p) for n, p in expected) and time.monotonic() < deadline:
        time.sleep(0.2)
        logs = _logs(stack.run_dir)
    for name, pattern in expected:
        assert _lines(logs[name], pattern), (name, pattern, logs[name][-2000:])


def test_a_role_switch_is_in_the_sidecars_log_and_the_routers(stack: LocalStack) -> None:
    async def switch() -> dict[str, object] | None:
        async with admin_session(stack.token) as session:
            for _ in range(20):
                # None: the router did not see both decode workers healthy and Active at that
                # moment (a poll timed out on a loaded machine); it will at a later poll.
                done = await switch_once(session, stack.endpoint, stack.token, "decode", "wait")
                if done is not None:
                    return done
                await asyncio.sleep(0.5)
            return None

    done = asyncio.run(switch())
    assert done is not None and "error" not in done, done
    worker = str(done["worker"])
    logs = _logs(stack.run_dir)
    assert _lines(logs[worker], r"INFO switch decode -> prefill started \(drain wait\)")
    assert _lines(logs[worker], r"INFO switch decode -> prefill done in")
    router = logs["router"]
    for _ in range(20):  # the router sees the new role at its next poll (every 0.5 s)
        if _lines(router, rf"INFO worker {worker}: \S+ -> prefill/active"):
            break
        time.sleep(0.25)
        router = _logs(stack.run_dir)["router"]
    assert _lines(router, rf"INFO worker {worker}: decode/active -> ")
    assert _lines(router, rf"INFO worker {worker}: \S+ -> prefill/active"), router[-3000:]
