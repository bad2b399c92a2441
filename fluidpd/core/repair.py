"""Re-pairing a draining decode worker's reservations (FluidRole, §IV-C1: queued-not-started
work is reassigned to a peer, in-flight work finishes).

A decode worker that starts a drain (a D->P switch, or a retirement) holds KV reservations
for requests whose prefill may not have started yet. Waiting for them would make the drain as
long as the prefill queues in front of them, so the worker asks each one's prefill peer to give
it back. The peer decides: it gives back a request it has not started (still queued there:
``PrefillSide.cancel`` for the core's scheduler, SGLang's own queues for the ``sglang``
engine), and then the decode worker drops the reservation and the request is paired again. A
request the peer has started, or whose peer cannot be reached, stays: its KV is on the way and
it finishes here like any request in flight.

The decision (which drains do it, which requests are asked about, in what order) is here once;
the harnesses only do the asking: the simulator calls the peer's ``PrefillSide`` directly, the
sidecars (``fluidpd_sidecar.roles``, ``fluidpd_sidecar.sglang.fluidrole``) POST
``/v1/internal/release`` to it.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator
from typing import TypeVar

from fluidpd.core.types import Role

#: How a harness names a prefill peer (a simulated worker, a sidecar's URL).
P = TypeVar("P")


def drain_releases_reserved(role: Role) -> bool:
    """A drain of a worker in ``role`` (its role before the switch) hands back reservations:
    only decode workers hold them."""
    return role is Role.DECODE


def release_asks(
    reserved: Iterable[int],
    prefill_of: Callable[[int], P | None],
    repairing: Container[int] = frozenset(),
) -> Iterator[tuple[int, P]]:
    """(request id, its prefill peer) for each reservation to ask the peer to give back.

    ``reserved`` is read once, at the start, in its order (the order reservations were made):
    a reservation made or ended while the asks are under way is not asked about. A request
    whose peer ``prefill_of`` does not know (None), or that is in ``repairing`` (being paired
    again already), is skipped. Lazy: each request's peer is looked up (and ``repairing`` read)
    just before it is asked about, so an answer acted on in between is seen.
    """
    for rid in list(reserved):
        if rid in repairing:
            continue
        peer = prefill_of(rid)
        if peer is not None:
            yield rid, peer
