"""The robustness matrix's bars at a pool size it does not hold: 16 workers (8P8D), every
workload, rate and SLO, on the Llama-3.1-8B A100 and H200 profiles, one seed. The shipped suite
runs 4 and 8 workers; this checks that nothing in the rule is sized for them.

    python run.py 0 cells-seed0.jsonl > summary-seed0.txt
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from itertools import product
from typing import Any

from fluidpd.sim import robustness as rb

PROFILES = (("llama-3.1-8b", "a100-80gb"), ("llama-3.1-8b", "h200"))


def _row(args: tuple[rb.Cell, int]) -> dict[str, Any]:
    cell, seed = args
    row = rb.run_cell(cell, seed, rb.SIZES["full"])
    return row | {"misses": rb.check(row) if "fluidpd" in row else []}


def main(seed: int, out: str) -> None:
    cells = [
        rb.Cell(w, p, s, 16, f)
        for w, p, s, f in product(rb.WORKLOADS, PROFILES, rb.SLOS, rb.RATE_FRACTIONS)
    ]
    rows = []
    with ProcessPoolExecutor(2) as pool, open(out, "w") as f:
        for row in pool.map(_row, [(c, seed) for c in cells]):
            f.write(json.dumps(row) + "\n")
            rows.append(row)
    scored = [r for r in rows if "fluidpd" in r]
    print(f"seed {seed}: {len(scored)} cells at 16 workers ({len(rows) - len(scored)} skipped)")
    for bar in ("static-1pp", "oracle-2pp", "half-gain", "reversal", "flap"):
        hit = [r for r in scored if bar in r["misses"]]
        print(f"  {bar}: {len(hit)}")
    diffs = [r["vs_static_pp"] for r in scored]
    print(f"  FluidPD - static: mean {sum(diffs) / len(diffs):+.2f} pp, worst {min(diffs):+.2f} pp")
    print(f"  max switches in 10 min: {max(r['max_switches_10min'] for r in scored)}")
    for r in sorted(scored, key=lambda r: r["vs_static_pp"])[:5]:
        print(
            f"  {r['workload']} {r['model']}/{r['gpu']} {r['slo']} {r['fraction']}x: static "
            f"{100 * r['static']:.1f} FluidPD {100 * r['fluidpd']:.1f} oracle "
            f"{100 * r['oracle']:.1f} switches {r['switches']} {','.join(r['misses']) or '-'}"
        )


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python run.py SEED OUT.jsonl")
    main(int(sys.argv[1]), sys.argv[2])
