"""Bars of two robustness matrices (``cells.jsonl``) and the cells whose FluidPD moved.

python compare.py BASE.jsonl NEW.jsonl
"""

from __future__ import annotations

import json
import sys
from typing import Any

Key = tuple[Any, ...]


def load(path: str) -> dict[Key, dict[str, Any]]:
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    return {
        (r["workload"], r["model"], r["gpu"], r["slo"], r["workers"], r["fraction"]): r
        for r in rows
        if "skipped" not in r
    }


def bars(rows: dict[Key, dict[str, Any]]) -> str:
    cells = rows.values()
    missed = {
        bar: sum(bar in r["misses"] for r in cells)
        for bar in ("static-1pp", "oracle-2pp", "half-gain")
    }
    mean = sum(r["vs_static_pp"] for r in cells) / len(rows)
    return (
        f"mean {mean:+.2f} pp, below static-1pp {missed['static-1pp']},"
        f" oracle-2pp {missed['oracle-2pp']}, half-gain {missed['half-gain']},"
        f" max switches/10 min {max(r['max_switches_10min'] for r in cells)},"
        f" quick-reversal cells {sum(r['quick_reversals'] > 0 for r in cells)}"
    )


def main() -> None:
    base, new = load(sys.argv[1]), load(sys.argv[2])
    print("base:", bars(base))
    print("new: ", bars(new))
    moved = sorted(
        (k for k in base if k in new and base[k]["fluidpd"] != new[k]["fluidpd"]),
        key=lambda k: new[k]["fluidpd"] - base[k]["fluidpd"],
    )
    up = sum(new[k]["fluidpd"] > base[k]["fluidpd"] for k in moved)
    print(f"moved {len(moved)}: {up} up, {len(moved) - up} down")
    for k in moved:
        a, b = base[k], new[k]
        print(
            f"{100 * (b['fluidpd'] - a['fluidpd']):+6.1f} pp  {' '.join(map(str, k))}:"
            f" {100 * a['fluidpd']:.1f} -> {100 * b['fluidpd']:.1f} % (static"
            f" {100 * a['static']:.1f}, oracle {100 * a['oracle']:.1f}; switches"
            f" {a['switches']} -> {b['switches']})"
        )


if __name__ == "__main__":
    main()
