"""Messages a worker emits through its outbox; the harness delivers them."""

from __future__ import annotations

from dataclasses import dataclass

from fluidpd.core.types import Request


@dataclass(frozen=True, slots=True)
class Reserved:
    """Decode -> prefill: KV for ``rid`` is reserved; its prefill may start (SGLang bootstrap)."""

    rid: int
    prefill_worker: str
    decode_worker: str


@dataclass(frozen=True, slots=True)
class SuffixCommitted:
    """Prefill -> decode: ``tokens`` of ``rid``'s prompt will run on the decode side."""

    rid: int
    decode_worker: str
    tokens: int


@dataclass(frozen=True, slots=True)
class Handoff:
    """Prefill -> decode: start moving ``prefix_tokens`` of KV (``nbytes``) for ``rid``.

    With ``prefix_tokens == 0`` (the whole prompt was stolen) only metadata moves.
    """

    rid: int
    prefill_worker: str
    decode_worker: str
    prefix_tokens: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class FirstToken:
    rid: int
    t: float


@dataclass(frozen=True, slots=True)
class Finished:
    rid: int
    t: float


@dataclass(frozen=True, slots=True)
class Reroute:
    """A queued, not-started request leaves a draining worker; pair it again (keeps arrival)."""

    request: Request
    from_worker: str


Message = Reserved | SuffixCommitted | Handoff | FirstToken | Finished | Reroute
