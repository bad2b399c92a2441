"""Writes the small Azure-mixed slice that scripts/gpu/sglang_live.sh replays on the H200 (the
machine has no network and the traces stay here): N consecutive requests of FluidPD's
``azure-mixed`` workload (the highest-burstiness 10,000-request window of the 2023 Azure code
and conv traces merged by time, fluidpd.sim.workloads), as an Azure-format CSV (TIMESTAMP,
ContextTokens, GeneratedTokens). Of the N-request stretches starting every N/2 requests, the
one whose inter-arrival gaps vary most (coefficient of variation) is kept, as the workload
picks its window, so a short replay still sees bursts. Timestamps keep the native gaps, so
``fluidpd replay --workload FILE --rps R`` rescales them to mean rate R with the shape intact.
Run here, before the GPU call; the file goes in .sglwhl/slice/ (ignored by git, carried by the
call). Data: Azure LLM inference traces 2023, CC BY 4.0.

usage: python scripts/gpu/sglang_slice.py [--requests 100] [--out FILE]
"""

from __future__ import annotations

import argparse
import csv
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from fluidpd.sim.workloads import build_workload


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--out", default=".sglwhl/slice/azure-mixed-slice.csv")
    a = p.parse_args()
    # rps 1: arrivals in seconds at mean rate 1/s; replay rescales any rate the same way.
    w = build_workload("azure-mixed", rps=1.0)
    n = a.requests
    arr = w.arrivals

    def cv(s: int) -> float:
        gaps = np.diff(arr[s : s + n])
        return float(gaps.std() / gaps.mean()) if gaps.mean() > 0 else 0.0

    start = max(range(0, len(arr) - n + 1, max(1, n // 2)), key=cv)
    sl = slice(start, start + n)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    base = datetime(2023, 11, 16, tzinfo=UTC)
    with out.open("w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for t, n_in, n_out in zip(arr[sl], w.prompt_lens[sl], w.output_lens[sl], strict=True):
            stamp = (base + timedelta(seconds=float(t - arr[start]))).strftime(
                "%Y-%m-%d %H:%M:%S.%f"
            )
            wr.writerow([stamp, int(n_in), int(n_out)])
    print(
        f"{out}: requests [{start}:{start + n}] of {w.name} (gap CV {cv(start):.2f}), "
        f"{out.stat().st_size} bytes"
    )


if __name__ == "__main__":
    main()
