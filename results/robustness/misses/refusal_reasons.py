"""Why FluidPD did not take the switch that would have met a bar, in the cells ``causal.py``
finds within a switching controller's reach (classes ``fast``, ``early``, ``policy``: a
controller moving to the oracle's split 15 s or later into the window meets the bar).

For each such cell it reruns FluidPD and, for every forecast of a switch towards the oracle's
split (a decode donor where the oracle has more prefill workers than the starting split, a
prefill donor where it has fewer), records what ``worth_basis`` weighs: whether the gain is
clear (``gain_clear``), whether the donor keeps up at the recent peak rate
(``keeps_up_at_peak``), whether the switch loses requests at the rate's bound raised by the
margin (``Forecast.loses_beyond``), whether it is the budget's last switch away from a decode
pool (``_final_away``), and the verdict. Per cell it prints the intervals the rule asked, how
many had a clear gain, how many of those failed each check, and how many were taken; and the
switches FluidPD made.

    python refusal_reasons.py causal/seed0.jsonl 0 > refusal_reasons/seed0.txt
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from fluidpd.core.fluidrole import FluidRolePolicy
from fluidpd.core.policy_forecast import gain_clear, keeps_up_at_peak
from fluidpd.core.types import Role
from fluidpd.sim import robustness as rb
from fluidpd.sim.metrics import attainment
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import simulate

REACHABLE = ("fast", "early", "policy")


def _towards(row: dict[str, Any]) -> Role | None:
    """The donor of a switch towards the oracle's split (None: no single direction)."""
    half = row["workers"] // 2
    prefill = {int(split.split("P")[0]) for split in row["splits"].values()}
    if all(p > half for p in prefill):
        return Role.DECODE
    if all(p < half for p in prefill):
        return Role.PREFILL
    return None


def _cell(row: dict[str, Any], seed: int) -> dict[str, Any]:
    cell = rb.Cell(row["workload"], (row["model"], row["gpu"]), row["slo"], row["workers"],
                   row["fraction"])  # fmt: skip
    setup = rb.setup_cell(cell, seed, rb.SIZES["full"])
    assert setup is not None
    donor = _towards(row)
    counts = {"asked": 0, "clear": 0, "clear_donor_past_peak": 0, "clear_loses_beyond": 0,
              "clear_final": 0, "taken": 0}  # fmt: skip
    worth = FluidRolePolicy._worth

    def counted(self: FluidRolePolicy, now: float, f: Any, p: Any, source: Role,
                trade: bool = True) -> Any:  # fmt: skip
        basis = worth(self, now, f, p, source, trade)
        if source is donor:
            counts["asked"] += 1
            if gain_clear(f, self.cfg.gain_margin):
                counts["clear"] += 1
                counts["clear_donor_past_peak"] += not keeps_up_at_peak(f)
                counts["clear_loses_beyond"] += bool(f.loses_beyond)
                counts["clear_final"] += self._final_away(now, source)
            counts["taken"] += basis is not None
        return basis

    FluidRolePolicy._worth = counted  # type: ignore[method-assign]
    try:
        result = simulate(setup.workload, replace(setup.base, mechanisms=MECHANISMS["fluidpd"]))
    finally:
        FluidRolePolicy._worth = worth  # type: ignore[method-assign]
    switches = [(round(float(s.as_dict()["t"]), 1), s.as_dict()["from"]) for s in result.switches]
    return {
        "cell": f"{cell.label} seed {seed}",
        "classes": row["classes"],
        "static": row["static"],
        "fluidpd": round(attainment(result.requests, setup.base.slo), 4),
        "oracle": row["oracle"],
        "oracle_splits": sorted(set(row["splits"].values())),
        "towards": None if donor is None else f"{donor.value} donor",
        "switches": switches,
        **counts,
    }


def main(causal: str, seed: int) -> None:
    rows = [json.loads(line) for line in Path(causal).read_text().splitlines() if line]
    todo = [r for r in rows if any(c in REACHABLE for c in r.get("classes", {}).values())]
    with ProcessPoolExecutor(2) as pool:
        for res in pool.map(_cell, todo, [seed] * len(todo)):
            print(json.dumps(res), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or not sys.argv[2].isdigit():
        sys.exit("usage: python refusal_reasons.py causal/seedN.jsonl N (N: the seed, an integer)")
    main(sys.argv[1], int(sys.argv[2]))
