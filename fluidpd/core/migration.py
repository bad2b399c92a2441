"""Drain ``migrate`` planning: which active requests leave a draining decode worker, in what
order, and for which peer, so that the drain ends soonest (pure: numbers in, a plan out).

A draining worker is done when its last request has left or finished. Moving a request costs
its KV transfer; keeping it costs its remaining decode steps. So a request whose remaining
output takes no longer than its move stays and finishes here; the others move, longest
remaining first (they would hold the drain the longest, and moves are serial per source), each
to the peer with the most free KV that can hold its commitment (spreads the load, and keeps
the largest holes for the largest requests still to place). A request no peer has room for is
not planned: it finishes here (the drain falls back to ``wait`` for it) - never an error.

Used by the simulator (``fluidpd.sim.simulator``) and the sidecar
(``fluidpd_sidecar.migration``), so both make the same decisions.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Migrant:
    """An active request on the draining worker."""

    rid: int
    #: KV tokens the peer must commit for it (its prompt plus its output budget, clipped as
    #: the peer's admission clips it).
    commitment: int
    #: Output tokens still to generate at most.
    remaining: int
    #: Seconds its KV takes to move (the transfer model of its bytes).
    move_s: float


@dataclass(frozen=True, slots=True)
class Peer:
    """A decode worker that may adopt (Active, decode role)."""

    name: str
    #: KV tokens it can still commit.
    free_tokens: int
    #: Requests it can still take (its running-request limit less those it holds).
    free_slots: int


def worth_moving(m: Migrant, tpot_s: float) -> bool:
    """Moving ends this request's stay sooner than decoding it out here would."""
    return m.remaining * tpot_s > m.move_s


def plan_migration(
    migrants: Sequence[Migrant],
    peers: Sequence[Peer],
    tpot_s: float,
    barred: Collection[tuple[int, str]] = (),
) -> list[tuple[int, str]]:
    """(rid, peer name) moves, in the order to make them; never a ``barred`` (rid, peer) pair
    (a peer that refused that request for good)."""
    room = {p.name: [p.free_tokens, p.free_slots] for p in peers}
    order = sorted(
        (m for m in migrants if worth_moving(m, tpot_s)), key=lambda m: (-m.remaining, m.rid)
    )
    plan: list[tuple[int, str]] = []
    for m in order:
        fits = [n for n, (tokens, slots) in room.items()
                if tokens >= m.commitment and slots > 0 and (m.rid, n) not in barred]  # fmt: skip
        if not fits:
            continue
        best = max(fits, key=lambda n: (room[n][0], n))
        room[best][0] -= m.commitment
        room[best][1] -= 1
        plan.append((m.rid, best))
    return plan
