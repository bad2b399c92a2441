"""Delivers what the scheduler puts in its outbox: to a peer sidecar over HTTP
(reservations, suffix commits, KV hand-offs) or to the router through the request's decode
event stream (first token, finish, reroute); and the KV transport room a reservation needs.
"""

from __future__ import annotations

import json
import logging
import time
import zlib

from fluidpd.api.internal import DecodeEvent, Handoff, PrefillOutcome, Reserved, SuffixCommit
from fluidpd.core.scheduler import messages as msg
from fluidpd_sidecar.halves import DecodeState
from fluidpd_sidecar.peers import PeerError
from fluidpd_sidecar.streams import Streams

log = logging.getLogger("fluidpd.sidecar")
#: Per-request diagnostics at DEBUG (``FLUIDPD_DEBUG_LOGGERS=fluidpd.trace`` turns them on).
trace = logging.getLogger("fluidpd.trace")


class Outbox(Streams):
    """The scheduler's outbox, delivered; the arena room of reservations."""

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

    def _reserve_room(self, half: DecodeState) -> bool:
        half.dest = self.transfer.reserve(self.engine.kv_wire_bytes(half.req.prompt_len))
        return half.dest is not None

    def _free_room(self, half: DecodeState) -> None:
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
        if trace.isEnabledFor(logging.DEBUG):
            self._trace_finished(half, m.t)
        reason = stream.finish or "length"
        done = DecodeEvent(event="done", n=stream.count, finish_reason=reason, t=m.t)
        self._end_decode(m.rid, done)

    def _trace_finished(self, half: DecodeState, t: float) -> None:
        """One JSON line per finished decode half: when its first token and its first text went
        out, and which ids it produced (an id the served tokenizer cannot render streams no
        text, and clients time the first token by its text)."""
        ids = half.stream.output_ids
        texty = self.text.text_id_set
        req = half.req
        first_text = next((i for i, x in enumerate(ids) if x in texty), -1)
        prompt = ",".join(map(str, half.half.prompt_ids)).encode()
        rec = {
            "rid": req.rid, "crc": f"{zlib.crc32(prompt):08x}", "prompt": req.prompt_len,
            "out": len(ids), "first_text_idx": first_text,
            "text_tokens": sum(x in texty for x in ids), "arrival": req.arrival,
            "first_token_t": req.first_token_t, "first_text_t": half.first_text_t,
            "first_text_n": half.first_text_n, "finish_t": t, "ids": ids[:16],
        }  # fmt: skip
        trace.debug("decode trace %s", json.dumps(rec))

    def _reroute(self, rid: int) -> None:
        if rid in self.prefill_halves:
            self._resolve_prefill(rid, PrefillOutcome(status="reroute", detail="worker draining"))
        if rid in self.decode_halves:
            self._end_decode(rid, DecodeEvent(event="reroute", detail="worker draining"))
