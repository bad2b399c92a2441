"""The robustness matrix's cells on profiles it does not hold (issue #14): held-out deployments.

    python heldout.py OUT.jsonl PROFILE.yaml [PROFILE.yaml ...]
    python heldout.py bins PROFILE.yaml WORKLOAD SLO WORKERS FRACTION [BIN_S]

runs every cell of the full matrix (workloads, SLOs, 4 and 8 workers, 0.6/0.9/1.2x r_best) on
each profile file given, exactly as ``fluidpd sim --suite robustness --suite-size full`` runs its
own (``fluidpd.sim.robustness.run_cell``, engine noise 0.05, seed 0), and writes one JSON line
per cell with the bars it misses (``issues``). Nothing was tuned on these cells. ``bins``
prints one cell's arrivals and misses per ``BIN_S`` seconds (default 20) for every static split
and for FluidPD, with FluidPD's switches: the time series behind a cell's number.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from fluidpd.core.policy_forecast import CapacityModel
from fluidpd.core.profile import Profile
from fluidpd.profiles import load_profile_file, resolve_profile
from fluidpd.sim import robustness as rb
from fluidpd.sim.metrics import good_mask
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import SimConfig, simulate

_FILE = "file:"


def _resolve(model: str | None, gpu: str | None, path: str | None) -> Profile:
    """A cell's profile: a file for the held-out ones (model ``file:PATH``), else shipped."""
    if model is not None and model.startswith(_FILE):
        return load_profile_file(model[len(_FILE) :])
    return resolve_profile(model, gpu, path)


def _size(files: list[str]) -> rb.SuiteSize:
    full = rb.SIZES["full"]
    profiles = tuple((_FILE + f, "file") for f in files)
    return rb.SuiteSize(
        full.long_requests, full.azure_thin, full.workloads, profiles, full.slos, full.workers,
        full.fractions,
    )  # fmt: skip


def _cell(args: tuple[rb.Cell, rb.SuiteSize]) -> dict[str, Any]:
    rb.resolve_profile = _resolve  # type: ignore[assignment]  # in each worker process
    row = rb.run_cell(args[0], 0, args[1])
    row["issues"] = rb.check(row)
    return row


def main(out: str, files: list[str]) -> None:
    size = _size(files)
    with ProcessPoolExecutor(2) as pool, open(out, "w") as f:
        for row in pool.map(_cell, [(c, size) for c in rb.cells(size)]):
            f.write(json.dumps(row) + "\n")


def bins(
    profile: Profile, workload: str, slo_name: str, workers: int, fraction: float, bin_s: float
) -> None:
    """One cell's time series, built as ``run_cell`` builds it."""
    slo, size = rb.SLOS[slo_name], rb.SIZES["full"]
    model = CapacityModel.from_profile(profile, slo)
    r_best = rb.best_capacity_rate(model, rb.thinned(workload, 1.0, 0, profile, size), workers)
    rps = float(f"{fraction * r_best:.3g}")
    w = rb.thinned(workload, rps, 0, profile, size)
    t = np.asarray(w.arrivals)
    edges = np.arange(0.0, float(t[-1]) + bin_s, bin_s)
    which = np.digitize(t, edges) - 1

    def per_bin(mask: Any) -> str:
        return " ".join(f"{int(np.sum(mask & (which == b))):4d}" for b in range(len(edges) - 1))

    print(f"{workload} {profile.name} {slo_name} {workers}w {fraction:g}x: {rps:g} req/s")
    print(f"{'arrivals':>16s} {'':>6s} {per_bin(np.ones(len(w), dtype=bool))}")
    half = workers // 2
    base = SimConfig(profile, slo, half, workers - half, noise=rb.SUITE_NOISE, seed=0)
    runs = [(f"static {p}P{workers - p}D", replace(base, n_prefill=p, n_decode=workers - p))
            for p in range(1, workers)]  # fmt: skip
    runs.append(("fluidpd", replace(base, mechanisms=MECHANISMS["fluidpd"])))
    for label, cfg in runs:
        result = simulate(w, cfg)
        ttft_ok, tpot_ok = good_mask(result.requests, slo)
        good = ttft_ok & tpot_ok
        print(f"{label:>16s} {100 * float(np.mean(good)):5.1f}% {per_bin(~good)}")
        for switch in result.switches:
            print(f"{'':>24s}switch {switch.as_dict()}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["bins"]:
        a = sys.argv[2:]
        profile = load_profile_file(a[0])
        bins(profile, a[1], a[2], int(a[3]), float(a[4]), float(a[5]) if len(a) > 5 else 20.0)
    else:
        main(sys.argv[1], sys.argv[2:])
