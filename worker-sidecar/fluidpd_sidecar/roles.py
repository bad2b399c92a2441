"""FluidRole on this worker: role switches (drain, then the engine switches) and
retirement (scale-in), with their status.
"""

from __future__ import annotations

import logging
import time

from fluidpd.api.internal import (
    Abort,
    DecodeEvent,
    DrainReport,
    RetireRequest,
    RoleRequest,
    RoleStatus,
)
from fluidpd.core.repair import drain_releases_reserved, release_asks
from fluidpd.core.rolestate import IllegalTransition
from fluidpd.core.types import DrainMode, Role, RoleState
from fluidpd_sidecar.errors import Conflict
from fluidpd_sidecar.migration import Migration
from fluidpd_sidecar.peers import PeerError

log = logging.getLogger("fluidpd.sidecar")


class Roles(Migration):
    """Role switches and retirement."""

    def role_status(self) -> RoleStatus:
        return RoleStatus.of(
            self.cfg.worker_id, self.worker.role_sm, self.switches, self._last_drain
        )

    def _new_drain_report(self, source: Role, drain: DrainMode) -> None:
        if source is Role.DECODE and drain is DrainMode.MIGRATE:
            self._drain_report = self._last_drain = DrainReport()
            self._barred = set()

    def request_role(self, body: RoleRequest) -> RoleStatus:
        w = self.worker
        try:
            if not w.role_sm.wants_switch(body.role):
                return self.role_status()  # already there, or on its way: idempotent
        except IllegalTransition as exc:
            raise Conflict(str(exc)) from None
        source = w.role
        w.begin_switch(body.role, time.time(), body.drain)
        self._migrate_to = [u for u in body.migrate_to if u.rstrip("/") != self.cfg.url.rstrip("/")]
        self._drain_started = time.time()
        self._new_drain_report(source, body.drain)
        self._dispatch()
        if drain_releases_reserved(source):
            self._spawn(self._release_reserved())
        log.info("switch %s -> %s started (drain %s)", source.value, body.role.value, body.drain)
        self.wake()
        return self.role_status()

    def retire(self, body: RetireRequest) -> RoleStatus:
        """Scale-in: stop taking work and empty the worker; idempotent."""
        w = self.worker
        try:
            if not w.role_sm.wants_retire():
                return self.role_status()
        except IllegalTransition as exc:
            raise Conflict(str(exc)) from None
        now = time.time()
        w.begin_retire(now, body.drain)
        self._retire_until = now + body.return_after_s if body.return_after_s else float("inf")
        self._migrate_to = [u for u in body.migrate_to if u.rstrip("/") != self.cfg.url.rstrip("/")]
        self._drain_started = now
        self._new_drain_report(w.role, body.drain)
        self._dispatch()
        if drain_releases_reserved(w.role):
            self._spawn(self._release_reserved())
        log.info("retiring (drain %s)", body.drain.value)
        self.wake()
        return self.role_status()

    def cancel_retire(self, why: str = "cancelled") -> RoleStatus:
        """Calls off a scale-in: the worker takes work again in its role; idempotent."""
        w = self.worker
        if not w.retiring:
            return self.role_status()
        w.cancel_retire(time.time())
        self._retire_until = float("inf")
        self._migrate_to = []
        log.info("retirement %s: back in service as %s", why, w.role.value)
        self.wake()
        return self.role_status()

    def expire_retirement(self, now: float) -> None:
        """A retirement still here ``return_after_s`` after it began was abandoned (nobody
        deleted the worker): return to service rather than stay out of it for good."""
        if self.worker.retiring and now >= self._retire_until:
            self.cancel_retire("not completed in time (the worker was not removed)")

    def _prefill_url_of(self, rid: int) -> str | None:
        half = self.decode_halves.get(rid)
        return None if half is None else half.prefill_url

    async def _release_reserved(self) -> None:
        """D->P: requests holding a reservation here whose prefill has not started are re-paired,
        so the drain waits only for work in flight (``fluidpd.core.repair``)."""
        for rid, prefill_url in release_asks(self.worker.decode.reserved, self._prefill_url_of):
            try:
                answer = await self.peers.post(
                    prefill_url, "/v1/internal/release", Abort(rid=rid, reason="re-pair")
                )
            except PeerError:
                continue
            if answer.get("released"):
                self.worker.decode.cancel(rid)
                self._end_decode(rid, DecodeEvent(event="reroute", detail="worker draining"))
        self.wake()

    async def _advance_switch(self) -> None:
        w = self.worker
        if w.state is RoleState.DRAIN and w.decode.migrate_on_drain and w.role is Role.DECODE:
            await self._migrate_out()
        if not w.try_enter_switch(time.time()):
            return
        target = w.role_sm.target
        assert target is not None
        source = w.role
        await self.engine.switch_role(target)
        finished = time.time()
        w.complete_switch(finished)
        self.switches += 1
        self._last_switch = (source, target, self._drain_started, finished)
        drain_s = finished - self._drain_started
        self.metrics.switched(source, target, drain_s)
        log.info("switch %s -> %s done in %.3f s", source.value, target.value, drain_s)
        report = self._drain_report
        if source is Role.DECODE and self._last_drain is report:
            report.drain_s = round(drain_s, 4)
            # Moves still copying go on after the switch (their KV pages stay until sent);
            # the record keeps counting them (``last_activated_s``).
            log.info("drain migrate: %s", report.model_dump_json())
