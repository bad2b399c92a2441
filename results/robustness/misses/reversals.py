"""What meeting the no-flapping bar would cost in the cells where FluidPD reverses a switch
inside the reversal cooldown (issue #14: "no switch that the next one reverses within the
cooldown of a reversal"; "where a cell cannot meet this, show why").

For every cell of ``CELLS.jsonl`` with a quick reversal it runs two controllers that keep to
the bar, on the cell's own workload and deployment:

- ``held``: FluidPD with every reversal inside the cooldown refused, the undo of a refuted
  switch included (the undo then goes once the cooldown is over, if its reason still holds);
  everything else as in FluidPD;
- ``fluidtoken``: no role switch at all (FluidToken alone, as FluidPD runs it).

and prints, for each, the attainment and the bars it misses (``robustness.check``). A cell
whose ``held`` and ``fluidtoken`` rows both miss a bar that FluidPD meets is one where the
quick reversal buys that bar; one where either meets every bar is one where FluidPD's flap
was avoidable in hindsight.

    python reversals.py ../full/cells.jsonl reversals/seed0.jsonl [SEED]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from fluidpd.core.fluidrole import FluidRolePolicy, Recommendation
from fluidpd.sim import robustness as rb
from fluidpd.sim.metrics import attainment
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import simulate


@contextmanager
def reversals_held() -> Iterator[None]:
    """FluidRole with no switch inside the reversal cooldown that reverses the last one."""
    commit = FluidRolePolicy._commit

    def held(self: FluidRolePolicy, now: float, workers: Any, source: Any, rec: Any,
             *args: Any, **kwargs: Any) -> Any:  # fmt: skip
        last = self._last_direction
        reverses = last not in (Recommendation.NONE, rec)
        if reverses and now < self._last_switch_end + self.cfg.reversal_cooldown_s:
            return None
        return commit(self, now, workers, source, rec, *args, **kwargs)

    FluidRolePolicy._commit = held  # type: ignore[method-assign]
    try:
        yield
    finally:
        FluidRolePolicy._commit = commit  # type: ignore[method-assign]


def _run(setup: rb.CellSetup, mechanisms: str, held: bool) -> dict[str, Any]:
    cfg = replace(setup.base, mechanisms=MECHANISMS[mechanisms])
    if held:
        with reversals_held():
            result = simulate(setup.workload, cfg)
    else:
        result = simulate(setup.workload, cfg)
    switches = [s.as_dict() for s in result.switches]
    return {
        "attainment": round(attainment(result.requests, setup.base.slo), 4),
        "switches": [(round(float(s["t"]), 1), s["from"]) for s in switches],
        "max_switches_10min": rb.max_switches_per(switches, 600.0),
        "quick_reversals": rb.quick_reversals(switches, 300.0),
    }


def _bars(row: dict[str, Any], run: dict[str, Any]) -> list[str]:
    """``robustness.check`` of the cell with ``run`` in FluidPD's place."""
    a = run["attainment"]
    probe = {
        "static": row["static"],
        "oracle": row["oracle"],
        "fluidpd": a,
        "vs_static_pp": round(100 * (a - row["static"]), 2),
        "vs_oracle_pp": round(100 * (a - row["oracle"]), 2),
        "max_switches_10min": run["max_switches_10min"],
        "quick_reversals": run["quick_reversals"],
    }
    return rb.check(probe)


def _cell(row: dict[str, Any], seed: int) -> dict[str, Any]:
    cell = rb.Cell(row["workload"], (row["model"], row["gpu"]), row["slo"], row["workers"],
                   row["fraction"])  # fmt: skip
    setup = rb.setup_cell(cell, seed, rb.SIZES["full"])
    assert setup is not None
    out: dict[str, Any] = {k: row[k] for k in ("workload", "model", "gpu", "slo", "workers")}
    out |= {k: row[k] for k in ("fraction", "static", "oracle", "fluidpd", "misses")}
    for name, mechanisms, held in (
        ("fluidpd_now", "fluidpd", False),
        ("held", "fluidpd", True),
        ("fluidtoken", "fluidtoken", False),
    ):
        run = _run(setup, mechanisms, held)
        out[name] = run | {"misses": _bars(row, run)}
    return out


def main(cells: str, out: str, seed: int) -> None:
    rows = [json.loads(line) for line in Path(cells).read_text().splitlines() if line]
    todo = [r for r in rows if r.get("quick_reversals")]
    with ProcessPoolExecutor(2) as pool, Path(out).open("w") as f:
        for res in pool.map(_cell, todo, [seed] * len(todo)):
            f.write(json.dumps(res) + "\n")
            line = " ".join(
                f"{n} {100 * res[n]['attainment']:.1f} {','.join(res[n]['misses']) or '-'}"
                for n in ("fluidpd_now", "held", "fluidtoken")
            )
            print(
                f"{seed} {res['workload']} {res['model']}/{res['gpu']} {res['slo']} "
                f"{res['workers']}w {res['fraction']}x static {100 * res['static']:.1f} "
                f"oracle {100 * res['oracle']:.1f} | {line}",
                flush=True,
            )


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: python reversals.py CELLS.jsonl OUT.jsonl [SEED]")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) == 4 else 0)
