"""Request halves arriving over HTTP: prefill and decode halves, reservations, hand-offs,
aborts and re-pairings, and the decode event stream the router reads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from fluidpd.api.internal import (
    Abort,
    DecodeEvent,
    DecodeHalf,
    Handoff,
    PrefillHalf,
    PrefillOutcome,
    Released,
    Reserved,
    SuffixCommit,
)
from fluidpd.api.sampling import SampledToken
from fluidpd.core.types import Request, Role
from fluidpd_sidecar.engine import kv_stamp
from fluidpd_sidecar.errors import BadRequest, Conflict, NotFound
from fluidpd_sidecar.halves import (
    DecodeState,
    PrefillState,
    check_half,
    log_admitted,
    spares_started,
)
from fluidpd_sidecar.outbox import Outbox
from fluidpd_sidecar.stopping import OutputStream
from fluidpd_sidecar.transfer import KVDest

log = logging.getLogger("fluidpd.sidecar")


class Intake(Outbox):
    """What the HTTP handlers call to hand a request's half to this worker."""

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
        self.prefill_halves[half.rid] = PrefillState(req, half.decode_url, future)
        self._decode_urls[half.decode_worker] = half.decode_url
        self.worker.prefill.add(req)
        log_admitted(half)
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

    @staticmethod
    def _request_of(half: DecodeHalf) -> Request:
        req = Request(half.rid, half.arrival, half.prompt_len, half.max_new_tokens)
        req.prefill_worker = half.prefill_worker
        return req

    def _decode_state(
        self, half: DecodeHalf, output_ids: list[int] | None = None, req: Request | None = None
    ) -> DecodeState:
        """The decode half's state; the engine admits it (``req``: the core's request for it,
        when the core holds KV for it already)."""
        req = req or self._request_of(half)
        stream = OutputStream(self.text, half.sampling, self.cfg.model.eos_token_ids)
        try:
            self.engine.admit(half.rid, half.prompt_ids, half.sampling, output_ids or ())
        except ValueError as exc:  # the engine's own checks (its vocabulary): bad input
            raise BadRequest(str(exc)) from exc
        state = DecodeState(req, half.prefill_url, half, stream)
        if output_ids:
            stream.feed(SampledToken(i) for i in output_ids)
            stream.skip_sent()  # the source sent their text already
            state.fed = len(output_ids)
        return state

    def accept_decode(self, half: DecodeHalf) -> DecodeState:
        self._check_accepting(Role.DECODE)
        check_half(half, self.cfg.context_limit, self.cfg.model.vocab_size)
        if half.rid in self.decode_halves:
            raise Conflict(f"request {half.rid} is already here")
        state = self._decode_state(half)
        self._add_decode_half(state)
        self.worker.decode.add(state.req, time.time())
        log_admitted(half)
        self._dispatch()
        self.wake()
        return state

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
        half.started = True
        self.worker.decode.handoff_done(body.rid, body.prefix_tokens, time.time())
        self._dispatch()
        self.wake()

    def _verify_kv(self, half: DecodeState) -> None:
        """The transport moved real bytes: check the first ones are this request's."""
        view = getattr(self.transfer, "view", None)
        if view is None or half.dest is None:
            return
        stamp = kv_stamp(half.req.rid)
        if bytes(view(half.dest.addr, len(stamp))) != stamp:
            self.metrics.kv_corrupt()
            log.error("KV of request %d arrived corrupted", half.req.rid)

    def suffix_committed(self, body: SuffixCommit) -> float:
        self.worker.decode.suffix_committed(body.rid, body.tokens)
        return self.worker.decode.steal_budget(self.n_prefill)

    def budget(self) -> float:
        if self.worker.role is not Role.DECODE:
            return 0.0
        return self.worker.decode.steal_budget(self.n_prefill)

    def subscribe(self, half: DecodeState) -> DecodeState:
        if half.subscribed:
            raise Conflict(f"request {half.req.rid} is already being streamed")
        half.subscribed = True
        return half

    async def events(self, half: DecodeState) -> AsyncIterator[bytes]:
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

    def decode_half(self, rid: int) -> DecodeState:
        half = self.decode_halves.get(rid)
        if half is None and rid in self._unclaimed:
            half = self._unclaimed[rid][0]
        if half is None:
            raise NotFound(f"no decode half for request {rid} here")
        return half

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
        dec = self.decode_halves.get(rid)
        if dec is not None and not spares_started(body, dec.started):
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
