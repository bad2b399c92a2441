"""Open-loop load through a deployment's router, in a thread of the test: from ``start`` (or
entering a ``with`` block) until ``stop`` (or leaving it), or until ``duration_s`` has passed.
Stopping ends the sending and waits for the requests in flight, so a test's load lasts as long
as what it watches, not a fixed time, and every request sent is accounted for."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from fluidpd.drills.load import LoadReport, OpenLoopLoad

MODEL = "llama-3.1-8b"
#: A request taking longer than this counts as hung (the load's own request timeout).
HANG_S = 120.0


class Load:
    def __init__(self, url: str, duration_s: float = 3600.0, **kw: Any) -> None:
        self.duration = duration_s
        self.load = OpenLoopLoad(url, MODEL, request_timeout_s=HANG_S, **kw)
        self.report: LoadReport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def main() -> LoadReport:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self._started.set()
            return await self.load.run(self.duration, self._stop)

        self.report = asyncio.run(main())

    def start(self) -> Load:
        self.thread.start()
        self._started.wait(10)
        return self

    def stop(self) -> LoadReport:
        """Stops sending and waits for the requests in flight (each ends by ``HANG_S``)."""
        assert self._loop is not None and self._stop is not None
        # A load whose time is up has closed its loop already.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(HANG_S + 60)
        if self.report is None:
            raise RuntimeError("the load never finished")
        return self.report

    def summary(self) -> dict[str, Any]:
        return self.stop().summary(HANG_S)

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
