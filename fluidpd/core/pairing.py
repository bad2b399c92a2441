"""Pairing: which prefill worker and which decode worker serve a request.

The paper routes round-robin (§V-A). Pairing is pluggable; the pools passed in are the
*accepting* workers at the time of the call, so pairing follows role switches and never picks
a draining worker. ``random`` is what SGLang's own P/D load balancer (mini_lb) does, so that
the static baseline can be simulated as SGLang serves it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


class NoWorkers(RuntimeError):
    """No accepting worker of a needed role."""


def _require(prefill: Sequence[str], decode: Sequence[str]) -> None:
    if not prefill or not decode:
        raise NoWorkers("no accepting prefill or decode worker")


class Pairing(Protocol):
    name: str

    def choose(self, prefill: Sequence[str], decode: Sequence[str]) -> tuple[str, str]: ...


@dataclass(slots=True)
class RoundRobinPairing:
    """Round-robin over the prefill x decode product, prefill index fastest.

    Every prefill worker is paired with every decode worker (so |P| in eq. 17 is the prefill
    pool size), and over |P|*|D| requests each pair is used once.
    """

    name: str = "round-robin"
    _k: int = 0

    def choose(self, prefill: Sequence[str], decode: Sequence[str]) -> tuple[str, str]:
        _require(prefill, decode)
        k = self._k
        self._k += 1
        return prefill[k % len(prefill)], decode[(k // len(prefill)) % len(decode)]


@dataclass(slots=True)
class LeastLoadedPairing:
    """The prefill worker with the least predicted backlog and the decode worker with the most
    allocatable KV. Ties go round-robin: in a backlog every decode worker may read no free KV,
    and breaking those ties by order would send the whole backlog to the first one."""

    prefill_backlog: Callable[[str], float]
    decode_free_kv: Callable[[str], float]
    name: str = "least-loaded"
    _k: int = 0

    def choose(self, prefill: Sequence[str], decode: Sequence[str]) -> tuple[str, str]:
        _require(prefill, decode)
        k = self._k
        self._k += 1
        return (
            _best(prefill, lambda w: -self.prefill_backlog(w), k),
            _best(decode, self.decode_free_kv, k),
        )


def _best(pool: Sequence[str], score: Callable[[str], float], k: int) -> str:
    """The worker of ``pool`` with the highest score; among equals, the ``k``-th in turn."""
    scores = [score(w) for w in pool]
    top = max(scores)
    tied = [w for w, s in zip(pool, scores, strict=True) if s == top]
    return tied[k % len(tied)]


@dataclass(slots=True)
class RandomPairing:
    """A prefill and a decode worker drawn uniformly, each on its own. ``draw(n)`` is an index
    in ``[0, n)`` from the harness's random stream (seeded for a reproducible simulation)."""

    draw: Callable[[int], int]
    name: str = "random"

    def choose(self, prefill: Sequence[str], decode: Sequence[str]) -> tuple[str, str]:
        _require(prefill, decode)
        return prefill[self.draw(len(prefill))], decode[self.draw(len(decode))]


PAIRINGS = ("round-robin", "least-loaded", "random")
