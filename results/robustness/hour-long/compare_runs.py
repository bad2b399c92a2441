"""Two runs of ``hourlong.py`` side by side: each run's mean FluidPD - static, worst cell, cells
below static - 1 pp, most switches in 10 minutes, quick-reversal cells and bars missed, then
every cell whose FluidPD figure moved:

    python compare_runs.py hourlong-OLD.jsonl hourlong-NEW.jsonl
"""

from __future__ import annotations

import json
import sys
from typing import Any

KEYS = ("workload", "model", "gpu", "slo", "workers", "fraction")


def load(path: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    try:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"compare_runs.py: {path}: {e}")
    return {tuple(r[k] for k in KEYS): r for r in rows}


def describe(name: str, runs: dict[tuple[Any, ...], dict[str, Any]]) -> str:
    rows = list(runs.values())
    pp = [r["vs_static_pp"] for r in rows]
    misses: dict[str, int] = {}
    for r in rows:
        for m in r.get("misses", []):
            misses[m] = misses.get(m, 0) + 1
    return (
        f"{name}: {len(rows)} cells, mean {sum(pp) / len(pp):+.2f} pp, worst {min(pp):+.2f}, "
        f"below static - 1 pp {sum(x < -1 for x in pp)}, "
        f"max switches/10 min {max(r['max_switches_10min'] for r in rows)}, "
        f"quick-reversal cells {sum(r['quick_reversals'] > 0 for r in rows)}, misses {misses}"
    )


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: python compare_runs.py hourlong-OLD.jsonl hourlong-NEW.jsonl")
    old, new = load(sys.argv[1]), load(sys.argv[2])
    print(describe("old", old))
    print(describe("new", new))
    moved = [(k, old[k]["fluidpd"], new[k]["fluidpd"], new[k]["static"]) for k in old if k in new]
    moved = [m for m in moved if abs(m[1] - m[2]) > 1e-9]
    print(f"moved {len(moved)}, up {sum(b > a for _, a, b, _ in moved)}")
    for k, a, b, s in sorted(moved, key=lambda m: m[2] - m[1]):
        cell = " ".join(map(str, k))
        figures = f"{100 * a:.2f} -> {100 * b:.2f} % (static {100 * s:.2f})"
        print(f"  {100 * (b - a):+.2f} pp  {cell}: {figures}")


if __name__ == "__main__":
    main()
