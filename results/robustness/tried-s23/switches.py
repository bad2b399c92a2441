"""One stress cell's FluidPD role switches, each with the time it ended and its drain:

    PYTHONPATH=<tree> python switches.py SEED CELL

run from a folder that holds ``../stress/stress.py`` and ``cell_bins.py``.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import stress
from cell_bins import CELLS_PER_SEED

from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import SimConfig, simulate


def main() -> None:
    seed0, index = int(sys.argv[1]), int(sys.argv[2])
    cell = next(c for c in stress.cells(CELLS_PER_SEED[seed0], seed0) if c[0] == index)
    _, _, _, _, workers, pd, _, seed = cell
    traced = stress.cell_trace(cell)
    assert traced is not None
    profile, slo, _, w = traced
    base = SimConfig(profile, slo, pd, workers - pd)
    cfg = replace(base, noise=0.05, seed=seed, mechanisms=MECHANISMS["fluidpd"])
    print([s.as_dict() for s in simulate(w, cfg).switches])


if __name__ == "__main__":
    main()
