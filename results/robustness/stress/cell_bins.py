"""Misses per time bin of one stress cell, for every static split and each policy:

    python cell_bins.py SEED CELL [BIN_S]

(``SEED`` and ``CELL`` as in ``stress.py``'s output: its draw and the cell's ``i``; the number
of cells drawn per seed is the one the README's commands use.)"""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import stress

from fluidpd.sim.metrics import good_mask
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import SimConfig, simulate

CELLS_PER_SEED = {1: 200, **{s: 150 for s in range(2, 39)}}


def main() -> None:
    try:
        seed0, index = int(sys.argv[1]), int(sys.argv[2])
        bin_s = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
    except (IndexError, ValueError):
        sys.exit("usage: python cell_bins.py SEED CELL [BIN_S] (integers, and seconds > 0)")
    if seed0 not in CELLS_PER_SEED or bin_s <= 0:
        sys.exit(f"SEED: one of {sorted(CELLS_PER_SEED)}; BIN_S: seconds > 0")
    drawn = stress.cells(CELLS_PER_SEED[seed0], seed0)
    cell = next((c for c in drawn if c[0] == index), None)
    if cell is None:
        sys.exit(f"CELL: {index} is not a cell of seed {seed0} (0-{len(drawn) - 1})")
    _, params, prof, slo_name, workers, pd, _, seed = cell
    traced = stress.cell_trace(cell)
    if traced is None:
        sys.exit(f"cell {index} of seed {seed0}: one prompt alone misses the TTFT target")
    profile, slo, rps, w = traced
    n = len(w)
    runs = [
        (f"{p}P{workers - p}D static", SimConfig(profile, slo, p, workers - p), "static")
        for p in range(1, workers)
    ] + [(policy, SimConfig(profile, slo, pd, workers - pd), policy) for policy in
         ("fluidtoken", "fluidrole", "fluidpd")]  # fmt: skip
    bins = (np.asarray(w.arrivals) // bin_s).astype(int)
    width = int(bins.max()) + 1
    head = f"cell {index} of seed {seed0}: {params} {'/'.join(prof)} {slo_name}, {workers} workers"
    print(f"{head} from {pd}P{workers - pd}D, {rps} req/s, {n} requests; misses per {bin_s:g} s")
    counts = np.bincount(bins, minlength=width)
    print(f"{'arrivals':18s}       ", " ".join(f"{x:3d}" for x in counts))
    for name, base, policy in runs:
        cfg = replace(base, noise=0.05, seed=seed, mechanisms=MECHANISMS[policy])
        result = simulate(w, cfg)
        reqs = sorted(result.requests, key=lambda r: r.rid)
        ttft, tpot = good_mask(reqs, slo)
        ok = ttft & tpot
        at = (np.array([r.arrival for r in reqs]) // bin_s).astype(int)
        misses = np.bincount(at, weights=~ok, minlength=width)
        switches = [(round(s.t), f"{s.source}->{s.target}") for s in result.switches]
        print(f"{name:18s} {100 * ok.mean():5.1f} %", " ".join(f"{int(x):3d}" for x in misses),
              switches or "")  # fmt: skip


if __name__ == "__main__":
    main()
