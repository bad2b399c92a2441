"""How well does the forecast's capacity model rank static splits? (issue #14: the switch rule
can be no better than the model it asks.)

For every cell of the full matrix at one seed, this replays the cell's workload on every
static split of its workers (no FluidToken, no switching) and keeps each split's SLO
attainment with the demand of the whole trace (``DemandWindow`` over all of its arrivals: the
rate, the means, the prefill-time quantiles, c_a^2). It then asks ``CapacityModel.loss`` to
rank the splits at that demand, with no calibration (scale 1), and scores the ranking by:

- *regret*: the best split's attainment less that of the split the model ranks first;
- *picks off*: cells whose regret passes 2 pp;
- *pairs misordered*: neighbouring splits (one worker apart) whose attainments differ by more
  than 5 pp and that the model orders the other way (or ties);

over every cell, and over the cells whose trace lasts at least the forecast's horizon
(``FluidRoleConfig.horizon_s``, 120 s). The model is of a steady state; the shorter traces
(800 requests of an overloaded cell can arrive in 40 s) end while a decode pool past its
throughput is still filling, and there a split the model reads as failing serves most
requests.

The policy never sees a whole trace; it reads a minute of demand, bounds its rate and
calibrates the model by the pool's pressure. What this measures is the model under all of
that: where it ranks splits wrongly at the true demand, no bound or calibration makes a
forecast right.

    python accuracy.py simulate model-accuracy/seed0.jsonl [SEED]    # about 4 min, 2 cores
    python accuracy.py score model-accuracy/seed0.jsonl [--worst N]  # seconds

(run from ``results/robustness/``; ``summary.txt`` is the output of ``score --worst 25``).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import asdict, replace
from multiprocessing import Pool
from typing import Any

from fluidpd.core.fluidrole import FluidRoleConfig
from fluidpd.core.policy_forecast import CapacityModel, Demand, DemandWindow, Split
from fluidpd.profiles import resolve_profile
from fluidpd.sim import robustness as rb
from fluidpd.sim.metrics import attainment
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import simulate


def _simulate_cell(args: tuple[rb.Cell, int]) -> dict[str, Any] | None:
    cell, seed = args
    setup = rb.setup_cell(cell, seed, rb.SIZES["full"])
    if setup is None:
        return None
    w, base = setup.workload, setup.base
    window = DemandWindow(base.profile.prefill_predictor(), window_s=float("inf"))
    for t, p, o in zip(w.arrivals, w.prompt_lens, w.output_lens, strict=True):
        window.add(float(t), int(p), int(o))
    demand = window.demand(float(w.arrivals[-1]))
    static = {}
    for n_prefill in range(1, cell.workers):
        split = replace(
            base,
            mechanisms=MECHANISMS["static"],
            n_prefill=n_prefill,
            n_decode=cell.workers - n_prefill,
        )
        static[n_prefill] = attainment(simulate(w, split).requests, base.slo)
    return {
        "workload": cell.workload,
        "model": cell.profile[0],
        "gpu": cell.profile[1],
        "slo": cell.slo,
        "workers": cell.workers,
        "fraction": cell.fraction,
        "rps": setup.rps,
        "trace_s": float(w.arrivals[-1]),
        "demand": asdict(demand),
        "static": static,
    }


def simulate_rows(out: str, seed: int) -> None:
    cells = [(cell, seed) for cell in rb.cells(rb.SIZES["full"])]
    with Pool(2) as pool, open(out, "w") as f:
        for row in pool.imap(_simulate_cell, cells, chunksize=4):
            if row is not None:
                f.write(json.dumps(row) + "\n")


def _demand(row: dict[str, Any]) -> Demand:
    fields = dict(row["demand"])
    fields["prefill_quantiles"] = tuple(fields["prefill_quantiles"])
    return Demand(**fields)


def _model(row: dict[str, Any]) -> CapacityModel:
    profile = resolve_profile(row["model"], row["gpu"], None)
    return CapacityModel.from_profile(profile, rb.SLOS[row["slo"]])


def score(rows: list[dict[str, Any]], worst: int, label: str) -> list[str]:
    lines: list[str] = []
    regrets: list[float] = []
    by_workload: dict[str, list[float]] = defaultdict(list)
    misordered = pairs = 0
    off: list[tuple[float, str]] = []
    models: dict[tuple[str, str, str], CapacityModel] = {}
    for row in rows:
        key = (row["model"], row["gpu"], row["slo"])
        if key not in models:
            models[key] = _model(row)
        model, demand, n = models[key], _demand(row), row["workers"]
        static = {int(k): v for k, v in row["static"].items()}
        loss = {p: model.loss(demand, Split(p, n - p)) for p in static}
        # Ties go to the split nearer the even one, as the static baseline starts there.
        pick = min(loss, key=lambda p: (loss[p], abs(p - n / 2)))
        best = max(static, key=lambda p: static[p])
        regret = static[best] - static[pick]
        regrets.append(regret)
        by_workload[row["workload"]].append(regret)
        if regret > 0.02:
            name = (
                f"{row['workload']} {row['model']}/{row['gpu']} {row['slo']} {n}w "
                f"{row['fraction']:g}x: model {pick}P{n - pick}D {100 * static[pick]:.1f} %, "
                f"best {best}P{n - best}D {100 * static[best]:.1f} %"
            )
            off.append((regret, name))
        for p, here in static.items():
            if p + 1 in static and abs(here - static[p + 1]) > 0.05:
                pairs += 1
                order = (loss[p] - loss[p + 1]) * (static[p + 1] - here)
                misordered += order < 0 or loss[p] == loss[p + 1]
    lines.append(
        f"{label}: {len(rows)} cells, mean regret {100 * sum(regrets) / len(rows):.2f} pp,"
        f" picks off by > 2 pp {len(off)}, neighbouring pairs misordered {misordered}/{pairs}"
    )
    for workload, values in sorted(by_workload.items()):
        lines.append(
            f"  {workload:20s} mean regret {100 * sum(values) / len(values):5.2f} pp,"
            f" picks off {sum(v > 0.02 for v in values)}"
        )
    for regret, name in sorted(off, reverse=True)[:worst]:
        lines.append(f"  {100 * regret:5.1f} pp  {name}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("simulate", "score"):
        print("usage: accuracy.py simulate OUT.jsonl [SEED] | score ROWS.jsonl [--worst N]")
        return 2
    if argv[0] == "simulate":
        simulate_rows(argv[1], int(argv[2]) if len(argv) > 2 else 0)
        return 0
    worst = int(argv[argv.index("--worst") + 1]) if "--worst" in argv else 0
    with open(argv[1]) as f:
        rows = [json.loads(line) for line in f]
    horizon = FluidRoleConfig().horizon_s
    long = [row for row in rows if row["trace_s"] >= horizon]
    print("\n".join(score(rows, worst, "every cell")))
    print("\n".join(score(long, worst, f"traces of {horizon:g} s or more")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
