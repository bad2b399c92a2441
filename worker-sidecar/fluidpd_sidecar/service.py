"""The sidecar's engine room: the shared scheduler in real time, and the messages it sends.

One asyncio task runs the plan/execute/complete cycle of ``fluidpd.core.scheduler.Worker``
against the engine; HTTP handlers only feed it (new halves, reservations, hand-offs, aborts,
role switches) and wake it. Every message the scheduler puts in its outbox is delivered
(``outbox``): to a peer sidecar over HTTP, or to the router through the request's decode
event stream (``streams``).

On a decode worker every output token goes through the request's ``OutputStream`` right
after the step that made it (detokenization, EOS / stop ids / stop strings), and a request
that stopped leaves the batch at that boundary (``DecodeSide.finish_early``). The stream to the
router is coalesced (``stream_interval_s``); the first and the last tokens go out at once.

The service is one class built in layers, one concern a module (see ``state``); this module
adds its lifecycle, the scheduler loop, the periodic tasks and the pressure signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

import numpy as np

from fluidpd.api.internal import PressureReport
from fluidpd.core.scheduler.prefill import PrefillBatch
from fluidpd.core.types import Role, RoleState
from fluidpd.modeldir.text import TokenText
from fluidpd_sidecar.config import SidecarConfig
from fluidpd_sidecar.engine import Engine
from fluidpd_sidecar.errors import BadRequest, Conflict, NotFound
from fluidpd_sidecar.halves import check_half
from fluidpd_sidecar.metrics import SidecarMetrics
from fluidpd_sidecar.peers import refresh_budgets
from fluidpd_sidecar.roles import Roles
from fluidpd_sidecar.transfer import KVTransfer

log = logging.getLogger("fluidpd.sidecar")
#: How often expired bootstrap reservations, unclaimed halves and retirements are swept, s.
SWEEP_S = 1.0

#: The names the HTTP layer, the CLI and the tests import from here.
__all__ = ["BadRequest", "Conflict", "NotFound", "SidecarConfig", "SidecarService", "check_half"]


class SidecarService(Roles):
    """A worker's sidecar service on one engine and one KV transport (the rest of its
    constructor is ``state.ServiceState``'s)."""

    def __init__(
        self, cfg: SidecarConfig, engine: Engine, transfer: KVTransfer, text: TokenText
    ) -> None:
        super().__init__(cfg, engine, transfer, text)
        self.metrics = SidecarMetrics(self)

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._run(), name="scheduler"),
            asyncio.create_task(self._flush_streams(), name="stream-flusher"),
            asyncio.create_task(self._refresh_budgets(), name="budget-refresher"),
        ]

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        for task in [*self._tasks, *self._background]:
            task.cancel()
        for task in [*self._tasks, *self._background]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.peers.close()
        close = getattr(self.transfer, "close", None)
        if self.transfer.name in ("shm", "cuda-ipc") and close is not None:
            # Its arena is memory until unlinked, and uvicorn re-raises SIGTERM once shut down,
            # so the process ends without running atexit handlers: release it here (cuda-ipc:
            # close the mappings of peers' GPU arenas).
            close()

    async def _run(self) -> None:
        w = self.worker
        while not self._stopping:
            try:
                await self._advance_switch()
                batch = w.next_batch(
                    time.time(), self._budget_source if w.role is Role.PREFILL else None
                )
                self._dispatch()
                if batch is None:
                    self._wake.clear()
                    booked = w.decode.next_booking_expiry() if w.role is Role.DECODE else None
                    await self._sleep(booked)
                    continue
                if isinstance(batch, PrefillBatch):
                    measured = await self.engine.prefill(batch)
                    self.metrics.queue_time(batch.start - batch.request.arrival)
                    w.finish_batch(batch, time.time(), measured)
                else:
                    measured = await self.engine.decode_step(batch)
                    now = time.time()
                    w.finish_batch(batch, now, measured)
                    self._dispatch()
                    self._check_stops(now)
                self._free_loaded()
                self._dispatch()
                if w.state is RoleState.DRAIN and w.role is Role.DECODE:
                    await self._migrate_out()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not silently stop the worker; log and go on
                log.exception("scheduler iteration failed")
                await asyncio.sleep(0.01)

    async def _sleep(self, until: float | None) -> None:
        """Until woken, or until ``until`` (a booking lapses: the next pass admits what it
        held back; ``next_batch`` drops it)."""
        if until is None:
            await self._wake.wait()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), max(0.0, until - time.time()))

    def _budget_source(self, decode_ids: Sequence[str]) -> np.ndarray:
        return np.array([self.budgets.get(d, 0.0) for d in decode_ids], dtype=np.float64)

    async def _flush_streams(self) -> None:
        """Streams generated tokens in coalesced chunks (timing-exact first and last tokens are
        sent as they happen)."""
        last_sweep = 0.0
        while not self._stopping:
            if self.decode_halves:
                await asyncio.sleep(self.cfg.stream_interval_s)
            else:
                # Nothing streams: sleep until a decode half arrives or the sweeps are due,
                # instead of waking 20 times a second for nothing.
                self._streaming.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._streaming.wait(), SWEEP_S)
            now = time.time()
            for half in list(self.decode_halves.values()):
                self._emit(half, now)
            if now - last_sweep >= SWEEP_S:
                last_sweep = now
                self._expire_bootstrap(now)
                self.expire_unclaimed(now)
                self.expire_retirement(now)

    async def _refresh_budgets(self) -> None:
        """While this prefill queue is under stealing pressure, keep its peers' budgets fresh."""
        while not self._stopping:
            await asyncio.sleep(self.cfg.budget_refresh_s)
            w = self.worker
            if w.role is not Role.PREFILL or not self.cfg.token_cfg.enabled:
                continue
            wanted = w.prefill.budget_peers()
            await refresh_budgets(self.peers, wanted, self._decode_urls, self.budgets)

    def pressure(self, n_prefill: int | None = None) -> PressureReport:
        if n_prefill:
            self.n_prefill = n_prefill
        now = time.time()
        p = self.worker.pressure(now, self.n_prefill)
        last = self._last_switch
        return PressureReport.of(
            p,
            stolen_tokens=self.worker.prefill.stolen_tokens,
            switches=self.switches,
            last_switch_from=last[0] if last else None,
            last_switch_to=last[1] if last else None,
            last_switch_started=last[2] if last else 0.0,
            last_switch_finished=last[3] if last else 0.0,
            t=now,
        )
