"""FluidPD alone, rerun on every cell of one stress draw (``../stress/stress.py``'s JSONL), with
each cell's static figure kept from it: a variant's draw in about 1 min instead of 2.3. Run
with the tree under test first on ``PYTHONPATH``:

    PYTHONPATH=<tree> python fstress.py BASE/seedN.jsonl N OUT/seedN.jsonl
    python ../tried-s23/stress_compare.py OUT BASE

With the tree that wrote BASE it writes the same rows (checked on draw 27 at ``148210d``).
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "stress"))

import stress
from cell_bins import CELLS_PER_SEED
from jsonl_rows import read_rows

from fluidpd.core.fluidrole import FluidRoleConfig
from fluidpd.sim.metrics import attainment
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.robustness import max_switches_per, quick_reversals
from fluidpd.sim.simulator import simulate


def rerun(job: tuple[dict[str, Any], tuple[Any, ...]]) -> dict[str, Any]:
    row, cell = job
    traced = stress.cell_trace(cell)
    assert traced is not None
    profile, slo, _, w = traced
    config = replace(stress.base_config(cell, profile, slo), mechanisms=MECHANISMS["fluidpd"])
    result = simulate(w, config)
    switches = [s.as_dict() for s in result.switches]
    out = dict(row)
    out["fluidpd"] = round(100 * attainment(result.requests, slo), 1)
    out["switches"] = [(s["t"], f"{s['from']}->{s['to']}") for s in switches]
    out["max_switches_10min"] = max_switches_per(switches, 600.0)
    out["quick_reversals"] = quick_reversals(switches, FluidRoleConfig().reversal_cooldown_s)
    out["vs_static_pp"] = round(out["fluidpd"] - out["static"], 1)
    return out


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit("usage: python fstress.py BASE.jsonl DRAW OUT.jsonl")
    draw = int(sys.argv[2]) if sys.argv[2].isdigit() else -1
    if draw not in CELLS_PER_SEED:
        sys.exit(f"DRAW: one of {sorted(CELLS_PER_SEED)}")
    rows = read_rows(sys.argv[1], "BASE.jsonl")
    cells = {c[0]: c for c in stress.cells(CELLS_PER_SEED[draw], draw)}
    if any(not isinstance(r, dict) or r.get("i") not in cells or "static" not in r for r in rows):
        sys.exit(f"BASE.jsonl: {sys.argv[1]} is not stress.py's output for draw {draw}")
    with ProcessPoolExecutor(2) as pool, open(sys.argv[3], "w") as out:
        for row in pool.map(rerun, [(r, cells[r["i"]]) for r in rows], chunksize=2):
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
