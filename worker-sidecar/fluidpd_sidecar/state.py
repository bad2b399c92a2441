"""The state every part of the sidecar service shares, and the hooks one part offers
the parts below it.

The service is built in layers, one concern a module, each using only the layers below it:
``streams`` (a request's events and its end, bootstrap expiry) < ``outbox`` (delivering the
scheduler's messages; the KV transport room) < ``intake`` (request halves arriving over HTTP)
< ``migration`` (drain ``migrate``) < ``roles`` (role switch and retirement) < ``service``
(the scheduler loop and the periodic tasks). SGLang's ``srt/disaggregation`` splits its
scheduler the same way, one concern a file.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any

from fluidpd.api.internal import DrainReport, Reserved
from fluidpd.core.scheduler import messages as msg
from fluidpd.core.scheduler.worker import Worker
from fluidpd.core.types import Role
from fluidpd.modeldir.text import TokenText
from fluidpd_sidecar.config import SidecarConfig
from fluidpd_sidecar.engine import Engine
from fluidpd_sidecar.halves import DecodeState, PrefillState
from fluidpd_sidecar.metrics import SidecarMetrics
from fluidpd_sidecar.peers import Peers
from fluidpd_sidecar.transfer import KVTransfer


class ServiceState:
    """What the layers of ``SidecarService`` share: the scheduler, the engine, the transport, the
    request halves here."""

    #: Set by ``SidecarService`` (its collectors read the whole service).
    metrics: SidecarMetrics

    def __init__(
        self, cfg: SidecarConfig, engine: Engine, transfer: KVTransfer, text: TokenText
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.transfer = transfer
        self.text = text
        self.worker = Worker.create(
            cfg.worker_id, cfg.role, cfg.profile, cfg.slo, cfg.token_cfg, cfg.adaptive, time.time()
        )
        self.worker.prefill.forced_steal = cfg.force_steal
        self.peers = Peers(cfg.admin_token)
        self.prefill_halves: dict[int, PrefillState] = {}
        self.decode_halves: dict[int, DecodeState] = {}
        #: Ended decode halves nobody has read yet (migrated in, the router not yet attached),
        #: with the time they ended: their events wait here for the router.
        self._unclaimed: dict[int, tuple[DecodeState, float]] = {}
        self._early_reserved: dict[int, Reserved] = {}
        #: Admitted decode halves waiting for arena room before their reservation is sent.
        self._awaiting_room: deque[msg.Reserved] = deque()
        #: Per-prefill stealing budgets the paired decode workers advertise, by worker id.
        self.budgets: dict[str, float] = {}
        self._decode_urls: dict[str, str] = {}
        self.n_prefill = 1
        self.switches = 0
        self._last_switch: tuple[Role, Role, float, float] | None = None
        self._migrate_to: list[str] = []
        self._drain_started = 0.0
        #: Where the running (or last) decode drain ``migrate`` spends its time.
        self._drain_report = DrainReport()
        self._last_drain: DrainReport | None = None
        #: (request, peer) pairs of this drain that the peer refused for good (HTTP 400: the
        #: request is not one it can serve): not asked again; the request finishes here.
        self._barred: set[tuple[int, str]] = set()
        #: Migrations out whose KV is still on its way.
        self._moving = 0
        #: A retirement nobody completed (the worker was not deleted) ends at this time.
        self._retire_until = float("inf")
        self._wake = asyncio.Event()
        #: Set when a decode half arrives: the stream flusher sleeps while none streams.
        self._streaming = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._stopping = False

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def wake(self) -> None:
        self._wake.set()

    def _add_decode_half(self, state: DecodeState) -> None:
        self.decode_halves[state.req.rid] = state
        self._streaming.set()

    # -- what ``outbox`` (a layer above) does, for the layers below it ------------------------
    def _dispatch(self) -> None:
        """Delivers every message in the scheduler's outbox (``Outbox._dispatch``)."""
        raise NotImplementedError

    def _free_room(self, half: DecodeState) -> None:
        """Gives a decode half's arena room back (``Outbox._free_room``)."""
        raise NotImplementedError
