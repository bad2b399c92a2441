"""Could any controller that switches through the real mechanism meet the bar this cell misses?
(issue #14: "where a cell cannot meet this, show why").

The oracle is the best static split of each workload window in hindsight, each window replayed
on a fresh, empty deployment with the split in place from its first request. A controller
cannot do that: it starts from the even split, has to see demand before it acts, and moves a
worker through a real drain while the backlog of the last window is still there. This script
runs, for every cell of ``CELLS.jsonl`` that misses the oracle - 2 pp or the half-gain bar, a
*scripted* controller that is told the oracle's split of every window and switches towards it
``D`` seconds after the window starts, through the simulator's real drains (the policy's own
choice of the cheapest worker to drain, the cell's drain mode, FluidToken on, as in FluidPD):

- ``free0``: D = 0, any number of switches at once (clairvoyant, no switch budget);
- ``b0``, ``b15``, ``b30``, ``b60``: D = 0 / 15 / 30 / 60 s, at most 2 switch starts in any
  10 minutes (the issue's no-flapping bar, which FluidPD's budget enforces).

Each cell is then put in the first class that fits:

- ``unreachable``: not even ``free0`` meets the bar: the oracle's number rests on replaying
  windows fresh and on instant reconfiguration, which no switching controller has;
- ``budget``: ``free0`` meets it, ``b0`` does not: it takes more switches than the bar allows;
- ``foresight``: ``b0`` meets it, ``b15`` does not: it takes switching within 15 s of a window's
  first request, before a controller has seen enough of its demand to tell it from noise (the
  forecast reads a 60 s window and needs 20 arrivals in it);
- ``fast``: ``b15`` meets it, ``b30`` does not;
- ``early``: ``b30`` meets it, ``b60`` does not;
- ``policy``: ``b60`` meets it: a controller that acted on a minute of demand could have.

    python causal.py ../full/cells.jsonl causal/seed0.jsonl [SEED]

writes one JSON row per cell (the cell, its bars, the five scripted attainments and switch
counts, the oracle's splits and the class per bar) and prints a count per bar and class;
``python causal.py --summary causal/seed*.jsonl`` prints the counts of every seed and the cells
of the last three classes (``causal/summary.txt``).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from fluidpd.core.types import Role
from fluidpd.sim import robustness as rb
from fluidpd.sim.metrics import attainment
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.runner import RunSpec, run_oracle
from fluidpd.sim.simulator import SimConfig, Simulator
from fluidpd.sim.workloads import Workload

VARIANTS = {
    "free0": (0.0, None),
    "b0": (0.0, 2),
    "b15": (15.0, 2),
    "b30": (30.0, 2),
    "b60": (60.0, 2),
}
BUDGET_WINDOW_S = 600.0
CLASSES = ("unreachable", "budget", "foresight", "fast", "early", "policy")


class Scripted(Simulator):
    """FluidToken as in FluidPD; instead of FluidRole's policy, a script of (time, prefill
    workers) that the control loop moves the split towards, one drain per worker."""

    def __init__(
        self, w: Workload, cfg: SimConfig, plan: list[tuple[float, int]], budget: int | None
    ) -> None:
        super().__init__(w, cfg)
        self.plan = plan
        self.budget = budget
        self.starts: list[float] = []
        self.pending: dict[str, Role] = {}

    def _switch_done(self, wid: str) -> None:
        self.pending.pop(wid, None)
        super()._switch_done(wid)

    def _control(self) -> None:
        super()._control()
        due = [p for t, p in self.plan if t <= self.now]
        if not due:
            return
        target = due[-1]
        while True:
            roles = [self.pending.get(wid, w.role) for wid, w in self.workers.items()]
            n_prefill = roles.count(Role.PREFILL)
            if n_prefill == target:
                return
            recent = [s for s in self.starts if s > self.now - BUDGET_WINDOW_S]
            if self.budget is not None and len(recent) >= self.budget:
                return
            source = Role.DECODE if n_prefill < target else Role.PREFILL
            dest = Role.PREFILL if source is Role.DECODE else Role.DECODE
            pool = max(1, len(self.pool(Role.PREFILL)))
            signals = [
                w.pressure(self.now, pool).signals()
                for wid, w in self.workers.items()
                if wid not in self.pending
            ]
            pick = self.role_policy.pick_candidate(signals, source)
            if pick is None:
                return
            self.pending[pick.worker] = dest
            self.starts.append(self.now)
            self.begin_switch(pick.worker, dest, self.cfg.role_cfg.drain_mode)


def _plan(w: Workload, splits: dict[str, str], delay: float) -> list[tuple[float, int]]:
    plan = []
    for label, a, b in w.windows:
        if b > a and label in splits:
            plan.append((float(w.arrivals[a]) + delay, int(splits[label].split("P")[0])))
    return plan


def _bar(row: dict[str, Any], bar: str) -> float:
    if bar == "oracle-2pp":
        return float(row["oracle"]) - 0.02
    return float(row["static"]) + (float(row["oracle"]) - float(row["static"])) / 2


def _cell(row: dict[str, Any], seed: int) -> dict[str, Any]:
    cell = rb.Cell(row["workload"], (row["model"], row["gpu"]), row["slo"], row["workers"],
                   row["fraction"])  # fmt: skip
    setup = rb.setup_cell(cell, seed, rb.SIZES["full"])
    assert setup is not None
    w, base = setup.workload, setup.base
    oracle = run_oracle(RunSpec("oracle", w.name, 1.0, base), w).record
    splits: dict[str, str] = oracle["oracle_splits"]  # type: ignore[assignment]
    cfg = replace(base, mechanisms=MECHANISMS["fluidtoken"])
    out: dict[str, Any] = {k: row[k] for k in ("workload", "model", "gpu", "slo", "workers")}
    out |= {k: row[k] for k in ("fraction", "static", "fluidpd", "oracle")}
    out["splits"] = splits
    for name, (delay, budget) in VARIANTS.items():
        sim = Scripted(w, cfg, _plan(w, splits, delay), budget)
        out[name] = round(attainment(sim.run().requests, base.slo), 4)
        out[f"{name}_switches"] = len(sim.switches)
    out["classes"] = {}
    for bar in rb.check(row):
        if bar not in ("oracle-2pp", "half-gain"):
            continue
        need = _bar(row, bar) - 1e-9
        met = [out[v] >= need for v in ("free0", "b0", "b15", "b30", "b60")]
        out["classes"][bar] = next(
            c for c, ok in zip(CLASSES, [*met, False], strict=True) if not ok
        )
    return out


def main(cells: str, out: str, seed: int) -> None:
    rows = [json.loads(line) for line in Path(cells).read_text().splitlines() if line]
    todo = [r for r in rows if {"oracle-2pp", "half-gain"} & set(rb.check(r))]
    counts: Counter[tuple[str, str]] = Counter()
    with ProcessPoolExecutor(2) as pool, Path(out).open("w") as f:
        for res in pool.map(_cell, todo, [seed] * len(todo)):
            f.write(json.dumps(res) + "\n")
            for bar, cls in res["classes"].items():
                counts[bar, cls] += 1
    for bar in ("oracle-2pp", "half-gain"):
        row = ", ".join(f"{c} {counts[bar, c]}" for c in CLASSES)
        print(f"{bar}: {sum(counts[bar, c] for c in CLASSES)} cells: {row}")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def summary(paths: list[str]) -> None:
    """Prints the counts per seed, bar and class of ``causal/seedN.jsonl`` files (N from each
    name), then every cell a controller switching 15 s or later into a window could meet."""
    for p in paths:
        if not Path(p).stem.removeprefix("seed").isdigit() or not Path(p).is_file():
            sys.exit(f"causal.py --summary: {p}: not a readable causal/seedN.jsonl file")
    seeds = [(int(Path(p).stem.removeprefix("seed")), p) for p in paths]
    rows = [(s, json.loads(line)) for s, p in seeds for line in Path(p).read_text().splitlines()]
    total: Counter[tuple[str, str]] = Counter()
    for seed, _ in seeds:
        for bar in ("oracle-2pp", "half-gain"):
            c = Counter(r["classes"][bar] for s, r in rows if s == seed and bar in r["classes"])
            total.update({(bar, k): v for k, v in c.items()})
            listed = ", ".join(f"{k} {c[k]}" for k in CLASSES)
            print(f"seed {seed} {bar}: {sum(c.values())} cells: {listed}")
    for bar in ("oracle-2pp", "half-gain"):
        listed = ", ".join(f"{k} {total[bar, k]}" for k in CLASSES)
        print(f"all seeds {bar}: {sum(total[bar, k] for k in CLASSES)} cells: {listed}")
    print(
        "\ncells a controller switching 15 s or later into the window could meet (classes fast,"
        " early, policy);\nattainments in %: static, FluidPD, oracle, then the scripted"
        " controller at D = 15 / 30 / 60 s"
    )
    print(
        "seed workload profile slo workers x static fluidpd oracle b15 b30 b60 oracle-split class"
    )
    for seed, r in rows:
        late = {b: c for b, c in r["classes"].items() if c in CLASSES[3:]}
        if not late:
            continue
        split = " ".join(f"{k}:{v}" for k, v in r["splits"].items())
        cls = " ".join(f"{b}:{c}" for b, c in r["classes"].items())
        nums = " ".join(_pct(r[k]) for k in ("static", "fluidpd", "oracle", "b15", "b30", "b60"))
        print(
            f"{seed} {r['workload']} {r['model']}/{r['gpu']} {r['slo']} {r['workers']}w"
            f" {r['fraction']}x {nums} {split} {cls}"
        )


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--summary":
        summary(sys.argv[2:])
    elif len(sys.argv) in (3, 4):
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) == 4 else 0)
    else:
        sys.exit("usage: python causal.py CELLS.jsonl OUT.jsonl [SEED] | --summary SEED0.jsonl ...")
