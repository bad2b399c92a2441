"""The robustness matrix's cells on profiles it does not hold (issue #14): held-out deployments.

    python heldout.py OUT.jsonl PROFILE.yaml [PROFILE.yaml ...]
    python heldout.py bins PROFILE.yaml WORKLOAD SLO WORKERS FRACTION [BIN_S]
    python heldout.py compare BASE.jsonl NEW.jsonl

runs every cell of the full matrix (workloads, SLOs, 4 and 8 workers, 0.6/0.9/1.2x r_best) on
each profile file given, exactly as ``fluidpd sim --suite robustness --suite-size full`` runs its
own (``fluidpd.sim.robustness.run_cell``, engine noise 0.05, seed 0), and writes one JSON line
per cell with the bars it misses (``issues``). Nothing was tuned on these cells. ``bins``
prints one cell's arrivals and misses per ``BIN_S`` seconds (default 20) for every static split
and for FluidPD, with FluidPD's switches (``fluidpd.sim.robustness.cell_timeseries``).
``compare`` prints two runs' overall figures (mean FluidPD - static, cells below static - 1 pp,
the worst cell, cells with a quick reversal) and every cell whose FluidPD figure moved.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from fluidpd.profiles import ProfileError, load_profile_file
from fluidpd.sim import robustness as rb
from fluidpd.sim.workloads import WorkloadError


def _cell(args: tuple[rb.Cell, rb.SuiteSize]) -> dict[str, Any]:
    cell, size = args
    row = rb.run_cell(cell, 0, size)
    row["issues"] = rb.check(row)
    return row


def main(out: str, files: list[str]) -> None:
    size = rb.on_profile_files(rb.SIZES["full"], files)
    with ProcessPoolExecutor(2) as pool, open(out, "w") as f:
        for row in pool.map(_cell, [(c, size) for c in rb.cells(size)]):
            f.write(json.dumps(row) + "\n")


def bins(path: str, workload: str, slo: str, workers: int, fraction: float, bin_s: float) -> None:
    cell = rb.Cell(workload, (rb.PROFILE_FILE + path, "file"), slo, workers, fraction)
    profile = load_profile_file(path)
    print(rb.cell_timeseries(cell, 0, rb.SIZES["full"], bin_s, profile), end="")


def _summary(name: str, rows: dict[tuple[Any, ...], dict[str, Any]]) -> str:
    gains = [r["vs_static_pp"] for r in rows.values()]
    return (
        f"{name}: {len(gains)} cells, mean {sum(gains) / len(gains):+.2f} pp, "
        f"below static - 1 pp {sum(g < -1 for g in gains)}, worst {min(gains):+.2f} pp, "
        f"quick-reversal cells {sum(r['quick_reversals'] > 0 for r in rows.values())}"
    )


def compare(base_path: str, new_path: str) -> None:
    def load(path: str) -> dict[tuple[Any, ...], dict[str, Any]]:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        keys = ("workload", "model", "slo", "workers", "fraction")
        return {tuple(r[k] for k in keys): r for r in rows}

    base, new = load(base_path), load(new_path)
    if not base or base.keys() != new.keys():
        sys.exit(f"error: {base_path} and {new_path} do not hold the same cells")
    print(_summary("base", base))
    print(_summary("new ", new))
    for key in sorted(base):
        b, n = base[key], new[key]
        if b["fluidpd"] != n["fluidpd"]:
            name = " ".join(str(k).split("/")[-1].removesuffix(".yaml") for k in key)
            print(f"  {name}: {b['vs_static_pp']:+.2f} -> {n['vs_static_pp']:+.2f} pp")


_USAGE = (
    "usage: python heldout.py OUT.jsonl PROFILE.yaml [PROFILE.yaml ...]\n"
    "       python heldout.py bins PROFILE.yaml WORKLOAD SLO WORKERS FRACTION [BIN_S]\n"
    "       python heldout.py compare BASE.jsonl NEW.jsonl"
)

if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["bins"]:
        a = args[1:]
        try:
            workers, fraction = int(a[3]), float(a[4])
            bin_s = float(a[5]) if len(a) > 5 else 20.0
        except (IndexError, ValueError):
            sys.exit(_USAGE)
        if a[2] not in rb.SLOS or workers < 2 or fraction <= 0 or bin_s <= 0:
            sys.exit(f"SLO: one of {', '.join(rb.SLOS)}; WORKERS >= 2; FRACTION, BIN_S > 0")
        try:
            bins(a[0], a[1], a[2], workers, fraction, bin_s)
        except (ProfileError, WorkloadError) as exc:
            sys.exit(f"error: {exc}")
    elif args[:1] == ["compare"]:
        if len(args) != 3:
            sys.exit(_USAGE)
        try:
            compare(args[1], args[2])
        except (OSError, ValueError, KeyError) as exc:
            sys.exit(f"error: {exc}")
    elif len(args) >= 2:
        main(args[0], args[1:])
    else:
        sys.exit(_USAGE)
