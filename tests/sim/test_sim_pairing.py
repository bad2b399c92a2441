"""The simulator's ``random`` pairing (SGLang's mini_lb) is reproducible per seed and draws
every pair."""

from __future__ import annotations

from collections import Counter

from fluidpd.core.types import SLO
from fluidpd.profiles import resolve_profile
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import SimConfig, SimResult, simulate
from fluidpd.sim.workloads import build_workload


def _run(pairing: str, seed: int) -> SimResult:
    profile = resolve_profile("llama-3.1-8b", "a100-80gb", None)
    w = build_workload("azure-mixed", 12.0, context_limit=profile.context_limit, num_requests=200)
    cfg = SimConfig(
        profile, SLO(2.0, 0.1), 2, 2, mechanisms=MECHANISMS["static"], pairing=pairing, seed=seed
    )
    return simulate(w, cfg)


def _pairs(result: SimResult) -> list[tuple[str, str]]:
    return [(r.prefill_worker, r.decode_worker) for r in result.requests]


def test_random_pairing_is_the_same_per_seed_and_differs_across_seeds() -> None:
    a, b, c = _run("random", 0), _run("random", 0), _run("random", 1)
    assert _pairs(a) == _pairs(b)
    assert [r.first_token_t for r in a.requests] == [r.first_token_t for r in b.requests]
    assert _pairs(a) != _pairs(c)
    # Every pair of the 2P2D is drawn, not in a fixed turn as round-robin's.
    counts = Counter(_pairs(a))
    assert len(counts) == 4 and min(counts.values()) > 20
    rr = _pairs(_run("round-robin", 0))
    assert _pairs(a) != rr and Counter(rr) == {p: 50 for p in Counter(rr)}
