"""Polls every worker's ``/pressure``, runs the core's FluidRole policy, and carries out its
decisions through the sidecars' ``POST /role``.

The decision logic is ``fluidpd.core.fluidrole.FluidRolePolicy``; this module only moves data:
pressure reports in, switch requests out. A worker that does not answer is left out of the
observation, so a dead worker is never chosen for a switch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from fluidpd.controller.metrics import DeploymentMetrics
from fluidpd.core.fluidrole import (
    FluidRoleConfig,
    FluidRolePolicy,
    Recommendation,
    SwitchDecision,
    SwitchRule,
    WorkerSignals,
)
from fluidpd.core.types import DrainMode, Role, RoleState

log = logging.getLogger("fluidpd.controller")

#: Returns the current worker set, id -> sidecar URL.
WorkerSource = Callable[[], Awaitable[dict[str, str]]]


async def fetch_pressure(session: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    """One sidecar's ``/pressure`` report (with its ``url`` added), or None when it does not
    answer in time: a worker that does not answer is left out, never guessed at."""
    try:
        timeout = aiohttp.ClientTimeout(total=1.0, connect=0.5)
        async with session.get(f"{url}/pressure", timeout=timeout) as resp:
            if resp.status != 200:
                return None
            report: dict[str, Any] = orjson.loads(await resp.read())
            report["url"] = url
            return report
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def post_admin(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[int, str]:
    """POST a JSON body to a sidecar's admin endpoint: (status, text); status 0 when it could
    not be reached in time."""
    try:
        async with session.post(
            url, data=orjson.dumps(body), headers=headers, timeout=aiohttp.ClientTimeout(total=5.0)
        ) as resp:
            return resp.status, await resp.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return 0, str(exc)


@dataclass(slots=True)
class ControllerEvent:
    t: float
    #: "switch-started", "switch-resumed", "switch-finished", "switch-abandoned",
    #: "switch-refused", "needs-capacity"
    kind: str
    worker: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


class FluidRoleController:
    def __init__(
        self,
        source: WorkerSource,
        cfg: FluidRoleConfig,
        session: aiohttp.ClientSession,
        token: str | None = None,
        on_change: Callable[[], Awaitable[None]] | None = None,
        metrics: DeploymentMetrics | None = None,
    ) -> None:
        self.source = source
        self.cfg = cfg
        self.policy = FluidRolePolicy(cfg)
        if cfg.enabled and cfg.switch_rule is SwitchRule.PREDICTIVE:
            # Said once, so that nobody takes the live rule for the simulator's (issue #14).
            log.warning(
                "switch rule 'predictive' needs a demand forecast, which the live router does "
                "not export yet: this controller decides with eqs. (22)-(23), persistence, "
                "cooldowns and the switch budget (as --switch-rule paper)"
            )
        self.session = session
        self.headers = {"content-type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.on_change = on_change
        self.metrics = metrics
        self.events: list[ControllerEvent] = []
        self.reports: dict[str, dict[str, Any]] = {}
        self._switching: tuple[str, Role] | None = None

    def _event(self, event: ControllerEvent) -> None:
        self.events.append(event)
        if self.metrics is not None:
            drain = event.detail.get("drain_s") if event.kind == "switch-finished" else None
            self.metrics.event(event.kind, drain)

    def _observed(self, decision: SwitchDecision | Recommendation) -> None:
        m = self.metrics
        if m is None:
            return
        m.decided(decision)
        for role in Role:
            m.worker_count(role, sum(1 for r in self.reports.values() if r["role"] == role.value))
        m.pressure(self.policy.last_pressure)

    @property
    def in_flight(self) -> tuple[str, Role] | None:
        """The switch being carried out (worker, target role), if any."""
        return self._switching

    async def _pressure(self, wid: str, url: str) -> dict[str, Any] | None:
        return await fetch_pressure(self.session, url)

    async def step(self) -> SwitchDecision | Recommendation:
        workers = await self.source()
        results = await asyncio.gather(*(self._pressure(w, u) for w, u in workers.items()))
        self.reports = {r["worker"]: r for r in results if r is not None}
        now = time.time()
        signals = [
            WorkerSignals(
                r["worker"],
                Role(r["role"]),
                RoleState(r["state"]),
                r["attributable_ppi"],
                r["dpi_load"],
                r["dpi_adm"],
                r["drain_cost"],
            )
            for r in self.reports.values()
        ]
        await self._track_switch(now)
        decision = self.policy.observe(now, signals)
        self._observed(decision)
        if isinstance(decision, SwitchDecision):
            await self._start_switch(decision, now)
        elif decision is Recommendation.NEEDS_CAPACITY:
            self._event(ControllerEvent(now, "needs-capacity"))
            log.warning("both phases pressured: the deployment needs more capacity")
        return decision

    async def _track_switch(self, now: float) -> None:
        if self._switching is None:
            return
        wid, target = self._switching
        r = self.reports.get(wid)
        if r is None:
            # The switching worker is gone: the switch will not finish; free the policy.
            self.policy.switch_finished(wid, now)
            self._switching = None
            self._event(ControllerEvent(now, "switch-abandoned", wid))
            return
        if r["role"] == target.value and r["state"] == RoleState.ACTIVE.value:
            self.policy.switch_finished(wid, now)
            self._switching = None
            self._event(
                ControllerEvent(
                    now,
                    "switch-finished",
                    wid,
                    {
                        "to": target.value,
                        "drain_s": r.get("last_switch_finished", now)
                        - r.get("last_switch_started", now),
                    },
                )
            )
            if self.on_change:
                await self.on_change()

    async def _post_role(self, worker: str, target: Role, drain: DrainMode) -> tuple[bool, str]:
        """Asks ``worker``'s sidecar to switch (idempotent there: the same switch under way, or
        already done, answers 200)."""
        url = self.reports[worker]["url"]
        decode_urls = [
            r["url"]
            for w, r in self.reports.items()
            if r["role"] == Role.DECODE.value
            and r["state"] == RoleState.ACTIVE.value
            and w != worker
        ]
        body = {"role": target.value, "drain": drain.value, "migrate_to": decode_urls}
        status, text = await post_admin(self.session, f"{url}/role", body, self.headers)
        return status == 200, text[:200]

    async def resume(self, worker: str, target: Role, drain: DrainMode) -> bool:
        """Takes over a switch started before this controller (a restarted operator reads it
        back from the cluster): re-asks the sidecar, then tracks it like its own."""
        if self._switching is not None or worker not in self.reports:
            return False
        ok, detail = await self._post_role(worker, target, drain)
        if not ok:
            log.warning("resumed switch of %s refused: %s", worker, detail)
            return False
        self.policy.switch_resumed(worker)
        self._switching = (worker, target)
        self._event(ControllerEvent(time.time(), "switch-resumed", worker, {"to": target.value}))
        return True

    async def _start_switch(self, d: SwitchDecision, now: float) -> None:
        ok, detail = await self._post_role(d.worker, d.target, d.drain_mode)
        if not ok:
            log.warning("switch of %s refused: %s", d.worker, detail)
            self.policy.switch_finished(d.worker, now)
            self._event(ControllerEvent(now, "switch-refused", d.worker, {"detail": detail}))
            return
        self._switching = (d.worker, d.target)
        p = d.pressure
        log.info(  # the pool pressure that decided it, so an operator can tell why
            "switch %s %s -> %s (%s drain): PPI %.2f, DPI_load %.2f, DPI_adm %.2f, %dP%dD",
            d.worker,
            d.source.value,
            d.target.value,
            d.drain_mode.value,
            p.ppi_bar,
            p.dpi_load_bar,
            p.dpi_adm_bar,
            p.n_prefill,
            p.n_decode,
        )
        self._event(
            ControllerEvent(
                now,
                "switch-started",
                d.worker,
                {"from": d.source.value, "to": d.target.value, "drain": d.drain_mode.value},
            )
        )
        if self.on_change:
            await self.on_change()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self.step()
            except Exception:  # keep controlling; one bad interval must not stop the loop
                log.exception("control interval failed")
            delay = self.cfg.interval_s - (time.monotonic() - started)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, delay))
