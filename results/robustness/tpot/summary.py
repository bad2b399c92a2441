"""Counts of two ``scan.py`` runs of one draw, and the cells whose FluidToken moved.

    python summary.py BASE.jsonl NEW.jsonl
"""

from __future__ import annotations

import json
import sys
from typing import Any


def load(path: str) -> dict[int, dict[str, Any]]:
    with open(path) as f:
        return {row["i"]: row for row in map(json.loads, f)}


def counts(rows: dict[int, dict[str, Any]]) -> str:
    slo = [r["fluidtoken"][0] - r["static"][0] for r in rows.values()]
    tpot = [r["fluidtoken"][2] - r["static"][2] for r in rows.values()]
    return (
        f"{len(rows)} cells, FluidToken - static: mean {sum(slo) / len(slo):+.2f} pp, "
        f"below -1 pp {sum(x < -1 for x in slo)}; TPOT attainment below static's by more "
        f"than 1 pp in {sum(x < -1 for x in tpot)}, 5 pp in {sum(x < -5 for x in tpot)}"
    )


def main() -> None:
    base, new = load(sys.argv[1]), load(sys.argv[2])
    print(f"base: {counts(base)}\nnew:  {counts(new)}")
    moved = sorted(
        (new[i]["fluidtoken"][0] - base[i]["fluidtoken"][0], i) for i in base if i in new
    )
    for d, i in moved:
        if abs(d) >= 0.5:
            b, n = base[i], new[i]
            print(
                f"  {d:+5.1f} pp  cell {i}: SLO/TTFT/TPOT {b['fluidtoken']} -> {n['fluidtoken']}"
                f" (static {b['static']})"
            )


if __name__ == "__main__":
    main()
