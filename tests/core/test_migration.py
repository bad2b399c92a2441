"""Drain ``migrate`` planning (``fluidpd.core.migration``)."""

from __future__ import annotations

from fluidpd.core.migration import Migrant, Peer, plan_migration, worth_moving


def _m(rid: int, commitment: int = 100, remaining: int = 50, move_s: float = 0.01) -> Migrant:
    return Migrant(rid, commitment, remaining, move_s)


def test_longest_remaining_moves_first_to_the_freest_peer() -> None:
    plan = plan_migration(
        [_m(1, remaining=10), _m(2, remaining=500), _m(3, remaining=100)],
        [Peer("a", 1000, 8), Peer("b", 300, 8)],
        tpot_s=0.02,
    )
    assert [rid for rid, _ in plan] == [2, 3, 1]
    assert plan[0] == (2, "a")


def test_load_spreads_as_room_is_taken() -> None:
    plan = plan_migration([_m(i, commitment=400) for i in range(3)],
                          [Peer("a", 800, 8), Peer("b", 500, 8)], tpot_s=0.02)  # fmt: skip
    assert sorted(p for _, p in plan) == ["a", "a", "b"]


def test_no_room_means_it_waits_here() -> None:
    plan = plan_migration([_m(1, commitment=600), _m(2, commitment=100)],
                          [Peer("a", 500, 8)], tpot_s=0.02)  # fmt: skip
    assert plan == [(2, "a")]
    assert plan_migration([_m(1)], [], tpot_s=0.02) == []
    # Slots count as room too.
    assert plan_migration([_m(1), _m(2)], [Peer("a", 10_000, 1)], tpot_s=0.02) == [(1, "a")]


def test_a_request_about_to_finish_stays() -> None:
    near = _m(1, remaining=2, move_s=0.1)
    assert not worth_moving(near, tpot_s=0.02)
    assert worth_moving(_m(2, remaining=20, move_s=0.1), tpot_s=0.02)
    assert plan_migration([near], [Peer("a", 10_000, 8)], tpot_s=0.02) == []


def test_a_pair_refused_for_good_is_not_planned_again() -> None:
    """A peer that refused a request for good (HTTP 400) is not asked for it again; another
    peer with room takes it, and with none it finishes here."""
    peers = [Peer("a", 1000, 8), Peer("b", 300, 8)]
    plan = plan_migration([_m(1), _m(2, remaining=40)], peers, tpot_s=0.02, barred={(1, "a")})
    assert plan == [(1, "b"), (2, "a")]
    assert plan_migration([_m(1)], peers, tpot_s=0.02, barred={(1, "a"), (1, "b")}) == []
