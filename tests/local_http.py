"""A real aiohttp server on a free local port, for tests whose peer is an HTTP service."""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web


async def serve_routes(routes: Iterable[web.AbstractRouteDef]) -> tuple[web.AppRunner, str]:
    """Serves ``routes`` on 127.0.0.1 at a free port: the runner (to clean up) and base URL."""
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"
