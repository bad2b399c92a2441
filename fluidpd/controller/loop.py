"""Polls every worker's ``/pressure`` and the router's arrivals, runs the core's FluidRole
policy, and carries out its decisions through the sidecars' ``POST /role``.

The decision logic is ``fluidpd.core.fluidrole.FluidRolePolicy``, fed through the core's
``RoleControl`` exactly as the simulator feeds it (the predictive rule's demand window from
every arrival, then one observation per interval); this module only moves data: pressure
reports and arrivals in, switch requests out. A worker that does not answer is left out of the
observation, so a dead worker is never chosen for a switch; an interval whose arrivals the
router did not give takes no predictive switch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from fluidpd.controller.demand import ArrivalSource
from fluidpd.controller.metrics import DeploymentMetrics
from fluidpd.core.fluidrole import (
    FluidRoleConfig,
    Recommendation,
    SwitchDecision,
    SwitchRule,
    WorkerSignals,
)
from fluidpd.core.policy_forecast import Forecast
from fluidpd.core.profile import Profile
from fluidpd.core.role_control import RoleControl
from fluidpd.core.types import SLO, DrainMode, Role, RoleState

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
    #: "switch-refused" (by the sidecar), "switch-declined" (the predictive rule's forecast
    #: said it does not pay; ``detail`` holds the forecast), "needs-capacity"
    kind: str
    worker: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


def forecast_detail(f: Forecast) -> dict[str, Any]:
    """A forecast as an event's detail (bottleneck ratios, overloaded seconds, drain s; the
    gain and cost counted at the window's rate too, which may decide where the rate's lower
    bound is blind; the donor's load ratio there, which may let a split past capacity trade
    its overload)."""
    mean = f.at_mean
    return {
        "before": round(f.before, 4),
        "after": round(f.after, 4),
        "during": round(f.during, 4),
        "donor_after": round(f.donor_after, 4),
        "gain": round(f.gain, 3),
        "cost": round(f.cost, 3),
        "gain_at_rate": None if mean is None else round(mean.gain, 3),
        "cost_at_rate": None if mean is None else round(mean.cost, 3),
        "donor_at_rate": round(f.donor_at_rate, 4) if math.isfinite(f.donor_at_rate) else None,
        "drain_s": round(f.drain_s, 3),
    }


class FluidRoleController:
    """``profile`` and ``slo`` (the workers' profile and the deployment's SLO) give the
    predictive rule its capacity model and ``demand`` (the router's arrivals) its demand; the
    rule needs all three, and without them the controller decides as the paper does."""

    def __init__(
        self,
        source: WorkerSource,
        cfg: FluidRoleConfig,
        session: aiohttp.ClientSession,
        token: str | None = None,
        on_change: Callable[[], Awaitable[None]] | None = None,
        metrics: DeploymentMetrics | None = None,
        *,
        profile: Profile | None = None,
        slo: SLO | None = None,
        demand: ArrivalSource | None = None,
    ) -> None:
        self.source = source
        self.cfg = cfg
        self.demand = demand
        self.role = RoleControl.create(cfg, profile, slo, fed=demand is not None)
        self.policy = self.role.policy
        if cfg.enabled and cfg.switch_rule is SwitchRule.PREDICTIVE:
            # Said once, so that nobody takes the live rule for another (issue #14).
            if self.role.predictive:
                log.info(
                    "switch rule 'predictive': forecasts from the router's arrivals and the "
                    "profile's predictors, as the simulator"
                )
            else:
                missing = "the router's arrivals" if profile and slo else "a profile and SLO"
                log.warning(
                    "switch rule 'predictive' needs %s, which this controller was not given: "
                    "it decides with eqs. (22)-(23), persistence, cooldowns and the switch "
                    "budget (as --switch-rule paper)",
                    missing,
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
        if self.role.last_demand is not None:
            m.demand(self.role.last_demand)

    @property
    def in_flight(self) -> tuple[str, Role] | None:
        """The switch being carried out (worker, target role), if any."""
        return self._switching

    async def _pressure(self, wid: str, url: str) -> dict[str, Any] | None:
        return await fetch_pressure(self.session, url)

    async def _arrivals(self) -> bool:
        """Feeds the arrivals since the last interval to the demand window; False when the
        router did not give them (this interval's demand is then incomplete)."""
        if self.demand is None:
            return True
        arrivals = await self.demand.read()
        if arrivals is None:
            return False
        for a in arrivals:
            self.role.arrived(a.t, a.prompt, a.output)
        return True

    async def step(self) -> SwitchDecision | Recommendation:
        workers = await self.source()
        results, current = await asyncio.gather(
            asyncio.gather(*(self._pressure(w, u) for w, u in workers.items())),
            self._arrivals(),
        )
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
                r.get("busy"),
                int(r.get("kv_waiting", 0)),
            )
            for r in self.reports.values()
        ]
        await self._track_switch(now)
        refused = self.policy.refused
        decision = self.role.observe(now, signals, current)
        if self.policy.refused > refused and self.policy.last_forecast is not None:
            detail: dict[str, Any] = forecast_detail(self.policy.last_forecast)
            detail["direction"] = self.policy.last_recommendation.value
            self._event(ControllerEvent(now, "switch-declined", "", detail))
            log.info("switch declined by the forecast: %s", detail)
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
            "switch %s %s -> %s (%s drain): PPI %.2f, DPI_load %.2f, DPI_adm %.2f, %dP%dD%s",
            d.worker,
            d.source.value,
            d.target.value,
            d.drain_mode.value,
            p.ppi_bar,
            p.dpi_load_bar,
            p.dpi_adm_bar,
            p.n_prefill,
            p.n_decode,
            f", forecast {forecast_detail(d.forecast)}" if d.forecast else "",
        )
        started: dict[str, Any] = {
            "from": d.source.value,
            "to": d.target.value,
            "drain": d.drain_mode.value,
            "undo": d.undo,
        }
        if d.forecast is not None:
            started["forecast"] = forecast_detail(d.forecast)
        self._event(ControllerEvent(now, "switch-started", d.worker, started))
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
