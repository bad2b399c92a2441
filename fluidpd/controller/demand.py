"""The controller's demand feed: the router's arrivals (``GET /admin/arrivals``), in order,
each once, on the controller's clock. What the predictive rule makes of them is the core's
(``fluidpd.core.role_control.RoleControl``); this module only moves them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import aiohttp
from pydantic import ValidationError

from fluidpd.api.demand import ArrivalsReport
from fluidpd.core.role_control import Arrival

log = logging.getLogger("fluidpd.controller")


class ArrivalSource(Protocol):
    """What the controller reads its demand from: one router (``DemandFeed``), or every
    router of a deployment (``RouterDemand``)."""

    async def read(self) -> list[Arrival] | None: ...


#: How long a read of one router's arrivals may take before the interval's demand counts as
#: incomplete: the controller reads every control interval and must not fall behind it.
READ_TIMEOUT_S = 1.0


class DemandFeed:
    """Reads one router's arrivals after the cursor of its previous answer."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        router: str,
        headers: dict[str, str] | None = None,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.session = session
        self.url = f"{router.rstrip('/')}/admin/arrivals"
        self.headers = headers or {}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, connect=timeout_s / 2)
        self.epoch: str | None = None
        self.cursor: int | None = None
        #: Arrivals received, and arrivals the router could not give (its log forgot them).
        self.received = 0
        self.dropped = 0

    async def read(self) -> list[Arrival] | None:
        """The arrivals since the previous read, their times on this process's clock; None
        when the router did not answer in time (the caller then knows this interval's demand
        is incomplete)."""
        params: dict[str, str] = {}
        if self.cursor is not None and self.epoch is not None:
            params = {"after": str(self.cursor), "epoch": self.epoch}
        try:
            async with self.session.get(
                self.url, params=params, headers=self.headers, timeout=self.timeout
            ) as resp:
                if resp.status != 200:
                    log.warning("arrivals: the router answered HTTP %d", resp.status)
                    return None
                report = ArrivalsReport.model_validate_json(await resp.read())
        except (aiohttp.ClientError, TimeoutError, ValidationError) as exc:
            log.debug("arrivals: %s", exc)
            return None
        if self.epoch is not None and report.epoch != self.epoch:
            log.info(
                "arrivals: the router restarted (epoch %s); reading its log anew", report.epoch
            )
        if report.dropped:
            log.warning("arrivals: %d lost (the router's log forgot them)", report.dropped)
        self.epoch, self.cursor = report.epoch, report.next
        self.received += len(report.arrivals)
        self.dropped += report.dropped
        # The router's clock to ours (the answer's transit, milliseconds, is the error).
        offset = time.time() - report.t
        return [Arrival(a.t + offset, a.prompt, a.output) for a in report.arrivals]


class RouterDemand:
    """The arrivals of every router of a deployment, merged in time order: each replica
    behind the Service sees only the requests sent to it, and the demand is their sum.
    ``urls`` gives the ready routers' base URLs at each read (a router that left takes its
    cursor with it; a new one is read from the start of its log)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        urls: Callable[[], Sequence[str]],
        headers: Callable[[], dict[str, str]],
        timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.session = session
        self.urls = urls
        self.headers = headers
        self.timeout_s = timeout_s
        self.feeds: dict[str, DemandFeed] = {}
        #: Arrivals read from the routers that answered while another did not: given with
        #: the next complete read, not lost (their routers' cursors have moved past them).
        self._held: list[Arrival] = []

    async def read(self) -> list[Arrival] | None:
        """Every router's arrivals since its previous read; None when there is no router or
        one did not answer (this interval's demand is then incomplete)."""
        urls = list(self.urls())
        if not urls:
            return None
        self.feeds = {
            u: self.feeds.get(u) or DemandFeed(self.session, u, timeout_s=self.timeout_s)
            for u in urls
        }
        headers = self.headers()
        for feed in self.feeds.values():
            feed.headers = headers
        parts = await asyncio.gather(*(feed.read() for feed in self.feeds.values()))
        self._held.extend(a for part in parts if part for a in part)
        if any(part is None for part in parts):
            return None
        out, self._held = sorted(self._held, key=lambda a: a.t), []
        return out
