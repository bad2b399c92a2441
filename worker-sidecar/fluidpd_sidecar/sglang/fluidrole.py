"""FluidRole for an ``sglang`` worker: the core's role state machine (Active -> Drain ->
Switch -> Active) driven over a running SGLang server, which flips in place (``roleswitch``).

The drain is the paper's ``wait``: the worker stops taking halves (the router re-pairs what
it sends meanwhile), turns back its queued-not-started work for re-pairing and lets what has
started finish; then SGLang's scheduler, now fully idle, switches on its own loop thread.

Re-pairing is SGLang's way (shared/notes/sglang-internals.md section 3.4): a queued request
is pinned to its (prefill, bootstrap room) pair, so both halves are aborted and the router
issues a fresh pair. The hook aborts, on the scheduler's loop thread, exactly the requests
nothing has started for (P: bootstrap and waiting queues; D: the pre-allocation queue) and
names them; their halves end with ``reroute`` (the prefill half's outcome, the decode half's
stream event), on which the router aborts the other half and pairs the request again. A
decode worker also asks the prefill peer of each request that holds a KV reservation here to
release it if the peer has not started it (``/v1/internal/release``, as the other engines'
sidecars do); a released one is aborted here and re-paired too.

``migrate`` (moving running decode requests' KV to a peer) is not implemented on SGLang: a
``migrate`` drain waits, which is also what the paper's ``migrate`` does when no peer can
take a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import aiohttp
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fluidpd.api.internal import (
    Abort,
    PressureReport,
    RetireRequest,
    RoleRequest,
    RoleStatus,
)
from fluidpd.core.repair import drain_releases_reserved, release_asks
from fluidpd.core.rolestate import IllegalTransition, RoleStateMachine
from fluidpd.core.types import DrainMode, Role, RoleState
from fluidpd_sidecar.errors import Conflict
from fluidpd_sidecar.peers import PeerError

if TYPE_CHECKING:
    from fluidpd_sidecar.sglang.service import SglangService

log = logging.getLogger("fluidpd.sidecar.sglang")
POLL_S = 0.05


class SwitchGauges(Collector):
    """The in-engine part of the last switch (SGLang's flip alone, the drain excluded)."""

    def __init__(self, driver: RoleDriver) -> None:
        self.driver = driver

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            "fluidpd_sglang_switch_seconds",
            "Seconds SGLang's scheduler took to flip roles in place (last switch), by target",
            labels=["worker", "target"],
        )
        for target, seconds in self.driver.engine_switch_s.items():
            g.add_metric([self.driver.service.cfg.worker_id, target.value], seconds)
        yield g


class RoleDriver:
    def __init__(self, service: SglangService) -> None:
        self.service = service
        self.sm = RoleStateMachine(service.cfg.role, since=time.time())
        self.switches = 0
        #: (from, to, drain started, switch finished) of the last completed switch.
        self.last: tuple[Role, Role, float, float] | None = None
        #: SGLang's own flip time of the last switch into each role.
        self.engine_switch_s: dict[Role, float] = {}
        #: Halves turned back for re-pairing: they end with ``reroute``, not an error.
        self.repair: set[int] = set()
        self._drain_started = 0.0
        self._task: asyncio.Task[None] | None = None
        self._syncing = False
        self._sync_failed = 0.0

    # -- what the service asks ------------------------------------------------------------
    @property
    def role(self) -> Role:
        return self.sm.role

    def engine_in_role(self) -> bool:
        """SGLang's scheduler runs the role FluidPD gives this worker (it is launched as a
        decode server and flipped at start; after a restart it is flipped again)."""
        snap = self.service.snapshot
        return bool(snap.get("ready")) and snap.get("mode") == self.sm.role.value

    def status(self) -> RoleStatus:
        return RoleStatus.of(self.service.cfg.worker_id, self.sm, self.switches)

    def report(self, base: PressureReport) -> PressureReport:
        last = self.last
        return base.model_copy(
            update={
                "role": self.sm.role,
                "state": self.sm.state,
                "target": self.sm.target,
                "switches": self.switches,
                "last_switch_from": last[0] if last else None,
                "last_switch_to": last[1] if last else None,
                "last_switch_started": last[2] if last else 0.0,
                "last_switch_finished": last[3] if last else 0.0,
            }
        )

    # -- FluidRole --------------------------------------------------------------------------
    def request(self, body: RoleRequest) -> RoleStatus:
        sm = self.sm
        try:
            if not sm.wants_switch(body.role):
                return self.status()  # already there, or on its way: idempotent
        except IllegalTransition as exc:
            raise Conflict(str(exc)) from None
        if not self.engine_in_role():
            raise Conflict("SGLang is not serving yet; switch once it is ready")
        source = sm.role
        now = time.time()
        sm.begin_drain(body.role, now)
        self._drain_started = now
        if body.drain is DrainMode.MIGRATE:
            log.info("drain 'migrate' is not implemented on SGLang; waiting instead")
        log.info("switch %s -> %s started (drain wait)", source.value, body.role.value)
        self._task = asyncio.ensure_future(self._switch(source, body.role))
        return self.status()

    def retire(self, body: RetireRequest) -> RoleStatus:
        """Scale-in: take no more halves, re-pair what has not started, finish the rest."""
        sm = self.sm
        try:
            if not sm.wants_retire():
                return self.status()
        except IllegalTransition as exc:
            raise Conflict(str(exc)) from None
        sm.begin_retire(time.time())
        self._task = asyncio.ensure_future(self._repair_unstarted())
        return self.status()

    def cancel_retire(self) -> RoleStatus:
        """Calls off a scale-in (idempotent): the worker takes halves again in its role."""
        if self.sm.retiring:
            self.sm.cancel_retire(time.time())
            log.info("retirement cancelled: back in service as %s", self.sm.role.value)
        return self.status()

    async def release(self, rid: int) -> bool:
        """A draining decode peer asks: re-pair this request if its prefill has not started."""
        if self.sm.role is not Role.PREFILL or rid not in self.service.halves:
            return False
        self.repair.add(rid)
        code, out = await self._hook("unstarted", {"rids": [str(rid)]})
        released = code == 200 and str(rid) in out.get("aborted", [])
        if not released:
            self.repair.discard(rid)
        return released

    # -- the drain and the switch -----------------------------------------------------------
    async def _switch(self, source: Role, target: Role) -> None:
        try:
            await self._repair_unstarted()
            while self.service.halves:  # what has started finishes here
                await asyncio.sleep(POLL_S)
            self.sm.begin_switch(time.time())
            out = await self._flip(target)
            finished = time.time()
            self.sm.complete(finished)
            self.switches += 1
            self.last = (source, target, self._drain_started, finished)
            self.engine_switch_s[target] = float(out.get("seconds", 0.0))
            drain_s = finished - self._drain_started
            self.service.metrics.switched(source, target, drain_s)
            log.info(
                "switch %s -> %s done in %.3f s (SGLang's flip %.4f s, pid %s)",
                source.value, target.value, drain_s, self.engine_switch_s[target],
                out.get("pid"),
            )  # fmt: skip
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("switch %s -> %s failed", source.value, target.value)

    async def _flip(self, target: Role) -> dict[str, Any]:
        """SGLang's in-place flip; it refuses (409) until its scheduler is fully idle (a last
        transfer completing, an abort being cleaned up), so this retries until it is."""
        warned = 0.0
        while True:
            code, out = await self._hook("role", {"role": target.value})
            if code == 200:
                return out
            now = time.time()
            if code != 409 and now - warned > 5.0:
                warned = now
                log.warning("SGLang refused the switch to %s: %s", target.value, out)
            await asyncio.sleep(POLL_S)

    def _prefill_url_of(self, rid: int) -> str | None:
        half = self.service.halves.get(rid)
        return half.prefill_url if half is not None and half.prefill_url else None

    async def _repair_unstarted(self) -> None:
        svc = self.service
        code, out = await self._hook("unstarted", {})
        aborted = [int(r) for r in out.get("aborted", [])] if code == 200 else []
        self.repair.update(aborted)
        if aborted:
            log.info("re-pairing %d queued, not started requests", len(aborted))
        if not drain_releases_reserved(self.sm.role):
            return
        # Decode: requests holding a reservation here whose prefill may not have started
        # (SGLang's transfer queue), asked about as ``fluidpd.core.repair`` says.
        reserved = [int(entry["rid"]) for entry in svc.snapshot.get("transfer", [])]
        for rid, prefill_url in release_asks(reserved, self._prefill_url_of, self.repair):
            try:
                answer = await svc.peer_post(
                    prefill_url, "/v1/internal/release", Abort(rid=rid, reason="re-pair")
                )
            except (PeerError, ValueError):
                continue
            if answer.get("released"):
                self.repair.add(rid)
                await svc.abort_sglang(rid)

    # -- the engine's role at start and after a restart -----------------------------------
    async def sync_engine(self) -> None:
        """Flips a (re)started SGLang into the worker's role; called by the hook poller."""
        if self._syncing or self.sm.state is not RoleState.ACTIVE:
            return
        if time.time() - self._sync_failed < 2.0:
            return
        snap = self.service.snapshot
        if not snap.get("ready") or snap.get("mode") == self.sm.role.value:
            return
        self._syncing = True
        try:
            code, out = await self._hook("role", {"role": self.sm.role.value})
            if code == 200:
                log.info(
                    "SGLang (pid %s) set to %s in %.4f s",
                    out.get("pid"), self.sm.role.value, float(out.get("seconds", 0.0)),
                )  # fmt: skip
                # Readiness waits for the snapshot to show the new mode.
                with contextlib.suppress(Exception):
                    await self.service.refresh_snapshot()
            else:
                self._sync_failed = time.time()
                log.warning("could not set SGLang to %s: %s", self.sm.role.value, out)
        finally:
            self._syncing = False

    async def _hook(self, op: str, args: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        svc = self.service
        url = f"http://127.0.0.1:{svc.server.cfg.hook_port}/{op}"
        try:
            timeout = aiohttp.ClientTimeout(total=180.0)
            async with svc.client.post(url, json=args, timeout=timeout) as r:
                return r.status, dict(await r.json(content_type=None))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return 599, {"error": str(exc)}

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
