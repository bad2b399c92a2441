"""Decode side: KV reservation before prefill, continuous batching, stolen-suffix extends."""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

from fluidpd.core.fluidtoken import (
    FluidTokenConfig,
    IterationError,
    KvIntake,
    advertised_budget,
    stream_tpot_room,
    tpot_slack,
)
from fluidpd.core.migration import BOOKING_TTL_S, Migrant, Peer
from fluidpd.core.predictors import (
    DecodeIterPredictor,
    FloatArray,
    SuffixPredictor,
    TransferModel,
)
from fluidpd.core.scheduler.messages import Finished, FirstToken, Message, Reroute, Reserved
from fluidpd.core.signals import allocatable_kv, dpi_adm, dpi_load, kv_commitment
from fluidpd.core.types import SLO, Request


@dataclass(slots=True)
class _Slot:
    """An active request in the running batch."""

    req: Request
    joined: int  # completed-iteration count when it joined
    gen0: int  # tokens generated when it joined

    def generated(self, iteration: int) -> int:
        return self.gen0 + (iteration - self.joined)

    @property
    def finish_iteration(self) -> int:
        return self.joined + self.req.max_new_tokens - self.gen0


@dataclass(slots=True)
class DecodeBatch:
    batch: int
    context: int
    suffix: list[Request]
    predicted_s: float
    start: float
    #: Consecutive iterations of an unchanged batch (a simulator runs them as one step; a live
    #: engine always asks for one).
    iterations: int = 1


def slack_bank_update(bank: float, tpot_slo: float, iteration_s: float, cap: float) -> float:
    """Stream-level TPOT slack after an iteration of ``iteration_s`` seconds.

    The paper lets a stolen suffix borrow up to eta times one iteration's slack "accumulated
    across multiple decode iterations" (eq. 15). We keep that account explicitly: every
    iteration adds S_TPOT minus its duration (negative after a long suffix iteration), capped
    at ``cap``; a suffix may run only while the account is not in debt, so a steady flow of
    stolen work cannot push every stream's average past S_TPOT.
    """
    return min(cap, bank + tpot_slo - iteration_s)


def slack_bank_after(bank: float, tpot_slo: float, iteration_s: FloatArray, cap: float) -> float:
    """:func:`slack_bank_update` applied once per iteration of ``iteration_s``, in closed form.

    With S_m the running sum of (S_TPOT - t_i) over the first m iterations, the capped
    recurrence unrolls to min(bank + S_k, cap + S_k - max_m S_m).
    """
    if len(iteration_s) == 0:
        return bank
    running = np.cumsum(tpot_slo - np.asarray(iteration_s, dtype=np.float64))
    total = float(running[-1])
    return min(bank + total, cap + total - float(running.max()), cap)


@dataclass(slots=True)
class DecodeSide:
    worker_id: str
    slo: SLO
    decode: DecodeIterPredictor
    suffix: SuffixPredictor
    transfer: TransferModel
    kv_capacity: int
    kv_bytes_per_token: int
    max_running: int
    reserve_output_clip: int
    token_cfg: FluidTokenConfig
    outbox: list[Message]
    #: Waiting for KV (SGLang's prealloc queue), in the clients' arrival order (``_enqueue``).
    prealloc: deque[Request] = field(default_factory=deque)
    #: KV reserved, hand-off not finished.
    reserved: dict[int, Request] = field(default_factory=dict)
    #: Hand-off finished, stolen suffix waiting for an eligible iteration.
    ready: deque[Request] = field(default_factory=deque)
    #: Hand-off finished (first token out) or migrated in, with tokens generated so far;
    #: joins the batch at the next iteration boundary.
    joining: list[tuple[Request, int]] = field(default_factory=list)
    #: Migrated in, KV reserved, waiting for its KV to arrive.
    migrating_in: dict[int, tuple[Request, int]] = field(default_factory=dict)
    active: dict[int, _Slot] = field(default_factory=dict)
    _finish_heap: list[tuple[int, int]] = field(default_factory=list)
    #: Committed KV tokens per held request (prompt + clipped output).
    commits: dict[int, int] = field(default_factory=dict)
    committed: int = 0
    #: Suffix tokens prefill workers committed to us and we have not run yet, per request.
    suffix_of: dict[int, int] = field(default_factory=dict)
    pending_suffix_tokens: int = 0
    iteration: int = 0
    context: int = 0
    running: DecodeBatch | None = None
    #: Members of the running batch that left it before it finished (abort, EOS).
    _left_running_batch: int = 0
    #: Stolen suffixes in the running batch whose requests were cancelled meanwhile.
    _cancelled_suffix: set[int] = field(default_factory=set)
    bank: float = 0.0
    admitting: bool = True
    migrate_on_drain: bool = False
    #: Room kept for streams a draining peer could not move here yet: rid -> (KV tokens, when
    #: the booking lapses). Admission leaves it free, so they come ahead of new requests.
    bookings: dict[int, tuple[int, float]] = field(default_factory=dict)
    stolen_tokens: int = 0
    #: The requests handed to this worker, for the edge of its KV admission (FluidToken).
    intake: KvIntake = field(default_factory=KvIntake)
    #: Measured iterations against their prediction, for the running streams' TPOT room.
    iteration_error: IterationError = field(default_factory=IterationError)

    # -- KV admission -------------------------------------------------------------------------
    def commitment(self, req: Request) -> int:
        return min(
            self.kv_capacity,
            kv_commitment(req.prompt_len, req.max_new_tokens, self.reserve_output_clip),
        )

    @property
    def held(self) -> int:
        return len(self.commits)

    def _hold(self, req: Request, around_bookings: bool = False) -> bool:
        """Reserve ``req``'s KV and a slot if they fit (``around_bookings``: leaving the room
        booked for streams migrating in free)."""
        need = self.commitment(req)
        slots = tokens = 0
        if around_bookings and self.bookings:
            slots = len(self.bookings)
            tokens = sum(booked for booked, _ in self.bookings.values())
        if (
            self.held + slots >= self.max_running
            or self.committed + need + tokens > self.kv_capacity
        ):
            return False
        self.commits[req.rid] = need
        self.committed += need
        return True

    def _release(self, rid: int) -> None:
        self.committed -= self.commits.pop(rid, 0)
        tokens = self.suffix_of.pop(rid, 0)
        self.pending_suffix_tokens -= tokens

    def add(self, req: Request, now: float | None = None) -> None:
        """A request was paired with this worker (at ``now``, the clock of ``req.arrival``):
        queue it for KV reservation."""
        req.decode_worker = self.worker_id
        self.intake.add(
            self.iteration, req.prompt_len, req.max_new_tokens, self.reserve_output_clip
        )
        self._enqueue(req, now)
        if now is not None and self.bookings:
            self.expire_bookings(now)
        self.admit()

    def _enqueue(self, req: Request, now: float | None) -> None:
        """Queue in the clients' arrival order: a request re-paired by a drain keeps its place
        in line (as vLLM puts a preempted request back at the head of its queue) instead of
        going behind everything that arrived after it. One already past its TTFT target goes
        to the back: moving it ahead would make requests that can still meet theirs late."""
        q = self.prealloc
        late = now is not None and now > req.arrival + self.slo.ttft
        if q and req.arrival < q[-1].arrival and not late:
            q.insert(bisect_right(q, req.arrival, key=attrgetter("arrival")), req)
        else:
            q.append(req)

    def admit(self) -> None:
        """Reserve KV for queued requests in queue order while capacity lasts (SGLang prealloc),
        less the room booked for streams migrating in."""
        while self.admitting and self.prealloc:
            req = self.prealloc[0]
            if not self._hold(req, around_bookings=True):
                return
            self.prealloc.popleft()
            self.reserved[req.rid] = req
            self.outbox.append(Reserved(req.rid, req.prefill_worker, self.worker_id))

    def suffix_committed(self, rid: int, tokens: int) -> None:
        if rid in self.reserved and tokens > 0:
            self.suffix_of[rid] = self.suffix_of.get(rid, 0) + tokens
            self.pending_suffix_tokens += tokens

    # -- hand-off -----------------------------------------------------------------------------
    def handoff_done(self, rid: int, prefix_tokens: int, now: float) -> None:
        """The prefix KV has arrived; either run the suffix or join the batch."""
        req = self.reserved.pop(rid, None)
        if req is None:
            return
        req.stolen = req.prompt_len - prefix_tokens
        if req.stolen > 0:
            self.ready.append(req)
            return
        self._first_token(req, now)
        if req.max_new_tokens > 1:
            self.joining.append((req, 1))

    def _first_token(self, req: Request, now: float) -> None:
        req.first_token_t = now
        self.outbox.append(FirstToken(req.rid, now))
        if req.max_new_tokens <= 1:
            req.finish_t = now
            self._release(req.rid)
            self.outbox.append(Finished(req.rid, now))
            self.admit()

    def _join(self, req: Request, generated: int) -> None:
        slot = _Slot(req, self.iteration, generated)
        self.active[req.rid] = slot
        self.context += req.prompt_len + generated
        heapq.heappush(self._finish_heap, (slot.finish_iteration, req.rid))

    # -- iterations ---------------------------------------------------------------------------
    @property
    def bank_cap(self) -> float:
        return max(0.0, (self.token_cfg.eta - 1.0) * self.slo.tpot)

    def _iterations_to_next_finish(self) -> int:
        """Iterations until the first active request finishes (stale heap entries dropped)."""
        heap = self._finish_heap
        while heap:
            due, rid = heap[0]
            slot = self.active.get(rid)
            if slot is not None and slot.finish_iteration == due:
                return max(1, due - self.iteration)
            heapq.heappop(heap)
        return 1

    def next_batch(self, now: float, max_iterations: int = 1) -> DecodeBatch | None:
        """The next iteration, or up to ``max_iterations`` of them while nothing can change the
        batch's membership by itself: no stolen suffix waiting and no member finishing before
        the last one. A harness that changes membership meanwhile (a hand-off, a cancel, a
        drain) first calls :meth:`split` and :meth:`truncate`."""
        if self.running is not None:
            return None
        if self.bookings:
            self.expire_bookings(now)
        for req, generated in self.joining:
            self._join(req, generated)
        self.joining.clear()
        n, ctx = len(self.active), self.context
        if n == 0:
            self.bank = self.bank_cap
        suffix: list[Request] = []
        suffix_s = 0.0
        if self.ready and self.bank >= 0:
            allow = self.token_cfg.eta * tpot_slack(self.slo.tpot, self.decode, n, ctx)
            joins: list[tuple[float, int]] = []
            while self.ready:
                head = self.ready[0]
                t = self.suffix.of_prompt(head.stolen, head.prompt_len)
                # The first suffix goes past eq. (15)'s allowance (it would wait for ever),
                # never past a running stream's TPOT room, which its own stream's steps
                # (and those of the suffixes before it) share once it joins.
                joins.append((self.decode.added(head.prompt_len), head.max_new_tokens))
                room = self.stream_room(now, n, ctx, joins)
                if suffix_s + t > room or (suffix and suffix_s + t > allow):
                    break
                suffix.append(self.ready.popleft())
                suffix_s += t
        if n == 0 and not suffix:
            return None
        k = 1
        if max_iterations > 1 and n and not suffix and not self.ready:
            k = min(max_iterations, self._iterations_to_next_finish())
        if k > 1:
            predicted = self.decode.span_time(n, ctx, k)
        else:
            predicted = (self.decode.time(n, ctx) if n else 0.0) + suffix_s
        self.running = DecodeBatch(n, ctx, suffix, predicted, now, k)
        return self.running

    def split(
        self, batch: DecodeBatch, done: int, now: float, iteration_s: FloatArray
    ) -> DecodeBatch:
        """End the first ``done`` iterations of a multi-iteration batch at ``now`` (the end of
        the last of them; ``iteration_s`` their durations); the rest keeps running as the
        returned batch. Nobody finishes in the part split off (the batch stops at the first
        finish), so this only advances the iteration count, the context and the slack bank."""
        if self.running is not batch or not 0 < done < batch.iterations:
            raise ValueError("split needs the running batch and 0 < done < its iterations")
        if self._left_running_batch:
            raise ValueError("split after a member left the batch")
        k, n = batch.iterations, batch.batch
        head = DecodeBatch(
            n, batch.context, [], self.decode.span_time(n, batch.context, done), batch.start, done
        )
        self.running = head
        self.finish_batch(head, now, float(sum(iteration_s)), iteration_s)
        ctx = batch.context + n * done
        self.running = DecodeBatch(
            n, ctx, [], self.decode.span_time(n, ctx, k - done), now, k - done
        )
        return self.running

    def truncate(self, batch: DecodeBatch) -> DecodeBatch:
        """Stop a multi-iteration batch after its first iteration (the one in progress), so that
        a membership change takes effect at the next boundary."""
        if self.running is not batch:
            raise ValueError("truncate for a batch this worker is not running")
        if batch.iterations == 1:
            return batch
        self.running = DecodeBatch(
            batch.batch,
            batch.context,
            [],
            self.decode.time(batch.batch, batch.context),
            batch.start,
        )
        return self.running

    def finish_batch(
        self,
        batch: DecodeBatch,
        now: float,
        measured_s: float,
        iteration_s: FloatArray | None = None,
    ) -> None:
        """The running batch ended at ``now`` after ``measured_s`` seconds (``iteration_s``:
        each iteration's duration, for a multi-iteration batch)."""
        if self.running is not batch:
            raise ValueError("finish_batch for a batch this worker is not running")
        k = batch.iterations
        if k == 1 and batch.batch:
            self.iteration_error.add(batch.predicted_s, measured_s)
        if k > 1 and self._left_running_batch:
            raise ValueError("a member left a multi-iteration batch; truncate it first")
        self.running = None
        self.iteration += k
        self.context += k * batch.batch - self._left_running_batch
        self._left_running_batch = 0
        heap = self._finish_heap
        while heap and heap[0][0] <= self.iteration:
            due, rid = heapq.heappop(heap)
            slot = self.active.get(rid)
            if slot is None or slot.finish_iteration != due:
                continue  # cancelled, finished early or migrated
            del self.active[rid]
            self.context -= slot.req.prompt_len + slot.generated(self.iteration)
            slot.req.finish_t = now
            self._release(rid)
            self.outbox.append(Finished(rid, now))
        for req in batch.suffix:
            if req.rid in self._cancelled_suffix:
                continue
            self.stolen_tokens += req.stolen
            self.pending_suffix_tokens -= self.suffix_of.pop(req.rid, 0)
            self._first_token(req, now)
            if req.max_new_tokens > 1:
                self._join(req, 1)
        self._cancelled_suffix.clear()
        if batch.batch:
            if k == 1:
                self.bank = slack_bank_update(self.bank, self.slo.tpot, measured_s, self.bank_cap)
            else:
                steps = np.full(k, measured_s / k) if iteration_s is None else iteration_s
                self.bank = slack_bank_after(self.bank, self.slo.tpot, steps, self.bank_cap)
        self.admit()

    def finish_early(self, rid: int, now: float) -> bool:
        """The request stopped before ``max_new_tokens`` (EOS, a stop id or string): it leaves
        the batch at this boundary, its KV commitment is released at once (DPI and the steal
        budget see the room; queued requests may be admitted into it) and ``Finished`` is
        emitted. Applies to a request whose first token is out: running, or joining at the
        next boundary. False if the request is not there (already finished or gone)."""
        slot = self.active.pop(rid, None)
        if slot is not None:
            self._remove_active(slot)
            req = slot.req
        else:
            i = next((k for k, (r, _) in enumerate(self.joining) if r.rid == rid), -1)
            if i < 0:
                return False
            req = self.joining.pop(i)[0]
        req.finish_t = now
        self._release(rid)
        self.outbox.append(Finished(rid, now))
        self.admit()
        return True

    def cancel(self, rid: int) -> Request | None:
        """Drop a request wherever it is (timeout, client abort, re-pairing)."""
        found: Request | None = None
        for i, r in enumerate(self.prealloc):
            if r.rid == rid:
                del self.prealloc[i]
                return r
        if rid in self.reserved:
            found = self.reserved.pop(rid)
        elif rid in self.migrating_in:
            found = self.migrating_in.pop(rid)[0]
        elif rid in self.active:
            slot = self.active.pop(rid)
            self._remove_active(slot)
            found = slot.req
        else:
            for i, r in enumerate(self.ready):
                if r.rid == rid:
                    del self.ready[i]
                    found = r
                    break
            for i, (r, _) in enumerate(self.joining):
                if r.rid == rid:
                    del self.joining[i]
                    found = r
                    break
            running = self.running.suffix if self.running is not None else []
            for r in running:
                if r.rid == rid and found is None:
                    self._cancelled_suffix.add(rid)
                    found = r
        if found is not None:
            self._release(rid)
            self.admit()
        return found

    def _remove_active(self, slot: _Slot) -> None:
        """Take a request's KV out of the batch context; if an iteration is running it was
        counted in that batch, so the batch's growth must not count it either."""
        self.context -= slot.req.prompt_len + slot.generated(self.iteration)
        if self.running is not None and slot.joined <= self.iteration:
            self._left_running_batch += 1

    # -- migration (drain mode "migrate") -----------------------------------------------------
    def detach(self, rid: int) -> tuple[Request, int]:
        """Remove an active request to move it elsewhere; call only between iterations."""
        if self.running is not None:
            raise ValueError("detach during an iteration")
        slot = self.active.pop(rid)
        generated = slot.generated(self.iteration)
        self.context -= slot.req.prompt_len + generated
        self._release(rid)
        return slot.req, generated

    def adopt(self, req: Request, generated: int, now: float) -> bool:
        """Reserve KV for a request migrating in; False if it does not fit, and then its room is
        booked until ``now`` + ``BOOKING_TTL_S`` (``fluidpd.core.migration``)."""
        self.bookings.pop(req.rid, None)
        if not self._hold(req):
            self.bookings[req.rid] = (self.commitment(req), now + BOOKING_TTL_S)
            return False
        req.decode_worker = self.worker_id
        self.migrating_in[req.rid] = (req, generated)
        return True

    def expire_bookings(self, now: float) -> bool:
        """Drop the bookings not renewed by ``now`` and admit what they held back; True if any
        lapsed."""
        lapsed = [rid for rid, (_, until) in self.bookings.items() if until <= now]
        for rid in lapsed:
            del self.bookings[rid]
        if lapsed:
            self.admit()
        return bool(lapsed)

    def next_booking_expiry(self) -> float | None:
        """When the first booking lapses (a harness wakes then: admission may resume)."""
        return min((until for _, until in self.bookings.values()), default=None)

    def activate(self, rid: int) -> None:
        """The migrated KV has arrived: the request joins at the next iteration boundary."""
        entry = self.migrating_in.pop(rid, None)
        if entry is not None:
            self.joining.append(entry)

    def migration_bytes(self, req: Request, generated: int) -> int:
        return (req.prompt_len + generated) * self.kv_bytes_per_token

    def migrants(self, move_s: Callable[[int], float]) -> list[Migrant]:
        """The active requests as drain-migrate candidates (``move_s``: seconds to move a
        number of KV bytes, the transfer model)."""
        out = []
        for rid, slot in self.active.items():
            g = slot.generated(self.iteration)
            nbytes = self.migration_bytes(slot.req, g)
            remaining = max(0, slot.req.max_new_tokens - g)
            out.append(Migrant(rid, self.commitment(slot.req), remaining, move_s(nbytes)))
        return out

    def room(self, name: str) -> Peer:
        """What this worker could still adopt, as a migration peer."""
        return Peer(name, self.kv_capacity - self.committed, self.max_running - self.held)

    def step_s(self) -> float:
        """Predicted seconds of one iteration of the current batch (a token's time here)."""
        n = len(self.active)
        return self.decode.time(n, self.context) if n else 0.0

    # -- FluidRole ----------------------------------------------------------------------------
    def begin_drain(self, migrate: bool) -> None:
        """D->P drain: stop admitting; not-yet-reserved requests go back for re-pairing. Room
        booked for peers' streams goes too: a draining worker adopts nothing."""
        self.admitting = False
        self.migrate_on_drain = migrate
        self.bookings.clear()
        for req in self.prealloc:
            self.outbox.append(Reroute(req, self.worker_id))
        self.prealloc.clear()

    @property
    def drained(self) -> bool:
        return (
            self.running is None
            and not self.prealloc
            and not self.reserved
            and not self.ready
            and not self.joining
            and not self.migrating_in
            and not self.active
        )

    def drain_cost(self) -> float:
        """D->P drain-cost proxy: requests this worker must still serve (the paper's count)."""
        return float(self.held)

    # -- signals ------------------------------------------------------------------------------
    def n_tpot(self) -> int:
        n = len(self.active)
        mean_ctx = self.context / n if n else 0.0
        return min(self.max_running, self.decode.max_batch(self.slo.tpot, mean_ctx))

    def dpi_load(self) -> float:
        return dpi_load(self.context, self.kv_capacity, len(self.active), self.n_tpot())

    def allocatable(self) -> int:
        active = self.context
        reserved = max(0, self.committed - active)
        return allocatable_kv(self.kv_capacity, active, reserved)

    def dpi_adm(self) -> float:
        return dpi_adm(self.allocatable(), self.kv_capacity)

    def pending_suffixes(self) -> list[tuple[int, int]]:
        """(tokens, prefix) of every suffix committed here and not yet run: its request is
        reserved (the prefix KV on its way) or ready (the prefix here)."""
        prompts = {req.rid: req.prompt_len for req in self.ready}
        out = []
        for rid, tokens in self.suffix_of.items():
            req = self.reserved.get(rid)
            prompt = req.prompt_len if req is not None else prompts.get(rid, tokens)
            out.append((tokens, max(0, prompt - tokens)))
        return out

    def stream_room(
        self, now: float, batch: int, context: int, joins: Sequence[tuple[float, int]] = ()
    ) -> float:
        """``stream_tpot_room`` of the running streams at ``now``, for an iteration of
        ``batch`` streams over ``context`` tokens, with the requests ``joins`` adds."""
        streams = (
            (now - s.req.first_token_t, s.generated(self.iteration), s.req.max_new_tokens)
            for s in self.active.values()
        )
        return stream_tpot_room(
            self.slo.tpot,
            self.decode.time(batch, context),
            streams,
            self.iteration_error.stretch,
            joining=joins,
        )

    def steal_budget(self, n_prefill: int) -> float:
        """Per-prefill-worker stealing budget this worker advertises (eqs. 12-17,
        ``advertised_budget``); 0 while requests already wait for KV here or the requests
        coming in will fill it (``KvIntake``)."""
        return advertised_budget(
            self.slo.tpot,
            self.decode,
            self.suffix,
            len(self.active),
            self.context,
            self.pending_suffixes(),
            self.dpi_load(),
            n_prefill,
            self.token_cfg,
            self.admitting and not self.prealloc,
            self.intake.forecast(self.iteration, self.kv_capacity),
        )
