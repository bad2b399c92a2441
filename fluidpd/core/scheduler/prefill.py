"""Prefill side: FIFO, one request per batch, gated by the decode side's KV reservation."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from fluidpd.core.fluidtoken import FluidTokenConfig, StealPlan, plan_stealing
from fluidpd.core.predictors import FloatArray, PrefillPredictor, SuffixPredictor, TransferModel
from fluidpd.core.scheduler.messages import Handoff, Message, Reroute, SuffixCommitted
from fluidpd.core.signals import IntArray, queue_ppi
from fluidpd.core.types import SLO, Request

#: Given the decode workers a prefill worker's queue is paired with, return the per-prefill
#: stealing budget (tokens, eq. 17) each currently advertises.
BudgetSource = Callable[[Sequence[str]], FloatArray]


class QueueView(NamedTuple):
    lengths: FloatArray
    arrivals: FloatArray
    #: When the decode side's reservation let each request into the queue.
    ready: FloatArray
    deadlines: FloatArray
    peers: IntArray


class WaitingQueue:
    """The reserved-request FIFO, mirrored in numpy arrays for the per-iteration planner.

    Appends and pops at the head are amortised O(1); arrays are views, so a control
    iteration does not rebuild them from Python objects. Removal from the middle (a cancelled
    or re-paired request) compacts, which is rare.
    """

    __slots__ = ("_arr", "_deadline", "_head", "_len", "_peer", "_ready", "_reqs")

    def __init__(self, capacity: int = 64) -> None:
        self._reqs: deque[Request] = deque()
        self._len = np.zeros(capacity, dtype=np.float64)
        self._arr = np.zeros(capacity, dtype=np.float64)
        self._ready = np.zeros(capacity, dtype=np.float64)
        self._deadline = np.zeros(capacity, dtype=np.float64)
        self._peer = np.zeros(capacity, dtype=np.int64)
        self._head = 0

    def __len__(self) -> int:
        return len(self._reqs)

    def __bool__(self) -> bool:
        return bool(self._reqs)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._reqs)

    def __getitem__(self, i: int) -> Request:
        return self._reqs[i]

    def _compact(self, extra: int) -> None:
        n = len(self._reqs)
        h = self._head
        need = n + extra
        cap = len(self._len)
        if need > cap:
            cap = max(2 * cap, need)
        for name in ("_len", "_arr", "_ready", "_deadline", "_peer"):
            old = getattr(self, name)
            new = np.zeros(cap, dtype=old.dtype)
            new[:n] = old[h : h + n]
            setattr(self, name, new)
        self._head = 0

    def append(self, req: Request, deadline: float, peer: int, ready: float) -> None:
        tail = self._head + len(self._reqs)
        if tail >= len(self._len):
            self._compact(1)
            tail = len(self._reqs)
        self._len[tail] = req.prompt_len
        self._arr[tail] = req.arrival
        self._ready[tail] = ready
        self._deadline[tail] = deadline
        self._peer[tail] = peer
        self._reqs.append(req)

    def popleft(self) -> Request:
        req = self._reqs.popleft()
        self._head += 1
        if not self._reqs:
            self._head = 0
        return req

    def remove(self, rid: int) -> Request | None:
        i = next((k for k, r in enumerate(self._reqs) if r.rid == rid), -1)
        if i < 0:
            return None
        r = self._reqs[i]
        h = self._head
        n = len(self._reqs)
        for arr in (self._len, self._arr, self._ready, self._deadline, self._peer):
            arr[h + i : h + n - 1] = arr[h + i + 1 : h + n].copy()
        del self._reqs[i]
        if not self._reqs:
            self._head = 0
        return r

    def clear(self) -> None:
        self._reqs.clear()
        self._head = 0

    def arrays(self) -> QueueView:
        """The queue as array views, in queue order."""
        h, t = self._head, self._head + len(self._reqs)
        return QueueView(
            self._len[h:t], self._arr[h:t], self._ready[h:t], self._deadline[h:t], self._peer[h:t]
        )


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
    waiting: WaitingQueue = field(default_factory=WaitingQueue)
    #: Decode peers seen so far, in the order of the budget vector handed to the planner.
    peers: dict[str, int] = field(default_factory=dict)
    running: PrefillBatch | None = None
    #: KV hand-offs started and not yet confirmed, rid -> bytes.
    transfers: dict[int, int] = field(default_factory=dict)
    #: Predicted end of the forwards handed to an engine that queues and batches them itself
    #: (:meth:`hand_over`); 0.0 while none has been.
    handed_until: float = 0.0
    stolen_tokens: int = 0
    #: Testing knob: every request runs with this stealing ratio beta (prefix
    #: ``p = round((1 - beta) * L)``), whatever the planner and budgets say, so that a test
    #: can pin the P/D split of each request (beta = 1: the whole prompt runs on decode).
    forced_steal: float | None = None

    # -- intake -------------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.prefill_worker = self.worker_id
        self.bootstrap[req.rid] = req

    def reserved(self, rid: int, now: float | None = None) -> bool:
        """The paired decode worker reserved KV (at ``now``; at arrival if not given); the
        request may now be scheduled."""
        req = self.bootstrap.pop(rid, None)
        if req is None:
            return False
        peer = self.peers.setdefault(req.decode_worker, len(self.peers))
        ready = req.arrival if now is None else max(now, req.arrival)
        self.waiting.append(req, req.arrival + self.slo.ttft, peer, ready)
        return True

    def cancel(self, rid: int) -> Request | None:
        """Drop a queued request (timeout, client abort). Started requests are not touched."""
        req = self.bootstrap.pop(rid, None)
        if req is not None:
            return req
        return self.waiting.remove(rid)

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
        """Predicted seconds until the running batch (if any) finishes, behind the forwards
        handed over before it."""
        end = self.handed_until
        if self.running is not None:
            end = max(end, self.running.start) + self.running.predicted_s
        return max(0.0, end - now)

    def queued_work(self, now: float) -> float:
        """Predicted seconds to clear the running batch and the whole queue (eq. 2 summed)."""
        queued = [*self.bootstrap.values(), *self.waiting]
        return self.backlog(now) + sum(self.prefill.time(float(r.prompt_len)) for r in queued)

    def queue_ppi(self, now: float) -> float:
        """Queue-level PPI (eq. 5) over the waiting queue, counting the running batch."""
        q = self.waiting.arrays()
        return queue_ppi(
            q.lengths,
            q.arrivals,
            now,
            self.slo.ttft,
            self.prefill,
            self.backlog(now),
            self.token_cfg.eps,
        )

    def attributable_ppi(self, now: float) -> float:
        """Eq. (5) with each request's TTFT budget starting when its KV was reserved.

        Time a request spent waiting for decode admission is decode pressure (DPI_adm reports
        it), not prefill pressure. Under decode starvation requests reach the prefill queue
        already late and eq. (5) explodes through its epsilon, which would make FluidRole ask
        for *more* prefill workers. FluidRole reads this signal instead (beyond the paper); the
        two are equal whenever decode admits at once.
        """
        q = self.waiting.arrays()
        return queue_ppi(
            q.lengths,
            q.ready,
            now,
            self.slo.ttft,
            self.prefill,
            self.backlog(now),
            self.token_cfg.eps,
        )

    def plan(self, now: float, budgets: BudgetSource, head_only: bool = False) -> StealPlan:
        """One FluidToken control iteration: PPI, the paired decode workers' budgets (their
        DPI-gated eq. 17) and Algorithm 1 over the waiting queue."""
        q = self.waiting.arrays()
        return plan_stealing(
            q.lengths,
            q.deadlines,
            q.peers,
            budgets(list(self.peers)),
            now,
            self.prefill,
            self.suffix,
            self.backlog(now),
            self.token_cfg.eps,
            head_only,
        )

    def next_batch(self, now: float, budgets: BudgetSource | None) -> PrefillBatch | None:
        """Start the head of the waiting queue, with FluidToken's split when enabled."""
        if self.running is not None or not self.waiting:
            return None
        stolen = 0
        if self.forced_steal is not None:
            length = self.waiting[0].prompt_len
            stolen = length - round((1.0 - self.forced_steal) * length)
        # A lone head cannot donate to anyone behind it, so Algorithm 1 would return 0.
        elif budgets is not None and self.token_cfg.enabled and len(self.waiting) > 1:
            # Only the head's ratio is committed; the rest are re-planned next iteration.
            stolen = int(self.plan(now, budgets, head_only=True).stolen[0])
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

    def hand_over(self, batch: PrefillBatch, now: float) -> None:
        """An engine with its own queue (SGLang) takes the running batch now and runs it when
        it can, batched with others: the next request may be planned at once. Its compute,
        predicted, stays ahead of the queue (:meth:`backlog`) until its forward would end, and
        its hand-off starts as in :meth:`finish_batch`."""
        self.finish_batch(batch, now)
        self.handed_until = max(self.handed_until, batch.start) + batch.predicted_s

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

    def budget_peers(self) -> set[str]:
        """The decode workers whose stealing budgets (eq. 17) this queue's next plans read, so a
        harness keeps them fresh: those of the queued requests while at least two wait (with
        fewer there is nothing to reorder or steal for)."""
        if len(self.waiting) < 2:
            return set()
        return {r.decode_worker for r in self.waiting}
