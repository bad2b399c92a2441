"""Scale-in on a live deployment: ``POST /retire`` empties a worker under load without losing a
request, the router stops sending it work, and the worker reports ``drained``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from fluidpd.drills.load import OpenLoopLoad


async def _retire_under_load(stack: Any, victim: str, drain: str) -> tuple[dict[str, Any], Any]:
    url = stack.workers[victim]
    headers = {"Authorization": f"Bearer {stack.token}"}
    load = OpenLoopLoad(
        stack.endpoint, "llama-3.1-8b", rps=8.0, prompt_len=(200, 1500), max_tokens=(20, 120)
    )
    stop = asyncio.Event()
    task = asyncio.create_task(load.run(14.0, stop))
    async with aiohttp.ClientSession(headers=headers) as session:
        await asyncio.sleep(4.0)
        others = [u for n, u in stack.workers.items() if n != victim]
        body = {"drain": drain, "migrate_to": others}
        async with session.post(f"{url}/retire", json=body) as resp:
            assert resp.status == 200, await resp.text()
            status = await resp.json()
        assert status["retiring"] is True
        # Idempotent: a second call while draining answers the same.
        async with session.post(f"{url}/retire", json=body) as resp:
            assert resp.status == 200 and (await resp.json())["retiring"] is True
        pressure: dict[str, Any] = {}
        for _ in range(120):
            async with session.get(f"{url}/pressure") as resp:
                pressure = await resp.json()
            if pressure["drained"]:
                break
            await asyncio.sleep(0.25)
        # A retiring worker never flips role: it waits to be deleted.
        async with session.get(f"{url}/role") as resp:
            role = await resp.json()
    report = await task
    return {"pressure": pressure, "role": role}, report


@pytest.mark.parametrize(("victim", "drain"), [("w0", "wait"), ("w2", "migrate")])
def test_retire_drains_without_losing_requests(
    stack_factory: Callable[..., Any], victim: str, drain: str
) -> None:
    stack = stack_factory("2P2D", "static")
    before = dict(stack.workers)
    seen, report = asyncio.run(_retire_under_load(stack, victim, drain))
    assert seen["pressure"]["drained"] is True and seen["pressure"]["retiring"] is True
    assert seen["role"]["state"] == "drain" and seen["role"]["retiring"] is True
    summary = report.summary(120.0)
    assert summary["hung"] == 0
    assert summary["completed"] == summary["sent"], summary
    assert set(stack.workers) == set(before)
