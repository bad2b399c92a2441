"""Every forecast FluidRole's predictive rule asks for in one cell, with its verdict: what a
switch the rule refused would have gained and why it was refused (issue #14: "where a cell
cannot meet this, show why").

    python refusals.py SEED WORKLOAD MODEL GPU SLO WORKERS FRACTION [FROM_S TO_S]

prints the cell's attainment and switches, how often each recommendation stood, then one line
per forecast between FROM_S and TO_S (default: all): time, the donor the switch would take a
worker from, the verdict (``worth_basis``: none = refused), the forecast SLO loss before,
after and during the drain, gain and cost (overloaded seconds over the horizon), the donor's
load ratio after the switch at the recent peak rate, the loss at the peak before and after,
the donor's added misses at the peak, and the arrivals over the horizon.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from typing import Any

from fluidpd.core.fluidrole import FluidRolePolicy
from fluidpd.sim import robustness as rb
from fluidpd.sim.metrics import attainment
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import simulate


def main(argv: list[str]) -> None:
    try:
        seed, workers, fraction = int(argv[0]), int(argv[5]), float(argv[6])
        lo, hi = (float(argv[7]), float(argv[8])) if len(argv) == 9 else (0.0, float("inf"))
    except ValueError as exc:
        sys.exit(
            f"refusals.py: SEED and WORKERS are integers, FRACTION, FROM_S, TO_S numbers ({exc})"
        )
    workload, model, gpu, slo = argv[1], argv[2], argv[3], argv[4]
    cell = rb.Cell(workload, (model, gpu), slo, workers, fraction)
    setup = rb.setup_cell(cell, seed, rb.SIZES["full"])
    if setup is None:
        sys.exit(f"{cell.label}: no static split meets TTFT at any rate")
    lines: list[tuple[Any, ...]] = []
    recs: Counter[str] = Counter()
    worth, observe = FluidRolePolicy._worth, FluidRolePolicy.observe

    def logged_worth(self: FluidRolePolicy, now: float, f: Any, p: Any, source: Any,
                     trade: bool = True) -> Any:  # fmt: skip
        basis = worth(self, now, f, p, source, trade)
        if lo <= now <= hi:
            lines.append((
                f"{now:.1f}", source.value, "none" if basis is None else basis.value,
                *(f"{x:.3f}" for x in (f.loss_before, f.loss_after, f.loss_during)),
                *(f"{x:.2f}" for x in (f.gain, f.cost, f.donor_after)),
                *(f"{x:.3f}" for x in (f.peak_loss_before, f.peak_loss_after, f.donor_tail)),
                f"{f.arrivals:.1f}",
            ))  # fmt: skip
        return basis

    def counted_observe(self: FluidRolePolicy, now: float, workers: Any, demand: Any = None) -> Any:
        out = observe(self, now, workers, demand)
        if self.last_recommendation is not None:
            recs[self.last_recommendation.value] += 1
        return out

    FluidRolePolicy._worth = logged_worth  # type: ignore[method-assign]
    FluidRolePolicy.observe = counted_observe  # type: ignore[method-assign]
    try:
        result = simulate(setup.workload, replace(setup.base, mechanisms=MECHANISMS["fluidpd"]))
    finally:
        FluidRolePolicy._worth, FluidRolePolicy.observe = worth, observe  # type: ignore[method-assign]
    switches = [(round(float(s.as_dict()["t"]), 1), s.as_dict()["from"]) for s in result.switches]
    score = 100 * attainment(result.requests, setup.base.slo)
    print(f"{cell.label} seed {seed}: FluidPD {score:.1f} %, switches {switches}")
    print("recommendations (intervals):", dict(recs))
    print("t donor verdict loss_before loss_after loss_during gain cost donor_after "
          "peak_loss_before peak_loss_after donor_tail arrivals")  # fmt: skip
    for line in lines:
        print(*line)


if __name__ == "__main__":
    if len(sys.argv) not in (8, 10):
        sys.exit(__doc__)
    main(sys.argv[1:])
