"""HTTP calls from a sidecar to its peers (the other half of a request, migration targets)."""

from __future__ import annotations

import logging
from typing import Any

import httpx
from pydantic import BaseModel

log = logging.getLogger("fluidpd.sidecar.peers")


class PeerError(RuntimeError):
    """A peer did not answer, or answered with an error."""


class Peers:
    """One pooled HTTP client for every peer call, carrying the shared bearer token."""

    def __init__(self, token: str | None, timeout_s: float = 10.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=2.0),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )

    async def post(self, url: str, path: str, body: BaseModel) -> dict[str, Any]:
        try:
            resp = await self._client.post(
                url.rstrip("/") + path,
                content=body.model_dump_json(),
                headers={"content-type": "application/json"},
            )
        except httpx.HTTPError as exc:
            raise PeerError(f"{url}{path}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise PeerError(f"{url}{path}: HTTP {resp.status_code}: {resp.text[:200]}")
        data = resp.json() if resp.content else {}
        return data if isinstance(data, dict) else {}

    async def get(self, url: str, path: str) -> dict[str, Any]:
        try:
            resp = await self._client.get(url.rstrip("/") + path)
        except httpx.HTTPError as exc:
            raise PeerError(f"{url}{path}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise PeerError(f"{url}{path}: HTTP {resp.status_code}")
        data = resp.json()
        return data if isinstance(data, dict) else {}

    async def close(self) -> None:
        await self._client.aclose()
