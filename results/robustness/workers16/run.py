"""The robustness matrix's bars at a pool size it does not hold: 16 workers (8P8D), every
workload, rate and SLO, on the Llama-3.1-8B A100 and H200 profiles, one seed. The shipped suite
runs 4 and 8 workers; this checks that nothing in the rule is sized for them. The suite's own
``run_suite`` on the full size with these profiles and 16 workers, and its ``overall``.

    python run.py SEED cells-seed0.jsonl > summary-seed0.txt   # run (about 4 minutes)
    python run.py --summary cells-seed0.jsonl                  # summarise a run
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from fluidpd.sim import robustness as rb

SIZE = replace(
    rb.SIZES["full"],
    profiles=(("llama-3.1-8b", "a100-80gb"), ("llama-3.1-8b", "h200")),
    workers=(16,),
)


def summary(rows: list[dict[str, Any]]) -> str:
    """The suite's overall bars, then the five cells furthest below static."""
    ran = [r for r in rows if "skipped" not in r]
    worst = sorted(ran, key=lambda r: r["vs_static_pp"])[:5]
    return f"{rb.format_overall(rb.overall(rows))}\n{rb.format_rows(worst)}"


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--summary":
        rows = [json.loads(line) for line in Path(argv[1]).read_text().splitlines() if line]
    elif len(argv) == 2:
        rows = rb.run_suite(SIZE, int(argv[0]), jobs=2)
        Path(argv[1]).write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        sys.exit("usage: python run.py SEED OUT.jsonl | python run.py --summary CELLS.jsonl")
    print(summary(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
