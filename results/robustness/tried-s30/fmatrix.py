"""FluidPD alone, rerun on every cell of a robustness-matrix JSONL (``fluidpd sim --suite
robustness --suite-size full``'s ``cells.jsonl``), with each cell's static and oracle figures
kept from it: a policy variant's matrix in about 2 min a seed instead of 11, since only
FluidPD's run changes with the policy. The bars are then read as the suite reads them
(``robustness.check``). Run with the tree under test first on ``PYTHONPATH``:

    PYTHONPATH=<tree> python fmatrix.py BASE.jsonl SEED OUT.jsonl
    python ../lending/compare.py BASE.jsonl OUT.jsonl

With the tree that wrote BASE.jsonl it writes the same rows (checked on the three seeds of
``../streams-check/matrix-seed*.jsonl.xz`` at ``148210d``).
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from jsonl_rows import read_rows

from fluidpd.core.fluidrole import FluidRoleConfig
from fluidpd.sim import robustness as rb
from fluidpd.sim.metrics import attainment
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import simulate


def run_fluidpd(row: dict[str, Any], seed: int) -> tuple[Any, Any]:
    """FluidPD alone on the matrix cell ``row`` at ``seed``: the cell's setup and the result."""
    cell = rb.Cell(
        row["workload"],
        (row["model"], row["gpu"]),
        row["slo"],
        int(row["workers"]),
        float(row["fraction"]),
    )
    setup = rb.setup_cell(cell, seed, rb.SIZES["full"])
    assert setup is not None
    return setup, simulate(setup.workload, replace(setup.base, mechanisms=MECHANISMS["fluidpd"]))


def rerun(job: tuple[dict[str, Any], int]) -> dict[str, Any]:
    row, seed = job
    if "skipped" in row or "fluidpd" not in row:
        return row
    setup, result = run_fluidpd(row, seed)
    switches = [s.as_dict() for s in result.switches]
    out = dict(row)
    out["fluidpd"] = attainment(result.requests, setup.base.slo)
    out["switches"] = len(switches)
    out["max_switches_10min"] = rb.max_switches_per(switches, 600.0)
    out["quick_reversals"] = rb.quick_reversals(switches, FluidRoleConfig().reversal_cooldown_s)
    out["failed_fluidpd"] = sum(r.failed for r in result.requests)
    hours = max(float(setup.workload.arrivals[-1]), 1.0) / 3600
    out["switches_per_hour"] = round(len(switches) / hours, 1)
    out["vs_static_pp"] = round(100 * (out["fluidpd"] - out["static"]), 2)
    out["vs_oracle_pp"] = round(100 * (out["fluidpd"] - out["oracle"]), 2)
    out["misses"] = rb.check(out)
    return out


def read_base(script: str) -> tuple[list[dict[str, Any]], int, str]:
    """``script BASE.jsonl SEED OUT.jsonl``'s rows, seed and output path, or a one-line error
    and exit 1."""
    if len(sys.argv) != 4:
        sys.exit(f"usage: python {script} BASE.jsonl SEED OUT.jsonl")
    try:
        seed = int(sys.argv[2])
    except ValueError:
        sys.exit(f"SEED: an integer, not {sys.argv[2]!r}")
    rows = read_rows(sys.argv[1], "BASE.jsonl")
    keys = ("workload", "model", "gpu", "slo", "workers", "fraction", "static", "oracle")
    if any(
        not isinstance(r, dict) or ("fluidpd" in r and any(k not in r for k in keys)) for r in rows
    ):
        sys.exit(f"BASE.jsonl: {sys.argv[1]} is not a robustness-matrix cells file")
    return rows, seed, sys.argv[3]


def main() -> None:
    rows, seed, path = read_base("fmatrix.py")
    with ProcessPoolExecutor(2) as pool, open(path, "w") as out:
        for row in pool.map(rerun, [(r, seed) for r in rows], chunksize=4):
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
