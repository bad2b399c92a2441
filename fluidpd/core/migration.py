"""Drain ``migrate`` planning: which active requests leave a draining decode worker, in what
order, and for which peer, so that the drain ends soonest (pure: numbers in, a plan out).

A draining worker is done when its last request has left or finished. Moving a request costs
its KV transfer; keeping it costs its remaining decode steps. So a request whose remaining
output takes no longer than its move stays and finishes here; the others move, longest
remaining first (they would hold the drain the longest, and moves are serial per source), each
to the peer with the most free KV that can hold its commitment (spreads the load, and keeps
the largest holes for the largest requests still to place). A request no peer has room for
now is *booked* at the peer with the most free KV: the drain asks that peer to adopt it anyway,
and the peer's refusal keeps room for it (``DecodeSide.adopt``): its admission leaves that KV
and a slot free, so the stream moves as soon as the peer's running requests free enough,
instead of new admissions taking each freed page while the drain waits on it. The drain asks
again every round, which renews the booking; one not renewed for ``BOOKING_TTL_S`` lapses (the
request finished here, or the drain ended). With no peer at all it finishes here (the drain
falls back to ``wait`` for it) - never an error.

Used by the simulator (``fluidpd.sim.simulator``) and the sidecar
(``fluidpd_sidecar.migration``), so both make the same decisions.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

#: Seconds a peer keeps room booked for a stream it could not adopt. The draining worker asks
#: again after each of its decode iterations (tens of milliseconds, plus a round trip live), so
#: a drain renews it several times within this; a booking outlives its need by at most this
#: long, and meanwhile the peer admits nothing into that room. At 0.5 s a stress cell at 350
#: req/s with a 1 s TTFT target (1B/H200) lost 6.8 pp to bookings left by streams that had
#: finished on the draining worker; at 0.1 s it lost 3.1 pp (still 57.9 pp over static), and
#: the other cells that moved gained as at 0.5 s (results/robustness/migrants-first).
BOOKING_TTL_S = 0.1


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


@dataclass(frozen=True, slots=True)
class MigrationPlan:
    """One round of a drain's moves. The harness asks each named peer to adopt each request,
    ``moves`` first; a peer in ``bookings`` has no room for it now, and its refusal books room."""

    #: (rid, peer name) moves that fit, in the order to make them.
    moves: list[tuple[int, str]] = field(default_factory=list)
    #: (rid, peer name) for the requests worth moving that fit no peer now.
    bookings: list[tuple[int, str]] = field(default_factory=list)

    @property
    def asks(self) -> list[tuple[int, str]]:
        return self.moves + self.bookings


def plan_migration(
    migrants: Sequence[Migrant],
    peers: Sequence[Peer],
    tpot_s: float,
    barred: Collection[tuple[int, str]] = (),
) -> MigrationPlan:
    """This round's moves and bookings; never a ``barred`` (rid, peer) pair (a peer that
    refused that request for good)."""
    room = {p.name: [p.free_tokens, p.free_slots] for p in peers}
    order = sorted(
        (m for m in migrants if worth_moving(m, tpot_s)), key=lambda m: (-m.remaining, m.rid)
    )
    plan = MigrationPlan()
    for m in order:
        open_ = [n for n in room if (m.rid, n) not in barred]
        if not open_:
            continue
        fits = [n for n in open_ if room[n][0] >= m.commitment and room[n][1] > 0]
        best = max(fits or open_, key=lambda n: (room[n][0], n))
        room[best][0] -= m.commitment
        room[best][1] -= 1
        (plan.moves if fits else plan.bookings).append((m.rid, best))
    return plan
