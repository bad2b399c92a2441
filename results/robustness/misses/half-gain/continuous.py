"""Why the half-gain cells of ``../../standard/`` miss (issue #14): the oracle replays each
workload window on a fresh (empty) deployment, so the backlog an overloaded window leaves never
reaches the next window; every policy that runs the trace continuously carries it.

``python continuous.py WORKLOAD MODEL GPU SLO WORKERS FRACTION [THIN]`` prints, for every static
split, its attainment when it runs the whole thinned trace continuously (per window) and when
each window is replayed fresh (the oracle's per-window runs), and the half-gain bar of the cell.
``THIN`` (default: the standard suite's 10) keeps every THIN-th request of the Azure trace built
at THIN times the rate: 3 gives windows 3.3 times longer at the same rate.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from fluidpd.core.policy_forecast import CapacityModel
from fluidpd.profiles import resolve_profile
from fluidpd.sim import robustness as rb
from fluidpd.sim.metrics import attainment, windowed_attainment
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.runner import _sub_workload
from fluidpd.sim.simulator import SimConfig, simulate


def main(argv: list[str]) -> None:
    workload, model, gpu, slo_name, workers_s, fraction_s = argv[:6]
    cell = rb.Cell(workload, (model, gpu), slo_name, int(workers_s), float(fraction_s))
    size = rb.SIZES["standard"]
    if len(argv) > 6:
        size = replace(size, azure_thin=int(argv[6]))
    profile = resolve_profile(model, gpu, None)
    slo = rb.SLOS[slo_name]
    probe = rb.thinned(workload, 1.0, 0, profile, rb.SIZES["standard"])
    r_best = rb.best_capacity_rate(CapacityModel.from_profile(profile, slo), probe, cell.workers)
    rps = float(f"{cell.fraction * r_best:.3g}")
    w = rb.thinned(workload, rps, 0, profile, size)
    n = cell.workers
    print(f"{cell.label}: {rps:g} req/s, windows {w.windows}, trace {float(w.arrivals[-1]):.0f} s")
    best_fresh: dict[str, float] = {}
    best_cont: dict[str, float] = {}
    totals: dict[str, float] = {}
    for p in range(1, n):
        base = SimConfig(profile, slo, p, n - p, noise=rb.SUITE_NOISE, seed=0)
        cfg = replace(base, mechanisms=MECHANISMS["static"])
        run = simulate(w, cfg).requests
        per = windowed_attainment(run, w.windows, slo)
        fresh = {}
        for label, a, b in w.windows:
            fresh[label] = attainment(simulate(_sub_workload(w, a, b, label), cfg).requests, slo)
            best_fresh[label] = max(best_fresh.get(label, 0.0), fresh[label])
            best_cont[label] = max(best_cont.get(label, 0.0), float(per[label]))
        totals[f"{p}P{n - p}D"] = attainment(run, slo)
        print(
            f"  {p}P{n - p}D continuous {100 * totals[f'{p}P{n - p}D']:5.1f} %"
            f" per window {', '.join(f'{k} {100 * float(v):5.1f}' for k, v in per.items())};"
            f" fresh per window {', '.join(f'{k} {100 * v:5.1f}' for k, v in fresh.items())}"
        )
    sizes = {label: b - a for label, a, b in w.windows}
    total = sum(sizes.values())
    oracle = sum(best_fresh[k] * sizes[k] for k in sizes) / total
    cont = sum(best_cont[k] * sizes[k] for k in sizes) / total
    static = totals[f"{n // 2}P{n - n // 2}D"]
    bar = static + (oracle - static) / 2
    print(
        f"  static {100 * static:.1f}, oracle (fresh windows) {100 * oracle:.1f}, half-gain bar"
        f" {100 * bar:.1f}; best continuous static split {100 * max(totals.values()):.1f}"
        f" ({max(totals, key=lambda k: totals[k])}); best continuous split per window, summed"
        f" {100 * cont:.1f}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
