"""The controller's demand feed: the router's arrivals (``GET /admin/arrivals``), in order,
each once, on the controller's clock. What the predictive rule makes of them is the core's
(``fluidpd.core.role_control.RoleControl``); this module only moves them."""

from __future__ import annotations

import logging
import time

import aiohttp
from pydantic import ValidationError

from fluidpd.api.demand import ArrivalsReport
from fluidpd.core.role_control import Arrival

log = logging.getLogger("fluidpd.controller")


class DemandFeed:
    """Reads one router's arrivals after the cursor of its previous answer."""

    def __init__(
        self, session: aiohttp.ClientSession, router: str, headers: dict[str, str] | None = None
    ) -> None:
        self.session = session
        self.url = f"{router.rstrip('/')}/admin/arrivals"
        self.headers = headers or {}
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
            timeout = aiohttp.ClientTimeout(total=1.0, connect=0.5)
            async with self.session.get(
                self.url, params=params, headers=self.headers, timeout=timeout
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
