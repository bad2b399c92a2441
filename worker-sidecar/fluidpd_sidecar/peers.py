"""HTTP calls from a sidecar to its peers (the other half of a request, migration targets).

aiohttp, the project's one HTTP client library for asynchronous clients (router, controller,
operator, drills, replay: see ``fluidpd/replay/client.py`` for why it beat httpx on streams).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp
import orjson
from pydantic import BaseModel

log = logging.getLogger("fluidpd.sidecar.peers")


class PeerError(RuntimeError):
    """A peer did not answer, or answered with an error (``status``: its HTTP status)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Peers:
    """One pooled HTTP client for every peer call, carrying the shared bearer token.

    The session is made on first use: it belongs to the event loop that serves the sidecar,
    which does not run yet when the service is built."""

    def __init__(self, token: str | None, timeout_s: float = 10.0) -> None:
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=2.0)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=256, limit_per_host=0),
            )
        return self._session

    async def _call(
        self, method: str, url: str, path: str, body: bytes | None = None
    ) -> dict[str, Any]:
        target = url.rstrip("/") + path
        headers = {"content-type": "application/json"} if body is not None else None
        try:
            async with self._client().request(method, target, data=body, headers=headers) as resp:
                content = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise PeerError(f"{url}{path}: {type(exc).__name__}: {exc}") from exc
        if status >= 400:
            detail = f": {content[:200].decode(errors='replace')}" if body is not None else ""
            raise PeerError(f"{url}{path}: HTTP {status}{detail}", status)
        data = orjson.loads(content) if content else {}
        return data if isinstance(data, dict) else {}

    async def post(self, url: str, path: str, body: BaseModel) -> dict[str, Any]:
        return await self._call("POST", url, path, body.model_dump_json().encode())

    async def get(self, url: str, path: str) -> dict[str, Any]:
        return await self._call("GET", url, path)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


async def refresh_budgets(
    peers: Peers, wanted: Iterable[str], urls: Mapping[str, str], budgets: dict[str, float]
) -> None:
    """Reads the stealing budget of each ``wanted`` decode worker whose URL is known into
    ``budgets``; one that does not answer has none (0) until it does."""
    for d in wanted:
        url = urls.get(d)
        if url is None:
            continue
        try:
            answer = await peers.get(url, "/v1/internal/budget")
            budgets[d] = float(answer.get("budget", 0.0))
        except PeerError:
            budgets[d] = 0.0
