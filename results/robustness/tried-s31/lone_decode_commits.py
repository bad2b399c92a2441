"""Every switch FluidPD commits in every cell of a robustness-matrix JSONL, with the forecast
it was taken on (donor ratio at the peak, donor tail, gain, arrivals over the horizon) and
the pool readings at the time; one JSON row per cell. ``lone_decode_separation.py`` reads
them. Run with the tree under test first on ``PYTHONPATH``:

    PYTHONPATH=<tree> python lone_decode_commits.py BASE.jsonl SEED OUT.jsonl

It wraps ``FluidRolePolicy._commit`` and changes nothing else: each row's ``fluidpd`` equals
BASE's (checked on the three seeds of ``../streams-check/matrix-seed*.jsonl.xz``).
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from fluidpd.core import fluidrole
from fluidpd.core.fluidrole import FluidRoleConfig
from fluidpd.sim import robustness as rb
from fluidpd.sim.metrics import attainment
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import simulate

COMMITS: list[dict[str, Any]] = []
_commit = fluidrole.FluidRolePolicy._commit


def _logged_commit(
    self: Any,
    now: float,
    workers: Any,
    source: Any,
    rec: Any,
    p: Any,
    f: Any,
    demand: Any,
    undo: bool = False,
    shared: bool = False,
) -> Any:
    decision = _commit(self, now, workers, source, rec, p, f, demand, undo, shared)
    if decision is not None:
        row: dict[str, Any] = {
            "t": round(now, 1),
            "src": source.value,
            "undo": undo,
            "shared": shared,
            "P": p.n_prefill,
            "D": p.n_decode,
            "dpi_load": round(p.dpi_load_bar, 3),
            "dpi_adm": round(p.dpi_adm_bar, 3),
        }
        if f is not None:
            row |= {
                "don": round(f.donor_after, 3),
                "tail": round(f.donor_tail, 3),
                "gain": round(f.gain, 2),
                "cost": round(f.cost, 2),
                "at_rate": round(f.donor_at_rate, 3),
                "arrivals": round(f.arrivals, 1),
            }
        COMMITS.append(row)
    return decision


fluidrole.FluidRolePolicy._commit = _logged_commit  # type: ignore[method-assign]


def rerun(job: tuple[dict[str, Any], int]) -> dict[str, Any] | None:
    row, seed = job
    if "skipped" in row or "fluidpd" not in row:
        return None
    COMMITS.clear()
    cell = rb.Cell(
        row["workload"],
        (row["model"], row["gpu"]),
        row["slo"],
        int(row["workers"]),
        float(row["fraction"]),
    )
    setup = rb.setup_cell(cell, seed, rb.SIZES["full"])
    assert setup is not None
    result = simulate(setup.workload, replace(setup.base, mechanisms=MECHANISMS["fluidpd"]))
    switches = [s.as_dict() for s in result.switches]
    return {
        "cell": [row[k] for k in ("workload", "model", "gpu", "slo", "workers", "fraction")],
        "seed": seed,
        "static": row["static"],
        "oracle": row["oracle"],
        "fluidpd": attainment(result.requests, setup.base.slo),
        "quick_reversals": rb.quick_reversals(switches, FluidRoleConfig().reversal_cooldown_s),
        "commits": list(COMMITS),
    }


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit("usage: python lone_decode_commits.py BASE.jsonl SEED OUT.jsonl")
    try:
        seed = int(sys.argv[2])
    except ValueError:
        sys.exit(f"SEED: an integer, not {sys.argv[2]!r}")
    try:
        with open(sys.argv[1]) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"BASE.jsonl: cannot read {sys.argv[1]}: {e}")
    keys = ("workload", "model", "gpu", "slo", "workers", "fraction", "static", "oracle")
    if any(
        not isinstance(r, dict) or ("fluidpd" in r and any(k not in r for k in keys)) for r in rows
    ):
        sys.exit(f"BASE.jsonl: {sys.argv[1]} is not a robustness-matrix cells file")
    with ProcessPoolExecutor(2) as pool, open(sys.argv[3], "w") as out:
        for res in pool.map(rerun, [(r, seed) for r in rows], chunksize=4):
            if res is not None:
                out.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
