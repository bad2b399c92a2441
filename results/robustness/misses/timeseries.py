"""The time series of every cell of the full matrix that misses a bar (issue #14: "where a cell
cannot meet this, show why with its time series").

    python timeseries.py ../full/cells.jsonl timeseries/

writes one file per cell that misses a bar (``fluidpd.sim.robustness.check``): the bars it misses,
then its arrivals and misses per bin (about 20 bins over the trace) for every static split and
for FluidPD, with FluidPD's switches (``fluidpd.sim.robustness.cell_timeseries``).
"""

from __future__ import annotations

import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from fluidpd.sim import robustness as rb

BINS = 20


def _name(row: dict[str, Any]) -> str:
    return (
        f"{row['workload']}_{row['model']}_{row['gpu']}_{row['slo']}_{row['workers']}w_"
        f"{row['fraction']:g}x.txt"
    )


def _series(row: dict[str, Any]) -> tuple[str, str]:
    cell = rb.Cell(row["workload"], (row["model"], row["gpu"]), row["slo"], row["workers"],
                   row["fraction"])  # fmt: skip
    bin_s = max(1.0, math.ceil(float(row["trace_s"]) / BINS))
    head = (
        f"misses: {', '.join(rb.check(row))}\n"
        f"static {100 * row['static']:.1f} %, FluidPD {100 * row['fluidpd']:.1f} %, "
        f"oracle {100 * row['oracle']:.1f} %; {row['trace_s']} s of trace, bins of {bin_s:g} s\n"
    )
    return _name(row), head + rb.cell_timeseries(cell, 0, rb.SIZES["full"], bin_s)


def main(cells: str, out: str) -> None:
    rows = [json.loads(line) for line in Path(cells).read_text().splitlines() if line]
    missing = [r for r in rows if "skipped" not in r and rb.check(r)]
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(2) as pool:
        for name, text in pool.map(_series, missing):
            (folder / name).write_text(text)
    print(f"wrote {len(missing)} files to {folder}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python timeseries.py CELLS.jsonl OUT_DIR")
    main(sys.argv[1], sys.argv[2])
