"""The drills' view of a deployment's admin API (every ``/admin/*`` route takes the token)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson


def admin_session(token: str | None) -> aiohttp.ClientSession:
    """A session whose requests carry the deployment's bearer token."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return aiohttp.ClientSession(headers=headers)


async def get_json(session: aiohttp.ClientSession, url: str, tries: int = 5) -> dict[str, Any]:
    """GET a JSON object; a slow or refused answer is tried again (a loaded machine, or a
    process the drill is restarting), so that the drill measures the stack, not its probe."""
    for attempt in range(tries):
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=5.0)) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:200]
                    raise RuntimeError(f"GET {url}: HTTP {resp.status}: {text}")
                data: dict[str, Any] = orjson.loads(await resp.read())
                return data
        except (TimeoutError, aiohttp.ClientError):
            if attempt == tries - 1:
                raise
            await asyncio.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


async def router_workers(session: aiohttp.ClientSession, endpoint: str) -> list[dict[str, Any]]:
    """The router's ``/admin/stats`` worker list (role, state, health, load of each)."""
    workers: list[dict[str, Any]] = (await get_json(session, f"{endpoint}/admin/stats"))["workers"]
    return workers
