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
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tried-s30"))

from fmatrix import read_base, run_fluidpd

from fluidpd.core import fluidrole
from fluidpd.core.fluidrole import FluidRoleConfig
from fluidpd.sim import robustness as rb
from fluidpd.sim.metrics import attainment

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
    setup, result = run_fluidpd(row, seed)
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
    rows, seed, path = read_base("lone_decode_commits.py")
    with ProcessPoolExecutor(2) as pool, open(path, "w") as out:
        for res in pool.map(rerun, [(r, seed) for r in rows], chunksize=4):
            if res is not None:
                out.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
