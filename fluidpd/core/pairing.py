"""Pairing: which prefill worker and which decode worker serve a request.

The paper routes round-robin (§V-A). Pairing is pluggable; the pools passed in are the
*accepting* workers at the time of the call, so pairing follows role switches and never picks
a draining worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


class NoWorkers(RuntimeError):
    """No accepting worker of a needed role."""


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
        if not prefill or not decode:
            raise NoWorkers("no accepting prefill or decode worker")
        k = self._k
        self._k += 1
        return prefill[k % len(prefill)], decode[(k // len(prefill)) % len(decode)]


@dataclass(slots=True)
class LeastLoadedPairing:
    """The prefill worker with the least predicted backlog and the decode worker with the most
    allocatable KV (ties broken by order)."""

    prefill_backlog: Callable[[str], float]
    decode_free_kv: Callable[[str], float]
    name: str = "least-loaded"

    def choose(self, prefill: Sequence[str], decode: Sequence[str]) -> tuple[str, str]:
        if not prefill or not decode:
            raise NoWorkers("no accepting prefill or decode worker")
        p = min(prefill, key=self.prefill_backlog)
        d = max(decode, key=self.decode_free_kv)
        return p, d


PAIRINGS = ("round-robin", "least-loaded")
