"""Does the decode model's calibration carry over from two decode workers to the one a D->P
switch leaves? For every D->P switch that leaves one decode worker (the commits of
``../tried-s31/lone-decode-commits.tar.xz``), FluidPD is rerun on its matrix cell (the matrix
at ``e57461c``, ``../streams-check/matrix-seedN.jsonl.xz``) and the decode pool's observed /
modelled ratio (the calibration ``decode_scale`` takes: max(DPI-bar_load, DPI-bar_adm) over
``CapacityModel.decode_ratio`` at the window's demand, uncalibrated) is read as a median over
the 30 s before the switch (two workers) and over 10-150 s after it ended (one worker, until
the next switch):

    PYTHONPATH=<tree> python scale_diag.py run OUT.jsonl      # about 2 min on 2 cores
    python scale_diag.py summary OUT.jsonl
"""

from __future__ import annotations

import io
import json
import lzma
import os
import statistics
import sys
import tarfile
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tried-s30"))

from fmatrix import run_fluidpd  # noqa: E402
from jsonl_rows import read_rows  # noqa: E402

from fluidpd.core import fluidrole  # noqa: E402

KEYS = ("workload", "model", "gpu", "slo", "workers", "fraction")
LOG: list[tuple[float, int, float, float]] = []


def _hook() -> None:
    observe = fluidrole.FluidRolePolicy.observe

    def logged(self: Any, now: float, workers: Any, demand: Any = None) -> Any:
        out = observe(self, now, workers, demand)
        p, m = self.last_pressure, self.model
        known = p is not None and m is not None and demand is not None and demand.reliable
        if known and p.n_decode > 0:
            mod = m.decode_ratio(demand, p.n_decode, m.prefill_wait(demand, p.n_prefill))
            LOG.append((now, p.n_decode, max(p.dpi_load_bar, p.dpi_adm_bar), mod))
        return out

    fluidrole.FluidRolePolicy.observe = logged  # type: ignore[method-assign]


def _median(t0: float, t1: float, n_decode: int) -> float | None:
    xs = [o / m for t, n, o, m in LOG if t0 <= t <= t1 and n == n_decode and m > 0]
    return statistics.median(xs) if xs else None


def job(task: tuple[dict[str, Any], int]) -> list[dict[str, Any]]:
    row, seed = task
    LOG.clear()
    _, result = run_fluidpd(row, seed)
    sw = [s.as_dict() for s in result.switches]
    out = []
    for i, s in enumerate(sw):
        if s["from"] != "decode":
            continue
        end = s["t"]
        start = end - s["drain_s"]
        nxt = sw[i + 1]["t"] - sw[i + 1]["drain_s"] if i + 1 < len(sw) else float("inf")
        before = _median(start - 30, start, 2)
        after = _median(end + 10, min(nxt, end + 150), 1)
        if before is None or after is None:
            continue
        undone = i + 1 < len(sw) and sw[i + 1]["from"] == "prefill" and nxt - end < 300
        cell = [row[k] for k in KEYS]
        out.append({"cell": cell, "seed": seed, "t": start, "before": before, "after": after,
                    "undone_within_cooldown": undone})  # fmt: skip
    return out


def run(out_path: str) -> None:
    _hook()
    base: dict[tuple[Any, ...], dict[str, Any]] = {}
    for seed in (0, 1, 2):
        path = os.path.join(HERE, "..", "streams-check", f"matrix-seed{seed}.jsonl.xz")
        with lzma.open(path, "rt") as f:
            for line in f:
                r = json.loads(line)
                base[(seed, *(r[k] for k in KEYS))] = r
    tasks = []
    tar_path = os.path.join(HERE, "..", "tried-s31", "lone-decode-commits.tar.xz")
    with tarfile.open(tar_path) as tar:
        for seed in (0, 1, 2):
            member = tar.extractfile(f"commits{seed}.jsonl")
            assert member is not None
            for line in io.TextIOWrapper(member):
                r = json.loads(line)
                if any(c["src"] == "decode" and c["D"] == 2 for c in r["commits"]):
                    tasks.append((base[(r["seed"], *r["cell"])], r["seed"]))
    with ProcessPoolExecutor(2) as ex, open(out_path, "w") as f:
        for rows in ex.map(job, tasks):
            for r in rows:
                f.write(json.dumps(r) + "\n")


def summary(path: str) -> None:
    groups: dict[tuple[str, bool], list[float]] = defaultdict(list)
    for r in read_rows(path, "OUT.jsonl"):
        groups[(r["cell"][0], r["undone_within_cooldown"])].append(r["after"] / r["before"])
    print("workload, undone within the cooldown: switches; calibration after / before")
    for (workload, undone), v in sorted(groups.items()):
        v.sort()
        q1, q3 = v[len(v) // 4], v[3 * len(v) // 4]
        med = statistics.median(v)
        quartiles = f"{q1:.2f}-{q3:.2f}"
        print(f"{workload:19s} {undone!s:5s} {len(v):3d}  median {med:.2f}  quartiles {quartiles}")


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in ("run", "summary"):
        sys.exit("usage: python scale_diag.py run|summary OUT.jsonl")
    try:
        (run if sys.argv[1] == "run" else summary)(sys.argv[2])
    except OSError as e:
        sys.exit(f"scale_diag.py: {e}")


if __name__ == "__main__":
    main()
