"""The router's view of the worker set: who exists, their role and state, who is alive.

Workers come from a static list (``--worker id=url``) or from ``PUT /admin/workers`` (what the
operator and the controller feed). A poller reads every worker's ``/pressure`` twice a second,
which gives the role and state (a draining worker gets no new work), health (a dead worker is
dropped within one poll period plus the connect timeout) and role-switch records; it also tells
each sidecar the pool sizes it needs for eq. 17.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from fluidpd.core.pairing import Pairing, RoundRobinPairing
from fluidpd.core.types import Role, RoleState

log = logging.getLogger("fluidpd.router.workers")

#: A request routed this long before a poll of its worker started shows in that poll's report
#: (a sidecar's report reads its engine's state, refreshed every 50 ms); until then the router
#: counts it itself, so that a burst between two polls does not all go to the worker that
#: looked least loaded at the last one.
REPORTED_AFTER_S = 0.2


@dataclass(slots=True)
class WorkerInfo:
    worker: str
    url: str
    role: Role | None = None
    state: RoleState | None = None
    healthy: bool = False
    failures: int = 0
    switches: int = 0
    pressure: dict[str, Any] = field(default_factory=dict)
    #: Marked dead by a failed request: skipped until a poll sees it alive again.
    suspect_until: float = 0.0
    #: Role and state as last polled (``state`` above is also cleared by a 409 between polls):
    #: what a change is logged against.
    polled: tuple[Role, RoleState] | None = None
    #: Requests routed here that the last report may not show yet: (routed at, prompt tokens).
    unreported: list[tuple[float, int]] = field(default_factory=list)

    def routed(self, prompt_tokens: int, now: float) -> None:
        self.unreported.append((now, prompt_tokens))

    def reported(self, poll_started: float) -> None:
        """A report asked for at ``poll_started`` came back: it shows what was routed well
        before."""
        edge = poll_started - REPORTED_AFTER_S
        self.unreported = [(t, n) for t, n in self.unreported if t > edge]

    @property
    def unreported_tokens(self) -> int:
        return sum(n for _, n in self.unreported)

    def accepts(self, role: Role, now: float) -> bool:
        return (
            self.healthy
            and self.role is role
            and self.state is RoleState.ACTIVE
            and now >= self.suspect_until
        )


class WorkerSet:
    def __init__(
        self,
        pairing: Pairing | None = None,
        poll_s: float = 0.5,
        token: str | None = None,
    ) -> None:
        self.workers: dict[str, WorkerInfo] = {}
        self.pairing: Pairing = pairing or RoundRobinPairing()
        self.poll_s = poll_s
        self.switches: list[dict[str, Any]] = []
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._polled = asyncio.Event()

    def set(self, workers: dict[str, str]) -> None:
        """Replaces the worker set (id -> URL), keeping what is known of the ones that stay."""
        self.workers = self._carried(workers)

    def _carried(self, workers: dict[str, str]) -> dict[str, WorkerInfo]:
        current = self.workers
        return {
            wid: current[wid] if wid in current and current[wid].url == url
            else WorkerInfo(wid, url)
            for wid, url in workers.items()
        }  # fmt: skip

    def usable(self) -> bool:
        """There is a prefill and a decode worker to pair now."""
        prefill, decode = self.pools()
        return bool(prefill and decode)

    async def usable_with(self, workers: dict[str, str]) -> bool:
        """Would ``workers`` (id -> URL) be usable? Probes the ones not known yet."""
        candidate = WorkerSet(self.pairing, self.poll_s)
        candidate._headers, candidate._session = self._headers, self._session
        candidate.workers = self._carried(workers)
        unknown = [w for w in candidate.workers.values() if not w.healthy]
        await asyncio.gather(*(candidate._poll(w, 1) for w in unknown))
        return candidate.usable()

    def pools(self) -> tuple[list[str], list[str]]:
        now = time.time()
        infos = self.workers.values()
        return (
            [w.worker for w in infos if w.accepts(Role.PREFILL, now)],
            [w.worker for w in infos if w.accepts(Role.DECODE, now)],
        )

    def choose(self, prompt_tokens: int = 0) -> tuple[WorkerInfo, WorkerInfo] | None:
        prefill, decode = self.pools()
        if not prefill or not decode:
            return None
        p, d = self.pairing.choose(prefill, decode)
        now = time.time()
        for wid in (p, d):
            self.workers[wid].routed(prompt_tokens, now)
        return self.workers[p], self.workers[d]

    def suspect(self, wid: str, seconds: float = 2.0) -> None:
        """A request found the worker unreachable: stop routing to it until a poll says
        otherwise (the poll confirms within ``poll_s``)."""
        info = self.workers.get(wid)
        if info is not None:
            info.suspect_until = time.time() + seconds

    def turned_away(self, wid: str) -> None:
        """The worker answered 409 (draining, switching, retiring): its last poll is stale, so
        it gets no work until the next poll says what it is now (otherwise every re-pairing
        may pick it again at once and spend the request's attempts in milliseconds)."""
        info = self.workers.get(wid)
        if info is not None:
            info.state = None

    # -- polling --------------------------------------------------------------------------------
    async def start(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        self._task = asyncio.create_task(self._poll_forever(), name="worker-poller")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait_polled(self, timeout: float) -> None:
        await asyncio.wait_for(self._polled.wait(), timeout)

    async def _poll_forever(self) -> None:
        while True:
            await self.poll_once()
            self._polled.set()
            await asyncio.sleep(self.poll_s)

    async def poll_once(self) -> None:
        infos = list(self.workers.values())
        roles = [w.role for w in infos if w.healthy]
        n_prefill = max(1, sum(1 for r in roles if r is Role.PREFILL))
        await asyncio.gather(*(self._poll(w, n_prefill) for w in infos))

    async def _poll(self, info: WorkerInfo, n_prefill: int) -> None:
        assert self._session is not None
        url = f"{info.url.rstrip('/')}/pressure?n_prefill={n_prefill}"
        started = time.time()
        try:
            timeout = aiohttp.ClientTimeout(total=1.0, connect=0.5)
            async with self._session.get(url, headers=self._headers, timeout=timeout) as resp:
                if resp.status != 200:
                    raise aiohttp.ClientError(f"HTTP {resp.status}")
                p = orjson.loads(await resp.read())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            if info.healthy:
                log.warning("worker %s unreachable: %s", info.worker, exc)
            info.healthy = False
            info.failures += 1
            return
        if info.failures:
            log.info("worker %s reachable again after %d failed polls", info.worker, info.failures)
        info.healthy = True
        info.failures = 0
        info.suspect_until = 0.0
        info.role = Role(p["role"])
        info.state = RoleState(p["state"])
        self._log_change(info)
        info.pressure = p
        info.reported(started)
        if p.get("switches", 0) > info.switches and p.get("last_switch_to"):
            self.switches.append(
                {
                    "t": p["last_switch_finished"],
                    "worker": info.worker,
                    "from": p["last_switch_from"],
                    "to": p["last_switch_to"],
                    "drain_s": round(p["last_switch_finished"] - p["last_switch_started"], 3),
                }
            )
        info.switches = p.get("switches", 0)

    @staticmethod
    def _log_change(info: WorkerInfo) -> None:
        """Logs a worker's role or state as the router first sees it and each time it changes
        (a switch reads drain, switch, then active in the new role), so the router's log shows
        when it stopped and started sending a worker work."""
        assert info.role is not None and info.state is not None
        now = (info.role, info.state)
        if now == info.polled:
            return
        shown = f"{now[0].value}/{now[1].value}"
        if info.polled is None:
            log.info("worker %s: %s", info.worker, shown)
        else:
            was = f"{info.polled[0].value}/{info.polled[1].value}"
            log.info("worker %s: %s -> %s", info.worker, was, shown)
        info.polled = now

    def stats(self) -> dict[str, Any]:
        workers = [
            {
                "worker": w.worker,
                "url": w.url,
                "role": w.role.value if w.role else None,
                "state": w.state.value if w.state else None,
                "healthy": w.healthy,
                "queue_len": w.pressure.get("queue_len", 0),
                "batch": w.pressure.get("batch", 0),
                "queue_ppi": w.pressure.get("queue_ppi", 0.0),
                "dpi_load": w.pressure.get("dpi_load", 0.0),
                "dpi_adm": w.pressure.get("dpi_adm", 0.0),
                "stolen_tokens": w.pressure.get("stolen_tokens", 0),
            }
            for w in self.workers.values()
        ]
        return {
            "workers": workers,
            "role_switches": list(self.switches),
            "stolen_tokens": sum(int(w["stolen_tokens"]) for w in workers),
        }
