"""A request's way out of this worker: its decode event stream to the router (tokens
through its ``OutputStream``, coalesced), its end, and the expiry of halves whose peer never
came through (bootstrap) or whose router never came back (unclaimed).
"""

from __future__ import annotations

import logging
import time

from fluidpd.api.internal import DecodeEvent, PrefillOutcome
from fluidpd_sidecar.halves import DecodeState, log_decode_end
from fluidpd_sidecar.state import ServiceState

log = logging.getLogger("fluidpd.sidecar")


class Streams(ServiceState):
    """Decode event streams and the ends of request halves."""

    def _push(self, half: DecodeState, event: DecodeEvent) -> None:
        if not half.closed:
            half.events.put_nowait(event)

    def _advance(self, half: DecodeState, n: int) -> bool:
        """Feeds the engine's output tokens up to ``n`` into the request's stream; True if
        the request has stopped."""
        if n > half.fed and half.stream.finish is None:
            half.stream.feed(self.engine.outputs(half.req.rid, half.fed, n))
            half.fed = n
        return half.stream.finish is not None

    def _emit(self, half: DecodeState, t: float, final: bool = False) -> None:
        ids, text, logprobs = half.stream.take(final)
        if ids or text:
            n = half.stream.count
            if text and not half.first_text_t:
                half.first_text_t, half.first_text_n = t, n
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

    def _resolve_prefill(self, rid: int, outcome: PrefillOutcome) -> None:
        half = self.prefill_halves.pop(rid, None)
        if half is None:
            return
        self.engine.release(rid)
        if not half.outcome.done():
            half.outcome.set_result(outcome)

    def _end_decode(self, rid: int, event: DecodeEvent) -> None:
        half = self.decode_halves.pop(rid, None)
        if half is None:
            return
        log_decode_end(rid, event)
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
