"""Random workloads off the robustness matrix (issue #14): static against FluidPD.

    python stress.py CELLS SEED OUT.jsonl

draws CELLS cells from SEED and writes one JSON line per cell. Each cell draws a prompt and an
output length distribution (lognormal, median 150-14,000 and 10-1,500 tokens, sigma 0.3-1.2,
in 40 % of cells a mix shift half-way that multiplies either median by 0.22-4.5), an arrival
process (Poisson; Markov-modulated bursts at 2x or 3x the mean; gamma gaps with a coefficient
of variation of 3), a profile (the five shipped ones), an SLO (strict, medium, relaxed), 4, 6
or 8 workers, a start split (any, not only the even one) and a rate of 0.3-1.5x r_best (the
suite's capacity rate). Traces last about 600 s (600-3,000 requests). Engine noise 0.05, as
in the suite. Nothing here was tuned: the draws are uniform in the ranges above.
"""

from __future__ import annotations

import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from fluidpd.core.fluidrole import FluidRoleConfig
from fluidpd.core.policy_forecast import CapacityModel
from fluidpd.core.profile import Profile
from fluidpd.core.types import SLO
from fluidpd.profiles import resolve_profile
from fluidpd.sim.metrics import attainment
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.robustness import SLOS, best_capacity_rate, max_switches_per, quick_reversals
from fluidpd.sim.simulator import SimConfig, simulate
from fluidpd.sim.workloads import Workload

PROFILES = [
    ("llama-3.1-8b", "a100-80gb"),
    ("qwen3-14b", "a100-80gb"),
    ("qwen3-30b-a3b", "a100-80gb"),
    ("llama-3.1-8b", "h200"),
    ("llama-3.2-1b", "h200"),
]
Params = tuple[int, float, int, float, str, Any]


def _lengths(rng: np.random.Generator, median: float, sigma: float, hi: int, n: int) -> Any:
    return np.clip(np.rint(rng.lognormal(math.log(median), sigma, n)), 1, hi).astype(np.int64)


def _arrivals(rng: np.random.Generator, kind: str, rps: float, n: int) -> Any:
    if kind == "poisson":
        return np.concatenate(([0.0], np.cumsum(rng.exponential(1 / rps, n - 1))))
    if kind == "gamma":  # gaps with a coefficient of variation of 3
        return np.concatenate(([0.0], np.cumsum(rng.gamma(1 / 9, 9 / rps, n - 1))))
    factor = float(kind[5:])  # "burstF": 30 % of the time at F x the mean
    times: list[float] = [0.0]
    now = 0.0
    while len(times) < n:
        on = rng.random() < 0.3
        span = rng.exponential(60 if on else 140)
        rate = rps * factor if on else rps * max(0.2, (1 - 0.3 * factor) / 0.7)
        times.extend(sorted(now + rng.random(rng.poisson(rate * span)) * span))
        now += span
    t = np.array(times[:n]) - times[0]
    return np.sort(t * ((n - 1) / rps) / t[-1])


def workload(params: Params, rps: float, n: int, seed: int, limit: int) -> Workload:
    rng = np.random.default_rng(seed)
    pm, ps, om, osig, kind, shift = params
    half = n // 2 if shift else n
    p_scale, o_scale = shift if shift else (1.0, 1.0)
    top = limit - 64
    prompts = np.concatenate(
        [_lengths(rng, pm, ps, top, half), _lengths(rng, pm * p_scale, ps, top, n - half)]
    )
    outputs = np.concatenate(
        [_lengths(rng, om, osig, 4096, half), _lengths(rng, om * o_scale, osig, 4096, n - half)]
    )
    return Workload("stress", _arrivals(rng, kind, rps, n), prompts, outputs, (("all", 0, n),), "")


def cell_trace(cell: tuple[Any, ...]) -> tuple[Profile, SLO, float, Workload] | None:
    """A cell's profile, SLO, rate (its fraction of r_best) and trace; None where one prompt
    alone misses the TTFT target (no rate to speak of)."""
    _, params, prof, slo_name, workers, _, frac, seed = cell
    profile = resolve_profile(prof[0], prof[1], None)
    slo = SLOS[slo_name]
    r_best = best_capacity_rate(
        CapacityModel.from_profile(profile, slo),
        workload(params, 1.0, 600, seed, profile.context_limit),
        workers,
    )
    if r_best <= 0.01:
        return None
    rps = float(f"{frac * r_best:.3g}")
    n = int(min(max(rps * 600, 600), 3000))
    return profile, slo, rps, workload(params, rps, n, seed, profile.context_limit)


def base_config(cell: tuple[Any, ...], profile: Profile, slo: SLO) -> SimConfig:
    """The cell's deployment: its split, the draws' engine noise, its seed."""
    _, _, _, _, workers, pd, _, seed = cell
    return SimConfig(profile, slo, pd, workers - pd, noise=0.05, seed=seed)


def run(cell: tuple[Any, ...]) -> dict[str, Any]:
    i, params, prof, slo_name, workers, pd, frac, seed = cell
    traced = cell_trace(cell)
    if traced is None:
        return {"i": i, "skip": True}
    profile, slo, rps, w = traced
    n = len(w)
    base = base_config(cell, profile, slo)
    out: dict[str, Any] = {
        "i": i, "params": params, "profile": "/".join(prof), "slo": slo_name,
        "workers": workers, "pd": pd, "frac": frac, "rps": rps, "seed": seed, "requests": n,
    }  # fmt: skip
    for policy in ("static", "fluidpd"):
        result = simulate(w, replace(base, mechanisms=MECHANISMS[policy]))
        out[policy] = round(100 * attainment(result.requests, slo), 1)
    switches = [s.as_dict() for s in result.switches]
    out["switches"] = [(s["t"], f"{s['from']}->{s['to']}") for s in switches]
    out["max_switches_10min"] = max_switches_per(switches, 600.0)
    out["quick_reversals"] = quick_reversals(switches, FluidRoleConfig().reversal_cooldown_s)
    out["vs_static_pp"] = round(out["fluidpd"] - out["static"], 1)
    return out


def cells(k: int, seed0: int) -> list[tuple[Any, ...]]:
    rng = np.random.default_rng(seed0)
    drawn = []
    for i in range(k):
        pm = float(np.exp(rng.uniform(math.log(150), math.log(14000))))
        om = float(np.exp(rng.uniform(math.log(10), math.log(1500))))
        kind = str(rng.choice(["poisson", "burst2.0", "burst3.0", "gamma"]))
        shift = None
        if rng.random() >= 0.6:
            shift = tuple(round(float(np.exp(rng.uniform(-1.5, 1.5))), 2) for _ in range(2))
        params = (round(pm), round(float(rng.uniform(0.3, 1.2)), 2), round(om),
                  round(float(rng.uniform(0.3, 1.2)), 2), kind, shift)  # fmt: skip
        prof = PROFILES[rng.integers(len(PROFILES))]
        slo = str(rng.choice(list(SLOS)))
        workers = int(rng.choice([4, 6, 8]))
        pd = int(rng.integers(1, workers))
        frac = round(float(rng.uniform(0.3, 1.5)), 2)
        drawn.append((i, params, prof, slo, workers, pd, frac, int(rng.integers(1000))))
    return drawn


def main() -> None:
    k, seed0, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    with ProcessPoolExecutor(2) as pool, open(path, "w") as out:
        for row in pool.map(run, cells(k, seed0)):
            if not row.get("skip"):
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
