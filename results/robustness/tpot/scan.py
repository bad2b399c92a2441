"""FluidToken alone against the static split, TTFT and TPOT attainment apart, on the cells of
one stress draw (``../stress/stress.py``'s workloads, profiles, SLOs and splits): where a
decode worker's stolen suffixes cost the streams it runs their TPOT.

    PYTHONPATH=<tree> python scan.py DRAW OUT.jsonl

writes one row per cell: ``i`` (the draw's cell), then for ``static`` and ``fluidtoken`` the
SLO, TTFT and TPOT attainment (%) and the prompt tokens stolen.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "stress"))

import stress

from fluidpd.sim.metrics import run_metrics
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import simulate

KEYS = ("slo_attainment", "ttft_attainment", "tpot_attainment")


def one(cell: tuple[Any, ...]) -> dict[str, Any] | None:
    traced = stress.cell_trace(cell)
    if traced is None:
        return None
    profile, slo, _, w = traced
    base = stress.base_config(cell, profile, slo)
    out: dict[str, Any] = {"i": cell[0]}
    for policy in ("static", "fluidtoken"):
        result = simulate(w, replace(base, mechanisms=MECHANISMS[policy]))
        m = run_metrics(result.requests, slo)
        out[policy] = [round(100 * float(m[k]), 2) for k in KEYS]
        out[f"{policy}_stolen"] = result.stolen_tokens
    return out


def main() -> None:
    draw, path = int(sys.argv[1]), sys.argv[2]
    k = 200 if draw == 1 else 150
    with ProcessPoolExecutor(2) as pool, open(path, "w") as f:
        for row in pool.map(one, stress.cells(k, draw)):
            if row:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
