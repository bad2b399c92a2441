"""The sidecar's peer client: answers as dicts, every failure as one PeerError."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import orjson
import pytest
from aiohttp import web
from pydantic import BaseModel

from fluidpd_sidecar.peers import PeerError, Peers, refresh_budgets


class _Body(BaseModel):
    rid: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_peer_calls_and_their_failures() -> None:
    seen: list[tuple[str, str | None, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read()) if request.can_read_body else None
        seen.append((request.path, request.headers.get("Authorization"), body))
        if request.path == "/broken":
            return web.Response(status=503, text="arena full")
        return web.Response(body=orjson.dumps({"ok": True, "echo": body}))

    async def main() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        port = _free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        peers = Peers("tok", timeout_s=5.0)
        url = f"http://127.0.0.1:{port}/"
        try:
            assert await peers.post(url, "/v1/internal/adopt", _Body(rid=7)) == {
                "ok": True, "echo": {"rid": 7},
            }  # fmt: skip
            assert (await peers.get(url, "/pressure"))["ok"] is True
            with pytest.raises(PeerError, match=r"/broken: HTTP 503: arena full"):
                await peers.post(url, "/broken", _Body(rid=1))
            with pytest.raises(PeerError, match="HTTP 503"):
                await peers.get(url, "/broken")
            with pytest.raises(PeerError, match="/pressure"):
                await peers.get(f"http://127.0.0.1:{_free_port()}", "/pressure")  # refused
        finally:
            await peers.close()
            await runner.cleanup()

    asyncio.run(main())
    assert [(p, a) for p, a, _ in seen][:2] == [
        ("/v1/internal/adopt", "Bearer tok"), ("/pressure", "Bearer tok"),
    ]  # fmt: skip


def test_budgets_are_read_from_the_wanted_peers_and_zero_when_one_is_gone() -> None:
    class _Stub(Peers):
        async def get(self, url: str, path: str) -> dict[str, Any]:
            if "gone" in url:
                raise PeerError(f"{url}{path}: refused")
            return {"budget": 12.5 if url == "http://d0" else 3.0}

    budgets = {"d1": 7.0, "d3": 1.0}
    urls = {"d0": "http://d0", "d1": "http://gone", "d3": "http://d3"}
    asyncio.run(refresh_budgets(_Stub(None), ["d0", "d1", "d2"], urls, budgets))
    # d2's URL is not known: left alone; d3 not wanted: not read.
    assert budgets == {"d0": 12.5, "d1": 0.0, "d3": 1.0}
