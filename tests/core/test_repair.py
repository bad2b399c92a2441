"""Re-pairing a draining decode worker's reservations (``fluidpd.core.repair``)."""

from __future__ import annotations

from fluidpd.core.repair import drain_releases_reserved, release_asks
from fluidpd.core.types import Role


def test_only_a_decode_drain_hands_back_reservations() -> None:
    assert drain_releases_reserved(Role.DECODE)
    assert not drain_releases_reserved(Role.PREFILL)


def test_asks_in_reservation_order_skipping_unknown_peers_and_those_repairing() -> None:
    peers = {1: "p0", 2: None, 3: "p1", 4: "p0"}
    asks = list(release_asks([3, 1, 2, 4], peers.get, repairing={4}))
    assert asks == [(3, "p1"), (1, "p0")]


def test_reservations_are_read_once_and_peers_looked_up_lazily() -> None:
    reserved = {1: "a", 2: "b", 3: "c"}
    repairing: set[int] = set()
    asked = []
    for rid, peer in release_asks(reserved, reserved.get, repairing):
        asked.append((rid, peer))
        # What the harness does while the asks go on: a reservation ends (its KV arrived),
        # a new one is made, another request is being re-paired already.
        reserved.pop(2, None)
        reserved[9] = "z"
        repairing.add(3)
    assert asked == [(1, "a")]
