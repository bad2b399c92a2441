"""The sidecar's engine room: the shared scheduler in real time, and the messages it sends.

One asyncio task runs the plan/execute/complete cycle of ``fluidpd.core.scheduler.Worker``
against the engine; HTTP handlers only feed it (new halves, reservations, hand-offs, aborts,
role switches) and wake it. Every message the scheduler puts in its outbox is delivered here:
to a peer sidecar over HTTP, or to the router through the request's decode event stream.

On a decode worker every output token goes through the request's ``OutputStream`` right
after the step that made it (detokenization, EOS / stop ids / stop strings), and a request
that stopped leaves the batch at that boundary (``DecodeSide.finish_early``). The stream to the
router is coalesced (``stream_interval_s``); the first and the last tokens go out at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fluidpd.api.internal import (
    Abort,
    Adopt,
    DecodeEvent,
    DecodeHalf,
    Handoff,
    PrefillHalf,
    PrefillOutcome,
    PressureReport,
    Released,
    RequestHalf,
    Reserved,
    RetireRequest,
    RoleRequest,
    RoleStatus,
    SuffixCommit,
)
from fluidpd.api.sampling import SampledToken
from fluidpd.core.fluidtoken import FluidTokenConfig
from fluidpd.core.migration import Peer, plan_migration
from fluidpd.core.profile import Profile
from fluidpd.core.scheduler import messages as msg
from fluidpd.core.scheduler.prefill import PrefillBatch
from fluidpd.core.scheduler.worker import Worker
from fluidpd.core.signals import allocatable_kv
from fluidpd.core.types import SLO, Request, Role, RoleState
from fluidpd.modeldir.model_dir import ModelDir
from fluidpd.modeldir.text import TokenText
from fluidpd_sidecar.engine import Engine, kv_stamp
from fluidpd_sidecar.metrics import SidecarMetrics
from fluidpd_sidecar.peers import PeerError, Peers
from fluidpd_sidecar.stopping import OutputStream
from fluidpd_sidecar.transfer import KVDest, KVTransfer

log = logging.getLogger("fluidpd.sidecar")


class Conflict(RuntimeError):
    """The request cannot be served in the worker's current role or state (HTTP 409)."""


class NotFound(KeyError):
    """No such request here (HTTP 404)."""


class BadRequest(ValueError):
    """The request cannot be served at all (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class SidecarConfig:
    worker_id: str
    role: Role
    url: str
    profile: Profile
    slo: SLO
    #: What is served: its tokenizer detokenizes, its EOS ids stop, its vocabulary bounds ids.
    model: ModelDir
    token_cfg: FluidTokenConfig = FluidTokenConfig()
    adaptive: bool = False
    admin_token: str | None = None
    #: Tokens are streamed to the router at most this often (first and last token at once).
    stream_interval_s: float = 0.05
    #: While a prefill queue is under pressure, paired decode budgets are refreshed this often.
    budget_refresh_s: float = 0.1
    #: A prefill half whose decode peer never reserves KV is given up after this long
    #: (SGLang's SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT plays the same role).
    bootstrap_timeout_s: float = 300.0
    #: Testing knob: every prefill runs with this stealing ratio (``PrefillSide.forced_steal``).
    force_steal: float | None = None
    #: A migrated-in request that ended before the router re-attached to its event stream
    #: keeps its events this long for the router to read (then it is dropped).
    unclaimed_timeout_s: float = 60.0

    @property
    def context_limit(self) -> int:
        return self.model.context_limit(self.profile.context_limit)


@dataclass(slots=True)
class _PrefillHalf:
    req: Request
    decode_url: str
    outcome: asyncio.Future[PrefillOutcome]
    dest: KVDest | None = None
    aborted: bool = False
    #: Local receipt time (the request's arrival is the router's, and could be anything).
    received: float = field(default_factory=time.time)


@dataclass(slots=True)
class _DecodeHalf:
    req: Request
    prefill_url: str
    half: DecodeHalf
    stream: OutputStream
    events: asyncio.Queue[DecodeEvent | None] = field(default_factory=asyncio.Queue)
    #: Output tokens read from the engine into ``stream`` (those of a migrated-in request too).
    fed: int = 0
    closed: bool = False
    dest: KVDest | None = None
    received: float = field(default_factory=time.time)
    #: Someone is reading the event stream (the decode call itself, or the router after a
    #: migration); a second reader would steal its events.
    subscribed: bool = False


def check_half(half: RequestHalf, context_limit: int, vocab: int) -> None:
    """What the router checked already, checked again on every engine's sidecar: a peer must
    not crash an engine (over-long requests, token ids outside the vocabulary)."""
    if half.prompt_len + half.max_new_tokens > context_limit:
        raise BadRequest(
            f"prompt_ids: {half.prompt_len} tokens + max_new_tokens "
            f"({half.max_new_tokens}) exceed the context limit {context_limit}"
        )
    for name, ids in (("prompt_ids", half.prompt_ids),
                      ("sampling.stop_token_ids", half.sampling.stop_token_ids)):  # fmt: skip
        if ids and (min(ids) < 0 or max(ids) >= vocab):
            raise BadRequest(f"{name}: token ids must be in [0, {vocab})")


class SidecarService:
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
        self.metrics = SidecarMetrics(self)
        self.peers = Peers(cfg.admin_token)
        self.prefill_halves: dict[int, _PrefillHalf] = {}
        self.decode_halves: dict[int, _DecodeHalf] = {}
        #: Ended decode halves nobody has read yet (migrated in, the router not yet attached),
        #: with the time they ended: their events wait here for the router.
        self._unclaimed: dict[int, tuple[_DecodeHalf, float]] = {}
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
        #: A retirement nobody completed (the worker was not deleted) ends at this time.
        self._retire_until = float("inf")
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._stopping = False

    # -- lifecycle ----------------------------------------------------------------------------
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

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def wake(self) -> None:
        self._wake.set()

    # -- the scheduler loop -------------------------------------------------------------------
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
                    await self._wake.wait()
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

    def _budget_source(self, decode_ids: Sequence[str]) -> np.ndarray:
        return np.array([self.budgets.get(d, 0.0) for d in decode_ids], dtype=np.float64)

    # -- outbox -------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        # Delivering a message can make more (a first token that is EOS finishes the request).
        while messages := self.worker.take_outbox():
            for m in messages:
                self._deliver(m)

    def _deliver(self, m: msg.Message) -> None:
        if isinstance(m, msg.Reserved):
            self._spawn(self._send_reserved(m))
        elif isinstance(m, msg.SuffixCommitted):
            self._spawn(self._send_suffix(m))
        elif isinstance(m, msg.Handoff):
            self._spawn(self._handoff(m))
        elif isinstance(m, msg.FirstToken):
            self._first_token(m)
        elif isinstance(m, msg.Finished):
            self._finished(m)
        elif isinstance(m, msg.Reroute):
            self._reroute(m.request.rid)

    async def _send_reserved(self, m: msg.Reserved) -> None:
        half = self.decode_halves.get(m.rid)
        if half is None:
            return
        # Transport room is taken when the core admits the request (KV reserved), not on
        # arrival; while the arena is full the reservation waits its turn (FIFO, like SGLang's
        # prealloc queue), since the prefill side must not start a prompt whose KV has nowhere
        # to go.
        needs_room = half.dest is None and self.transfer.arena_bytes > 0
        if needs_room and (self._awaiting_room or not self._reserve_room(half)):
            self._awaiting_room.append(m)
            return
        body = Reserved(
            rid=m.rid,
            decode_worker=self.cfg.worker_id,
            t=time.time(),
            budget=self.worker.decode.steal_budget(self.n_prefill),
            kv_session=half.dest.session if half.dest else "",
            kv_addr=half.dest.addr if half.dest else 0,
            kv_nbytes=half.dest.nbytes if half.dest else 0,
        )
        for attempt in range(2):
            try:
                await self.peers.post(half.prefill_url, "/v1/internal/reserved", body)
                return
            except PeerError as exc:
                # Telling the prefill side twice is harmless (it applies a reservation once),
                # and a pooled connection the peer just closed fails the first try now and then.
                if attempt == 0:
                    continue
                log.warning("reservation for %d not delivered: %s", m.rid, exc)
        # The reservation goes back too, or its KV would stay committed for good.
        self.worker.decode.cancel(m.rid)
        self._dispatch()
        self._end_decode(m.rid, DecodeEvent(event="error", detail="prefill peer unreachable"))

    def _reserve_room(self, half: _DecodeHalf) -> bool:
        half.dest = self.transfer.reserve(self.engine.kv_wire_bytes(half.req.prompt_len))
        return half.dest is not None

    def _free_room(self, half: _DecodeHalf) -> None:
        if half.dest is not None:
            self.transfer.free(half.dest)
            half.dest = None
        # Also when nothing was freed: a half that ended while waiting leaves the queue.
        while self._awaiting_room:
            waiting = self.decode_halves.get(self._awaiting_room[0].rid)
            if waiting is not None and not self._reserve_room(waiting):
                return
            m = self._awaiting_room.popleft()
            if waiting is not None:
                self._spawn(self._send_reserved(m))

    def _free_loaded(self) -> None:
        """Room of hand-offs the engine has loaded goes back to the arena at once, not when
        the request finishes decoding (long outputs would hold it for their whole life)."""
        for rid in self.engine.take_loaded():
            half = self.decode_halves.get(rid)
            if half is not None:
                self._free_room(half)

    async def _send_suffix(self, m: msg.SuffixCommitted) -> None:
        half = self.prefill_halves.get(m.rid)
        if half is None:
            return
        try:
            answer = await self.peers.post(
                half.decode_url, "/v1/internal/suffix", SuffixCommit(rid=m.rid, tokens=m.tokens)
            )
            self.budgets[m.decode_worker] = float(answer.get("budget", 0.0))
        except PeerError as exc:
            log.warning("suffix commit for %d not delivered: %s", m.rid, exc)

    async def _handoff(self, m: msg.Handoff) -> None:
        half = self.prefill_halves.get(m.rid)
        outcome = PrefillOutcome(status="cancelled", detail="aborted")
        try:
            if half is not None and not half.aborted:
                region = self.engine.export_kv(m.rid, m.prefix_tokens)
                nbytes = region.nbytes if region else m.nbytes
                first = None
                if m.prefix_tokens == half.req.prompt_len:
                    first = self.engine.first_token(m.rid)
                    if first is None:
                        raise RuntimeError("the engine sampled no first token")
                await self.transfer.send(region.addr if region else None, half.dest, nbytes)
                self.metrics.kv_sent.labels(self.cfg.worker_id).inc(m.nbytes)
                body = Handoff(
                    rid=m.rid, prefix_tokens=m.prefix_tokens, nbytes=m.nbytes, first=first
                )
                await self.peers.post(half.decode_url, "/v1/internal/handoff", body)
                outcome = PrefillOutcome(status="done", stolen=half.req.stolen)
                log.info(
                    "request %d prefill done: %d tokens handed off (%d B), %d stolen",
                    m.rid, m.prefix_tokens, nbytes, half.req.stolen,
                )  # fmt: skip
        except Exception as exc:  # the transport or the peer failed: the half ends with an error
            log.warning("hand-off of %d failed: %s", m.rid, exc)
            outcome = PrefillOutcome(status="cancelled", detail=f"hand-off failed: {exc}")
        finally:
            self.worker.prefill.transfer_done(m.rid)
            self._resolve_prefill(m.rid, outcome)
            self.wake()

    def _resolve_prefill(self, rid: int, outcome: PrefillOutcome) -> None:
        half = self.prefill_halves.pop(rid, None)
        if half is None:
            return
        self.engine.release(rid)
        if not half.outcome.done():
            half.outcome.set_result(outcome)

    def _push(self, half: _DecodeHalf, event: DecodeEvent) -> None:
        if not half.closed:
            half.events.put_nowait(event)

    def _advance(self, half: _DecodeHalf, n: int) -> bool:
        """Feeds the engine's output tokens up to ``n`` into the request's stream; True if
        the request has stopped."""
        if n > half.fed and half.stream.finish is None:
            half.stream.feed(self.engine.outputs(half.req.rid, half.fed, n))
            half.fed = n
        return half.stream.finish is not None

    def _emit(self, half: _DecodeHalf, t: float, final: bool = False) -> None:
        ids, text, logprobs = half.stream.take(final)
        if ids or text:
            n = half.stream.count
            self._push(half, DecodeEvent(event="token", n=n, ids=ids, text=text,
                                         logprobs=logprobs, t=t))  # fmt: skip

    def _check_stops(self, now: float) -> None:
        """After a decode step: read every running request's new tokens; those that stopped
        leave the batch now and free their KV (their ``Finished`` follows)."""
        d = self.worker.decode
        stopped = [
            rid
            for rid, slot in d.active.items()
            if (half := self.decode_halves.get(rid)) is not None
            and self._advance(half, slot.generated(d.iteration))
        ]
        for rid in stopped:
            d.finish_early(rid, now)
        if stopped:
            self._dispatch()

    def _first_token(self, m: msg.FirstToken) -> None:
        half = self.decode_halves.get(m.rid)
        if half is None:
            return
        self.metrics.first_token(m.t - half.req.arrival)
        if self._advance(half, 1):
            self.worker.decode.finish_early(m.rid, m.t)  # its Finished is delivered next
            return
        self._emit(half, m.t)

    def _finished(self, m: msg.Finished) -> None:
        half = self.decode_halves.get(m.rid)
        if half is None:
            return
        req = half.req
        stream = half.stream
        if not self._advance(half, req.max_new_tokens):
            stream.end()
        self._emit(half, m.t, final=True)
        self.metrics.finished(req, m.t, stream.count)
        reason = stream.finish or "length"
        done = DecodeEvent(event="done", n=stream.count, finish_reason=reason, t=m.t)
        self._end_decode(m.rid, done)

    def _end_decode(self, rid: int, event: DecodeEvent) -> None:
        half = self.decode_halves.pop(rid, None)
        if half is None:
            return
        if event.event == "done":
            log.info("request %d finished (%s, %d tokens)", rid, event.finish_reason, event.n)
        elif event.event == "error":
            log.warning("request %d failed: %s", rid, event.detail)
        else:
            log.info("request %d ended here: %s (%s)", rid, event.event, event.detail)
        self._push(half, event)
        half.closed = True
        half.events.put_nowait(None)
        if not half.subscribed:
            # Migrated in and already over before the router came for its stream (it learns
            # the new URL only after the activation): keep the events for it.
            self._unclaimed[rid] = (half, time.time())
        self._free_room(half)
        self.engine.release(rid)

    def expire_unclaimed(self, now: float) -> None:
        """Drops ended, unread halves older than ``unclaimed_timeout_s`` (their router is gone)."""
        limit = now - self.cfg.unclaimed_timeout_s
        for rid in [r for r, (_, t) in self._unclaimed.items() if t <= limit]:
            del self._unclaimed[rid]
            log.info("request %d: migrated in and ended, but never claimed; dropped", rid)

    def _reroute(self, rid: int) -> None:
        if rid in self.prefill_halves:
            self._resolve_prefill(rid, PrefillOutcome(status="reroute", detail="worker draining"))
        if rid in self.decode_halves:
            self._end_decode(rid, DecodeEvent(event="reroute", detail="worker draining"))

    async def _flush_streams(self) -> None:
        """Streams generated tokens in coalesced chunks (timing-exact first and last tokens are
        sent as they happen)."""
        last_sweep = 0.0
        while not self._stopping:
            await asyncio.sleep(self.cfg.stream_interval_s)
            now = time.time()
            for half in list(self.decode_halves.values()):
                self._emit(half, now)
            if now - last_sweep >= 1.0:
                last_sweep = now
                self._expire_bootstrap(now)
                self.expire_unclaimed(now)
                self.expire_retirement(now)

    def _expire_bootstrap(self, now: float) -> None:
        """Gives up halves whose peer never came through: a prefill half never reserved, a
        decode half never handed its KV (or, migrating in, never activated)."""
        limit = now - self.cfg.bootstrap_timeout_s
        d = self.worker.decode
        waiting = [*d.prealloc, *d.reserved.values(), *(r for r, _ in d.migrating_in.values())]
        for req in waiting:
            half = self.decode_halves.get(req.rid)
            if half is None or half.received >= limit:
                continue
            d.cancel(req.rid)
            self._end_decode(
                req.rid,
                DecodeEvent(
                    event="error",
                    detail=f"no KV hand-off from the prefill peer within "
                    f"{self.cfg.bootstrap_timeout_s:g} s",
                ),
            )
        stale = [
            rid
            for rid in self.worker.prefill.bootstrap
            if rid in self.prefill_halves and self.prefill_halves[rid].received < limit
        ]
        for rid in stale:
            self.worker.prefill.cancel(rid)
            self._resolve_prefill(
                rid,
                PrefillOutcome(
                    status="cancelled",
                    detail=f"no KV reservation from the decode peer within "
                    f"{self.cfg.bootstrap_timeout_s:g} s",
                ),
            )

    async def _refresh_budgets(self) -> None:
        """While this prefill queue is under stealing pressure, keep its peers' budgets fresh."""
        while not self._stopping:
            await asyncio.sleep(self.cfg.budget_refresh_s)
            w = self.worker
            if w.role is not Role.PREFILL or not self.cfg.token_cfg.enabled:
                continue
            if len(w.prefill.waiting) < 2:
                continue
            peers = {r.decode_worker for r in w.prefill.waiting}
            for d in peers:
                url = self._decode_urls.get(d)
                if url is None:
                    continue
                try:
                    answer = await self.peers.get(url, "/v1/internal/budget")
                    self.budgets[d] = float(answer.get("budget", 0.0))
                except PeerError:
                    self.budgets[d] = 0.0

    # -- request halves -----------------------------------------------------------------------
    def _check_accepting(self, role: Role) -> None:
        w = self.worker
        if w.role is not role:
            raise Conflict(f"worker {self.cfg.worker_id} is {w.role.value}, not {role.value}")
        if not w.accepting:
            raise Conflict(f"worker {self.cfg.worker_id} is {w.state.value}; not taking work")

    def accept_prefill(self, half: PrefillHalf) -> asyncio.Future[PrefillOutcome]:
        self._check_accepting(Role.PREFILL)
        check_half(half, self.cfg.context_limit, self.cfg.model.vocab_size)
        if half.rid in self.prefill_halves:
            raise Conflict(f"request {half.rid} is already queued here")
        req = Request(half.rid, half.arrival, half.prompt_len, half.max_new_tokens)
        req.decode_worker = half.decode_worker
        future: asyncio.Future[PrefillOutcome] = asyncio.get_running_loop().create_future()
        try:
            self.engine.admit(half.rid, half.prompt_ids, half.sampling)
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        self.prefill_halves[half.rid] = _PrefillHalf(req, half.decode_url, future)
        self._decode_urls[half.decode_worker] = half.decode_url
        self.worker.prefill.add(req)
        log.info(
            "request %d admitted for prefill (%d prompt tokens, decode on %s)",
            half.rid, half.prompt_len, half.decode_worker,
        )  # fmt: skip
        early = self._early_reserved.pop(half.rid, None)
        if early is not None:
            self.reserved(early)
        return future

    def reserved(self, body: Reserved) -> None:
        half = self.prefill_halves.get(body.rid)
        if half is None:
            # The decode side can be faster than the router's prefill call: keep it briefly.
            self._early_reserved[body.rid] = body
            if len(self._early_reserved) > 10_000:
                self._early_reserved.pop(next(iter(self._early_reserved)))
            return
        self.budgets[body.decode_worker] = body.budget
        if body.kv_session:
            half.dest = KVDest(body.kv_session, body.kv_addr, body.kv_nbytes)
        if self.worker.prefill.reserved(body.rid, body.t):
            self.wake()

    def _decode_state(self, half: DecodeHalf, output_ids: list[int] | None = None) -> _DecodeHalf:
        req = Request(half.rid, half.arrival, half.prompt_len, half.max_new_tokens)
        req.prefill_worker = half.prefill_worker
        stream = OutputStream(self.text, half.sampling, self.cfg.model.eos_token_ids)
        try:
            self.engine.admit(half.rid, half.prompt_ids, half.sampling, output_ids or ())
        except ValueError as exc:  # the engine's own checks (its vocabulary): bad input
            raise BadRequest(str(exc)) from exc
        state = _DecodeHalf(req, half.prefill_url, half, stream)
        if output_ids:
            stream.feed(SampledToken(i) for i in output_ids)
            stream.skip_sent()  # the source sent their text already
            state.fed = len(output_ids)
        return state

    def accept_decode(self, half: DecodeHalf) -> _DecodeHalf:
        self._check_accepting(Role.DECODE)
        check_half(half, self.cfg.context_limit, self.cfg.model.vocab_size)
        if half.rid in self.decode_halves:
            raise Conflict(f"request {half.rid} is already here")
        state = self._decode_state(half)
        self.decode_halves[half.rid] = state
        self.worker.decode.add(state.req)
        log.info(
            "request %d admitted for decode (%d prompt tokens, up to %d new, prefill on %s)",
            half.rid, half.prompt_len, half.max_new_tokens, half.prefill_worker,
        )  # fmt: skip
        self._dispatch()
        self.wake()
        return state

    def subscribe(self, half: _DecodeHalf) -> _DecodeHalf:
        if half.subscribed:
            raise Conflict(f"request {half.req.rid} is already being streamed")
        half.subscribed = True
        return half

    async def events(self, half: _DecodeHalf) -> AsyncIterator[bytes]:
        """The decode half's NDJSON event stream; closing it early aborts the request."""
        try:
            while True:
                event = await half.events.get()
                if event is None:
                    return
                yield event.model_dump_json().encode() + b"\n"
        finally:
            self._unclaimed.pop(half.req.rid, None)
            if not half.closed:
                self.abort(Abort(rid=half.req.rid, reason="router went away"))

    def decode_half(self, rid: int) -> _DecodeHalf:
        half = self.decode_halves.get(rid)
        if half is None and rid in self._unclaimed:
            half = self._unclaimed[rid][0]
        if half is None:
            raise NotFound(f"no decode half for request {rid} here")
        return half

    def suffix_committed(self, body: SuffixCommit) -> float:
        self.worker.decode.suffix_committed(body.rid, body.tokens)
        return self.worker.decode.steal_budget(self.n_prefill)

    def budget(self) -> float:
        if self.worker.role is not Role.DECODE:
            return 0.0
        return self.worker.decode.steal_budget(self.n_prefill)

    def handoff_done(self, body: Handoff) -> None:
        half = self.decode_halves.get(body.rid)
        if half is None:
            raise NotFound(f"no decode half for request {body.rid} here")
        if body.nbytes and self.transfer.arena_bytes and half.dest is None:
            # Never reached while reservations wait for room; if it were, decoding without the
            # prefix KV would produce garbage silently.
            self._end_decode(body.rid, DecodeEvent(event="error", detail="KV sent without room"))
            raise BadRequest(f"request {body.rid}: {body.nbytes} B of KV arrived with no room")
        if half.dest is not None and body.nbytes:
            self.metrics.kv_received.labels(self.cfg.worker_id).inc(body.nbytes)
            self._verify_kv(half)
        view = getattr(self.transfer, "view", None)
        kv = view(half.dest.addr, half.dest.nbytes) if view and half.dest else None
        try:
            if body.prefix_tokens > half.req.prompt_len:
                raise ValueError(
                    f"{body.prefix_tokens} prefix tokens of a {half.req.prompt_len}-token prompt"
                )
            if body.prefix_tokens == half.req.prompt_len and body.first is None:
                raise ValueError("the whole prompt was handed off without its first token")
            self.engine.import_kv(body.rid, body.prefix_tokens, kv, body.first)
        except ValueError as exc:
            self.worker.decode.cancel(body.rid)
            self._dispatch()
            self._end_decode(body.rid, DecodeEvent(event="error", detail=f"KV import: {exc}"))
            raise BadRequest(str(exc)) from exc
        self.worker.decode.handoff_done(body.rid, body.prefix_tokens, time.time())
        self._dispatch()
        self.wake()

    def _verify_kv(self, half: _DecodeHalf) -> None:
        """The transport moved real bytes: check the first ones are this request's."""
        view = getattr(self.transfer, "view", None)
        if view is None or half.dest is None:
            return
        stamp = kv_stamp(half.req.rid)
        if bytes(view(half.dest.addr, len(stamp))) != stamp:
            self.metrics.kv_corrupt()
            log.error("KV of request %d arrived corrupted", half.req.rid)

    def abort(self, body: Abort) -> bool:
        """Cancels a request's half here, wherever it is; True if there was one."""
        rid = body.rid
        found = False
        pre = self.prefill_halves.get(rid)
        if pre is not None:
            found = True
            pre.aborted = True
            if self.worker.prefill.cancel(rid) is not None:
                # Not started: nothing runs on it any more. (A started one ends in its
                # hand-off, which sees ``aborted`` and releases it.)
                self._resolve_prefill(rid, PrefillOutcome(status="cancelled", detail=body.reason))
        self._early_reserved.pop(rid, None)
        if rid in self._unclaimed:
            found = True  # it ended already; its events wait for a reader that is not coming
            del self._unclaimed[rid]
        if rid in self.decode_halves:
            found = True
            self.worker.decode.cancel(rid)
            self._dispatch()
            self._end_decode(rid, DecodeEvent(event="cancelled", detail=body.reason))
        self.wake()
        return found

    def release(self, rid: int) -> Released:
        """A draining decode peer asks to re-pair a request whose prefill has not started."""
        if self.worker.prefill.cancel(rid) is None:
            return Released(released=False)
        self._resolve_prefill(rid, PrefillOutcome(status="reroute", detail="decode peer draining"))
        self.wake()
        return Released(released=True)

    # -- migration (drain "migrate") ---------------------------------------------------------
    @property
    def _moves_kv(self) -> bool:
        """The engine's decode KV travels with a migrated request (real bytes; the ``sim``
        engine's outputs need none, so it moves only the modelled time)."""
        return hasattr(self.engine, "export_decode") and self.transfer.arena_bytes > 0

    def adopt(self, body: Adopt) -> KVDest | None:
        """Takes over a request migrating in; returns where its KV is to be written."""
        self._check_accepting(Role.DECODE)
        if not getattr(self.engine, "migrates_kv", True):
            raise Conflict(f"engine {self.engine.name} cannot adopt a request without its KV")
        half = body.half
        check_half(half, self.cfg.context_limit, self.cfg.model.vocab_size)
        if half.rid in self.decode_halves or half.rid in self._unclaimed:
            raise Conflict(f"request {half.rid} is already here")
        state = self._decode_state(half, body.output_ids)
        state.req.first_token_t = body.first_token_t
        if not self.worker.decode.adopt(state.req, body.generated):
            self.engine.release(half.rid)
            raise Conflict(f"no KV room for request {half.rid}")
        if self._moves_kv:
            tokens = half.prompt_len + body.generated - 1
            state.dest = self.transfer.reserve(self.engine.kv_wire_bytes(tokens))
            if state.dest is None:
                self.worker.decode.cancel(half.rid)
                self.engine.release(half.rid)
                raise Conflict(f"no KV transport room for request {half.rid}")
        self.decode_halves[half.rid] = state
        log.info("request %d adopted (migrating in after %d tokens)", half.rid, body.generated)
        return state.dest

    def activate(self, rid: int) -> None:
        half = self.decode_halves.get(rid)
        if half is None or rid not in self.worker.decode.migrating_in:
            raise NotFound(f"no adopted request {rid} here")
        if half.dest is not None:
            view = getattr(self.transfer, "view")  # noqa: B009 - byte-moving transports only
            self.metrics.kv_received.labels(self.cfg.worker_id).inc(half.dest.nbytes)
            self._verify_kv(half)
            try:
                self.engine.import_decode(rid, view(half.dest.addr, half.dest.nbytes))  # type: ignore[attr-defined]
            except ValueError as exc:
                self.worker.decode.cancel(rid)
                self._end_decode(rid, DecodeEvent(event="error", detail=f"KV import: {exc}"))
                raise BadRequest(str(exc)) from exc
        self.worker.decode.activate(rid)
        self.wake()

    async def _peer_room(self) -> list[Peer]:
        """The migration peers that are Active decode workers now, with their free KV."""
        room = []
        for url in self._migrate_to:
            try:
                p = await self.peers.get(url, "/pressure")
            except PeerError:
                continue
            if p.get("role") != Role.DECODE.value or p.get("state") != RoleState.ACTIVE.value:
                continue
            free = allocatable_kv(int(p["kv_capacity"]), int(p["kv_used"]), int(p["kv_reserved"]))
            # Its running-request limit is not in /pressure: its adopt answers 409 when full.
            room.append(Peer(url, free, 1 << 30))
        return room

    async def _migrate_out(self) -> None:
        d = self.worker.decode
        if not d.migrate_on_drain or not d.active or d.running is not None:
            return
        move_s = self.cfg.profile.transfer_model().time
        plan = plan_migration(d.migrants(move_s), await self._peer_room(), d.step_s())
        moves: list[tuple[int, str, _DecodeHalf, Adopt]] = []
        for rid, target in plan:
            half = self.decode_halves.get(rid)
            slot = d.active.get(rid)
            if half is None or slot is None or d.running is not None:
                continue
            generated = slot.generated(d.iteration)
            if self._advance(half, generated):
                d.finish_early(rid, time.time())  # it stopped: it finishes here instead
                self._dispatch()
                continue
            self._emit(half, time.time())
            body = Adopt(
                half=half.half,
                generated=generated,
                output_ids=half.stream.output_ids,
                first_token_t=half.req.first_token_t,
            )
            moves.append((rid, target, half, body))
        # Every adoption of the plan at once: the drain pays one round trip, not one per
        # request (no step runs meanwhile: this is the scheduler's own task).
        answers = await asyncio.gather(
            *(self.peers.post(target, "/v1/internal/adopt", body) for _, target, _, body in moves),
            return_exceptions=True,
        )
        for (rid, target, half, _), answer in zip(moves, answers, strict=True):
            if isinstance(answer, BaseException):
                log.info("migration of %d to %s refused: %s", rid, target, answer)
                continue
            if rid not in d.active:
                # Finished or aborted while we asked: the adopted copy must not decode alone.
                self._spawn(self._abort_peer(target, rid, "migration source ended it"))
                continue
            req, generated = d.detach(rid)
            nbytes = d.migration_bytes(req, generated)
            dest = None
            if answer.get("kv_nbytes"):
                dest = KVDest(
                    answer["kv_session"], int(answer["kv_addr"]), int(answer["kv_nbytes"])
                )
            detach = getattr(self.engine, "detach", None)
            if detach is not None:
                detach(rid)  # out of the engine's next step: its KV must not grow while copied
            self.decode_halves.pop(rid, None)
            self._spawn(self._move(half, target, nbytes, dest, generated))

    async def _move(
        self, half: _DecodeHalf, target: str, nbytes: int, dest: KVDest | None, generated: int
    ) -> None:
        rid = half.req.rid
        try:
            if dest is not None and self._moves_kv:
                region = await self.engine.export_decode(rid, generated)  # type: ignore[attr-defined]
                await self.transfer.send(region.addr, dest, region.nbytes)
                self.metrics.kv_sent.labels(self.cfg.worker_id).inc(region.nbytes)
            else:
                await self.transfer.send(None, None, nbytes)
            await self.peers.post(
                target, "/v1/internal/activate", Abort(rid=rid, reason="migrated")
            )
            self._push(half, DecodeEvent(event="migrated", url=target, n=half.fed))
            log.info("request %d migrated to %s after %d tokens", rid, target, half.fed)
        except Exception as exc:
            log.warning("request %d failed: migration to %s failed: %s", rid, target, exc)
            self._push(half, DecodeEvent(event="error", detail=f"migration failed: {exc}"))
            await self._abort_peer(target, rid, "migration failed")
        finally:
            half.closed = True
            half.events.put_nowait(None)
            self.engine.release(rid)
            self.wake()

    async def _abort_peer(self, url: str, rid: int, reason: str) -> None:
        try:
            await self.peers.post(url, "/v1/internal/abort", Abort(rid=rid, reason=reason))
        except PeerError as exc:
            log.info("abort of %d on %s not delivered: %s", rid, url, exc)

    # -- FluidRole ----------------------------------------------------------------------------
    def role_status(self) -> RoleStatus:
        sm = self.worker.role_sm
        return RoleStatus(
            worker=self.cfg.worker_id,
            role=sm.role,
            state=sm.state,
            target=sm.target,
            since=sm.since,
            switches=self.switches,
            retiring=sm.retiring,
        )

    def request_role(self, body: RoleRequest) -> RoleStatus:
        w = self.worker
        sm = w.role_sm
        if sm.state is RoleState.ACTIVE and sm.role is body.role:
            return self.role_status()  # already there: idempotent
        if sm.state is not RoleState.ACTIVE:
            if sm.target is body.role:
                return self.role_status()  # the same switch is under way
            raise Conflict(f"a switch to {sm.target.value if sm.target else '?'} is under way")
        source = w.role
        w.begin_switch(body.role, time.time(), body.drain)
        self._migrate_to = [u for u in body.migrate_to if u.rstrip("/") != self.cfg.url.rstrip("/")]
        self._drain_started = time.time()
        self._dispatch()
        if source is Role.DECODE:
            self._spawn(self._release_reserved())
        log.info("switch %s -> %s started (drain %s)", source.value, body.role.value, body.drain)
        self.wake()
        return self.role_status()

    def retire(self, body: RetireRequest) -> RoleStatus:
        """Scale-in: stop taking work and empty the worker; idempotent."""
        w = self.worker
        if w.retiring:
            return self.role_status()
        if w.state is not RoleState.ACTIVE:
            raise Conflict(
                f"a switch to {w.role_sm.target.value if w.role_sm.target else '?'} is under way"
            )
        now = time.time()
        w.begin_retire(now, body.drain)
        self._retire_until = now + body.return_after_s if body.return_after_s else float("inf")
        self._migrate_to = [u for u in body.migrate_to if u.rstrip("/") != self.cfg.url.rstrip("/")]
        self._dispatch()
        if w.role is Role.DECODE:
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

    async def _release_reserved(self) -> None:
        """D->P: requests holding a reservation here whose prefill has not started are re-paired,
        so the drain waits only for work in flight."""
        for rid in list(self.worker.decode.reserved):
            half = self.decode_halves.get(rid)
            if half is None:
                continue
            try:
                answer = await self.peers.post(
                    half.prefill_url, "/v1/internal/release", Abort(rid=rid, reason="re-pair")
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

    # -- signals ------------------------------------------------------------------------------
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
