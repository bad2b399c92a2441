"""The "over the cells" block of ``../misses/reversals/summary.txt``: per controller, the
cells meeting every bar, each bar's misses and the mean attainment, over the rows
``../misses/reversals.py`` wrote:

    python reversal_summary.py ../misses/reversals/seed0.jsonl ../misses/reversals/seed1.jsonl ...
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tried-s30"))

from jsonl_rows import read_rows

NAMES = ("fluidpd_now", "held", "fluidtoken")
BARS = ("static-1pp", "oracle-2pp", "half-gain", "reversal")


def load(paths: list[str]) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        rows += read_rows(path, "ROWS.jsonl")
    if not rows or any(not isinstance(r, dict) or any(n not in r for n in NAMES) for r in rows):
        sys.exit("ROWS.jsonl: not reversals.py's output")
    return rows


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python reversal_summary.py ROWS.jsonl [ROWS.jsonl ...]")
    rows = load(sys.argv[1:])
    print(f"over the {len(rows)} cells:")
    for n in NAMES:
        every = sum(1 for r in rows if not r[n]["misses"])
        misses = ", ".join(f"{b} {sum(b in r[n]['misses'] for r in rows)}" for b in BARS)
        mean = 100 * sum(r[n]["attainment"] for r in rows) / len(rows)
        print(f"  {n}: meets every bar in {every}; misses {misses}; mean attainment {mean:.1f} %")
    either = sum(1 for r in rows if not r["held"]["misses"] or not r["fluidtoken"]["misses"])
    print(f"  cells where held or fluidtoken meets every bar: {either}")
    buys = sum(
        any(
            b not in r["fluidpd_now"]["misses"]
            and b in r["held"]["misses"]
            and b in r["fluidtoken"]["misses"]
            for b in BARS[:3]
        )
        for r in rows
    )
    print(f"  cells where the quick reversal buys a bar that both others miss: {buys}")
    for other in NAMES[1:]:
        d = [100 * (r["fluidpd_now"]["attainment"] - r[other]["attainment"]) for r in rows]
        print(
            f"  FluidPD - {other}: mean {sum(d) / len(d):+.2f} pp ({min(d):+.1f} .. {max(d):+.1f})"
        )
    same = sum(1 for r in rows if abs(r["fluidpd_now"]["attainment"] - r["fluidpd"]) < 6e-5)
    print(f"  fluidpd_now equal to the matrix's figure in {same} of {len(rows)} cells")


if __name__ == "__main__":
    main()
