"""Prefill side: FIFO, one request per batch, gated by the decode side's KV reservation."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fluidpd.core.fluidtoken import FluidTokenConfig, plan_stealing
from fluidpd.core.predictors import FloatArray, PrefillPredictor, SuffixPredictor, TransferModel
from fluidpd.core.scheduler.messages import Handoff, Message, Reroute, SuffixCommitted
from fluidpd.core.signals import queue_ppi
from fluidpd.core.types import SLO, Request

#: Given the decode workers a prefill worker's queue is paired with, return the per-prefill
#: stealing budget (tokens, eq. 17) each currently advertises.
BudgetSource = Callable[[Sequence[str]], FloatArray]


@dataclass(slots=True)
class PrefillBatch:
    request: Request
    prefix_tokens: int
    predicted_s: float
    start: float

    @property
    def end_predicted(self) -> float:
        return self.start + self.predicted_s


@dataclass(slots=True)
class PrefillSide:
    worker_id: str
    slo: SLO
    prefill: PrefillPredictor
    suffix: SuffixPredictor
    kv_bytes_per_token: int
    transfer: TransferModel
    token_cfg: FluidTokenConfig
    outbox: list[Message]
    #: Waiting for the decode side's reservation (SGLang's bootstrap queue).
    bootstrap: dict[int, Request] = field(default_factory=dict)
    #: Reserved, in scheduling order (SGLang's waiting queue); PPI looks at this queue.
    waiting: deque[Request] = field(default_factory=deque)
    running: PrefillBatch | None = None
    #: KV hand-offs started and not yet confirmed, rid -> bytes.
    transfers: dict[int, int] = field(default_factory=dict)
    stolen_tokens: int = 0

    # -- intake -------------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.prefill_worker = self.worker_id
        self.bootstrap[req.rid] = req

    def reserved(self, rid: int) -> bool:
        """The paired decode worker reserved KV; the request may now be scheduled."""
        req = self.bootstrap.pop(rid, None)
        if req is None:
            return False
        self.waiting.append(req)
        return True

    def cancel(self, rid: int) -> Request | None:
        """Drop a queued request (timeout, client abort). Started requests are not touched."""
        req = self.bootstrap.pop(rid, None)
        if req is not None:
            return req
        for i, r in enumerate(self.waiting):
            if r.rid == rid:
                del self.waiting[i]
                return r
        return None

    def repoint_decode(self, rid: int, decode_worker: str) -> bool:
        """Give a not-yet-started request a new decode peer; False if it already started."""
        req = self.cancel(rid)
        if req is None:
            return False
        req.decode_worker = decode_worker
        self.bootstrap[rid] = req
        return True

    # -- scheduling ---------------------------------------------------------------------------
    def backlog(self, now: float) -> float:
        """Predicted seconds until the running batch (if any) finishes."""
        return max(0.0, self.running.end_predicted - now) if self.running is not None else 0.0

    def queued_work(self, now: float) -> float:
        """Predicted seconds to clear the running batch and the whole queue (eq. 2 summed)."""
        queued = [*self.bootstrap.values(), *self.waiting]
        return self.backlog(now) + sum(self.prefill.time(r.prompt_len) for r in queued)

    def queue_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.waiting)
        lengths = np.fromiter((r.prompt_len for r in self.waiting), dtype=np.int64, count=n)
        arrivals = np.fromiter((r.arrival for r in self.waiting), dtype=np.float64, count=n)
        return lengths, arrivals

    def queue_ppi(self, now: float) -> float:
        lengths, arrivals = self.queue_arrays()
        return queue_ppi(
            lengths,
            arrivals,
            now,
            self.slo.ttft,
            self.prefill,
            self.backlog(now),
            self.token_cfg.eps,
        )

    def _stolen_for_head(self, now: float, budgets: BudgetSource) -> int:
        """Algorithm 1 over the waiting queue; only the head's ratio is committed now."""
        lengths, arrivals = self.queue_arrays()
        peers: dict[str, int] = {}
        index = np.fromiter(
            (peers.setdefault(r.decode_worker, len(peers)) for r in self.waiting),
            dtype=np.int64,
            count=len(self.waiting),
        )
        plan = plan_stealing(
            lengths,
            arrivals + self.slo.ttft,
            index,
            budgets(list(peers)),
            now,
            self.prefill,
            self.suffix,
            self.backlog(now),
            self.token_cfg.eps,
        )
        return int(plan.stolen[0])

    def next_batch(self, now: float, budgets: BudgetSource | None) -> PrefillBatch | None:
        """Start the head of the waiting queue, with FluidToken's split when enabled."""
        if self.running is not None or not self.waiting:
            return None
        stolen = 0
        # A lone head cannot donate to anyone behind it, so Algorithm 1 would return 0.
        if budgets is not None and self.token_cfg.enabled and len(self.waiting) > 1:
            stolen = self._stolen_for_head(now, budgets)
        req = self.waiting.popleft()
        req.stolen = stolen
        req.prefill_started = True
        if stolen:
            self.stolen_tokens += stolen
            self.outbox.append(SuffixCommitted(req.rid, req.decode_worker, stolen))
        prefix = req.prompt_len - stolen
        predicted = self.prefill.time(prefix) if prefix > 0 else 0.0
        self.running = PrefillBatch(req, prefix, predicted, now)
        return self.running

    def finish_batch(self, batch: PrefillBatch, now: float) -> None:
        """The prefix's KV is computed: start the hand-off to the decode side."""
        if self.running is not batch:
            raise ValueError("finish_batch for a batch this worker is not running")
        self.running = None
        req = batch.request
        nbytes = batch.prefix_tokens * self.kv_bytes_per_token
        self.transfers[req.rid] = nbytes
        self.outbox.append(
            Handoff(req.rid, self.worker_id, req.decode_worker, batch.prefix_tokens, nbytes)
        )

    def transfer_done(self, rid: int) -> None:
        self.transfers.pop(rid, None)

    # -- FluidRole ----------------------------------------------------------------------------
    def begin_drain(self) -> None:
        """P->D drain: every queued, not-started request goes back for re-pairing."""
        for req in [*self.bootstrap.values(), *self.waiting]:
            self.outbox.append(Reroute(req, self.worker_id))
        self.bootstrap.clear()
        self.waiting.clear()

    @property
    def drained(self) -> bool:
        return (
            self.running is None and not self.transfers and not self.bootstrap and not self.waiting
        )

    def drain_cost(self, now: float) -> float:
        """P->D drain-cost proxy: remaining prefill work plus pending transfers, in seconds."""
        return self.backlog(now) + sum(self.transfer.time(b) for b in self.transfers.values())

    @property
    def queue_len(self) -> int:
        return len(self.bootstrap) + len(self.waiting)
