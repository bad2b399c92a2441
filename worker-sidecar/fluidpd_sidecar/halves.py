"""A request's half on this worker, as the sidecar keeps it, and the checks every half
passes on arrival."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from fluidpd.api.internal import (
    Abort,
    DecodeEvent,
    DecodeHalf,
    PrefillHalf,
    PrefillOutcome,
    RequestHalf,
)
from fluidpd.core.types import Request
from fluidpd_sidecar.errors import BadRequest
from fluidpd_sidecar.stopping import OutputStream
from fluidpd_sidecar.transfer import KVDest

log = logging.getLogger("fluidpd.sidecar")


@dataclass(slots=True)
class PrefillState:
    """A prefill half queued or running here; ``outcome`` answers the router's call."""

    req: Request
    decode_url: str
    outcome: asyncio.Future[PrefillOutcome]
    dest: KVDest | None = None
    aborted: bool = False
    #: Local receipt time (the request's arrival is the router's, and could be anything).
    received: float = field(default_factory=time.time)


@dataclass(slots=True)
class DecodeState:
    """A decode half here; ``events`` is its stream to the router (``None`` ends it)."""

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
    #: Its KV is here (the prefill hand-off arrived, or it migrated in): it can finish.
    started: bool = False
    #: When the stream first carried text, and its token count then (for the decode trace:
    #: clients time the first token by its text).
    first_text_t: float = 0.0
    first_text_n: int = 0


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


def spares_started(body: Abort, started: bool) -> bool:
    """True if ``body`` leaves this decode half alone: an ``unless_started`` abort of a half
    that has started (its KV is here). The router sends one after a prefill half that ended
    badly (its peer call timed out, its process died), which races the hand-off: once the KV
    is here the request can finish, so it does. Every engine's sidecar decides it here."""
    if body.unless_started and started:
        log.info("request %d: abort (%s) ignored, its decode half has started", body.rid,
                 body.reason)  # fmt: skip
        return True
    return False


# -- a request's life cycle in the sidecar's log --------------------------------------------------
# Every engine's sidecar logs these same lines, so one grep for "request <rid> " over a run
# directory traces a request whatever the engine (the router's "admitted" line names the id the
# client got).


def log_admitted(half: PrefillHalf | DecodeHalf) -> None:
    if isinstance(half, PrefillHalf):
        log.info(
            "request %d admitted for prefill (%d prompt tokens, decode on %s)",
            half.rid, half.prompt_len, half.decode_worker,
        )  # fmt: skip
    else:
        log.info(
            "request %d admitted for decode (%d prompt tokens, up to %d new, prefill on %s)",
            half.rid, half.prompt_len, half.max_new_tokens, half.prefill_worker,
        )  # fmt: skip


def log_decode_end(rid: int, event: DecodeEvent) -> None:
    """How a decode half ended here: finished, failed (with why) or another end (a reroute, a
    cancel, a migration)."""
    if event.event == "done":
        log.info("request %d finished (%s, %d tokens)", rid, event.finish_reason, event.n)
    elif event.event == "error":
        log.warning("request %d failed: %s", rid, event.detail)
    else:
        log.info("request %d ended here: %s (%s)", rid, event.event, event.detail)
