"""Drain ``migrate`` planning (``fluidpd.core.migration``)."""

from __future__ import annotations

from fluidpd.core.migration import Migrant, MigrationPlan, Peer, plan_migration, worth_moving


def _m(rid: int, commitment: int = 100, remaining: int = 50, move_s: float = 0.01) -> Migrant:
    return Migrant(rid, commitment, remaining, move_s)


def test_longest_remaining_moves_first_to_the_freest_peer() -> None:
    plan = plan_migration(
        [_m(1, remaining=10), _m(2, remaining=500), _m(3, remaining=100)],
        [Peer("a", 1000, 8), Peer("b", 300, 8)],
        tpot_s=0.02,
    ).moves
    assert [rid for rid, _ in plan] == [2, 3, 1]
    assert plan[0] == (2, "a")


def test_load_spreads_as_room_is_taken() -> None:
    plan = plan_migration([_m(i, commitment=400) for i in range(3)],
                          [Peer("a", 800, 8), Peer("b", 500, 8)], tpot_s=0.02).moves  # fmt: skip
    assert sorted(p for _, p in plan) == ["a", "a", "b"]


def test_no_room_now_books_the_freest_peer() -> None:
    """A request no peer can hold now is not moved; the peer with the most free KV is asked
    anyway, so that its refusal books room for it."""
    plan = plan_migration([_m(1, commitment=600), _m(2, commitment=100)],
                          [Peer("a", 500, 8), Peer("b", 450, 8)], tpot_s=0.02)  # fmt: skip
    # 1 goes first (same remaining: rid order) but fits nowhere: booked at the freest peer,
    # whose room it then counts against, so 2 goes to the other one.
    assert plan == MigrationPlan(moves=[(2, "b")], bookings=[(1, "a")])
    assert plan.asks == [(2, "b"), (1, "a")]  # moves are asked first
    assert plan_migration([_m(1)], [], tpot_s=0.02) == MigrationPlan()
    # Slots count as room too: the second is booked where the first went.
    slots = plan_migration([_m(1), _m(2)], [Peer("a", 10_000, 1)], tpot_s=0.02)
    assert slots == MigrationPlan(moves=[(1, "a")], bookings=[(2, "a")])


def test_bookings_spread_over_peers() -> None:
    plan = plan_migration([_m(i, commitment=900) for i in range(2)],
                          [Peer("a", 500, 8), Peer("b", 400, 8)], tpot_s=0.02)  # fmt: skip
    assert plan.moves == []
    assert sorted(p for _, p in plan.bookings) == ["a", "b"]


def test_a_request_about_to_finish_stays() -> None:
    near = _m(1, remaining=2, move_s=0.1)
    assert not worth_moving(near, tpot_s=0.02)
    assert worth_moving(_m(2, remaining=20, move_s=0.1), tpot_s=0.02)
    assert plan_migration([near], [Peer("a", 10_000, 8)], tpot_s=0.02) == MigrationPlan()


def test_a_pair_refused_for_good_is_not_planned_again() -> None:
    """A peer that refused a request for good (HTTP 400) is not asked for it again; another
    peer with room takes it, and with none it finishes here."""
    peers = [Peer("a", 1000, 8), Peer("b", 300, 8)]
    plan = plan_migration([_m(1), _m(2, remaining=40)], peers, tpot_s=0.02, barred={(1, "a")})
    assert plan.moves == [(1, "b"), (2, "a")]
    never = plan_migration([_m(1)], peers, tpot_s=0.02, barred={(1, "a"), (1, "b")})
    assert never == MigrationPlan()  # not even booked: it finishes here
    # A barred peer is not booked either.
    big = plan_migration([_m(1, commitment=5000)], peers, tpot_s=0.02, barred={(1, "a")})
    assert big == MigrationPlan(bookings=[(1, "b")])
