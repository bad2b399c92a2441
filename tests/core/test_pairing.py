"""Pairing: least-loaded picks by load, and equal loads go round-robin (not all to the first)."""

from __future__ import annotations

from collections import Counter

import pytest

from fluidpd.core.pairing import LeastLoadedPairing, NoWorkers, RandomPairing, RoundRobinPairing


def test_least_loaded_picks_the_shortest_queue_and_the_most_free_kv() -> None:
    backlog = {"p0": 3.0, "p1": 1.0, "p2": 2.0}
    free = {"d0": 100.0, "d1": 900.0}
    pairing = LeastLoadedPairing(backlog.__getitem__, free.__getitem__)
    for _ in range(5):
        assert pairing.choose(list(backlog), list(free)) == ("p1", "d1")


def test_least_loaded_ties_go_round_robin() -> None:
    # A backlog: no decode worker has free KV, every prefill queue is as long.
    pairing = LeastLoadedPairing(lambda _w: 4.0, lambda _w: 0.0)
    picks = [pairing.choose(["p0", "p1"], ["d0", "d1", "d2"]) for _ in range(6)]
    assert Counter(d for _, d in picks) == {"d0": 2, "d1": 2, "d2": 2}
    assert Counter(p for p, _ in picks) == {"p0": 3, "p1": 3}


def test_least_loaded_rotates_among_the_tied_best_only() -> None:
    free = {"d0": 5.0, "d1": 9.0, "d2": 9.0}
    pairing = LeastLoadedPairing(lambda _w: 0.0, free.__getitem__)
    picks = {pairing.choose(["p0"], list(free))[1] for _ in range(4)}
    assert picks == {"d1", "d2"}


def test_random_draws_the_prefill_and_the_decode_worker_each_on_its_own() -> None:
    drawn = iter([2, 0, 1, 1])
    asked: list[int] = []

    def draw(n: int) -> int:
        asked.append(n)
        return next(drawn)

    pairing = RandomPairing(draw)
    assert pairing.choose(["p0", "p1", "p2"], ["d0", "d1"]) == ("p2", "d0")
    assert pairing.choose(["p0", "p1", "p2"], ["d0", "d1"]) == ("p1", "d1")
    assert asked == [3, 2, 3, 2]


@pytest.mark.parametrize(
    "pairing",
    [
        RoundRobinPairing(),
        LeastLoadedPairing(lambda _w: 0.0, lambda _w: 0.0),
        RandomPairing(lambda _n: 0),
    ],
)
def test_an_empty_pool_is_no_workers(
    pairing: RoundRobinPairing | LeastLoadedPairing | RandomPairing,
) -> None:
    with pytest.raises(NoWorkers):
        pairing.choose([], ["d0"])
    with pytest.raises(NoWorkers):
        pairing.choose(["p0"], [])
