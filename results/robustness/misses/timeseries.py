"""The time series of every cell of the full matrix that misses a bar (issue #14: "where a cell
cannot meet this, show why with its time series").

    python timeseries.py ../full/cells.jsonl timeseries/

writes one file per cell that misses a bar (``fluidpd.sim.robustness.check``): the bars it misses,
then its arrivals and misses per bin (about 20 bins over the trace) for every static split and
for FluidPD, with FluidPD's switches (``../heldout/heldout.py``'s ``bins``, the cell built as
``run_cell`` builds it).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from fluidpd.profiles import resolve_profile
from fluidpd.sim import robustness as rb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "heldout"))
import heldout

BINS = 20


def _name(row: dict[str, Any]) -> str:
    return (
        f"{row['workload']}_{row['model']}_{row['gpu']}_{row['slo']}_{row['workers']}w_"
        f"{row['fraction']:g}x.txt"
    )


def _series(row: dict[str, Any]) -> tuple[str, str]:
    profile = resolve_profile(row["model"], row["gpu"], None)
    bin_s = max(1.0, math.ceil(float(row["trace_s"]) / BINS))
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        print(f"misses: {', '.join(rb.check(row))}")
        print(
            f"static {100 * row['static']:.1f} %, FluidPD {100 * row['fluidpd']:.1f} %, "
            f"oracle {100 * row['oracle']:.1f} %; {row['trace_s']} s of trace, bins of {bin_s:g} s"
        )
        heldout.bins(profile, row["workload"], row["slo"], row["workers"], row["fraction"], bin_s)
    return _name(row), text.getvalue()


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
    main(sys.argv[1], sys.argv[2])
